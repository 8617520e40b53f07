"""Where this process sits in a job: rank, world size, local rank, master address.

Launchers tell each process its place through environment variables; this
module reads the three families a job is likely to meet and turns them into
one :class:`LaunchEnv`:

* torchrun and ``python -m cudalab.distributed.run``: ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
  ``GROUP_RANK`` (the node's rank) and ``GROUP_WORLD_SIZE`` (the number of nodes);
* MPI launchers: Open MPI's ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` /
  ``_LOCAL_RANK`` / ``_LOCAL_SIZE``, and MPICH / Intel MPI (Hydra)'s ``PMI_RANK``,
  ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``;
* Slurm's ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS`` (``SLURM_STEP_NUM_TASKS``
  first), ``SLURM_LOCALID``, ``SLURM_NODEID``, the tasks per node
  (``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_TASKS_PER_NODE``,
  ``SLURM_NTASKS_PER_NODE``: "4(x2),2" forms) and the master from
  ``MASTER_ADDR`` or the first host of ``SLURM_STEP_NODELIST`` /
  ``SLURM_JOB_NODELIST`` ("gpu[01-04,07]" hostlists).

When several are present torchrun's variables win (``srun torchrun ...``),
then MPI's (an ``mpirun`` inside a Slurm allocation inherits the allocation's
``SLURM_*`` variables, which describe the batch step, not the MPI ranks), then
Slurm's. With none of them the process is a world of one.

Every malformed value raises ValueError naming the variable and its value;
nothing here touches the GPU or the network.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Literal

__all__ = ["DEFAULT_MASTER_PORT", "LaunchEnv", "expand_hostlist", "expand_tasks_per_node",
           "from_environ"]

# torchrun's default; also used by MPI jobs that do not set MASTER_PORT.
DEFAULT_MASTER_PORT = 29500
# Slurm jobs without MASTER_PORT get 15000 + job id % 10000: below Linux's
# ephemeral range (32768+), and two jobs sharing a node rarely collide.
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 10000

Launcher = Literal["torchrun", "slurm", "mpi", "none"]


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """This process's place in the job, as its launcher described it.

    Attributes
    ----------
    rank : int
        Global rank, ``0 <= rank < world_size``.
    world_size : int
        Number of processes in the job.
    local_rank : int
        Rank among the processes of this node; the GPU it should use.
    local_world_size : int
        Number of processes on this node.
    master_addr : str
        Host of rank 0 (where the rendezvous listens).
    master_port : int
        Port of the rendezvous on `master_addr`.
    launcher : {"torchrun", "slurm", "mpi", "none"}
        Which variables described the job ("none": no launcher, a world of 1).
    node_rank : int
        Index of this node, ``0 <= node_rank < nnodes``.
    nnodes : int
        Number of nodes.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: Launcher
    node_rank: int
    nnodes: int

    @property
    def is_distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1


def from_environ(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """from_environ(environ=None) -> LaunchEnv

    Read this process's place in the job from launcher variables.

    Parameters
    ----------
    environ : mapping of str to str, optional
        The variables to read; default ``os.environ``.

    Returns
    -------
    LaunchEnv

    Raises
    ------
    ValueError
        A variable that is not a number where one is needed, out of range,
        inconsistent with the others (a rank >= the world size, ...), a
        malformed hostlist or tasks-per-node string, or a job spanning several
        nodes without a way to find rank 0 (no ``MASTER_ADDR``). The message
        names the variable and its value.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        return _from_torchrun(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _from_open_mpi(env)
    if "PMI_RANK" in env and "MPI_LOCALRANKID" in env:
        return _from_pmi(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    if "PMI_RANK" in env:
        # A PMI rank without Hydra's local rank: nothing says which GPU is ours.
        return _from_pmi(env)
    return LaunchEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                     master_addr=env.get("MASTER_ADDR", "").strip() or "127.0.0.1",
                     master_port=_port(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
                     launcher="none", node_rank=0, nnodes=1)


# ---- the launcher families ----------------------------------------------------------


def _from_torchrun(env: Mapping[str, str]) -> LaunchEnv:
    rank = _required_int(env, "RANK", "WORLD_SIZE", minimum=0)
    world = _required_int(env, "WORLD_SIZE", "RANK", minimum=1)
    _check_below(env, "RANK", rank, "WORLD_SIZE", world)
    # Without LOCAL_* (RANK and WORLD_SIZE set by hand) the job is taken to be
    # one node; a job that spans nodes must say so (torchrun always does).
    local_world = _int(env, "LOCAL_WORLD_SIZE", world, minimum=1)
    _check_at_most(env, "LOCAL_WORLD_SIZE", local_world, "WORLD_SIZE", world)
    local_rank = _int(env, "LOCAL_RANK", rank if local_world == world else None, minimum=0)
    _check_below(env, "LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    nnodes = _int(env, "GROUP_WORLD_SIZE", -(-world // local_world), minimum=1)
    node_rank = _int(env, "GROUP_RANK", rank // local_world, minimum=0)
    _check_below(env, "GROUP_RANK", node_rank, "GROUP_WORLD_SIZE", nnodes)
    return LaunchEnv(rank=rank, world_size=world, local_rank=local_rank,
                     local_world_size=local_world,
                     master_addr=_master_addr(env, world, local_world, "torchrun"),
                     master_port=_port(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
                     launcher="torchrun", node_rank=node_rank, nnodes=nnodes)


def _from_open_mpi(env: Mapping[str, str]) -> LaunchEnv:
    return _mpi(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _from_pmi(env: Mapping[str, str]) -> LaunchEnv:
    return _mpi(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _mpi(env: Mapping[str, str], rank_var: str, size_var: str, local_var: str,
         local_size_var: str) -> LaunchEnv:
    rank = _required_int(env, rank_var, size_var, minimum=0)
    world = _required_int(env, size_var, rank_var, minimum=1)
    _check_below(env, rank_var, rank, size_var, world)
    local_rank = _required_int(env, local_var, rank_var, minimum=0)
    local_world = _required_int(env, local_size_var, local_var, minimum=1)
    _check_below(env, local_var, local_rank, local_size_var, local_world)
    _check_at_most(env, local_size_var, local_world, size_var, world)
    # MPI names no node index; ranks are placed node by node (mpirun's default "by slot").
    nnodes = -(-world // local_world)
    return LaunchEnv(rank=rank, world_size=world, local_rank=local_rank,
                     local_world_size=local_world,
                     master_addr=_master_addr(env, world, local_world, "mpi"),
                     master_port=_port(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
                     launcher="mpi", node_rank=min(rank // local_world, nnodes - 1),
                     nnodes=nnodes)


def _from_slurm(env: Mapping[str, str]) -> LaunchEnv:
    rank = _required_int(env, "SLURM_PROCID", "SLURM_NTASKS", minimum=0)
    size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    if size_var not in env and "SLURM_NPROCS" in env:
        size_var = "SLURM_NPROCS"
    world = _required_int(env, size_var, "SLURM_PROCID", minimum=1)
    _check_below(env, "SLURM_PROCID", rank, size_var, world)
    local_rank = _required_int(env, "SLURM_LOCALID", "SLURM_PROCID", minimum=0)
    node_rank = _int(env, "SLURM_NODEID", 0, minimum=0)

    per_node_var = next((v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                      "SLURM_NTASKS_PER_NODE") if v in env), None)
    if per_node_var is not None:
        per_node = expand_tasks_per_node(env[per_node_var], per_node_var)
        if per_node_var == "SLURM_NTASKS_PER_NODE" and len(per_node) == 1:
            # --ntasks-per-node=4: one number that holds for every node.
            per_node = [per_node[0]] * -(-world // per_node[0])
        elif sum(per_node) != world:
            raise ValueError(f"{per_node_var}={env[per_node_var]!r} adds up to "
                             f"{sum(per_node)} tasks, but {size_var}={env[size_var]!r}")
        if node_rank >= len(per_node):
            raise ValueError(f"SLURM_NODEID={env['SLURM_NODEID']!r}: {per_node_var}="
                             f"{env[per_node_var]!r} describes only {len(per_node)} nodes")
        local_world = per_node[node_rank]
        nnodes = len(per_node)
    else:
        nnodes = _int(env, "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env
                      else "SLURM_NNODES", 1, minimum=1)
        if world % nnodes:
            raise ValueError(
                f"SLURM_NTASKS={world} tasks do not divide evenly over {nnodes} nodes and "
                "neither SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set: cannot "
                "tell how many tasks run on this node")
        local_world = world // nnodes
        _check_below(env, "SLURM_NODEID", node_rank, "SLURM_NNODES", nnodes)
    _check_below(env, "SLURM_LOCALID", local_rank, "the tasks on this node", local_world,
                 what="")

    master = env.get("MASTER_ADDR", "").strip()
    if not master:
        for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            if env.get(var, "").strip():
                master = expand_hostlist(env[var], var)[0]
                break
    if not master:
        if local_world != world:
            raise ValueError(
                "this Slurm job spans several nodes but neither MASTER_ADDR nor "
                "SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is set: cannot find rank 0's host")
        master = "127.0.0.1"
    if "MASTER_PORT" in env:
        port = _port(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    elif "SLURM_JOB_ID" in env:
        job = _int(env, "SLURM_JOB_ID", 0, minimum=0)
        port = _SLURM_PORT_BASE + job % _SLURM_PORT_SPAN
    else:
        port = DEFAULT_MASTER_PORT
    return LaunchEnv(rank=rank, world_size=world, local_rank=local_rank,
                     local_world_size=local_world, master_addr=master, master_port=port,
                     launcher="slurm", node_rank=node_rank, nnodes=nnodes)


# ---- Slurm's compact forms ----------------------------------------------------------

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_tasks_per_node(value: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """expand_tasks_per_node(value, variable="SLURM_TASKS_PER_NODE") -> list[int]

    Slurm's tasks-per-node string as one count per node: ``"4(x2),2"`` is
    ``[4, 4, 2]``.

    Raises
    ------
    ValueError
        A malformed string, a zero count or repeat; names `variable` and `value`.
    """
    counts: list[int] = []
    text = value.strip()
    for item in text.split(",") if text else [""]:
        m = _TASKS_ITEM.match(item.strip())
        if m is None:
            raise ValueError(f"{variable}={value!r}: expected counts like '4(x2),2', "
                             f"got the item {item!r}")
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if count < 1 or repeat < 1:
            raise ValueError(f"{variable}={value!r}: counts and repeats must be >= 1")
        counts.extend([count] * repeat)
    return counts


def expand_hostlist(value: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """expand_hostlist(value, variable="SLURM_JOB_NODELIST") -> list[str]

    A Slurm hostlist as host names, in order: ``"gpu[01-03,07],login1"`` is
    ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]``. Ranges keep the low
    bound's zero padding; several bracket groups in one name expand to every
    combination (``"r[1-2]n[1-2]"``: r1n1, r1n2, r2n1, r2n2).

    Raises
    ------
    ValueError
        Unbalanced brackets, an empty name or range, a descending range,
        non-numeric bounds; names `variable` and `value`.
    """
    def bad(why: str) -> ValueError:
        return ValueError(f"{variable}={value!r}: not a valid hostlist ({why})")

    hosts: list[str] = []
    for name in _split_top_level(value, bad):
        name = name.strip()
        if not name:
            raise bad("an empty host name")
        expansions = [""]
        pos = 0
        while pos < len(name):
            open_at = name.find("[", pos)
            if open_at < 0:
                if "]" in name[pos:]:
                    raise bad("']' without '['")
                expansions = [e + name[pos:] for e in expansions]
                break
            close_at = name.find("]", open_at)
            if close_at < 0:
                raise bad("'[' without ']'")
            prefix = name[pos:open_at]
            if "]" in prefix:
                raise bad("']' without '['")
            items = _expand_ranges(name[open_at + 1:close_at], bad)
            expansions = [e + prefix + item for e in expansions for item in items]
            pos = close_at + 1
        hosts.extend(expansions)
    if not hosts:
        raise bad("no host")
    return hosts


def _split_top_level(value: str, bad) -> list[str]:
    """Split at the commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise bad("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise bad("']' without '['")
        elif ch == "," and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    if depth:
        raise bad("'[' without ']'")
    parts.append(value[start:])
    return parts


def _expand_ranges(body: str, bad) -> list[str]:
    items: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise bad("an empty range")
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise bad(f"the range {part!r} is not numeric")
        if not sep:
            items.append(low)
            continue
        lo, hi = int(low), int(high)
        if hi < lo:
            raise bad(f"the range {part!r} goes down")
        width = len(low)
        items.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return items


# ---- numbers --------------------------------------------------------------------------


def _parse_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env[name]
    text = raw.strip()
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r}: must be >= {minimum}")
    return value


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int) -> int:
    if name not in env:
        if default is None:
            raise ValueError(f"{name} is not set: it is needed when LOCAL_WORLD_SIZE is "
                             "smaller than WORLD_SIZE (a job on several nodes)")
        return default
    return _parse_int(env, name, minimum)


def _required_int(env: Mapping[str, str], name: str, companion: str, minimum: int) -> int:
    if name not in env:
        raise ValueError(f"{name} is not set, but {companion} is: a launcher sets both")
    return _parse_int(env, name, minimum)


def _check_below(env: Mapping[str, str], name: str, value: int, limit_name: str, limit: int,
                 what: str | None = None) -> None:
    if value >= limit:
        limit_text = f"{limit_name}={env[limit_name]!r}" if limit_name in env else \
            f"{what or ''} {limit_name} ({limit})".strip()
        raise ValueError(f"{name}={env.get(name, str(value))!r}: must be below {limit_text}")


def _check_at_most(env: Mapping[str, str], name: str, value: int, limit_name: str,
                   limit: int) -> None:
    if value > limit:
        raise ValueError(f"{name}={env[name]!r}: must be at most {limit_name}="
                         f"{env.get(limit_name, str(limit))!r}")


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    if name not in env:
        return default
    port = _parse_int(env, name, 1)
    if port > 65535:
        raise ValueError(f"{name}={env[name]!r}: a TCP port is at most 65535")
    return port


def _master_addr(env: Mapping[str, str], world: int, local_world: int, launcher: str) -> str:
    addr = env.get("MASTER_ADDR")
    if addr is not None:
        if not addr.strip() or any(c.isspace() for c in addr.strip()):
            raise ValueError(f"MASTER_ADDR={addr!r}: expected a host name or address")
        return addr.strip()
    if local_world < world:
        raise ValueError(
            f"MASTER_ADDR is not set: this {launcher} job spans several nodes "
            f"(WORLD_SIZE {world}, {local_world} per node), so every rank must be told "
            "rank 0's host (export MASTER_ADDR=<host of rank 0>)")
    return "127.0.0.1"
