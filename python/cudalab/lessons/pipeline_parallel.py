"""Lesson 25 `pipeline_parallel`: the MLP split across GPUs, micro-batches, the bubble, memory.

Model (pipeline) parallelism gives each GPU a contiguous block of the model's
layers, so each holds only its share of the weights, optimizer state and
activations. Run naively (torch's "model parallel" tutorial: the batch goes
through stage 0, ``.to('cuda:1')``, stage 1), only one GPU works at a time.
Splitting the batch into m micro-batches lets stage s work on micro-batch k
while stage s + 1 works on k - 1 (GPipe); what is left idle is the fill and
drain of the pipeline, the *bubble*, which GPipe's analysis puts at
``(S - 1) / (m + S - 1)`` of the step for S equal stages.

`cudalab.distributed.Pipeline` runs that schedule for the nn MLP (stages
balanced by parameter count; the default MLP has 4096 inputs so that its
layers, and so its stages, are equal). For every stage count and every
micro-batch count the lesson times the training step (host clock, every
device synchronized), reads each stage's busy time from the pipeline's own
CUDA events (``timing=True``) and so the measured bubble (the stages' mean
idle share of the step), beside GPipe's formula and beside what the schedule
allows with the stage times measured (``schedule_bubble``: unequal stages and
thinner micro-batch GEMMs included). It records every GPU's peak memory
against the whole model trained on one GPU. Where torch is installed, its
tutorial's two versions run beside it on 2 GPUs: model parallel (m = 1) and
its pipelined forward (the batch split, stage 0 on the next split while stage
1 works). The pipeline's gradients are checked against the unsplit MLP's.

On one GPU the lesson measures the whole model and the cost of micro-batches
alone (a one-stage pipeline), and says what the rest needs.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from ..bench import host_clock, host_measurement
from . import multi_gpu as M
from ..nn import torch_twin as TT
from . import training as T
from . import _params as P
from .registry import LessonRun, lesson

MIB = 1 << 20
PRECISIONS = ("fp32", "tf32", "bf16")
# Pipeline vs unsplit fp32 gradients (max |diff| / max |grad| per parameter), and losses.
GRAD_TOL = 1e-4
LOSS_TOL = 1e-5
# The measured bubble agrees with a theory when the pipeline's utilisation (1 - bubble) is
# within this fraction of the theory's (issue 20: "within 10%").
BUBBLE_TOLERANCE = 0.10
# Pipelining "helps" when the best micro-batch count is this many times faster than m = 1.
PIPELINING_HELPS = 1.2
# Splitting the model "saves memory" when the largest stage's peak is at most this share of
# the whole model's peak on one GPU.
MEMORY_SHARE = 0.75
TIMER = "host clock around a training step and a synchronize of every device"

ROW_KEYS = ("impl", "stages", "chunks", "ms", "samples_per_s", "vs_one_gpu", "bubble",
            "bubble_gpipe", "bubble_schedule", "peak_mib", "peak_mib_per_gpu")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def gpipe_bubble(stages: int, chunks: int) -> float:
    """GPipe's bubble fraction (S - 1) / (m + S - 1) for S equal stages and m micro-batches."""
    if stages < 1 or chunks < 1:
        raise ValueError(f"gpipe_bubble(): expected stages and chunks >= 1, got {stages}, "
                         f"{chunks}")
    return (stages - 1) / (chunks + stages - 1)


def measured_bubble(step: float, busy: Sequence[float]) -> float:
    """The stages' mean idle share of a step: mean over stages of 1 - busy / step."""
    if not step > 0 or not busy:
        return math.nan
    return statistics.fmean(1.0 - b / step for b in busy)


def schedule_step(forward: Sequence[Sequence[float]], backward: Sequence[Sequence[float]]) -> float:
    """The step GPipe's schedule allows with these stage times (per stage, per micro-batch):
    each phase takes its stages' mean micro-batch times summed (the fill) plus (m - 1) times
    the slowest stage's (the steady state); copies between stages count as free."""
    total = 0.0
    for phase in (forward, backward):
        means = [statistics.fmean(t) for t in phase if t]
        if not means:
            continue
        m = len(phase[0])
        total += sum(means) + (m - 1) * max(means)
    return total


def schedule_bubble(forward: Sequence[Sequence[float]],
                    backward: Sequence[Sequence[float]]) -> float:
    """The bubble the schedule allows with these stage times: 1 - busy / (S x schedule_step)."""
    step = schedule_step(forward, backward)
    busy = [sum(f) + sum(b) for f, b in zip(forward, backward)]
    return measured_bubble(step, busy)


def utilisation_ratio(measured: float, theory: float) -> float:
    """(1 - measured bubble) / (1 - theory's): 1.0 when the pipeline keeps its GPUs as busy
    as the theory says."""
    return (1.0 - measured) / (1.0 - theory) if theory < 1 else math.nan


def bubble_text(stages: int, chunks: int, step_ms: float, bubble: float, gpipe: float,
                schedule: float) -> str:
    ratio = utilisation_ratio(bubble, gpipe)
    text = (f"{stages} stages, {chunks} micro-batch{'es' if chunks > 1 else ''}: step "
            f"{step_ms:.2f} ms, measured bubble {bubble:.3f} against GPipe's {gpipe:.3f} "
            f"(equal stages) and {schedule:.3f} (the schedule with these stage times)")
    if ratio >= 1 - BUBBLE_TOLERANCE:
        return text + f": the GPUs are busy {ratio:.2f}x as much as GPipe's formula says"
    return text + (f": busy only {ratio:.2f}x GPipe's share: "
                   + ("unequal stages" if schedule - gpipe > BUBBLE_TOLERANCE * (1 - gpipe)
                      else "copies, launches and thinner micro-batch GEMMs") + " cost the rest")


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the MLP's sizes, the micro-batch counts) from the params; ValueError on a bad one."""
    sizes = T.check_sizes("pipeline_parallel", p)
    chunks = M.positive_ints("pipeline_parallel", "chunks", p["chunks"])
    if not chunks:
        raise ValueError("lesson 'pipeline_parallel': chunks must name at least one count")
    T.check_positive("pipeline_parallel", p, "batch", "repeats", "timing_steps", "check_rows")
    if p["batch"] < max(chunks):
        raise ValueError(f"lesson 'pipeline_parallel': batch {p['batch']} has fewer rows than "
                         f"{max(chunks)} micro-batches")
    if p["precision"] not in PRECISIONS:
        raise ValueError(f"lesson 'pipeline_parallel': precision must be one of "
                         f"{', '.join(PRECISIONS)} (fp16 needs a loss scaler), got "
                         f"{p['precision']!r}")
    M.check_gpus("pipeline_parallel", p["gpus"])
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'pipeline_parallel': lr must be a number in (0, 1), got {lr!r}")
    if not isinstance(p["torch"], bool):
        raise ValueError(f"lesson 'pipeline_parallel': torch must be True or False, got "
                         f"{p['torch']!r}")
    P.seed("pipeline_parallel", p)
    return sizes, tuple(sorted(set(int(c) for c in chunks)))


def stage_counts(n: int, layers: int) -> tuple[int, ...]:
    """Stage counts to measure on n GPUs: 2..n (at most one stage per layer); (1,) on one."""
    counts = tuple(s for s in range(2, n + 1) if s <= layers)
    return counts or (1,)


# ---- measuring -----------------------------------------------------------------------------


def _label(impl: str, stages: int, chunks: int) -> str:
    head = "" if impl == "cudalab" else "torch "
    return f"{head}pipeline {stages} GPU{'s' if stages > 1 else ''} m={chunks}"


ONE_GPU = "one GPU, whole model"


def _sync_all(cudalab: Any, devices: Sequence[int]) -> None:
    for d in devices:
        cudalab.synchronize(d)


def _host_time(r: LessonRun, label: str, fn: Any, rows: int) -> Any:
    [times] = host_clock({label: fn}, r.params["repeats"], warmup=r.timer.settings.warmup).values()
    return r.add(host_measurement(times, calls=1, label=label, timer=TIMER, host_time=False,
                                  metadata={"rows": rows}))


def _memory_before(cudalab: Any, devices: Sequence[int]) -> list[int]:
    _sync_all(cudalab, devices)
    return [cudalab.memory_allocated(d) for d in devices]


def _reset_peaks(cudalab: Any, devices: Sequence[int]) -> None:
    _sync_all(cudalab, devices)
    for d in devices:
        cudalab.reset_peak_memory_stats(d)


def _one_gpu(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any) -> dict[str, Any]:
    """The whole MLP trained on device 0: step time and peak memory (model included)."""
    import cudalab
    from cudalab import nn

    p = r.params
    before = _memory_before(cudalab, [0])
    with cudalab.device(0):
        model = nn.MLP(sizes, "gelu", seed=p["seed"])
        opt = nn.AdamW(model.parameters(), lr=p["lr"])
    _reset_peaks(cudalab, [0])

    def step() -> None:
        with cudalab.device(0):
            nn.train_step(model, opt, x, labels, p["precision"])
        cudalab.synchronize(0)

    m = _host_time(r, ONE_GPU, step, x.shape[0])
    peak = cudalab.max_memory_allocated(0) - before[0]
    return {"time": m, "peak": [peak]}


def _pipeline(r: LessonRun, sizes: tuple[int, ...], x: Any, labels: Any, stages: int,
              chunks: int) -> dict[str, Any]:
    """One (stages, chunks): step time, per-step timings (median of a few), peak per GPU."""
    import cudalab
    from cudalab import nn
    from cudalab.distributed import Pipeline

    p = r.params
    devices = list(range(stages))
    before = _memory_before(cudalab, devices)
    with cudalab.device(0):
        pipe = Pipeline(nn.MLP(sizes, "gelu", seed=p["seed"]), devices, chunks, timing=True)
    opts = pipe.optimizers(nn.AdamW, lr=p["lr"])
    _reset_peaks(cudalab, devices)

    def step() -> None:
        pipe.train_step(x, labels, opts, p["precision"])
        _sync_all(cudalab, devices)

    m = _host_time(r, _label("cudalab", stages, chunks), step, x.shape[0])
    peak = [cudalab.max_memory_allocated(d) - b for d, b in zip(devices, before)]
    timings = []
    for _ in range(int(p["timing_steps"])):
        step()
        timings.append(pipe.timings())
    mid = sorted(timings, key=lambda t: t.step_ms)[len(timings) // 2]
    out = {"time": m, "peak": peak, "timings": mid, "bounds": list(pipe.bounds),
           "bubble": measured_bubble(mid.step_ms, mid.busy_ms),
           "schedule": schedule_bubble(mid.forward_ms, mid.backward_ms),
           "gpipe": gpipe_bubble(stages, len(pipe.last_split))}
    return out  # the pipeline and its optimizers go with this frame


def _check(r: LessonRun, sizes: tuple[int, ...], stages: int, chunks: int) -> None:
    """The pipeline's fp32 loss and gradients against the unsplit MLP's on the same batch."""
    import cudalab
    from cudalab import nn
    from cudalab.distributed import Pipeline

    from ._measuring import rel_error
    from .grad_accumulation import grad_difference

    p = r.params
    rows = max(chunks, int(p["check_rows"]))
    with cudalab.device(0):
        x, labels = nn.TeacherData(sizes[0], sizes[-1], rows, hidden=T.TEACHER_HIDDEN, batches=1,
                                   seed=p["seed"] + 5).batch(0)
        ref = nn.MLP(sizes, "gelu", seed=p["seed"])
        logits = ref.forward(x, "fp32")
        ref_loss = float(nn.functional.cross_entropy(logits, labels, grad=logits).get())
        ref.backward(logits)
        want = [q.grad.get() for q in ref.parameters()]
        del ref
        pipe = Pipeline(nn.MLP(sizes, "gelu", seed=p["seed"]), list(range(stages)), chunks)
    loss = float(pipe.forward_backward(x, labels, "fp32").get())
    got = [q.grad.get() for q in pipe.parameters()]
    del pipe
    r.check(f"pipeline of {stages} stages, {chunks} micro-batches: fp32 gradients of {rows} rows "
            f"vs the unsplit MLP's (max relative difference per parameter)",
            grad_difference(got, want), GRAD_TOL)
    r.check(f"pipeline of {stages} stages, {chunks} micro-batches: fp32 mean loss vs the "
            f"unsplit MLP's (relative)", rel_error([loss], [ref_loss]), LOSS_TOL)


def _torch(r: LessonRun, torch: Any, sizes: tuple[int, ...], bounds: Sequence[tuple[int, int]],
           x: Any, labels: Any, chunk_counts: Sequence[int]) -> dict[int, Any]:
    """torch's tutorial on 2 GPUs: model parallel (m = 1) and its pipelined forward."""
    import cudalab
    from cudalab import nn

    p = r.params
    cudalab.synchronize()
    seq = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
    mods = list(seq)
    # Sequential positions of each MLP layer: its Linear and (but the last) its activation.
    starts = [i for i, mod in enumerate(mods) if isinstance(mod, torch.nn.Linear)] + [len(mods)]
    parts = [torch.nn.Sequential(*mods[starts[a]:starts[b]]).to(f"cuda:{s}")
             for s, (a, b) in enumerate(bounds)]
    opt = TT.torch_adamw(torch, [q for part in parts for q in part.parameters()], p["lr"])
    tx = torch.from_dlpack(x)
    tl = torch.from_dlpack(labels).to(f"cuda:{len(parts) - 1}")
    dtype = {"bf16": torch.bfloat16}.get(p["precision"])
    ce = torch.nn.functional.cross_entropy

    def forward(m: int) -> Any:
        if m == 1:  # the tutorial's ModelParallel: one stage after the other
            h = tx
            for s, part in enumerate(parts):
                h = part(h.to(f"cuda:{s}"))
            return h
        # The tutorial's PipelineParallel forward: stage 0 on the next split while stage 1
        # works on the previous one (two stages).
        splits = iter(tx.split(tx.shape[0] // m))
        s_prev = parts[0](next(splits)).to("cuda:1")
        ret = []
        for s_next in splits:
            ret.append(parts[1](s_prev))
            s_prev = parts[0](s_next).to("cuda:1")
        ret.append(parts[1](s_prev))
        return torch.cat(ret)

    out = {}
    with TT.Tf32(torch, p["precision"] == "tf32"):
        for m in chunk_counts:
            def step(m: int = m) -> None:
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                    loss = ce(forward(m), tl)
                loss.backward()
                opt.step()
                for d in range(len(parts)):
                    torch.cuda.synchronize(d)
            out[m] = _host_time(r, _label("torch", len(parts), m), step, x.shape[0])
    return out


# ---- the lesson ---------------------------------------------------------------------------


@lesson(25, "pipeline_parallel", title="Pipeline parallelism: stages, micro-batches, the bubble",
        seed="PyTorch 'Single-Machine Model Parallel Best Practices' (model parallel with "
             ".to('cuda:1'), then pipelining the input); GPipe's bubble (S - 1) / (m + S - 1)",
        params={"in_features": 4096, "hidden": (4096, 4096, 4096, 4096), "classes": 16,
                "batch": 8192, "chunks": (1, 2, 4, 8, 16), "gpus": None, "precision": "bf16",
                "lr": 1e-4, "repeats": 10, "timing_steps": 5, "check_rows": 64, "torch": True,
                "seed": 0},
        quick_params={"batch": 4096, "chunks": (1, 4), "repeats": 5, "timing_steps": 3,
                      "check_rows": 16},
        check=check_params)
def run(r: LessonRun) -> None:
    import cudalab
    from cudalab import nn

    p = r.params
    sizes, chunk_counts = check_params(p)
    present = M.gpu_count()
    n = M.gpus_used(p["gpus"], present)
    with cudalab.device(0):
        x, labels = nn.TeacherData(sizes[0], sizes[-1], p["batch"], hidden=T.TEACHER_HIDDEN,
                                   batches=1, seed=p["seed"]).batch(0)
    one = _one_gpu(r, sizes, x, labels)
    results = {}
    for stages in stage_counts(n, len(sizes) - 1):
        _check(r, sizes, stages, max(chunk_counts))
        for chunks in chunk_counts:
            results[(stages, chunks)] = _pipeline(r, sizes, x, labels, stages, chunks)
    torch = r.torch() if p["torch"] and n >= 2 else None
    theirs = {}
    if torch is not None and (2, 1) in results:
        theirs = _torch(r, torch, sizes, results[(2, 1)]["bounds"], x, labels, chunk_counts)
    _rows(r, one, results, theirs)
    _findings(r, one, results, theirs, n, present)


def _rows(r: LessonRun, one: dict, results: dict, theirs: dict) -> None:
    batch = r.params["batch"]
    base = one["time"].median

    def row(impl: str, stages: int, chunks: int, m: Any, res: dict | None) -> None:
        peak = None if res is None else res["peak"]
        r.row(impl=impl, stages=stages, chunks=chunks, ms=m.median * 1e3,
              samples_per_s=batch / m.median, vs_one_gpu=base / m.median,
              bubble=None if res is None or "bubble" not in res else res["bubble"],
              bubble_gpipe=None if res is None or "gpipe" not in res else res["gpipe"],
              bubble_schedule=None if res is None or "schedule" not in res else res["schedule"],
              peak_mib=None if peak is None else max(peak) / MIB,
              peak_mib_per_gpu=None if peak is None else [round(q / MIB, 1) for q in peak])

    row("cudalab", 1, 1, one["time"], {"peak": one["peak"]})
    for (stages, chunks), res in results.items():
        row("cudalab", stages, chunks, res["time"], res)
    for chunks, m in theirs.items():
        row("torch", 2, chunks, m, None)


def _findings(r: LessonRun, one: dict, results: dict, theirs: dict, n: int,
              present: int) -> None:
    batch = r.params["batch"]
    for (stages, chunks), res in results.items():
        t = res["timings"]
        r.finding(bubble_text(stages, chunks, t.step_ms, res["bubble"], res["gpipe"],
                              res["schedule"]), value=res["bubble"], unit="fraction",
                  labels=(res["time"].label,))
    if n < 2 or not any(s > 1 for s, _ in results):
        mid = results[(1, max(c for _, c in results))]
        r.finding(f"On one GPU, {max(c for _, c in results)} micro-batches of "
                  f"{batch // max(c for _, c in results)} rows take {mid['time'].median * 1e3:.2f} "
                  f"ms per step against {one['time'].median * 1e3:.2f} ms for the whole batch at "
                  f"once: the cost of thinner GEMMs, with nothing to overlap",
                  value=mid["time"].median / one["time"].median, unit="x",
                  labels=(one["time"].label, mid["time"].label))
        r.finding(M.needs_text("Splitting the model across GPUs (pipeline stages)", 2, present),
                  value=present, unit="GPUs")
        return
    top = max(s for s, _ in results)
    chunk_counts = sorted(c for s, c in results if s == top)
    # The best pipelined count (more than the fewest micro-batches, when there are several).
    best_m = min(chunk_counts[1:] or chunk_counts, key=lambda c: results[(top, c)]["time"].median)
    naive, best = results[(top, chunk_counts[0])], results[(top, best_m)]
    gain = naive["time"].median / best["time"].median
    r.finding(f"{top} stages: the best micro-batch count, {best_m}, runs a step in "
              f"{best['time'].median * 1e3:.2f} ms against {naive['time'].median * 1e3:.2f} ms "
              f"with {chunk_counts[0]} ({gain:.2f}x) and "
              f"{one['time'].median * 1e3:.2f} ms for the whole model on one GPU "
              f"({one['time'].median / best['time'].median:.2f}x)",
              value=gain, unit="x", labels=(naive["time"].label, best["time"].label,
                                            one["time"].label))
    share = max(best["peak"]) / one["peak"][0]
    r.finding(f"Memory: the largest stage's peak on {top} GPUs is {max(best['peak']) / MIB:.0f} "
              f"MiB ({', '.join(f'{q / MIB:.0f}' for q in best['peak'])} MiB per GPU) against "
              f"{one['peak'][0] / MIB:.0f} MiB for the whole model on one GPU ({share:.2f}x)",
              value=share, unit="x", labels=(best["time"].label, one["time"].label))
    if theirs:
        tb = min([c for c in theirs if c > min(theirs)] or list(theirs),
                 key=lambda c: theirs[c].median)
        naive_t = theirs[min(theirs)].median
        r.finding(f"torch's tutorial on 2 GPUs: model parallel {naive_t * 1e3:.2f} ms per step, "
                  f"its pipelined forward at best {theirs[tb].median * 1e3:.2f} ms "
                  f"(m = {tb}); cudalab's Pipeline {results[(2, tb)]['time'].median * 1e3:.2f} ms "
                  f"at m = {tb} (torch pipelines only the forward: autograd runs the backward)",
                  value=theirs[tb].median / results[(2, tb)]["time"].median, unit="x",
                  labels=(theirs[tb].label, results[(2, tb)]["time"].label))
    last = results[(top, chunk_counts[-1])]
    ratio = utilisation_ratio(last["bubble"], last["gpipe"])
    r.claim("GPipe: the bubble is (S - 1) / (m + S - 1) of the step, so more micro-batches keep "
            "the stages busy", tutorial=last["gpipe"], measured=last["bubble"], unit="fraction",
            held=ratio >= 1 - BUBBLE_TOLERANCE,
            why=f"{top} stages, m = {chunk_counts[-1]}: the GPUs are busy {ratio:.2f}x GPipe's "
                f"share (holds from {1 - BUBBLE_TOLERANCE:.2f}x); with these stage times the "
                f"schedule allows a bubble of {last['schedule']:.3f}")
    r.claim("Pipelining the input (micro-batches) makes model parallelism faster than running the "
            "stages one after the other", tutorial=None, measured=gain, unit="x",
            held=gain >= PIPELINING_HELPS,
            why=f"m = {best_m} vs m = {chunk_counts[0]} on {top} stages: {gain:.2f}x; holds from "
                f"{PIPELINING_HELPS}x")
    r.claim("Splitting the model across GPUs lets each hold only a part of it", tutorial=None,
            measured=share, unit="x of one GPU's peak", held=share <= MEMORY_SHARE,
            why=f"largest stage {max(best['peak']) / MIB:.0f} MiB vs {one['peak'][0] / MIB:.0f} "
                f"MiB on one GPU; holds up to {MEMORY_SHARE}x")


@run.plot
def plot(result: Any, ax: Any) -> None:
    for stages in sorted({x["stages"] for x in result.rows if x["impl"] == "cudalab"
                          and x["bubble"] is not None}):
        pts = sorted((x["chunks"], x["bubble"], x["bubble_gpipe"]) for x in result.rows
                     if x["impl"] == "cudalab" and x["stages"] == stages
                     and x["bubble"] is not None)
        ax.plot([q[0] for q in pts], [q[1] for q in pts], "o-", label=f"{stages} stages measured")
        ax.plot([q[0] for q in pts], [q[2] for q in pts], ":", label=f"{stages} stages GPipe")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble (idle share of the step)")
    text = "\n".join(f"{x['impl']} {x['stages']} GPU m={x['chunks']}: {x['ms']:.2f} ms"
                     + (f", peak {x['peak_mib']:.0f} MiB" if x["peak_mib"] else "")
                     for x in result.rows)
    ax.text(0.98, 0.98, text, transform=ax.transAxes, ha="right", va="top", fontsize=6,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    ax.legend(fontsize=7, loc="lower left")
