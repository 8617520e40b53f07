"""The lesson commands of the CLI: ``lessons``, ``lesson NAME``, ``run-all``,
and the GPU fundamentals guide's own ``cpu-vs-gpu`` and ``memory``.

Every command runs lessons through `cudalab.lessons.run` and prints each
result's table on stdout. ``--quick`` starts from a lesson's quick
parameters; ``lesson NAME --set KEY=VALUE`` overrides one parameter (the
value read as a Python literal, else as text; a comma list for a tuple
parameter). ``--json PATH`` writes a lessons results file
(`cudalab.lessons.write_results`) and ``--markdown PATH`` a report of every
result, both rewritten after each lesson so a long run that is stopped keeps
what finished (``--max-times N`` caps the raw times kept). ``run-all``
(``--only`` / ``--skip`` to choose lessons) carries on after a lesson fails,
reports it, and exits 1 at the end.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import _core, lessons
from ..bench import torch_cuda
from .._progress import ProgressBar
from .._table import format_table
from ..devices import device as device_context
from ..devices import get_device_properties
from ..lessons.registry import Lesson, check_params, resolve_params
from .args import ChoiceList, common_parser, output_file, positive_int, several
# The device check under this module's own name: each command module looks it up
# here, so a test can stand in a device for one command group.
from .args import check_device as _check_device
from .results import without_gpu_text

__all__ = ["add_parsers", "parse_params", "parse_value", "run_lessons", "running_parser"]

# ---- parameters from the command line -------------------------------------------------


def _literal(text: str) -> Any:
    """A Python literal, or the text itself when it is not one (``float16``)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError):
        return text


def parse_value(text: str, default: Any) -> Any:
    """parse_value(text, default) -> value

    A ``--set`` value for a parameter whose default is `default`: a Python
    literal (``4096``, ``1e-3``, ``None``, ``(1, 2)``), else the text. A str
    parameter keeps the text; a bool one also takes true/false; a tuple one
    takes a comma list (``1024,2048`` gives ``(1024, 2048)``, ``7`` gives
    ``(7,)``, ``float16,bfloat16`` gives ``("float16", "bfloat16")``).
    """
    if isinstance(default, str):
        return text
    if isinstance(default, bool) and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    if isinstance(default, (tuple, list)):
        if not text.strip():
            return ()
        value = _literal(text)
        if isinstance(value, (tuple, list)):
            return tuple(value)
        if isinstance(value, str):  # not one literal: a list of items, each read alone
            return tuple(_literal(item.strip()) for item in text.split(","))
        return (value,)
    return _literal(text)


def parse_params(x: Lesson, assignments: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """parse_params(x, assignments) -> dict

    ``(key, text)`` pairs from ``--set`` as parameters of lesson `x` (a later
    key wins), each read by `parse_value` against the lesson's default.

    Raises
    ------
    ValueError
        A key the lesson does not take; the message lists those it does.
    """
    texts = dict(assignments)
    check_params(x, texts)
    return {key: parse_value(text, x.params[key]) for key, text in texts.items()}


def _assignment(text: str) -> tuple[str, str]:
    """An argparse type: ``KEY=VALUE`` as (key, value text)."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _positive_ints(text: str) -> tuple[int, ...]:
    """An argparse type: ``16,32,64`` as a tuple of positive ints."""
    return tuple(positive_int(item.strip()) for item in text.split(","))


def _max_times(text: str) -> int:
    """An argparse type: an int >= 5, as `cudalab.bench.results_dict` takes."""
    value = positive_int(text)
    if value < 5:
        raise argparse.ArgumentTypeError(f"expected an integer >= 5, got {value}")
    return value


# ---- reporting ------------------------------------------------------------------------

# "lessons.get() argument 'name': " or "lessons.run(): ": the command names itself instead.
_CALLER = re.compile(r"^[\w.]+\(\)(?: argument '\w+')?: ")


def _usage_error(command: str, exc: ValueError) -> int:
    print(f"cudalab {command}: {_CALLER.sub('', str(exc))}", file=sys.stderr)
    return 2


def _command_line() -> str:
    return " ".join(["cudalab", *sys.argv[1:]])


def _run_one(command: str, name: str, params: dict[str, Any], quick: bool,
             bar: ProgressBar) -> lessons.LessonResult | dict[str, str]:
    """The lesson's result, or a failure record after reporting it on stderr."""
    try:
        result = lessons.run(name, quick=quick, **params)
    except Exception as exc:  # one lesson's failure must not stop the lessons after it
        bar.close()
        error = f"{type(exc).__name__}: {exc}"
        print(f"cudalab {command}: lesson {name!r} failed: {error}", file=sys.stderr)
        if not isinstance(exc, _core.CudalabError):  # a bug in the lesson: show where
            traceback.print_exc(file=sys.stderr)
        return {"lesson": name, "error": error}
    bar.close()
    print(result.table())
    print()
    return result


def _save(args: argparse.Namespace, results: list, failures: list, device: str) -> None:
    if args.json:
        lessons.write_results(args.json, results, failures=failures, command=_command_line(),
                              max_times=args.max_times)
    if args.markdown:
        Path(args.markdown).write_text(
            lessons.markdown(results, device=device, failures=failures), encoding="utf-8")


def run_lessons(args: argparse.Namespace, command: str, jobs: list[tuple[str, dict[str, Any]]],
                without_gpu: Callable[[], str] | None = None) -> int:
    """Run each (lesson, params) in order on the chosen device; 1 if any failed.

    Every lesson's parameters are checked first (2 on a bad one), then the
    device; without a GPU, `without_gpu()` (when given) says what to do instead.
    """
    for name, params in jobs:
        try:
            resolve_params(lessons.get(name), params, args.quick)
        except (TypeError, ValueError) as exc:
            return _usage_error(command, exc)
    device = _check_device(args, command)
    if device is None:
        if without_gpu is not None and not _core.is_available():
            print(without_gpu(), file=sys.stderr)
        return 1
    if not jobs:
        print(f"cudalab {command}: no lessons are registered.", file=sys.stderr)
        return 1
    device_name = get_device_properties(device).name
    if len(jobs) > 1:
        # PyTorch's import (seconds) happens here, once, not inside whichever lesson asks first:
        # each lesson's wall time is then its own.
        torch_cuda()
    results: list[lessons.LessonResult] = []
    failures: list[dict[str, str]] = []
    with device_context(device), ProgressBar(
            len(jobs), enabled=False if args.no_progress else None) as bar:
        for name, params in jobs:
            bar.step(f"lesson {name}")
            done = _run_one(command, name, params, args.quick, bar)
            (failures if isinstance(done, dict) else results).append(done)
            _save(args, results, failures, device_name)
    if failures and len(jobs) > 1:
        print(f"cudalab {command}: {len(failures)} of {len(jobs)} lessons failed: "
              f"{', '.join(f['lesson'] for f in failures)}", file=sys.stderr)
    return 1 if failures else 0


# ---- commands -------------------------------------------------------------------------


def _describe_params(x: Lesson) -> str:
    return ", ".join(f"{k}={v!r}" + (f" (quick {x.quick_params[k]!r})" if k in x.quick_params
                                     else "") for k, v in x.params.items()) or "none"


def _cmd_list(args: argparse.Namespace) -> int:
    found = [lessons.get(name) for name in lessons.names()]
    if not found:
        print("No lessons are registered.")
        return 0
    header = ["#", "name", "title", "tutorial section"] + (["parameters"] if args.params else [])
    rows = [[str(x.number), x.name, x.title, x.seed] + ([_describe_params(x)] if args.params
                                                        else []) for x in found]
    print(format_table(header, rows, left=len(header)))
    return 0


def _cmd_lesson(args: argparse.Namespace) -> int:
    try:
        x = lessons.get(args.name)
        params = parse_params(x, args.set)
    except ValueError as exc:
        return _usage_error("lesson", exc)
    return run_lessons(args, "lesson", [(x.name, params)], lambda: without_gpu_text(x))


def _cmd_run_all(args: argparse.Namespace) -> int:
    chosen = [name for name in lessons.names() if (args.only is None or name in args.only)
              and name not in (args.skip or ())]
    return run_lessons(args, "run-all", [(name, {}) for name in chosen])


def _cmd_guide(args: argparse.Namespace) -> int:
    params = {k: getattr(args, k) for k in args.options if getattr(args, k) is not None}
    try:
        check_params(lessons.get(args.lesson), params)
    except ValueError as exc:
        return _usage_error(args.command, exc)
    return run_lessons(args, args.command, [(args.lesson, params)])


# ---- argument parsing -----------------------------------------------------------------


def running_parser() -> argparse.ArgumentParser:
    """The options of every command that runs lessons: --quick, --markdown, --max-times."""
    running = argparse.ArgumentParser(add_help=False)
    running.add_argument("--quick", action="store_true",
                         help="start from the quick parameters (seconds per lesson) instead "
                              "of the full ones")
    running.add_argument("--markdown", metavar="PATH", type=output_file,
                         help="also write a Markdown report to PATH (its directory must exist)")
    running.add_argument("--max-times", type=_max_times, metavar="N",
                         help="with --json: keep at most N raw times per measurement (order "
                              "statistics that keep the median, quartiles, min and max exact; "
                              "for files to commit); default: all")
    return running


# The guide's commands: (command, lesson, what it shows, options). Each option
# (flag, type, metavar, example) sets the lesson parameter of the same name.
GUIDE_COMMANDS = (
    ("cpu-vs-gpu", "cpu_vs_gpu", "the guide's CPU vs GPU matrix multiply benchmark",
     (("--matrix-size", positive_int, "N", "8192"), ("--iterations", positive_int, "N", "100"))),
    ("memory", "memory", "the guide's memory management demo, per batch size",
     (("--batch-sizes", _positive_ints, "N,N,...", "16,32,64,128"),)),
)


def _add_guide_parsers(sub: argparse._SubParsersAction, parents: list) -> None:
    """``cpu-vs-gpu`` and ``memory``: the guide's commands, as their lessons."""
    for command, lesson, what, options in GUIDE_COMMANDS:
        parser = sub.add_parser(
            command, parents=parents, help=f"{what} (lesson {lesson})",
            description=f"Run lesson {lesson}: {what}. Options left out keep the lesson's "
                        "defaults.")
        names = []
        for flag, kind, metavar, example in options:
            names.append(flag[2:].replace("-", "_"))
            parser.add_argument(flag, type=kind, metavar=metavar,
                                help=f"the lesson's {names[-1]} (the guide uses {example})")
        parser.set_defaults(func=_cmd_guide, lesson=lesson, options=tuple(names))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``lessons``, ``lesson``, ``run-all``, ``cpu-vs-gpu`` and ``memory`` to the CLI."""
    parents = [common_parser(), running_parser()]
    listing = sub.add_parser(
        "lessons", help="list the lessons",
        description="List the lessons: number, name, title and the tutorial section each "
                    "comes from.")
    listing.add_argument("--params", action="store_true",
                         help="also list each lesson's parameters (full value, quick value)")
    listing.set_defaults(func=_cmd_list)

    one = sub.add_parser(
        "lesson", parents=parents, help="run one lesson and print its results",
        description="Run one lesson on the GPU and print its table, findings, the tutorial's "
                    "claims beside what this GPU measured, and its correctness checks.")
    one.add_argument("name", metavar="NAME", help="the lesson's name (see cudalab lessons)")
    one.add_argument("--set", type=_assignment, action="append", default=[],
                     metavar="KEY=VALUE",
                     help="set a parameter: a Python literal (4096, 1e-3, None, (1, 2)) or "
                          "text; a tuple parameter takes a comma list (sizes=1024,2048). "
                          "Repeat for several (cudalab lessons --params lists them)")
    one.set_defaults(func=_cmd_lesson)

    every = sub.add_parser(
        "run-all", parents=parents, help="run every lesson in order",
        description="Run every lesson in order, printing each one's results. A lesson that "
                    "fails is reported and the others still run; the exit status is then 1.")
    for option, what in (("--only", "run only these lessons (in lesson order)"),
                         ("--skip", "leave these lessons out")):
        every.add_argument(option, action=ChoiceList, choices=lessons.names(), metavar="NAME",
                           help=f"{what}. {several(option, 'first', 'second')}")
    every.set_defaults(func=_cmd_run_all)
    _add_guide_parsers(sub, parents)
