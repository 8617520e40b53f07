"""Shared helpers of the cudalab.distributed tests (CPU and GPU tiers).

* ``needs_gpus(n)``: decorator for tests that need n GPUs: marked ``gpu``,
  skipped when fewer are visible; with ``CUDALAB_REQUIRE_GPU=1`` the lack of
  GPUs fails the test instead, unless ``CUDALAB_ALLOW_FEWER_GPUS=1``.
* ``launch_workers(script, nproc, args, timeout, env=None)``: run a worker
  script of ``tests/dist_workers/`` under ``python -m cudalab.distributed.run``
  (which calls ``cudalab.distributed.run.launch``), each rank writing its
  results as JSON into a fresh directory; returns a ``CompletedRun`` with the
  exit status, the captured output and the ranks' results. ``start_workers``
  is the same, started in the background (two launchers of a 2-node job).
* ``run_ranks(script, world, args, timeout, env=None, rank_env=None)``: the
  same without the launcher: `world` processes started directly with
  torchrun's variables (or none, for a world of 1 with ``launcher_vars=False``),
  for failures the launcher would otherwise cut short.
* ``leftover_processes(pids)``: those of `pids` still running; every helper
  here kills and reaps what it started, even when the test fails.
* ``worker_env(**extra)``: os.environ without any launcher's variables.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import cudalab

WORKERS = Path(__file__).resolve().parent / "dist_workers"
# The worker scripts write here: rank<r>.json (results), rank<r>.pid (at start).
RESULTS_VAR = "CUDALAB_TEST_RESULTS_DIR"

# Variables of launchers (torchrun, Slurm, MPI) that would change what a
# worker started without our launcher believes about its world.
LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)


# ---- GPUs ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """cudalab.device_count(), 0 on any error."""
    try:
        return int(cudalab.device_count())
    except Exception:  # no driver: no GPU
        return 0


def _require_gpus(n: int, nodeid: str = "") -> None:
    have = gpu_count()
    if have >= n:
        return
    required = os.environ.get("CUDALAB_REQUIRE_GPU", "").strip() == "1"
    fewer_ok = os.environ.get("CUDALAB_ALLOW_FEWER_GPUS", "").strip() == "1"
    text = f"needs {n} GPUs, {have} visible"
    if required and not fewer_ok:
        pytest.fail(f"CUDALAB_REQUIRE_GPU=1: {nodeid or 'this test'} {text} (set "
                    "CUDALAB_ALLOW_FEWER_GPUS=1 to skip tests that need more GPUs)",
                    pytrace=False)
    pytest.skip(text)


def needs_gpus(n: int):
    """needs_gpus(n) -> decorator

    Mark a test function ``gpu`` and skip it unless ``cudalab.device_count()
    >= n`` (fail instead under ``CUDALAB_REQUIRE_GPU=1`` unless
    ``CUDALAB_ALLOW_FEWER_GPUS=1``). The check runs when the test runs, before
    its body.
    """
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            _require_gpus(n)
            return fn(*args, **kwargs)

        return pytest.mark.gpu(wrapper)

    return decorate


# ---- processes ------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def leftover_processes(pids) -> list[int]:
    """leftover_processes(pids) -> list[int]: the pids that still run (zombies do not count)."""
    return [pid for pid in pids if _alive(pid)]


def wait_gone(pids, seconds: float = 5.0) -> list[int]:
    """Poll until none of `pids` runs or `seconds` pass; the ones still running."""
    deadline = time.monotonic() + seconds
    left = leftover_processes(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = leftover_processes(left)
    return left


def kill_processes(pids) -> None:
    """SIGKILL every pid of `pids` still running (its session first)."""
    for pid in leftover_processes(pids):
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass


def worker_env(**extra: str) -> dict[str, str]:
    """os.environ without launcher variables, plus `extra` (which wins)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---- running worker scripts ----------------------------------------------------------------


@dataclass
class CompletedRun:
    """What a launcher run left: exit status, output, each rank's results."""

    returncode: int
    stdout: str
    stderr: str
    results: list[dict] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    seconds: float = 0.0
    returncodes: list[int] = field(default_factory=list)  # run_ranks: one per rank

    def by_rank(self) -> dict[int, dict]:
        return {r["rank"]: r for r in self.results}

    def explain(self) -> str:
        """A summary for assertion messages: status, time, the output's tails."""
        return (f"launcher exit status {self.returncode} after {self.seconds:.1f} s; "
                f"{len(self.results)} rank result(s)\n--- stdout (tail) ---\n"
                f"{self.stdout[-3000:]}\n--- stderr (tail) ---\n{self.stderr[-6000:]}")


def read_pids(path: Path) -> list[int]:
    """The pids the workers wrote into `path` (rank<r>.pid) when they started."""
    pids = []
    for f in sorted(path.glob("rank*.pid")):
        try:
            pids.append(int(f.read_text().strip()))
        except ValueError:
            pass
    return pids


def read_results(path: Path) -> list[dict]:
    """The workers' results (rank<r>.json) in `path`, by rank."""
    out = []
    for f in sorted(path.glob("rank*.json")):
        try:
            out.append(json.loads(f.read_text()))
        except ValueError as exc:
            out.append({"rank": -1, "unreadable": f"{f.name}: {exc}"})
    return sorted(out, key=lambda r: r.get("rank", -1))


class RunningWorkers:
    """A launcher started in the background (see start_workers)."""

    def __init__(self, proc: subprocess.Popen, results_dir: tempfile.TemporaryDirectory,
                 timeout: float, started: float) -> None:
        self.proc = proc
        self._dir = results_dir
        self.path = Path(results_dir.name)
        self.timeout = timeout
        self.started = started

    def worker_pids(self) -> list[int]:
        return read_pids(self.path)

    def results(self) -> list[dict]:
        return read_results(self.path)

    def wait(self) -> CompletedRun:
        """Wait (bounded: the launcher's --timeout plus a margin), kill what is left, collect."""
        try:
            try:
                stdout, stderr = self.proc.communicate(timeout=self.timeout + 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                stdout, stderr = self.proc.communicate()
                stderr += "\n[test helper: the launcher outlived its --timeout + 30 s; killed]"
            pids = self.worker_pids()
            return CompletedRun(self.proc.returncode, stdout, stderr, self.results(), pids,
                                time.monotonic() - self.started)
        finally:
            self.close()

    def close(self) -> None:
        """Kill the launcher and every worker still running; remove the results."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()
        kill_processes(self.worker_pids())
        self._dir.cleanup()


def start_workers(script, nproc: int, args=(), timeout: float = 120.0, env=None,
                  launcher_args=()) -> RunningWorkers:
    """start_workers(script, nproc, args=(), timeout=120.0, env=None, launcher_args=()) -> RunningWorkers

    Start ``python -m cudalab.distributed.run --nproc-per-node nproc
    --timeout timeout [launcher_args] script args`` in the background.

    Parameters
    ----------
    script : str or Path
        A file of tests/dist_workers/ (a bare name is looked up there).
    env : mapping, optional
        The launcher's environment (default: ``worker_env()``); the results
        directory variable is added.
    """
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    results_dir = tempfile.TemporaryDirectory(prefix="cudalab-dist-")
    child_env = dict(worker_env() if env is None else env)
    child_env[RESULTS_VAR] = results_dir.name
    # Python's own output unbuffered, so a killed worker's last lines are not lost.
    child_env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "cudalab.distributed.run", "--nproc-per-node", str(nproc),
               "--timeout", str(timeout), "--grace-seconds", "3", *map(str, launcher_args),
               str(script), *map(str, args)]
    started = time.monotonic()
    proc = subprocess.Popen(command, env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return RunningWorkers(proc, results_dir, timeout, started)


def launch_workers(script, nproc: int, args=(), timeout: float = 120.0, env=None,
                   launcher_args=()) -> CompletedRun:
    """launch_workers(script, nproc, args=(), timeout=120.0, env=None, launcher_args=()) -> CompletedRun

    Run a worker script under the launcher and wait for it (see start_workers).
    Nothing it started is left running afterwards.
    """
    return start_workers(script, nproc, args, timeout, env, launcher_args).wait()


def run_ranks(script, world: int, args=(), timeout: float = 120.0, env=None, rank_env=None,
              launcher_vars: bool = True) -> CompletedRun:
    """run_ranks(script, world, args=(), timeout=120.0, env=None, rank_env=None, launcher_vars=True) -> CompletedRun

    Start `world` worker processes directly (no launcher: nobody stops the
    others when one fails), with torchrun's variables for one node and a free
    MASTER_PORT unless ``launcher_vars=False``; wait for all of them up to
    `timeout` seconds, kill whatever is left, collect their results.
    ``returncode`` is the first nonzero status (in rank order), -9 for a rank
    killed at the timeout; ``returncodes`` has every rank's.

    Parameters
    ----------
    env : mapping, optional
        The base environment (default ``worker_env()``).
    rank_env : callable, optional
        ``rank_env(rank) -> dict`` of variables for that rank (they win).
    """
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    results_dir = tempfile.TemporaryDirectory(prefix="cudalab-dist-")
    port = free_port()
    procs: list[subprocess.Popen] = []
    started = time.monotonic()
    try:
        for rank in range(world):
            child_env = dict(worker_env() if env is None else env)
            if launcher_vars:
                child_env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                                 LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                                 MASTER_PORT=str(port))
            child_env.update({k: str(v) for k, v in (rank_env(rank) if rank_env else {}).items()})
            child_env[RESULTS_VAR] = results_dir.name
            child_env["PYTHONUNBUFFERED"] = "1"
            procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)],
                                          env=child_env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        outs, errs, codes = [], [], []
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(0.1, started + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
                err += f"\n[test helper: rank {rank} still ran after {timeout} s; killed]"
            outs.append(f"--- rank {rank} ---\n{out}")
            errs.append(f"--- rank {rank} (status {p.returncode}) ---\n{err}")
            codes.append(p.returncode)
        path = Path(results_dir.name)
        pids = [p.pid for p in procs] + read_pids(path)
        return CompletedRun(next((c for c in codes if c != 0), 0), "\n".join(outs),
                            "\n".join(errs), read_results(path), sorted(set(pids)),
                            time.monotonic() - started, codes)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait()
        results_dir.cleanup()


def visible_gpu_ids() -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries this process may hand out ("0", "1", ... if unset)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip():
        return [str(i) for i in range(gpu_count())]
    return [v.strip() for v in value.split(",") if v.strip()]


def free_port() -> int:
    """A TCP port nobody listens on now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
