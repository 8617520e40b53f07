"""GPU tier: cudalab.distributed on real GPUs, through the launcher.

Each multi-process test runs a script of tests/dist_workers/ under
``python -m cudalab.distributed.run`` (or directly, where the launcher would
stop the ranks before they show what they do on their own) and reads what
each rank reported. The collective checks report every check by name, so a
failure lists all that broke, not just the first. Nothing a test starts
outlives it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import cudalab
import cudalab.distributed as dist
from _distributed import (
    RESULTS_VAR,
    WORKERS,
    free_port,
    gpu_count,
    launch_workers,
    needs_gpus,
    read_results,
    run_ranks,
    start_workers,
    visible_gpu_ids,
    wait_gone,
    worker_env,
)

# Seconds on top of a watchdog or rendezvous timeout for a rank to notice, report
# and exit (the watchdog polls every 0.1 s and waits up to 2 s for a call in flight).
MARGIN = 8.0


def assert_checks_passed(run, world: int) -> None:
    """Every rank reported, and every one of its checks passed."""
    assert len(run.results) == world, (
        f"{len(run.results)} of {world} ranks reported\n{run.explain()}")
    problems = []
    for res in run.results:
        if res.get("init_error"):
            problems.append(f"rank {res['rank']}: init() failed: {res['init_error']}")
            continue
        failed = [c for c in res["checks"] if not c["ok"]]
        problems += [f"rank {res['rank']}: {c['name']}: {c['error']}" for c in failed]
        assert res["checks"], f"rank {res['rank']} ran no check"
    assert not problems, (f"{len(problems)} failed checks (first 40):\n"
                          + "\n".join(problems[:40]) + f"\n{run.explain()}")
    assert run.returncode == 0, run.explain()


def assert_nothing_left(run) -> None:
    left = wait_gone(run.pids, 10.0)
    assert not left, f"processes still running after the job: {left}"


def watchdog_lines(run) -> str:
    """What the C layer's watchdog and reaper said on stderr, for failure messages."""
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("cudalab.distributed: ")]
    return ("watchdog/reaper said:\n  " + "\n  ".join(lines)) if lines else \
        "the watchdog printed nothing (it never fired)"


def errors_of(res: dict) -> str:
    return "; ".join(f"{e['type']}: {e['message']}" for e in res.get("errors", []))


# ---- every collective and dtype ---------------------------------------------------------------


@needs_gpus(2)
def test_collectives_on_two_gpus():
    run = launch_workers("collectives.py", 2, ["--timeout", "60"], timeout=300)
    assert_checks_passed(run, 2)
    by_rank = run.by_rank()
    assert {r: res["device"] for r, res in by_rank.items()} == {0: 0, 1: 1}
    assert {res["launcher"] for res in by_rank.values()} == {"torchrun"}
    assert all(res["env"]["world_size"] == 2 for res in by_rank.values())
    assert_nothing_left(run)


@pytest.mark.gpu
def test_world_of_one_runs_every_collective():
    """No launcher variables: init() makes a world of 1 and every collective works."""
    run = run_ranks("collectives.py", 1, ["--timeout", "60"], timeout=240, launcher_vars=False)
    assert_checks_passed(run, 1)
    res = run.results[0]
    assert (res["world_size"], res["launcher"], res["device"]) == (1, "none", 0)


@needs_gpus(2)
def test_two_nodes_on_one_host_over_the_network_transport():
    """Two launchers (--nnodes 2), one GPU each, NCCL forced onto sockets over loopback."""
    port = free_port()
    gpus = visible_gpu_ids()
    runs = []
    try:
        for node in (0, 1):
            env = worker_env(CUDA_VISIBLE_DEVICES=gpus[node], NCCL_P2P_DISABLE="1",
                             NCCL_SHM_DISABLE="1", NCCL_SOCKET_IFNAME="lo")
            runs.append(start_workers(
                "collectives.py", 1, ["--timeout", "60"], timeout=300, env=env,
                launcher_args=["--nnodes", "2", "--node-rank", node, "--master-addr",
                               "127.0.0.1", "--master-port", port]))
        done = [r.wait() for r in runs]
    finally:
        for r in runs:
            r.close()
    for node, run in enumerate(done):
        assert run.returncode == 0 and len(run.results) == 1, f"node {node}: {run.explain()}"
        res = run.results[0]
        assert res["rank"] == node and res["world_size"] == 2, res
        assert (res["env"]["node_rank"], res["env"]["nnodes"]) == (node, 2)
        assert res["device"] == 0  # each node sees one GPU
        failed = [f"{c['name']}: {c['error']}" for c in res["checks"] if not c["ok"]]
        assert not failed, f"node {node}: {len(failed)} failed checks:\n" + "\n".join(failed[:40])
        assert_nothing_left(run)


@needs_gpus(2)
def test_scripts_run_under_torchrun_too():
    """The same worker under torchrun (its agent may hold MASTER_PORT: the store path)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch (torchrun) is not installed")
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", str(WORKERS / "collectives.py"), "--quick", "--timeout", "60"],
            env=worker_env(**{RESULTS_VAR: out}), capture_output=True, text=True, timeout=300)
        results = read_results(Path(out))
    failed = [f"rank {res['rank']}: {c['name']}: {c['error']}" for res in results
              for c in res.get("checks", []) if not c["ok"]]
    assert proc.returncode == 0 and len(results) == 2 and not failed, (
        f"torchrun status {proc.returncode}; {len(results)} reports; failed: {failed[:20]}; "
        f"init: {[r.get('init_error') for r in results]}\n{proc.stderr[-4000:]}")


# ---- failures ------------------------------------------------------------------------------------


@needs_gpus(2)
def test_rank_that_exits_early_under_the_launcher():
    run = launch_workers("failures.py", 2, ["exit_early", "--timeout", "10"], timeout=120)
    assert run.returncode == 3, run.explain()
    assert "rank 1 (local rank 1" in run.stderr and "exited with status 3" in run.stderr, \
        run.explain()
    assert "stopped the other 1 running worker" in run.stderr, run.explain()
    assert run.seconds < 60, run.explain()
    assert_nothing_left(run)


@needs_gpus(2)
def test_rank_that_exits_early_without_a_launcher():
    """Nobody stops rank 0: its own watchdog must end its wait with DistributedError."""
    timeout = 5.0
    run = run_ranks("failures.py", 2, ["exit_early", "--timeout", timeout], timeout=120)
    assert run.returncodes[1] == 3, run.explain()
    res = run.by_rank().get(0)
    assert res is not None, f"rank 0 never reported; {watchdog_lines(run)}\n{run.explain()}"
    assert any(e["distributed"] for e in res["errors"]), \
        f"rank 0 saw no DistributedError: {errors_of(res)}\n{run.explain()}"
    assert res["seconds"] < timeout + MARGIN, f"{res['seconds']:.1f} s: {errors_of(res)}"
    assert run.returncodes[0] != 0, run.explain()  # 1, or killed by the watchdog's reaper
    assert_nothing_left(run)


@needs_gpus(2)
def test_rank_that_hangs_in_a_collective_is_caught_by_the_watchdog():
    timeout = 5.0
    run = launch_workers("failures.py", 2, ["hang", "--timeout", timeout], timeout=120)
    res = run.by_rank().get(0)
    # No report: the main thread never left synchronize() (the abort did not end the
    # kernel) and the reaper ended the process; the watchdog's lines say how far it got.
    assert res is not None, f"rank 0 never reported; {watchdog_lines(run)}\n{run.explain()}"
    distributed = [e for e in res["errors"] if e["distributed"]]
    assert distributed, f"rank 0 saw no DistributedError: {errors_of(res)}\n{run.explain()}"
    message = distributed[0]["message"]
    assert "rank 0" in message and "all_reduce" in message, message
    assert timeout - 0.5 <= res["seconds"] < timeout + MARGIN, \
        f"the watchdog fired after {res['seconds']:.1f} s (timeout {timeout} s): {message}"
    assert res["aborted"] is True, res
    # Rank 0 failed first (status 1, or the watchdog's reaper's signal); rank 1 was stopped.
    assert run.returncode != 0 and "cudalab.distributed.run: rank 0 (local rank 0" in \
        run.stderr, run.explain()
    assert "stopped the other 1 running worker" in run.stderr, run.explain()
    assert_nothing_left(run)


@needs_gpus(1)
def test_rank_that_never_arrives():
    """Rank 1 never calls init(): rank 0's rendezvous fails in time, naming it."""
    timeout = 3.0
    run = launch_workers("failures.py", 2, ["never_arrives", "--timeout", timeout], timeout=120)
    res = run.by_rank().get(0)
    assert res is not None, run.explain()
    message = errors_of(res)
    assert "DistributedError" in message and "rank 1 never arrived" in message, message
    assert "127.0.0.1:" in message and f"waited {timeout:.1f} s" in message, message
    assert timeout <= res["seconds"] < timeout + MARGIN, f"{res['seconds']:.1f} s: {message}"
    assert run.returncode == 1, run.explain()
    assert_nothing_left(run)


@needs_gpus(1)
def test_two_ranks_on_one_gpu_are_refused():
    """Both ranks told LOCAL_RANK 0 (the global-rank-as-device bug in reverse)."""
    gpu = visible_gpu_ids()[0]
    run = run_ranks("collectives.py", 2, ["--timeout", "20"], timeout=120,
                    rank_env=lambda r: {"LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
                                        "CUDA_VISIBLE_DEVICES": gpu})
    errors = [res.get("init_error", "") for res in run.results]
    assert len(errors) == 2 and all("both use GPU" in e for e in errors), \
        f"{errors}\n{run.explain()}"
    assert all(code == 1 for code in run.returncodes), run.explain()


# ---- one process -----------------------------------------------------------------------


@pytest.fixture
def world_of_one():
    """init() in this process as a world of 1; destroyed afterwards."""
    group = dist.init(environ={}, timeout=60)
    try:
        yield group
    finally:
        dist.destroy()


@pytest.mark.gpu
def test_init_refuses_a_local_rank_without_a_gpu():
    n = gpu_count()
    environ = {"RANK": str(n), "WORLD_SIZE": str(n + 1), "LOCAL_RANK": str(n),
               "LOCAL_WORLD_SIZE": str(n + 1), "CUDA_VISIBLE_DEVICES": "shown"}
    with pytest.raises(dist.DistributedError,
                       match=rf"^init\(\): LOCAL_RANK is {n} but this process sees {n} GPU"):
        dist.init(environ=environ, timeout=5)
    assert not dist.is_initialized()


@pytest.mark.gpu
def test_group_facts_and_current_device(world_of_one):
    g = world_of_one
    assert (g.rank, g.world_size, g.device, g.launcher) == (0, 1, 0, "none")
    assert dist.get_group() is g and dist.is_initialized()
    assert cudalab.current_device() == g.device
    assert g.peers[0]["device_uuid"].startswith("GPU-")
    assert g.peers[0]["nccl_version"] == cudalab._core._nccl_version()
    with pytest.raises(dist.DistributedError, match="already initialized"):
        dist.init(environ={})


@pytest.mark.gpu
def test_synchronous_all_reduce_adds_little_python(world_of_one):
    """An 8-byte all_reduce in a host loop: the wrapper's cost over the C call."""
    comm = world_of_one.comm
    x = cudalab.ones((2,), dtype=np.float32)
    all_reduce = dist.all_reduce
    n = 300

    def direct():
        t0 = time.perf_counter()
        for _ in range(n):
            comm.all_reduce(x, x, 0)
        return time.perf_counter() - t0

    def wrapped():
        t0 = time.perf_counter()
        for _ in range(n):
            all_reduce(x)
        return time.perf_counter() - t0

    direct(), wrapped()  # warm up
    cudalab.synchronize()
    d, w = [], []
    for _ in range(7):
        d.append(direct())
        cudalab.synchronize()
        w.append(wrapped())
        cudalab.synchronize()
    overhead = (float(np.median(w)) - float(np.median(d))) / n
    per_call = float(np.median(w)) / n
    assert overhead < 3e-6, (f"all_reduce() adds {overhead * 1e6:.2f} us per call over the C "
                             f"call ({per_call * 1e6:.2f} us per call in all)")
    np.testing.assert_array_equal(x.get(), np.ones(2, np.float32))  # world of 1: sums stay 1


@pytest.mark.gpu
def test_collectives_of_a_destroyed_group_fail(world_of_one):
    g = world_of_one
    x = cudalab.ones((3,))
    dist.destroy()
    assert not dist.is_initialized()
    with pytest.raises(dist.DistributedError, match=r"not initialized"):
        dist.all_reduce(x)
    with pytest.raises(dist.DistributedError, match=r"destroyed"):
        dist.all_reduce(x, group=g)

