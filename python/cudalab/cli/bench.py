"""The measuring commands of the CLI: ``bench matmul|copy|transfer`` and ``ceilings``.

Every figure comes from `cudalab.bench` (CUDA events, warm-up, median and
IQR) with a named preset (``--preset``, default "sustained"), on the
benchmark cases of `cudalab.bench.cases`. PyTorch, when installed with CUDA,
is measured in the same run the same way, on the same data and the same
default stream, for a side-by-side column (``--no-torch`` skips it).
``--json PATH`` writes a `cudalab.bench.results` file; a progress bar shows
on a terminal.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence

from .._progress import ProgressBar
from .._table import format_table
from ..bench import (CEILING_NAMES, MATMUL_DTYPES, PRESETS, Case, CopyCase, MatmulCase,
                     Measurement, Row, Timer, TransferCase, ceilings, format_time, write_results)
from ..bench.cases import HOST_MEMORIES, MIB, TRANSFER_DIRECTIONS, torch_cuda
from ..devices import device as device_context
from ..devices import get_device_properties
from .args import ChoiceList, common_parser, positive_float, positive_int, several
# The device check under this module's own name: each command module looks it up
# here, so a test can stand in a device for one command group.
from .args import check_device as _check_device

__all__ = ["add_parsers"]


# ---- shared plumbing ----------------------------------------------------------------


def _torch(use: bool):
    """torch with CUDA, or None (not installed, no CUDA, or --no-torch)."""
    return torch_cuda() if use else None


def _timer(args: argparse.Namespace, progress: Callable[[float], None]) -> Timer:
    """The preset with --warmup / --min-run-time; --iterations N: exactly N timed repeats."""
    overrides: dict[str, Any] = {"warmup": args.warmup, "min_run_time": args.min_run_time,
                                 "flush_l2": True if getattr(args, "flush_l2", False) else None}
    if args.iterations is not None:
        overrides.update(min_repeats=args.iterations, max_repeats=args.iterations,
                         min_run_time=1e-6, max_run_time=1e9)
    return Timer(args.preset, progress=progress, **overrides)


def _write_json(args: argparse.Namespace, command: str, rows: Sequence[Measurement | Row]) -> None:
    if args.json:
        write_results(args.json, command, rows, command=" ".join(["cudalab", *args.argv]))


def _note(measurements: list[Measurement]) -> None:
    for m in measurements:
        if m.warning:
            print(f"WARNING {m.title}: {m.warning}")
    clocks = next((m.clocks for m in measurements if m.clocks), None)
    if clocks:
        print(f"Clocks after timing: SM {clocks.get('sm_mhz')} MHz, memory {clocks.get('memory_mhz')} MHz")


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}" if ours and theirs else "-"


def _title(device: int, what: str) -> str:
    return f"{what} on {get_device_properties(device).name} (device {device})"


def _measure_cases(cases: list[Case], args: argparse.Namespace) -> list[Measurement]:
    """Each case through cudalab, then (when torch runs) through torch, on the same data."""
    torch = _torch(not args.no_torch)
    impls = ["cudalab"] + (["torch"] if torch is not None else [])
    results = []
    with ProgressBar(len(cases) * len(impls), enabled=False if args.no_progress else None) as bar:
        timer = _timer(args, bar.update)
        for case in cases:
            prepared = case.prepare()  # one case's operands at a time
            for impl in impls:
                bar.step(f"{case.name} {impl}")
                work = prepared if impl == "cudalab" else prepared.torch_twin(torch)
                results.append(work.measure(timer, description=impl))
            del prepared
    return results


def _run_bench(args: argparse.Namespace, command: str, cases: Callable[[], list[Case]],
               table: Callable[[dict[tuple, Measurement], int], str]) -> int:
    """The shape of every ``bench`` command: device, cases, table, notes, JSON."""
    device = _check_device(args, command)
    if device is None:
        return 1
    with device_context(device):
        measurements = _measure_cases(cases(), args)
    by_key = {(m.label, m.sub_label, m.description): m for m in measurements}
    print(table(by_key, device))
    _note(measurements)
    _write_json(args, command, measurements)
    return 0


# ---- bench matmul, copy, transfer -----------------------------------------------------


def _cmd_matmul(args: argparse.Namespace) -> int:
    n = args.matrix_size
    cases = [MatmulCase(dtype, n) for dtype in args.dtype or MATMUL_DTYPES]

    def table(by_key: dict[tuple, Measurement], device: int) -> str:
        peaks = get_device_properties(device).peak_flops
        rows = []
        for case in cases:
            ours = by_key[("matmul", case.dtype, "cudalab")]
            theirs = by_key.get(("matmul", case.dtype, "torch"))
            peak = peaks.get(case.peak_key)
            rows.append((
                case.dtype, format_time(ours.median), f"{ours.relative_iqr:.1%}", f"{ours.tflops:.1f}",
                f"{100 * ours.tflops * 1e12 / peak:.1f}" if peak else "-",
                f"{theirs.tflops:.1f}" if theirs else "-",
                _ratio(ours.tflops, theirs.tflops if theirs else None),
            ))
        return format_table(
            ("dtype", "median", "IQR/med", "TFLOP/s", "% of theor. peak", "torch TFLOP/s", "x torch"),
            rows, title=_title(device, f"matmul {n} x {n} x {n}"))

    return _run_bench(args, "bench matmul", lambda: cases, table)


def _cmd_copy(args: argparse.Namespace) -> int:
    case = CopyCase(args.size_mb * MIB)

    def table(by_key: dict[tuple, Measurement], device: int) -> str:
        peak = get_device_properties(device).peak_memory_bandwidth
        rows = [(m.description, format_time(m.median), f"{m.relative_iqr:.1%}", f"{m.gbps:.0f}",
                 f"{100 * m.gbps * 1e9 / peak:.1f}" if peak else "-") for m in by_key.values()]
        return format_table(("impl", "median", "IQR/med", "GB/s (read+write)", "% of theor. DRAM"),
                            rows, title=_title(device, f"device-to-device copy of {args.size_mb} MiB"))

    return _run_bench(args, "bench copy", lambda: [case], table)


def _cmd_transfer(args: argparse.Namespace) -> int:
    memories = HOST_MEMORIES if args.pageable else ("pinned",)
    cases = [TransferCase(direction, memory, args.size_mb * MIB)
             for memory in memories for direction in TRANSFER_DIRECTIONS]

    def table(by_key: dict[tuple, Measurement], device: int) -> str:
        rows = []
        for case in cases:
            ours = by_key[(case.label, case.sub_label, "cudalab")]
            theirs = by_key.get((case.label, case.sub_label, "torch"))
            rows.append((f"{case.direction} {case.memory}", format_time(ours.median),
                         f"{ours.gbps:.1f}", f"{theirs.gbps:.1f}" if theirs else "-",
                         _ratio(ours.gbps, theirs.gbps if theirs else None)))
        return format_table(("transfer", "median", "GB/s", "torch GB/s", "x torch"), rows,
                            title=_title(device, f"host <-> device copies of {args.size_mb} MiB"))

    return _run_bench(args, "bench transfer", lambda: cases, table)


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
    _write_json(args, "ceilings", [c.row() for c in result.values()])
    return 0


# ---- argument parsing ---------------------------------------------------------------


def _size_option(parser: argparse.ArgumentParser, what: str, default: int) -> None:
    parser.add_argument("--size-mb", type=positive_int, default=default, metavar="MIB",
                        help=f"{what} size in MiB (default {default})")


def _timing() -> argparse.ArgumentParser:
    timing = argparse.ArgumentParser(add_help=False)
    timing.add_argument("--preset", choices=tuple(PRESETS), default="sustained",
                        help="timing preset (default sustained: "
                             f"{PRESETS['sustained'].describe().replace('%', '%%')})")
    timing.add_argument("--iterations", type=positive_int, default=None, metavar="N",
                        help="exactly N timed repeats instead of the noise-based stop")
    timing.add_argument("--warmup", type=positive_float, default=None, metavar="SECONDS",
                        help="seconds of warm-up calls before timing (default: the preset's)")
    timing.add_argument("--min-run-time", type=positive_float, default=None, metavar="SECONDS",
                        help="seconds of timed repeats before the noise-based stop (default: "
                             "the preset's)")
    timing.add_argument("--no-torch", action="store_true",
                        help="skip the PyTorch column (it runs when torch with CUDA is installed)")
    return timing


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` (with matmul, copy, transfer) and ``ceilings`` to the CLI."""
    common, timing = common_parser(), _timing()
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
    matmul.add_argument("--matrix-size", type=positive_int, default=8192, metavar="N",
                        help="n (default 8192)")
    matmul.add_argument("--dtype", action=ChoiceList, choices=MATMUL_DTYPES, metavar="DTYPE",
                        help=f"dtypes to run: {', '.join(MATMUL_DTYPES)} (default: all). "
                             f"{several('--dtype', 'float16', 'bfloat16')}. tf32 is float32 "
                             "storage with TF32 tensor-core math")
    matmul.add_argument("--flush-l2", action="store_true",
                        help="flush the L2 cache before every call (one cold call per repeat)")
    matmul.set_defaults(func=_cmd_matmul)

    copy = kinds.add_parser(
        "copy", parents=[common, timing], help="device-to-device copy bandwidth",
        description="Copy a contiguous device buffer (DeviceArray.copy; torch's clone); GB/s "
                    "counts bytes read + written.")
    _size_option(copy, "buffer", 1024)
    copy.set_defaults(func=_cmd_copy)

    transfer = kinds.add_parser(
        "transfer", parents=[common, timing], help="host <-> device bandwidth, pinned (and pageable)",
        description="Copy between host and device memory in both directions: pinned memory "
                    "with non_blocking copies, and with --pageable also ordinary NumPy memory.")
    _size_option(transfer, "transfer", 256)
    transfer.add_argument("--pageable", action="store_true", help="also time pageable memory")
    transfer.set_defaults(func=_cmd_transfer)

    ceiling_parser = sub.add_parser(
        "ceilings", parents=[common], help="measure what this GPU does at best",
        description="Measure the ceilings lessons are placed against (with the sustained "
                    "preset): device copy bandwidth, pinned host<->device bandwidth, "
                    "empty-kernel launch cost and GEMM peak per dtype, beside the theoretical "
                    "peaks.")
    ceiling_parser.add_argument(
        "--only", action=ChoiceList, choices=CEILING_NAMES, metavar="NAME",
        help=f"measure only these: {', '.join(CEILING_NAMES)}. {several('--only', 'copy', 'launch')}")
    ceiling_parser.set_defaults(func=_cmd_ceilings)
