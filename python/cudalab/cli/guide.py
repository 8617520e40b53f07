"""``cudalab guide``: the step-by-step guide's four scripts, in order, as cudalab commands.

The GPU fundamentals guide (seed 001) has four scripts, which its
``scripts/run_benchmarks.sh`` runs one after the other: ``check_gpu.py``,
``cpu_vs_gpu_benchmark.py --matrix-size 8192 --iterations 100``,
``memory_management.py --batch-sizes 16,32,64,128`` and
``model_inference_comparison.py --model-name resnet50 --batch-sizes 1,8,16,32``.
Each is a cudalab command (``check``, ``cpu-vs-gpu``, ``memory``,
``inference``); this command runs the four with the guide's flags, in that
order, each printing exactly what the command prints alone, then a summary
(each step, the command that ran, its exit status and wall time). A step that
fails does not stop the next ones; the exit status is then 1.

``--quick`` runs the lesson steps with ``--quick`` at their lessons' quick
sizes instead of the guide's (seconds per step); ``--device`` and
``--no-progress`` are passed on to the lesson steps (``check`` reports every
device). Without a GPU the command says so and exits 1 before any step.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from typing import Sequence

from .._table import format_table
# The device check under this module's own name: each command module looks it up
# here, so a test can stand in a device for one command group.
from .args import check_device as _check_device

__all__ = ["GUIDE_STEPS", "GuideStep", "add_parsers", "step_argv"]


@dataclasses.dataclass(frozen=True)
class GuideStep:
    """One script of the guide and the cudalab command that runs it.

    Attributes
    ----------
    script : str
        The guide's script, with the flags the guide gives it.
    argv : tuple of str
        The cudalab command line (without ``cudalab``) run for it.
    quick_argv : tuple of str
        The same with ``--quick``: the lesson's quick sizes instead of the guide's.
    lesson_step : bool
        Whether the step runs a lesson (takes --device, --no-progress, --quick).
    """

    script: str
    argv: tuple[str, ...]
    quick_argv: tuple[str, ...]
    lesson_step: bool = True


# The guide's Quick Start, in run_benchmarks.sh's order, with the guide's flags.
GUIDE_STEPS = (
    GuideStep("check_gpu.py", ("check",), ("check",), lesson_step=False),
    GuideStep("cpu_vs_gpu_benchmark.py --matrix-size 8192 --iterations 100",
              ("cpu-vs-gpu", "--matrix-size", "8192", "--iterations", "100"),
              ("cpu-vs-gpu", "--quick")),
    GuideStep("memory_management.py --batch-sizes 16,32,64,128",
              ("memory", "--batch-sizes", "16,32,64,128"),
              ("memory", "--quick")),
    # The inference command always sets its batch sizes (default the guide's), so the
    # quick run names the lesson's quick ones.
    GuideStep("model_inference_comparison.py --model-name resnet50 --batch-sizes 1,8,16,32",
              ("inference", "--model-name", "resnet50", "--batch-sizes", "1,8,16,32"),
              ("inference", "--quick", "--model-name", "resnet50", "--batch-sizes", "1,8")),
)


def step_argv(step: GuideStep, quick: bool, device: int | None = None,
              no_progress: bool = False) -> list[str]:
    """step_argv(step, quick, device=None, no_progress=False) -> list of str

    The cudalab command line of `step`: the guide's flags (the quick ones with
    `quick`), plus ``--device`` and ``--no-progress`` for a lesson step.
    """
    argv = list(step.quick_argv if quick else step.argv)
    if step.lesson_step:
        if device is not None:
            argv += ["--device", str(device)]
        if no_progress:
            argv.append("--no-progress")
    return argv


def _run_step(argv: Sequence[str]) -> int:
    """One step, as ``cudalab *argv`` would run it in this process; its exit status."""
    from . import build_parser  # the whole CLI (this module is one of its parts)

    try:
        args = build_parser().parse_args(list(argv))
        args.argv = list(argv)
        return int(args.func(args))
    except SystemExit as exc:  # argparse refused the step's arguments (it printed why)
        return exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # one step's failure must not stop the steps after it
        print(f"cudalab guide: cudalab {' '.join(argv)} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return 1


def _summary(done: list[tuple[GuideStep, list[str], int, float]], quick: bool) -> str:
    rows = [(str(i), f"{step.script.split()[0]}", "cudalab " + " ".join(argv),
             "ok" if status == 0 else f"failed (exit {status})", f"{seconds:.1f}")
            for i, (step, argv, status, seconds) in enumerate(done, 1)]
    failed = sum(status != 0 for _, _, status, _ in done)
    title = (f"The guide's {len(done)} steps{' (quick)' if quick else ''}: "
             + ("all ran" if not failed else f"{failed} failed"))
    return format_table(("step", "the guide's script", "cudalab command", "status", "seconds"),
                        rows, title=title, left=4)


def _cmd_guide(args: argparse.Namespace) -> int:
    device = _check_device(args, "guide")
    if device is None:
        return 1
    done = []
    for i, step in enumerate(GUIDE_STEPS, 1):
        argv = step_argv(step, args.quick, device, args.no_progress)
        print(f"== Step {i} of {len(GUIDE_STEPS)}: the guide's {step.script}")
        print(f"== cudalab {' '.join(argv)}")
        print(flush=True)
        start = time.perf_counter()
        status = _run_step(argv)
        sys.stdout.flush()
        done.append((step, argv, status, time.perf_counter() - start))
        print()
    print(_summary(done, args.quick))
    return 1 if any(status != 0 for _, _, status, _ in done) else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``guide`` to the CLI."""
    steps = "; ".join(f"{s.script} as cudalab {' '.join(s.argv)}" for s in GUIDE_STEPS)
    parser = sub.add_parser(
        "guide", help="run the step-by-step guide's four scripts in order, as its "
                      "run_benchmarks.sh (check, cpu-vs-gpu, memory, inference)",
        description=f"Run the GPU fundamentals guide's scripts in order with its flags: "
                    f"{steps}. Each step prints what its command prints; a summary follows. "
                    "A failed step does not stop the others; the exit status is then 1.")
    parser.add_argument("--device", type=int, default=None,
                        help="device index for the lesson steps (default: current)")
    parser.add_argument("--quick", action="store_true",
                        help="run the lesson steps with --quick at their lessons' quick sizes "
                             "(seconds each) instead of the guide's sizes")
    parser.add_argument("--no-progress", action="store_true",
                        help="never draw the progress bar")
    parser.set_defaults(func=_cmd_guide)
