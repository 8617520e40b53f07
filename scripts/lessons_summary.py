"""The README's "Lessons" table from a lessons results file.

Usage: python scripts/lessons_summary.py benchmarks/results/lessons_<device>.json

Prints one Markdown row per lesson: its number and name, what it shows (its
title and first claim), what the tutorials claim and what the tutorial's own
Tesla T4 run printed (`cudalab.lessons.tutorial_figures`; "-" where there is
none: only the Colab notebook shows a run), the value measured here for the
lesson's first claim, whether that claim held (and how many of the lesson's
claims did), why, and how cudalab's timings compare with PyTorch's in the same
run (`cudalab.lessons.versus`). README.md holds the table verbatim;
tests/test_readme_results_cpu.py checks that it matches the committed file.
"""

from __future__ import annotations

import argparse
import sys

from cudalab.lessons import read_results
from cudalab.lessons.tutorial_figures import figure
from cudalab.lessons.versus import summary, versus_torch

HEADER = ("| # | lesson | what it shows | tutorial claims | tutorial's T4 run | measured here "
          "| held | why | cudalab vs PyTorch (same run) |\n|---|---|---|---|---|---|---|---|---|")


def _number(value, unit) -> str:
    if value is None:
        return "-"
    text = f"{value:.4g}"
    return f"{text} {unit}" if unit else text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def tutorial_cells(lesson: str) -> tuple[str, str]:
    """The tutorial claims and the tutorial's T4 run for `lesson`; "-" for what is missing
    (a lesson with no entry in cudalab.lessons.tutorial_figures has neither)."""
    found = figure(lesson)
    if found is None:
        return "-", "-"
    return found.claim_text(), found.t4_run or "-"


def readme_row(result) -> str:
    """One lesson's row of the README table."""
    claims = result.claims
    if claims:
        first = claims[0]
        held = "yes" if first.held else "no"
        if len(claims) > 1:
            held += f" ({sum(c.held for c in claims)} of {len(claims)} claims)"
        measured = _number(first.measured, first.unit)
        what = f"{result.title}: {first.claim}"
        why = first.why
    else:
        held, measured, what, why = "-", "-", result.title, "-"
    cells = (str(result.number), f"`{result.lesson}`", what, *tutorial_cells(result.lesson),
             measured, held, why, summary(versus_torch(result)))
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def readme_table(results) -> str:
    """The whole table: header and one row per lesson, in lesson order."""
    rows = [readme_row(r) for r in sorted(results, key=lambda r: r.number)]
    return "\n".join([HEADER, *rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a lessons results file (cudalab run-all --json)")
    args = parser.parse_args()
    print(readme_table(read_results(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
