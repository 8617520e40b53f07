"""What the CLI's commands share: argparse types, option groups, the device check.

Every command module of cudalab.cli (bench, lessons, inference, check, results)
builds its parser from these; the names are public within the CLI package.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from .. import _core

__all__ = ["ChoiceList", "check_device", "common_parser", "output_file", "positive_float",
           "positive_int", "several"]


def check_device(args: argparse.Namespace, command: str) -> int | None:
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


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def output_file(text: str) -> str:
    """An argparse type: a file path whose directory exists (nothing is created)."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    parent = os.path.dirname(text) or "."
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"directory {parent!r} does not exist; create it first")
    return text


class ChoiceList(argparse.Action):
    """Values from `choices`, in any of the forms the help shows.

    ``--opt A B``, ``--opt A,B`` and ``--opt A --opt B`` all give ``[A, B]``
    (in order, repeats dropped).
    """

    def __init__(self, option_strings: Sequence[str], dest: str, choices: Sequence[str],
                 **kwargs: Any) -> None:
        self.valid = tuple(choices)
        super().__init__(option_strings, dest, nargs="+", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        chosen = list(getattr(namespace, self.dest) or [])
        for value in values:
            for item in value.split(","):
                if item.strip() not in self.valid:
                    raise argparse.ArgumentError(
                        self, f"invalid choice: {item.strip()!r} (choose from {', '.join(self.valid)})")
                if item.strip() not in chosen:
                    chosen.append(item.strip())
        setattr(namespace, self.dest, chosen)


def several(option: str, first: str, second: str) -> str:
    """The help sentence of a ChoiceList option: the three forms it accepts."""
    return (f"Several as '{option} {first} {second}', '{option} {first},{second}' or a "
            f"repeated {option}")


def common_parser() -> argparse.ArgumentParser:
    """The options every measuring command takes: --device, --json, --no-progress."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", type=int, default=None, help="device index (default: current)")
    common.add_argument("--json", metavar="PATH", type=output_file,
                        help="also write the results as JSON to PATH (its directory must exist)")
    common.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    return common
