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
  only, in matmuls and cuDNN (off for fp32, torch's settings restored
  after); cuDNN autotuning is on; eval mode and ``torch.no_grad()``;
* ``torch compile <mode>``: the channels_last model compiled by
  ``torch.compile(mode=..., dynamic=False)`` in each of `--compile-modes`
  (default: default and max-autotune), at the batches of
  `--compile-batches` (default: the largest). Each (mode, precision, batch)
  compiles once, on a fresh dynamo cache (`torch_twin.compiling`), and its
  row gives ``compile_s``: the wall clock of compiling and the first calls
  less what those calls take warm (`torch_twin.compile_ready`), so tracing,
  code generation and, in max-autotune, autotuning (benchmarking every
  GEMM/conv choice: minutes) are in it; ``fx_cache`` says whether
  inductor's on-disk FX graph cache was warm (no compiling, no autotuning),
  cold or partly warm, where torch's counters tell; its logits are compared
  with torch channels_last's (``max_rel_err_vs_torch_channels_last``).

Times are CUDA events around back-to-back forwards with no spin-kernel hold
(`Timer(..., hold=False)`), so a forward the host issues slower than the GPU
runs it is timed at the host's pace, as a serving loop sees it. Every row
gives images/s and the convolutions' and fc's useful TFLOP/s
(``model.gemm_flops(batch)``) as % of the measured GEMM ceiling of its
precision. cudalab rows get ``vs_torch`` (torch's fastest uncompiled mode's
time over ours: above 1, cudalab is faster) and ``vs_torch_channels_last``;
``cudalab graph`` rows get ``vs_compile_<mode>`` (torch.compile's time in that
mode over ours, "-" replaced by "_").

The issue's targets are evaluated in the output (`evaluate_targets`): fp16
batch 1 with a CUDA graph <= 0.5 ms; fp32 batch 1 eager <= 1.5 ms; fp16 and
bf16 batch 128 >= 1.2x torch eager channels_last images/s.

Module API for the benchmark driver: run(quick: bool) -> list[dict] (rows of
benchlib.row; quick compiles nothing unless asked). Run as a script to
measure and write benchmarks/results/resnet_<device>[_quick][_<subset>].json
and .txt (a subset of precisions or batches gets its own name, so it never
overwrites the full run's file):
python benchmarks/bench_resnet.py [--quick] [--precisions fp16,bf16,...]
    [--batches 1,128] [--compile-modes default,max-autotune|none]
    [--compile-batches 128] [--outdir DIR]
Progress of the compiles (max-autotune takes minutes) goes to stderr.
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

from cudalab.models import torch_twin as TW  # noqa: E402  (torch is imported only when run)

BATCHES = (1, 8, 32, 128)
QUICK_BATCHES = (1, 8)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
SEED = 0
OP = "resnet50"
# torch.compile's modes the bench may run, and those it runs unless told
# (quick: none, since compiling ResNet-50 takes tens of seconds, max-autotune minutes).
COMPILE_MODES = TW.COMPILE_MODES
DEFAULT_COMPILE_MODES = ("default", "max-autotune")
# Short column names of the cudalab graph / torch.compile ratios.
COMPILE_COLUMN = {"default": "vs c.def", "reduce-overhead": "vs c.ro", "max-autotune": "vs c.max"}
# Compiled logits vs torch channels_last's at the same batch, relative to the largest
# |logit|: each is within the inference lesson's tolerance of the float32 reference.
COMPILED_TOLERANCE_FACTOR = 2

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


# ---- settings (pure, tested on the CPU) ------------------------------------------------------


def parse_compile_modes(text: str) -> tuple[str, ...]:
    """parse_compile_modes("default,max-autotune") -> ("default", "max-autotune");
    "none" -> (). Order kept, repeats dropped; ValueError names a mode torch.compile lacks."""
    items = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    if items == ["none"]:
        return ()
    if not items:
        raise ValueError("compile modes: expected a comma list of modes, or none")
    bad = [t for t in items if t not in COMPILE_MODES]
    if bad:
        raise ValueError(f"compile modes: unknown mode {bad[0]!r}; expected some of "
                         f"{', '.join(COMPILE_MODES)}, or none")
    return tuple(dict.fromkeys(items))


def settings(quick: bool, precisions: Sequence[str] | None = None,
             batches: Sequence[int] | None = None, compile_modes: Sequence[str] | None = None,
             compile_batches: Sequence[int] | None = None) -> dict[str, tuple]:
    """The run's precisions, batches, compile modes and compile batches, defaults filled in
    (None: all precisions; BATCHES or QUICK_BATCHES; DEFAULT_COMPILE_MODES, none when quick;
    the largest batch) and checked (compile batches among the batches)."""
    from cudalab.lessons import resnet as R

    precs = PRECISIONS if precisions is None else R.check_precisions(precisions, "precisions")
    bs = (QUICK_BATCHES if quick else BATCHES) if batches is None else \
        R.check_batch_sizes(batches, "batches")
    if compile_modes is None:
        modes = () if quick else DEFAULT_COMPILE_MODES
    else:
        modes = parse_compile_modes(",".join(compile_modes) or "none")
    cbs = (max(bs),) if compile_batches is None else \
        R.check_batch_sizes(compile_batches, "compile batches")
    missing = [b for b in cbs if b not in bs]
    if missing:
        raise ValueError(f"compile batches must be among the batches {bs} (the uncompiled "
                         f"rows they are compared with), got {missing}")
    return {"precisions": tuple(precs), "batches": tuple(bs), "compile_modes": modes,
            "compile_batches": tuple(cbs) if modes else ()}


def compiled_impl(mode: str) -> str:
    """The impl of a torch.compile row: 'torch compile max-autotune'."""
    return f"torch compile {mode}"


def compile_key(mode: str) -> str:
    """The cudalab graph row's ratio to a torch.compile mode: 'vs_compile_max_autotune'."""
    return "vs_compile_" + mode.replace("-", "_")


def stem(device: str, quick: bool, cfg: dict[str, tuple]) -> str:
    """The results files' name: resnet_<device>[_quick], plus the precisions and batches
    when they are not the default set (resnet_NVIDIA_H200_fp16-bf16_b128)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_")
    out = f"resnet_{slug}{'_quick' if quick else ''}"
    default = settings(quick)
    if (cfg["precisions"], cfg["batches"]) != (default["precisions"], default["batches"]):
        out += f"_{'-'.join(cfg['precisions'])}_b{'-'.join(map(str, cfg['batches']))}"
    return out


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
    """On cudalab rows: vs_torch (torch's fastest uncompiled mode's time / ours, as before
    torch.compile had columns) and vs_torch_channels_last; on cudalab graph rows,
    vs_compile_<mode> (that torch.compile mode's time / ours) per compiled mode."""
    for r in rows:
        if not r["impl"].startswith("cudalab"):
            continue
        theirs = [t for t in rows if t["impl"].startswith("torch")
                  and not t["impl"].startswith("torch compile ")
                  and (t["precision"], t["batch"]) == (r["precision"], r["batch"])]
        if theirs:
            r["vs_torch"] = min(t["median_ms"] for t in theirs) / r["median_ms"]
        cl = _find(rows, r["precision"], r["batch"], "torch channels_last")
        if cl is not None:
            r["vs_torch_channels_last"] = cl["median_ms"] / r["median_ms"]
        if r["impl"] != "cudalab graph":
            continue
        for mode in COMPILE_MODES:
            c = _find(rows, r["precision"], r["batch"], compiled_impl(mode))
            if c is not None:
                r[compile_key(mode)] = c["median_ms"] / r["median_ms"]


def compile_text(rows: Sequence[dict]) -> str:
    """One line per torch.compile row: its time, what getting ready cost, the FX graph
    cache's state, and cudalab graph's time over it ("" without compile rows)."""
    lines = []
    for c in rows:
        if not c["impl"].startswith("torch compile "):
            continue
        mode = c["impl"][len("torch compile "):]
        ours = _find(rows, c["precision"], c["batch"], "cudalab graph")
        text = (f"- {c['precision']} batch {c['batch']}, torch.compile {mode}: "
                f"{c['median_ms']:.3f} ms per call after {c['compile_s']:.1f} s of compiling "
                f"(autotuning included; FX graph cache {c.get('fx_cache') or 'state unknown'})")
        if ours is not None:
            ratio = c["median_ms"] / ours["median_ms"]
            text += (f"; cudalab graph {ours['median_ms']:.3f} ms: "
                     + (f"cudalab {ratio:.2f}x faster" if ratio >= 1
                        else f"torch.compile {1 / ratio:.2f}x faster"))
        lines.append(text)
    if not lines:
        return ""
    return ("torch.compile (compile s: the wall clock of compiling and the first "
            "calls, less those calls warm):\n" + "\n".join(lines))


# ---- measuring -----------------------------------------------------------------------------


def _row(m: Any, precision: str, batch: int) -> dict:
    from cudalab.lessons import resnet as R

    return row(m, (batch, 224, 224, 3), R.DTYPE_OF[precision], precision=precision, batch=batch,
               images_per_s=R.images_per_s(batch, m.median),
               pct_gemm_peak=m.percent_of_ceiling)


def _progress(text: str) -> None:
    print(f"bench_resnet: {text}", file=sys.stderr, flush=True)


def _compiled_rows(torch: Any, twin: Any, inputs: dict, precision: str, b: int,
                   modes: Sequence[str], time: Any, failures: list[str]) -> None:
    """torch.compile of the twin in each mode at batch `b`: compiled once per (mode,
    precision, batch) on a fresh dynamo cache, timed like the other rows by `time` (which
    appends the row and returns it); the compile fields filled in after."""
    import numpy as np

    from cudalab.lessons.inference import TOLERANCE

    x_cl = inputs["channels_last"]
    ref = TW.host_copy(twin.call("channels_last", x_cl)())
    tol = COMPILED_TOLERANCE_FACTOR * TOLERANCE[precision]
    for mode in modes:
        impl = compiled_impl(mode)
        _progress(f"{precision} batch {b}: torch.compile mode={mode} (compile time includes "
                  f"autotuning{': minutes on a cold cache' if mode == 'max-autotune' else ''})")
        try:
            with TW.compiling(torch):  # dynamo reset after: the next one compiles afresh
                seconds, first, call, cache = TW.compile_ready(torch, twin, mode, x_cl)
                _progress(f"  ready after {seconds:.1f} s (FX graph cache "
                          f"{cache or 'state unknown'}); timing")
                r = time(call, impl)
                del call
        except Exception as exc:  # a torch without a working inductor/triton here
            first_line = (str(exc).strip().splitlines() or [""])[0][:200]
            failures.append(f"{precision} b{b} torch.compile {mode}: "
                            f"{type(exc).__name__}: {first_line}")
            _progress(f"  failed: {failures[-1]}")
            continue
        err = float(np.abs(first - ref).max() / np.abs(ref).max())
        r.update(compile_s=TW.setup_cost(seconds, TW.FIRST_CALLS, r["median_ms"] / 1e3),
                 compile_wall_s=seconds, fx_cache=cache,
                 max_rel_err_vs_torch_channels_last=err)
        if not err <= tol:
            note = f"logits differ from torch channels_last's by {err:.2e} > {tol:.0e}"
            r["warning"] = f"{r['warning']}; {note}" if r.get("warning") else note


def _precision_rows(cudalab: Any, torch: Any, cpu_module: Any, state: dict, timer: Any,
                    precision: str, batches: Sequence[int], x_h: Any,
                    compile_modes: Sequence[str] = (), compile_batches: Sequence[int] = (),
                    failures: list[str] | None = None) -> list[dict]:
    from cudalab import models
    from cudalab.lessons import resnet as R

    model = models.resnet50(state, precision=precision)
    ceiling = R.CEILING_OF[precision]
    rows = []
    with TW.torch_session(torch, cpu_module, precision) as twin:
        for b in batches:
            x = cudalab.asarray(x_h[:b])
            out = cudalab.empty((b, 1000), dtype="float32")
            flops = model.gemm_flops(b)

            def time(fn: Any, impl: str) -> dict:
                m = timer.measure(fn, flops=flops, ceiling=ceiling, label=f"{OP} b{b}",
                                  sub_label=precision, description=impl)
                rows.append(_row(m, precision, b))
                return rows[-1]

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
                del replay
                if b in compile_batches and compile_modes:
                    _compiled_rows(torch, twin, inputs, precision, b, compile_modes, time,
                                   [] if failures is None else failures)
                del inputs
            model.release(b)
            cudalab.synchronize()
    model.release()
    cudalab.empty_cache()
    return rows


def _fp32_agreement(cudalab: Any, torch: Any, cpu_module: Any, state: dict, x_h: Any) -> dict:
    """fp32 logits of both at batch 1 (TF32 off in torch): max |diff| / max |torch logit|."""
    import numpy as np

    from cudalab import models

    ours = models.resnet50(state, precision="fp32")(cudalab.asarray(x_h[:1])).get()
    with TW.torch_session(torch, cpu_module, "fp32") as twin:
        theirs = twin.call("eager", twin.inputs(x_h[:1])["eager"])().float().cpu().numpy()
    err = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    return {"fp32_b1_max_rel_err_vs_torch": err}


def run(quick: bool = False, extra: dict | None = None,
        cfg: dict[str, tuple] | None = None) -> list[dict]:
    """The rows; `extra` (a dict) receives the fp32 agreement with torch when torch runs,
    and the torch.compile settings and failures; `cfg` is `settings(...)` (default:
    settings(quick))."""
    cfg = settings(quick) if cfg is None else cfg
    require_gpu("bench_resnet")
    import cudalab
    from cudalab import models
    from cudalab.bench import Timer
    from cudalab.lessons import resnet as R

    torch = torch_cuda()
    tv = TW.torchvision_or_none() if torch is not None else None
    batches = cfg["batches"]
    timer = Timer(preset(quick), hold=False)
    state = models.init_weights(seed=SEED)
    x_h = R.images(SEED, max(batches))
    cpu_module = None if tv is None else TW.torch_resnet50(torch, tv, state)
    if cpu_module is not None and extra is not None:
        extra.update(_fp32_agreement(cudalab, torch, cpu_module, state, x_h))
    failures: list[str] = []
    rows: list[dict] = []
    for precision in cfg["precisions"]:
        rows += _precision_rows(cudalab, torch, cpu_module, state, timer, precision, batches,
                                x_h, cfg["compile_modes"], cfg["compile_batches"], failures)
    compare_with_torch(rows)
    if extra is not None and cpu_module is not None and cfg["compile_modes"]:
        extra["torch_compile"] = {
            "modes": list(cfg["compile_modes"]), "batches": list(cfg["compile_batches"]),
            "compile_s": "wall clock of compiling and the first calls less those calls warm: "
                         "tracing, code generation and autotuning (max-autotune) included",
            "failures": failures}
    return rows


# ---- output --------------------------------------------------------------------------------


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    """The rows as text; the torch.compile columns (compile s, and cudalab graph's ratio to
    each mode) only when some row was compiled."""
    modes = [m for m in COMPILE_MODES if any(r["impl"] == compiled_impl(m) for r in rows)]
    width = max([20] + [len(r["impl"]) for r in rows])
    head = (f"{'batch':>5} {'prec':<5} {'impl':<{width}} {'ms':>9} {'IQR':>7} {'images/s':>9} "
            f"{'TFLOP/s':>8} {'% GEMM':>7} {'vs torch':>8} {'vs t.cl':>8}")
    if modes:
        head += f" {'compile s':>9}" + "".join(f" {COMPILE_COLUMN[m]:>8}" for m in modes)
    lines = [head]
    for r in rows:
        line = (f"{r['batch']:>5} {r['precision']:<5} {r['impl']:<{width}} "
                f"{r['median_ms']:>9.4f} {r['iqr_ms']:>7.4f} {r['images_per_s']:>9.0f} "
                f"{_cell(r.get('tflops'), '.1f'):>8} {_cell(r.get('pct_gemm_peak'), '.1f'):>7} "
                f"{_cell(r.get('vs_torch'), '.3f'):>8} "
                f"{_cell(r.get('vs_torch_channels_last'), '.3f'):>8}")
        if modes:
            line += f" {_cell(r.get('compile_s'), '.1f'):>9}" + "".join(
                f" {_cell(r.get(compile_key(m)), '.3f'):>8}" for m in modes)
        lines.append(line + (f"  ({r['warning']})" if r.get("warning") else ""))
    if modes:
        lines.append("vs c.X: torch.compile mode X's time over cudalab graph's (above 1, "
                     "cudalab is faster); compile s: compiling and the first "
                     "calls less those calls warm, autotuning included")
    return "\n".join(lines)


def targets_text(targets: list[dict]) -> str:
    lines = ["Targets:"]
    for t in targets:
        verdict = {True: "held", False: "MISSED", None: "not measured"}[t["held"]]
        value = "-" if t["measured"] is None else f"{t['measured']:.3f} {t['unit']}"
        lines.append(f"- {t['target']}: {value} ({t['impl'] or '-'}): {verdict}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--outdir", type=Path, default=HERE / "results")
    parser.add_argument("--precisions", default=None,
                        help=f"comma list among {', '.join(PRECISIONS)} (default: all)")
    parser.add_argument("--batches", default=None,
                        help=f"comma list of batch sizes (default: "
                             f"{','.join(map(str, BATCHES))}; quick: "
                             f"{','.join(map(str, QUICK_BATCHES))})")
    parser.add_argument("--compile-modes", default=None,
                        help=f"torch.compile modes among {', '.join(COMPILE_MODES)}, or none "
                             f"(default: {','.join(DEFAULT_COMPILE_MODES)}; quick: none)")
    parser.add_argument("--compile-batches", default=None,
                        help="batch sizes to compile at, among --batches (default: the "
                             "largest); each (mode, precision, batch) compiles once")
    return parser


def settings_of(args: argparse.Namespace) -> dict[str, tuple]:
    """`settings` from the command line's arguments (ValueError for bad ones)."""
    from cudalab.lessons import resnet as R

    return settings(
        args.quick,
        None if args.precisions is None else R.parse_precisions(args.precisions),
        None if args.batches is None else R.parse_batch_sizes(args.batches),
        None if args.compile_modes is None else parse_compile_modes(args.compile_modes),
        None if args.compile_batches is None else R.parse_batch_sizes(args.compile_batches))


def command_of(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (for the results file)."""
    words = ["python benchmarks/bench_resnet.py"] + (["--quick"] if args.quick else [])
    for flag in ("precisions", "batches", "compile_modes", "compile_batches"):
        value = getattr(args, flag)
        if value is not None:
            words.append(f"--{flag.replace('_', '-')} {value}")
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = settings_of(args)
    except ValueError as exc:
        parser.error(str(exc))

    import cudalab
    from cudalab.bench import write_results

    extra: dict[str, Any] = {}
    try:
        rows = run(args.quick, extra, cfg)
    except cudalab.NoDeviceError as exc:
        print(exc, file=sys.stderr)
        return 1
    targets = evaluate_targets(rows)
    text = table(rows) + "\n\n" + targets_text(targets)
    compiled = compile_text(rows)
    if compiled:
        text += "\n\n" + compiled
    failures = extra.get("torch_compile", {}).get("failures")
    if failures:
        text += "\n\ntorch.compile failed (no row): " + "; ".join(failures)
    if "fp32_b1_max_rel_err_vs_torch" in extra:
        text += f"\n\nfp32 batch 1 logits vs torch: max rel err " \
                f"{extra['fp32_b1_max_rel_err_vs_torch']:.2e}"
    print(text)
    props = cudalab.get_device_properties(0)
    name = stem(props.name, args.quick, cfg)
    args.outdir.mkdir(parents=True, exist_ok=True)
    path = args.outdir / f"{name}.json"
    write_results(path, "compute_benchmarks", rows, max_times=MAX_TIMES_IN_JSON,
                  command=command_of(args),
                  extra={"preset": preset(args.quick).to_dict(), "targets": targets, **extra})
    (args.outdir / f"{name}.txt").write_text(f"{props.name}\n{text}\n", encoding="utf-8")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
