"""The launcher: ``python -m cudalab.distributed.run [options] script.py args``.

Starts ``--nproc-per-node`` copies of a Python script (or ``-m module``) on
this node with torchrun's variables set (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``,
``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), on top of
this process's environment, so a script written for torchrun runs unchanged.
A job on several nodes runs one launcher per node with the same
``--nnodes``, ``--master-addr`` and ``--master-port`` and its own
``--node-rank``; the workers meet in ``cudalab.distributed.init()``.

Every worker starts in a session of its own, so the launcher can signal a
worker together with whatever it started, and a Ctrl-C in the terminal
reaches the launcher only, which forwards it. When a worker fails (a nonzero
exit or a signal) the launcher stops the others (SIGTERM, then SIGKILL after
``--grace-seconds``), prints one line naming the failed rank and its status,
and exits with that status (128 + N for signal N). ``--timeout`` bounds the
whole job (exit status 124, like timeout(1)). A successful job prints
nothing but what the workers print.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

__all__ = ["TIMEOUT_STATUS", "launch", "main"]

TIMEOUT_STATUS = 124
DEFAULT_GRACE_SECONDS = 5.0
# How often the launcher looks at its workers.
_POLL_SECONDS = 0.02
_PREFIX = "cudalab.distributed.run"


def _free_port() -> int:
    """A port no one listens on now (rank 0 binds it a moment later, SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"launch() argument '{name}': expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"launch() argument '{name}': must be >= {minimum}, got {value}")
    return value


def _check_seconds(value, name: str, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"launch() argument '{name}': expected seconds as a number, "
                        f"got {type(value).__name__}")
    if not 0 <= value < float("inf") or (name == "timeout" and value == 0):
        raise ValueError(f"launch() argument '{name}': must be finite and "
                         f"{'positive' if name == 'timeout' else '>= 0'}, got {value}")
    return float(value)


def _signal_text(status: int) -> str:
    try:
        return signal.Signals(status).name
    except ValueError:
        return f"signal {status}"


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {_signal_text(-returncode)} (exit status {128 - returncode})"
    return f"exited with status {returncode}"


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Workers:
    """The worker processes of this node and how to stop them."""

    def __init__(self, procs: list[subprocess.Popen], first_rank: int) -> None:
        self.procs = procs
        self.first_rank = first_rank

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            # The whole session: the worker and whatever it started (start_new_session).
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, grace: float, first: int = signal.SIGTERM) -> int:
        """`first` to every worker, SIGKILL to those alive after `grace` s; returns how many ran."""
        alive = self.running()
        self.signal_all(first)
        deadline = time.monotonic() + grace
        while self.running() and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        # Also the sessions of workers that exited: their children may live on.
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=max(grace, 1.0))
            except subprocess.TimeoutExpired:  # unkillable (D state): do not hang on it
                pass
        return len(alive)


def launch(argv: Sequence[str], nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0,
           master_addr: str = "127.0.0.1", master_port: int | None = None,
           env: Mapping[str, str] | None = None, timeout: float | None = None,
           grace_seconds: float = DEFAULT_GRACE_SECONDS) -> int:
    """launch(argv, nproc_per_node, *, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=None, env=None, timeout=None, grace_seconds=5.0) -> int

    Run `nproc_per_node` workers of this node and return the job's exit status.

    Parameters
    ----------
    argv : sequence of str
        What each worker runs after the Python interpreter: ``["script.py",
        *args]`` or ``["-m", "module", *args]``.
    nproc_per_node : int
        Workers on this node; local ranks 0..n-1, global ranks
        ``node_rank * nproc_per_node + local_rank``.
    nnodes, node_rank : int
        The number of nodes (one launcher each) and this node's index.
    master_addr : str
        Rank 0's host (node 0's address as the other nodes reach it).
    master_port : int, optional
        The rendezvous port; on one node, None picks a free one. Required
        with several nodes.
    env : mapping, optional
        Variables added to (or replacing in) this process's environment for
        the workers; nothing is removed.
    timeout : float, optional
        Seconds for the whole job; then every worker is stopped and the
        status is 124.
    grace_seconds : float
        Between SIGTERM and SIGKILL when workers are stopped.

    Returns
    -------
    int
        0 when every worker exited 0; otherwise the first failed worker's
        exit status (128 + N for signal N), 124 on timeout, 128 + N when the
        launcher received signal N (SIGINT, SIGTERM: forwarded to the workers).
    """
    argv = list(argv)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("launch() argument 'argv': expected a script (or '-m', module) "
                         "and its arguments, as strings")
    if argv[0] == "-m" and len(argv) < 2:
        raise ValueError("launch() argument 'argv': '-m' needs a module name")
    nproc = _check_int(nproc_per_node, "nproc_per_node", 1)
    nnodes = _check_int(nnodes, "nnodes", 1)
    node_rank = _check_int(node_rank, "node_rank", 0)
    if node_rank >= nnodes:
        raise ValueError(f"launch() argument 'node_rank': must be below nnodes ({nnodes}), "
                         f"got {node_rank}")
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise ValueError(f"launch() argument 'master_addr': expected a host name, "
                         f"got {master_addr!r}")
    if master_port is None:
        if nnodes > 1:
            raise ValueError("launch() argument 'master_port': required with several nodes "
                             "(every node's launcher must name the same port)")
        master_port = _free_port()
    master_port = _check_int(master_port, "master_port", 1)
    if master_port > 65535:
        raise ValueError(f"launch() argument 'master_port': must be <= 65535, got {master_port}")
    timeout = _check_seconds(timeout, "timeout", optional=True)
    grace = _check_seconds(grace_seconds, "grace_seconds", optional=False)
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"launch() argument 'env': expected a mapping, got {type(env).__name__}")

    world = nproc * nnodes
    base = dict(os.environ)
    base.update(env or {})
    base.update({
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr.strip(),
        "MASTER_PORT": str(master_port),
    })
    # Our workers serve MASTER_PORT themselves; a torchrun around us must not
    # make them look for its agent's store there.
    base.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    command = [sys.executable, *argv]

    stop_signal: list[int] = []

    def on_signal(signum, frame):
        stop_signal.append(signum)

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {}
    in_main_thread = _is_main_thread()
    if in_main_thread:
        for s in handled:
            previous[s] = signal.signal(s, on_signal)
    procs: list[subprocess.Popen] = []
    workers = _Workers(procs, node_rank * nproc)
    try:
        for local in range(nproc):
            rank = node_rank * nproc + local
            child_env = dict(base, RANK=str(rank), LOCAL_RANK=str(local), ROLE_RANK=str(rank))
            procs.append(subprocess.Popen(command, env=child_env, start_new_session=True))
        return _supervise(workers, timeout, grace, stop_signal)
    finally:
        if workers.running():  # an error in the launcher itself: never leave workers behind
            workers.stop(grace)
        if in_main_thread:
            for s, handler in previous.items():
                # None: a handler installed outside Python; the default is the best we can do.
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _supervise(workers: _Workers, timeout: float | None, grace: float,
               stop_signal: list[int]) -> int:
    start = time.monotonic()
    while True:
        if stop_signal:
            signum = stop_signal[0]
            n = workers.stop(grace, first=signum)
            _say(f"received {_signal_text(signum)}; forwarded it to {n} running worker"
                 f"{'s' if n != 1 else ''} and stopped them")
            return 128 + signum
        failed = None
        running = 0
        for local, p in enumerate(workers.procs):
            code = p.poll()
            if code is None:
                running += 1
            elif code != 0 and failed is None:
                failed = (local, p, code)
        if failed is not None:
            local, p, code = failed
            n = workers.stop(grace)
            others = (f"stopped the other {n} running worker{'s' if n != 1 else ''}" if n
                      else "no other worker was running")
            _say(f"rank {workers.first_rank + local} (local rank {local}, pid {p.pid}) "
                 f"{_describe(code)}; {others}")
            return _status(code)
        if running == 0:
            return 0
        if timeout is not None and time.monotonic() - start >= timeout:
            n = workers.stop(grace)
            _say(f"timed out after {timeout:g} s; stopped {n} running worker"
                 f"{'s' if n != 1 else ''}")
            return TIMEOUT_STATUS
        time.sleep(_POLL_SECONDS)


def _say(text: str) -> None:
    print(f"{_PREFIX}: {text}", file=sys.stderr, flush=True)


# ---- command line --------------------------------------------------------------------------


def _nproc(value: str) -> int:
    if value in ("gpu", "auto"):
        from .. import _core

        count = _core.device_count()
        if count < 1:
            raise argparse.ArgumentTypeError(f"{value!r}: no GPU is visible")
        return count
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, 'gpu' or 'auto', got {value!r}") \
            from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _positive_int(minimum: int):
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n
    return parse


def _seconds(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 <= x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {value!r}")
    return x


def _nnodes(value: str) -> int:
    if ":" in value:
        raise argparse.ArgumentTypeError(
            f"elastic ranges ({value!r}) are not supported: give a fixed number of nodes")
    return _positive_int(1)(value)


def build_parser() -> argparse.ArgumentParser:
    """The launcher's argument parser (torchrun's spellings with '_' are accepted too)."""
    p = argparse.ArgumentParser(
        prog="python -m cudalab.distributed.run",
        description="Start one process per GPU for cudalab.distributed (torchrun's variables).",
        allow_abbrev=False)
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=_nproc, default=1,
                   metavar="N", help="workers on this node: a number, or 'gpu' (one per GPU)")
    p.add_argument("--nnodes", type=_nnodes, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=_positive_int(0), default=0,
                   help="this node's index, 0..nnodes-1 (default 0)")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1",
                   help="rank 0's host (node 0), default 127.0.0.1")
    p.add_argument("--master-port", "--master_port", type=_positive_int(1), default=None,
                   help="rendezvous port (default: a free port on one node; required on several)")
    p.add_argument("--standalone", action="store_true",
                   help="one node, a free port (torchrun's flag; the default here)")
    p.add_argument("--grace-seconds", type=_seconds, default=DEFAULT_GRACE_SECONDS,
                   help="seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
    p.add_argument("--timeout", type=_seconds, default=None,
                   help="seconds for the whole job; then the workers are stopped (status 124)")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the script argument as a module (python -m)")
    p.add_argument("script", help="the Python script (or module, with -m) each worker runs")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """main(argv=None) -> int: the command line (``sys.argv[1:]`` by default)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.standalone and args.nnodes != 1:
        parser.error("--standalone runs one node; drop --nnodes")
    if args.node_rank >= args.nnodes:
        parser.error(f"--node-rank {args.node_rank} must be below --nnodes {args.nnodes}")
    if args.nnodes > 1 and args.master_port is None:
        parser.error("--master-port is required with --nnodes > 1 (the same on every node)")
    if args.master_port is not None and args.master_port > 65535:
        parser.error(f"--master-port {args.master_port} is not a TCP port")
    if args.timeout is not None and args.timeout == 0:
        parser.error("--timeout must be positive")
    worker_argv = (["-m", args.script] if args.module else [args.script]) + args.script_args
    return launch(worker_argv, args.nproc_per_node, nnodes=args.nnodes,
                  node_rank=args.node_rank, master_addr=args.master_addr,
                  master_port=args.master_port, timeout=args.timeout,
                  grace_seconds=args.grace_seconds)


if __name__ == "__main__":
    sys.exit(main())
