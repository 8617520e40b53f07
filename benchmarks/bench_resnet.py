"""Benchmark: ResNet-50 inference, cudalab beside torchvision, per batch size and precision.

One set of weights (torchvision's initialisation drawn by
``cudalab.models.init_weights``), copied into torchvision's ``resnet50()``
through its state_dict, so both sides compute the same function. For each
precision (fp32, tf32, fp16, bf16) and batch size (1, 8, 32, 128; quick: 1,
8), on random normalised 224 x 224 images:

* ``cudalab``: ``model.forward(x, out=...)``, one C call per forward, NHWC;
* ``cudalab graph``: ``model.capture(batch).replay()``;
* ``torch``: torchvision eager, NCHW; ``torch channels_last``: the model and
  input in channels_last; ``torch graph``: the channels_last forward
  captured in a ``torch.cuda.CUDAGraph``. fp16 and bf16 convert the whole
  model (``module.to(dtype)``, as ``model.half()``); TF32 is on for tf32
  only, in matmuls and cuDNN; cuDNN autotuning is on; ``torch.no_grad()``.

Times are CUDA events around back-to-back forwards with no spin-kernel hold
(`Timer(..., hold=False)`), so a forward the host issues slower than the GPU
runs it is timed at the host's pace, as a serving loop sees it. Every row
gives images/s and the convolutions' and fc's useful TFLOP/s
(``model.gemm_flops(batch)``) as % of the measured GEMM ceiling of its
precision. cudalab rows get ``vs_torch`` (torch's fastest mode's time over
ours: above 1, cudalab is faster) and ``vs_torch_channels_last``.

The issue's targets are evaluated in the output (`evaluate_targets`): fp16
batch 1 with a CUDA graph <= 0.5 ms; fp32 batch 1 eager <= 1.5 ms; fp16 and
bf16 batch 128 >= 1.2x torch eager channels_last images/s.

Module API for the benchmark driver: run(quick: bool) -> list[dict] (rows of
benchlib.row). Run as a script to measure and write
benchmarks/results/resnet_<device>[_quick].json and .txt:
python benchmarks/bench_resnet.py [--quick] [--outdir DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import MAX_TIMES_IN_JSON, preset, require_gpu, row, torch_cuda  # noqa: E402

BATCHES = (1, 8, 32, 128)
QUICK_BATCHES = (1, 8)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
SEED = 0
OP = "resnet50"

# (name, precision, batch, impl, bound): a time bound in ms, or a speed-up over
# torch channels_last (images/s ratio) that cudalab's fastest mode must reach.
TARGETS = (
    ("fp16 batch 1 with a CUDA graph <= 0.5 ms", "fp16", 1, "cudalab graph", ("max_ms", 0.5)),
    ("fp32 batch 1 eager <= 1.5 ms", "fp32", 1, "cudalab", ("max_ms", 1.5)),
    ("fp16 batch 128 >= 1.2x torch channels_last images/s", "fp16", 128, "cudalab best",
     ("min_vs_torch_channels_last", 1.2)),
    ("bf16 batch 128 >= 1.2x torch channels_last images/s", "bf16", 128, "cudalab best",
     ("min_vs_torch_channels_last", 1.2)),
)


# ---- targets (pure, tested on the CPU) -------------------------------------------------------


def _find(rows: Sequence[dict], precision: str, batch: int, impl: str) -> dict | None:
    for r in rows:
        if (r.get("precision"), r.get("batch"), r["impl"]) == (precision, batch, impl):
            return r
    return None


def _best_ours(rows: Sequence[dict], precision: str, batch: int) -> dict | None:
    mine = [r for r in rows if (r.get("precision"), r.get("batch")) == (precision, batch)
            and r["impl"].startswith("cudalab")]
    return min(mine, key=lambda r: r["median_ms"]) if mine else None


def evaluate_targets(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """evaluate_targets(rows) -> list of dict

    Each target with the measured value, its bound and whether it held;
    ``held`` is None (and ``measured`` None) when the rows lack what it needs
    (a quick run without batch 128, or no torch).
    """
    out = []
    for name, prec, batch, impl, (kind, bound) in TARGETS:
        ours = _best_ours(rows, prec, batch) if impl == "cudalab best" else \
            _find(rows, prec, batch, impl)
        measured = held = None
        if ours is not None and kind == "max_ms":
            measured = ours["median_ms"]
            held = measured <= bound
        elif ours is not None:
            theirs = _find(rows, prec, batch, "torch channels_last")
            if theirs is not None:
                measured = theirs["median_ms"] / ours["median_ms"]
                held = measured >= bound
        out.append({"target": name, "measured": measured, "bound": bound,
                    "unit": "ms" if kind == "max_ms" else "x", "held": held,
                    "impl": None if ours is None else ours["impl"]})
    return out


def compare_with_torch(rows: list[dict]) -> None:
    """vs_torch (torch's fastest mode's time / ours) and vs_torch_channels_last on cudalab rows."""
    for r in rows:
        if not r["impl"].startswith("cudalab"):
            continue
        theirs = [t for t in rows if t["impl"].startswith("torch")
                  and (t["precision"], t["batch"]) == (r["precision"], r["batch"])]
        if theirs:
            r["vs_torch"] = min(t["median_ms"] for t in theirs) / r["median_ms"]
        cl = _find(rows, r["precision"], r["batch"], "torch channels_last")
        if cl is not None:
            r["vs_torch_channels_last"] = cl["median_ms"] / r["median_ms"]


# ---- measuring -----------------------------------------------------------------------------


def _row(m: Any, precision: str, batch: int) -> dict:
    from cudalab.lessons import resnet as R

    return row(m, (batch, 224, 224, 3), R.DTYPE_OF[precision], precision=precision, batch=batch,
               images_per_s=R.images_per_s(batch, m.median),
               pct_gemm_peak=m.percent_of_ceiling)


def _precision_rows(cudalab: Any, torch: Any, cpu_module: Any, state: dict, timer: Any,
                    precision: str, batches: Sequence[int], x_h: Any) -> list[dict]:
    from cudalab import models
    from cudalab.lessons import resnet as R
    from cudalab.models import torch_twin as TW

    model = models.resnet50(state, precision=precision)
    ceiling = R.CEILING_OF[precision]
    rows = []
    with TW.torch_session(torch, cpu_module, precision) as twin:
        for b in batches:
            x = cudalab.asarray(x_h[:b])
            out = cudalab.empty((b, 1000), dtype="float32")
            flops = model.gemm_flops(b)

            def time(fn: Any, impl: str) -> None:
                m = timer.measure(fn, flops=flops, ceiling=ceiling, label=f"{OP} b{b}",
                                  sub_label=precision, description=impl)
                rows.append(_row(m, precision, b))

            time(lambda: model.forward(x, out=out), "cudalab")
            g = model.capture(b)
            g(x)
            time(g.replay, "cudalab graph")
            del g
            if twin is not None:
                inputs = twin.inputs(x_h[:b])
                time(twin.call("eager", inputs["eager"]), "torch")
                time(twin.call("channels_last", inputs["channels_last"]), "torch channels_last")
                replay, _ = twin.graph(inputs["channels_last"])
                time(replay, "torch graph")
                del replay, inputs
            model.release(b)
            cudalab.synchronize()
    model.release()
    cudalab.empty_cache()
    return rows


def _fp32_agreement(cudalab: Any, torch: Any, cpu_module: Any, state: dict, x_h: Any) -> dict:
    """fp32 logits of both at batch 1 (TF32 off in torch): max |diff| / max |torch logit|."""
    import numpy as np

    from cudalab import models
    from cudalab.models import torch_twin as TW

    ours = models.resnet50(state, precision="fp32")(cudalab.asarray(x_h[:1])).get()
    with TW.torch_session(torch, cpu_module, "fp32") as twin:
        theirs = twin.call("eager", twin.inputs(x_h[:1])["eager"])().float().cpu().numpy()
    err = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    return {"fp32_b1_max_rel_err_vs_torch": err}


def run(quick: bool = False, extra: dict | None = None) -> list[dict]:
    """The rows; `extra` (a dict) receives the fp32 agreement with torch when torch runs."""
    require_gpu("bench_resnet")
    import cudalab
    from cudalab import models
    from cudalab.bench import Timer
    from cudalab.lessons import resnet as R
    from cudalab.models import torch_twin as TW

    torch = torch_cuda()
    tv = TW.torchvision_or_none() if torch is not None else None
    batches = QUICK_BATCHES if quick else BATCHES
    timer = Timer(preset(quick), hold=False)
    state = models.init_weights(seed=SEED)
    x_h = R.images(SEED, max(batches))
    cpu_module = None if tv is None else TW.torch_resnet50(torch, tv, state)
    if cpu_module is not None and extra is not None:
        extra.update(_fp32_agreement(cudalab, torch, cpu_module, state, x_h))
    rows: list[dict] = []
    for precision in PRECISIONS:
        rows += _precision_rows(cudalab, torch, cpu_module, state, timer, precision, batches,
                                x_h)
    compare_with_torch(rows)
    return rows


# ---- output --------------------------------------------------------------------------------


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    lines = [f"{'batch':>5} {'prec':<5} {'impl':<20} {'ms':>9} {'IQR':>7} {'images/s':>9} "
             f"{'TFLOP/s':>8} {'% GEMM':>7} {'vs torch':>8} {'vs t.cl':>8}"]
    for r in rows:
        lines.append(
            f"{r['batch']:>5} {r['precision']:<5} {r['impl']:<20} {r['median_ms']:>9.4f} "
            f"{r['iqr_ms']:>7.4f} {r['images_per_s']:>9.0f} {_cell(r.get('tflops'), '.1f'):>8} "
            f"{_cell(r.get('pct_gemm_peak'), '.1f'):>7} {_cell(r.get('vs_torch'), '.3f'):>8} "
            f"{_cell(r.get('vs_torch_channels_last'), '.3f'):>8}"
            + (f"  ({r['warning']})" if r.get("warning") else ""))
    return "\n".join(lines)


def targets_text(targets: list[dict]) -> str:
    lines = ["Targets:"]
    for t in targets:
        verdict = {True: "held", False: "MISSED", None: "not measured"}[t["held"]]
        value = "-" if t["measured"] is None else f"{t['measured']:.3f} {t['unit']}"
        lines.append(f"- {t['target']}: {value} ({t['impl'] or '-'}): {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--outdir", type=Path, default=HERE / "results")
    args = parser.parse_args()

    import cudalab
    from cudalab.bench import write_results

    extra: dict[str, Any] = {}
    try:
        rows = run(args.quick, extra)
    except cudalab.NoDeviceError as exc:
        print(exc, file=sys.stderr)
        return 1
    targets = evaluate_targets(rows)
    text = table(rows) + "\n\n" + targets_text(targets)
    if extra:
        text += f"\n\nfp32 batch 1 logits vs torch: max rel err " \
                f"{extra['fp32_b1_max_rel_err_vs_torch']:.2e}"
    print(text)
    props = cudalab.get_device_properties(0)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    stem = f"resnet_{slug}{'_quick' if args.quick else ''}"
    args.outdir.mkdir(parents=True, exist_ok=True)
    path = args.outdir / f"{stem}.json"
    write_results(path, "compute_benchmarks", rows, max_times=MAX_TIMES_IN_JSON,
                  command="python benchmarks/bench_resnet.py" + (" --quick" if args.quick else ""),
                  extra={"preset": preset(args.quick).to_dict(), "targets": targets, **extra})
    (args.outdir / f"{stem}.txt").write_text(f"{props.name}\n{text}\n", encoding="utf-8")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
