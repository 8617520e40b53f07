"""CPU tier: cudalab.distributed.env reads torchrun, Slurm and MPI variables.

Every test passes its own mapping to ``from_environ``: nothing here reads or
changes this process's environment.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from cudalab.distributed import LaunchEnv
from cudalab.distributed.env import (
    DEFAULT_MASTER_PORT,
    expand_hostlist,
    expand_tasks_per_node,
    from_environ,
)


def torchrun(rank=1, world=4, local=1, local_world=2, **more):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
           "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": "node0", "MASTER_PORT": "29511"}
    env.update(more)
    return env


def slurm(procid=5, ntasks=8, localid=1, nodeid=1, **more):
    env = {"SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks),
           "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid),
           "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]",
           "SLURM_JOB_ID": "123456"}
    env.update(more)
    return env


def ompi(rank=3, size=4, local=1, local_size=2, **more):
    env = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
           "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
           "MASTER_ADDR": "10.0.0.1"}
    env.update(more)
    return env


def pmi(rank=2, size=3, local=2, local_size=3, **more):
    env = {"PMI_RANK": str(rank), "PMI_SIZE": str(size), "MPI_LOCALRANKID": str(local),
           "MPI_LOCALNRANKS": str(local_size)}
    env.update(more)
    return env


def drop(env, *names):
    return {k: v for k, v in env.items() if k not in names}


# ---- nothing set ---------------------------------------------------------------------------


def test_no_launcher_is_a_world_of_one():
    env = from_environ({})
    assert env == LaunchEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                            master_addr="127.0.0.1", master_port=DEFAULT_MASTER_PORT,
                            launcher="none", node_rank=0, nnodes=1)
    assert not env.is_distributed


def test_no_launcher_keeps_master_variables():
    env = from_environ({"MASTER_ADDR": " host1 ", "MASTER_PORT": "4000"})
    assert (env.master_addr, env.master_port, env.world_size) == ("host1", 4000, 1)


def test_launch_env_is_frozen():
    env = from_environ({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 3


def test_reads_os_environ_by_default(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    env = from_environ()
    assert (env.rank, env.world_size, env.launcher) == (1, 2, "torchrun")


# ---- torchrun -------------------------------------------------------------------------------


def test_torchrun_variables():
    env = from_environ(torchrun(GROUP_RANK="0", GROUP_WORLD_SIZE="2"))
    assert env == LaunchEnv(rank=1, world_size=4, local_rank=1, local_world_size=2,
                            master_addr="node0", master_port=29511, launcher="torchrun",
                            node_rank=0, nnodes=2)
    assert env.is_distributed


def test_torchrun_node_rank_and_nnodes_derived_without_group_variables():
    env = from_environ(torchrun(rank=3, world=4, local=1, local_world=2))
    assert (env.node_rank, env.nnodes) == (1, 2)
    env = from_environ(torchrun(rank=2, world=3, local=0, local_world=2))
    assert (env.node_rank, env.nnodes) == (1, 2)  # an uneven last node


def test_torchrun_by_hand_on_one_node_defaults_local_and_master():
    env = from_environ({"RANK": "1", "WORLD_SIZE": "2"})
    assert (env.local_rank, env.local_world_size) == (1, 2)
    assert (env.master_addr, env.master_port) == ("127.0.0.1", DEFAULT_MASTER_PORT)


def test_torchrun_wins_over_slurm_and_mpi():
    env = from_environ({**slurm(), **ompi(), **pmi(), **torchrun()})
    assert env.launcher == "torchrun"
    assert (env.rank, env.world_size) == (1, 4)


@pytest.mark.parametrize("name, value, match", [
    ("RANK", "one", r"RANK='one': expected an integer"),
    ("RANK", "", r"RANK='': expected an integer"),
    ("RANK", "-1", r"RANK='-1': must be >= 0"),
    ("RANK", "4", r"RANK='4': must be below WORLD_SIZE='4'"),
    ("RANK", "1.0", r"RANK='1.0': expected an integer"),
    ("WORLD_SIZE", "0", r"WORLD_SIZE='0': must be >= 1"),
    ("WORLD_SIZE", "4x", r"WORLD_SIZE='4x': expected an integer"),
    ("LOCAL_RANK", "2", r"LOCAL_RANK='2': must be below LOCAL_WORLD_SIZE='2'"),
    ("LOCAL_RANK", "-3", r"LOCAL_RANK='-3': must be >= 0"),
    ("LOCAL_WORLD_SIZE", "5", r"LOCAL_WORLD_SIZE='5': must be at most WORLD_SIZE='4'"),
    ("LOCAL_WORLD_SIZE", "0", r"LOCAL_WORLD_SIZE='0': must be >= 1"),
    ("MASTER_PORT", "http", r"MASTER_PORT='http': expected an integer"),
    ("MASTER_PORT", "0", r"MASTER_PORT='0': must be >= 1"),
    ("MASTER_PORT", "70000", r"MASTER_PORT='70000': a TCP port is at most 65535"),
    ("MASTER_ADDR", "", r"MASTER_ADDR='': expected a host name"),
    ("MASTER_ADDR", "a b", r"MASTER_ADDR='a b': expected a host name"),
    ("GROUP_RANK", "2", r"GROUP_RANK='2': must be below GROUP_WORLD_SIZE='2'"),
    ("GROUP_WORLD_SIZE", "zero", r"GROUP_WORLD_SIZE='zero': expected an integer"),
])
def test_torchrun_bad_values_name_variable_and_value(name, value, match):
    env = torchrun(GROUP_WORLD_SIZE="2", GROUP_RANK="0")
    env[name] = value
    with pytest.raises(ValueError, match=match):
        from_environ(env)


def test_torchrun_missing_world_size_or_rank():
    with pytest.raises(ValueError, match=r"WORLD_SIZE is not set, but RANK is"):
        from_environ({"RANK": "0"})
    with pytest.raises(ValueError, match=r"RANK is not set, but WORLD_SIZE is"):
        from_environ({"WORLD_SIZE": "2"})


def test_torchrun_several_nodes_need_local_rank_and_master_addr():
    with pytest.raises(ValueError, match=r"LOCAL_RANK is not set"):
        from_environ(drop(torchrun(), "LOCAL_RANK"))
    with pytest.raises(ValueError, match=r"MASTER_ADDR is not set: this torchrun job spans "
                                         r"several nodes"):
        from_environ(drop(torchrun(), "MASTER_ADDR"))


# ---- Slurm -------------------------------------------------------------------------------------


def test_slurm_variables():
    env = from_environ(slurm())
    assert env == LaunchEnv(rank=5, world_size=8, local_rank=1, local_world_size=4,
                            master_addr="gpu07", master_port=15000 + 123456 % 10000,
                            launcher="slurm", node_rank=1, nnodes=2)


def test_slurm_uneven_tasks_per_node():
    env = from_environ(slurm(procid=8, ntasks=9, localid=0, nodeid=2,
                             SLURM_STEP_TASKS_PER_NODE="4(x2),1"))
    assert (env.local_world_size, env.nnodes, env.node_rank) == (1, 3, 2)


def test_slurm_step_num_tasks_wins_over_the_job_count():
    env = from_environ(slurm(ntasks=16, SLURM_STEP_NUM_TASKS="8"))
    assert env.world_size == 8


def test_slurm_ntasks_per_node_single_number():
    env = from_environ(drop(slurm(SLURM_NTASKS_PER_NODE="4"), "SLURM_STEP_TASKS_PER_NODE"))
    assert (env.local_world_size, env.nnodes) == (4, 2)


def test_slurm_job_tasks_per_node_when_no_step_variable():
    env = from_environ(drop(slurm(SLURM_TASKS_PER_NODE="2,6"), "SLURM_STEP_TASKS_PER_NODE"))
    assert (env.local_world_size, env.nnodes) == (6, 2)


def test_slurm_without_tasks_per_node_divides_evenly():
    env = from_environ(drop(slurm(SLURM_NNODES="2"), "SLURM_STEP_TASKS_PER_NODE"))
    assert env.local_world_size == 4
    with pytest.raises(ValueError, match=r"SLURM_NTASKS=8 tasks do not divide evenly over 3"):
        from_environ(drop(slurm(SLURM_NNODES="3"), "SLURM_STEP_TASKS_PER_NODE"))


def test_slurm_master_from_master_addr_or_nodelists():
    assert from_environ(slurm(MASTER_ADDR="head")).master_addr == "head"
    env = drop(slurm(SLURM_JOB_NODELIST="a[3-4]"), "SLURM_STEP_NODELIST")
    assert from_environ(env).master_addr == "a3"
    assert from_environ(slurm(SLURM_JOB_NODELIST="zzz")).master_addr == "gpu07"  # step first


def test_slurm_port_from_master_port_or_job_id():
    assert from_environ(slurm(MASTER_PORT="6000")).master_port == 6000
    assert from_environ(slurm(SLURM_JOB_ID="20001")).master_port == 15001
    assert from_environ(drop(slurm(), "SLURM_JOB_ID")).master_port == DEFAULT_MASTER_PORT


def test_slurm_one_node_without_nodelist_uses_loopback():
    env = from_environ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"})
    assert (env.master_addr, env.local_world_size, env.nnodes) == ("127.0.0.1", 2, 1)


def test_slurm_several_nodes_without_any_master():
    env = drop(slurm(), "SLURM_STEP_NODELIST")
    with pytest.raises(ValueError, match=r"neither MASTER_ADDR nor SLURM_STEP_NODELIST"):
        from_environ(env)


@pytest.mark.parametrize("name, value, match", [
    ("SLURM_PROCID", "x", r"SLURM_PROCID='x': expected an integer"),
    ("SLURM_PROCID", "8", r"SLURM_PROCID='8': must be below SLURM_NTASKS='8'"),
    ("SLURM_NTASKS", "0", r"SLURM_NTASKS='0': must be >= 1"),
    ("SLURM_LOCALID", "4", r"SLURM_LOCALID='4': must be below the tasks on this node \(4\)"),
    ("SLURM_LOCALID", "", r"SLURM_LOCALID='': expected an integer"),
    ("SLURM_NODEID", "2", r"SLURM_NODEID='2': SLURM_STEP_TASKS_PER_NODE='4\(x2\)' describes "
                          r"only 2 nodes"),
    ("SLURM_NODEID", "-1", r"SLURM_NODEID='-1': must be >= 0"),
    ("SLURM_STEP_TASKS_PER_NODE", "4(x3)", r"SLURM_STEP_TASKS_PER_NODE='4\(x3\)' adds up to "
                                           r"12 tasks, but SLURM_NTASKS='8'"),
    ("SLURM_STEP_TASKS_PER_NODE", "4(2)", r"SLURM_STEP_TASKS_PER_NODE='4\(2\)': expected"),
    ("SLURM_STEP_TASKS_PER_NODE", "", r"SLURM_STEP_TASKS_PER_NODE='': expected"),
    ("SLURM_STEP_NODELIST", "gpu[08-07]", r"SLURM_STEP_NODELIST='gpu\[08-07\]': not a valid "
                                          r"hostlist \(the range '08-07' goes down\)"),
    ("SLURM_JOB_ID", "job", r"SLURM_JOB_ID='job': expected an integer"),
])
def test_slurm_bad_values_name_variable_and_value(name, value, match):
    env = slurm()
    env[name] = value
    with pytest.raises(ValueError, match=match):
        from_environ(env)


def test_slurm_missing_local_id():
    with pytest.raises(ValueError, match=r"SLURM_LOCALID is not set"):
        from_environ(drop(slurm(), "SLURM_LOCALID"))


# ---- MPI ---------------------------------------------------------------------------------------


def test_open_mpi_variables():
    env = from_environ(ompi())
    assert env == LaunchEnv(rank=3, world_size=4, local_rank=1, local_world_size=2,
                            master_addr="10.0.0.1", master_port=DEFAULT_MASTER_PORT,
                            launcher="mpi", node_rank=1, nnodes=2)


def test_pmi_hydra_variables_one_node_needs_no_master():
    env = from_environ(pmi())
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (2, 3, 2, 3)
    assert (env.launcher, env.master_addr, env.nnodes) == ("mpi", "127.0.0.1", 1)


def test_mpi_several_nodes_need_master_addr():
    with pytest.raises(ValueError, match=r"MASTER_ADDR is not set: this mpi job spans several "
                                         r"nodes \(WORLD_SIZE 4, 2 per node\)"):
        from_environ(drop(ompi(), "MASTER_ADDR"))


def test_mpi_wins_over_slurm():
    # mpirun inside an allocation: the SLURM_* variables describe the batch step.
    env = from_environ({**slurm(procid=0, ntasks=8), **ompi()})
    assert (env.launcher, env.rank) == ("mpi", 3)
    env = from_environ({**slurm(procid=0, ntasks=8), **pmi()})
    assert (env.launcher, env.rank) == ("mpi", 2)


def test_pmi_without_hydra_local_rank():
    # srun --mpi=pmi2 sets PMI_RANK too: Slurm's variables then say more.
    env = from_environ({**slurm(), "PMI_RANK": "5", "PMI_SIZE": "8"})
    assert env.launcher == "slurm"
    with pytest.raises(ValueError, match=r"MPI_LOCALRANKID is not set, but PMI_RANK is"):
        from_environ({"PMI_RANK": "0", "PMI_SIZE": "2"})


@pytest.mark.parametrize("name, value, match", [
    ("OMPI_COMM_WORLD_RANK", "r3", r"OMPI_COMM_WORLD_RANK='r3': expected an integer"),
    ("OMPI_COMM_WORLD_RANK", "4", r"OMPI_COMM_WORLD_RANK='4': must be below "
                                  r"OMPI_COMM_WORLD_SIZE='4'"),
    ("OMPI_COMM_WORLD_SIZE", "-2", r"OMPI_COMM_WORLD_SIZE='-2': must be >= 1"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "2", r"OMPI_COMM_WORLD_LOCAL_RANK='2': must be below "
                                        r"OMPI_COMM_WORLD_LOCAL_SIZE='2'"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "8", r"OMPI_COMM_WORLD_LOCAL_SIZE='8': must be at most "
                                        r"OMPI_COMM_WORLD_SIZE='4'"),
    ("MASTER_PORT", "99999", r"MASTER_PORT='99999': a TCP port is at most 65535"),
])
def test_mpi_bad_values_name_variable_and_value(name, value, match):
    env = ompi()
    env[name] = value
    with pytest.raises(ValueError, match=match):
        from_environ(env)


def test_mpi_missing_local_variables():
    with pytest.raises(ValueError, match=r"OMPI_COMM_WORLD_LOCAL_RANK is not set"):
        from_environ(drop(ompi(), "OMPI_COMM_WORLD_LOCAL_RANK"))
    with pytest.raises(ValueError, match=r"MPI_LOCALNRANKS is not set"):
        from_environ(drop(pmi(), "MPI_LOCALNRANKS"))


# ---- hostlists and tasks per node ------------------------------------------------------------


@pytest.mark.parametrize("value, hosts", [
    ("gpu01", ["gpu01"]),
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("node[1,3]-ib", ["node1-ib", "node3-ib"]),
    ("10.0.0.1", ["10.0.0.1"]),
    ("[1-2]x", ["1x", "2x"]),
])
def test_expand_hostlist(value, hosts):
    assert expand_hostlist(value) == hosts


@pytest.mark.parametrize("value, why", [
    ("", "an empty host name"),
    ("a,,b", "an empty host name"),
    ("gpu[01-04", "'\\[' without '\\]'"),
    ("gpu01-04]", "'\\]' without '\\['"),
    ("gpu[[1]]", "nested '\\['"),
    ("gpu[]", "an empty range"),
    ("gpu[1,]", "an empty range"),
    ("gpu[a-b]", "the range 'a-b' is not numeric"),
    ("gpu[1-]", "the range '1-' is not numeric"),
    ("gpu[5-2]", "the range '5-2' goes down"),
])
def test_expand_hostlist_errors_name_variable_and_value(value, why):
    with pytest.raises(ValueError) as info:
        expand_hostlist(value)
    message = str(info.value)
    assert message.startswith(f"SLURM_JOB_NODELIST={value!r}: not a valid hostlist ("), message
    assert re.search(why, message), message


def test_expand_hostlist_names_the_given_variable():
    with pytest.raises(ValueError, match=r"^SLURM_STEP_NODELIST='x\[': "):
        expand_hostlist("x[", "SLURM_STEP_NODELIST")


@pytest.mark.parametrize("value, counts", [
    ("4", [4]),
    ("4(x2)", [4, 4]),
    ("4(x2),2", [4, 4, 2]),
    ("1,2(x3), 3", [1, 2, 2, 2, 3]),
])
def test_expand_tasks_per_node(value, counts):
    assert expand_tasks_per_node(value) == counts


@pytest.mark.parametrize("value", ["", "x", "4(x)", "4(x0)", "0", "4(2)", "4,,2", "-1", "4(x2"])
def test_expand_tasks_per_node_errors(value):
    with pytest.raises(ValueError, match="^" + re.escape(f"SLURM_TASKS_PER_NODE={value!r}: ")):
        expand_tasks_per_node(value)
