"""Worker: a job in which one rank misbehaves (run with 2 ranks).

    failures.py exit_early      rank 1 exits with status 3 after init(); rank 0
                                all-reduces and waits (the launcher stops it)
    failures.py hang            rank 1 never enters the collective (it sleeps);
                                rank 0's watchdog must abort and raise
                                DistributedError within --timeout + a margin
    failures.py never_arrives   rank 1 never calls init(); rank 0's rendezvous
                                must fail within --timeout, naming rank 1

Rank 0 reports what it saw: the exceptions (type and message) and the
seconds from the start of the step that failed.
"""

from __future__ import annotations

import argparse
import sys
import time

import _common

RANK = _common.started()

import cudalab  # noqa: E402
import cudalab.distributed as dist  # noqa: E402

# The misbehaving rank's "forever": far beyond any test's timeout (the
# launcher stops it long before).
FOREVER = 300.0


def caught(fn) -> list[dict]:
    """Run `fn`, then a few more instructions; every exception seen, in order.

    The watchdog raises its DistributedError at the main thread's next Python
    instruction after it aborts, which may be just after a blocking call
    returns: the second try block gives it a place to land.
    """
    seen = []
    try:
        fn()
    except Exception as exc:
        seen.append({"type": type(exc).__name__, "message": str(exc),
                     "distributed": isinstance(exc, dist.DistributedError)})
    try:
        for _ in range(10000):
            pass
    except Exception as exc:
        seen.append({"type": type(exc).__name__, "message": str(exc),
                     "distributed": isinstance(exc, dist.DistributedError)})
    return seen


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("exit_early", "hang", "never_arrives"))
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()

    if args.mode == "never_arrives":
        if RANK == 1:
            time.sleep(FOREVER)
            return 0
        start = time.monotonic()
        errors = caught(lambda: dist.init(timeout=args.timeout))
        _common.report(RANK, mode=args.mode, errors=errors,
                       seconds=time.monotonic() - start, timeout=args.timeout)
        return 1 if errors else 0

    group = dist.init(timeout=args.timeout)
    x = cudalab.ones((1024,), dtype="float32")
    dist.all_reduce(x)  # both ranks: the communicator works
    cudalab.synchronize()
    if args.mode == "exit_early" and RANK == 1:
        sys.exit(3)
    if args.mode == "hang" and RANK == 1:
        time.sleep(FOREVER)
        return 0
    start = time.monotonic()

    def collective():
        dist.all_reduce(x)
        cudalab.synchronize()  # blocks until the watchdog aborts the communicator

    errors = caught(collective)
    _common.report(RANK, mode=args.mode, errors=errors, seconds=time.monotonic() - start,
                   timeout=args.timeout, aborted=group.aborted,
                   comm_error=getattr(group.comm, "error", None) if group.comm else None)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
