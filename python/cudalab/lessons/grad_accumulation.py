"""Lesson 18 `grad_accumulation`: one big batch vs k accumulated micro-batches.

An optimizer step over a batch of B rows can be taken in k passes of B / k
rows: each micro-batch's forward and backward adds its gradients into the
same float32 buffers, with its loss gradient scaled by 1 / k so the sum is
the big batch's mean-loss gradient, and the optimizer steps once. Only one
micro-batch's activations are alive at a time, so the memory a step needs
beyond the model falls roughly k-fold, while the GEMMs get k times thinner
and the launches k times more numerous. The lesson measures both sides (the
memory pool's peak and the GPU time per optimizer step) for k = 1 (the big
batch) and each k asked for, and shows that the accumulated gradients equal
the big batch's.
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn

from ..nn import torch_twin as TT
from . import training as T
from ._measuring import ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson

MIB = 2**20
# Accumulation counts as saving memory when the big batch's peak is at least this many times k's.
MEMORY_SAVES = 1.5
# Accumulation counts as costing time when its step takes at least this many times the big batch's.
TIME_COSTS = 1.05
# Accumulated vs big-batch gradients, max |difference| / max |big| per parameter: the same sums
# in another order (float32), or half-precision GEMM outputs rounded at other points.
GRAD_TOL = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}
# Precisions the lesson takes: fp16 needs a loss scaler (the amp lesson shows it).
PRECISIONS = tuple(GRAD_TOL)

ROW_KEYS = ("impl", "k", "micro_batch", "ms_per_step", "samples_per_s", "time_vs_big",
            "peak_mib", "step_mib", "memory_vs_big", "grad_max_rel_diff")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def micro_slices(batch: int, k: int) -> list[slice]:
    """The k row ranges of equal size that make up a batch of `batch` rows."""
    if k < 1 or batch % k:
        raise ValueError(f"a batch of {batch} rows does not split into {k} equal micro-batches")
    n = batch // k
    return [slice(j * n, (j + 1) * n) for j in range(k)]


def grad_difference(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """The largest, over parameters, of max |got - want| / max |want|."""
    if len(got) != len(want):
        return float("inf")
    return max((rel_error(g, w) for g, w in zip(got, want)), default=0.0)


def trade_text(k: int, micro: int, memory: float, time: float) -> str:
    """One sentence on what k micro-batches change against the big batch (ratios k / big)."""
    head = f"k={k} ({micro} rows each):"
    if memory > 0 and 1 / memory >= MEMORY_SAVES:
        mem = f"{1 / memory:.1f}x less step memory"
    else:
        mem = f"about the same step memory ({memory:.2f}x)"
    if time >= TIME_COSTS:
        tm = f"{time:.2f}x the time per optimizer step"
    else:
        tm = f"no extra time ({time:.2f}x): the thinner GEMMs still fill the GPU"
    return f"{head} {mem}, {tm}"


# ---- the step, ours and PyTorch's ----------------------------------------------------------


class Accumulator:
    """An MLP, its AdamW and the micro-batches of one optimizer step."""

    def __init__(self, p: Mapping[str, Any], sizes: tuple[int, ...], x: Any, labels: Any,
                 k: int) -> None:
        self.precision = p["precision"]
        self.model = nn.MLP(sizes, "gelu", seed=p["seed"])
        self.opt = nn.AdamW(self.model.parameters(), lr=p["lr"])
        self.micro = [(x[s], labels[s]) for s in micro_slices(x.shape[0], k)]
        # Each micro-batch's mean-loss gradient times 1 / k: their sum is the big batch's.
        self.inv_k = cudalab.full((1,), 1.0 / k, dtype=np.float32)

    def step(self) -> None:
        model, prec = self.model, self.precision
        model.cast_weights(prec)  # once per optimizer step, not per micro-batch
        for j, (x, labels) in enumerate(self.micro):
            logits = model.forward(x, prec, cast_weights=False)
            nn.functional.cross_entropy(logits, labels, grad=logits, loss_scale=self.inv_k)
            model.backward(logits, accumulate=j > 0)
        self.opt.step()


def _ours(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any, k: int,
          big_grads: Sequence[np.ndarray] | None) -> dict[str, Any]:
    """Memory of building the model and its first step, the grads of that step (k = 1) or
    their difference from the big batch's (`big_grads`), the step time."""
    cudalab.synchronize()
    before = cudalab.memory_allocated()
    acc = Accumulator(r.params, sizes, x, labels, k)
    cudalab.synchronize()
    built = cudalab.memory_allocated()
    cudalab.reset_peak_memory_stats()
    acc.step()
    cudalab.synchronize()
    peak = cudalab.max_memory_allocated()
    grads = [p.grad.get() for p in acc.model.parameters()]  # of the initial weights
    diff = None if big_grads is None else grad_difference(grads, big_grads)
    m = r.measure(_label(k, x.shape[0]), acc.step, flops=T.step_flops(sizes, x.shape[0]),
                  description="one optimizer step (CUDA events)")
    return {"peak": peak - before, "step": peak - built, "time": m, "diff": diff,
            "grads": grads if big_grads is None else None}


def _torch_one(r: LessonRun, torch: Any, sizes: tuple[int, ...], tx: Any, tl: Any,
               k: int) -> dict[str, Any]:
    """PyTorch's loop of the tutorial: loss / k, backward per micro-batch, one step."""
    p, c = r.params, torch.cuda
    ce = torch.nn.functional.cross_entropy
    dtype = torch.bfloat16 if p["precision"] == "bf16" else None
    c.synchronize()
    before = c.memory_allocated()
    c.reset_peak_memory_stats()
    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
    opt = TT.torch_adamw(torch, twin.parameters(), p["lr"])
    micro = [(tx[s], tl[s]) for s in micro_slices(tx.shape[0], k)]

    def step() -> None:
        opt.zero_grad()
        for xm, lm in micro:
            with (torch.autocast("cuda", dtype=dtype) if dtype is not None
                  else contextlib.nullcontext()):
                loss = ce(twin(xm), lm) / k
            loss.backward()
        opt.step()

    for _ in range(2):  # torch makes its grads and optimizer state during the first step
        step()
    c.synchronize()
    peak = c.max_memory_allocated() - before
    m = r.measure("torch " + _label(k, tx.shape[0]), step, flops=T.step_flops(sizes, tx.shape[0]),
                  description="one torch optimizer step (CUDA events)")
    return {"peak": peak, "step": None, "time": m, "diff": None}


def _label(k: int, batch: int) -> str:
    return f"big batch {batch}" if k == 1 else f"accumulate k={k} ({k} x {batch // k})"


# ---- the lesson ----------------------------------------------------------------------------


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the MLP's sizes, the ks with 1 first) from the params; ValueError on a bad one."""
    sizes = T.check_sizes("grad_accumulation", p)
    T.check_positive("grad_accumulation", p, "batch")
    ks = p["ks"]
    ks = (ks,) if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool) else tuple(ks)
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise ValueError(f"lesson 'grad_accumulation': ks must be ints >= 2, got {k!r}")
        if p["batch"] % k:
            raise ValueError(f"lesson 'grad_accumulation': batch {p['batch']} does not split "
                             f"into {k} equal micro-batches")
    if not ks or len(set(ks)) != len(ks):
        raise ValueError(f"lesson 'grad_accumulation': ks must be distinct, got {ks!r}")
    if p["precision"] not in PRECISIONS:
        raise ValueError(f"lesson 'grad_accumulation': precision must be one of "
                         f"{', '.join(PRECISIONS)} (fp16 needs a loss scaler: see lesson 'amp'), "
                         f"got {p['precision']!r}")
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'grad_accumulation': lr must be a number in (0, 1), got {lr!r}")
    P.seed("grad_accumulation", p)
    return sizes, (1, *sorted(int(k) for k in ks))


@lesson(18, "grad_accumulation", title="Gradient accumulation: memory vs time of micro-batches",
        seed="Guides' memory tips and out-of-memory troubleshooting ('accumulate gradients to "
             "simulate larger batches': loss / accumulation_steps, backward per micro-batch, one "
             "optimizer step), no figure given",
        params={"in_features": 1024, "hidden": (4096, 4096, 4096), "classes": 16, "batch": 8192,
                "ks": (2, 4, 8), "precision": "fp32", "lr": 1e-4, "seed": 0},
        quick_params={"in_features": 64, "hidden": (256, 256), "batch": 1024, "ks": (2, 4)},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    sizes, ks = check_params(p)
    [(x, labels)] = T.teacher_batches(sizes, p["batch"], 1, p["seed"])
    ours = {1: _ours(r, sizes, x, labels, 1, None)}
    big = ours[1]["grads"]
    for k in ks[1:]:
        ours[k] = _ours(r, sizes, x, labels, k, big)
        r.check(f"k={k}: accumulated grads vs the big batch's (max relative difference over "
                f"{len(big)} parameters)", ours[k]["diff"], GRAD_TOL[p["precision"]])
    torch = r.torch()
    theirs = {}
    if torch is not None:
        tx, tl = TT.torch_batches(torch, [(x, labels)])[0]
        with TT.Tf32(torch, p["precision"] == "tf32"):
            theirs = {k: _torch_one(r, torch, sizes, tx, tl, k) for k in ks}
    for impl, results in (("cudalab", ours), ("torch", theirs)):
        for k, v in results.items():
            _row(r, impl, k, v, results[1])
    _findings(r, ours, ks, theirs)


def _row(r: LessonRun, impl: str, k: int, v: dict, big: dict) -> None:
    batch = r.params["batch"]
    t = v["time"].median
    r.row(impl=impl, k=k, micro_batch=batch // k, ms_per_step=t * 1e3, samples_per_s=batch / t,
          time_vs_big=t / big["time"].median, peak_mib=v["peak"] / MIB,
          step_mib=None if v["step"] is None else v["step"] / MIB,
          memory_vs_big=v["peak"] / big["peak"], grad_max_rel_diff=v["diff"])


def _findings(r: LessonRun, ours: dict, ks: Sequence[int], theirs: dict) -> None:
    batch, big = r.params["batch"], ours[1]
    for k in ks[1:]:
        v = ours[k]
        memory, time = ratio(v["step"], big["step"]), ratio(v["time"].median, big["time"].median)
        r.finding(trade_text(k, batch // k, memory, time), value=ratio(1.0, memory), unit="x",
                  labels=(v["time"].label, big["time"].label))
    model = big["peak"] - big["step"]
    r.finding(f"The model, its gradients and AdamW's two moments take {model / MIB:.3g} MiB "
              f"whatever k; one step over {batch} rows adds {big['step'] / MIB:.3g} MiB, "
              f"k={ks[-1]} micro-batches add {ours[ks[-1]]['step'] / MIB:.3g} MiB",
              value=model / MIB, unit="MiB")
    diffs = [ours[k]["diff"] for k in ks[1:]]
    r.finding(f"Accumulated gradients equal the big batch's: largest relative difference "
              f"{max(diffs):.2g} ({r.params['precision']})", value=max(diffs), unit="relative")
    last = ours[ks[-1]]
    saving = ratio(big["peak"], last["peak"])
    time = ratio(last["time"].median, big["time"].median)
    r.claim("Gradient accumulation simulates a larger batch in less memory, at some cost in time",
            tutorial=None, measured=saving, unit="x", held=saving >= MEMORY_SAVES,
            why=f"k={ks[-1]}: whole-step peak {saving:.2f}x lower (holds from {MEMORY_SAVES}x), "
                f"{time:.2f}x the time per optimizer step")
    if theirs:
        ratios = [theirs[k]["time"].median / ours[k]["time"].median for k in ks]
        r.finding("PyTorch's time per optimizer step over cudalab's (above 1: cudalab is "
                  "faster): " + ", ".join(f"k={k} {v:.2f}x" for k, v in zip(ks, ratios))
                  + "; whole-step peak: " + ", ".join(
                      f"k={k} {theirs[k]['peak'] / MIB:.0f} vs {ours[k]['peak'] / MIB:.0f} MiB"
                      for k in ks),
                  value=min(ratios), unit="x",
                  labels=tuple(m for k in ks for m in (ours[k]["time"].label,
                                                      theirs[k]["time"].label)))


@run.plot
def plot(result: Any, ax: Any) -> None:
    for impl, style in (("cudalab", "o-"), ("torch", "s--")):
        rows = [x for x in result.rows if x["impl"] == impl]
        if not rows:
            continue
        ax.plot([x["k"] for x in rows], [x["peak_mib"] for x in rows], style,
                label=f"{impl}: peak MiB")
        for x in rows:
            ax.annotate(f"{x['ms_per_step']:.2f} ms", (x["k"], x["peak_mib"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches per optimizer step k (k=1: one big batch)")
    ax.set_ylabel("pool peak over a step (MiB), model included")
    ax.legend(fontsize=8)
