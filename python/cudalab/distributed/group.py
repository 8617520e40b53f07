"""Process groups and the collectives on DeviceArrays.

``init()`` reads this process's place in the job (:mod:`.env`), picks the
GPU from the local rank, loads NCCL, meets the other ranks (:mod:`.rendezvous`:
rank 0's NCCL unique id goes to everyone) and makes the NCCL communicator,
kept as the default group. The collectives are shaped like
``torch.distributed``'s:

* synchronous (``async_op=False``, the default): enqueued on the current
  stream of the group's device; the host does not wait (as in torch);
* ``async_op=True``: enqueued on the group's side stream, which first waits
  for the current stream; the returned :class:`Work`'s ``wait()`` makes the
  current stream wait for it, ``synchronize()`` makes the host wait.

Arrays are updated in place (``all_reduce``, ``broadcast``, ``reduce``) or
written to ``output``; a non-contiguous array goes through a contiguous copy
(copied back for outputs). Reductions take a :class:`ReduceOp` or its name.

The synchronous path is kept thin: a host loop of 8-byte all_reduces costs
the C call plus a few cheap checks (the group, the op code, the array's type
and contiguity); every other case and every error goes to a general path
that checks each argument and names it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Union

import numpy as np

from .. import _core
from .._core import DeviceArray, Stream, current_stream
from ..devices import device as _device_ctx
from . import env as _env
from . import library
from . import rendezvous as _rdzv
from .._core import DistributedError

__all__ = [
    "DEFAULT_TIMEOUT",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "destroy",
    "destroy_process_group",
    "get_group",
    "get_local_rank",
    "get_local_world_size",
    "get_rank",
    "get_world_size",
    "init",
    "init_process_group",
    "is_initialized",
    "recv",
    "reduce",
    "reduce_scatter",
    "send",
]

# Seconds that bound the rendezvous and, per collective, the watchdog.
DEFAULT_TIMEOUT = 600.0


class ReduceOp(enum.IntEnum):
    """The reductions of all_reduce, reduce and reduce_scatter (NCCL's codes).

    The lower-case names are accepted wherever a ReduceOp is: ``"sum"``,
    ``"prod"`` or ``"product"``, ``"max"``, ``"min"``, ``"avg"``; so is
    ``ReduceOp("prod")``. On bool arrays sum and avg are a logical or, prod a
    logical and (as in torch); avg needs a floating dtype.
    """

    SUM = 0
    PRODUCT = 1
    MAX = 2
    MIN = 3
    AVG = 4

    @classmethod
    def _missing_(cls, value: object) -> ReduceOp | None:
        if isinstance(value, str):
            code = _OP_NAMES.get(value.strip().lower())
            if code is not None:
                return cls(code)
        return None


_OP_NAMES = {"sum": 0, "prod": 1, "product": 1, "max": 2, "min": 3, "avg": 4}
# The fast path's lookup: members (equal to their ints, so ints too) and names.
_OP_CODES: dict[Any, int] = {**{op: int(op) for op in ReduceOp}, **_OP_NAMES}
_OP_TYPES = frozenset({ReduceOp, int, str})


def _op_code(op: Any, func: str) -> int:
    """`op` as NCCL's code, or TypeError/ValueError naming `func`'s 'op'."""
    if isinstance(op, str):
        code = _OP_NAMES.get(op.strip().lower())
        if code is None:
            raise ValueError(f"{func}() argument 'op': expected one of 'sum', 'prod', 'max', "
                             f"'min', 'avg', got {op!r}")
        return code
    if isinstance(op, bool) or not isinstance(op, int):
        raise TypeError(f"{func}() argument 'op': expected a ReduceOp or its name, "
                        f"got {type(op).__name__}")
    if not 0 <= op <= 4:
        raise ValueError(f"{func}() argument 'op': expected a ReduceOp (0 to 4), got {int(op)}")
    return int(op)


class Work:
    """A collective enqueued with ``async_op=True`` on the group's side stream.

    Methods
    -------
    wait()
        The current stream waits for the collective (the host does not):
        work issued afterwards sees its result. Returns True.
    is_completed()
        Whether the GPU has finished it (never blocks).
    synchronize()
        The host waits until the GPU has finished it (GIL released).
    """

    __slots__ = ("_event", "_device", "_keep")

    def __init__(self, event: Any, device: int, keep: tuple = ()) -> None:
        self._event = event
        self._device = device
        self._keep = keep  # temporaries of a non-contiguous operand, alive until done

    def wait(self, timeout: Any = None) -> bool:
        """wait(timeout=None) -> True: the current stream waits for the collective."""
        current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        """is_completed() -> bool: finished on the GPU (never blocks)."""
        done = self._event.query()
        if done:
            self._keep = ()
        return done

    def synchronize(self) -> None:
        """synchronize(): the host waits for the collective."""
        self._event.synchronize()
        self._keep = ()

    def __repr__(self) -> str:
        return f"<Work on device {self._device}>"


class ProcessGroup:
    """A set of ranks, one GPU each, and the NCCL communicator between them.

    Made by :func:`init`; its attributes are read-only by convention.

    Attributes
    ----------
    rank, world_size : int
        This process's rank and the number of ranks.
    local_rank, local_world_size : int
        Rank on this node and processes on this node.
    device : int
        This rank's GPU (also made the current device by init()).
    backend : str
        "nccl".
    launcher : str
        "torchrun", "slurm", "mpi" or "none" (see :class:`LaunchEnv`).
    timeout : float
        Seconds of the rendezvous and of the watchdog for each collective.
    peers : tuple of dict
        Every rank's rendezvous payload (host, pid, device, device uuid...).
    """

    backend = "nccl"

    def __init__(self, comm: Any, *, rank: int, world_size: int, local_rank: int,
                 local_world_size: int, device: int, launcher: str, timeout: float,
                 peers: Sequence[Mapping[str, Any]] = ()) -> None:
        self._comm = comm
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.device = device
        self.launcher = launcher
        self.timeout = timeout
        self.peers = tuple(dict(p) for p in peers)
        self._side: Stream | None = None
        self._flag: DeviceArray | None = None

    @property
    def comm(self) -> Any:
        """The ``_NcclComm``; None once destroyed."""
        return self._comm

    @property
    def aborted(self) -> bool:
        """Whether the communicator was aborted (the watchdog, a peer's failure)."""
        comm = self._comm
        return comm is not None and bool(comm.aborted)

    def side_stream(self) -> Stream:
        """The stream that ``async_op=True`` collectives run on (made on first use)."""
        if self._side is None:
            self._side = Stream(device=self.device)
        return self._side

    def destroy(self) -> None:
        """Destroy the communicator (idempotent); the group can no longer be used."""
        comm, self._comm = self._comm, None
        self._side = self._flag = None
        if comm is not None:
            comm.destroy()

    def __repr__(self) -> str:
        state = "" if self._comm is not None else ", destroyed"
        return (f"ProcessGroup(rank={self.rank}, world_size={self.world_size}, "
                f"device={self.device}, backend='nccl', launcher={self.launcher!r}{state})")


_default: ProcessGroup | None = None
_generation = 0  # init() calls in this process: keys of a torchrun store rendezvous


# ---- the fast path: a blocking call on contiguous arrays of a live group -----------------


def _ready_group(group: Any, async_op: Any, *arrays: Any) -> ProcessGroup | None:
    """The group a collective may call its communicator on at once: a live
    ProcessGroup (the default for None), async_op False and every array a
    contiguous DeviceArray. None sends the call down its checked path, which
    raises the errors, makes the Work and copies other layouts. Exact class
    tests keep this path to a few attribute reads: a small message's
    per-call cost is what lessons/allreduce measures."""
    g = _default if group is None else group
    if async_op is not False or g.__class__ is not ProcessGroup or g._comm is None:
        return None
    for a in arrays:
        if a.__class__ is not DeviceArray or not a.is_contiguous:
            return None
    return g


# ---- argument checks (the general path) -----------------------------------------------


def _group(group: Any, func: str, need_comm: bool = True) -> ProcessGroup:
    if group is None:
        g = _default
        if g is None:
            raise DistributedError(
                f"{func}(): the default process group is not initialized; call "
                "cudalab.distributed.init() first (start the script with "
                "`python -m cudalab.distributed.run` or torchrun)")
    elif isinstance(group, ProcessGroup):
        g = group
    else:
        raise TypeError(f"{func}() argument 'group': expected a ProcessGroup or None, "
                        f"got {type(group).__name__}")
    if need_comm and g._comm is None:
        raise DistributedError(f"{func}(): the process group was destroyed")
    return g


def _array(value: Any, func: str, param: str) -> DeviceArray:
    if not isinstance(value, DeviceArray):
        raise TypeError(f"{func}() argument '{param}': expected a DeviceArray, "
                        f"got {type(value).__name__}")
    return value


def _array_list(value: Any, func: str, param: str, g: ProcessGroup,
                like: DeviceArray, like_param: str) -> list[DeviceArray]:
    """A list/tuple of world_size arrays, each of `like`'s shape and dtype."""
    if len(value) != g.world_size:
        raise ValueError(f"{func}() argument '{param}': expected {g.world_size} arrays "
                         f"(the world size), got {len(value)}")
    arrays = []
    for i, a in enumerate(value):
        if not isinstance(a, DeviceArray):
            raise TypeError(f"{func}() argument '{param}': item {i} is a "
                            f"{type(a).__name__}, not a DeviceArray")
        if a.shape != like.shape or a.dtype != like.dtype:
            raise ValueError(f"{func}() argument '{param}': item {i} has shape {a.shape} and "
                             f"dtype {a.dtype}, but '{like_param}' has {like.shape} and "
                             f"{like.dtype}")
        arrays.append(a)
    return arrays


def _rank_arg(value: Any, func: str, param: str, g: ProcessGroup, not_self: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{func}() argument '{param}': expected a rank (int), "
                        f"got {type(value).__name__}")
    value = int(value)
    if not 0 <= value < g.world_size:
        raise ValueError(f"{func}() argument '{param}': rank {value} is not in the group "
                         f"(world size {g.world_size})")
    if not_self and value == g.rank:
        raise ValueError(f"{func}() argument '{param}': rank {value} is this rank; "
                         "send and recv need another rank")
    return value


def _async_arg(value: Any, func: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{func}() argument 'async_op': expected a bool, "
                        f"got {type(value).__name__}")
    return value


def _empty(g: ProcessGroup, shape: tuple[int, ...], dtype: Any) -> DeviceArray:
    with _device_ctx(g.device):
        return _core.empty(shape, dtype=dtype)


def _contiguous(a: DeviceArray) -> DeviceArray:
    return a if a.is_contiguous else _core.ascontiguousarray(a)


def _issue(g: ProcessGroup, async_op: bool, body: Callable[[], tuple]) -> Work | None:
    """Run `body` (which enqueues on the current stream) now, or on the side stream.

    `body` returns the temporaries it made, kept by the Work until it is done.
    """
    if not async_op:
        body()
        return None
    side = g.side_stream()
    side.wait_stream(current_stream(g.device))
    with side:
        keep = body()
        event = side.record_event()
    return Work(event, g.device, keep)


# ---- collectives -----------------------------------------------------------------------


def all_reduce(array: DeviceArray, op: Any = ReduceOp.SUM, *, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """all_reduce(array, op=ReduceOp.SUM, *, group=None, async_op=False) -> Work or None

    Reduce `array` over every rank, in place: afterwards every rank holds
    ``op(array of rank 0, ..., array of rank n-1)``.

    Parameters
    ----------
    array : DeviceArray
        On the group's device; any dtype (bool: sum/avg is a logical or,
        prod a logical and). Non-contiguous: through a contiguous copy.
    op : ReduceOp or str
        "sum" (default), "prod", "max", "min" or "avg" (floating dtypes).
    group : ProcessGroup, optional
        Default: the group made by init().
    async_op : bool
        Enqueue on the group's side stream and return a :class:`Work`.

    Returns
    -------
    Work or None
        None for the synchronous form (enqueued on the current stream).

    Raises
    ------
    TypeError, ValueError
        A bad argument (the array's device, dtype and layout are checked by
        the C layer).
    DistributedError
        No group, a destroyed or aborted one (the watchdog's error).
    """
    code = _OP_CODES.get(op) if op.__class__ in _OP_TYPES else None
    g = _ready_group(group, async_op, array) if code is not None else None
    if g is not None:
        g._comm.all_reduce(array, array, code)
        return None
    return _all_reduce(array, op, group, async_op)


def _all_reduce(array, op, group, async_op):
    func = "all_reduce"
    g = _group(group, func)
    code = _op_code(op, func)
    async_op = _async_arg(async_op, func)
    _array(array, func, "array")
    comm = g._comm

    def body():
        if array.is_contiguous:
            comm.all_reduce(array, array, code)
            return ()
        tmp = _core.ascontiguousarray(array)
        comm.all_reduce(tmp, tmp, code)
        _core.copyto(array, tmp)
        return (tmp,)

    return _issue(g, async_op, body)


def broadcast(array: DeviceArray, src: int = 0, *, group: ProcessGroup | None = None,
              async_op: bool = False) -> Work | None:
    """broadcast(array, src=0, *, group=None, async_op=False) -> Work or None

    Copy rank `src`'s `array` into `array` on every rank (in place).

    Parameters
    ----------
    array : DeviceArray
        Same shape and dtype on every rank.
    src : int
        The rank whose values are sent.
    group, async_op
        As for :func:`all_reduce`.
    """
    g = _ready_group(group, async_op, array)
    if g is not None and src.__class__ is int and 0 <= src < g.world_size:
        g._comm.broadcast(array, array, src)
        return None
    return _broadcast(array, src, group, async_op)


def _broadcast(array, src, group, async_op):
    func = "broadcast"
    g = _group(group, func)
    src = _rank_arg(src, func, "src", g)
    async_op = _async_arg(async_op, func)
    _array(array, func, "array")
    comm = g._comm

    def body():
        if array.is_contiguous:
            comm.broadcast(array, array, src)
            return ()
        tmp = _core.ascontiguousarray(array)
        comm.broadcast(tmp, tmp, src)
        if g.rank != src:
            _core.copyto(array, tmp)
        return (tmp,)

    return _issue(g, async_op, body)


def reduce(array: DeviceArray, dst: int = 0, op: Any = ReduceOp.SUM, *,
           group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """reduce(array, dst=0, op=ReduceOp.SUM, *, group=None, async_op=False) -> Work or None

    Reduce `array` over every rank into rank `dst`'s `array` (in place);
    the other ranks' arrays are left as they were.

    Parameters
    ----------
    array : DeviceArray
    dst : int
        The rank that receives the result.
    op, group, async_op
        As for :func:`all_reduce`.
    """
    code = _OP_CODES.get(op) if op.__class__ in _OP_TYPES else None
    g = _ready_group(group, async_op, array) if code is not None else None
    if g is not None and dst.__class__ is int and 0 <= dst < g.world_size:
        g._comm.reduce(array, array, code, dst)
        return None
    return _reduce(array, dst, op, group, async_op)


def _reduce(array, dst, op, group, async_op):
    func = "reduce"
    g = _group(group, func)
    dst = _rank_arg(dst, func, "dst", g)
    code = _op_code(op, func)
    async_op = _async_arg(async_op, func)
    _array(array, func, "array")
    comm = g._comm

    def body():
        if array.is_contiguous:
            comm.reduce(array, array, code, dst)
            return ()
        tmp = _core.ascontiguousarray(array)
        comm.reduce(tmp, tmp, code, dst)
        if g.rank == dst:
            _core.copyto(array, tmp)
        return (tmp,)

    return _issue(g, async_op, body)


def all_gather(output: DeviceArray | Sequence[DeviceArray], input: DeviceArray, *,
               group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """all_gather(output, input, *, group=None, async_op=False) -> Work or None

    Gather every rank's `input` into `output` on every rank, in rank order.

    Parameters
    ----------
    output : DeviceArray or list of DeviceArray
        One array of ``world_size * input.size`` elements (for example of
        shape ``(world_size, *input.shape)``: block r comes from rank r), or
        a list of `world_size` arrays shaped like `input`.
    input : DeviceArray
        This rank's block.
    group, async_op
        As for :func:`all_reduce`.
    """
    g = _ready_group(group, async_op, output, input)
    if g is not None:
        g._comm.all_gather(input, output)
        return None
    return _all_gather(output, input, group, async_op)


def _all_gather(output, input, group, async_op):
    func = "all_gather"
    g = _group(group, func)
    async_op = _async_arg(async_op, func)
    _array(input, func, "input")
    outputs = None
    if isinstance(output, (list, tuple)):
        outputs = _array_list(output, func, "output", g, input, "input")
    else:
        _array(output, func, "output")
    comm = g._comm

    def body():
        src = _contiguous(input)
        if outputs is not None:
            tmp = _empty(g, (g.world_size, *input.shape), input.dtype)
            comm.all_gather(src, tmp)
            for r, out in enumerate(outputs):
                _core.copyto(out, tmp[r])
            return (src, tmp)
        if output.is_contiguous:
            comm.all_gather(src, output)
            return (src,)
        tmp = _core.empty_like(output)
        comm.all_gather(src, tmp)
        _core.copyto(output, tmp)
        return (src, tmp)

    return _issue(g, async_op, body)


def reduce_scatter(output: DeviceArray, input: DeviceArray | Sequence[DeviceArray],
                   op: Any = ReduceOp.SUM, *, group: ProcessGroup | None = None,
                   async_op: bool = False) -> Work | None:
    """reduce_scatter(output, input, op=ReduceOp.SUM, *, group=None, async_op=False) -> Work or None

    Reduce `input` over every rank and give rank r block r of the result.

    Parameters
    ----------
    output : DeviceArray
        This rank's block of the result.
    input : DeviceArray or list of DeviceArray
        One array of ``world_size * output.size`` elements (block r goes to
        rank r), or a list of `world_size` arrays shaped like `output`.
    op, group, async_op
        As for :func:`all_reduce`.
    """
    code = _OP_CODES.get(op) if op.__class__ in _OP_TYPES else None
    g = _ready_group(group, async_op, output, input) if code is not None else None
    if g is not None:
        g._comm.reduce_scatter(input, output, code)
        return None
    return _reduce_scatter(output, input, op, group, async_op)


def _reduce_scatter(output, input, op, group, async_op):
    func = "reduce_scatter"
    g = _group(group, func)
    code = _op_code(op, func)
    async_op = _async_arg(async_op, func)
    _array(output, func, "output")
    inputs = None
    if isinstance(input, (list, tuple)):
        inputs = _array_list(input, func, "input", g, output, "output")
    else:
        _array(input, func, "input")
    comm = g._comm

    def body():
        if inputs is not None:
            src = _empty(g, (g.world_size, *output.shape), output.dtype)
            for r, a in enumerate(inputs):
                _core.copyto(src[r], a)
        else:
            src = _contiguous(input)
        if output.is_contiguous:
            comm.reduce_scatter(src, output, code)
            return (src,)
        tmp = _core.empty_like(output)
        comm.reduce_scatter(src, tmp, code)
        _core.copyto(output, tmp)
        return (src, tmp)

    return _issue(g, async_op, body)


def all_to_all(output: DeviceArray, input: DeviceArray, *, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """all_to_all(output, input, *, group=None, async_op=False) -> Work or None

    Exchange blocks: block r of this rank's `input` goes to rank r, and
    block s of `output` comes from rank s. Both have the same number of
    elements, divisible by the world size (shape ``(world_size, ...)`` reads
    naturally).

    Parameters
    ----------
    output, input : DeviceArray
    group, async_op
        As for :func:`all_reduce`.
    """
    g = _ready_group(group, async_op, output, input)
    if g is not None:
        g._comm.all_to_all(input, output)
        return None
    return _all_to_all(output, input, group, async_op)


def _all_to_all(output, input, group, async_op):
    func = "all_to_all"
    g = _group(group, func)
    async_op = _async_arg(async_op, func)
    _array(output, func, "output")
    _array(input, func, "input")
    comm = g._comm

    def body():
        src = _contiguous(input)
        if output.is_contiguous:
            comm.all_to_all(src, output)
            return (src,)
        tmp = _core.empty_like(output)
        comm.all_to_all(src, tmp)
        _core.copyto(output, tmp)
        return (src, tmp)

    return _issue(g, async_op, body)


def send(array: DeviceArray, dst: int, *, group: ProcessGroup | None = None) -> None:
    """send(array, dst, *, group=None)

    Send `array` to rank `dst` on the current stream; rank `dst` must
    :func:`recv` an array of the same size and dtype. Between two ranks that
    both send and receive, order the calls so one sends first while the
    other receives first.
    """
    g = _ready_group(group, False, array)
    if g is not None and dst.__class__ is int and 0 <= dst < g.world_size and dst != g.rank:
        g._comm.send(array, dst)
        return None
    func = "send"
    g = _group(group, func)
    dst = _rank_arg(dst, func, "dst", g, not_self=True)
    _array(array, func, "array")
    g._comm.send(_contiguous(array), dst)
    return None


def recv(array: DeviceArray, src: int, *, group: ProcessGroup | None = None) -> None:
    """recv(array, src, *, group=None)

    Receive into `array` what rank `src` sends, on the current stream.
    """
    g = _ready_group(group, False, array)
    if g is not None and src.__class__ is int and 0 <= src < g.world_size and src != g.rank:
        g._comm.recv(array, src)
        return None
    func = "recv"
    g = _group(group, func)
    src = _rank_arg(src, func, "src", g, not_self=True)
    _array(array, func, "array")
    if array.is_contiguous:
        g._comm.recv(array, src)
    else:
        tmp = _core.empty_like(array)
        g._comm.recv(tmp, src)
        _core.copyto(array, tmp)
    return None


def barrier(*, group: ProcessGroup | None = None) -> None:
    """barrier(*, group=None)

    Wait until every rank has reached the barrier: a one-element all_reduce
    on the current stream, then the host waits for that stream. A rank that
    never arrives makes the watchdog abort after the group's timeout
    (DistributedError).
    """
    g = _group(group, "barrier")
    flag = g._flag
    if flag is None:
        with _device_ctx(g.device):
            flag = g._flag = _core.zeros((1,), dtype=np.uint8)
    g._comm.all_reduce(flag, flag, 0)
    current_stream(g.device).synchronize()


# ---- the default group -------------------------------------------------------------------


def _timeout_seconds(value: Any, func: str) -> float:
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{func}() argument 'timeout': expected seconds (a number) or a "
                        f"datetime.timedelta, got {type(value).__name__}")
    else:
        seconds = float(value)
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{func}() argument 'timeout': must be positive and finite, "
                         f"got {seconds} s")
    return seconds


def _optional_int(value: Any, func: str, param: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{func}() argument '{param}': expected an int or None, "
                        f"got {type(value).__name__}")
    if value < minimum:
        if value == -1 and param in ("rank", "world_size"):
            return None  # torch's "not given"
        raise ValueError(f"{func}() argument '{param}': must be >= {minimum}, got {value}")
    return int(value)


def _master_from_init_method(init_method: Any, func: str) -> tuple[str, int] | None:
    if init_method is None or init_method == "env://":
        return None
    if not isinstance(init_method, str):
        raise TypeError(f"{func}() argument 'init_method': expected a str or None, "
                        f"got {type(init_method).__name__}")
    if init_method.startswith("tcp://"):
        host, sep, port = init_method[len("tcp://"):].rstrip("/").rpartition(":")
        host = host.strip("[]")
        if sep and host and port.isdigit() and 0 < int(port) <= 65535:
            return host, int(port)
        raise ValueError(f"{func}() argument 'init_method': expected 'tcp://HOST:PORT', "
                         f"got {init_method!r}")
    raise ValueError(f"{func}() argument 'init_method': only 'env://' (the default) and "
                     f"'tcp://HOST:PORT' are supported, got {init_method!r}")


def _check_backend(backend: Any, func: str) -> None:
    if backend is None:
        return
    if not isinstance(backend, str):
        raise TypeError(f"{func}() argument 'backend': expected a str or None, "
                        f"got {type(backend).__name__}")
    # torch's forms: "nccl", "cuda:nccl", "cpu:gloo,cuda:nccl" (only the CUDA part matters).
    parts = [p.strip().lower() for p in backend.split(",") if p.strip()]
    cuda = [p.split(":", 1)[1] if ":" in p else p for p in parts
            if ":" not in p or p.startswith("cuda:")]
    if not cuda or any(p != "nccl" for p in cuda):
        raise ValueError(f"{func}() argument 'backend': cudalab.distributed runs on NCCL; "
                         f"expected 'nccl' or None, got {backend!r}")


def _launch_env(environ: Mapping[str, str], rank: int | None, world_size: int | None,
                master: tuple[str, int] | None, func: str) -> _env.LaunchEnv:
    launch = _env.from_environ(environ)
    if (rank is None) != (world_size is None):
        given, missing = ("rank", "world_size") if rank is not None else ("world_size", "rank")
        raise ValueError(f"{func}() argument '{missing}': must be given with '{given}'")
    if rank is not None:
        if rank >= world_size:
            raise ValueError(f"{func}() argument 'rank': must be below world_size "
                             f"({world_size}), got {rank}")
        same_job = launch.launcher != "none" and launch.world_size == world_size
        launch = dataclasses.replace(
            launch, rank=rank, world_size=world_size,
            local_rank=launch.local_rank if same_job else rank,
            local_world_size=launch.local_world_size if same_job else world_size,
            node_rank=launch.node_rank if same_job else 0,
            nnodes=launch.nnodes if same_job else 1)
    if master is not None:
        launch = dataclasses.replace(launch, master_addr=master[0], master_port=master[1])
    return launch


def init(backend: str | None = None, init_method: str | None = None, *,
         timeout: Union[float, datetime.timedelta] = DEFAULT_TIMEOUT,
         world_size: int | None = None, rank: int | None = None, device: int | None = None,
         environ: Mapping[str, str] | None = None) -> ProcessGroup:
    """init(backend=None, init_method=None, *, timeout=600.0, world_size=None, rank=None, device=None, environ=None) -> ProcessGroup

    Join the job and make the default process group (``init_process_group``
    is the same function, shaped like torch's).

    Reads the launcher's variables (torchrun and ``python -m
    cudalab.distributed.run``, Slurm's srun, MPI: see :mod:`.env`; none: a
    world of 1), takes the GPU ``LOCAL_RANK`` names (and makes it the
    current device), loads NCCL, meets the other ranks (rank 0 hands out
    NCCL's unique id) and creates the communicator.

    Parameters
    ----------
    backend : str, optional
        "nccl" or None (torch's "cuda:nccl" forms too).
    init_method : str, optional
        "env://" (default: MASTER_ADDR/MASTER_PORT) or "tcp://HOST:PORT".
    timeout : float or datetime.timedelta
        Seconds for the rendezvous, and for each collective before the
        watchdog aborts the communicator (default 600).
    world_size, rank : int, optional
        Instead of the launcher's (both or neither; torch's -1 means "not given").
    device : int, optional
        The GPU; default the local rank.
    environ : mapping, optional
        Variables to read instead of ``os.environ``.

    Returns
    -------
    ProcessGroup
        The default group.

    Raises
    ------
    TypeError, ValueError
        A bad argument or launcher variable (named with its value).
    NoDeviceError
        No GPU.
    DistributedError
        Already initialized; LOCAL_RANK names a GPU this process does not
        see; NCCL cannot be loaded (the message says what to install); the
        rendezvous failed (names the ranks, address and seconds).
    """
    global _default, _generation
    func = "init"
    _check_backend(backend, func)
    master = _master_from_init_method(init_method, func)
    seconds = _timeout_seconds(timeout, func)
    world_size = _optional_int(world_size, func, "world_size", 1)
    rank = _optional_int(rank, func, "rank", 0)
    if device is not None:
        device = _optional_int(device, func, "device", 0)
    if environ is not None and not isinstance(environ, Mapping):
        raise TypeError(f"{func}() argument 'environ': expected a mapping or None, "
                        f"got {type(environ).__name__}")
    if _default is not None:
        raise DistributedError(
            f"{func}(): the default process group is already initialized ({_default!r}); "
            "call cudalab.distributed.destroy() first")
    environ = os.environ if environ is None else environ
    launch = _launch_env(environ, rank, world_size, master, func)

    count = _core.device_count()
    if count == 0:
        _core._parse_device(None, func)  # NoDeviceError saying why (no driver, no GPU)
        raise _core.NoDeviceError(f"{func}(): no CUDA device is available")
    if device is None:
        if launch.local_rank >= count:
            visible = environ.get("CUDA_VISIBLE_DEVICES")
            shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            raise DistributedError(
                f"{func}(): LOCAL_RANK is {launch.local_rank} but this process sees {count} "
                f"GPU{'s' if count != 1 else ''}{shown}: start at most {count} processes per "
                "node, or give each its own GPU")
        device = launch.local_rank
    elif device >= count:
        raise ValueError(f"{func}() argument 'device': device {device} does not exist "
                         f"({count} visible)")
    library.load()

    _generation += 1
    payload = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": launch.local_rank,
        "device": device,
        "device_uuid": _core._device_properties(device)["uuid"],
        "nccl_version": _core._nccl_version(),
    }
    extra = {"nccl_id": _core._nccl_unique_id().hex()} if launch.rank == 0 else None
    result = _rendezvous(launch, payload, extra, seconds, environ)
    unique_id = bytes.fromhex(result.extra["nccl_id"])
    _core.set_device(device)
    comm = _core._NcclComm(unique_id, launch.world_size, launch.rank, device, seconds)
    _default = ProcessGroup(comm, rank=launch.rank, world_size=launch.world_size,
                            local_rank=launch.local_rank,
                            local_world_size=launch.local_world_size, device=device,
                            launcher=launch.launcher, timeout=seconds, peers=result.payloads)
    return _default


init_process_group = init


def _rendezvous(launch: _env.LaunchEnv, payload: dict, extra: dict | None, seconds: float,
                environ: Mapping[str, str]) -> _rdzv.RendezvousResult:
    same = ("nccl_version",)
    if (launch.world_size > 1 and launch.launcher == "torchrun"
            and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"):
        # torchrun's agent already serves MASTER_PORT (its TCPStore): meet there.
        store = _torch_agent_store(launch, seconds)
        prefix = (f"cudalab/{environ.get('TORCHELASTIC_RUN_ID', '')}/"
                  f"{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_generation}")
        return _rdzv.rendezvous_store(
            store, launch.rank, launch.world_size, prefix, payload=payload, extra=extra,
            timeout=seconds, same=same,
            where=f"torchrun's store at {launch.master_addr}:{launch.master_port}")
    return _rdzv.rendezvous(launch.rank, launch.world_size, launch.master_addr,
                            launch.master_port, payload=payload, extra=extra, timeout=seconds,
                            same=same)


def _torch_agent_store(launch: _env.LaunchEnv, seconds: float) -> Any:
    try:
        from torch.distributed import TCPStore
    except ImportError as exc:
        raise DistributedError(
            "init(): TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent serves "
            f"MASTER_PORT ({launch.master_port}) with its TCPStore, which cudalab reaches "
            f"through torch, but torch.distributed cannot be imported ({exc})") from None
    try:
        return TCPStore(host_name=launch.master_addr, port=launch.master_port, is_master=False,
                        timeout=datetime.timedelta(seconds=seconds))
    except Exception as exc:  # torch raises RuntimeError/DistStoreError subclasses
        raise DistributedError(
            f"rendezvous: rank {launch.rank} could not reach torchrun's store at "
            f"{launch.master_addr}:{launch.master_port} within {seconds:g} s: {exc}") from None


def destroy(group: ProcessGroup | None = None) -> None:
    """destroy(group=None)

    Destroy `group` (default: the default group, which init() can then make
    again). Idempotent: nothing to destroy is not an error.
    """
    global _default
    if group is not None and not isinstance(group, ProcessGroup):
        raise TypeError(f"destroy() argument 'group': expected a ProcessGroup or None, "
                        f"got {type(group).__name__}")
    g = _default if group is None else group
    if g is None:
        return
    if g is _default:
        _default = None
    g.destroy()


destroy_process_group = destroy


def is_initialized() -> bool:
    """is_initialized() -> bool: whether init() made the default group (and it is not destroyed)."""
    return _default is not None


def get_group() -> ProcessGroup:
    """get_group() -> ProcessGroup: the default group (DistributedError before init())."""
    return _group(None, "get_group", need_comm=False)


def get_rank(group: ProcessGroup | None = None) -> int:
    """get_rank(group=None) -> int: this process's rank."""
    return _group(group, "get_rank", need_comm=False).rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """get_world_size(group=None) -> int: the number of ranks."""
    return _group(group, "get_world_size", need_comm=False).world_size


def get_local_rank(group: ProcessGroup | None = None) -> int:
    """get_local_rank(group=None) -> int: this process's rank on its node."""
    return _group(group, "get_local_rank", need_comm=False).local_rank


def get_local_world_size(group: ProcessGroup | None = None) -> int:
    """get_local_world_size(group=None) -> int: the number of ranks on this node."""
    return _group(group, "get_local_world_size", need_comm=False).local_world_size
