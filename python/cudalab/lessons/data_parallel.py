"""Lesson 23 `data_parallel`: training the MLP on 1 to N GPUs, DataParallel and DDP.

Data parallelism keeps a whole model on every GPU, gives each its own rows,
and averages the gradients before the optimizer steps. The lesson trains the
4 x 4096 GELU MLP (bf16, AdamW) at two per-GPU batches, a large one that
fills the GPU and a small one where the all-reduce weighs most:

* DistributedDataParallel, one process per GPU (worker processes started with
  `cudalab.distributed.run.launch`, once per GPU count): throughput, speed-up
  and scaling efficiency against one GPU, with gradients sent in float32 and
  in bfloat16; how long the step takes with no communication at all, how long
  the bucket all-reduces take alone, and so how much of the communication the
  backward hides; torch's DDP on the same model and batches beside it;
* DataParallel, one process driving every GPU (in the lesson's own process):
  what splitting the batch automatically costs (it copies the weights to every
  GPU and the batch from GPU 0 each step, reduces the gradients after the
  backward, and one thread launches everything), against DDP;
* the tutorials' own DDP code, its three mistakes shown one by one: the global
  rank used as the device index (what rank 2 of a 2 x 2 job would pick), no
  DistributedSampler (every rank on the same rows: the effective batch does
  not grow), and DDP wrapped around inference (measured with and without).

What DDP computes is checked in fp32 on a small batch: its averaged gradients
and its losses against one GPU training on the whole global batch; so is
DataParallel's. On one GPU only the baseline runs, and the lesson says what
the rest needs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from . import multi_gpu as M
from ._ddp_worker import OPTIM_IN_BACKWARD  # DDP, bf16 gradients, AdamW stepped per bucket
from . import training as T
from . import _params as P
from .registry import LessonRun, lesson

MIB = 1 << 20
WORKER = "cudalab.lessons._ddp_worker"
# Precisions the lesson trains in (fp16 needs a loss scaler: lesson 'amp').
PRECISIONS = ("fp32", "tf32", "bf16")
GRAD_DTYPES = ("fp32", "bf16")
# DDP's averaged fp32 gradients vs one GPU's of the whole batch (max |diff| / max |grad|
# per parameter): the same sums in another order.
GRAD_TOL = 1e-4
# DDP's losses over a few AdamW steps vs one GPU's, relative.
LOSS_TOL = 1e-4
# Gradients "differ" (the missing-sharding demonstration) from this relative difference.
DIFFERENT = 1e-2
# "DDP is preferred over DataParallel" holds from this throughput ratio.
DDP_PREFERRED = 1.05
# "DDP hides the all-reduce behind the backward" holds from this hidden fraction.
OVERLAP_HIDES = 0.5
# Issue 20's scaling targets on 2 GPUs: the largest per-GPU batch >= 1.9x one GPU, the
# smallest >= 1.5x (torch DDP on 2 H200s: 1.79x and 1.26x).
LARGE_BATCH_TARGET = 1.9
SMALL_BATCH_TARGET = 1.5
TORCH_H200 = {"large": 1.79, "small": 1.26}
# A 2 x 2 torchrun job as its rank 2 (node 1, local rank 0) sees it.
MULTI_NODE_RANK2 = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                    "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}

ROW_KEYS = ("part", "impl", "grads", "gpus", "batch_per_gpu", "ms", "samples_per_s", "speedup",
            "efficiency", "comm_ms", "hidden")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def hidden_fraction(compute_s: float, comm_s: float, step_s: float) -> float:
    """The share of the all-reduce the step does not pay: (compute + comm - step) / comm,
    clamped to [0, 1] (nan without a communication time)."""
    if not comm_s > 0 or not math.isfinite(step_s):
        return math.nan
    return min(1.0, max(0.0, (compute_s + comm_s - step_s) / comm_s))


def rank_as_device(environ: Mapping[str, str] = MULTI_NODE_RANK2) -> dict[str, Any]:
    """What the tutorials' ``torch.cuda.set_device(rank)`` picks for the process `environ`
    describes, against the right choice (the local rank).

    Returns a dict: rank, world_size, node_rank, nnodes, gpus_per_node, tutorial_device,
    right_device and exists (whether the tutorial's device is one of the node's GPUs).
    """
    from ..distributed.env import from_environ

    env = from_environ(environ)
    return {"rank": env.rank, "world_size": env.world_size, "node_rank": env.node_rank,
            "nnodes": env.nnodes, "gpus_per_node": env.local_world_size,
            "tutorial_device": env.rank, "right_device": env.local_rank,
            "exists": env.rank < env.local_world_size}


def rank_as_device_text(c: Mapping[str, Any]) -> str:
    return (f"Tutorial mistake 1, the global rank as the device index: in a "
            f"{c['nnodes']} x {c['gpus_per_node']} job, rank {c['rank']} (node {c['node_rank']}) "
            f"calls set_device({c['tutorial_device']}), "
            + ("a GPU its node does not have" if not c["exists"] else "another process's GPU")
            + f"; its GPU is its local rank, {c['right_device']} (LaunchEnv.local_rank; "
            f"cudalab.distributed.init picks it)")


def rows_seen(rows_per_rank: int, world: int, sharded: bool) -> int:
    """Distinct rows one step trains on: world x rows with a sampler that shards, rows without."""
    return rows_per_rank * world if sharded else rows_per_rank


def sharding_text(rows: int, world: int, vs_local: float, vs_global: float) -> str:
    text = (f"Tutorial mistake 2, no DistributedSampler: every rank reads the same {rows} rows, "
            f"so the averaged gradient is one GPU's gradient of those {rows} rows (max relative "
            f"difference {vs_local:.2g}), not of {rows_seen(rows, world, True)} rows ("
            f"{vs_global:.2g} from it)")
    if vs_global >= DIFFERENT:
        return text + (f": {world} GPUs do the work of one, and the effective batch stays "
                       f"{rows_seen(rows, world, False)}")
    return text + ": the two gradients happen to be close on this data"


def inference_text(impl: str, bare_s: float, wrapped_s: float, k: int, b: int) -> str:
    extra = wrapped_s - bare_s
    return (f"Tutorial mistake 3, DDP around inference ({impl}, {k} GPUs, batch {b}): a forward "
            f"takes {bare_s * 1e3:.3f} ms bare and {wrapped_s * 1e3:.3f} ms through DDP "
            f"({extra * 1e6:+.0f} us): the wrapper only adds work to a forward (a broadcast of "
            f"buffers in torch, where a model has them); inference needs no gradient sync")


def scaling_text(what: str, k: int, b: int, rate: float, rate_1: float) -> str:
    eff = M.scaling_efficiency(rate, rate_1, k)
    return (f"{what} on {k} GPUs, per-GPU batch {b}: {rate:.0f} samples/s, {rate / rate_1:.2f}x "
            f"one GPU's {rate_1:.0f} (scaling efficiency {eff:.3f})")


def overlap_text(wire: str, k: int, b: int, compute: float, comm: float, step: float) -> str:
    h = hidden_fraction(compute, comm, step)
    return (f"DDP, {wire} gradients, {k} GPUs, batch {b}: the step without communication takes "
            f"{compute * 1e3:.2f} ms, the bucket all-reduces alone {comm * 1e3:.2f} ms, the "
            f"overlapped step {step * 1e3:.2f} ms: the backward hides {100 * h:.0f}% of the "
            f"communication")


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the MLP's sizes, the per-GPU batches) from the params; ValueError on a bad one."""
    sizes = T.check_sizes("data_parallel", p)
    batches = M.positive_ints("data_parallel", "batches", p["batches"])
    if not batches or len(set(batches)) != len(batches):
        raise ValueError(f"lesson 'data_parallel': batches must be distinct and at least one, "
                         f"got {batches!r}")
    if p["precision"] not in PRECISIONS:
        raise ValueError(f"lesson 'data_parallel': precision must be one of "
                         f"{', '.join(PRECISIONS)} (fp16 needs a loss scaler: see lesson 'amp'), "
                         f"got {p['precision']!r}")
    M.check_gpus("data_parallel", p["gpus"])
    counts = p["gpu_counts"]
    if counts is not None:
        if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__") or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts):
            raise ValueError(f"lesson 'data_parallel': gpu_counts must be None (every count) "
                             f"or ints >= 1, got {counts!r}")
    T.check_positive("data_parallel", p, "repeats", "check_rows", "check_steps")
    if p["repeats"] < 5:
        raise ValueError(f"lesson 'data_parallel': repeats must be >= 5, got {p['repeats']}")
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'data_parallel': lr must be a number in (0, 1), got {lr!r}")
    for name in ("budget_s", "timeout"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"lesson 'data_parallel': {name} must be a number > 0, got {v!r}")
    for name in ("torch", "data_parallel"):
        if not isinstance(p[name], bool):
            raise ValueError(f"lesson 'data_parallel': {name} must be True or False, "
                             f"got {p[name]!r}")
    P.seed("data_parallel", p)
    return sizes, tuple(sorted(batches, reverse=True))


# ---- reading the workers' numbers ------------------------------------------------------------


def _gpus(k: int) -> str:
    return f"{k} GPU{'s' if k > 1 else ''}"


def label(key: str, k: int, b: int | None) -> str:
    """The measurement label of a worker key ("plain", "ddp bf16", "torch ddp fp32", "comm fp32",
    "forward", ...) on k GPUs at per-GPU batch b."""
    torch = key.startswith("torch ")
    base = key[len("torch "):] if torch else key
    if base == "plain":
        name = _gpus(1) if k == 1 else f"no sync {_gpus(k)}"
    elif base.startswith("ddp ") and base != "ddp forward":
        name = f"ddp {base[4:]} grads {_gpus(k)}"
    elif base.startswith("comm "):
        name = f"all_reduce grads {base[5:]} {_gpus(k)}"
    else:
        name = f"{base} {_gpus(k)}"
    if b is not None:
        name += f" b{b}"
    return ("torch " if torch else "") + name


def batch_measurements(results: Sequence[Mapping[str, Any]], k: int) -> dict[tuple[str, int], Any]:
    """(worker key, batch) -> the slowest rank's Measurement, from one launch on k GPUs."""
    out = {}
    for i, entry in enumerate(results[0]["batches"]):
        b = int(entry["batch"])
        for key in entry:
            if key == "batch":
                continue
            per_rank = [{**res["batches"][i][key], "device": res["device"],
                         "device_name": res["device_name"]} for res in results]
            out[(key, b)] = M.slowest_measurement(label(key, k, b), per_rank,
                                                  metadata={"gpus": k, "batch_per_gpu": b})
    return out


def comm_measurements(results: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """grad dtype -> the slowest rank's Measurement of the bucket all-reduces alone."""
    out = {}
    for wire in GRAD_DTYPES:
        if wire not in results[0].get("comm", {}):
            continue
        per_rank = [{**res["comm"][wire], "device": res["device"],
                     "device_name": res["device_name"]} for res in results]
        nbytes = results[0]["comm"][f"{wire} bytes"]
        out[wire] = M.slowest_measurement(label(f"comm {wire}", k, None), per_rank,
                                          bytes=nbytes, metadata={"gpus": k})
    return out


# ---- DataParallel, in this process -----------------------------------------------------------


def _dp_step(cudalab: Any, nn: Any, dp: Any, opt: Any, x: Any, labels: Any, prec: str) -> Any:
    def step() -> None:
        logits = dp.forward(x, prec)
        nn.functional.cross_entropy(logits, labels, grad=logits)
        dp.backward(logits)
        opt.step()
    return step


def _data_parallel(r: LessonRun, sizes: tuple[int, ...], batches: Sequence[int],
                   counts: Sequence[int]) -> dict[str, Any]:
    """One GPU and DataParallel on k GPUs, per batch, timed on device 0 (CUDA events on its
    current stream: the gradient reduce into device 0 ends every step there)."""
    import cudalab
    from cudalab import nn
    from cudalab.distributed import DataParallel

    p = r.params
    prec, seed, lr = p["precision"], int(p["seed"]), float(p["lr"])
    timer = r.timer.replace(hold=False)  # one thread launches every GPU's work: its pace counts
    out: dict[str, Any] = {"times": {}, "split": {}, "traffic": {}}
    with cudalab.device(0):
        _dp_check(r, cudalab, nn, DataParallel, sizes, max(counts))
        for b in batches:
            for k in [1, *[c for c in counts if c > 1]]:
                data = nn.TeacherData(sizes[0], sizes[-1], k * b, hidden=T.TEACHER_HIDDEN,
                                      batches=1, seed=seed)
                x, labels = data.batch(0)
                model = nn.MLP(sizes, "gelu", seed=seed)
                dp = DataParallel(model, device_ids=list(range(k)))
                opt = nn.AdamW(model.parameters(), lr=lr)
                name = f"{_gpus(1)} b{b} (lesson process)" if k == 1 else \
                    f"DataParallel {_gpus(k)} b{b}"
                m = timer.measure(_dp_step(cudalab, nn, dp, opt, x, labels, prec), label=name)
                out["times"][(k, b)] = r.add(m, name)
                out["split"][(k, b)] = list(dp.last_split)
                out["traffic"][(k, b)] = dp.step_traffic(k * b, prec)
                del dp, model, opt, x, labels, data
                for d in range(k):
                    cudalab.synchronize(d)
    return out


def _dp_check(r: LessonRun, cudalab: Any, nn: Any, DataParallel: Any, sizes: tuple[int, ...],
              k: int) -> None:
    """DataParallel's fp32 gradients vs one GPU's on the same batch."""
    from .grad_accumulation import grad_difference

    p = r.params
    rows = k * int(p["check_rows"])
    x, labels = nn.TeacherData(sizes[0], sizes[-1], rows, hidden=T.TEACHER_HIDDEN, batches=1,
                               seed=int(p["seed"]) + 7).batch(0)
    grads = []
    for devices in ([0], list(range(k))):
        model = nn.MLP(sizes, "gelu", seed=int(p["seed"]))
        dp = DataParallel(model, device_ids=devices)
        logits = dp.forward(x, "fp32")
        nn.functional.cross_entropy(logits, labels, grad=logits)
        dp.backward(logits)
        grads.append([q.grad.get() for q in model.parameters()])
        del dp, model
    r.check(f"DataParallel on {k} GPUs: fp32 gradients of a {rows}-row batch vs one GPU's "
            f"(max relative difference per parameter)", grad_difference(grads[1], grads[0]),
            GRAD_TOL)


# ---- the lesson ---------------------------------------------------------------------------


@lesson(23, "data_parallel", title="Data-parallel training: DDP and DataParallel on 1 to N GPUs",
        seed="PyTorch 'Getting Started with Distributed Data Parallel' and 'Optional: Data "
             "Parallelism' (DataParallel splits the batch; DDP is preferred); issue 20 targets",
        params={"in_features": 512, "hidden": (4096, 4096, 4096, 4096), "classes": 16,
                "batches": (8192, 256), "precision": "bf16", "gpus": None, "gpu_counts": None,
                "lr": 1e-4, "repeats": 20, "budget_s": 1.0, "check_rows": 64, "check_steps": 3,
                "torch": True, "data_parallel": True, "timeout": 600.0, "seed": 0},
        quick_params={"batches": (2048, 256), "repeats": 8, "budget_s": 0.25, "check_rows": 16,
                      "check_steps": 2, "timeout": 120.0, "torch": False},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    sizes, batches = check_params(p)
    present = M.gpu_count()
    n = M.gpus_used(p["gpus"], present)
    counts = M.device_counts(p["gpu_counts"], n)
    want_torch = p["torch"] and r.torch() is not None
    launched = {}
    for k in counts:
        config = {"params": {**dict(p), "torch": bool(want_torch)}, "sizes": list(sizes),
                  "batches": list(batches), "timeout": float(p["timeout"])}
        launched[k] = M.launch_workers(WORKER, k, config, float(p["timeout"]),
                                       f"lesson 'data_parallel': DDP on {_gpus(k)}")
    found = {k: batch_measurements(res, k) for k, res in launched.items()}
    comm = {k: comm_measurements(res, k) for k, res in launched.items() if k > 1}
    for k in found:
        for m in found[k].values():
            r.add(m)
        for m in comm.get(k, {}).values():
            r.add(m)
    for k in counts:
        if k > 1:
            _checks(r, launched[k], k)
    dp = (_data_parallel(r, sizes, batches, counts)
          if p["data_parallel"] and max(counts) > 1 else None)
    _rows(r, found, comm, batches, dp)
    _findings(r, found, comm, launched, batches, n, present, dp)


def _checks(r: LessonRun, results: Sequence[Mapping[str, Any]], k: int) -> None:
    c = results[0]["check"]
    rows = c["rows_per_rank"]
    r.check(f"DDP on {k} GPUs ({rows} rows each, fp32): averaged gradients vs one GPU's of "
            f"the {k * rows}-row batch (max relative difference per parameter)",
            c["grad_diff"], GRAD_TOL)
    global_losses = [sum(res["check"]["losses"][s] for res in results) / k
                     for s in range(c["steps"])]
    worst = max(abs(g - w) / abs(w) for g, w in zip(global_losses, c["ref_losses"]))
    r.check(f"DDP on {k} GPUs: mean loss over the ranks at each of {c['steps']} AdamW steps vs "
            f"one GPU's on the whole batch (relative)", worst, LOSS_TOL)
    r.check(f"every rank on the same {rows} rows (no sharding): DDP's gradient equals one GPU's "
            f"of those rows (max relative difference per parameter)",
            c["same_rows_vs_local"], GRAD_TOL)


def _rows(r: LessonRun, found: dict, comm: dict, batches: Sequence[int], dp: dict | None) -> None:
    base = {(impl, b): found[1].get((key, b)) for b in batches
            for impl, key in (("cudalab", "plain"), ("torch", "torch plain"))}
    for k, ms in found.items():
        for (key, b), m in ms.items():
            impl = "torch" if key.startswith("torch ") else "cudalab"
            kind = key[len("torch "):] if impl == "torch" else key
            part = ("inference" if "forward" in kind else "compute" if kind == "plain" and k > 1
                    else "ddp")
            one = base.get((impl, b))
            rate = k * b / m.median if part != "inference" else None
            rate_1 = None if one is None else b / one.median
            grads = kind.split()[1] if kind.startswith("ddp ") and "forward" not in kind else None
            c = comm.get(k, {}).get(grads) if grads and impl == "cudalab" else None
            compute = ms.get(("torch plain" if impl == "torch" else "plain", b))
            hidden = None
            if c is not None and compute is not None and impl == "cudalab":
                hidden = hidden_fraction(compute.median, c.median, m.median)
            r.row(part=part, impl=impl, grads=grads, gpus=k, batch_per_gpu=b,
                  ms=m.median * 1e3, samples_per_s=rate,
                  speedup=None if rate is None or rate_1 is None or part == "compute"
                  else rate / rate_1,
                  efficiency=None if rate is None or rate_1 is None or part == "compute"
                  else M.scaling_efficiency(rate, rate_1, k),
                  comm_ms=None if c is None else c.median * 1e3, hidden=hidden)
    if dp is not None:
        for (k, b), m in dp["times"].items():
            one = dp["times"].get((1, b))
            rate, rate_1 = k * b / m.median, b / one.median
            r.row(part="dataparallel", impl="cudalab", grads="fp32 (reduce)", gpus=k,
                  batch_per_gpu=b, ms=m.median * 1e3, samples_per_s=rate,
                  speedup=rate / rate_1, efficiency=M.scaling_efficiency(rate, rate_1, k),
                  comm_ms=None, hidden=None)


def _best_ddp(ms: dict, b: int, impl: str = "cudalab") -> tuple[str, Any] | None:
    """The fastest DDP variant at batch b: (its wire name, its step Measurement)."""
    head = "torch " if impl == "torch" else ""
    wires = GRAD_DTYPES + ((OPTIM_IN_BACKWARD,) if impl == "cudalab" else ())
    options = [(w, ms[(f"{head}ddp {w}", b)]) for w in wires if (f"{head}ddp {w}", b) in ms]
    return min(options, key=lambda o: o[1].median) if options else None


def _variant_text(wire: str) -> str:
    if wire == OPTIM_IN_BACKWARD:
        return f"bf16 gradients and AdamW stepped per bucket in the backward ({wire})"
    return f"{wire} gradients"


def optim_in_backward_text(k: int, b: int, plain: float, in_backward: float) -> str:
    """What stepping AdamW per bucket inside the backward changed (DDP, bf16 gradients)."""
    change = plain / in_backward
    verdict = ("faster: each bucket's update overlaps the next bucket's all-reduce"
               if change >= 1.0 else "no faster: the updates compete with the transfers")
    return (f"DDP (bf16 gradients) on {k} GPUs, per-GPU batch {b}: AdamW stepped per bucket "
            f"inside the backward takes {in_backward * 1e3:.2f} ms per step against "
            f"{plain * 1e3:.2f} ms after it ({change:.2f}x, {verdict})")


def _findings(r: LessonRun, found: dict, comm: dict, launched: dict, batches: Sequence[int],
              n: int, present: int, dp: dict | None) -> None:
    one = found[1]
    for b in batches:
        m = one[("plain", b)]
        r.finding(f"One GPU, per-GPU batch {b}: {b / m.median:.0f} samples/s "
                  f"({m.median * 1e3:.2f} ms per step, {r.params['precision']}, AdamW)",
                  value=b / m.median, unit="samples/s", labels=(m.label,))
    top = max(found)
    if top < 2:
        r.finding(M.needs_text("DistributedDataParallel and DataParallel", 2, present)
                  if n < 2 else "Only one GPU count was asked for (gpu_counts): DDP and "
                  "DataParallel need 2 or more", value=present, unit="GPUs")
    _rank_mistake(r)
    if top < 2:
        return
    ms = found[top]
    for b in batches:
        for impl in ("cudalab", "torch"):
            best = _best_ddp(ms, b, impl)
            if best is None or (("torch plain" if impl == "torch" else "plain"), b) not in one:
                continue
            wire, m = best
            base = one[("torch plain" if impl == "torch" else "plain", b)]
            r.finding(scaling_text(f"{'torch' if impl == 'torch' else 'cudalab'} DDP "
                                   f"({wire} gradients)", top, b, top * b / m.median,
                                   b / base.median),
                      value=M.scaling_efficiency(top * b / m.median, b / base.median, top),
                      unit="efficiency", labels=(base.label, m.label))
        plain, inside = ms.get(("ddp bf16", b)), ms.get((f"ddp {OPTIM_IN_BACKWARD}", b))
        if plain is not None and inside is not None:
            r.finding(optim_in_backward_text(top, b, plain.median, inside.median),
                      value=plain.median / inside.median, unit="x",
                      labels=(plain.label, inside.label))
        for wire in GRAD_DTYPES:
            step, c, compute = ms.get((f"ddp {wire}", b)), comm[top].get(wire), ms.get(("plain", b))
            if step is None or c is None or compute is None:
                continue
            r.finding(overlap_text(wire, top, b, compute.median, c.median, step.median),
                      value=hidden_fraction(compute.median, c.median, step.median),
                      unit="fraction", labels=(compute.label, c.label, step.label))
    for wire, c in comm[top].items():
        r.finding(f"The gradients' bucket all-reduces in {wire} on {top} GPUs move "
                  f"{c.bytes / MIB:.0f} MiB per rank in {c.median * 1e3:.2f} ms "
                  f"({c.bytes / c.median / 1e9:.0f} GB/s algorithm bandwidth)",
                  value=c.median * 1e3, unit="ms", labels=(c.label,))
    _sharding_mistake(r, launched[top], top)
    _inference_mistake(r, ms, top, min(batches))
    _dp_findings(r, found, dp, batches, top)
    _claims(r, found, comm, batches, dp, top)


def _rank_mistake(r: LessonRun) -> None:
    c = rank_as_device()
    r.finding(rank_as_device_text(c), value=c["tutorial_device"], unit="device index")
    r.claim("The tutorials' DDP setup, torch.cuda.set_device(rank), gives each process its GPU",
            tutorial=None, measured=c["tutorial_device"], unit="device index", held=c["exists"],
            why=f"rank {c['rank']} of a {c['nnodes']} x {c['gpus_per_node']} job picks device "
                f"{c['tutorial_device']} on a node of {c['gpus_per_node']} GPUs; its own GPU is "
                f"local rank {c['right_device']}")


def _sharding_mistake(r: LessonRun, results: Sequence[Mapping[str, Any]], k: int) -> None:
    c = results[0]["check"]
    # Not a check: AdamW divides each gradient by its own running size, so an element whose
    # gradient is ~0 may step either way on the two runs; the losses and gradients are checked.
    r.finding(f"After {c['steps']} AdamW steps the parameters' updates on {k} GPUs differ from "
              f"one GPU's by at most {c['update_diff']:.2g} of each parameter's largest update "
              f"(elements whose gradient is about 0 may step either way)",
              value=c["update_diff"], unit="relative")
    r.finding(sharding_text(c["rows_per_rank"], k, c["same_rows_vs_local"],
                            c["same_rows_vs_global"]),
              value=rows_seen(c["rows_per_rank"], k, False), unit="rows per step")


def _inference_mistake(r: LessonRun, ms: dict, k: int, b: int) -> None:
    for impl, head in (("cudalab", ""), ("torch", "torch ")):
        bare, wrapped = ms.get((f"{head}forward", b)), ms.get((f"{head}ddp forward", b))
        if bare is None or wrapped is None:
            continue
        r.finding(inference_text(impl, bare.median, wrapped.median, k, b),
                  value=(wrapped.median - bare.median) * 1e6, unit="us",
                  labels=(bare.label, wrapped.label))


def _dp_findings(r: LessonRun, found: dict, dp: dict | None, batches: Sequence[int],
                 k: int) -> None:
    if dp is None:
        return
    for b in batches:
        m = dp["times"][(k, b)]
        best = _best_ddp(found[k], b)
        t = dp["traffic"][(k, b)]
        text = (f"DataParallel on {k} GPUs, per-GPU batch {b}: {k * b / m.median:.0f} samples/s, "
                f"{k * b / m.median / (b / dp['times'][(1, b)].median):.2f}x one GPU in the same "
                f"process; each step moves {t['total'] / MIB:.0f} MiB between GPUs (weights "
                f"{t['replicate'] / MIB:.0f}, batch and logits "
                f"{(t['scatter'] + t['gather']) / MIB:.0f}, "
                f"gradients {t['reduce'] / MIB:.0f})")
        labels = [m.label]
        if best is not None:
            text += f"; DDP ({best[0]} gradients) is {m.median / best[1].median:.2f}x as fast"
            labels.append(best[1].label)
        r.finding(text, value=k * b / m.median, unit="samples/s", labels=tuple(labels))


def _claims(r: LessonRun, found: dict, comm: dict, batches: Sequence[int], dp: dict | None,
            k: int) -> None:
    big, small = max(batches), min(batches)
    if dp is not None:
        split = dp["split"][(k, big)]
        sizes = [stop - start for start, stop in split]
        even = len(split) == k and len(set(sizes)) == 1 and split[-1][1] == k * big
        m, one = dp["times"][(k, big)], dp["times"][(1, big)]
        eff = M.scaling_efficiency(k * big / m.median, big / one.median, k)
        r.claim("DataParallel splits the batch across the GPUs automatically", tutorial=None,
                measured=len(split), unit="pieces", held=even,
                why=f"a batch of {k * big} rows went out as {sizes} on {k} GPUs; what it costs: "
                    f"scaling efficiency {eff:.2f}")
        best = _best_ddp(found[k], big)
        if best is not None:
            ratio = m.median / best[1].median
            r.claim("DistributedDataParallel is preferred over DataParallel (it is faster)",
                    tutorial=None, measured=ratio, unit="x", held=ratio >= DDP_PREFERRED,
                    why=f"{k} GPUs, batch {big} per GPU: DDP {ratio:.2f}x DataParallel's "
                        f"throughput; holds from {DDP_PREFERRED}x")
    hidden = []
    for wire in GRAD_DTYPES:
        step, c, compute = (found[k].get((f"ddp {wire}", big)), comm[k].get(wire),
                            found[k].get(("plain", big)))
        if step is not None and c is not None and compute is not None:
            hidden.append((hidden_fraction(compute.median, c.median, step.median), wire))
    if hidden:
        h, wire = max(hidden)
        r.claim("DDP overlaps the gradient all-reduce with the backward pass", tutorial=None,
                measured=h, unit="fraction hidden", held=h >= OVERLAP_HIDES,
                why=f"{100 * h:.0f}% of the {wire} all-reduce hidden at batch {big} on {k} GPUs; "
                    f"holds from {100 * OVERLAP_HIDES:.0f}%")
    if k == 2:
        targets = [(big, LARGE_BATCH_TARGET, "large")]
        if small != big:
            targets.append((small, SMALL_BATCH_TARGET, "small"))
        for b, target, key in targets:
            best = _best_ddp(found[2], b)
            if best is None:
                continue
            speedup = found[1][("plain", b)].median / best[1].median * 2
            r.claim(f"DDP on 2 GPUs trains at >= {target}x one GPU's rate at a per-GPU batch "
                    f"of {b} (issue 20's target)", tutorial=TORCH_H200[key], measured=speedup,
                    unit="x", held=speedup >= target,
                    why=f"{speedup:.2f}x with {_variant_text(best[0])}; torch DDP measured "
                        f"{TORCH_H200[key]}x for the same model on 2 H200s (tutorial column)")


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = [x for x in result.rows if x["samples_per_s"]]
    ones = {(x["impl"], x["batch_per_gpu"]): x["samples_per_s"] for x in rows
            if x["part"] == "ddp" and x["gpus"] == 1}
    lines = sorted({(x["impl"], x["part"], x["grads"], x["batch_per_gpu"]) for x in rows
                    if x["part"] in ("ddp", "dataparallel") and x["gpus"] > 1})
    for impl, part, grads, b in lines:
        pts = sorted((x["gpus"], x["samples_per_s"]) for x in rows
                     if (x["impl"], x["part"], x["grads"], x["batch_per_gpu"]) ==
                     (impl, part, grads, b))
        if part == "ddp" and (impl, b) in ones:
            pts.insert(0, (1, ones[(impl, b)]))
        name = "DataParallel" if part == "dataparallel" else f"DDP {grads} grads"
        ax.plot([q[0] for q in pts], [q[1] for q in pts], "o-" if impl == "cudalab" else "s--",
                label=f"{impl} {name} b{b}", alpha=0.85)
    for (impl, b), rate in ones.items():
        if not lines:
            ax.plot([1], [rate], "o" if impl == "cudalab" else "s", label=f"{impl} 1 GPU b{b}")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples per second")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=6, ncol=2)
