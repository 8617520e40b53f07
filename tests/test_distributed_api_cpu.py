"""CPU tier: cudalab.distributed's public API without a GPU (and without NCCL).

The names the package exports, NCCL's discovery and loading (tests that need
the library skip where it cannot load), ReduceOp, and the argument checks of
every public function. A collective needs a group: where no GPU is needed to
reach the check, a ProcessGroup around a stand-in communicator serves.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest

import cudalab
import cudalab.distributed as dist
from _distributed import worker_env
from _support import no_gpu_only
from cudalab import _core
from cudalab.distributed import group as group_module
from cudalab.distributed import library

SPEC_NAMES = {
    "DistributedError", "NcclError", "is_available", "nccl_version", "nccl_library",
    "LaunchEnv", "ProcessGroup", "ReduceOp", "Work", "init", "init_process_group", "destroy",
    "destroy_process_group", "is_initialized", "get_rank", "get_world_size", "get_local_rank",
    "get_local_world_size", "get_group", "all_reduce", "broadcast", "reduce", "all_gather",
    "reduce_scatter", "all_to_all", "send", "recv", "barrier", "can_access_peer",
    "enable_peer_access", "disable_peer_access", "DataParallel", "DistributedDataParallel",
    "Pipeline",
}


class FakeComm:
    """Stands in for _core._NcclComm: records calls, never touches a GPU."""

    aborted = False
    error = None

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.destroyed = 0

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, *args))
        return call

    def destroy(self):
        self.destroyed += 1


def fake_group(rank=0, world_size=2) -> dist.ProcessGroup:
    return dist.ProcessGroup(FakeComm(), rank=rank, world_size=world_size, local_rank=rank,
                             local_world_size=world_size, device=0, launcher="torchrun",
                             timeout=5.0, peers=[{"host": "h", "pid": 1}])


@pytest.fixture
def default_group(monkeypatch):
    """A fake default group (init() is never called: no GPU here)."""
    g = fake_group(rank=1, world_size=3)
    monkeypatch.setattr(group_module, "_default", g)
    return g


# ---- names ------------------------------------------------------------------------------------


def test_public_names():
    assert set(dist.__all__) == SPEC_NAMES
    for name in SPEC_NAMES:
        assert getattr(dist, name) is not None, name
    assert cudalab.distributed is dist
    assert dist.DistributedError is cudalab.DistributedError is _core.DistributedError
    assert issubclass(dist.NcclError, dist.DistributedError)
    assert issubclass(dist.DistributedError, cudalab.CudalabError)
    assert dist.init_process_group is dist.init
    assert dist.destroy_process_group is dist.destroy
    assert dist.can_access_peer is cudalab.can_access_peer


def test_importing_the_launcher_module_stays_out_of_the_package():
    # `python -m cudalab.distributed.run` must not find run.py already imported.
    code = "import sys, cudalab.distributed; print('cudalab.distributed.run' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=worker_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---- NCCL library -------------------------------------------------------------------------------


def test_is_available_is_a_bool_and_never_raises(monkeypatch):
    assert isinstance(dist.is_available(), bool)

    def broken(*args):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(_core, "_nccl_library", lambda: None)
    monkeypatch.setattr(_core, "_nccl_load", broken)
    assert dist.is_available() is False


def test_load_failure_says_what_to_install(monkeypatch):
    def missing(paths):
        raise dist.DistributedError("could not load NCCL; tried:\n  libnccl.so.2: not found")

    monkeypatch.setattr(_core, "_nccl_library", lambda: None)
    monkeypatch.setattr(_core, "_nccl_load", missing)
    assert dist.is_available() is False
    for fn in (dist.nccl_version, dist.nccl_library, library.load):
        with pytest.raises(dist.DistributedError) as info:
            fn()
        message = str(info.value)
        assert message.startswith("could not load NCCL; tried:"), message
        assert 'pip install "cudalab[distributed]"' in message
        assert "nvidia-nccl-cu13" in message and "CUDALAB_NCCL_LIBRARY" in message


def test_candidates_order(monkeypatch, tmp_path):
    lib = tmp_path / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CUDALAB_NCCL_LIBRARY", "/opt/mine/libnccl.so.2")
    found = library.candidates()
    assert found[0] == "/opt/mine/libnccl.so.2"
    assert str(lib / "libnccl.so.2") in found[1:]
    monkeypatch.delenv("CUDALAB_NCCL_LIBRARY")
    assert "/opt/mine/libnccl.so.2" not in library.candidates()


def test_candidates_pass_to_the_loader(monkeypatch):
    seen = []
    monkeypatch.setattr(_core, "_nccl_library", lambda: None)
    monkeypatch.setattr(_core, "_nccl_load", lambda paths: seen.append(paths) or "/x/lib.so")
    monkeypatch.setenv("CUDALAB_NCCL_LIBRARY", "/custom/libnccl.so.2")
    assert dist.nccl_library() == "/x/lib.so"
    assert seen[0][0] == "/custom/libnccl.so.2"


def test_loaded_library_is_returned_at_once(monkeypatch):
    monkeypatch.setattr(_core, "_nccl_library", lambda: "/already/libnccl.so.2")
    monkeypatch.setattr(_core, "_nccl_load", lambda paths: pytest.fail("loaded twice"))
    assert library.load() == "/already/libnccl.so.2"


@pytest.mark.parametrize("code, version", [(22809, (2, 28, 9)), (21903, (2, 19, 3)),
                                           (2708, (2, 7, 8)), (30000, (3, 0, 0))])
def test_decode_version(code, version):
    assert library.decode_version(code) == version


def test_real_nccl_when_it_loads():
    """Where NCCL is installed (not needed by CI): version and path of the real library."""
    if not dist.is_available():
        pytest.skip("NCCL cannot be loaded here")
    major, minor, patch = dist.nccl_version()
    assert major >= 2 and minor >= 0 and patch >= 0
    assert library.decode_version(_core._nccl_version()) == (major, minor, patch)
    path = dist.nccl_library()
    assert os.path.basename(path).startswith("libnccl") or os.path.exists(path), path
    unique_id = _core._nccl_unique_id()
    assert isinstance(unique_id, bytes) and len(unique_id) == 128


def test_wrong_explicit_library_falls_back_or_names_it():
    """CUDALAB_NCCL_LIBRARY naming no file: the next candidates are tried, and if none
    loads the error names the path (in a fresh process: NCCL loads once per process)."""
    code = ("import cudalab.distributed as d\n"
            "try:\n    print('loaded', d.nccl_library())\n"
            "except d.DistributedError as e:\n    print('error', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=worker_env(CUDALAB_NCCL_LIBRARY="/no/such/libnccl.so.2"),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("loaded"):
        assert "/no/such" not in out.stdout
    else:
        assert "/no/such/libnccl.so.2" in out.stdout, out.stdout
        assert "CUDALAB_NCCL_LIBRARY" in out.stdout


# ---- ReduceOp --------------------------------------------------------------------------------


def test_reduce_op_values():
    assert [int(op) for op in dist.ReduceOp] == [0, 1, 2, 3, 4]
    assert [op.name for op in dist.ReduceOp] == ["SUM", "PRODUCT", "MAX", "MIN", "AVG"]


@pytest.mark.parametrize("name, op", [("sum", "SUM"), ("prod", "PRODUCT"),
                                      ("product", "PRODUCT"), ("max", "MAX"), ("min", "MIN"),
                                      ("avg", "AVG"), ("SUM", "SUM"), (" Max ", "MAX")])
def test_reduce_op_from_name(name, op):
    assert dist.ReduceOp(name) is dist.ReduceOp[op]
    assert group_module._op_code(name, "f") == int(dist.ReduceOp[op])


@pytest.mark.parametrize("value, exc, match", [
    ("mean", ValueError, r"^f\(\) argument 'op': expected one of 'sum', 'prod', 'max', 'min', "
                         r"'avg', got 'mean'"),
    (5, ValueError, r"^f\(\) argument 'op': expected a ReduceOp \(0 to 4\), got 5"),
    (-1, ValueError, r"got -1"),
    (True, TypeError, r"^f\(\) argument 'op': expected a ReduceOp or its name, got bool"),
    (1.0, TypeError, r"got float"),
    (None, TypeError, r"got NoneType"),
])
def test_reduce_op_errors(value, exc, match):
    with pytest.raises(exc, match=match):
        group_module._op_code(value, "f")


def test_reduce_op_constructor_refuses_unknown_names():
    with pytest.raises(ValueError):
        dist.ReduceOp("mean")
    with pytest.raises(ValueError):
        dist.ReduceOp(7)


# ---- no group ------------------------------------------------------------------------------------


COLLECTIVE_CALLS = [
    ("all_reduce", lambda **kw: dist.all_reduce(object(), **kw)),
    ("broadcast", lambda **kw: dist.broadcast(object(), **kw)),
    ("reduce", lambda **kw: dist.reduce(object(), **kw)),
    ("all_gather", lambda **kw: dist.all_gather(object(), object(), **kw)),
    ("reduce_scatter", lambda **kw: dist.reduce_scatter(object(), object(), **kw)),
    ("all_to_all", lambda **kw: dist.all_to_all(object(), object(), **kw)),
    ("send", lambda **kw: dist.send(object(), 1, **kw)),
    ("recv", lambda **kw: dist.recv(object(), 1, **kw)),
    ("barrier", lambda **kw: dist.barrier(**kw)),
]


@pytest.mark.parametrize("func, call", COLLECTIVE_CALLS, ids=[c[0] for c in COLLECTIVE_CALLS])
def test_collectives_need_a_group(func, call):
    assert not dist.is_initialized()
    with pytest.raises(dist.DistributedError,
                       match=rf"^{func}\(\): the default process group is not initialized; "
                             r"call cudalab.distributed.init\(\) first"):
        call()


@pytest.mark.parametrize("func, call", COLLECTIVE_CALLS, ids=[c[0] for c in COLLECTIVE_CALLS])
def test_collectives_check_the_group_argument(func, call):
    with pytest.raises(TypeError, match=rf"^{func}\(\) argument 'group': expected a "
                                        r"ProcessGroup or None, got str"):
        call(group="world")


@pytest.mark.parametrize("func, call", COLLECTIVE_CALLS, ids=[c[0] for c in COLLECTIVE_CALLS])
def test_collectives_refuse_a_destroyed_group(func, call):
    g = fake_group()
    g.destroy()
    with pytest.raises(dist.DistributedError, match=rf"^{func}\(\): the process group was "
                                                    r"destroyed"):
        call(group=g)


@pytest.mark.parametrize("fn", [dist.get_rank, dist.get_world_size, dist.get_local_rank,
                                dist.get_local_world_size])
def test_queries_need_a_group(fn):
    with pytest.raises(dist.DistributedError, match=rf"^{fn.__name__}\(\): the default process "
                                                    "group is not initialized"):
        fn()
    with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\) argument 'group'"):
        fn(group=3)
    with pytest.raises(dist.DistributedError, match=r"^get_group\(\)"):
        dist.get_group()


def test_queries_of_the_default_group(default_group):
    assert dist.is_initialized()
    assert dist.get_group() is default_group
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank(),
            dist.get_local_world_size()) == (1, 3, 1, 3)
    other = fake_group(rank=0, world_size=2)
    assert (dist.get_rank(other), dist.get_world_size(group=other)) == (0, 2)


def test_destroy(default_group):
    comm = default_group.comm
    dist.destroy()
    assert not dist.is_initialized()
    assert comm.destroyed == 1 and default_group.comm is None
    dist.destroy()  # nothing left: not an error
    default_group.destroy()  # idempotent
    assert comm.destroyed == 1
    assert dist.get_rank(default_group) == 1  # its facts stay readable
    assert "destroyed" in repr(default_group)
    with pytest.raises(TypeError, match=r"^destroy\(\) argument 'group': expected a "
                                        r"ProcessGroup or None, got int"):
        dist.destroy(1)


def test_destroy_a_group_that_is_not_the_default(default_group):
    other = fake_group()
    dist.destroy(other)
    assert other.comm is None and dist.get_group() is default_group


def test_process_group_attributes():
    g = fake_group(rank=1, world_size=4)
    assert (g.rank, g.world_size, g.local_rank, g.local_world_size, g.device, g.backend,
            g.launcher, g.timeout) == (1, 4, 1, 4, 0, "nccl", "torchrun", 5.0)
    assert g.peers == ({"host": "h", "pid": 1},)
    assert repr(g) == ("ProcessGroup(rank=1, world_size=4, device=0, backend='nccl', "
                       "launcher='torchrun')")
    assert not g.aborted
    g.comm.aborted = True
    assert g.aborted


# ---- argument checks that need no array ----------------------------------------------------


@pytest.mark.parametrize("call, exc, match", [
    (lambda: dist.all_reduce(object(), "mean"), ValueError,
     r"^all_reduce\(\) argument 'op': expected one of"),
    (lambda: dist.all_reduce(object(), op=None), TypeError, r"^all_reduce\(\) argument 'op'"),
    (lambda: dist.all_reduce(object(), async_op=1), TypeError,
     r"^all_reduce\(\) argument 'async_op': expected a bool, got int"),
    (lambda: dist.all_reduce(object()), TypeError,
     r"^all_reduce\(\) argument 'array': expected a DeviceArray, got object"),
    (lambda: dist.broadcast(object(), 3), ValueError,
     r"^broadcast\(\) argument 'src': rank 3 is not in the group \(world size 3\)"),
    (lambda: dist.broadcast(object(), -1), ValueError, r"argument 'src': rank -1 is not in"),
    (lambda: dist.broadcast(object(), "0"), TypeError,
     r"^broadcast\(\) argument 'src': expected a rank \(int\), got str"),
    (lambda: dist.broadcast(object(), True), TypeError, r"argument 'src': .* got bool"),
    (lambda: dist.broadcast([1, 2]), TypeError,
     r"^broadcast\(\) argument 'array': expected a DeviceArray, got list"),
    (lambda: dist.reduce(object(), 5), ValueError, r"^reduce\(\) argument 'dst': rank 5"),
    (lambda: dist.reduce(object(), 0, "median"), ValueError, r"^reduce\(\) argument 'op'"),
    (lambda: dist.reduce(object(), 0, async_op=None), TypeError,
     r"^reduce\(\) argument 'async_op'"),
    (lambda: dist.all_gather(object(), object()), TypeError,
     r"^all_gather\(\) argument 'input': expected a DeviceArray, got object"),
    (lambda: dist.all_gather(object(), object(), async_op="yes"), TypeError,
     r"^all_gather\(\) argument 'async_op'"),
    (lambda: dist.reduce_scatter(object(), object(), "x"), ValueError,
     r"^reduce_scatter\(\) argument 'op'"),
    (lambda: dist.reduce_scatter(object(), object()), TypeError,
     r"^reduce_scatter\(\) argument 'output': expected a DeviceArray"),
    (lambda: dist.all_to_all(object(), object()), TypeError,
     r"^all_to_all\(\) argument 'output': expected a DeviceArray"),
    (lambda: dist.send(object(), 1), ValueError,
     r"^send\(\) argument 'dst': rank 1 is this rank; send and recv need another rank"),
    (lambda: dist.send(object(), 3), ValueError, r"^send\(\) argument 'dst': rank 3 is not in"),
    (lambda: dist.send(object(), 0), TypeError,
     r"^send\(\) argument 'array': expected a DeviceArray"),
    (lambda: dist.recv(object(), 1), ValueError, r"^recv\(\) argument 'src': rank 1 is this"),
    (lambda: dist.recv(object(), None), TypeError, r"^recv\(\) argument 'src': expected a rank"),
    (lambda: dist.recv(object(), 2), TypeError, r"^recv\(\) argument 'array'"),
])
def test_collective_argument_errors(default_group, call, exc, match):
    with pytest.raises(exc, match=match):
        call()
    assert default_group.comm.calls == []  # nothing reached the communicator


# ---- init() ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"backend": "gloo"}, ValueError,
     r"^init\(\) argument 'backend': cudalab.distributed runs on NCCL; expected 'nccl' or "
     r"None, got 'gloo'"),
    ({"backend": "cpu:gloo"}, ValueError, r"argument 'backend'"),
    ({"backend": 1}, TypeError, r"^init\(\) argument 'backend': expected a str or None"),
    ({"init_method": "file:///tmp/x"}, ValueError,
     r"^init\(\) argument 'init_method': only 'env://' \(the default\) and 'tcp://HOST:PORT'"),
    ({"init_method": "tcp://host"}, ValueError, r"expected 'tcp://HOST:PORT', got 'tcp://host'"),
    ({"init_method": "tcp://host:0"}, ValueError, r"expected 'tcp://HOST:PORT'"),
    ({"init_method": 5}, TypeError, r"^init\(\) argument 'init_method': expected a str"),
    ({"timeout": 0}, ValueError, r"^init\(\) argument 'timeout': must be positive and finite"),
    ({"timeout": -1.0}, ValueError, r"argument 'timeout'"),
    ({"timeout": float("inf")}, ValueError, r"argument 'timeout'"),
    ({"timeout": datetime.timedelta(0)}, ValueError, r"argument 'timeout'"),
    ({"timeout": "60"}, TypeError, r"^init\(\) argument 'timeout': expected seconds \(a "
                                   r"number\) or a datetime.timedelta, got str"),
    ({"timeout": True}, TypeError, r"argument 'timeout'"),
    ({"rank": 0}, ValueError, r"^init\(\) argument 'world_size': must be given with 'rank'"),
    ({"world_size": 2}, ValueError, r"^init\(\) argument 'rank': must be given with"),
    ({"rank": 2, "world_size": 2}, ValueError,
     r"^init\(\) argument 'rank': must be below world_size \(2\), got 2"),
    ({"rank": -2, "world_size": 2}, ValueError, r"^init\(\) argument 'rank': must be >= 0"),
    ({"rank": 0, "world_size": 0}, ValueError, r"^init\(\) argument 'world_size': must be >= 1"),
    ({"rank": "0", "world_size": 2}, TypeError, r"^init\(\) argument 'rank': expected an int"),
    ({"device": -1}, ValueError, r"^init\(\) argument 'device': must be >= 0, got -1"),
    ({"device": 1.0}, TypeError, r"^init\(\) argument 'device': expected an int"),
    ({"environ": [("RANK", "0")]}, TypeError, r"^init\(\) argument 'environ': expected a "
                                              r"mapping"),
    ({"environ": {"RANK": "x", "WORLD_SIZE": "2"}}, ValueError, r"^RANK='x': expected an "
                                                                r"integer"),
    ({"environ": {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}}, ValueError,
     r"^SLURM_LOCALID is not set"),
])
def test_init_argument_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        dist.init(**kwargs)
    assert not dist.is_initialized()


def test_init_twice(default_group):
    with pytest.raises(dist.DistributedError, match=r"^init\(\): the default process group is "
                                                    r"already initialized \(ProcessGroup\(rank=1"):
        dist.init(environ={})


@no_gpu_only
@pytest.mark.parametrize("kwargs", [
    {},
    {"backend": "nccl", "timeout": datetime.timedelta(seconds=30)},
    {"backend": "cuda:nccl", "init_method": "env://", "rank": -1, "world_size": -1},
    {"init_method": "tcp://127.0.0.1:29500", "rank": 0, "world_size": 1},
    {"environ": {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1"}},
])
def test_init_without_a_gpu(kwargs):
    """Valid arguments reach the device check: NoDeviceError, before any network or NCCL."""
    with pytest.raises(cudalab.NoDeviceError, match=r"^init\(\): no CUDA device is available"):
        dist.init(**kwargs, **({} if "environ" in kwargs else {"environ": {}}))
    assert not dist.is_initialized()


def test_init_method_and_explicit_ranks_shape_the_launch_env():
    env = group_module._launch_env({}, 1, 4, ("head", 1234), "init")
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 4, 1, 4)
    assert (env.master_addr, env.master_port, env.launcher) == ("head", 1234, "none")
    # The launcher's local facts stay when the world agrees with it.
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "n0"}
    env = group_module._launch_env(torchrun, 2, 4, None, "init")
    assert (env.rank, env.local_rank, env.local_world_size, env.master_addr) == (2, 1, 2, "n0")
    assert group_module._master_from_init_method("tcp://[::1]:80", "init") == ("::1", 80)


def test_torchrun_agent_store_without_torch():
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed: the agent store would be reached")
    launch = dist.env.from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29400"})
    with pytest.raises(dist.DistributedError, match=r"TORCHELASTIC_USE_AGENT_STORE=True says "
                                                    r"torchrun's agent serves MASTER_PORT "
                                                    r"\(29400\)"):
        group_module._torch_agent_store(launch, 1.0)


# ---- Work ------------------------------------------------------------------------------


class FakeEvent:
    def __init__(self, done):
        self.done = done
        self.synchronized = 0

    def query(self):
        return self.done

    def synchronize(self):
        self.synchronized += 1
        self.done = True


def test_work_completion_and_synchronize():
    ev = FakeEvent(False)
    work = dist.Work(ev, 0, keep=("tmp",))
    assert work.is_completed() is False
    work.synchronize()
    assert ev.synchronized == 1 and work.is_completed() is True
    assert repr(work) == "<Work on device 0>"


def test_ready_group_is_the_fast_paths_one_test(default_group):
    """A collective calls its communicator directly only for a blocking call on a live
    ProcessGroup with contiguous DeviceArrays; anything else takes the checked path."""
    ready = group_module._ready_group
    assert ready(None, False) is default_group
    other = fake_group()
    assert ready(other, False) is other
    assert ready(None, True) is None and ready(None, 0) is None
    assert ready("group", False) is None
    assert ready(None, False, object()) is None  # not a DeviceArray: the checks say why
    other._comm = None  # destroyed
    assert ready(other, False) is None
