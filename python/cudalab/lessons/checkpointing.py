"""Lesson 26 `checkpointing`: gradient checkpointing, memory saved vs compute paid.

A training step keeps every layer's activations from the forward for the
backward. Gradient checkpointing keeps only the input of each of k segments
of layers and runs a segment's forward again just before its backward: the
activations alive at once fall from all n layers' to about k + n / k layers'
(least near k = sqrt(n)), at the price of one more forward GEMM per
recomputed layer. The lesson trains a deep MLP one step per configuration
(no checkpointing, then k = 1 .. n segments; :meth:`cudalab.nn.MLP.checkpoint`)
and measures the memory pool's peak, the step's time and the gradients
(equal to the plain step's: the recomputation repeats the same GEMMs); beside
it PyTorch runs ``torch.utils.checkpoint.checkpoint_sequential`` over the same
segments of the same network.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

import cudalab
from cudalab import nn

from ..nn import torch_twin as TT
from ..nn.layers import activation_bytes, recomputed_layers, segment_bounds
from ..nn.precision import get_precision
from . import training as T
from ._measuring import ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson

MIB = 2**20
GIB = 2**30
# Checkpointing counts as saving memory when the plain step's activation memory is at least
# this many times the configuration's.
MEMORY_SAVES = 1.5
# "About one more forward": the extra step time is at most this many forward passes.
ONE_FORWARD = 1.25
# Checkpointed vs plain gradients, max |difference| / max |plain| per parameter. The
# recomputation runs the same GEMMs on the same inputs, so the difference is expected to be
# exactly 0 (the nn tests check bitwise); the bound admits a last-bit difference should the
# GEMM library pick another algorithm for a recomputed call.
GRAD_TOL = 1e-6
PRECISIONS = ("fp32", "tf32", "bf16")

ROW_KEYS = ("impl", "segments", "recomputed", "peak_mib", "step_mib", "predicted_mib",
            "memory_vs_plain", "ms_per_step", "time_vs_plain", "predicted_time_vs_plain",
            "grad_max_rel_diff", "bitwise")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def recompute_flops(sizes: Sequence[int], batch: int, segments: Optional[int]) -> float:
    """The GEMM FLOPs a checkpointed backward adds: one forward GEMM per recomputed layer."""
    return sum(2.0 * batch * sizes[i] * sizes[i + 1]
               for i in recomputed_layers(len(sizes) - 1, segments))


def predicted_time_ratio(sizes: Sequence[int], batch: int, segments: Optional[int]) -> float:
    """The step time over the plain step's if time followed the GEMM FLOPs."""
    return 1.0 + recompute_flops(sizes, batch, segments) / T.step_flops(sizes, batch)


def sqrt_rule(layers: int) -> int:
    """The rule of thumb's segment count: sqrt(n) rounded, in [1, n]."""
    return min(layers, max(1, round(math.sqrt(layers))))


def best_segments(memory: Mapping[int, float], times: Mapping[int, float]) -> int:
    """The segment count of least memory; among equal memories the fastest."""
    return min(memory, key=lambda k: (memory[k], times[k]))


def largest_batch(budget: float, fixed: float, per_sample: float) -> int:
    """The largest batch whose memory, fixed + batch * per_sample bytes, fits `budget`."""
    if per_sample <= 0 or budget <= fixed:
        return 0
    return int((budget - fixed) // per_sample)


def trade_text(k: int, recomputed: int, layers: int, memory: float, time: float,
               predicted: float) -> str:
    """One sentence on what k segments change against the plain step (ratios plain / k for
    memory, k / plain for time)."""
    head = f"k={k} (recomputes {recomputed} of {layers} layers):"
    if memory >= MEMORY_SAVES:
        mem = f"{memory:.1f}x less activation memory"
    elif memory > 1 / MEMORY_SAVES and abs(memory - 1) < 0.05:
        mem = f"about the same activation memory ({1 / memory:.2f}x the plain step's)"
    else:  # a saving below the threshold, or more memory than the plain step
        mem = f"{1 / memory:.2f}x the plain step's activation memory"
    return f"{head} {mem}, {time:.2f}x the step time (FLOPs predict {predicted:.2f}x)"


def segments_param(p: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    """The segment counts to run: 'all' (1 .. layers) or distinct ints in [1, layers], sorted."""
    ks = p["segments"]
    if isinstance(ks, str):
        if ks != "all":
            raise ValueError(f"lesson 'checkpointing': segments must be 'all' or ints, got {ks!r}")
        return tuple(range(1, layers + 1))
    ks = (ks,) if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool) else tuple(ks)
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= layers:
            raise ValueError(f"lesson 'checkpointing': segments must be ints in [1, {layers}] "
                             f"(the number of layers), got {k!r}")
    if not ks or len(set(ks)) != len(ks):
        raise ValueError(f"lesson 'checkpointing': segments must be distinct, got {ks!r}")
    return tuple(sorted(int(k) for k in ks))


# ---- the step, ours and PyTorch's ----------------------------------------------------------


def _label(k: Optional[int]) -> str:
    return "no checkpointing" if k is None else f"checkpoint k={k}"


def _ours(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any, k: Optional[int],
          want: Optional[Sequence[np.ndarray]]) -> dict[str, Any]:
    """Memory of building the model and of its first step, that step's gradients (or their
    difference from the plain step's, `want`), the step time."""
    p = r.params
    prec = p["precision"]
    cudalab.synchronize()
    before = cudalab.memory_allocated()
    model = nn.MLP(sizes, "gelu", seed=p["seed"], checkpoint_segments=k)
    opt = nn.AdamW(model.parameters(), lr=p["lr"])
    cudalab.synchronize()
    built = cudalab.memory_allocated()
    cudalab.reset_peak_memory_stats()
    nn.train_step(model, opt, x, labels, prec)
    cudalab.synchronize()
    peak = cudalab.max_memory_allocated()
    grads = [q.grad.get() for q in model.parameters()]  # of the initial weights
    out: dict[str, Any] = {"model": built - before, "peak": peak - before, "step": peak - built,
                           "grads": grads if want is None else None, "diff": None,
                           "bitwise": None}
    if want is not None:
        out["diff"] = max(rel_error(g, w) for g, w in zip(grads, want))
        out["bitwise"] = all(np.array_equal(g, w) for g, w in zip(grads, want))
    batch = x.shape[0]
    out["time"] = r.measure(_label(k), lambda: nn.train_step(model, opt, x, labels, prec),
                            flops=T.step_flops(sizes, batch),
                            description="one training step: forward, loss, backward (with "
                                        "recomputation), AdamW (CUDA events)")
    if k is None:
        out["forward"] = r.measure("forward only", lambda: model.forward(x, prec),
                                   flops=T.step_flops(sizes, batch) / 3,
                                   description="the plain forward pass alone (CUDA events)")
    return out


def _torch_one(r: LessonRun, torch: Any, sizes: tuple[int, ...], tx: Any, tl: Any,
               k: Optional[int], want: Optional[list]) -> dict[str, Any]:
    """PyTorch's step on the twin, with checkpoint_sequential over the same segments."""
    p, c = r.params, torch.cuda
    ce = torch.nn.functional.cross_entropy
    checkpoint = importlib.import_module("torch.utils.checkpoint")
    dtype = torch.bfloat16 if p["precision"] == "bf16" else None
    c.synchronize()
    c.reset_peak_memory_stats()
    before = c.memory_allocated()
    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
    opt = TT.torch_adamw(torch, twin.parameters(), p["lr"])
    mods = list(twin)  # layer i is modules 2i (Linear) and 2i + 1 (GELU, but the last layer)
    segs = None
    if k is not None:  # one Sequential per segment: checkpoint_sequential's k chunks are ours
        segs = torch.nn.Sequential(*[torch.nn.Sequential(*mods[2 * a:2 * b])
                                     for a, b in segment_bounds(len(sizes) - 1, k)])

    def loss() -> Any:
        with (torch.autocast("cuda", dtype=dtype) if dtype is not None
              else contextlib.nullcontext()):
            out = twin(tx) if segs is None else checkpoint.checkpoint_sequential(
                segs, k, tx, use_reentrant=False)
            return ce(out, tl)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    loss().backward()  # the gradients of the initial weights
    grads = [q.grad.detach().clone() for q in twin.parameters()]
    diff = None
    if want is not None:
        diff = max((((g - w).abs().max() / w.abs().max()).item() for g, w in zip(grads, want)),
                   default=0.0)
    for _ in range(2):  # torch makes AdamW's state during the first step
        step()
    c.synchronize()
    peak = c.max_memory_allocated() - before
    m = r.measure("torch " + _label(k), step, flops=T.step_flops(sizes, tx.shape[0]),
                  description="one torch training step (CUDA events)")
    return {"peak": peak, "time": m, "diff": diff, "grads": grads if want is None else None}


# ---- the lesson ----------------------------------------------------------------------------


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the MLP's sizes, the segment counts) from the params; ValueError on a bad one."""
    sizes = T.check_sizes("checkpointing", p)
    T.check_positive("checkpointing", p, "batch")
    ks = segments_param(p, len(sizes) - 1)
    if p["precision"] not in PRECISIONS:
        raise ValueError(f"lesson 'checkpointing': precision must be one of "
                         f"{', '.join(PRECISIONS)} (fp16 needs a loss scaler: see lesson 'amp'), "
                         f"got {p['precision']!r}")
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'checkpointing': lr must be a number in (0, 1), got {lr!r}")
    budget = p["budget_gib"]
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"lesson 'checkpointing': budget_gib must be a number > 0, "
                         f"got {budget!r}")
    P.seed("checkpointing", p)
    return sizes, ks


@lesson(26, "checkpointing", title="Gradient checkpointing: activation memory vs recompute time",
        seed="Guides' out-of-memory remedies ('use gradient checkpointing': "
             "torch.utils.checkpoint trades compute for memory by recomputing activations in "
             "the backward), no figure given",
        params={"in_features": 1024, "hidden": (2048,) * 12, "classes": 16, "batch": 8192,
                "segments": "all", "precision": "tf32", "lr": 1e-4, "budget_gib": 16.0,
                "seed": 0},
        quick_params={"in_features": 64, "hidden": (256,) * 6, "batch": 1024},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    sizes, ks = check_params(p)
    [(x, labels)] = T.teacher_batches(sizes, p["batch"], 1, p["seed"])
    plain = _ours(r, sizes, x, labels, None, None)
    want = plain["grads"]
    ours: dict[Optional[int], dict] = {None: plain}
    for k in ks:
        ours[k] = _ours(r, sizes, x, labels, k, want)
        r.check(f"k={k}: checkpointed grads vs the plain step's (max relative difference over "
                f"{len(want)} parameters)", ours[k]["diff"], GRAD_TOL)
    torch = r.torch()
    theirs: dict[Optional[int], dict] = {}
    if torch is not None:
        tx, tl = TT.torch_batches(torch, [(x, labels)])[0]
        with TT.Tf32(torch, p["precision"] == "tf32"):
            theirs[None] = _torch_one(r, torch, sizes, tx, tl, None, None)
            for k in ks:
                theirs[k] = _torch_one(r, torch, sizes, tx, tl, k, theirs[None]["grads"])
    for k, v in ours.items():
        _row(r, sizes, "cudalab", k, v, plain)
    for k, v in theirs.items():
        _row(r, sizes, "torch", k, v, theirs[None])
    _findings(r, sizes, ks, ours, theirs)


def _row(r: LessonRun, sizes: tuple[int, ...], impl: str, k: Optional[int], v: dict,
         plain: dict) -> None:
    batch, n = r.params["batch"], len(sizes) - 1
    dt = get_precision(r.params["precision"]).compute_dtype
    t = v["time"].median
    ours = impl == "cudalab"
    mem, base = (v["step"], plain["step"]) if ours else (v["peak"], plain["peak"])
    r.row(impl=impl, segments=k, recomputed=len(recomputed_layers(n, k)),
          peak_mib=v["peak"] / MIB, step_mib=v["step"] / MIB if ours else None,
          predicted_mib=activation_bytes(sizes, batch, dt, "gelu", k) / MIB if ours else None,
          memory_vs_plain=ratio(mem, base), ms_per_step=t * 1e3,
          time_vs_plain=t / plain["time"].median,
          predicted_time_vs_plain=predicted_time_ratio(sizes, batch, k),
          grad_max_rel_diff=v["diff"], bitwise=v.get("bitwise"))


def _findings(r: LessonRun, sizes: tuple[int, ...], ks: Sequence[int], ours: dict,
              theirs: dict) -> None:
    p, n = r.params, len(sizes) - 1
    batch = p["batch"]
    plain = ours[None]
    base_t = plain["time"].median
    memory = {k: ours[k]["step"] for k in ks}
    times = {k: ours[k]["time"].median for k in ks}
    for k in ks:
        r.finding(trade_text(k, len(recomputed_layers(n, k)), n, ratio(plain["step"], memory[k]),
                             times[k] / base_t, predicted_time_ratio(sizes, batch, k)),
                  value=ratio(plain["step"], memory[k]), unit="x",
                  labels=(ours[k]["time"].label, plain["time"].label))
    best = best_segments(memory, times)
    rule = sqrt_rule(n)
    rule_text = (f"the sqrt(n) rule of thumb (n={n} layers) says k={rule}"
                 + (f" ({memory[rule] / MIB:.4g} MiB, {memory[rule] / memory[best]:.2f}x the "
                    f"least)" if rule in memory else " (not run)"))
    r.finding(f"Least step memory at k={best}: {memory[best] / MIB:.4g} MiB against "
              f"{plain['step'] / MIB:.4g} MiB without checkpointing; {rule_text}",
              value=best, unit="segments")
    dt = get_precision(p["precision"]).compute_dtype
    predicted = activation_bytes(sizes, batch, dt, "gelu", best)
    r.finding(f"The activation buffers account for the step memory: predicted "
              f"{activation_bytes(sizes, batch, dt, 'gelu') / MIB:.4g} MiB (measured "
              f"{plain['step'] / MIB:.4g}) without checkpointing, {predicted / MIB:.4g} MiB "
              f"(measured {memory[best] / MIB:.4g}) at k={best}; the rest is the weight casts, "
              f"the loss and the optimizer's scratch", value=memory[best] / MIB, unit="MiB")
    budget = p["budget_gib"] * GIB
    fixed = plain["model"]
    fit_plain = largest_batch(budget, fixed, plain["step"] / batch)
    fit_best = largest_batch(budget, fixed, memory[best] / batch)
    r.finding(f"In a {p['budget_gib']:g} GiB budget (model, grads and AdamW state "
              f"{fixed / MIB:.4g} MiB; per-sample step memory measured at batch {batch}): "
              f"the largest batch is {fit_plain} without checkpointing and {fit_best} with "
              f"k={best} ({ratio(fit_best, fit_plain):.2f}x)", value=fit_best, unit="rows")
    worst = max(ours[k]["diff"] for k in ks)
    bitwise = sum(1 for k in ks if ours[k]["bitwise"])
    r.finding(f"Checkpointed gradients equal the plain step's: {bitwise} of {len(ks)} "
              f"configurations bitwise, largest relative difference {worst:.2g}",
              value=worst, unit="relative")
    saving = ratio(plain["step"], memory[best])
    r.claim("Gradient checkpointing reduces the memory a training step needs",
            tutorial=None, measured=saving, unit="x", held=saving >= MEMORY_SAVES,
            why=f"k={best}: step memory (activations) {saving:.2f}x lower than without "
                f"checkpointing (holds from {MEMORY_SAVES}x)")
    fwd = plain["forward"].median
    extra = (times[best] - base_t) / fwd if fwd > 0 else float("inf")
    r.claim("... at the cost of extra compute: about one more forward pass",
            tutorial=1.0, measured=extra, unit="forwards", held=extra <= ONE_FORWARD,
            why=f"k={best}: the step takes {times[best] * 1e3:.3g} ms against "
                f"{base_t * 1e3:.3g} ms, {extra:.2f} forward passes of {fwd * 1e3:.3g} ms more "
                f"(holds up to {ONE_FORWARD}); it recomputes "
                f"{len(recomputed_layers(n, best))} of {n} layers (not the last segment)")
    if theirs:
        tb = theirs[None]
        ratios = [theirs[k]["time"].median / ours[k]["time"].median for k in (None, *ks)]
        r.finding("PyTorch's step time over cudalab's (above 1: cudalab is faster): "
                  + ", ".join(f"{'none' if k is None else k} {v:.2f}x"
                              for k, v in zip((None, *ks), ratios))
                  + f"; torch's whole-step peak falls from {tb['peak'] / MIB:.0f} MiB to "
                  f"{min(theirs[k]['peak'] for k in ks) / MIB:.0f} MiB (cudalab's from "
                  f"{plain['peak'] / MIB:.0f} to {min(ours[k]['peak'] for k in ks) / MIB:.0f})",
                  value=min(ratios), unit="x",
                  labels=tuple(m for k in (None, *ks) for m in (ours[k]["time"].label,
                                                               theirs[k]["time"].label)))
        worst_t = max(theirs[k]["diff"] for k in ks)
        r.finding(f"torch's checkpointed gradients vs its plain ones: largest relative "
                  f"difference {worst_t:.2g}", value=worst_t, unit="relative")


@run.plot
def plot(result: Any, ax: Any) -> None:
    for impl, style in (("cudalab", "o-"), ("torch", "s--")):
        rows = [x for x in result.rows if x["impl"] == impl and x["segments"] is not None]
        if not rows:
            continue
        ax.plot([x["segments"] for x in rows], [x["memory_vs_plain"] for x in rows], style,
                label=f"{impl}: memory / no checkpointing")
        for x in rows:
            ax.annotate(f"{x['time_vs_plain']:.2f}x t", (x["segments"], x["memory_vs_plain"]),
                        fontsize=7, textcoords="offset points", xytext=(4, 4))
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("checkpointed segments k (annotated: step time / no checkpointing)")
    ax.set_ylabel("step memory / no checkpointing (cudalab: activations; torch: whole peak)")
    ax.legend(fontsize=8)
