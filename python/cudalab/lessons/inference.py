"""Lesson 19 `inference`: ResNet-50 inference, CPU vs GPU, per batch size and precision.

The tutorial's inference comparison, on one set of weights: the NumPy
reference forward on the CPU (and torch on the CPU when installed) against
cudalab's GPU forward, for each batch size and precision (fp32, tf32, fp16,
bf16), issued eagerly (one C call per forward) and replayed from a CUDA
graph. Each row gives milliseconds per batch, images per second, and the
convolutions' and fc's useful TFLOP/s as a share of the measured GEMM
ceiling of that precision: small batches leave most of the GPU idle, large
ones approach what the GEMMs alone could do. Where torch and torchvision are
installed, torchvision's resnet50() with the same weights runs beside it:
eager NCHW, channels_last, and channels_last replayed from a
torch.cuda.CUDAGraph, and compiled by torch.compile in each of
`compile_modes` (static shapes, at the largest batch, for the precisions in
`compile_precisions`), with the wall clock of getting it ready (compiling,
autotuning in max-autotune, and the first calls, less those calls warm) as
its own row. GPU times are CUDA events around back-to-back forwards with no
spin-kernel hold, so a forward the host issues slower than the GPU runs it
is timed at the host's pace, as a serving loop sees it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import cudalab

from ..bench import ceiling, host_clock, host_measurement
from ..models import torch_twin as TW
from . import resnet as R
from ._measuring import break_even_uses, rel_error
from . import _params as P
from .registry import LessonCheckError, LessonRun, lesson

# GPU logits vs the float32 NumPy reference, relative to the largest |logit|:
# fp32 accumulates in fp32 (order differs); tf32 and fp16 keep 10 explicit
# mantissa bits through 54 GEMMs, bf16 only 7.
TOLERANCE = {"fp32": 1e-3, "tf32": 3e-2, "fp16": 3e-2, "bf16": 1e-1}
# A graph replay runs the very kernels of the eager forward on the same data.
TOL_REPLAY = 1e-6
# A CUDA graph "helps" when eager takes at least this many times as long.
GRAPH_HELPS = 1.1
# fp16 / bf16 "faster than fp32" from this ratio of times on.
HALF_FASTER = 1.3
# The GPU "much faster" than the CPU for inference from this ratio on.
GPU_MUCH_FASTER = 10.0
# cudalab at or above this fraction of torch's best speed counts as level with it.
LEVEL_WITH_TORCH = 0.95
# Below this % of the GEMM ceiling the forward is bound by something else
# (launches, memory-bound kernels, tiny GEMMs), not by tensor-core math.
LOW_PCT_PEAK = 20.0
# Host-clock repeats of the CPU forward per mode (the call takes 0.1-1 s).
CPU_REPEATS = {True: 1, False: 3}
# torch.compile's modes the lesson may run (lesson compilers times them all).
COMPILE_MODES = TW.COMPILE_MODES
# The full run compiles in default mode, fp16 only, at the largest batch: compiling
# ResNet-50 takes ~15 s per precision and mode on an H200 with a cold inductor cache
# (max-autotune minutes), and the full lesson's 84 s leave room for one.
FULL_COMPILE_MODES = ("default",)
FULL_COMPILE_PRECISIONS = ("fp16",)
SEED = 0


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def graph_text(batch: int, precision: str, eager_s: float, graph_s: float) -> tuple[float, str]:
    """(eager / graph, one sentence on what the CUDA graph changes)."""
    gain = eager_s / graph_s if graph_s > 0 else float("inf")
    head = (f"{precision} batch {batch}: eager {eager_s * 1e3:.3f} ms, graph replay "
            f"{graph_s * 1e3:.3f} ms ({gain:.2f}x)")
    if gain >= GRAPH_HELPS:
        return gain, head + ": the gaps between the forward's ~100 kernels are a real share"
    return gain, head + ": one C call already issues the kernels back to back"


def half_text(precision: str, batch: int, fp32_s: float, half_s: float) -> tuple[float, str]:
    """(fp32 time / half time, one sentence)."""
    speedup = fp32_s / half_s if half_s > 0 else float("inf")
    head = (f"{precision} at batch {batch}: {half_s * 1e3:.3f} ms vs fp32's {fp32_s * 1e3:.3f} ms "
            f"({speedup:.2f}x)")
    if speedup >= HALF_FASTER:
        return speedup, head + ": tensor cores and half the bytes per activation"
    return speedup, head + ": at this batch the time is not in the GEMMs' math"


def scaling_text(precision: str, small: tuple[int, float], big: tuple[int, float],
                 pct_small: float | None, pct_big: float | None) -> tuple[float, str]:
    """(images/s gain from the smallest to the largest batch, one sentence).

    `small` and `big` are (batch, images per second).
    """
    gain = big[1] / small[1] if small[1] > 0 else float("inf")
    text = (f"{precision}: {small[1]:.0f} images/s at batch {small[0]}, {big[1]:.0f} at batch "
            f"{big[0]} ({gain:.1f}x)")
    if pct_small is not None and pct_big is not None:
        text += (f"; the GEMMs reach {pct_small:.1f}% then {pct_big:.1f}% of the measured "
                 f"GEMM ceiling")
        if pct_big < LOW_PCT_PEAK:
            text += ": even the largest batch is bound by more than tensor-core math"
    return gain, text


def torch_text(precision: str, batch: int, ours_s: float, torch_s: float,
               torch_mode: str) -> tuple[float, str]:
    """(torch's best time / ours, one sentence): above 1, cudalab is faster."""
    ratio = torch_s / ours_s if ours_s > 0 else float("inf")
    text = (f"{precision} batch {batch}: cudalab {ours_s * 1e3:.3f} ms vs torch {torch_mode} "
            f"{torch_s * 1e3:.3f} ms: ")
    if ratio >= 1 / LEVEL_WITH_TORCH:
        return ratio, text + f"{ratio:.2f}x faster than torch"
    if ratio >= LEVEL_WITH_TORCH:
        return ratio, text + "level with torch"
    return ratio, text + f"torch is {1 / ratio:.2f}x faster"


def compiled_text(precision: str, batch: int, mode: str, ours: str, ours_s: float,
                  compiled_s: float, setup_s: float, cache: str | None,
                  base: str | None = None, base_s: float | None = None) -> tuple[float, str]:
    """(torch.compile's time / cudalab's `ours` mode's, one sentence with what compiling cost
    and, given torch's uncompiled `base` time, after how many calls it pays off)."""
    ratio = compiled_s / ours_s if ours_s > 0 else float("inf")
    text = (f"{precision} batch {batch}: cudalab {ours} {ours_s * 1e3:.3f} ms vs torch.compile "
            f"{mode} {compiled_s * 1e3:.3f} ms: ")
    if ratio >= 1 / LEVEL_WITH_TORCH:
        text += f"cudalab {ratio:.2f}x faster"
    elif ratio >= LEVEL_WITH_TORCH:
        text += "level"
    else:
        text += f"torch.compile {1 / ratio:.2f}x faster"
    text += (f", after {setup_s:.1f} s of compiling"
             + (f" (inductor's FX graph cache {cache})" if cache else ""))
    if base is not None and base_s is not None:
        n = break_even_uses(setup_s, base_s, compiled_s)
        text += (f"; against torch {base} ({base_s * 1e3:.3f} ms) the compile "
                 + ("never pays off" if n is None else f"pays off after {n:,} calls"))
    return ratio, text


def compile_plan(precisions: Sequence[str], batches: Sequence[int], modes: Sequence[str],
                 compile_precisions: Sequence[str]) -> list[tuple[str, int, str]]:
    """(precision, batch, mode) the run compiles: the largest batch, each precision of the
    run among `compile_precisions` (others are skipped: the CLI's --dtype picks the run's),
    each mode."""
    big = max(batches)
    return [(p, big, m) for p in precisions if p in compile_precisions for m in modes]


def compile_note(plan: Sequence[tuple[str, int, str]], precisions: Sequence[str],
                 modes: Sequence[str], compile_precisions: Sequence[str]) -> str | None:
    """One sentence on what torch.compile left out of this run and how to run it (None
    when nothing was left out)."""
    done = list(dict.fromkeys(p for p, _, _ in plan))
    rest = [p for p in precisions if p not in compile_precisions]
    rest_modes = [m for m in COMPILE_MODES if m not in modes]
    if not rest and not rest_modes:
        return None
    if not modes:
        what = "torch.compile did not run (compile_modes is empty)"
    elif not plan:
        what = "torch.compile did not run (no precision of this run is in compile_precisions)"
    else:
        what = (f"torch.compile ran in {', '.join(modes)} mode for {', '.join(done)} at batch "
                f"{plan[0][1]} only")
    sets = []
    if rest:
        sets.append(f"compile_precisions={','.join(precisions)}")
    if rest_modes:
        sets.append(f"compile_modes={','.join(COMPILE_MODES)}")
    return (f"{what}: compiling ResNet-50 takes ~15 s per precision and mode on a cold "
            f"inductor cache (max-autotune benchmarks every kernel choice: minutes). Run more "
            f"with `cudalab lesson inference --set {' --set '.join(sets)}`")


def cpu_text(batch: int, cpu_s: float, gpu_s: float, cpu_name: str) -> tuple[float, str]:
    """(CPU time / GPU time, one sentence)."""
    speedup = cpu_s / gpu_s if gpu_s > 0 else float("inf")
    return speedup, (f"batch {batch} fp32: {cpu_name} on the CPU {cpu_s * 1e3:.1f} ms, the GPU "
                     f"{gpu_s * 1e3:.3f} ms: {speedup:.0f}x")


def check_params(p: Any) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]]:
    """(batch sizes, precisions, CPU batch sizes) from the lesson's parameters, checked
    (the compile parameters too: `check_compile`)."""
    batches = R.check_batch_sizes(p["batch_sizes"], "lesson 'inference': batch_sizes")
    precisions = R.check_precisions(p["precisions"], "lesson 'inference': precisions")
    cpu = R.check_batch_sizes(p["cpu_batch_sizes"], "lesson 'inference': cpu_batch_sizes") \
        if len(p["cpu_batch_sizes"]) else ()
    P.bools("inference", p, "graph")
    check_compile(p)
    return batches, precisions, cpu


def check_compile(p: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile modes, compile precisions): each a sequence, possibly empty, of distinct
    names among COMPILE_MODES and the precisions."""
    modes = p["compile_modes"]
    if (isinstance(modes, (str, bytes)) or not hasattr(modes, "__len__")
            or not all(isinstance(m, str) and m in COMPILE_MODES for m in modes)
            or len(set(modes)) != len(modes)):
        raise ValueError(f"lesson 'inference': compile_modes must be a sequence of distinct "
                         f"names among {', '.join(COMPILE_MODES)} (empty: none), got {modes!r}")
    precs = p["compile_precisions"]
    if isinstance(precs, (str, bytes)) or not hasattr(precs, "__len__"):
        raise ValueError(f"lesson 'inference': compile_precisions must be a sequence of "
                         f"precisions (empty: none), got {precs!r}")
    precs = R.check_precisions(precs, "lesson 'inference': compile_precisions") \
        if len(precs) else ()
    return tuple(modes), precs


def _label(impl: str, mode: str, precision: str, batch: int) -> str:
    """'eager fp16 b8' for cudalab, 'torch channels_last fp16 b8', 'numpy cpu fp32 b1'."""
    head = "" if impl == "cudalab" else f"{impl} "
    return f"{head}{mode} {precision} b{batch}"


def _cpu_label(impl: str, batch: int) -> str:
    return _label(impl, "cpu", "fp32", batch)


def compile_mode(mode: str) -> str:
    """A torch.compile row's mode: 'compile-max-autotune' (its label
    'torch compile-max-autotune fp16 b32')."""
    return f"compile-{mode}"


def _torch_twin_label(label: str) -> str | None:
    """torch's channels_last rows pair with cudalab's eager (NHWC is its only layout);
    torch.compile's with cudalab's CUDA graph (compiled beside compiled: one program
    planned per batch shape, replayed)."""
    if label.startswith("torch channels_last "):
        return "eager " + label[len("torch channels_last "):]
    if label.startswith("torch compile-"):
        _, _, rest = label[len("torch compile-"):].partition(" ")
        return "graph " + rest if rest else None
    return None


# ---- measuring ------------------------------------------------------------------------------


def _row(r: LessonRun, impl: str, device: str, mode: str, precision: str, batch: int,
         m: Any) -> None:
    pct = m.percent_of_ceiling
    r.row(impl=impl, device=device, mode=mode, precision=precision, batch=batch,
          ms=m.median * 1e3, images_per_s=R.images_per_s(batch, m.median),
          gemm_tflops=None if m.flops is None else m.tflops,
          pct_gemm_peak=pct)


def _gpu_measure(r: LessonRun, label: str, fn: Any, flops: float, precision: str) -> Any:
    """Loop-paced CUDA-event timing (no hold): what back-to-back forwards cost."""
    m = r.timer.replace(hold=False).measure(fn, flops=flops, ceiling=R.CEILING_OF[precision],
                                            label=label)
    return r.add(m, label)


def _cpu_rows(r: LessonRun, torch_cpu: tuple[Any, Any] | None, params: Any, x_h: np.ndarray,
              cpu_batches: Sequence[int]) -> dict[int, np.ndarray]:
    """NumPy (and torch CPU) forwards, host clock; the NumPy logits per batch."""
    from ..models import reference

    logits: dict[int, np.ndarray] = {}
    for b in cpu_batches:
        x = x_h[:b]
        cases = {"numpy": lambda x=x, b=b: logits.__setitem__(b, reference.forward(params, x))}
        if torch_cpu is not None:
            torch, module = torch_cpu
            tx = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).contiguous()

            def run_torch(module=module, tx=tx) -> None:
                with torch.no_grad():
                    module(tx)
            cases["torch cpu"] = run_torch
        times = host_clock(cases, CPU_REPEATS[r.quick], 0.0)
        for case, t in times.items():
            impl = case.split()[0]
            label = _cpu_label(impl, b)
            m = r.add(host_measurement(t, calls=1, label=label, host_time=False,
                                       timer=f"host clock ({impl} on the CPU)"), label)
            _row(r, impl, "cpu", "eager", "fp32", b, m)
    return logits


def _torch_cpu_module(state: dict) -> tuple[Any, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    tv = TW.torchvision_or_none()
    return None if tv is None else (torch, TW.torch_resnet50(torch, tv, state))


def _check_batch1(r: LessonRun, model: Any, precision: str, x1: np.ndarray,
                  ref: np.ndarray) -> None:
    got = model(cudalab.asarray(x1)).get()
    r.check(f"{precision} GPU logits (batch {x1.shape[0]}) vs the NumPy fp32 reference, "
            f"relative to max |logit|", rel_error(got, ref), TOLERANCE[precision])


def _ours(r: LessonRun, model: Any, precision: str, b: int, x_h: np.ndarray,
          graph: bool) -> dict[str, float]:
    x = cudalab.asarray(x_h[:b])
    out = cudalab.empty((b, 1000), dtype="float32")
    flops = model.gemm_flops(b)
    eager = _gpu_measure(r, _label("cudalab", "eager", precision, b),
                         lambda: model.forward(x, out=out), flops, precision)
    _row(r, "cudalab", "gpu", "eager", precision, b, eager)
    times = {"eager": eager.median}
    if graph:
        g = model.capture(b)
        replayed = g(x).get()
        r.check(f"{precision} b{b}: graph replay vs eager forward", rel_error(replayed, out.get()),
                TOL_REPLAY)
        m = _gpu_measure(r, _label("cudalab", "graph", precision, b), g.replay, flops, precision)
        _row(r, "cudalab", "gpu", "graph", precision, b, m)
        times["graph"] = m.median
        del g
    return times


def _theirs(r: LessonRun, torch: Any, twin: Any, model: Any, precision: str, b: int,
            x_h: np.ndarray, ref1: np.ndarray | None) -> dict[str, float]:
    inputs = twin.inputs(x_h[:b])
    flops = model.gemm_flops(b)
    times = {}
    for mode in ("eager", "channels_last"):
        fn = twin.call(mode, inputs[mode])
        if b == 1 and ref1 is not None and mode == "eager":
            got = fn().float().cpu().numpy()
            r.check(f"torch {precision} logits (batch 1, same weights) vs the NumPy reference",
                    rel_error(got, ref1), TOLERANCE[precision])
        m = _gpu_measure(r, _label("torch", mode, precision, b), fn, flops, precision)
        _row(r, "torch", "gpu", mode, precision, b, m)
        times[mode] = m.median
    replay, _ = twin.graph(inputs["channels_last"])
    m = _gpu_measure(r, _label("torch", "graph", precision, b), replay, flops, precision)
    _row(r, "torch", "gpu", "graph", precision, b, m)
    times["graph"] = m.median
    return times


def _compiled(r: LessonRun, torch: Any, twin: Any, model: Any, precision: str, b: int,
              mode: str, x_h: np.ndarray, ref1: np.ndarray | None,
              notes: list[str]) -> dict[str, Any] | None:
    """torch.compile of the twin in `mode` at batch `b`, on a fresh dynamo cache: its
    logits checked, timed like the other torch rows, and getting ready as its own row;
    {"s", "setup_s", "cache"}, or None (and a note) when compiling fails here."""
    x_cl = twin.inputs(x_h[:b])["channels_last"]
    label = _label("torch", compile_mode(mode), precision, b)
    try:
        with TW.compiling(torch):  # dynamo reset after: later compiles start afresh
            seconds, first, call, cache = TW.compile_ready(torch, twin, mode, x_cl)
            if ref1 is not None:
                r.check(f"torch.compile {mode} {precision} logits (batch {b}, image 0) vs the "
                        f"NumPy reference", rel_error(first[:1], ref1), TOLERANCE[precision])
            m = _gpu_measure(r, label, call, model.gemm_flops(b), precision)
            del call
    except LessonCheckError:
        raise
    except Exception as exc:  # a torch whose inductor or triton does not work here
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        notes.append(f"torch.compile {mode} of ResNet-50 ({precision}, batch {b}) failed, so "
                     f"it has no row: {type(exc).__name__}: {first_line}")
        return None
    _row(r, "torch", "gpu", compile_mode(mode), precision, b, m)
    setup_s = TW.setup_cost(seconds, TW.FIRST_CALLS, m.median)
    r.row(impl="torch", device="host", mode=f"{compile_mode(mode)}: getting ready",
          precision=precision, batch=b, setup_s=setup_s, fx_cache=cache)
    return {"s": m.median, "setup_s": setup_s, "cache": cache}


def _precision(r: LessonRun, state: dict, precision: str, batches: Sequence[int],
               x_h: np.ndarray, ref1: np.ndarray | None, cpu_module: Any,
               plan: Sequence[tuple[str, int, str]] = (), compiled: dict | None = None,
               notes: list[str] | None = None) -> dict:
    """Every batch of one precision: cudalab (eager, graph) and torch; {batch: {impl mode: s}}.
    torch.compile's results of the `plan`'s entries go to `compiled[(precision, batch,
    mode)]`."""
    from .. import models

    model = models.resnet50(state, precision=precision)
    if ref1 is not None:
        _check_batch1(r, model, precision, x_h[:1], ref1)
    torch = r.torch() if cpu_module is not None else None
    got: dict[int, dict[str, float]] = {}
    with TW.torch_session(torch, cpu_module, precision) as twin:
        for b in batches:
            times = {f"cudalab {k}": v for k, v in
                     _ours(r, model, precision, b, x_h, r.params["graph"]).items()}
            if twin is not None:
                times.update({f"torch {k}": v for k, v in
                              _theirs(r, torch, twin, model, precision, b, x_h, ref1).items()})
                for mode in [m for p, bb, m in plan if (p, bb) == (precision, b)]:
                    done = _compiled(r, torch, twin, model, precision, b, mode, x_h, ref1,
                                     [] if notes is None else notes)
                    if done is not None and compiled is not None:
                        compiled[(precision, b, mode)] = done
            got[b] = times
            model.release(b)
    model.release()
    return got


# ---- findings ---------------------------------------------------------------------------------


def _best(times: dict[str, float], impl: str) -> tuple[str, float]:
    mine = {k: v for k, v in times.items() if k.startswith(impl + " ")}
    key = min(mine, key=mine.get)
    return key[len(impl) + 1:], mine[key]


def _findings(r: LessonRun, res: dict[str, dict], batches: Sequence[int]) -> None:
    small, big = min(batches), max(batches)
    rows = {(x["impl"], x["mode"], x["precision"], x["batch"]): x for x in r.rows
            if x["device"] == "gpu"}
    cpu = r.measurements.get(_cpu_label("numpy", 1))
    if cpu is not None and "fp32" in res and 1 in res["fp32"]:
        gpu_s = res["fp32"][1]["cudalab eager"]
        speedup, text = cpu_text(1, cpu.median, gpu_s, "NumPy")
        r.finding(text, value=speedup, unit="x",
                  labels=(_cpu_label("numpy", 1), _label("cudalab", "eager", "fp32", 1)))
        torch_cpu = r.measurements.get(_cpu_label("torch", 1))
        if torch_cpu is not None:
            ratio = cpu.median / torch_cpu.median
            r.finding(f"on the CPU at batch 1, torch takes {torch_cpu.median * 1e3:.1f} ms and "
                      f"the NumPy reference {cpu.median * 1e3:.1f} ms ({ratio:.1f}x): "
                      + ("torch's direct convolutions beat im2col + matmul in NumPy"
                         if ratio >= 1 else "NumPy's BLAS GEMMs hold their own"),
                      value=ratio, unit="x",
                      labels=(_cpu_label("numpy", 1), _cpu_label("torch", 1)))
        r.claim("the GPU runs ResNet-50 inference far faster than the CPU", tutorial=None,
                measured=speedup, unit="x", held=speedup >= GPU_MUCH_FASTER,
                why=f"fp32 batch 1 vs NumPy: {speedup:.0f}x; holds from {GPU_MUCH_FASTER:g}x")
    if r.params["graph"]:
        for prec in res:
            t = res[prec][small]
            gain, text = graph_text(small, prec, t["cudalab eager"], t["cudalab graph"])
            r.finding(text, value=gain, unit="x",
                      labels=(_label("cudalab", "eager", prec, small),
                              _label("cudalab", "graph", prec, small)))
    for prec in res:
        mode, s_small = _best(res[prec][small], "cudalab")
        mode_b, s_big = _best(res[prec][big], "cudalab")
        if big != small:
            pct = {b: rows[("cudalab", m, prec, b)]["pct_gemm_peak"]
                   for b, m in ((small, mode), (big, mode_b))}
            gain, text = scaling_text(prec, (small, R.images_per_s(small, s_small)),
                                      (big, R.images_per_s(big, s_big)), pct[small], pct[big])
            r.finding(text, value=gain, unit="x",
                      labels=(_label("cudalab", mode, prec, small),
                              _label("cudalab", mode_b, prec, big)))
        if any(k.startswith("torch ") for k in res[prec][big]):
            tmode, t_big = _best(res[prec][big], "torch")
            ratio, text = torch_text(prec, big, s_big, t_big, tmode)
            r.finding(text, value=ratio, unit="x",
                      labels=(_label("cudalab", mode_b, prec, big),
                              _label("torch", tmode, prec, big)))
    _half_findings(r, res, big)


def _compile_findings(r: LessonRun, res: dict[str, dict], compiled: dict) -> None:
    """cudalab's compiled program (its CUDA graph, else eager) against each torch.compile
    mode run, with what compiling cost and when it pays off against torch's best
    uncompiled mode."""
    for (prec, b, mode), c in compiled.items():
        times = res[prec][b]
        ours = "graph" if "cudalab graph" in times else "eager"
        base, base_s = _best(times, "torch")
        ratio, text = compiled_text(prec, b, mode, ours, times[f"cudalab {ours}"], c["s"],
                                    c["setup_s"], c["cache"], base, base_s)
        r.finding(text, value=ratio, unit="x",
                  labels=(_label("cudalab", ours, prec, b),
                          _label("torch", compile_mode(mode), prec, b),
                          _label("torch", base, prec, b)))


def _half_findings(r: LessonRun, res: dict[str, dict], big: int) -> None:
    if "fp32" not in res:
        return
    fp32_s = res["fp32"][big]["cudalab eager"]
    best = None
    for prec in ("fp16", "bf16"):
        if prec in res:
            speedup, text = half_text(prec, big, fp32_s, res[prec][big]["cudalab eager"])
            r.finding(text, value=speedup, unit="x",
                      labels=(_label("cudalab", "eager", "fp32", big),
                              _label("cudalab", "eager", prec, big)))
            best = speedup if best is None else max(best, speedup)
    if best is not None:
        r.claim("FP16/BF16 (mixed precision) makes inference faster", tutorial=None,
                measured=best, unit="x", held=best >= HALF_FASTER,
                why=f"best half precision vs fp32 at batch {big}: {best:.2f}x; holds from "
                    f"{HALF_FASTER:g}x")


# ---- the lesson -------------------------------------------------------------------------------


@lesson(19, "inference", title="ResNet-50 inference: CPU vs GPU, batch size, precision, graphs",
        seed="step-by-step guide: model_inference_comparison.py (--model-name resnet50 "
             "--batch-sizes 1,8,16,32; FP16/BF16 for faster inference)",
        params={"batch_sizes": (1, 8, 16, 32), "precisions": R.PRECISIONS, "graph": True,
                "cpu_batch_sizes": (1, 8), "compile_modes": FULL_COMPILE_MODES,
                "compile_precisions": FULL_COMPILE_PRECISIONS},
        quick_params={"batch_sizes": (1, 8), "precisions": ("fp16",),
                      "cpu_batch_sizes": (), "compile_modes": ()},
        torch_twin=_torch_twin_label,
        check=check_params)
def run(r: LessonRun) -> None:
    from .. import models

    batches, precisions, cpu_batches = check_params(r.params)
    modes, compile_precisions = check_compile(r.params)
    state = models.init_weights(seed=SEED)
    params = models.fold(state)
    x_h = R.images(SEED, max(batches + cpu_batches + (1,)))
    torch_cpu = _torch_cpu_module(state)
    ref = _cpu_rows(r, torch_cpu, params, x_h, cpu_batches)
    ref1 = ref.get(1)
    if ref1 is None:  # the checks need the batch-1 reference even when it is not timed
        ref1 = models.reference.forward(params, x_h[:1])
    cpu_module = torch_cpu[1] if torch_cpu is not None and r.torch() is not None else None
    for name in sorted({R.CEILING_OF[p] for p in precisions}):
        ceiling(name)  # measured once, before any forward is timed
    plan = compile_plan(precisions, batches, modes, compile_precisions)
    compiled: dict[tuple[str, int, str], dict] = {}
    notes: list[str] = []
    res = {prec: _precision(r, state, prec, batches, x_h, ref1, cpu_module, plan, compiled,
                            notes)
           for prec in precisions}
    _findings(r, res, batches)
    if cpu_module is not None:
        _compile_findings(r, res, compiled)
        note = compile_note(plan, precisions, modes, compile_precisions)
        for text in notes + ([note] if note else []):
            r.finding(text)


@run.plot
def plot(result: Any, ax: Any) -> None:
    for (impl, mode, prec) in sorted({(x["impl"], x["mode"], x["precision"])
                                      for x in result.rows if x["device"] == "gpu"}):
        pts = sorted((x["batch"], x["images_per_s"]) for x in result.rows
                     if (x["impl"], x["mode"], x["precision"]) == (impl, mode, prec))
        ax.plot([b for b, _ in pts], [v for _, v in pts], "o-" if impl == "cudalab" else "s--",
                label=f"{impl} {mode} {prec}", alpha=0.8 if impl == "cudalab" else 0.5)
    for x in result.rows:
        if x["device"] == "cpu":
            ax.plot([x["batch"]], [x["images_per_s"]], "kx")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("images per second (x: CPU)")
    ax.legend(fontsize=6, ncol=2)
