"""What every worker script shares: its rank, its pid file and its report.

A worker is started by tests/_distributed.py (under the launcher, or alone
for a world of 1). It writes ``rank<r>.pid`` as soon as it starts (so the
test can check that nothing is left running) and ``rank<r>.json`` with its
results at the end, into the directory named by CUDALAB_TEST_RESULTS_DIR.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

# tests/ holds _support.py (random data, tolerances).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS_VAR = "CUDALAB_TEST_RESULTS_DIR"


def rank_from_env() -> int:
    return int(os.environ.get("RANK", "0"))


def results_dir() -> Path | None:
    path = os.environ.get(RESULTS_VAR)
    return Path(path) if path else None


def started() -> int:
    """Record this process's pid; returns the launcher's RANK (0 without one)."""
    rank = rank_from_env()
    out = results_dir()
    if out is not None:
        (out / f"rank{rank}.pid").write_text(str(os.getpid()))
    return rank


def report(rank: int, **data) -> None:
    """Write this rank's results (atomically: a reader never sees half a file)."""
    out = results_dir()
    data = {"rank": rank, "pid": os.getpid(), "time": time.time(), **data}
    if out is None:
        print(json.dumps(data, indent=1, default=str))
        return
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(out / f"rank{rank}.json")


def error_text(exc: BaseException) -> str:
    """The exception's type and message, and where it was raised."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"
