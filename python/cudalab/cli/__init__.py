"""The ``cudalab`` command line (also ``python -m cudalab``).

Commands, one module of this package per group:

* ``check`` (cli/check.py): a report of every device (deviceQuery-style
  properties and theoretical peaks, plus live utilization, clocks,
  temperature and power nvidia-smi style when NVML is installed: ``pip
  install nvidia-ml-py``). Exits 1 with a clear message when no GPU or
  driver is present.

* ``bench matmul|copy|transfer`` and ``ceilings`` (cli/bench.py):
  measurements through cudalab.bench.

* ``lessons``, ``lesson NAME``, ``run-all``, ``cpu-vs-gpu`` and ``memory``
  (cli/lessons.py): the lessons of cudalab.lessons.

* ``inference`` (cli/inference.py): the guide's model inference comparison.

* ``guide`` (cli/guide.py): the guide's four scripts in order (check,
  cpu-vs-gpu, memory, inference) with its flags, and a summary.

* ``results [LESSON]`` (cli/results.py): the lesson results committed to the
  repository, printed without a GPU.

What the commands share (argparse types, option groups, the device check)
is cli/args.py. ``cudalab --version`` prints the version.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .. import __version__
from . import bench, check, guide, inference, lessons, results
from .check import check_report

__all__ = ["build_parser", "check_report", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cudalab", description="Hands-on, measured GPU performance from Python.")
    parser.add_argument("--version", action="version", version=f"cudalab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check.add_parsers(sub)
    bench.add_parsers(sub)
    lessons.add_parsers(sub)
    inference.add_parsers(sub)
    guide.add_parsers(sub)
    results.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what results files record
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args))
