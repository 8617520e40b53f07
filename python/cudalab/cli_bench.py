"""The measuring commands of the CLI: ``bench matmul|copy|transfer`` and ``ceilings``.

Every figure comes from `cudalab.bench.measure` (CUDA events, warm-up,
median and IQR). PyTorch, when installed with CUDA, is measured in the same
run the same way, on the same default stream, for a side-by-side column
(``--no-torch`` skips it). ``--json PATH`` writes every Measurement with the
device and versions; a progress bar shows on a terminal.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Callable

import numpy as np

from . import _core
from ._progress import ProgressBar
from ._table import format_table
from .bench import CEILING_NAMES, Measurement, ceilings, format_time
from .bench.timer import _measure
from .devices import device as device_context
from .devices import get_device_properties

__all__ = ["add_parsers"]

MATMUL_DTYPES = ("float64", "float32", "tf32", "float16", "bfloat16")


# ---- shared plumbing ----------------------------------------------------------------


def _torch(use: bool):
    """torch with CUDA, or None (not installed, no CUDA, or --no-torch)."""
    if not use:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _measure_options(args: argparse.Namespace) -> dict[str, Any]:
    """--iterations N: exactly N timed repeats; otherwise the noise-based stop."""
    if args.iterations is None:
        return {"min_run_time": args.min_run_time, "warmup": args.warmup}
    return {"min_repeats": args.iterations, "max_repeats": args.iterations,
            "min_run_time": 1e-6, "max_run_time": 1e9, "warmup": args.warmup}


def _run_cases(cases: list[tuple[str, Callable[[], Any], dict[str, Any]]],
               args: argparse.Namespace) -> list[Measurement]:
    """Measure each (step name, fn, measure keywords) with a progress bar."""
    results = []
    with ProgressBar(len(cases), enabled=False if args.no_progress else None) as bar:
        for name, fn, kw in cases:
            bar.step(name)
            options = {**_defaults(), **_measure_options(args), **kw}
            m, _ = _measure(fn, (), progress=bar.update, **options)
            results.append(m)
    return results


def _defaults() -> dict[str, Any]:
    """measure()'s keyword defaults, for the private _measure (which has none)."""
    return {"warmup": 0.25, "max_run_time": None, "min_repeats": 10, "max_repeats": 10_000,
            "noise_threshold": 0.02, "flush_l2": False, "hold": True, "stream": None,
            "flops": None, "bytes": None, "ceiling": None, "label": None,
            "sub_label": None, "description": None, "metadata": None}


def _write_json(path: str | None, command: str, device: int, measurements: list[Measurement],
                extra: dict[str, Any] | None = None) -> None:
    if not path:
        return
    from . import __version__

    props = get_device_properties(device)
    data = {
        "command": command,
        "argv": sys.argv[1:],
        "device": {"index": device, "name": props.name, "compute_capability": [props.major, props.minor],
                   "pci_bus_id": props.pci_bus_id},
        "versions": {"cudalab": __version__, "cuda_runtime": _core.runtime_version(),
                     "cuda_driver": _core.driver_version(), "python": platform.python_version(),
                     "numpy": np.__version__},
        "measurements": [m.to_dict() for m in measurements],
        **(extra or {}),
    }
    torch = _torch(True)
    if torch is not None:
        data["versions"]["torch"] = torch.__version__
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}" if ours and theirs else "-"


def _header(device: int, what: str) -> str:
    return f"{what} on {get_device_properties(device).name} (device {device})"


def _check_device(args: argparse.Namespace, command: str) -> int | None:
    """The device index to use, or None after printing why there is none."""
    if not _core.is_available():
        print(f"cudalab {command}: no CUDA device is available.", file=sys.stderr)
        return None
    count = _core.device_count()
    index = _core.current_device() if args.device is None else args.device
    if not 0 <= index < count:
        print(f"cudalab {command}: no device {index} ({count} available).", file=sys.stderr)
        return None
    return index


# ---- bench matmul -------------------------------------------------------------------


def _cmd_matmul(args: argparse.Namespace) -> int:
    device = _check_device(args, "bench matmul")
    if device is None:
        return 1
    n = args.matrix_size
    dtypes = args.dtype or list(MATMUL_DTYPES)
    torch = _torch(not args.no_torch)
    flops = 2.0 * n * n * n
    props = get_device_properties(device)
    rows, measurements = [], []
    with device_context(device):
        cases = []
        keep = []  # operands stay alive until every case ran
        for dtype in dtypes:
            storage = "float32" if dtype == "tf32" else dtype
            a = _core_random_normal((n, n), storage, 1)
            b = _core_random_normal((n, n), storage, 2)
            out = _core.empty((n, n), dtype=storage)
            precision = {"tf32": "high", "float32": "highest"}.get(dtype)
            keep += [a, b, out]
            meta = {"m": n, "n": n, "k": n, "dtype": dtype}
            cases.append((f"matmul {dtype} cudalab",
                          (lambda a=a, b=b, out=out, p=precision: _core.matmul(a, b, out=out, precision=p)),
                          {"flops": flops, "label": f"matmul {n}", "sub_label": dtype,
                           "description": "cudalab", "metadata": meta,
                           "flush_l2": args.flush_l2}))
            if torch is not None:
                ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
                tout = torch.empty_like(ta)
                keep += [ta, tb, tout]
                cases.append((f"matmul {dtype} torch", _torch_mm(torch, ta, tb, tout, dtype == "tf32"),
                              {"flops": flops, "label": f"matmul {n}", "sub_label": dtype,
                               "description": "torch", "metadata": meta,
                               "flush_l2": args.flush_l2}))
        measurements = _run_cases(cases, args)
    by_key = {(m.sub_label, m.description): m for m in measurements}
    for dtype in dtypes:
        ours = by_key[(dtype, "cudalab")]
        theirs = by_key.get((dtype, "torch"))
        peak = props.peak_flops.get("tfloat32" if dtype == "tf32" else dtype)
        rows.append((
            dtype, format_time(ours.median), f"{ours.relative_iqr:.1%}", f"{ours.tflops:.1f}",
            f"{100 * ours.tflops * 1e12 / peak:.1f}" if peak else "-",
            f"{theirs.tflops:.1f}" if theirs else "-",
            _ratio(ours.tflops, theirs.tflops if theirs else None),
        ))
    print(format_table(
        ("dtype", "median", "IQR/med", "TFLOP/s", "% of theor. peak", "torch TFLOP/s", "x torch"),
        rows, title=_header(device, f"matmul {n} x {n} x {n}")))
    _note(measurements)
    _write_json(args.json, "bench matmul", device, measurements)
    return 0


def _core_random_normal(shape, dtype: str, seed: int):
    from . import random

    return random.normal(shape, dtype=dtype, seed=seed)


def _torch_mm(torch, a, b, out, tf32: bool):
    def run():
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            torch.mm(a, b, out=out)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    return run


def _note(measurements: list[Measurement]) -> None:
    noisy = [m for m in measurements if m.warning]
    for m in noisy:
        print(f"WARNING {m.title}: {m.warning}")
    clocks = next((m.clocks for m in measurements if m.clocks), None)
    if clocks:
        print(f"Clocks after timing: SM {clocks.get('sm_mhz')} MHz, memory {clocks.get('memory_mhz')} MHz")


# ---- bench copy ---------------------------------------------------------------------


def _cmd_copy(args: argparse.Namespace) -> int:
    device = _check_device(args, "bench copy")
    if device is None:
        return 1
    nbytes = args.size_mb << 20
    torch = _torch(not args.no_torch)
    props = get_device_properties(device)
    with device_context(device):
        src = _core.full(nbytes // 4, 1.5, dtype="float32")
        cases = [("copy cudalab", src.copy,
                  {"bytes": 2 * nbytes, "label": "copy", "sub_label": f"{args.size_mb} MiB",
                   "description": "cudalab", "metadata": {"nbytes": nbytes}})]
        if torch is not None:
            tsrc = torch.from_dlpack(src)
            cases.append(("copy torch", tsrc.clone,
                          {"bytes": 2 * nbytes, "label": "copy", "sub_label": f"{args.size_mb} MiB",
                           "description": "torch", "metadata": {"nbytes": nbytes}}))
        measurements = _run_cases(cases, args)
    peak = props.peak_memory_bandwidth
    rows = [(m.description, format_time(m.median), f"{m.relative_iqr:.1%}", f"{m.gbps:.0f}",
             f"{100 * m.gbps * 1e9 / peak:.1f}" if peak else "-") for m in measurements]
    print(format_table(("impl", "median", "IQR/med", "GB/s (read+write)", "% of theor. DRAM"), rows,
                       title=_header(device, f"device-to-device copy of {args.size_mb} MiB")))
    _note(measurements)
    _write_json(args.json, "bench copy", device, measurements)
    return 0


# ---- bench transfer -----------------------------------------------------------------


def _cmd_transfer(args: argparse.Namespace) -> int:
    device = _check_device(args, "bench transfer")
    if device is None:
        return 1
    nbytes = args.size_mb << 20
    count = nbytes // 4
    torch = _torch(not args.no_torch)
    memories = ["pinned"] + (["pageable"] if args.pageable else [])
    cases = []
    with device_context(device):
        dev = _core.full(count, 2.5, dtype="float32")
        for memory in memories:
            host = _core.pinned_empty(count, "float32") if memory == "pinned" else np.empty(count, np.float32)
            host[:] = 1.25
            blocking = memory == "pageable"
            meta = {"nbytes": nbytes, "memory": memory}
            common = {"bytes": nbytes, "label": "transfer", "metadata": meta}
            cases.append((f"h2d {memory} cudalab",
                          (lambda h=host, nb=not blocking: _core.asarray(h, non_blocking=nb)),
                          {**common, "sub_label": f"h2d {memory}", "description": "cudalab"}))
            cases.append((f"d2h {memory} cudalab",
                          (lambda h=host, nb=not blocking: dev.get(out=h, non_blocking=nb)),
                          {**common, "sub_label": f"d2h {memory}", "description": "cudalab"}))
            if torch is not None:
                th = torch.from_numpy(host)
                td = torch.empty(count, dtype=torch.float32, device=f"cuda:{device}")
                cases.append((f"h2d {memory} torch",
                              (lambda th=th, td=td, nb=not blocking: td.copy_(th, non_blocking=nb)),
                              {**common, "sub_label": f"h2d {memory}", "description": "torch"}))
                cases.append((f"d2h {memory} torch",
                              (lambda th=th, td=td, nb=not blocking: th.copy_(td, non_blocking=nb)),
                              {**common, "sub_label": f"d2h {memory}", "description": "torch"}))
        measurements = _run_cases(cases, args)
    by_key = {(m.sub_label, m.description): m for m in measurements}
    rows = []
    for memory in memories:
        for direction in ("h2d", "d2h"):
            ours = by_key[(f"{direction} {memory}", "cudalab")]
            theirs = by_key.get((f"{direction} {memory}", "torch"))
            rows.append((f"{direction} {memory}", format_time(ours.median), f"{ours.gbps:.1f}",
                         f"{theirs.gbps:.1f}" if theirs else "-",
                         _ratio(ours.gbps, theirs.gbps if theirs else None)))
    print(format_table(("transfer", "median", "GB/s", "torch GB/s", "x torch"), rows,
                       title=_header(device, f"host <-> device copies of {args.size_mb} MiB")))
    _note(measurements)
    _write_json(args.json, "bench transfer", device, measurements)
    return 0


# ---- ceilings -----------------------------------------------------------------------


def _cmd_ceilings(args: argparse.Namespace) -> int:
    device = _check_device(args, "ceilings")
    if device is None:
        return 1
    names = args.only or list(CEILING_NAMES)
    with ProgressBar(len(names), enabled=False if args.no_progress else None) as bar:
        def progress(done: int, total: int, name: str) -> None:
            if done < total:
                bar.step(f"ceiling {name}")
        result = ceilings(device, names=names, progress=progress)
    print(result.table())
    if args.json:
        _write_json(args.json, "ceilings", device, [c.measurement for c in result.values()],
                    extra={"ceilings": result.to_dict()["ceilings"]})
    return 0


# ---- argument parsing ---------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", type=int, default=None, help="device index (default: current)")
    common.add_argument("--json", metavar="PATH", help="also write every measurement as JSON to PATH")
    common.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    return common


def _timing(torch_too: bool = True) -> argparse.ArgumentParser:
    timing = argparse.ArgumentParser(add_help=False)
    timing.add_argument("--iterations", type=_positive_int, default=None, metavar="N",
                        help="exactly N timed repeats (default: repeat until IQR/median <= 2%% "
                             "after --min-run-time, within a time budget)")
    timing.add_argument("--warmup", type=_positive_float, default=0.25, metavar="SECONDS",
                        help="seconds of warm-up calls before timing (default 0.25: long enough "
                             "for a power-capped GPU's clock to settle under load)")
    timing.add_argument("--min-run-time", type=_positive_float, default=0.2, metavar="SECONDS",
                        help="seconds of timed repeats before stopping (default 0.2)")
    if torch_too:
        timing.add_argument("--no-torch", action="store_true",
                            help="skip the PyTorch column (it runs when torch with CUDA is installed)")
    return timing


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` (with matmul, copy, transfer) and ``ceilings`` to the CLI."""
    common, timing = _common(), _timing()
    bench = sub.add_parser(
        "bench", help="time one operation (matmul, copy, transfer)",
        description="Time an operation with CUDA events (warm-up, median and IQR), beside "
                    "PyTorch when it is installed.")
    kinds = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)

    matmul = kinds.add_parser(
        "matmul", parents=[common, timing], help="n x n x n GEMM per dtype (cuBLASLt / cuBLAS)",
        description="Square GEMM through cudalab.matmul into a preallocated output, on random "
                    "normal operands; TFLOP/s = 2 n^3 / median time, against the theoretical "
                    "peak of the device.")
    matmul.add_argument("--matrix-size", type=_positive_int, default=8192, metavar="N",
                        help="n (default 8192)")
    matmul.add_argument("--dtype", action="append", choices=MATMUL_DTYPES,
                        help="dtype to run (repeatable; default: all of them). tf32 is float32 "
                             "storage with TF32 tensor-core math")
    matmul.add_argument("--flush-l2", action="store_true", help="flush L2 before every call")
    matmul.set_defaults(func=_cmd_matmul)

    copy = kinds.add_parser(
        "copy", parents=[common, timing], help="device-to-device copy bandwidth",
        description="Copy a contiguous device buffer (DeviceArray.copy; torch's clone); GB/s "
                    "counts bytes read + written.")
    copy.add_argument("--size-mb", type=_positive_int, default=1024, metavar="MIB",
                      help="buffer size in MiB (default 1024)")
    copy.set_defaults(func=_cmd_copy)

    transfer = kinds.add_parser(
        "transfer", parents=[common, timing], help="host <-> device bandwidth, pinned (and pageable)",
        description="Copy between host and device memory in both directions: pinned memory "
                    "with non_blocking copies, and with --pageable also ordinary NumPy memory.")
    transfer.add_argument("--size-mb", type=_positive_int, default=256, metavar="MIB",
                          help="transfer size in MiB (default 256)")
    transfer.add_argument("--pageable", action="store_true", help="also time pageable memory")
    transfer.set_defaults(func=_cmd_transfer)

    ceiling_parser = sub.add_parser(
        "ceilings", parents=[common], help="measure what this GPU does at best",
        description="Measure the ceilings lessons are placed against: device copy bandwidth, "
                    "pinned host<->device bandwidth, empty-kernel launch cost and GEMM peak per "
                    "dtype, beside the theoretical peaks.")
    ceiling_parser.add_argument("--only", action="append", choices=CEILING_NAMES, metavar="NAME",
                                help=f"measure only NAME (repeatable): {', '.join(CEILING_NAMES)}")
    ceiling_parser.set_defaults(func=_cmd_ceilings)
