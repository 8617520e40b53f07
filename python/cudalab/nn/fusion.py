"""GELU in the GEMM's epilogue, or as its own kernel: measured once per problem.

cuBLASLt can apply GELU in a GEMM's epilogue (forward, keeping the
pre-activation for the backward) and its derivative in the input-gradient
GEMM's epilogue. That saves a pass over the activations and a launch, but the
epilogue kernels are not always as fast as the plain GEMM: on an H200, at
8192 x 4096 x 4096, the fused forward runs 17% slower than the plain GEMM in
TF32 (0.96 vs 0.82 ms, where a separate GELU kernel takes 0.07 ms), while at a
few hundred rows the fused forms win. The answer depends on the GPU, the dtype
and the sizes, so it is measured, as ``torch.backends.cudnn.benchmark`` does
for convolutions: the first time a problem (direction, rows, features, dtype,
matmul precision) runs outside a CUDA graph capture, both forms are timed with
CUDA events and the faster is kept for the rest of the process. That first
call synchronizes; later ones do not. Inside a capture, an unmeasured problem
runs fused (nothing can be timed there) and stays unmeasured.

Both forms compute the same function (the tanh form of GELU) and leave the
same state behind (the pre-activation in the layer's aux buffer), so a step
may mix them freely.

``set_gelu_fusion("fused" | "split" | "auto")`` forces one form (for
experiments and tests) or restores the measurement; :func:`decisions` shows
what was measured and :func:`forget` drops it, so that every problem is
measured again on its next call (what the first call's measurement costs, or a
fresh choice after the clocks or the load changed).
"""

from __future__ import annotations

from typing import Callable, Hashable

from .. import _core

__all__ = ["MODES", "decisions", "forget", "get_gelu_fusion", "set_gelu_fusion", "use_fused"]

MODES = ("auto", "fused", "split")
# Calls timed per form, after one untimed call (plans, caches).
REPEATS = 3

_mode = "auto"
_measured: dict[Hashable, tuple[bool, float, float]] = {}


def set_gelu_fusion(mode: str) -> None:
    """set_gelu_fusion(mode) -> None

    "auto" (measure each problem once, the default), "fused" (always the
    epilogue) or "split" (always the plain GEMM and a GELU kernel).
    """
    global _mode
    if mode not in MODES:
        raise ValueError(f"set_gelu_fusion() argument 'mode': expected one of "
                         f"{', '.join(repr(m) for m in MODES)}, got {mode!r}")
    _mode = mode


def get_gelu_fusion() -> str:
    """The current mode (see :func:`set_gelu_fusion`)."""
    return _mode


def decisions() -> dict[Hashable, dict[str, float | bool]]:
    """Every measured problem: ``{key: {"fused": bool, "fused_ms": t, "split_ms": t}}``."""
    return {k: {"fused": f, "fused_ms": a, "split_ms": b} for k, (f, a, b) in _measured.items()}


def forget() -> None:
    """forget() -> None

    Drop every measured decision: in "auto" mode each problem is measured
    again the next time it runs outside a capture (that call synchronizes).
    The mode itself is kept.
    """
    _measured.clear()


def _time_ms(fn: Callable[[], object]) -> float:
    """Milliseconds per call of `fn` on the current stream (one untimed call first)."""
    fn()
    start, end = _core.Event(), _core.Event()
    start.record()
    for _ in range(REPEATS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / REPEATS


def use_fused(key: Hashable, fused: Callable[[], object], split: Callable[[], object]) -> bool:
    """Whether problem `key` runs `fused` (the epilogue) rather than `split`.

    Both callables do the same work into the same buffers; in "auto" mode an
    unmeasured key runs each REPEATS + 1 times first (outside a capture).
    """
    if _mode != "auto":
        return _mode == "fused"
    known = _measured.get(key)
    if known is not None:
        return known[0]
    if _core.is_current_stream_capturing():
        return True
    fused_ms, split_ms = _time_ms(fused), _time_ms(split)
    _measured[key] = (fused_ms <= split_ms, fused_ms, split_ms)
    return fused_ms <= split_ms
