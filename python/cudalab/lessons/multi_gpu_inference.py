"""Lesson 24 `multi_gpu_inference`: ResNet-50 images/s on 1 to N GPUs, a replica on each.

Inference has no gradients to exchange, so data parallelism is all it needs:
one replica of the model per GPU (``models.ResNet50.to(d)``), the batch split
between them, each replica's forward enqueued on its own device (one C call,
or one graph launch with ``graph=True``), the logits gathered on device 0.
The host issues every GPU's forward before it waits for any, so the GPUs run
at once; the lesson times whole steps (every forward and the gather, until
every device is done) with the host clock over a loop of steps, for every GPU
count from 1 to N at the same per-GPU batch, and gives images per second, the
speed-up over one GPU and the scaling efficiency (speed-up / N).

Where torch and torchvision are installed, the same scheme runs with
torchvision's resnet50 (channels_last, the same weights) beside it. (Not
``torch.nn.DataParallel``: with cuDNN autotuning on, its worker threads hung
inside their first convolutions on two H200s, torch 2.11; the `data_parallel`
lesson measures what a DataParallel step costs.) Every replica's logits are
checked against device 0's on the same images, and device 0's against the
NumPy reference.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import numpy as np

from ..bench import host_clock, host_measurement
from . import multi_gpu as M
from ..models import torch_twin as TW
from . import resnet as R
from ._measuring import rel_error
from .inference import TOLERANCE
from .registry import LessonRun, lesson

SEED = 0
# Replicas run the same kernels on the same GPU model: their logits match device 0's.
TOL_REPLICA = 1e-5
# Issue 20's target: >= 1.95x on 2 GPUs, a scaling efficiency of 0.975.
SCALING_TARGET = 0.975
# Below this efficiency the finding names what the GPUs wait for.
SCALING_POOR = 0.9
# CUDA graphs "help" at this ratio of eager over graph step times.
GRAPH_HELPS = 1.05
TIMER = "host clock around a loop of steps (every GPU's forward, the gather) and a synchronize"

ROW_KEYS = ("impl", "mode", "gpus", "batch_per_gpu", "global_batch", "ms_per_step",
            "images_per_s", "speedup", "efficiency")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def check_params(p: Mapping[str, Any]) -> tuple[int, str]:
    """(per-GPU batch, precision) from the params; ValueError on a bad one."""
    [batch] = R.check_batch_sizes([p["batch"]], "lesson 'multi_gpu_inference': batch")
    [precision] = R.check_precisions([p["precision"]], "lesson 'multi_gpu_inference': precision")
    M.check_gpus("multi_gpu_inference", p["gpus"])
    for name in ("steps", "repeats"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"lesson 'multi_gpu_inference': {name} must be an int >= 1, "
                             f"got {v!r}")
    for name in ("graph", "torch"):
        if not isinstance(p[name], bool):
            raise ValueError(f"lesson 'multi_gpu_inference': {name} must be True or False, "
                             f"got {p[name]!r}")
    return batch, precision


def scaling_text(impl: str, mode: str, n: int, rate_n: float, rate_1: float) -> str:
    """One sentence on n GPUs' images/s against one GPU's."""
    eff = M.scaling_efficiency(rate_n, rate_1, n)
    text = (f"{impl} {mode} on {n} GPUs: {rate_n:.0f} images/s, {rate_n / rate_1:.2f}x one GPU's "
            f"{rate_1:.0f} (scaling efficiency {eff:.3f})")
    if eff >= SCALING_TARGET:
        return text + ": the replicas run side by side with nothing to exchange"
    if eff >= SCALING_POOR:
        return text + ": close to linear; the gather and the host's launches take the rest"
    return text + (": far from linear: something serializes the GPUs (the host issuing "
                   "each GPU's forward in turn, the gather onto device 0)")


# ---- measuring -----------------------------------------------------------------------------


def _label(impl: str, mode: str, k: int, b: int, precision: str) -> str:
    head = "" if impl == "cudalab" else f"{impl} "
    return f"{head}{k} GPU{'s' if k > 1 else ''} b{k}x{b} {precision} {mode}"


def _torch_label_twin(label: str) -> str | None:
    """torch's channels_last replicas pair with cudalab's eager replicas."""
    if label.startswith("torch ") and label.endswith(" channels_last"):
        return label[len("torch "):-len(" channels_last")] + " eager"
    return None


class _Replicas:
    """A ResNet-50 on each of `n` devices, their inputs, outputs and the gather buffer."""

    def __init__(self, cudalab: Any, models: Any, params: Any, precision: str, n: int,
                 x_h: np.ndarray, batch: int, graph: bool) -> None:
        self.cl, self.n, self.b = cudalab, n, batch
        self.models, self.x, self.out, self.graphs = [], [], [], []
        for d in range(n):
            with cudalab.device(0):  # built on device 0, then moved: ResNet50.to
                model = models.ResNet50(params, precision=precision)
            self.models.append(model.to(d))
            with cudalab.device(d):
                self.x.append(cudalab.asarray(x_h[d * batch:(d + 1) * batch]))
                self.out.append(cudalab.empty((batch, 1000), dtype="float32"))
        with cudalab.device(0):
            self.gathered = cudalab.empty((n * batch, 1000), dtype="float32")
        if graph:
            for d in range(n):
                g = self.models[d].capture(batch)
                with cudalab.device(d):
                    cudalab.copyto(g.input, self.x[d])
                self.graphs.append(g)

    def step(self, k: int, graph: bool) -> None:
        """Every forward of GPUs 0..k-1, enqueued before any wait; the logits gathered on 0."""
        cl = self.cl
        outs = []
        for d in range(k):
            with cl.device(d):
                if graph:
                    outs.append(self.graphs[d].replay())
                else:
                    outs.append(self.models[d].forward(self.x[d], out=self.out[d]))
        with cl.device(0):
            for d, o in enumerate(outs):
                cl.copyto(self.gathered[d * self.b:(d + 1) * self.b], o)

    def loop(self, k: int, graph: bool, steps: int) -> Any:
        def run() -> None:
            for _ in range(steps):
                self.step(k, graph)
            for d in range(k):
                self.cl.synchronize(d)
        return run


def _measure(r: LessonRun, label: str, fn: Any, steps: int, images: int) -> Any:
    [times] = host_clock({label: fn}, r.params["repeats"], warmup=r.timer.settings.warmup).values()
    return r.add(host_measurement(times, calls=steps, label=label, timer=TIMER, host_time=False,
                                  metadata={"images_per_step": images}))


def _checks(r: LessonRun, cl: Any, reps: _Replicas, models: Any, params: Any, x_h: np.ndarray,
            precision: str, graph: bool) -> None:
    base = reps.models[0]
    for d in range(1, reps.n):
        with cl.device(0):
            want = base.forward(reps.x[d].to(0)).get()
        with cl.device(d):
            got = reps.models[d].forward(reps.x[d]).get()
        r.check(f"replica on device {d} vs device 0 on the same {reps.b} images "
                f"(max |diff| / max |logit|)", rel_error(got, want), TOL_REPLICA)
    reps.step(reps.n, graph)
    for d in range(reps.n):
        cl.synchronize(d)
    gathered = reps.gathered.get()
    for d in range(reps.n):
        with cl.device(d):
            own = (reps.graphs[d].output if graph else reps.out[d]).get()
        r.check(f"gathered logits of device {d} equal its own output "
                f"({'graph' if graph else 'eager'})",
                rel_error(gathered[d * reps.b:(d + 1) * reps.b], own), 0.0)
    ref = models.reference.forward(params, x_h[:1])
    with cl.device(0):
        got = base.forward(cl.asarray(x_h[:1])).get()
    r.check(f"{precision} logits on device 0 (batch 1) vs the NumPy fp32 reference",
            rel_error(got, ref), TOLERANCE[precision])


def _torch(r: LessonRun, torch: Any, state: Mapping[str, np.ndarray], precision: str, n: int,
           counts: Sequence[int], x_h: np.ndarray, b: int, steps: int) -> dict:
    """torchvision's resnet50 as replicas (channels_last), one per GPU, as ours run."""
    tv = TW.torchvision_or_none()
    if tv is None:
        return {}
    cpu = TW.torch_resnet50(torch, tv, state)
    dtype = getattr(torch, R.DTYPE_OF[precision])
    out = {}
    with TW.TorchPrecision(torch, precision), torch.no_grad():
        mods, xs = [], []
        for d in range(n):
            dev = f"cuda:{d}"
            mods.append(copy.deepcopy(cpu).to(device=dev, dtype=dtype,
                                              memory_format=torch.channels_last))
            x = torch.from_numpy(np.ascontiguousarray(x_h[d * b:(d + 1) * b])).to(dev)
            xs.append(x.permute(0, 3, 1, 2).to(dtype))  # NCHW shape, NHWC strides
        for k in counts:
            def loop(k: int = k) -> None:
                for _ in range(steps):
                    outs = []
                    for d in range(k):
                        with torch.cuda.device(d):
                            outs.append(mods[d](xs[d]))
                    torch.cat([o.to("cuda:0") for o in outs])
                for d in range(k):
                    torch.cuda.synchronize(d)
            label = _label("torch", "channels_last", k, b, precision)
            out[("channels_last", k)] = _measure(r, label, loop, steps, k * b)
    return out


# ---- the lesson ---------------------------------------------------------------------------


@lesson(24, "multi_gpu_inference", title="Data-parallel ResNet-50 inference on 1 to N GPUs",
        seed="PyTorch 'Optional: Data Parallelism' (nn.DataParallel splits the batch over "
             "GPUs) and issue 20 (replicas per GPU, >= 1.95x on 2)",
        params={"batch": 128, "precision": "fp16", "gpus": None, "graph": True, "steps": 10,
                "repeats": 10, "torch": True},
        quick_params={"batch": 32, "steps": 4, "repeats": 5, "torch": False},
        torch_twin=_torch_label_twin,
        check=check_params)
def run(r: LessonRun) -> None:
    import cudalab
    from .. import models

    p = r.params
    b, precision = check_params(p)
    present = M.gpu_count()
    n = M.gpus_used(p["gpus"], present)
    counts = M.device_counts(None, n)
    state = models.init_weights(seed=SEED)
    params = models.fold(state)
    x_h = R.images(SEED, n * b)
    reps = _Replicas(cudalab, models, params, precision, n, x_h, b, p["graph"])
    _checks(r, cudalab, reps, models, params, x_h, precision, p["graph"])
    modes = ["eager"] + (["graph"] if p["graph"] else [])
    ours = {}
    for mode in modes:
        for k in counts:
            label = _label("cudalab", mode, k, b, precision)
            ours[(mode, k)] = _measure(r, label, reps.loop(k, mode == "graph", p["steps"]),
                                       p["steps"], k * b)
    theirs = {}
    torch = r.torch() if p["torch"] else None
    if torch is not None:
        del reps
        theirs = _torch(r, torch, state, precision, n, counts, x_h, b, p["steps"])
    _rows(r, ours, theirs, b)
    _findings(r, ours, theirs, n, present, b, precision, modes)


def _rows(r: LessonRun, ours: dict, theirs: dict, b: int) -> None:
    for impl, found in (("cudalab", ours), ("torch", theirs)):
        for (mode, k), m in found.items():
            base = found.get((mode, 1))
            rate = k * b / m.median
            rate_1 = None if base is None else b / base.median
            r.row(impl=impl, mode=mode, gpus=k, batch_per_gpu=b, global_batch=k * b,
                  ms_per_step=m.median * 1e3, images_per_s=rate,
                  speedup=None if rate_1 is None else rate / rate_1,
                  efficiency=None if rate_1 is None else M.scaling_efficiency(rate, rate_1, k))


def _findings(r: LessonRun, ours: dict, theirs: dict, n: int, present: int, b: int,
              precision: str, modes: Sequence[str]) -> None:
    best_mode = min(modes, key=lambda mode: ours[(mode, n)].median)
    one = ours[(best_mode, 1)]
    rate_1 = b / one.median
    if n < 2:
        r.finding(f"One GPU, {precision}, batch {b}: {rate_1:.0f} images/s ({best_mode})",
                  value=rate_1, unit="images/s", labels=(one.label,))
        r.finding(M.needs_text("Splitting the batch over GPUs", 2, present), value=present,
                  unit="GPUs")
    for k in range(2, n + 1):
        m = ours[(best_mode, k)]
        rate = k * b / m.median
        r.finding(scaling_text("cudalab", best_mode, k, rate, rate_1),
                  value=M.scaling_efficiency(rate, rate_1, k), unit="efficiency",
                  labels=(one.label, m.label))
    if "graph" in modes:
        eager, graph = ours[("eager", n)], ours[("graph", n)]
        gain = eager.median / graph.median
        r.finding(f"On {n} GPU{'s' if n > 1 else ''}: eager steps take {eager.median * 1e3:.2f} "
                  f"ms, graph replays {graph.median * 1e3:.2f} ms ({gain:.2f}x)"
                  + (": one launch per GPU lets the host reach every GPU sooner"
                     if gain >= GRAPH_HELPS else ": the forward is long enough that launching "
                     "it costs little either way"),
                  value=gain, unit="x", labels=(eager.label, graph.label))
    if theirs:
        t = theirs[("channels_last", n)]
        mine = ours[("eager", n)]
        r.finding(f"torchvision's resnet50 (channels_last) as {n} replica(s): "
                  f"{n * b / t.median:.0f} images/s against cudalab's eager "
                  f"{n * b / mine.median:.0f} (torch's time is {t.median / mine.median:.2f}x "
                  f"cudalab's)",
                  value=t.median / mine.median, unit="x", labels=(mine.label, t.label))
    if n >= 2:
        m = ours[(best_mode, n)]
        rate = n * b / m.median
        eff = M.scaling_efficiency(rate, rate_1, n)
        r.claim("Data parallelism multiplies inference throughput by the number of GPUs "
                "(a replica per GPU, the batch split)", tutorial=None, measured=rate / rate_1,
                unit="x", held=eff >= SCALING_TARGET,
                why=f"{rate / rate_1:.2f}x on {n} GPUs ({best_mode}, batch {b} per GPU), "
                    f"efficiency {eff:.3f}; holds from {SCALING_TARGET} ({2 * SCALING_TARGET:.2f}x "
                    f"on 2)")


@run.plot
def plot(result: Any, ax: Any) -> None:
    for (impl, mode) in sorted({(x["impl"], x["mode"]) for x in result.rows}):
        pts = sorted((x["gpus"], x["images_per_s"]) for x in result.rows
                     if (x["impl"], x["mode"]) == (impl, mode))
        ax.plot([q[0] for q in pts], [q[1] for q in pts], "o-" if impl == "cudalab" else "s--",
                label=f"{impl} {mode}")
    ones = [x for x in result.rows if x["impl"] == "cudalab" and x["gpus"] == 1]
    if ones:
        best = max(x["images_per_s"] for x in ones)
        top = max(x["gpus"] for x in result.rows)
        ax.plot([1, top], [best, best * top], ":", color="gray", label="linear")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("images per second")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
