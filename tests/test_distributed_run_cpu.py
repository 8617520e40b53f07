"""CPU tier: the launcher (cudalab.distributed.run) with small worker scripts.

The workers (written to tmp_path) do what the test tells each rank: exit 0,
exit 3, kill themselves with a signal, hang, ignore SIGTERM, leave a child
behind. Each records its pid and environment first, and a worker that is to
fail waits until every worker of the node has started, so the launcher
really has others to stop. Every test checks that nothing it started is
still running afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _distributed import kill_processes, leftover_processes, wait_gone, worker_env
from cudalab.distributed.run import TIMEOUT_STATUS, build_parser, launch, main

GRACE = 0.5
# Launcher overhead on top of what a test waits for: starting Python
# processes, polling, the grace period.
SLACK = 15.0

WORKER = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    from pathlib import Path

    out = Path(sys.argv[1])
    plan = json.loads(sys.argv[2])
    rank = int(os.environ["RANK"])
    action = plan.get(str(rank), plan.get("*", "exit0"))
    record = {"pid": os.getpid(), "argv": sys.argv[3:],
              "env": {k: os.environ.get(k) for k in (
                  "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "NCCL_NVLS_ENABLE", "CUDALAB_TEST_EXTRA",
                  "TORCHELASTIC_USE_AGENT_STORE")},
              "pgid": os.getpgid(0), "sid": os.getsid(0)}

    def on_signal(signum, frame):
        (out / f"signal{rank}").write_text(str(signum))
        sys.exit(0)

    if action == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if action == "record_signals":
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    if action == "grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        record["child"] = child.pid
    tmp = out / f".rank{rank}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(out / f"rank{rank}.json")

    # Fail only once every worker of this node runs.
    deadline = time.monotonic() + 30
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    while len(list(out.glob("rank*.json"))) < local and time.monotonic() < deadline:
        time.sleep(0.01)

    if action == "exit0":
        print(f"worker {rank} done", flush=True)
        sys.exit(0)
    if action == "exit3":
        sys.exit(3)
    if action == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if action == "grandchild":
        sys.exit(5)
    time.sleep(600)  # hang, ignore_term, record_signals
""")


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    return path, out


def records(out: Path) -> dict[int, dict]:
    found = {}
    for f in out.glob("rank*.json"):
        data = json.loads(f.read_text())
        found[int(data["env"]["RANK"])] = data
    return found


def pids_of(out: Path) -> list[int]:
    pids = []
    for r in records(out).values():
        pids.append(r["pid"])
        if "child" in r:
            pids.append(r["child"])
    return pids


def run_launch(worker, nproc, plan, *extra_args, **kwargs):
    """launch() the worker; returns (status, seconds, records); kills leftovers."""
    path, out = worker
    kwargs.setdefault("grace_seconds", GRACE)
    kwargs.setdefault("timeout", 60)
    t0 = time.monotonic()
    try:
        status = launch([str(path), str(out), json.dumps(plan), *extra_args], nproc, **kwargs)
        seconds = time.monotonic() - t0
        left = wait_gone(pids_of(out), 5.0)
        assert not left, f"processes left running after launch(): {left}"
        return status, seconds, records(out)
    finally:
        kill_processes(pids_of(out))


# ---- success --------------------------------------------------------------------------------


def test_success_sets_torchrun_variables_and_prints_nothing(worker, capfd):
    status, _, recs = run_launch(worker, 3, {}, "--flag", "x", master_port=29999)
    assert status == 0
    _, err = capfd.readouterr()
    assert err == "", err  # the launcher says nothing on success
    assert sorted(recs) == [0, 1, 2]
    for rank, rec in recs.items():
        assert rec["env"] == {
            "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29999", "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
            "CUDALAB_TEST_EXTRA": None, "TORCHELASTIC_USE_AGENT_STORE": None}
        assert rec["argv"] == ["--flag", "x"]
        # Each worker leads a session of its own (the launcher signals it as a whole).
        assert rec["sid"] == rec["pid"] == rec["pgid"]


def test_worker_output_passes_through(worker, capfd):
    # One worker: several writing to one captured file could interleave their bytes.
    status, _, _ = run_launch(worker, 1, {})
    assert status == 0
    assert capfd.readouterr() == ("worker 0 done\n", "")


def test_several_nodes_number_ranks_by_node(worker):
    status, _, recs = run_launch(worker, 2, {}, nnodes=3, node_rank=1, master_addr="head",
                                 master_port=1234)
    assert status == 0
    assert sorted(recs) == [2, 3]
    for rank, rec in recs.items():
        env = rec["env"]
        assert (env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == \
            ("6", str(rank - 2), "2")
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "3")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("head", "1234")


def test_environment_is_inherited_and_extended(worker, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # a torchrun around us
    status, _, recs = run_launch(worker, 2, {}, env={"CUDALAB_TEST_EXTRA": "yes"})
    assert status == 0
    for rec in recs.values():
        assert rec["env"]["NCCL_NVLS_ENABLE"] == "0"
        assert rec["env"]["CUDALAB_TEST_EXTRA"] == "yes"
        assert rec["env"]["TORCHELASTIC_USE_AGENT_STORE"] is None  # we serve MASTER_PORT


def test_free_port_picked_on_one_node(worker):
    status, _, recs = run_launch(worker, 2, {})
    assert status == 0
    ports = {rec["env"]["MASTER_PORT"] for rec in recs.values()}
    assert len(ports) == 1
    assert 0 < int(ports.pop()) < 65536


def test_module_form(tmp_path, capfd):
    pkg = tmp_path / "wpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(
        "import os, sys, pathlib\n"
        f"pathlib.Path({str(tmp_path)!r}, 'out' + os.environ['RANK']).write_text("
        "repr(sys.argv[1:]))\n")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path),
                                                      os.environ.get("PYTHONPATH")) if p)}
    status = launch(["-m", "wpkg.main", "a", "--b"], 2, env=env, timeout=60)
    assert status == 0, capfd.readouterr().err
    for rank in (0, 1):
        assert (tmp_path / f"out{rank}").read_text() == "['a', '--b']"


# ---- failures -------------------------------------------------------------------------------


def test_failed_worker_stops_the_others_and_gives_its_status(worker, capfd):
    status, seconds, recs = run_launch(worker, 3, {"1": "exit3", "*": "hang"})
    assert status == 3
    assert seconds < GRACE + SLACK
    _, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0] == (f"cudalab.distributed.run: rank 1 (local rank 1, pid {recs[1]['pid']}) "
                        "exited with status 3; stopped the other 2 running workers")


def test_worker_killed_by_a_signal(worker, capfd):
    status, _, recs = run_launch(worker, 2, {"0": "kill9", "*": "hang"})
    assert status == 128 + signal.SIGKILL
    _, err = capfd.readouterr()
    assert (f"rank 0 (local rank 0, pid {recs[0]['pid']}) was killed by SIGKILL "
            "(exit status 137); stopped the other 1 running worker") in err, err


def test_worker_crash_signal(worker, capfd):
    status, _, _ = run_launch(worker, 2, {"1": "segv", "*": "exit0"})
    assert status == 128 + signal.SIGSEGV
    assert "was killed by SIGSEGV" in capfd.readouterr().err


def test_worker_ignoring_sigterm_is_killed_after_the_grace_period(worker, capfd):
    grace = 1.0
    status, seconds, _ = run_launch(worker, 3, {"0": "exit3", "*": "ignore_term"},
                                    grace_seconds=grace)
    assert status == 3
    assert grace <= seconds < grace + SLACK  # SIGTERM ignored: SIGKILL came after the grace
    assert "stopped the other 2 running workers" in capfd.readouterr().err


def test_children_of_a_failed_worker_are_stopped(worker):
    # The worker exits 5 leaving a child that would sleep 600 s: its session goes too.
    status, _, recs = run_launch(worker, 2, {"0": "grandchild", "*": "hang"})
    assert status == 5
    assert "child" in recs[0]  # run_launch asserted that the child is gone


def test_timeout_stops_every_worker(worker, capfd):
    status, seconds, _ = run_launch(worker, 2, {"*": "hang"}, timeout=1.0)
    assert status == TIMEOUT_STATUS
    assert 1.0 <= seconds < 1.0 + SLACK
    assert capfd.readouterr().err.strip() == \
        "cudalab.distributed.run: timed out after 1 s; stopped 2 running workers"


def test_all_succeed_while_one_is_slow(worker):
    status, _, recs = run_launch(worker, 3, {"*": "exit0"})
    assert status == 0 and sorted(recs) == [0, 1, 2]


# ---- signals to the launcher (the command line, in a process of its own) -------------------


def start_cli(worker, nproc, plan, *launcher_args):
    path, out = worker
    cmd = [sys.executable, "-m", "cudalab.distributed.run", "--nproc-per-node", str(nproc),
           "--grace-seconds", str(GRACE), "--timeout", "60", *launcher_args, str(path), str(out),
           json.dumps(plan)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=worker_env())


def wait_for_workers(out: Path, n: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while len(records(out)) < n:
        assert time.monotonic() < deadline, f"only {len(records(out))} of {n} workers started"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_launcher_forwards_sigint_and_sigterm(worker, sig):
    path, out = worker
    proc = start_cli(worker, 2, {"*": "record_signals"})
    try:
        wait_for_workers(out, 2)
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=SLACK)
        assert proc.returncode == 128 + sig, err
        assert time.monotonic() - t0 < GRACE + SLACK
        for rank in (0, 1):
            got = out / f"signal{rank}"
            assert got.exists(), f"worker {rank} never received {sig.name}; launcher said {err}"
            assert int(got.read_text()) == sig
        assert f"received {sig.name}; forwarded it to 2 running workers" in err, err
        assert not wait_gone(pids_of(out), 5.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_processes(pids_of(out))


def test_cli_propagates_the_exit_status(worker):
    path, out = worker
    proc = start_cli(worker, 2, {"1": "exit3", "*": "hang"})
    try:
        stdout, err = proc.communicate(timeout=60)
        assert proc.returncode == 3, err
        assert err.count("\n") == 1 and "rank 1 (local rank 1" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_processes(pids_of(out))
    assert not leftover_processes(pids_of(out))


def test_cli_success_passes_script_arguments(worker, capfd):
    path, out = worker
    status = main(["--nproc_per_node", "2", "--master_port", "29123", "--grace-seconds", "0.5",
                   str(path), str(out), "{}", "--nnodes", "7", "-m"])
    assert status == 0
    recs = records(out)
    assert all(r["argv"] == ["--nnodes", "7", "-m"] for r in recs.values())
    assert all(r["env"]["MASTER_PORT"] == "29123" for r in recs.values())
    assert capfd.readouterr().err == ""


# ---- argument checks --------------------------------------------------------------------------


@pytest.mark.parametrize("args, match", [
    (["--nnodes", "2", "x.py"], "--master-port is required with --nnodes > 1"),
    (["--nnodes", "2", "--node-rank", "2", "--master-port", "1", "x.py"],
     "--node-rank 2 must be below --nnodes 2"),
    (["--nnodes", "1:2", "x.py"], "elastic ranges"),
    (["--nproc-per-node", "0", "x.py"], "must be >= 1, got 0"),
    (["--nproc-per-node", "two", "x.py"], "expected a number, 'gpu' or 'auto'"),
    (["--master-port", "70000", "x.py"], "--master-port 70000 is not a TCP port"),
    (["--master-port", "0", "x.py"], "must be >= 1"),
    (["--grace-seconds", "-1", "x.py"], "must be finite and >= 0"),
    (["--timeout", "0", "x.py"], "--timeout must be positive"),
    (["--timeout", "nan", "x.py"], "must be finite"),
    (["--standalone", "--nnodes", "2", "--master-port", "5", "x.py"], "--standalone runs one"),
    ([], "the following arguments are required: script"),
])
def test_cli_usage_errors(args, match, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert match in capsys.readouterr().err


def test_cli_gpu_count_without_gpus(capsys):
    import cudalab

    if cudalab.device_count() > 0:
        pytest.skip("checks the message without a GPU")
    with pytest.raises(SystemExit):
        main(["--nproc-per-node", "gpu", "x.py"])
    assert "'gpu': no GPU is visible" in capsys.readouterr().err


def test_parser_accepts_torchrun_spellings():
    args = build_parser().parse_args(["--nproc_per_node=4", "--node_rank", "1", "--nnodes=2",
                                      "--master_addr", "h", "--master_port", "9", "-m",
                                      "pkg.mod", "--lr", "1"])
    assert (args.nproc_per_node, args.node_rank, args.nnodes, args.master_addr,
            args.master_port, args.module, args.script, args.script_args) == \
        (4, 1, 2, "h", 9, True, "pkg.mod", ["--lr", "1"])


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"argv": []}, ValueError, r"argument 'argv': expected a script"),
    ({"argv": ["-m"]}, ValueError, r"argument 'argv': '-m' needs a module name"),
    ({"argv": [1]}, ValueError, r"argument 'argv'"),
    ({"nproc_per_node": 0}, ValueError, r"argument 'nproc_per_node': must be >= 1, got 0"),
    ({"nproc_per_node": 2.0}, TypeError, r"argument 'nproc_per_node': expected an int"),
    ({"nnodes": 0}, ValueError, r"argument 'nnodes': must be >= 1"),
    ({"node_rank": 1}, ValueError, r"argument 'node_rank': must be below nnodes \(1\), got 1"),
    ({"nnodes": 2, "node_rank": 1}, ValueError, r"argument 'master_port': required with several"),
    ({"master_port": 0}, ValueError, r"argument 'master_port': must be >= 1"),
    ({"master_port": 65536}, ValueError, r"argument 'master_port': must be <= 65535"),
    ({"master_addr": " "}, ValueError, r"argument 'master_addr': expected a host name"),
    ({"timeout": 0}, ValueError, r"argument 'timeout': must be finite and positive"),
    ({"timeout": "1"}, TypeError, r"argument 'timeout': expected seconds"),
    ({"grace_seconds": -1}, ValueError, r"argument 'grace_seconds': must be finite and >= 0"),
    ({"env": [("A", "1")]}, TypeError, r"argument 'env': expected a mapping"),
])
def test_launch_argument_errors(kwargs, exc, match):
    args = {"argv": ["x.py"], "nproc_per_node": 1, **kwargs}
    with pytest.raises(exc, match=r"^launch\(\) " + match):
        launch(args.pop("argv"), args.pop("nproc_per_node"), **args)
