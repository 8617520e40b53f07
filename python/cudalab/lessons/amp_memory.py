"""Lesson 27 `amp_memory`: does mixed precision use "half the memory"? And why fp16 needs a scaler.

Part one builds the same MLP, its AdamW and (for fp16) its GradScaler in
each precision and reads the pool's exact byte counter (``requested_bytes``
of ``memory_stats()``) around every piece: the float32 master weights with
their float32 gradients (one allocation step: a Parameter makes its grad
with its value, so the split between the two comes from the arrays'
nbytes), AdamW's two float32 moments, the half copies of the weights the
layers keep (``cast_weights``), the activations the forward keeps for the
backward, and the peak of a whole training step. Only the activations and
the weight copies depend on the precision: masters, gradients and optimizer
state stay float32, so the total's ratio to fp32 depends on the batch size;
a sweep of batch sizes and a straight-line fit say from which batch the ratio
comes near one half. PyTorch's twin (autocast, GradScaler) is measured beside
it with ``torch.cuda.max_memory_allocated``.

Part two shows why fp16 needs a loss scaler: with the loss weighted small
(as a mean over many more rows would make it), the gradients of an MLP,
from the same weights and batch, are computed in fp32, in fp16 unscaled and
in fp16 times the scaler's scale; elements that are zero in fp16 but not in
fp32 underflowed. Then the three train a few hundred steps from the same
weights on the same batches.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn
from cudalab.nn import reference

from ..nn import torch_twin as TT
from ..nn.layers import activation_bytes
from . import training as T
from ._measuring import ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson
from .training import final_loss

MIB = 2**20
PRECISIONS = tuple(nn.PRECISIONS)
HALF = ("fp16", "bf16")
# "Half the memory" holds when a half precision's step peak is at most this fraction of fp32's.
HALF_TARGET = 0.55
# A part of the memory "halves" when its half / fp32 ratio is at most this.
HALVES = 0.6
# Measured bytes vs the arrays' nbytes (weights + grads, AdamW state, weight copies), relative.
NBYTES_TOL = 0.01
# Measured activations vs the layers' model of what a forward keeps (relative).
ACTIVATION_TOL = 0.05
# PyTorch's initial loss scale, used by both scalers.
INIT_SCALE = 2.0**16
# At most this many torch steps before the measured one, until AdamW has made its state.
TORCH_WARM_STEPS = 5
# A fresh model's float32 loss against float64 NumPy, on a few rows.
NUMPY_ROWS = 16
NUMPY_TOL = 1e-4
# The weighted fp32 gradients of part two against float64 NumPy (max relative, per parameter).
GRAD_NUMPY_TOL = 1e-3
# The first loss in fp16 against fp32's (same weights, same batch).
FIRST_LOSS_TOL = 1e-2
# The fp32 run's loss must fall to at most this fraction of its first loss (the setup learns).
LOSS_FELL = 0.9
# Unscaled fp16 "falls far slower" when its final loss is at least this many times fp32's.
UNSCALED_BEHIND = 2.0
# fp16 with the scaler "follows fp32" when its final loss is within this fraction of fp32's.
FOLLOWS = 0.05

MEMORY_KEYS = ("section", "impl", "precision", "batch", "weights_mib", "grads_mib",
               "optimizer_mib", "half_copies_mib", "activations_mib", "transient_mib",
               "peak_mib", "peak_vs_fp32", "step_ms")
UNDERFLOW_KEYS = ("section", "run", "where", "elements", "nonzero_fp32", "zero_here",
                  "underflow_pct")
TRAINING_KEYS = ("section", "run", "first_loss", "final_loss", "vs_fp32", "final_scale")

RUNS = ("fp32", "fp16 unscaled", "fp16 scaled")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def kept_activation_bytes(sizes: Sequence[int], rows: int, dtype: Any,
                          cast_input: bool) -> int:
    """Bytes an MLP's forward allocates and keeps for the backward: every layer's output
    and every hidden (GELU) layer's pre-activation in the compute dtype (nn's own model of
    its buffers, `activation_bytes`), and a copy of the input in that dtype when the data's
    dtype differs (half precisions, float32 data)."""
    total = activation_bytes(sizes, rows, dtype, "gelu")
    if cast_input:
        total += rows * sizes[0] * np.dtype(dtype).itemsize
    return total


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points (two distinct xs)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("line_fit() needs at least two distinct x values")
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    return float(y.mean() - slope * x.mean()), slope


def batch_for_ratio(half: tuple[float, float], full: tuple[float, float],
                    target: float) -> float | None:
    """The batch from which (intercept + slope * batch) of `half` is at most `target` times
    that of `full`, both as (intercept, slope); None when it never is."""
    (fh, sh), (ff, sf) = half, full
    room = target * sf - sh
    if room <= 0:
        return None
    return max(0.0, (fh - target * ff) / room)


def underflow(here: np.ndarray, fp32: np.ndarray) -> tuple[int, int]:
    """(elements zero in `here` but not in `fp32`, elements nonzero in `fp32`)."""
    here, fp32 = np.asarray(here, dtype=np.float64), np.asarray(fp32, dtype=np.float64)
    nonzero = fp32 != 0
    return int(np.count_nonzero((here == 0) & nonzero)), int(np.count_nonzero(nonzero))


def part_text(name: str, parts: Mapping[str, float]) -> str:
    """Which parts of the step's memory halve in `name` against fp32 (ratios half / fp32)."""
    halve = [k for k, v in parts.items() if v <= HALVES]
    stay = [k for k, v in parts.items() if v > HALVES]
    text = ", ".join(f"{k} {v:.2f}x" for k, v in parts.items())
    return (f"{name} against fp32, part by part: {text}; "
            f"{'halved: ' + ', '.join(halve) if halve else 'nothing halved'}"
            f"{'; not halved: ' + ', '.join(stay) if stay else ''}")


def ratio_text(name: str, ratios: Mapping[int, float], crossing: float | None,
               limit: float) -> str:
    """The step peak's half / fp32 ratio per batch and where it comes near one half."""
    head = (f"{name} step peak over fp32's by batch: "
            + ", ".join(f"{b} rows {v:.2f}" for b, v in ratios.items()))
    if crossing is None:
        return (head + f"; per row it costs {limit:.2f}x fp32, so it never falls to "
                       f"{HALF_TARGET}")
    return (head + f"; fitted lines put it at {HALF_TARGET} from about {crossing:,.0f} rows "
                   f"(per extra row it costs {limit:.2f}x fp32)")


def training_text(fp32: float, unscaled: float, scaled: float, first: float) -> str:
    """What the final losses of the three runs show."""
    head = (f"final loss: fp32 {fp32:.4f}, fp16 with the scaler {scaled:.4f}, fp16 without "
            f"{unscaled:.4f} (first loss {first:.4f})")
    if not np.isfinite(unscaled) or unscaled >= first:
        tail = "without a scaler the loss did not fall: the gradients that underflowed were lost"
    elif ratio(unscaled, fp32) >= UNSCALED_BEHIND:
        tail = (f"without a scaler it fell {unscaled / fp32:.1f}x less far, on the few gradients "
                f"that stayed above fp16's range")
    else:
        tail = "without a scaler it still came close: little of what mattered underflowed here"
    return f"{head}: {tail}"


# ---- part one: memory per precision -------------------------------------------------------


def _requested() -> int:
    cudalab.synchronize()  # frees are stream-ordered: count after the GPU
    return int(cudalab.memory_stats()["requested_bytes.all.current"])


def _peak() -> int:
    cudalab.synchronize()
    return int(cudalab.memory_stats()["requested_bytes.all.peak"])


def _build(p: Mapping[str, Any], sizes: tuple[int, ...], name: str) -> tuple[Any, Any, Any]:
    model = nn.MLP(sizes, "gelu", seed=p["seed"])
    opt = nn.AdamW(model.parameters(), lr=p["lr"])
    scaler = nn.GradScaler(INIT_SCALE) if nn.PRECISIONS[name].needs_scaler else None
    return model, opt, scaler


def _warm(p: Mapping[str, Any], sizes: tuple[int, ...], x: Any, labels: Any, name: str) -> None:
    """One throwaway step: the GEMM workspace and the GELU fusion choices for these shapes."""
    model, opt, scaler = _build(p, sizes, name)
    nn.train_step(model, opt, x, labels, name, scaler)
    del model, opt, scaler
    cudalab.synchronize()


def _ours(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any, name: str,
          timed: bool) -> dict[str, Any]:
    """Bytes of each piece, read from the pool's exact counter around its allocation."""
    p, batch = r.params, x.shape[0]
    _warm(p, sizes, x, labels, name)
    base = _requested()
    model = nn.MLP(sizes, "gelu", seed=p["seed"])
    with_grads = _requested()
    opt = nn.AdamW(model.parameters(), lr=p["lr"])
    scaler = nn.GradScaler(INIT_SCALE) if nn.PRECISIONS[name].needs_scaler else None
    with_opt = _requested()
    model.cast_weights(name)
    with_copies = _requested()
    model.forward(x, name, cast_weights=False)
    with_acts = _requested()
    cudalab.reset_peak_memory_stats()
    nn.train_step(model, opt, x, labels, name, scaler)
    peak = _peak()
    params = model.parameters()
    weights = sum(q.value.nbytes for q in params)
    grads = sum(q.grad.nbytes for q in params)
    state = sum(a.nbytes for a in (*opt.exp_avgs, *opt.exp_avg_sqs))
    prec = nn.PRECISIONS[name]
    itemsize = prec.compute_dtype.itemsize
    out = {"weights": weights, "grads": grads, "optimizer": with_opt - with_grads,
           "copies": with_copies - with_opt, "activations": with_acts - with_copies,
           "transient": peak - with_acts, "peak": peak - base, "step": None}
    r.check(f"{name} batch {batch}: weights + grads measured vs their nbytes (relative)",
            abs(with_grads - base - weights - grads) / (weights + grads), NBYTES_TOL)
    r.check(f"{name} batch {batch}: AdamW state measured vs its nbytes (relative)",
            abs(out["optimizer"] - state) / state, NBYTES_TOL)
    r.check(f"{name} batch {batch}: half weight copies measured vs half the masters' nbytes "
            f"(relative to the masters)",
            abs(out["copies"] - (weights * itemsize // 4 if prec.is_half else 0)) / weights,
            NBYTES_TOL)
    model_acts = kept_activation_bytes(sizes, batch, prec.compute_dtype,
                                       x.dtype != prec.compute_dtype)
    r.check(f"{name} batch {batch}: activations kept by the forward vs the layers' model "
            f"(relative)", abs(out["activations"] - model_acts) / model_acts, ACTIVATION_TOL)
    if timed:
        out["step"] = r.measure(f"step {name} batch {batch}",
                                lambda: nn.train_step(model, opt, x, labels, name, scaler),
                                flops=T.step_flops(sizes, batch),
                                description="one training step (CUDA events)")
    return out


def _theirs(r: LessonRun, torch: Any, sizes: tuple[int, ...], tx: Any, tl: Any,
            name: str) -> dict[str, Any]:
    """PyTorch's twin: weights measured, grads and AdamW state from nbytes, the step's peak
    from max_memory_allocated; the rest of the peak is what autograd kept (activations and
    autocast's half weight copies together) and the step's temporaries."""
    p, c = r.params, torch.cuda
    c.synchronize()
    base = c.memory_allocated()
    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
    weights = c.memory_allocated() - base
    opt = TT.torch_adamw(torch, twin.parameters(), p["lr"])
    scaler = TT.torch_grad_scaler(torch, INIT_SCALE, 2000) if name == "fp16" else None
    step = TT.torch_train_step(torch, twin, opt, scaler, name)
    # Grads, AdamW state and the cuBLAS workspace are made by the first step that is not
    # skipped (an fp16 step that overflows makes no AdamW state).
    for _ in range(TORCH_WARM_STEPS):
        step(tx, tl)
        if opt.state:
            break
    c.synchronize()
    c.reset_peak_memory_stats()
    step(tx, tl)
    c.synchronize()
    peak = c.max_memory_allocated() - base
    grads = sum(q.grad.nbytes for q in twin.parameters() if q.grad is not None)
    state = sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    del twin, opt, scaler, step
    return {"weights": weights, "grads": grads, "optimizer": state, "copies": None,
            "activations": peak - weights - grads - state, "transient": None, "peak": peak,
            "step": None}


def _memory(r: LessonRun, sizes: tuple[int, ...], names: Sequence[str],
            batches: Sequence[int]) -> tuple[dict, dict]:
    p = r.params
    torch = r.torch()
    ours: dict[tuple[int, str], dict] = {}
    theirs: dict[tuple[int, str], dict] = {}
    for batch in batches:
        [(x, labels)] = T.teacher_batches(sizes, batch, 1, p["seed"])
        if batch == batches[0]:
            _numpy_check(r, sizes, x, labels)
        for name in names:
            ours[batch, name] = _ours(r, sizes, x, labels, name, batch == batches[-1])
        if torch is not None:
            [(tx, tl)] = TT.torch_batches(torch, [(x, labels)])
            for name in names:
                with TT.Tf32(torch, name == "tf32"):
                    theirs[batch, name] = _theirs(r, torch, sizes, tx, tl, name)
            del tx, tl
        del x, labels
    return ours, theirs


def _numpy_check(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any) -> None:
    rows, error = T.initial_loss_error(sizes, r.params["seed"], x, labels, NUMPY_ROWS)
    r.check(f"fp32 loss of the initial model on {rows} rows vs float64 NumPy", error, NUMPY_TOL)


def _memory_row(r: LessonRun, impl: str, name: str, batch: int, v: dict, fp32: dict) -> None:
    def mib(b: int | None) -> float | None:
        return None if b is None else b / MIB
    r.row(section="memory", impl=impl, precision=name, batch=batch,
          weights_mib=mib(v["weights"]), grads_mib=mib(v["grads"]),
          optimizer_mib=mib(v["optimizer"]), half_copies_mib=mib(v["copies"]),
          activations_mib=mib(v["activations"]), transient_mib=mib(v["transient"]),
          peak_mib=mib(v["peak"]), peak_vs_fp32=v["peak"] / fp32["peak"],
          step_ms=None if v["step"] is None else v["step"].median * 1e3)


def _memory_findings(r: LessonRun, ours: dict, theirs: dict, names: Sequence[str],
                     batches: Sequence[int]) -> None:
    big = batches[-1]
    f32 = ours[big, "fp32"]
    r.finding(f"fp32 at batch {big}: float32 masters {f32['weights'] / MIB:.1f} MiB, their "
              f"grads {f32['grads'] / MIB:.1f} MiB (split by nbytes: a Parameter allocates "
              f"both at once), AdamW's two moments {f32['optimizer'] / MIB:.1f} MiB, "
              f"activations kept for the backward {f32['activations'] / MIB:.1f} MiB, the "
              f"step's temporaries {f32['transient'] / MIB:.2f} MiB; peak "
              f"{f32['peak'] / MIB:.1f} MiB", value=f32["peak"] / MIB, unit="MiB")
    fits = {n: line_fit(batches, [ours[b, n]["peak"] for b in batches]) for n in names}
    for name in (n for n in HALF if n in names):
        h = ours[big, name]
        parts = {"masters": h["weights"] / f32["weights"], "grads": h["grads"] / f32["grads"],
                 "AdamW state": h["optimizer"] / f32["optimizer"],
                 "activations": h["activations"] / f32["activations"],
                 "whole step": h["peak"] / f32["peak"]}
        r.finding(part_text(name, parts) + f"; the half weight copies add "
                  f"{h['copies'] / MIB:.1f} MiB ({h['copies'] / h['weights']:.2f}x the masters)",
                  value=parts["whole step"], unit="x",
                  labels=(h["step"].label, f32["step"].label))
        if len(batches) >= 2:
            ratios = {b: ours[b, name]["peak"] / ours[b, "fp32"]["peak"] for b in batches}
            crossing = batch_for_ratio(fits[name], fits["fp32"], HALF_TARGET)
            limit = ratio(fits[name][1], fits["fp32"][1])
            r.finding(ratio_text(name, ratios, crossing, limit), value=crossing, unit="rows")
    if theirs:
        parts = []
        for name in names:
            mine = ", ".join(f"{ours[b, name]['peak'] / MIB:.0f}" for b in batches)
            torch_ = ", ".join(f"{theirs[b, name]['peak'] / MIB:.0f}" for b in batches)
            parts.append(f"{name} cudalab {mine} vs torch {torch_}")
        half = [n for n in HALF if n in names]
        tail = ""
        if half:
            n = half[0]
            tail = (f"; torch's {n} peak over its fp32 peak at batch {big}: "
                    f"{theirs[big, n]['peak'] / theirs[big, 'fp32']['peak']:.2f} "
                    f"(autocast keeps its own half weight copies for the backward)")
        r.finding(f"Step peaks in MiB per batch ({', '.join(map(str, batches))}): "
                  + "; ".join(parts) + tail,
                  value=theirs[big, "fp32"]["peak"] / ours[big, "fp32"]["peak"], unit="x")


def _memory_claims(r: LessonRun, ours: dict, names: Sequence[str],
                   batches: Sequence[int]) -> None:
    for name in (n for n in HALF if n in names):
        ratios = {b: ours[b, name]["peak"] / ours[b, "fp32"]["peak"] for b in batches}
        best = min(ratios, key=ratios.get)
        acts = ours[best, name]["activations"] / ours[best, "fp32"]["activations"]
        r.claim(f"Mixed precision ({name}) uses half the memory", tutorial=0.5,
                measured=ratios[best], unit="x", held=ratios[best] <= HALF_TARGET,
                why=f"step peak {ratios[best]:.2f}x fp32's at batch {best} "
                    f"({ratios[batches[0]]:.2f}x at batch {batches[0]}); activations "
                    f"{acts:.2f}x, but float32 masters, grads and AdamW state stay; holds "
                    f"from {HALF_TARGET}x")


# ---- part two: fp16 without a loss scaler -------------------------------------------------


class Weighted:
    """An MLP trained on a loss weighted by `loss_weight`, in fp32 or fp16, with or without
    a GradScaler: the step written out (forward, cross-entropy whose gradient is scaled by
    the weight times the scaler's scale, backward, unscale, AdamW, scale update)."""

    def __init__(self, p: Mapping[str, Any], sizes: tuple[int, ...], name: str,
                 scaled: bool) -> None:
        self.model = nn.MLP(sizes, "gelu", seed=p["seed"])
        self.opt = nn.AdamW(self.model.parameters(), lr=p["lr"])
        self.name = name
        self.scaler = nn.GradScaler(INIT_SCALE) if scaled else None
        self.weight = cudalab.full((1,), float(p["loss_weight"]), dtype=np.float32)
        self.factor = cudalab.full((1,), float(p["loss_weight"]), dtype=np.float32)

    def backward(self, x: Any, labels: Any) -> tuple[Any, Any]:
        """Forward, loss and backward (grads of the weighted, scaled loss); (loss, logits)."""
        if self.scaler is not None:
            cudalab.mul(self.weight, self.scaler.scale, out=self.factor)
        logits = self.model.forward(x, self.name)
        loss = nn.functional.cross_entropy(logits, labels, grad=logits, loss_scale=self.factor)
        self.model.backward(logits)
        return loss, logits

    def step(self, x: Any, labels: Any) -> Any:
        loss, _ = self.backward(x, labels)
        s = self.scaler
        if s is None:
            self.opt.step()
        else:
            s.unscale_(self.opt)
            self.opt.step(found_inf=s.found_inf)
            s.update()
        return loss


def _gradients(run: Weighted, x: Any, labels: Any) -> dict[str, np.ndarray]:
    """Every gradient of one backward: each layer's pre-activation gradient (in the compute
    dtype; the backward writes it over the previous layer's output, the next layer's
    ``input``) and every Parameter's float32 grad."""
    loss, logits = run.backward(x, labels)
    layers = run.model.layers
    out = {f"layer {i} pre-activation grad": layers[i + 1].input.get()
           for i in range(len(layers) - 1)}
    out[f"layer {len(layers) - 1} pre-activation grad (logits)"] = logits.get()
    out["Parameter grads (float32)"] = np.concatenate(
        [q.grad.get().ravel() for q in run.model.parameters()])
    out["loss"] = loss.get()
    return out


def _underflow(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any) -> dict[str, Any]:
    p = r.params
    runs = {"fp32": Weighted(p, sizes, "fp32", False),
            "fp16 unscaled": Weighted(p, sizes, "fp16", False),
            "fp16 scaled": Weighted(p, sizes, "fp16", True)}
    grads = {k: _gradients(v, x, labels) for k, v in runs.items()}
    # The fp32 Parameter grads against float64 NumPy (same weights, same weighted loss).
    model = runs["fp32"].model
    hs, zs = reference.forward(reference.mlp_params(model), x.get(), "gelu")
    _, g = reference.cross_entropy(hs[-1], labels.get())
    want = reference.backward(reference.mlp_params(model), hs, zs, g * p["loss_weight"], "gelu")
    got = [q.grad.get() for q in model.parameters()]
    worst = max(rel_error(a, b) for a, b in zip(got, [w for pair in want for w in pair]))
    r.check("fp32 gradients of the weighted loss vs float64 NumPy (max relative, per "
            "parameter)", worst, GRAD_NUMPY_TOL)
    first = float(grads["fp32"]["loss"])
    r.check("fp16 first loss vs fp32's (same weights, same batch, relative)",
            abs(float(grads["fp16 unscaled"]["loss"]) - first) / first, FIRST_LOSS_TOL)
    counts: dict[str, dict[str, tuple[int, int, int]]] = {}
    for run in RUNS[1:]:
        counts[run] = {}
        for where, ref in grads["fp32"].items():
            if where == "loss":
                continue
            lost, nonzero = underflow(grads[run][where], ref)
            counts[run][where] = (lost, nonzero, ref.size)
            r.row(section="underflow", run=run, where=where, elements=int(ref.size),
                  nonzero_fp32=nonzero, zero_here=lost,
                  underflow_pct=100.0 * lost / nonzero if nonzero else 0.0)
    return counts


def _train(r: LessonRun, sizes: tuple[int, ...], batches: Sequence[tuple[Any, Any]]
           ) -> dict[str, dict[str, Any]]:
    """Each run trains `steps` steps from the same weights; the losses are copied on the
    device every step and read once at the end."""
    p = r.params
    out = {}
    for name, (precision, scaled) in zip(RUNS, (("fp32", False), ("fp16", False),
                                                ("fp16", True))):
        run = Weighted(p, sizes, precision, scaled)
        losses = cudalab.empty((p["steps"],), dtype=np.float32)
        for i in range(p["steps"]):
            x, labels = batches[i % len(batches)]
            cudalab.copyto(losses[i:i + 1], run.step(x, labels).reshape(1))
        out[name] = {"losses": losses.get(),
                     "scale": None if run.scaler is None else run.scaler.get_scale()}
    return out


def _scaler_part(r: LessonRun) -> None:
    p = r.params
    sizes = tuple(p["underflow_sizes"])
    batches = T.teacher_batches(sizes, p["underflow_batch"], min(p["batches"], p["steps"]),
                                p["seed"])
    counts = _underflow(r, sizes, *batches[0])
    trained = _train(r, sizes, batches)
    first = float(trained["fp32"]["losses"][0])
    finals = {k: final_loss(v["losses"]) for k, v in trained.items()}
    for name, v in trained.items():
        r.row(section="training", run=name, first_loss=float(v["losses"][0]),
              final_loss=finals[name], vs_fp32=ratio(finals[name], finals["fp32"]),
              final_scale=v["scale"])
    r.check("fp32 (weighted loss): the loss fell (final / first loss)",
            finals["fp32"] / first, LOSS_FELL)
    r.check("fp16 with the scaler: non-finite losses",
            int(np.count_nonzero(~np.isfinite(trained["fp16 scaled"]["losses"]))), 0)
    for run in RUNS[1:]:
        acts = [(k, v) for k, v in counts[run].items() if "pre-activation" in k]
        lost = sum(v[0] for _, v in acts)
        nonzero = sum(v[1] for _, v in acts)
        per_layer = ", ".join(f"{100.0 * v[0] / v[1] if v[1] else 0.0:.0f}%" for _, v in acts)
        plost, pnonzero, _ = counts[run]["Parameter grads (float32)"]
        scale = "" if run == "fp16 unscaled" else f" times the scale {INIT_SCALE:g}"
        r.finding(f"{run} (loss weighted by {p['loss_weight']:g}{scale}): "
                  f"{100.0 * lost / max(nonzero, 1):.1f}% of the activation-gradient elements "
                  f"that are nonzero in fp32 are zero in fp16 (per layer, first to last: "
                  f"{per_layer}); {100.0 * plost / max(pnonzero, 1):.1f}% of the float32 "
                  f"Parameter grads come out zero", value=100.0 * lost / max(nonzero, 1),
                  unit="%")
    r.finding(f"After {p['steps']} steps on a loss weighted by {p['loss_weight']:g}, "
              + training_text(finals["fp32"], finals["fp16 unscaled"], finals["fp16 scaled"],
                              first),
              value=ratio(finals["fp16 unscaled"], finals["fp32"]), unit="x")
    behind = ratio(finals["fp16 unscaled"], finals["fp32"])
    gap = abs(finals["fp16 scaled"] - finals["fp32"]) / finals["fp32"]
    r.claim("fp16 training needs a loss scaler: without one small gradients underflow",
            tutorial=None, measured=behind, unit="x",
            held=behind >= UNSCALED_BEHIND and gap <= FOLLOWS,
            why=f"unscaled final loss {behind:.2f}x fp32's (holds from {UNSCALED_BEHIND}x); "
                f"with the scaler {gap:.1%} from fp32's (within {FOLLOWS:.0%})")


# ---- the lesson ----------------------------------------------------------------------------


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[str, ...],
                                                tuple[int, ...]]:
    """(the MLP's sizes, the precisions, the batch sizes in increasing order) from the
    params; ValueError on a bad one."""
    name = "amp_memory"
    sizes = T.check_sizes(name, p)
    P.int_lists(name, p, "batch_sizes")
    batches = tuple(sorted(int(b) for b in p["batch_sizes"]))
    if len(set(batches)) != len(batches):
        raise ValueError(f"lesson 'amp_memory': batch_sizes must be distinct, got "
                         f"{tuple(p['batch_sizes'])!r}")
    P.among(name, p, "precisions", PRECISIONS)
    names = tuple(p["precisions"])
    if len(set(names)) != len(names) or "fp32" not in names:
        raise ValueError(f"lesson 'amp_memory': precisions must be distinct and include 'fp32' "
                         f"(the reference), got {names!r}")
    P.int_lists(name, p, "underflow_sizes")
    if len(p["underflow_sizes"]) < 2 or p["underflow_sizes"][-1] < 2:
        raise ValueError(f"lesson 'amp_memory': underflow_sizes must hold at least an input "
                         f"size and 2 or more classes, got {tuple(p['underflow_sizes'])!r}")
    T.check_positive(name, p, "underflow_batch", "steps", "batches")
    if p["steps"] < 10:
        raise ValueError(f"lesson 'amp_memory': steps must be >= 10 (the loss must be seen "
                         f"to fall), got {p['steps']}")
    for key, top in (("lr", 1.0), ("loss_weight", 1.0)):
        v = p[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= top:
            raise ValueError(f"lesson 'amp_memory': {key} must be a number in (0, {top:g}], "
                             f"got {v!r}")
    P.seed(name, p)
    return sizes, names, batches


@lesson(27, "amp_memory", title="Mixed precision and memory: what halves, and why fp16 needs "
                                "a loss scaler",
        seed="Guides' mixed-precision sections ('faster training with less memory usage', "
             "'uses half the memory'; torch.cuda.amp autocast with GradScaler), no figure "
             "for the memory given",
        params={"in_features": 1024, "hidden": (2048, 2048, 2048, 2048), "classes": 16,
                "batch_sizes": (1024, 8192, 65536), "precisions": PRECISIONS, "lr": 1e-3,
                "underflow_sizes": (64, 256, 256, 256, 16), "underflow_batch": 1024,
                "loss_weight": 2.0**-12, "steps": 300, "batches": 8, "seed": 0},
        quick_params={"in_features": 256, "hidden": (512, 512), "batch_sizes": (256, 4096),
                      "steps": 200},
        check=check_params)
def run(r: LessonRun) -> None:
    sizes, names, batches = check_params(r.params)
    ours, theirs = _memory(r, sizes, names, batches)
    for impl, results in (("cudalab", ours), ("torch", theirs)):
        for (batch, name), v in results.items():
            _memory_row(r, impl, name, batch, v, results[batch, "fp32"])
    _memory_findings(r, ours, theirs, names, batches)
    _memory_claims(r, ours, names, batches)
    _scaler_part(r)


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = [x for x in result.rows if x.get("section") == "memory" and x["impl"] == "cudalab"]
    names = list(dict.fromkeys(x["precision"] for x in rows))
    batches = sorted({x["batch"] for x in rows})
    parts = ("weights_mib", "grads_mib", "optimizer_mib", "half_copies_mib",
             "activations_mib", "transient_mib")
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        mine = {x["batch"]: x for x in rows if x["precision"] == name}
        xs = [i + j * width for i in range(len(batches))]
        bottom = [0.0] * len(batches)
        for k, part in enumerate(parts):
            hs = [mine[b][part] or 0.0 for b in batches]
            ax.bar(xs, hs, width=width, bottom=bottom, color=f"C{k}",
                   label=part.replace("_mib", "") if j == 0 else None)
            bottom = [a + h for a, h in zip(bottom, hs)]
        for xpos, b in zip(xs, batches):
            ax.annotate(f"{name}\n{mine[b]['peak_vs_fp32']:.2f}x", (xpos, mine[b]["peak_mib"]),
                        fontsize=6, ha="center", va="bottom")
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(batches))])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("MiB at the step's peak, by part (ratio to fp32 on top)")
    ax.legend(fontsize=7)
