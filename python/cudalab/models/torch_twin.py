"""The PyTorch twin of cudalab.models' ResNet-50, for side-by-side comparisons.

torchvision's ``resnet50()`` holding our weights (copied in through its
``state_dict``), in each precision, NCHW or channels_last, eager or replayed
from a ``torch.cuda.CUDAGraph`` or compiled by ``torch.compile``, with
torch's TF32 and cuDNN settings pinned for the precision and restored after.
Lessons ``inference``, ``multi_gpu_inference`` and ``compilers`` and
benchmarks/bench_resnet.py measure cudalab's forward beside it.

Getting a compiled form ready is timed the same way everywhere
(`first_calls`, `setup_cost`): the wall clock of making it and its first
`FIRST_CALLS` calls, less what those calls take once warm, so what remains
is compiling (autotuning included in max-autotune) and recording.

torch is never imported here (every function takes the ``torch`` module);
torchvision only by `torchvision_or_none`. Both are optional.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from .. import _precision
from ..nn.precision import PRECISIONS as _NN_PRECISIONS

__all__ = ["COMPILE_MODES", "DTYPE_OF", "FIRST_CALLS", "TorchPrecision", "TorchTwin", "cache_state",
           "compile_ready", "compiling", "first_calls", "fx_cache_counts", "host_copy",
           "setup_cost", "torch_resnet50", "torch_session", "torchvision_or_none"]

# The torch dtype each of cudalab.models' precisions (cudalab.nn's names) stores
# activations and weights in (the one table's torch_dtype): the twin runs the
# whole model in it.
DTYPE_OF = {name: _precision.resolve(name).torch_dtype for name in _NN_PRECISIONS}
# Calls a variant gets before it is timed warm: torch.compile compiles on the first,
# CUDA-graph trees record on the second or third, TorchScript's profiling executor
# optimizes after two, nn.Trainer captures on the second.
FIRST_CALLS = 3
# torch.compile's modes; "reduce-overhead" and "max-autotune" also replay CUDA graphs.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def torchvision_or_none() -> Any:
    """torchvision when it imports (with a torch it was built for), else None."""
    try:
        import torchvision
    except Exception:  # missing, or built for another torch: no torch columns either way
        return None
    return torchvision


def torch_resnet50(torch: Any, torchvision: Any, state: Mapping[str, np.ndarray]) -> Any:
    """torchvision's ``resnet50()`` on the CPU in eval mode, holding `state`'s weights.

    The weights are copied into the module's own ``state_dict`` tensors, key
    by key (``num_batches_tracked`` keeps torch's value, eval mode never
    reads it).
    """
    module = torchvision.models.resnet50()
    tensors = module.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            tensors[key].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return module.eval()


class TorchPrecision(_precision.TorchTf32):
    """``with TorchPrecision(torch, precision):`` TF32 on only for "tf32" (matmul and
    cuDNN), cuDNN autotuning on; torch's previous settings restored after."""

    def __init__(self, torch: Any, precision: str) -> None:
        spec = _precision.lookup(precision)
        super().__init__(torch, spec is not None and spec.torch_allow_tf32, cudnn=True)
        self.tf32 = self.on

    def __enter__(self) -> TorchPrecision:
        super().__enter__()
        b = self.torch.backends
        self.saved_benchmark = b.cudnn.benchmark
        b.cudnn.benchmark = True
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.torch.backends.cudnn.benchmark = self.saved_benchmark


def _torch_dtype(torch: Any, precision: str) -> Any:
    return getattr(torch, DTYPE_OF[precision])


class TorchTwin:
    """TorchTwin(torch, cpu_module, precision)

    The torchvision model in one precision on the GPU, twice: NCHW
    (``"eager"``) and channels_last (``"channels_last"``); fp16 and bf16 run
    the whole model in that dtype (``module.to(dtype)``, as the tutorial's
    ``model.half()``). Call inside `TorchPrecision` and ``torch.no_grad()``.
    """

    MODES = ("eager", "channels_last", "graph")

    def __init__(self, torch: Any, cpu_module: Any, precision: str) -> None:
        self.torch = torch
        self.dtype = _torch_dtype(torch, precision)
        nchw = copy.deepcopy(cpu_module).to(device="cuda", dtype=self.dtype)
        cl = copy.deepcopy(cpu_module).to(device="cuda", dtype=self.dtype)
        self.modules = {"eager": nchw, "channels_last": cl.to(memory_format=torch.channels_last)}
        self.compiled_modules: dict[str, Any] = {}

    def inputs(self, x_nhwc: np.ndarray) -> dict[str, Any]:
        """The batch as torch wants it per mode: NCHW contiguous, and channels_last."""
        t = self.torch.from_numpy(np.ascontiguousarray(x_nhwc)).to("cuda")
        t = t.permute(0, 3, 1, 2).to(self.dtype)  # NCHW shape, NHWC strides
        return {"eager": t.contiguous(),
                "channels_last": t.contiguous(memory_format=self.torch.channels_last)}

    def call(self, mode: str, x: Any) -> Callable[[], Any]:
        module = self.modules[mode]
        return lambda: module(x)

    def compiled(self, mode: str) -> Any:
        """The channels_last model compiled by ``torch.compile`` in `mode` (static shapes),
        made once per mode; torch compiles lazily, on the first call at each batch shape."""
        if mode not in self.compiled_modules:
            self.compiled_modules[mode] = self.torch.compile(self.modules["channels_last"],
                                                             mode=mode, dynamic=False)
        return self.compiled_modules[mode]

    def compiled_call(self, mode: str, x_cl: Any) -> Callable[[], Any]:
        module = self.compiled(mode)
        return lambda: module(x_cl)

    def graph(self, x_cl: Any, warmup: int = 3) -> tuple[Callable[[], None], Any]:
        """(replay, output): the channels_last forward captured in a CUDA graph
        reading `x_cl` (warmed up on a side stream first, as torch requires)."""
        torch = self.torch
        module = self.modules["channels_last"]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                module(x_cl)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = module(x_cl)
        return g.replay, out

    def release(self) -> None:
        self.modules.clear()
        self.compiled_modules.clear()
        self.torch.cuda.empty_cache()


@contextlib.contextmanager
def torch_session(torch: Any, cpu_module: Any, precision: str) -> Iterator[TorchTwin | None]:
    """``with torch_session(torch, cpu_module, precision) as twin:`` a `TorchTwin` under
    `TorchPrecision` and ``torch.no_grad()``, released after; None without torch."""
    if torch is None or cpu_module is None:
        yield None
        return
    with TorchPrecision(torch, precision), torch.no_grad():
        twin = TorchTwin(torch, cpu_module, precision)
        try:
            yield twin
        finally:
            twin.release()


# ---- getting a compiled form ready ---------------------------------------------------------


def setup_cost(first_calls_s: float, calls: int, steady_s: float) -> float:
    """Seconds a variant costs before it runs warm: the wall clock of making it and its first
    `calls` calls, less what `calls` warm calls take (never below 0)."""
    return max(0.0, first_calls_s - calls * steady_s)


def first_calls(fn: Callable[[], Any] | None, sync: Callable[[], Any],
                keep: Callable[[Any], Any],
                make: Callable[[], Any] | None = None) -> tuple[float, Any, Any]:
    """(wall seconds of `make()` and FIRST_CALLS calls of what it returns (or of `fn`),
    a copy of the first call's output taken at once, what `make` returned)."""
    sync()
    start = time.perf_counter()
    made = make() if make is not None else None
    call = made if callable(made) else fn
    first = keep(call())
    for _ in range(FIRST_CALLS - 1):
        call()
    sync()
    return time.perf_counter() - start, first, made


def host_copy(out: Any) -> np.ndarray:
    """A float32 host copy of a torch output, taken before the next call may overwrite it
    (CUDA-graph modes reuse their output buffers)."""
    return out.float().cpu().numpy()


def fx_cache_counts(torch: Any) -> tuple[int, int] | None:
    """(hits, misses) of inductor's FX graph cache so far in this process, from dynamo's
    counters; None where this torch keeps no such counters."""
    try:
        counters = importlib.import_module("torch._dynamo.utils").counters["inductor"]
        return int(counters["fxgraph_cache_hit"]), int(counters["fxgraph_cache_miss"])
    except Exception:  # no inductor, or counters under other names in this version
        return None


def cache_state(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str | None:
    """What inductor's FX graph cache did between two `fx_cache_counts`: "warm" (every graph
    came from the cache: no compiling, no autotuning), "cold" (none did), "partly warm", or
    None when it cannot be told (no counters, counters reset, or no graph compiled)."""
    if before is None or after is None:
        return None
    hits, misses = after[0] - before[0], after[1] - before[1]
    if hits < 0 or misses < 0 or hits + misses == 0:
        return None
    if misses == 0:
        return "warm"
    return "cold" if hits == 0 else "partly warm"


def compile_ready(torch: Any, twin: TorchTwin, mode: str,
                  x_cl: Any) -> tuple[float, np.ndarray, Callable[[], Any], str | None]:
    """Compile `twin`'s channels_last model in torch.compile `mode` and make its first calls
    on `x_cl`: (wall seconds of that, autotuning included, a host copy of the first output,
    the call, the FX graph cache's state as `cache_state` says). Call inside `compiling`."""
    before = fx_cache_counts(torch)
    seconds, first, call = first_calls(None, torch.cuda.synchronize, host_copy,
                                       make=lambda: twin.compiled_call(mode, x_cl))
    return seconds, first, call, cache_state(before, fx_cache_counts(torch))


@contextlib.contextmanager
def compiling(torch: Any) -> Iterator[None]:
    """``with compiling(torch):`` inductor compiles with every core; after it, torch's
    compile caches are reset (torch._dynamo.reset()) so later lessons in the process start
    clean, and the setting is restored."""
    try:
        config = importlib.import_module("torch._inductor.config")
        saved = config.compile_threads
    except Exception:  # a torch without inductor: torch.compile will say why, per variant
        config = None
    else:
        config.compile_threads = os.cpu_count() or 1
    try:
        yield
    finally:
        if config is not None:
            config.compile_threads = saved
        with contextlib.suppress(Exception):
            importlib.import_module("torch._dynamo").reset()
