"""Lesson 29 `determinism`: bitwise run-to-run equality, and what autotuning's first call costs.

Part 1, determinism. Each computation runs `repeats` times on the same input and
every result is copied to the host; the lesson counts the distinct results bit
for bit (the bytes compared, so NaNs and signed zeros count too) and how far
apart they lie. cudalab: the reductions sum, mean and max over a large float32
array, softmax, matmul in fp32, tf32 and fp16, and an nn.MLP trained `steps`
SGD steps from the same weights on the same batches (its final weights).
Where PyTorch is installed: the same computations in torch, and four that
torch documents as nondeterministic on CUDA by default -- index_add_,
scatter_add_ and index_put_(accumulate=True), which add floats with atomics,
and a convolution's weight gradient (cuDNN may choose an algorithm that
does) -- each with torch's default and with
``torch.use_deterministic_algorithms(True)`` and
``torch.backends.cudnn.deterministic = True``, timed both ways. torch
refuses cuBLAS work under the deterministic setting unless
CUBLAS_WORKSPACE_CONFIG was set before cuBLAS started; the lesson says
whether it was and measures what it can.

Part 2, autotuning. ``torch.backends.cudnn.benchmark`` off and on for a 3x3
convolution: the first call of a shape not seen before (with benchmark on,
cuDNN times its candidate algorithms then), on fresh shapes, and the
steady-state time per image afterwards. cudalab's analogue is nn.fusion,
which times GELU in the GEMM's epilogue against a separate kernel once per
problem: the first training step after ``nn.fusion.forget()`` against a
cached one, and the step with its choice against each form forced. It also
shows why autotuning and bitwise reproducibility pull apart: the two forms
compute the same function with different roundings.

Every torch flag and nn.fusion's mode are put back afterwards.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import _precision, nn
from cudalab.nn import fusion

from ..bench import host_clock, host_measurement
from ..nn import torch_twin as TT
from . import _params as P
from . import training as T
from ._measuring import break_even_uses, rel_error
from .registry import LessonRun, lesson

NAME = "determinism"
REDUCTIONS = ("sum", "mean", "max")
# cudalab matmul modes: (operand dtype, float32 matmul precision), from the precision table.
MATMUL_MODES = {m: (_precision.storage(m), _precision.matmul_precision(m))
                for m in ("fp32", "tf32", "fp16")}
# torch ops that add floats with atomics on CUDA by default.
ATOMIC_OPS = ("index_add_", "scatter_add_", "index_put_")
CONV_GRAD = "conv2d weight grad"
MLP = "MLP training"
SETTINGS = ("default", "deterministic")
# Why cudalab's computations repeat bit for bit, read from the kernels (cuda/ops/reduce.cu,
# softmax.cu, row_softmax.cuh, cross_entropy.cu, multi_tensor.cu) and csrc/ops/matmul_plan.c;
# a finding adds the reason only when every run agreed.
WHY_SAME = {
    "reductions": "every thread, warp and block combines its values in an order fixed by the "
                  "shape and the device (per-chunk partials finished in a fixed order), "
                  "no atomics",
    "softmax": "each row's max and sum are combined in a fixed order by one warp or one "
               "block, no atomics",
    "matmul": "cuBLASLt's heuristic picks the algorithm from the problem's shape and layout "
              "(nothing is timed) and the plan is cached, so every call runs the same kernel "
              "in the same order",
    "mlp": "the GEMMs as above, the loss reduced in one block, the optimizer element-wise, "
           "and nn.fusion's choice measured once and then kept for the process",
}
# SGD for the training runs: a small difference stays small (no Adam normalisation).
LR = 0.01
MOMENTUM = 0.9
BATCHES = 4
# A deterministic setting "costs speed" when the op takes at least this many times as long.
DET_COSTLY = 1.1
# cudnn.benchmark "speeds up" the convolution from this per-image speedup on.
BENCHMARK_FASTER = 1.05
# Autotuning "gains" when the slower fixed GELU form takes this many times the tuned step.
FUSION_GAINS = 1.05
# Checks: float32 sums of positive values (a tree's error grows slowly) against float64 NumPy.
SUM_TOL = 1e-5
SOFTMAX_TOL = 1e-5
MATMUL_TOL = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2}
LOSS_TOL = 1e-4
# torch's atomic sums against NumPy's float64 bincount (float32 sums of ~1000s of values).
SCATTER_TOL = 1e-5
# Weights after `steps` float32 SGD steps computed two ways (rounding differences only).
WEIGHTS_TOL = 1e-3
# A convolution's weight gradient by two cuDNN algorithms (TF32 may be on, cuDNN's default).
CONV_TOL = 1e-2
CHECK_ROWS = 16
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
HOST_REPEATS = {True: 5, False: 20}
FIRST_TIMER = "host clock around one first call + synchronize, each on a problem not seen before"
CACHED_TIMER = "host clock around one call + synchronize"
ERROR_CHARS = 160

ROW_KEYS = ("part", "impl", "op", "setting", "runs", "distinct", "max_diff", "us", "vs_default",
            "first_call_ms", "note")

# Convolution shapes this process has already run: cuDNN caches the algorithm per shape
# (whatever the benchmark flag), so a "first call" must use a shape never seen before.
_SEEN_CONV_SHAPES: set[tuple[int, int, int]] = set()


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def same_bits(a: Any, b: Any) -> bool:
    """Whether `a` and `b` have the same dtype, shape and bytes (NaN == NaN, -0.0 != 0.0)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(np.frombuffer(a.tobytes(), dtype=np.uint8),
                               np.frombuffer(b.tobytes(), dtype=np.uint8)))


class Tally:
    """The distinct results, bit for bit, of repeated runs of one computation.

    Only one copy of each distinct result is kept (a deterministic computation
    keeps one, whatever the number of runs).
    """

    def __init__(self) -> None:
        self.runs = 0
        self.distinct: list[np.ndarray] = []

    def add(self, result: Any) -> None:
        a = np.array(result, copy=True)
        self.runs += 1
        if not any(same_bits(a, d) for d in self.distinct):
            self.distinct.append(a)

    @property
    def count(self) -> int:
        return len(self.distinct)

    def spread(self) -> float:
        """The largest difference of a distinct result from the first run's, relative
        to the first run's largest magnitude (0 when every run agreed)."""
        if self.count < 2:
            return 0.0
        first = self.distinct[0].astype(np.float64)
        return max(rel_error(d.astype(np.float64), first) for d in self.distinct[1:])


def tally(fn: Callable[[], Any], runs: int) -> Tally:
    """`fn()` (a host array) `runs` times, tallied."""
    t = Tally()
    for _ in range(runs):
        t.add(fn())
    return t


def short_error(exc: BaseException) -> str:
    """The first line of an exception's message, at most ERROR_CHARS characters."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 3] + "..."


def cublas_config_ok(value: str | None) -> bool:
    """Whether CUBLAS_WORKSPACE_CONFIG holds one of the values torch accepts as deterministic."""
    return value in CUBLAS_DETERMINISTIC


def group_text(impl: str, tallies: Mapping[str, Tally], why: str = "") -> str:
    """One sentence on a group of computations: those identical in every run (and `why`),
    then each that was not, with how far apart its results lay."""
    same = [k for k, t in tallies.items() if t.count == 1]
    parts = []
    if same:
        runs = min(tallies[k].runs for k in same)
        each = " each" if len(same) > 1 else ""
        text = f"{impl} {', '.join(same)}: bitwise identical in {runs} of {runs} runs{each}"
        parts.append(text + (f": {why}" if why else ""))
    for k, t in tallies.items():
        if t.count > 1:
            parts.append(f"{impl} {k}: {t.count} distinct results in {t.runs} runs, up to "
                         f"{t.spread():.1e} apart (relative to its largest value)")
    return "; ".join(parts)


def setting_text(op: str, default: Tally, det: Tally | str,
                 default_s: float | None, det_s: float | None) -> str:
    """One sentence on a torch op by default and under the deterministic setting; `det` is
    the error message when torch refused to run it so."""
    head = f"torch {op}: {default.count} distinct result{'s' if default.count > 1 else ''} in " \
           f"{default.runs} runs by default"
    if default.count > 1:
        head += f" (up to {default.spread():.1e} apart)"
    if isinstance(det, str):
        return head + f"; under use_deterministic_algorithms(True) torch refuses it: {det}"
    head += f"; {det.count} in {det.runs} with the deterministic setting"
    if default_s and det_s:
        head += (f", at {det_s / default_s:.2f}x the time ({det_s * 1e6:.1f} vs "
                 f"{default_s * 1e6:.1f} us)")
    return head


def cublas_text(value: str | None, error: str | None) -> str:
    """One sentence on CUBLAS_WORKSPACE_CONFIG and whether torch ran cuBLAS work under
    use_deterministic_algorithms(True) (`error`: its refusal, None when it ran)."""
    state = f"{CUBLAS_ENV}={value}" if value is not None else f"{CUBLAS_ENV} is not set"
    if error is None:
        text = f"{state}: torch ran its float32 matmul under use_deterministic_algorithms(True)"
        if not cublas_config_ok(value):
            text += (f", though cuBLAS is only guaranteed deterministic with {CUBLAS_ENV} "
                     f"{' or '.join(CUBLAS_DETERMINISTIC)} set before it starts")
        return text
    return (f"{state}: under use_deterministic_algorithms(True) torch refuses cuBLAS work "
            f"({error}), so its matmuls and MLP ran with the default setting only; set "
            f"{CUBLAS_ENV}={CUBLAS_DETERMINISTIC[0]} in the environment before the process "
            f"first uses cuBLAS to run them deterministically")


def benchmark_text(first_on_s: float, first_off_s: float, on_s: float,
                   off_s: float) -> tuple[float, str]:
    """(steady-state speedup of cudnn.benchmark, one sentence); `on_s` and `off_s` are per
    call of the same batch."""
    speedup = off_s / on_s if on_s > 0 else float("inf")
    text = (f"cudnn.benchmark: the first call of a new shape took {first_on_s * 1e3:.1f} ms "
            f"with it on (cuDNN times its candidate algorithms) vs {first_off_s * 1e3:.1f} ms "
            f"off; afterwards {on_s * 1e6:.1f} vs {off_s * 1e6:.1f} us per call "
            f"({speedup:.2f}x)")
    uses = break_even_uses(max(first_on_s - first_off_s, 0.0), off_s, on_s)
    if speedup < BENCHMARK_FASTER or uses is None:
        return speedup, text + (": the search found nothing clearly faster than the "
                                "heuristic's pick at this shape, so it does not pay back")
    return speedup, text + (f": the search pays for itself after {uses} calls of the same "
                            f"shape, and every new shape (a last partial batch, another "
                            f"image size) pays it again")


def fusion_text(first_s: float, cached_s: float, auto_s: float, fused_s: float,
                split_s: float, problems: int, choices: int, remeasured: int) -> tuple[float, str]:
    """(the tuned step's gain over the slower fixed GELU form, one sentence on nn.fusion)."""
    worse = max(fused_s, split_s)
    gain = worse / auto_s if auto_s > 0 else float("inf")
    text = (f"nn.fusion: the first step after forget() took {first_s * 1e3:.2f} ms (it times "
            f"both GELU forms of {problems} problems and synchronizes) vs "
            f"{cached_s * 1e3:.2f} ms once cached; the step runs {auto_s * 1e3:.3f} ms with "
            f"its choices, {fused_s * 1e3:.3f} ms all fused, {split_s * 1e3:.3f} ms all split")
    if gain >= FUSION_GAINS:
        uses = break_even_uses(max(first_s - cached_s, 0.0), worse, auto_s)
        text += f": {gain:.2f}x over the slower form, repaid after {uses} steps"
    else:
        text += ": at this size the forms cost about the same, so the choice buys little"
    if remeasured > 1:
        same = "the same choices each time" if choices == 1 else f"{choices} different sets " \
               f"of choices"
        text += f"; measured {remeasured} times, it made {same}"
    return gain, text


def fusion_bits_text(equal: bool, diff: float) -> str:
    """One sentence on training with GELU fused vs split: whether the weights agree bit
    for bit."""
    if equal:
        return ("nn.MLP trained with GELU fused into the GEMM and with a separate GELU kernel "
                "ends with bitwise identical weights: here the autotuner's choice does not "
                "change the bits")
    return (f"nn.MLP trained with GELU fused into the GEMM and with a separate GELU kernel "
            f"ends with weights up to {diff:.1e} apart, not bitwise equal: an autotuner (nn."
            f"fusion, cudnn.benchmark) keeps its choice within a process, but another process "
            f"may choose otherwise, so bitwise repeatable runs across processes need the "
            f"choice fixed (nn.fusion.set_gelu_fusion, cudnn.benchmark = False)")


def fresh_batches(base: int, count: int, seen: set[tuple[int, int, int]], channels: int,
                  hw: int) -> list[int]:
    """The first `count` batch sizes from `base` on whose (batch, channels, hw) shape is not
    in `seen`; they are added to `seen`."""
    out, b = [], base
    while len(out) < count:
        if (b, channels, hw) not in seen:
            seen.add((b, channels, hw))
            out.append(b)
        b += 1
    return out


class TorchFlags:
    """``with TorchFlags(torch, deterministic=..., cudnn_deterministic=..., benchmark=...):``

    Sets the torch global flags given (None leaves one as it is):
    ``torch.use_deterministic_algorithms``, ``torch.backends.cudnn.deterministic``
    and ``torch.backends.cudnn.benchmark``; all of them, warn_only included,
    are put back on exit, also after an error.
    """

    def __init__(self, torch: Any, *, deterministic: bool | None = None,
                 cudnn_deterministic: bool | None = None, benchmark: bool | None = None) -> None:
        self.torch = torch
        self.wanted = (deterministic, cudnn_deterministic, benchmark)

    def __enter__(self) -> TorchFlags:
        t, c = self.torch, self.torch.backends.cudnn
        self.saved = (t.are_deterministic_algorithms_enabled(),
                      t.is_deterministic_algorithms_warn_only_enabled(), c.deterministic,
                      c.benchmark)
        deterministic, cudnn_deterministic, benchmark = self.wanted
        try:
            if deterministic is not None:
                t.use_deterministic_algorithms(deterministic)
            if cudnn_deterministic is not None:
                c.deterministic = cudnn_deterministic
            if benchmark is not None:
                c.benchmark = benchmark
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        deterministic, warn_only, cudnn_deterministic, benchmark = self.saved
        self.torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        self.torch.backends.cudnn.deterministic = cudnn_deterministic
        self.torch.backends.cudnn.benchmark = benchmark


def _attempt(fn: Callable[[], Any]) -> Any:
    """fn()'s result, or the message (a str) of the RuntimeError torch raised instead."""
    try:
        return fn()
    except RuntimeError as exc:
        return short_error(exc)


# ---- part 1: cudalab, repeated -------------------------------------------------------------


def _train_ours(sizes: tuple[int, ...], batches: Sequence[tuple[Any, Any]], steps: int,
                seed: int) -> np.ndarray:
    """The final weights (all parameters, flattened) of `steps` fp32 SGD steps from seed."""
    model = nn.MLP(sizes, "gelu", seed=seed)
    opt = nn.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for i in range(steps):
        x, labels = batches[i % len(batches)]
        nn.train_step(model, opt, x, labels, "fp32")
    return np.concatenate([q.value.get().ravel() for q in model.parameters()])


def _ours(r: LessonRun, data: dict[str, Any]) -> dict[str, Tally]:
    p, runs = r.params, r.params["repeats"]
    a, x = data["a"], data["x"]
    out = {op: tally(lambda f=getattr(cudalab, op): f(a).get(), runs) for op in REDUCTIONS}
    out["softmax"] = tally(lambda: cudalab.softmax(x, axis=-1).get(), runs)
    for mode, (dtype, precision) in MATMUL_MODES.items():
        ma, mb = data["matmul"][dtype]
        out[f"matmul {mode}"] = tally(lambda: cudalab.matmul(ma, mb, precision=precision).get(),
                                      runs)
    out[MLP] = tally(lambda: _train_ours(data["sizes"], data["batches"], p["steps"], p["seed"]),
                     runs)
    return out


def _checks_ours(r: LessonRun, data: dict[str, Any], ours: Mapping[str, Tally]) -> None:
    a_host = data["a_host"].astype(np.float64)
    for op in REDUCTIONS:
        want = getattr(np, op)(a_host)
        r.check(f"cudalab {op} of {a_host.size} float32 values vs float64 NumPy",
                rel_error(ours[op].distinct[0], want), 0.0 if op == "max" else SUM_TOL)
    xr = data["x_host"][:CHECK_ROWS].astype(np.float64)
    e = np.exp(xr - xr.max(axis=-1, keepdims=True))
    r.check(f"cudalab softmax of {len(xr)} rows vs float64 NumPy",
            rel_error(ours["softmax"].distinct[0][:CHECK_ROWS], e / e.sum(-1, keepdims=True)),
            SOFTMAX_TOL)
    for mode, (dtype, _) in MATMUL_MODES.items():
        ha, hb = (m.get().astype(np.float64) for m in data["matmul"][dtype])
        r.check(f"cudalab matmul {mode}: {CHECK_ROWS} rows vs float64 NumPy",
                rel_error(ours[f"matmul {mode}"].distinct[0][:CHECK_ROWS], ha[:CHECK_ROWS] @ hb),
                MATMUL_TOL[mode])
    rows, error = T.initial_loss_error(data["sizes"], r.params["seed"], *data["batches"][0],
                                       CHECK_ROWS)
    r.check(f"MLP fp32 loss of the initial model on {rows} rows vs float64 NumPy", error,
            LOSS_TOL)


def _fused_vs_split(r: LessonRun, data: dict[str, Any]) -> tuple[bool, float]:
    """Train once with GELU forced fused and once forced split: (bitwise equal, difference)."""
    p, mode = r.params, fusion.get_gelu_fusion()
    weights = {}
    try:
        for form in ("fused", "split"):
            fusion.set_gelu_fusion(form)
            weights[form] = _train_ours(data["sizes"], data["batches"], p["steps"], p["seed"])
    finally:
        fusion.set_gelu_fusion(mode)
    diff = rel_error(weights["split"], weights["fused"])
    r.check(f"MLP weights after {p['steps']} SGD steps, GELU split vs fused", diff, WEIGHTS_TOL)
    return same_bits(weights["fused"], weights["split"]), diff


# ---- part 1: torch, repeated, default and deterministic ------------------------------------


def _train_theirs(torch: Any, sizes: tuple[int, ...], tb: Sequence[tuple[Any, Any]], steps: int,
                  seed: int) -> np.ndarray:
    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=seed))
    opt = torch.optim.SGD(twin.parameters(), lr=LR, momentum=MOMENTUM)
    step = TT.torch_train_step(torch, twin, opt, None, "fp32")
    for i in range(steps):
        x, labels = tb[i % len(tb)]
        step(x, labels)
    return np.concatenate([q.detach().cpu().numpy().ravel() for q in twin.parameters()])


def _theirs_same(r: LessonRun, torch: Any, data: dict[str, Any]) -> dict[str, Any]:
    """torch's sum, mean, max, softmax, matmuls and MLP training, repeated (default setting),
    and its float32 matmul attempted under the deterministic setting."""
    p, runs = r.params, r.params["repeats"]
    ta, tx = torch.from_dlpack(data["a"]), torch.from_dlpack(data["x"])
    out: dict[str, Any] = {}
    with TorchFlags(torch, deterministic=False, cudnn_deterministic=False, benchmark=False):
        for op in REDUCTIONS:
            out[op] = tally(lambda f=getattr(torch, op): f(ta).cpu().numpy(), runs)
        out["softmax"] = tally(lambda: torch.softmax(tx, dim=-1).cpu().numpy(), runs)
        for mode, (dtype, _) in MATMUL_MODES.items():
            ma, mb = (torch.from_dlpack(m) for m in data["matmul"][dtype])
            with TT.Tf32(torch, mode == "tf32"):
                out[f"matmul {mode}"] = tally(lambda: torch.matmul(ma, mb).cpu().numpy(), runs)
        tb = TT.torch_batches(torch, data["batches"])
        with TT.Tf32(torch, False):
            out[MLP] = tally(lambda: _train_theirs(torch, data["sizes"], tb, p["steps"],
                                                   p["seed"]), runs)
    fa, fb = (torch.from_dlpack(m) for m in data["matmul"]["float32"])
    with TorchFlags(torch, deterministic=True, cudnn_deterministic=True, benchmark=False), \
            TT.Tf32(torch, False):
        det = _attempt(lambda: tally(lambda: torch.matmul(fa, fb).cpu().numpy(), runs))
    return {"tallies": out, "matmul_det": det}


def _atomic_ops(torch: Any, p: Mapping[str, Any]) -> tuple[dict[str, Callable[[], Any]],
                                                            np.ndarray]:
    """index_add_, scatter_add_, index_put_(accumulate=True) of `scatter_size` values into
    `bins` float32 bins (new zeros each call), and NumPy's float64 answer."""
    rng = np.random.default_rng(p["seed"] + 5)
    n, bins = p["scatter_size"], p["bins"]
    src_h = rng.standard_normal(n).astype(np.float32)
    idx_h = rng.integers(0, bins, n)
    src = torch.as_tensor(src_h, device="cuda")
    idx = torch.as_tensor(idx_h, device="cuda")
    want = np.bincount(idx_h, weights=src_h.astype(np.float64), minlength=bins)

    def zeros() -> Any:
        return torch.zeros(bins, device="cuda", dtype=torch.float32)

    ops = {
        "index_add_": lambda: zeros().index_add_(0, idx, src),
        "scatter_add_": lambda: zeros().scatter_add_(0, idx, src),
        "index_put_": lambda: zeros().index_put_((idx,), src, accumulate=True),
    }
    return ops, want


def _conv_data(torch: Any, p: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(x, w, g) of a 3x3 convolution: input, weight (requires grad), output gradient."""
    gen = torch.Generator(device="cuda").manual_seed(p["seed"])
    b, c, hw = p["conv_batch"], p["conv_channels"], p["conv_hw"]
    x = torch.randn(b, c, hw, hw, device="cuda", generator=gen)
    w = torch.randn(c, c, 3, 3, device="cuda", generator=gen) / math.sqrt(9 * c)
    g = torch.randn(b, c, hw, hw, device="cuda", generator=gen)
    _SEEN_CONV_SHAPES.add((b, c, hw))
    return x, w.requires_grad_(True), g


def _conv_grad(torch: Any, x: Any, w: Any, g: Any) -> Callable[[], Any]:
    """The weight gradient of conv2d(x, w): the forward made now (under the current flags),
    the backward repeated on it by each call."""
    y = torch.nn.functional.conv2d(x, w, padding=1)
    return lambda: torch.autograd.grad(y, w, g, retain_graph=True)[0]


def _theirs_settings(r: LessonRun, torch: Any) -> dict[str, dict[str, Any]]:
    """The ops torch makes nondeterministic by default, repeated and timed in both settings:
    {op: {"default": Tally or error, "deterministic": Tally or error, "default_m",
    "deterministic_m": Measurement or None}}."""
    p, runs = r.params, r.params["repeats"]
    atomic, want = _atomic_ops(torch, p)
    conv = _conv_data(torch, p)
    out: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        on = setting == "deterministic"
        suffix = "" if setting == "default" else " deterministic"
        with TorchFlags(torch, deterministic=on, cudnn_deterministic=on, benchmark=False):
            grad = _attempt(lambda: _conv_grad(torch, *conv))
            ops = {**atomic, CONV_GRAD: grad}
            for op, fn in ops.items():
                got = fn if isinstance(fn, str) else \
                    _attempt(lambda fn=fn: tally(lambda: fn().cpu().numpy(), runs))
                x = out.setdefault(op, {})
                x[setting], x[f"{setting}_m"] = got, None
                if isinstance(got, str):
                    continue
                if op != CONV_GRAD:
                    r.check(f"torch {op} ({setting}) of {p['scatter_size']} values into "
                            f"{p['bins']} bins vs float64 NumPy",
                            rel_error(got.distinct[0], want), SCATTER_TOL)
                x[f"{setting}_m"] = r.measure(f"torch {op}{suffix}", fn,
                                              description=f"torch {op}, {setting} setting")
    grads = out[CONV_GRAD]
    if not any(isinstance(t, str) for t in (grads["default"], grads["deterministic"])):
        r.check("torch conv2d weight grad: deterministic vs default algorithms",
                rel_error(grads["deterministic"].distinct[0], grads["default"].distinct[0]),
                CONV_TOL)
    return out


# ---- part 2: autotuning --------------------------------------------------------------------


def _conv_autotune(r: LessonRun, torch: Any) -> dict[str, Any]:
    """cudnn.benchmark off and on: first calls on fresh shapes (host clock) and the
    steady state, per call of batch conv_batch (the "on" run uses batch + 1, a shape of its
    own, since cuDNN's algorithm cache is shared by both settings)."""
    p = r.params
    b, c, hw = p["conv_batch"], p["conv_channels"], p["conv_hw"]
    conv = torch.nn.functional.conv2d
    gen = torch.Generator(device="cuda").manual_seed(p["seed"] + 1)
    w = torch.randn(c, c, 3, 3, device="cuda", generator=gen) / math.sqrt(9 * c)
    out: dict[str, Any] = {}
    _SEEN_CONV_SHAPES.update({(b, c, hw), (b + 1, c, hw)})
    with torch.no_grad():
        for on in (False, True):
            name = "on" if on else "off"
            with TorchFlags(torch, deterministic=False, cudnn_deterministic=False, benchmark=on):
                [warm] = fresh_batches(b + 2, 1, _SEEN_CONV_SHAPES, c, hw)
                conv(torch.randn(warm, c, hw, hw, device="cuda", generator=gen), w, padding=1)
                firsts = []
                for n in fresh_batches(b + 2, p["first_calls"], _SEEN_CONV_SHAPES, c, hw):
                    x = torch.randn(n, c, hw, hw, device="cuda", generator=gen)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    conv(x, w, padding=1)
                    torch.cuda.synchronize()
                    firsts.append(time.perf_counter() - t0)
                label = f"torch conv2d first call benchmark {name}"
                first = r.add(host_measurement(firsts, calls=1, label=label, timer=FIRST_TIMER,
                                               host_time=False), label)
                n = b + int(on)
                x = torch.randn(n, c, hw, hw, device="cuda", generator=gen)
                steady = r.measure(f"torch conv2d benchmark {name}",
                                   lambda x=x: conv(x, w, padding=1),
                                   flops=2.0 * n * c * c * 9 * hw * hw,
                                   description=f"3x3 conv2d, batch {n}, cudnn.benchmark {name}")
                out[name] = {"first": first, "steady": steady, "per_call": steady.median * b / n}
    return out


def _fusion_autotune(r: LessonRun, data: dict[str, Any]) -> dict[str, Any]:
    """nn.fusion: the first step after forget() (host clock), a cached step, and the step
    with its choices vs each form forced (CUDA events)."""
    p, sizes = r.params, data["sizes"]
    model = nn.MLP(sizes, "gelu", seed=p["seed"])
    opt = nn.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    one = T.cycle(lambda x, labels: nn.train_step(model, opt, x, labels, "fp32"),
                  data["batches"])

    def synced() -> None:
        one()
        cudalab.synchronize()

    flops = T.step_flops(sizes, p["batch"])
    mode = fusion.get_gelu_fusion()
    out: dict[str, Any] = {}
    try:
        fusion.set_gelu_fusion("auto")
        synced()  # buffers, GEMM plans, kernels: all warm but the measurement
        firsts, choices = [], set()
        for _ in range(p["first_calls"]):
            fusion.forget()
            t0 = time.perf_counter()
            synced()
            firsts.append(time.perf_counter() - t0)
            made = fusion.decisions()
            choices.add(tuple(sorted((repr(k), v["fused"]) for k, v in made.items())))
        out["problems"], out["choices"] = len(made), len(choices)
        [cached] = host_clock({"cached": synced}, HOST_REPEATS[r.quick],
                              warmup=r.timer.settings.warmup).values()
        label = "mlp step first call after forget()"
        out["first"] = r.add(host_measurement(firsts, calls=1, label=label, timer=FIRST_TIMER,
                                              host_time=False), label)
        out["cached"] = r.add(host_measurement(cached, calls=1, label="mlp step cached",
                                               timer=CACHED_TIMER, host_time=False),
                              "mlp step cached")
        out["auto"] = r.measure("mlp step auto", one, flops=flops,
                                description="one training step, nn.fusion's choices")
        for form in ("fused", "split"):
            fusion.set_gelu_fusion(form)
            out[form] = r.measure(f"mlp step {form}", one, flops=flops,
                                  description=f"one training step, GELU {form}")
    finally:
        fusion.set_gelu_fusion(mode)
    return out


# ---- the lesson ----------------------------------------------------------------------------


def check_params(p: Mapping[str, Any]) -> tuple[int, ...]:
    """The MLP's sizes from the params; ValueError on any bad parameter."""
    P.ints(NAME, p, "repeats", minimum=2)
    P.ints(NAME, p, "size", "matmul_size", "batch", "steps", "scatter_size", "bins",
           "conv_batch", "conv_channels", "conv_hw", "first_calls")
    P.int_lists(NAME, p, "softmax_shape")
    if len(p["softmax_shape"]) != 2:
        raise ValueError(f"lesson {NAME!r}: softmax_shape must be (rows, columns), got "
                         f"{p['softmax_shape']!r}")
    if p["bins"] > p["scatter_size"]:
        raise ValueError(f"lesson {NAME!r}: bins must be <= scatter_size (many values add into "
                         f"each bin), got bins={p['bins']} and scatter_size={p['scatter_size']}")
    sizes = T.check_sizes(NAME, p)
    P.seed(NAME, p)
    return sizes


def _data(p: Mapping[str, Any], sizes: tuple[int, ...]) -> dict[str, Any]:
    seed, n = p["seed"], p["matmul_size"]
    # Positive values: the sum's relative error stays small enough to check tightly.
    a = cudalab.random.uniform((p["size"],), 0.5, 1.5, seed=seed)
    x = cudalab.random.normal(tuple(p["softmax_shape"]), seed=seed + 1)
    ma = cudalab.random.normal((n, n), seed=seed + 2)
    mb = cudalab.random.normal((n, n), std=n ** -0.5, seed=seed + 3)
    matmul = {"float32": (ma, mb), "float16": (ma.astype("float16"), mb.astype("float16"))}
    batches = T.teacher_batches(sizes, p["batch"], min(BATCHES, p["steps"]), seed)
    return {"a": a, "a_host": a.get(), "x": x, "x_host": x.get(), "matmul": matmul,
            "sizes": sizes, "batches": batches}


@lesson(29, NAME, title="Determinism: bitwise repeatable runs, and the price of autotuning",
        seed="Chapter 17 'Using torch with CUDA', 17.9 benchmark settings "
             "(torch.backends.cudnn.benchmark = True lets PyTorch pick the fastest convolution "
             "algorithms; cudnn.deterministic = True for exact reproducibility)",
        params={"repeats": 20, "size": 1 << 26, "softmax_shape": (16384, 1000),
                "matmul_size": 2048, "in_features": 256, "hidden": (1024, 1024, 1024),
                "classes": 16, "batch": 1024, "steps": 20, "scatter_size": 1 << 22,
                "bins": 1024, "conv_batch": 32, "conv_channels": 96, "conv_hw": 40,
                "first_calls": 5, "seed": 0},
        quick_params={"repeats": 5, "size": 1 << 22, "softmax_shape": (2048, 1000),
                      "matmul_size": 512, "hidden": (256, 256), "batch": 256, "steps": 8,
                      "scatter_size": 1 << 20, "conv_batch": 8, "conv_channels": 64,
                      "conv_hw": 28, "first_calls": 2},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    sizes = check_params(p)
    data = _data(p, sizes)
    ours = _ours(r, data)
    _checks_ours(r, data, ours)
    bits = _fused_vs_split(r, data)
    torch = r.torch()
    same = settings = tuned = None
    if torch is not None:
        same = _theirs_same(r, torch, data)
        r.check(f"torch MLP weights after {p['steps']} SGD steps vs cudalab's",
                rel_error(same["tallies"][MLP].distinct[0], ours[MLP].distinct[0]), WEIGHTS_TOL)
        settings = _theirs_settings(r, torch)
        tuned = _conv_autotune(r, torch)
    fused = _fusion_autotune(r, data)
    _rows(r, ours, same, settings, tuned, fused)
    _findings(r, ours, bits, same, settings, tuned, fused)
    _claims(r, settings, tuned, fused)


def _row(r: LessonRun, **fields: Any) -> None:
    r.row(**{k: fields.get(k) for k in ROW_KEYS})


def _repeat_row(r: LessonRun, impl: str, op: str, setting: str, t: Tally | str,
                m: Any = None, base: Any = None) -> None:
    if isinstance(t, str):
        _row(r, part="repeat", impl=impl, op=op, setting=setting, note=f"refused: {t}")
        return
    _row(r, part="repeat", impl=impl, op=op, setting=setting, runs=t.runs, distinct=t.count,
         max_diff=t.spread(), us=None if m is None else m.median * 1e6,
         vs_default=None if m is None or base is None else m.median / base.median)


def _rows(r: LessonRun, ours: Mapping[str, Tally], same: dict | None, settings: dict | None,
          tuned: dict | None, fused: dict) -> None:
    for op, t in ours.items():
        _repeat_row(r, "cudalab", op, "default", t)
    if same is not None:
        for op, t in same["tallies"].items():
            _repeat_row(r, "torch", op, "default", t)
        _repeat_row(r, "torch", "matmul fp32", "deterministic", same["matmul_det"])
    for op, x in (settings or {}).items():
        _repeat_row(r, "torch", op, "default", x["default"], x["default_m"])
        _repeat_row(r, "torch", op, "deterministic", x["deterministic"], x["deterministic_m"],
                    x["default_m"])
    for name, x in (tuned or {}).items():
        off = tuned["off"]["per_call"]
        _row(r, part="autotune", impl="torch", op="conv2d", setting=f"benchmark {name}",
             us=x["per_call"] * 1e6, vs_default=x["per_call"] / off,
             first_call_ms=x["first"].median * 1e3, note="time per call of the off batch")
    for form in ("auto", "fused", "split"):
        _row(r, part="autotune", impl="cudalab", op="mlp step", setting=f"GELU {form}",
             us=fused[form].median * 1e6, vs_default=fused[form].median / fused["auto"].median,
             first_call_ms=fused["first"].median * 1e3 if form == "auto" else None,
             note="auto: nn.fusion measures once per problem" if form == "auto" else None)


def _findings(r: LessonRun, ours: Mapping[str, Tally], bits: tuple[bool, float],
              same: dict | None, settings: dict | None, tuned: dict | None, fused: dict) -> None:
    groups = {"reductions": REDUCTIONS, "softmax": ("softmax",),
              "matmul": tuple(f"matmul {m}" for m in MATMUL_MODES), "mlp": (MLP,)}
    for kind, ops in groups.items():
        tallies = {op: ours[op] for op in ops}
        r.finding(group_text("cudalab", tallies, WHY_SAME[kind]),
                  value=max(t.count for t in tallies.values()), unit="distinct results")
    r.finding(fusion_bits_text(*bits), value=bits[1], unit="relative difference")
    if same is not None:
        tallies = same["tallies"]
        r.finding(group_text("torch", tallies), value=max(t.count for t in tallies.values()),
                  unit="distinct results")
        det = same["matmul_det"]
        r.finding(cublas_text(os.environ.get(CUBLAS_ENV), det if isinstance(det, str) else None))
    for op, x in (settings or {}).items():
        if isinstance(x["default"], str):
            r.finding(f"torch {op} failed with the default setting: {x['default']}")
            continue
        dm, tm = x["default_m"], x["deterministic_m"]
        labels = tuple(m.label for m in (dm, tm) if m is not None)
        r.finding(setting_text(op, x["default"], x["deterministic"],
                               dm.median if dm else None, tm.median if tm else None),
                  value=x["default"].count, unit="distinct results", labels=labels)
    if tuned is not None:
        on, off = tuned["on"], tuned["off"]
        speedup, text = benchmark_text(on["first"].median, off["first"].median, on["per_call"],
                                       off["per_call"])
        r.finding(text, value=speedup, unit="x",
                  labels=tuple(x[k].label for x in (on, off) for k in ("first", "steady")))
    gain, text = fusion_text(fused["first"].median, fused["cached"].median,
                             fused["auto"].median, fused["fused"].median, fused["split"].median,
                             fused["problems"], fused["choices"], r.params["first_calls"])
    r.finding(text, value=gain, unit="x",
              labels=tuple(fused[k].label for k in ("first", "cached", "auto", "fused", "split")))


def det_costs(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each op's deterministic time over its default time, where both were measured."""
    return {op: x["deterministic_m"].median / x["default_m"].median
            for op, x in settings.items()
            if x.get("default_m") is not None and x.get("deterministic_m") is not None}


def _claims(r: LessonRun, settings: dict | None, tuned: dict | None, fused: dict) -> None:
    if tuned is not None:
        speedup = tuned["off"]["per_call"] / tuned["on"]["per_call"]
        r.claim("cudnn.benchmark = True speeds up convolutions with fixed input sizes",
                tutorial=None, measured=speedup, unit="x", held=speedup >= BENCHMARK_FASTER,
                why=f"{speedup:.2f}x per call after the first; holds from {BENCHMARK_FASTER}x")
    if settings is not None:
        ran = {op: x["deterministic"] for op, x in settings.items()
               if not isinstance(x["deterministic"], str)}
        refused = [op for op, x in settings.items() if isinstance(x["deterministic"], str)]
        repeat = [op for op, t in ran.items() if t.count == 1]
        worst = max((t.count for t in ran.values()), default=0)
        why = f"{len(repeat)} of {len(settings)} ops bitwise identical in every run"
        if refused:
            why += f"; torch refused {', '.join(refused)}"
        r.claim("cudnn.deterministic = True (with torch.use_deterministic_algorithms(True)) "
                "gives exact reproducibility", tutorial=None, measured=worst,
                unit="distinct results", held=bool(ran) and len(repeat) == len(ran)
                and not refused, why=why)
        costs = det_costs(settings)
        if costs:
            typical = statistics.median(costs.values())
            r.claim("Deterministic algorithms cost speed", tutorial=None, measured=typical,
                    unit="x", held=typical >= DET_COSTLY,
                    why="median over the ops of deterministic / default time ("
                        + ", ".join(f"{op} {v:.2f}x" for op, v in costs.items())
                        + f"); holds from {DET_COSTLY}x")
    worse = max(fused["fused"].median, fused["split"].median)
    gain = worse / fused["auto"].median
    r.claim("Autotuning (measure the candidates once, keep the fastest) speeds up the steady "
            "state: cudalab's nn.fusion, the analogue of cudnn.benchmark", tutorial=None,
            measured=gain, unit="x", held=gain >= FUSION_GAINS,
            why=f"the tuned step vs the slower fixed GELU form: {gain:.2f}x; holds from "
                f"{FUSION_GAINS}x")


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = [x for x in result.rows if x["part"] == "repeat" and x["distinct"] is not None]
    labels = [f"{x['impl']} {x['op']}" + (" (det.)" if x["setting"] == "deterministic" else "")
              for x in rows]
    colors = ["tab:blue" if x["impl"] == "cudalab" else
              "tab:green" if x["setting"] == "deterministic" else "tab:orange" for x in rows]
    ys = list(range(len(rows)))
    ax.barh(ys, [x["distinct"] for x in rows], color=colors)
    for y, x in zip(ys, rows):
        note = f" of {x['runs']} runs"
        if x["vs_default"] is not None:
            note += f", {x['vs_default']:.2f}x the default's time"
        ax.annotate(note, (x["distinct"], y), fontsize=7, va="center")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("distinct results (bitwise) over repeated runs: 1 = reproducible")
