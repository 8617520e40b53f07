"""Lesson 17 `amp`: mixed-precision training, fp32 vs tf32 vs fp16 (with a loss scaler) vs bf16.

The same MLP, from the same initial weights, trains on the same batches in
each precision mode of :mod:`cudalab.nn`: master weights, gradients and the
optimizer stay float32, only the GEMMs and activations change dtype. The
lesson measures the GPU time of one step (CUDA events) and the samples per
second it gives, trains a fixed number of steps from scratch and compares the
final loss with fp32's, and reads the fp16 loss scaler's history (skipped
steps, the scale after every step) once, at the end: the scaler never makes
the host wait during training. What a scaler that does make it wait costs is
measured too: the same fp16 loop with ``scaler.get_scale()`` after every step
against the sync-free loop (host clock around the loop and a synchronize).

One of the guides' AMP loops omits ``optimizer.zero_grad()``: in PyTorch the
gradients then add up across steps, and the loop trains wrong without an
error. Where torch is installed the lesson runs that loop beside the correct
one from the same weights and reports the gradient norms and losses.
cudalab.nn cannot make this mistake silently: ``MLP.backward`` overwrites the
gradients unless ``accumulate=True``, which the lesson checks.
"""

from __future__ import annotations

import contextlib

from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn

from ..bench import host_clock, host_measurement
from ..nn import torch_twin as TT
from . import training as T
from ._measuring import rel_error
from .training import final_loss
from . import _params as P
from .registry import LessonRun, lesson

PRECISIONS = tuple(nn.PRECISIONS)
HALF = ("fp16", "bf16")
# A mixed-precision step counts as faster when fp32's step takes at least this many times as long.
AMP_FASTER = 1.1
# Mixed precision "reaches the same loss": final loss within this fraction of fp32's.
LOSS_CLOSE = 0.02
# The loss fell: the final loss is at most this fraction of the first step's.
LOSS_FELL = 0.9
# A per-step host read counts as costly when the loop gets at least this much slower with it.
SYNC_COSTLY = 1.05
# The first step's loss (same weights, same batch) against fp32's, per precision.
FIRST_LOSS_TOL = {"tf32": 5e-3, "fp16": 1e-2, "bf16": 3e-2}
# A fresh model's float32 loss against float64 NumPy, on a few rows.
NUMPY_ROWS = 16
NUMPY_TOL = 1e-4
# torch's fp32 first loss against ours (true float32 GEMMs on both sides).
TORCH_TOL = 1e-4
HOST_REPEATS = {True: 3, False: 5}
# The seed's loop without zero_grad runs at most this many steps beside the correct one.
ZERO_GRAD_STEPS = 50
# Without zero_grad the loop "trains the same" when its last gradient norm is within this
# factor of the correct loop's and its final loss within LOSS_CLOSE.
ZERO_GRAD_SAME = 1.1
# cudalab: a batch's grads after another batch's backward vs its own grads (max relative).
OVERWRITE_TOL = 1e-6
# PyTorch's initial loss scale, used by both scalers.
INIT_SCALE = 2.0**16
LOOP_TIMER = "host clock around the loop of steps + synchronize, per step"
SYNCED = "fp16, get_scale() every step"

ROW_KEYS = ("impl", "precision", "step_ms", "samples_per_s", "speedup", "tflops", "pct_peak",
            "loop_ms",
            "synced_loop_ms", "first_loss", "final_loss", "vs_fp32_pct", "skipped_steps",
            "final_scale")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def loss_gap(final: float, reference: float) -> float:
    """|final - reference| / reference (inf when either is not finite)."""
    if not (np.isfinite(final) and np.isfinite(reference)) or reference <= 0:
        return float("inf")
    return abs(final - reference) / reference


def scale_story(scales: Sequence[float], found_inf: Sequence[float],
                init_scale: float) -> dict[str, Any]:
    """Skipped steps, backoffs, growths and the final scale from per-step histories."""
    scales = [float(s) for s in scales]
    before = [float(init_scale), *scales[:-1]]
    return {
        "skipped": int(sum(1 for f in found_inf if f != 0)),
        "backoffs": sum(1 for a, b in zip(before, scales) if b < a),
        "growths": sum(1 for a, b in zip(before, scales) if b > a),
        "final": scales[-1] if scales else float(init_scale),
    }


def speed_text(name: str, speedup: float, step_s: float, fp32_s: float) -> str:
    """One sentence on a precision's step time against fp32's."""
    base = (f"{name}: {step_s * 1e3:.3f} ms per step vs fp32's {fp32_s * 1e3:.3f} ms "
            f"({speedup:.2f}x)")
    if speedup >= AMP_FASTER:
        return base + ": the GEMMs run on tensor cores and move half the bytes"
    if speedup <= 1 / AMP_FASTER:
        return base + ": slower, the casts and scaler kernels outweigh faster GEMMs at this size"
    return base + ": no faster, at this size the step's time is not in its GEMMs"


def sync_text(free_s: float, synced_s: float) -> str:
    """One sentence on what a per-step host read of the scale costs the fp16 loop."""
    cost = synced_s - free_s
    ratio = synced_s / free_s if free_s > 0 else float("inf")
    head = (f"Reading the scale back every step (as a scaler that checks found_inf on the host "
            f"must): {synced_s * 1e3:.3f} ms per step vs {free_s * 1e3:.3f} ms sync-free")
    if ratio >= SYNC_COSTLY:
        return (head + f", {cost * 1e6:.0f} us ({ratio:.2f}x) per step: the host waits for the "
                f"GPU and the GPU then waits for the next launches")
    return (head + f" ({ratio:.2f}x): the GPU work per step hides the round trip at this size")


def zero_grad_text(name: str, norm_ratio: float, loss_gap_: float, skipped: tuple[int, int],
                   steps: int) -> str:
    """One sentence on the loop without zero_grad against the correct one (last gradient
    norm ratio, final-loss gap, skipped steps with and without zero_grad)."""
    head = (f"torch {name}, {steps} steps without optimizer.zero_grad(): last gradient norm "
            f"{norm_ratio:.3g}x the correct loop's, final loss {loss_gap_:.1%} away")
    if skipped[1] > skipped[0]:
        head += (f", {skipped[1]} steps skipped (vs {skipped[0]}): an overflowed gradient "
                 f"stays in .grad, so every later step finds inf")
    if not np.isfinite(norm_ratio) or norm_ratio >= ZERO_GRAD_SAME or loss_gap_ > LOSS_CLOSE:
        return head + ": the gradients add up across steps and the loop trains wrong, silently"
    return (head + ": hidden here (unscale_ divides the leftover gradients by the scale at "
            "every step), but the loop is still wrong")


# ---- training ------------------------------------------------------------------------------


class Run:
    """One precision's model, optimizer and scaler, built from the lesson's params."""

    def __init__(self, p: Mapping[str, Any], sizes: tuple[int, ...], name: str) -> None:
        self.name = name
        self.model = nn.MLP(sizes, "gelu", seed=p["seed"])
        self.opt = nn.AdamW(self.model.parameters(), lr=p["lr"])
        self.scaler = (nn.GradScaler(INIT_SCALE, growth_interval=p["growth_interval"])
                       if nn.PRECISIONS[name].needs_scaler else None)

    def step(self, x: Any, labels: Any) -> Any:
        return nn.train_step(self.model, self.opt, x, labels, self.name, self.scaler)


def _train(run: Run, batches: Sequence[tuple[Any, Any]], steps: int) -> dict[str, Any]:
    """`steps` steps from scratch; the losses and the scaler's history are kept on the
    device (a copy per step, no host read) and read once at the end."""
    losses = cudalab.empty((steps,), dtype=np.float32)
    s = run.scaler
    scales = found = None
    if s is not None:
        scales = cudalab.empty((steps,), dtype=np.float32)
        found = cudalab.empty((steps,), dtype=np.float32)
    for i in range(steps):
        x, labels = batches[i % len(batches)]
        cudalab.copyto(losses[i:i + 1], run.step(x, labels).reshape(1))
        if s is not None:
            cudalab.copyto(scales[i:i + 1], s.scale.reshape(1))
            cudalab.copyto(found[i:i + 1], s.found_inf.reshape(1))
    out = {"losses": losses.get()}
    if s is not None:
        out["scaler"] = scale_story(scales.get(), found.get(), s.init_scale)
    return out


def _loop(one: Callable[[], Any], n: int,
          after: Callable[[], Any] | None = None) -> Callable[[], None]:
    def run() -> None:
        for _ in range(n):
            one()
            if after is not None:
                after()
        cudalab.synchronize()
    return run


def _measure_step(r: LessonRun, label: str, one: Callable[[], Any], sizes: tuple[int, ...],
                  name: str) -> Any:
    return r.measure(label, one, flops=T.step_flops(sizes, r.params["batch"]),
                     ceiling=None if r.quick else T.MATMUL_CEILINGS[name],
                     description="one training step (CUDA events)")


def _numpy_check(r: LessonRun, sizes: tuple[int, ...], batches: Sequence[tuple[Any, Any]]) -> None:
    rows, error = T.initial_loss_error(sizes, r.params["seed"], *batches[0], NUMPY_ROWS)
    r.check(f"fp32 loss of the initial model on {rows} rows vs float64 NumPy", error, NUMPY_TOL)


def _ours(r: LessonRun, sizes: tuple[int, ...], batches: Sequence[tuple[Any, Any]],
          names: Sequence[str]) -> dict[str, dict[str, Any]]:
    p = r.params
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        run = Run(p, sizes, name)
        trained = _train(run, batches, p["steps"])
        one = T.cycle(run.step, batches)
        m = _measure_step(r, f"step {name}", one, sizes, name)
        loops = {f"loop {name}": _loop(one, p["loop_steps"])}
        if run.scaler is not None:
            loops[SYNCED] = _loop(one, p["loop_steps"], run.scaler.get_scale)
        times = host_clock(loops, HOST_REPEATS[r.quick], warmup=r.timer.settings.warmup)
        loop = {k: r.add(host_measurement(t, calls=p["loop_steps"], label=k, timer=LOOP_TIMER,
                                          host_time=False), k)
                for k, t in times.items()}
        out[name] = {**trained, "step": m, "loop": loop[f"loop {name}"], "synced": loop.get(SYNCED)}
    return out


def _torch_one(r: LessonRun, torch: Any, sizes: tuple[int, ...], tb: Sequence[tuple[Any, Any]],
               name: str) -> dict[str, Any]:
    """PyTorch trains the same MLP in precision `name`: losses, scale history, timings."""
    p = r.params
    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
    opt = TT.torch_adamw(torch, twin.parameters(), p["lr"])
    scaler = (TT.torch_grad_scaler(torch, INIT_SCALE, p["growth_interval"]) if name == "fp16"
              else None)
    step = TT.torch_train_step(torch, twin, opt, scaler, name)
    losses, scales = [], []
    for i in range(p["steps"]):
        x, labels = tb[i % len(tb)]
        losses.append(step(x, labels))
        if scaler is not None:  # torch's step already waits on found_inf: no extra cost here
            scales.append(scaler.get_scale())
    out = {"losses": torch.stack(losses).float().cpu().numpy()}
    if scaler is not None:
        backoffs = scale_story(scales, [0.0] * len(scales), INIT_SCALE)
        out["scaler"] = {**backoffs, "skipped": backoffs["backoffs"]}  # a skip halves the scale
    one = T.cycle(step, tb)
    out["step"] = _measure_step(r, f"torch step {name}", one, sizes, name)
    [t] = host_clock({"l": _loop(one, p["loop_steps"])}, HOST_REPEATS[r.quick],
                     warmup=r.timer.settings.warmup).values()
    label = f"torch loop {name}"
    out["loop"] = r.add(host_measurement(t, calls=p["loop_steps"], label=label, timer=LOOP_TIMER,
                                         host_time=False), label)
    out["synced"] = None
    return out


def _seed_loop(torch: Any, twin: Any, opt: Any, scaler: Any, precision: str,
               zero_grad: bool) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The guides' AMP step, with or without ``opt.zero_grad()``: ``step(x, labels)`` ->
    (loss, the gradient norm the optimizer steps with), both on the device."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    ce = torch.nn.functional.cross_entropy
    params = list(twin.parameters())

    def norm() -> Any:
        return torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(q.grad.float()) for q in params if q.grad is not None]))

    def step(x: Any, labels: Any) -> tuple[Any, Any]:
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        with (torch.autocast("cuda", dtype=dtype) if dtype is not None
              else contextlib.nullcontext()):
            loss = ce(twin(x), labels)
        if scaler is None:
            loss.backward()
            n = norm()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # to read the true norm; scaler.step does not unscale twice
            n = norm()
            scaler.step(opt)
            scaler.update()
        return loss.detach(), n
    return step


def _missing_zero_grad(r: LessonRun, torch: Any, sizes: tuple[int, ...],
                       tb: Sequence[tuple[Any, Any]], name: str) -> dict[str, Any]:
    """The seed's loop without zero_grad beside the correct one, from the same weights."""
    p = r.params
    steps = min(p["steps"], ZERO_GRAD_STEPS)
    out: dict[str, Any] = {"steps": steps}
    for label, zero_grad in (("with", True), ("without", False)):
        twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
        opt = TT.torch_adamw(torch, twin.parameters(), p["lr"])
        scaler = (TT.torch_grad_scaler(torch, INIT_SCALE, p["growth_interval"])
                  if name == "fp16" else None)
        step = _seed_loop(torch, twin, opt, scaler, name, zero_grad)
        losses, norms, scales = [], [], []
        for i in range(steps):
            loss, n = step(*tb[i % len(tb)])
            losses.append(loss)
            norms.append(n)
            if scaler is not None:
                scales.append(scaler.get_scale())
        out[label] = {"losses": torch.stack(losses).float().cpu().numpy(),
                      "norms": torch.stack(norms).float().cpu().numpy(),
                      "skipped": scale_story(scales, [0.0] * len(scales), INIT_SCALE)["backoffs"]}
    return out


def _overwrites(r: LessonRun, sizes: tuple[int, ...],
                batches: Sequence[tuple[Any, Any]]) -> tuple[float, float]:
    """cudalab: a batch's grads after another batch's backward vs its own, and what
    ``accumulate=True`` would have left instead (max relative differences)."""
    model = nn.MLP(sizes, "gelu", seed=r.params["seed"])

    def grads(x: Any, labels: Any, accumulate: bool = False) -> list[np.ndarray]:
        logits = model.forward(x, "fp32")
        nn.functional.cross_entropy(logits, labels, grad=logits)
        model.backward(logits, accumulate=accumulate)
        return [q.grad.get() for q in model.parameters()]

    (x0, l0), (x1, l1) = batches[0], batches[1 % len(batches)]
    own = grads(x1, l1)
    grads(x0, l0)
    again = grads(x1, l1)
    summed = grads(x1, l1, accumulate=True)  # what a forgotten reset would leave
    diff = max(rel_error(a, b) for a, b in zip(again, own))
    r.check("cudalab: a batch's grads after another batch's backward vs its own (backward "
            "overwrites the grads: no zero_grad to forget)", diff, OVERWRITE_TOL)
    return diff, max(rel_error(a, b) for a, b in zip(summed, own))


def _theirs(r: LessonRun, torch: Any, sizes: tuple[int, ...], batches: Sequence[tuple[Any, Any]],
            names: Sequence[str]) -> dict[str, dict[str, Any]]:
    tb = TT.torch_batches(torch, batches)
    out = {}
    for name in names:
        with TT.Tf32(torch, name == "tf32"):
            out[name] = _torch_one(r, torch, sizes, tb, name)
    return out


# ---- the lesson ----------------------------------------------------------------------------


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(the MLP's sizes, the precisions) from the params; ValueError on a bad one."""
    sizes = T.check_sizes("amp", p)
    T.check_positive("amp", p, "batch", "steps", "batches", "loop_steps", "growth_interval")
    if p["steps"] < 2:
        raise ValueError(f"lesson 'amp': steps must be >= 2 (the loss must be seen to fall), "
                         f"got {p['steps']}")
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'amp': lr must be a number in (0, 1), got {lr!r}")
    names = p["precisions"]
    names = (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"lesson 'amp': precisions must be distinct names among "
                         f"{', '.join(PRECISIONS)}, got {names!r}")
    if "fp32" not in names:
        raise ValueError("lesson 'amp': precisions must include 'fp32' (the reference)")
    P.seed("amp", p)
    return sizes, names


@lesson(17, "amp", title="Mixed-precision training: fp32, tf32, fp16 with a loss scaler, bf16",
        seed="Guides' mixed-precision training sections (torch.cuda.amp autocast and GradScaler: "
             "faster training with less memory, no figure given; the Colab notebook's lesson 2 "
             "measured a 2048 x 2048 float16 matmul at 4.0x float32's speed on a T4, a lone "
             "GEMM rather than a training step)",
        params={"in_features": 512, "hidden": (4096, 4096, 4096, 4096), "classes": 16,
                "batch": 1024, "steps": 300, "batches": 32, "lr": 2e-4, "growth_interval": 2000,
                "loop_steps": 50, "precisions": PRECISIONS, "seed": 0},
        quick_params={"in_features": 64, "hidden": (256, 256), "batch": 256, "steps": 100,
                      "batches": 8, "lr": 1e-3, "loop_steps": 20},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    sizes, names = check_params(p)
    batches = T.teacher_batches(sizes, p["batch"], min(p["batches"], p["steps"]), p["seed"])
    _numpy_check(r, sizes, batches)
    ours = _ours(r, sizes, batches, names)
    torch = r.torch()
    theirs = _theirs(r, torch, sizes, batches, names) if torch is not None else {}
    _checks(r, ours, theirs)
    overwrite = _overwrites(r, sizes, batches)
    missing = {}
    if torch is not None:
        tb = TT.torch_batches(torch, batches)
        for name in (n for n in ("fp16", "fp32") if n in names):
            with TT.Tf32(torch, False):
                missing[name] = _missing_zero_grad(r, torch, sizes, tb, name)
    for impl, results in (("cudalab", ours), ("torch", theirs)):
        for name, x in results.items():
            _row(r, impl, name, x, results["fp32"])
    _findings(r, ours, theirs, names)
    _claims(r, ours, names)
    _zero_grad_findings(r, overwrite, missing)


def _zero_grad_findings(r: LessonRun, overwrite: tuple[float, float], missing: dict) -> None:
    diff, summed = overwrite
    r.finding(f"cudalab.nn's backward overwrites the gradients unless accumulate=True: a "
              f"batch's grads after another batch's backward differ from its own by {diff:.2g} "
              f"(max relative); accumulate=True would have left them {summed:.2g} away, as a "
              f"torch loop without zero_grad does", value=summed, unit="relative")
    for name, m in missing.items():
        ok, bad = m["with"], m["without"]
        norm_ratio = float(bad["norms"][-1] / ok["norms"][-1])
        gap = loss_gap(final_loss(bad["losses"]), final_loss(ok["losses"]))
        r.finding(zero_grad_text(name, norm_ratio, gap, (ok["skipped"], bad["skipped"]),
                                 m["steps"]), value=norm_ratio, unit="x")
    if missing:
        name = next(iter(missing))  # the seed's own loop (fp16 with a GradScaler) when run
        ok, bad = missing[name]["with"], missing[name]["without"]
        norm_ratio = float(bad["norms"][-1] / ok["norms"][-1])
        gap = loss_gap(final_loss(bad["losses"]), final_loss(ok["losses"]))
        same = (np.isfinite(norm_ratio) and 1 / ZERO_GRAD_SAME <= norm_ratio <= ZERO_GRAD_SAME
                and gap <= LOSS_CLOSE and bad["skipped"] == ok["skipped"])
        r.claim(f"The guide's AMP loop without optimizer.zero_grad() ({name}) trains like the "
                f"loop with it", tutorial=None, measured=norm_ratio, unit="x", held=bool(same),
                why=f"after {missing[name]['steps']} steps: gradient norm {norm_ratio:.3g}x, "
                    f"final loss {gap:.1%} away, {bad['skipped']} vs {ok['skipped']} steps "
                    f"skipped; holds within {ZERO_GRAD_SAME}x and {LOSS_CLOSE:.0%}")


def _checks(r: LessonRun, ours: dict, theirs: dict) -> None:
    first32 = float(ours["fp32"]["losses"][0])
    for name, x in ours.items():
        losses = x["losses"]
        r.check(f"{name}: non-finite losses in {len(losses)} steps",
                int(np.count_nonzero(~np.isfinite(losses))), 0)
        if name != "fp32":
            r.check(f"{name}: first loss vs fp32's (same weights, same batch)",
                    loss_gap(float(losses[0]), first32), FIRST_LOSS_TOL[name])
        r.check(f"{name}: the loss fell (final / first loss)",
                final_loss(losses) / float(losses[0]), LOSS_FELL)
    if theirs:
        r.check("torch fp32 first loss vs cudalab's (same weights, same batch)",
                loss_gap(float(theirs["fp32"]["losses"][0]), first32), TORCH_TOL)


def _row(r: LessonRun, impl: str, name: str, x: dict, fp32: dict) -> None:
    step, scaler = x["step"].median, x.get("scaler")
    final, final32 = final_loss(x["losses"]), final_loss(fp32["losses"])
    r.row(impl=impl, precision=name, step_ms=step * 1e3,
          samples_per_s=r.params["batch"] / step, speedup=fp32["step"].median / step,
          tflops=x["step"].tflops, pct_peak=x["step"].percent_of_ceiling,
          loop_ms=x["loop"].median * 1e3,
          synced_loop_ms=None if x["synced"] is None else x["synced"].median * 1e3,
          first_loss=float(x["losses"][0]), final_loss=final,
          vs_fp32_pct=100.0 * (final - final32) / final32,
          skipped_steps=None if scaler is None else scaler["skipped"],
          final_scale=None if scaler is None else scaler["final"])


def _findings(r: LessonRun, ours: dict, theirs: dict, names: Sequence[str]) -> None:
    fp32 = ours["fp32"]["step"]
    for name in names:
        if name == "fp32":
            continue
        m = ours[name]["step"]
        speedup = fp32.median / m.median
        r.finding(speed_text(name, speedup, m.median, fp32.median), value=speedup, unit="x",
                  labels=(m.label, fp32.label))
    final32 = final_loss(ours["fp32"]["losses"])
    parts = [f"{n} {final_loss(ours[n]['losses']):.4f}" for n in names]
    worst = max(loss_gap(final_loss(ours[n]["losses"]), final32) for n in names)
    r.finding(f"Final loss after {r.params['steps']} steps (mean of the last tenth): "
              f"{', '.join(parts)}; the farthest from fp32's is {worst:.2%} away",
              value=100.0 * worst, unit="%")
    peaks = {n: ours[n]["step"].percent_of_ceiling for n in names}
    if all(v is not None for v in peaks.values()):
        r.finding("GEMM FLOPs per step over the step time, against this GPU's measured matmul "
                  "peak of the same type: " + ", ".join(
                      f"{n} {ours[n]['step'].tflops:.1f} TFLOP/s ({v:.0f}%)"
                      for n, v in peaks.items()),
                  value=max(peaks.values()), unit="%",
                  labels=tuple(ours[n]["step"].label for n in names))
    if "fp16" in ours:
        s, steps = ours["fp16"]["scaler"], r.params["steps"]
        r.finding(f"fp16 loss scaler: {s['skipped']} of {steps} steps skipped on the device "
                  f"({s['backoffs']} backoffs, {s['growths']} growths), scale {INIT_SCALE:g} -> "
                  f"{s['final']:g}; its history was copied on the device and read once, after "
                  f"the run", value=s["skipped"], unit="steps")
        free, synced = ours["fp16"]["loop"], ours["fp16"]["synced"]
        r.finding(sync_text(free.median, synced.median), value=synced.median / free.median,
                  unit="x", labels=(free.label, synced.label))
    if theirs:
        ratios = {n: theirs[n]["step"].median / ours[n]["step"].median for n in names}
        r.finding("PyTorch's step time over cudalab's (above 1: cudalab is faster): "
                  + ", ".join(f"{n} {v:.2f}x" for n, v in ratios.items()),
                  value=min(ratios.values()), unit="x",
                  labels=tuple(x for n in names for x in (f"step {n}", f"torch step {n}")))


def _claims(r: LessonRun, ours: dict, names: Sequence[str]) -> None:
    fp32 = ours["fp32"]
    final32 = final_loss(fp32["losses"])
    for name in (n for n in HALF if n in names):
        x = ours[name]
        speedup = fp32["step"].median / x["step"].median
        r.claim(f"Mixed precision ({name}) trains faster than fp32 (the guides give no figure; "
                f"the notebook's T4 float16 GEMM ran 4.0x float32)", tutorial=None,
                measured=speedup, unit="x", held=speedup >= AMP_FASTER,
                why=f"{speedup:.2f}x fp32's step time; holds from {AMP_FASTER}x")
        gap = loss_gap(final_loss(x["losses"]), final32)
        r.claim(f"Mixed precision ({name}) trains as well as fp32", tutorial=None,
                measured=100.0 * gap, unit="%", held=gap <= LOSS_CLOSE,
                why=f"final loss {gap:.2%} from fp32's; holds within {LOSS_CLOSE:.0%}")


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = result.rows
    names = list(dict.fromkeys(x["precision"] for x in rows))
    impls = list(dict.fromkeys(x["impl"] for x in rows))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        mine = {x["precision"]: x for x in rows if x["impl"] == impl}
        ys = [i + j * width for i in range(len(names))]
        ms = [mine[n]["step_ms"] if n in mine else 0.0 for n in names]
        ax.barh(ys, ms, height=width, label=f"{impl}: ms per step")
        for y, n in zip(ys, names):
            if n in mine:
                x = mine[n]
                skipped = "" if x["skipped_steps"] is None else f", {x['skipped_steps']} skipped"
                ax.annotate(f" {x['speedup']:.2f}x, loss {x['final_loss']:.3f}{skipped}",
                            (x["step_ms"], y), fontsize=7, va="center")
    ax.set_yticks([i + width * (len(impls) - 1) / 2 for i in range(len(names))])
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("GPU time per training step (ms); speedup over fp32 and final loss")
    ax.legend(fontsize=8)
