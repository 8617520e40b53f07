"""Op profiler: what each cudalab op cost on the host and on the GPU.

::

    import cudalab as cl

    with cl.profiler.profile() as prof:
        with cl.profiler.record_function("step"):
            c = cl.matmul(a, a)
            d = c + a
            s = cl.sum(d)
    print(prof.key_averages().table(sort_by="gpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")   # open in ui.perfetto.dev or chrome://tracing

``table(sort_by=...)`` also takes torch.profiler's names for the same orders
(``"cuda_time_total"`` as the guides type it, ``"cpu_time_total"``, ``"count"``...):
:data:`TORCH_SORT_KEYS` maps each to cudalab's key.

What is recorded
----------------
Inside ``profile()`` every cudalab op leaves one :class:`ProfilerEvent`: its
name, array operands' shapes, the dtype it works in, device, stream, thread,
host start and end, GPU start and duration, and the bytes it moves and FLOPs it
performs where those are known. The ops (names as recorded; :data:`OP_CATEGORIES`
and :func:`op_category` file them by kind):

* element-wise: every function of the op table, :data:`ELEMENTWISE_OPS`
  (``add``, ``exp``, ``gelu``, ...), also when reached through an operator
  (``a + b`` and ``a += b`` are ``add``);
* reductions: every one of the reduction table and softmax,
  :data:`REDUCTION_OPS` (``sum``, ``argmax``, ``log_softmax``, ...);
* ``matmul`` (also ``a @ b``); ``transpose``; ``random.normal random.uniform
  random.integers``;
* cudalab.nn's ops, under their public names: ``linear`` (the forward GEMM of
  nn.Linear / nn.functional.linear), ``linear_backward_input`` and
  ``linear_backward_weight`` (its backward GEMMs), ``cross_entropy``, the
  optimizer steps ``adamw`` and ``sgd``, and GradScaler's ``unscale`` and
  ``update_scale``;
* copies: ``copy astype ascontiguousarray``, ``reshape`` when it must copy,
  ``asarray`` (host to device, or a device array to another dtype), ``get``
  (device to host, also through ``asnumpy``), ``__dlpack__`` with a copy;
* fills: ``zeros ones full zeros_like ones_like full_like``;
* ``CUDAGraph.replay`` (the whole graph as one record).

Not recorded: ``empty``/``empty_like`` (an allocation, no device work), views
(slicing, ``.T``, ``reshape`` without a copy), zero-copy imports, stream, event
and synchronize calls. Work an op does internally (a cast to a common dtype, a
cast into ``out=``, a compaction before ``get``) belongs to that op's record.
:class:`record_function` adds user ranges, which appear beside the ops.

What the numbers mean
---------------------
* Host time: ``time.monotonic_ns()``'s clock (CLOCK_MONOTONIC), from after the
  op's arguments are checked to just before it returns; it includes the
  profiler's own work (two CUDA event records and a small C record per op;
  ``benchmarks/bench_profiler.py`` measures it).
* GPU time: the time between two CUDA events recorded on the op's stream
  around its work, read when the profile ends; it includes allocations from
  the pool. For ``get`` and ``asarray``, which wait for their copy, it ends
  with the copy, not with the host's wait. Ops enqueued while a CUDA graph is
  being captured run only at replay: they get host times only
  (``gpu_duration_ns`` None, ``in_graph_capture`` True); the replay itself is
  recorded with its GPU time.
* GPU timestamps are put on the host clock through an origin event recorded
  when the profile starts (for another device: at its first op), whose GPU time
  is taken to be the middle of the host interval around recording and
  synchronizing it. The offset error is at most half that interval, reported
  per device in :attr:`Profile.gpu_clock_uncertainty_ns`; CUDA events resolve
  about 0.5 us, and placement loses about 1 us more per 16 s of profile (float
  milliseconds from the origin).
* Bytes are logical: each array operand read once and the result written
  once (element-wise: inputs + result; reductions: input + result; transpose
  and device copies: read + write; host transfers and ``get``: the bytes that
  cross; fills and random: the bytes written; ``matmul``: a + b + result).
  Temporaries of internal casts are not counted.
* FLOPs: ``matmul`` ``2*M*N*K`` per matrix product; ``add sub mul div`` one and
  ``axpy`` two per result element, ``sum``/``mean`` one per input element, on
  floating dtypes only. Other ops have no FLOP count (None), their cost not
  being a count of floating-point operations.

Cost
----
Off (the normal case): each op tests one C flag and calls nothing; see
``benchmarks/bench_profiler.py`` for the measured dispatch time of an in-place
add off and on. On: two CUDA event records and a small C record per op; the
events are read when the profile ends (which waits for the GPU).

NVTX
----
Every op and every :class:`record_function` range is also an NVTX range in the
``cudalab`` domain, so Nsight Systems shows them (``nsys profile -t cuda,nvtx
python script.py``). They are emitted when an NVTX tool is attached through
``NVTX_INJECTION64_PATH``, as Nsight Systems and Nsight Compute do, so that
without a tool an op pays nothing for them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, TypeVar, Union, overload

from . import _core

__all__ = [
    "ELEMENTWISE_OPS",
    "OP_CATEGORIES",
    "REDUCTION_OPS",
    "SORT_KEYS",
    "TORCH_SORT_KEYS",
    "KeyAverage",
    "KeyAverages",
    "Profile",
    "ProfilerEvent",
    "chrome_trace",
    "op_category",
    "profile",
    "record_function",
]

# Keys table(sort_by=...) accepts; numeric ones sort descending, name ascending.
SORT_KEYS = (
    "gpu_time_total",
    "gpu_time_avg",
    "host_time_total",
    "host_time_avg",
    "calls",
    "name",
)

# torch.profiler's sort_by names (the ones a torch user types, as the guides do with
# "cuda_time_total"), each taken as the cudalab key it means. torch's "cuda_time" and
# "cpu_time" are per-call averages. cudalab's ops do not nest (an op's record holds all its
# work), so an op's self time is its total time; a record_function range sorts by its
# whole time, where torch's self time would leave out the ops inside it.
TORCH_SORT_KEYS: dict[str, str] = {
    "cuda_time_total": "gpu_time_total",
    "self_cuda_time_total": "gpu_time_total",
    "device_time_total": "gpu_time_total",
    "self_device_time_total": "gpu_time_total",
    "cuda_time": "gpu_time_avg",
    "device_time": "gpu_time_avg",
    "cpu_time_total": "host_time_total",
    "self_cpu_time_total": "host_time_total",
    "cpu_time": "host_time_avg",
    "count": "calls",
}

# torch's memory sort keys: the profiler records no memory, so these have no cudalab key.
_TORCH_MEMORY_KEYS = (
    "cpu_memory_usage",
    "self_cpu_memory_usage",
    "cuda_memory_usage",
    "self_cuda_memory_usage",
    "device_memory_usage",
    "self_device_memory_usage",
)

# The op names as recorded, by kind. The element-wise ops and the reductions are the
# op tables' (cuda/ops/elementwise_ops.h and reduce_ops.h), read from the extension:
# a new table op is filed here with no edit.
ELEMENTWISE_OPS: tuple[str, ...] = _core._ELEMENTWISE_OPS
REDUCTION_OPS: tuple[str, ...] = _core._REDUCTIONS + ("softmax", "log_softmax")
OP_CATEGORIES: dict[str, tuple[str, ...]] = {
    "gemm": ("matmul", "linear", "linear_backward_input", "linear_backward_weight"),
    "loss": ("cross_entropy",),
    "optimizer": ("adamw", "sgd", "unscale", "update_scale"),
    "cast": ("copyto", "astype", "copy", "ascontiguousarray"),
    "element-wise": ELEMENTWISE_OPS,
    "reduction": REDUCTION_OPS,
}


def op_category(name: str) -> str:
    """The key of :data:`OP_CATEGORIES` that holds op `name`, else ``"other"``."""
    for category, names in OP_CATEGORIES.items():
        if name in names:
            return category
    return "other"


# Chrome-trace process ids of the GPUs: far above any Linux pid (at most 2**22).
_GPU_PID_BASE = 1 << 30

_F = TypeVar("_F", bound=Callable[..., Any])


# ---- events ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProfilerEvent:
    """One recorded op or user range.

    Times are integer nanoseconds on ``time.monotonic_ns()``'s clock.

    Attributes
    ----------
    name : str
        The op (``"matmul"``, ``"add"``, ...) or the record_function name.
    kind : str
        ``"op"`` or ``"range"`` (a record_function).
    device : int or None
        The GPU it ran on; None for a range recorded without a GPU.
    stream : int or None
        The ``cudaStream_t`` it was enqueued on, as ``Stream.cuda_stream``
        gives it (0: the legacy default stream).
    thread_id : int
        Native id of the calling thread (``threading.get_native_id()``).
    host_start_ns, host_end_ns : int
        Host time around the call.
    gpu_start_ns : int or None
        When the GPU began its work, placed on the host clock.
    gpu_duration_ns : int or None
        GPU time between the op's two events; None without a GPU, during CUDA
        graph capture, or when the events could not be read.
    dtype : str or None
        The dtype the op works in (the result's; for reductions the input's,
        after any ``dtype=`` cast).
    input_shapes : tuple of tuple of int
        Shapes of the array operands, in order (scalars are not listed).
    output_shape : tuple of int or None
        Shape of the result.
    bytes : int or None
        Bytes moved (see the module docstring for what counts).
    flops : int or None
        Floating-point operations, where the op has a meaningful count.
    in_graph_capture : bool
        Enqueued while its stream was being captured into a CUDA graph.
    """

    name: str
    kind: str
    device: Optional[int]
    stream: Optional[int]
    thread_id: int
    host_start_ns: int
    host_end_ns: int
    gpu_start_ns: Optional[int] = None
    gpu_duration_ns: Optional[int] = None
    dtype: Optional[str] = None
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shape: Optional[tuple[int, ...]] = None
    bytes: Optional[int] = None
    flops: Optional[int] = None
    in_graph_capture: bool = False

    @property
    def host_duration_ns(self) -> int:
        return self.host_end_ns - self.host_start_ns

    @property
    def gpu_end_ns(self) -> Optional[int]:
        if self.gpu_start_ns is None or self.gpu_duration_ns is None:
            return None
        return self.gpu_start_ns + self.gpu_duration_ns


# ---- key averages -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KeyAverage:
    """The events of one name (and kind, and input shapes when grouped), summed.

    Attributes
    ----------
    name, kind : str
    input_shapes : tuple of tuple of int, or None
        Set when grouped by input shape.
    calls : int
    host_time_total_ns : int
    gpu_calls : int
        Calls that have a GPU time.
    gpu_time_total_ns : int or None
        Sum over those calls; None when no call has one.
    bytes, flops : int or None
        Totals over the calls where they are known.
    gb_per_s, tflop_per_s : float or None
        Bytes (FLOPs) of the calls that have both a GPU time and a count,
        divided by those calls' GPU time.
    """

    name: str
    kind: str
    input_shapes: Optional[tuple[tuple[int, ...], ...]]
    calls: int
    host_time_total_ns: int
    gpu_calls: int
    gpu_time_total_ns: Optional[int]
    bytes: Optional[int]
    flops: Optional[int]
    gb_per_s: Optional[float]
    tflop_per_s: Optional[float]

    @property
    def host_time_avg_ns(self) -> float:
        return self.host_time_total_ns / self.calls

    @property
    def gpu_time_avg_ns(self) -> Optional[float]:
        if self.gpu_time_total_ns is None:
            return None
        return self.gpu_time_total_ns / self.gpu_calls

    @classmethod
    def from_events(
        cls, events: Sequence[ProfilerEvent], group_by_input_shape: bool = False
    ) -> KeyAverage:
        """Aggregate events that share a name and kind (all of them)."""
        first = events[0]
        gpu = [e for e in events if e.gpu_duration_ns is not None]
        gpu_total = sum(e.gpu_duration_ns for e in gpu) if gpu else None  # type: ignore[misc]
        return cls(
            name=first.name,
            kind=first.kind,
            input_shapes=first.input_shapes if group_by_input_shape else None,
            calls=len(events),
            host_time_total_ns=sum(e.host_duration_ns for e in events),
            gpu_calls=len(gpu),
            gpu_time_total_ns=gpu_total,
            bytes=_total(e.bytes for e in events),
            flops=_total(e.flops for e in events),
            gb_per_s=_rate(gpu, "bytes", 1e9),
            tflop_per_s=_rate(gpu, "flops", 1e12),
        )


def _torch_names() -> str:
    """TORCH_SORT_KEYS for an error message: ``cuda_time_total (gpu_time_total), ...``."""
    return ", ".join(f"{torch} ({ours})" for torch, ours in TORCH_SORT_KEYS.items())


def _total(values: Iterable[Optional[int]]) -> Optional[int]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _rate(gpu_events: Sequence[ProfilerEvent], field: str, unit: float) -> Optional[float]:
    """Sum of `field` over events with a GPU time, per second of that time, in `unit`s."""
    pairs = [(getattr(e, field), e.gpu_duration_ns) for e in gpu_events]
    pairs = [(v, t) for v, t in pairs if v is not None]
    ns = sum(t for _, t in pairs)
    if not pairs or ns <= 0:
        return None
    return sum(v for v, _ in pairs) / (ns * 1e-9) / unit


class KeyAverages(Sequence[KeyAverage]):
    """Per-op (or per-op and input shape) totals, in order of first appearance.

    A sequence of :class:`KeyAverage`; :meth:`table` formats it.
    """

    def __init__(self, rows: Sequence[KeyAverage], group_by_input_shape: bool = False) -> None:
        self._rows = tuple(rows)
        self.group_by_input_shape = group_by_input_shape

    @classmethod
    def from_events(
        cls, events: Iterable[ProfilerEvent], group_by_input_shape: bool = False
    ) -> KeyAverages:
        groups: dict[tuple[Any, ...], list[ProfilerEvent]] = {}
        for e in events:
            key: tuple[Any, ...] = (e.kind, e.name)
            if group_by_input_shape:
                key += (e.input_shapes,)
            groups.setdefault(key, []).append(e)
        rows = [KeyAverage.from_events(g, group_by_input_shape) for g in groups.values()]
        return cls(rows, group_by_input_shape)

    @overload
    def __getitem__(self, index: int) -> KeyAverage: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[KeyAverage]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[KeyAverage, Sequence[KeyAverage]]:
        return self._rows[index]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[KeyAverage]:
        return iter(self._rows)

    def __repr__(self) -> str:
        return f"KeyAverages({len(self._rows)} rows)"

    def sorted(self, sort_by: str = "gpu_time_total") -> list[KeyAverage]:
        """The rows ordered by one of :data:`SORT_KEYS`, or torch's name for one
        (:data:`TORCH_SORT_KEYS`: ``cuda_time_total`` is ``gpu_time_total``)."""
        if not isinstance(sort_by, str):
            raise TypeError(
                f"table() argument 'sort_by': expected a str, got {type(sort_by).__name__}"
            )
        if sort_by in _TORCH_MEMORY_KEYS:
            raise ValueError(
                f"table() argument 'sort_by': torch's key {sort_by!r} sorts by memory, which "
                f"cudalab's profiler does not record (expected one of {', '.join(SORT_KEYS)}, "
                f"or torch's {', '.join(TORCH_SORT_KEYS)})"
            )
        sort_by = TORCH_SORT_KEYS.get(sort_by, sort_by)
        if sort_by not in SORT_KEYS:
            raise ValueError(
                f"table() argument 'sort_by': unknown key {sort_by!r} "
                f"(expected one of {', '.join(SORT_KEYS)}, "
                f"or torch's name for one: {_torch_names()})"
            )
        if sort_by == "name":
            return sorted(self._rows, key=lambda r: r.name)

        def value(r: KeyAverage) -> float:
            v = {
                "gpu_time_total": r.gpu_time_total_ns,
                "gpu_time_avg": r.gpu_time_avg_ns,
                "host_time_total": r.host_time_total_ns,
                "host_time_avg": r.host_time_avg_ns,
                "calls": r.calls,
            }[sort_by]
            return -1.0 if v is None else float(v)  # no GPU time sorts last

        return sorted(self._rows, key=value, reverse=True)  # stable: ties keep their order

    def table(self, sort_by: str = "gpu_time_total", row_limit: Optional[int] = None) -> str:
        """A fixed-width text table of the rows.

        Parameters
        ----------
        sort_by : str, optional
            One of ``gpu_time_total`` (default), ``gpu_time_avg``,
            ``host_time_total``, ``host_time_avg``, ``calls`` (descending) or
            ``name`` (ascending); torch's names are accepted for the same
            orders (:data:`TORCH_SORT_KEYS`): ``cuda_time_total``,
            ``self_cuda_time_total`` and ``device_time_total`` are
            ``gpu_time_total``, ``cuda_time`` is ``gpu_time_avg``,
            ``cpu_time_total`` and ``self_cpu_time_total`` are
            ``host_time_total``, ``cpu_time`` is ``host_time_avg``, ``count``
            is ``calls``.
        row_limit : int, optional
            Show at most this many rows (None: all).

        Returns
        -------
        str
            Columns Name, [Input shapes,] Calls, Host total, Host avg, GPU
            total, GPU avg, GPU % (share of the GPU time of all ops; ranges
            overlap ops and are not part of that total), GB/s, TFLOP/s; "-"
            where a value is unknown.
        """
        if row_limit is not None and (
            isinstance(row_limit, bool) or not isinstance(row_limit, int)
        ):
            raise TypeError(
                f"table() argument 'row_limit': expected an int or None, "
                f"got {type(row_limit).__name__}"
            )
        if row_limit is not None and row_limit < 0:
            raise ValueError(
                f"table() argument 'row_limit': must be >= 0 (or None for all rows), "
                f"got {row_limit}"
            )
        rows = self.sorted(sort_by)
        shown = rows if row_limit is None else rows[:row_limit]
        return _format_table(rows, shown, self.group_by_input_shape)


# ---- table formatting -------------------------------------------------------------------

_NAME_MAX = 40


def format_time_ns(ns: Optional[float]) -> str:
    """``"-"`` for None, else the time in ns, us, ms or s with two decimals."""
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.2f} {unit}"
    return f"{ns:.0f} ns"


def _rate_text(value: Optional[float]) -> str:
    """A rate with a width-friendly precision: 4351, 50.72, 0.0013."""
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:.0f}"
    if value >= 0.01 or value == 0:
        return f"{value:.2f}"
    return f"{value:.2g}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _shapes_text(shapes: Optional[tuple[tuple[int, ...], ...]]) -> str:
    if shapes is None:
        return "-"
    return "[" + ", ".join(str(tuple(s)) for s in shapes) + "]"


def _format_table(
    all_rows: Sequence[KeyAverage], rows: Sequence[KeyAverage], by_shape: bool
) -> str:
    op_gpu_total = sum(r.gpu_time_total_ns or 0 for r in all_rows if r.kind == "op")
    headers = ["Name"] + (["Input shapes"] if by_shape else []) + [
        "Calls", "Host total", "Host avg", "GPU total", "GPU avg", "GPU %", "GB/s", "TFLOP/s",
    ]
    body = []
    for r in rows:
        pct = (
            f"{100.0 * r.gpu_time_total_ns / op_gpu_total:.1f}"
            if r.gpu_time_total_ns is not None and op_gpu_total > 0
            else "-"
        )
        cells = [_clip(r.name, _NAME_MAX)]
        if by_shape:
            cells.append(_clip(_shapes_text(r.input_shapes), _NAME_MAX))
        cells += [
            str(r.calls),
            format_time_ns(r.host_time_total_ns),
            format_time_ns(r.host_time_avg_ns),
            format_time_ns(r.gpu_time_total_ns),
            format_time_ns(r.gpu_time_avg_ns),
            pct,
            _rate_text(r.gb_per_s),
            _rate_text(r.tflop_per_s),
        ]
        body.append(cells)
    text_cols = 2 if by_shape else 1  # left-aligned; numbers are right-aligned
    widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i < text_cols else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(cells) for cells in body]
    if not all_rows:
        out.append("(no events recorded)")
    else:
        calls = sum(r.calls for r in all_rows if r.kind == "op")
        ranges = sum(r.calls for r in all_rows if r.kind == "range")
        hidden = len(all_rows) - len(rows)
        summary = f"{calls} op call{'s' if calls != 1 else ''}"
        if ranges:
            summary += f", {ranges} range{'s' if ranges != 1 else ''}"
        if op_gpu_total:
            summary += f"; GPU time of all ops: {format_time_ns(op_gpu_total)}"
        if hidden:
            summary += f"; {hidden} more row{'s' if hidden != 1 else ''} not shown"
        out.append(summary)
    return "\n".join(out)


# ---- Chrome trace -------------------------------------------------------------------


def _stream_label(stream: Optional[int]) -> str:
    return "legacy default stream" if not stream else f"stream 0x{stream:x}"


def chrome_trace(
    events: Sequence[ProfilerEvent],
    start_ns: Optional[int] = None,
    thread_names: Optional[dict[int, str]] = None,
    other_data: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """The Trace Event Format document for `events` (what export_chrome_trace writes).

    Host events go on this process (pid ``os.getpid()``), one track per
    thread; GPU events on one process per device (named ``"GPU <i>"``), one
    track per stream. Timestamps are microseconds since `start_ns` (default:
    the earliest event).
    """
    pid = os.getpid()
    if start_ns is None:
        starts = [e.host_start_ns for e in events]
        starts += [e.gpu_start_ns for e in events if e.gpu_start_ns is not None]
        start_ns = min(starts) if starts else 0
    thread_names = thread_names or {}

    def us(ns: int) -> float:
        return round((ns - start_ns) / 1e3, 3)

    trace: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
         "args": {"name": f"Host (pid {pid})"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
         "args": {"sort_index": 0}},
    ]
    threads: dict[int, None] = {}
    gpu_tids: dict[int, dict[int, int]] = {}  # device -> stream -> tid
    for e in events:
        if e.thread_id not in threads:
            threads[e.thread_id] = None
            trace.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": e.thread_id,
                          "ts": 0, "args": {"name": thread_names.get(e.thread_id,
                                                                     f"thread {e.thread_id}")}})
        if e.gpu_start_ns is None or e.gpu_duration_ns is None or e.device is None:
            continue
        streams = gpu_tids.get(e.device)
        if streams is None:
            streams = gpu_tids[e.device] = {}
            gpid = _GPU_PID_BASE + e.device
            trace.append({"name": "process_name", "ph": "M", "pid": gpid, "tid": 0, "ts": 0,
                          "args": {"name": f"GPU {e.device}"}})
            trace.append({"name": "process_sort_index", "ph": "M", "pid": gpid, "tid": 0,
                          "ts": 0, "args": {"sort_index": 1 + e.device}})
        stream = e.stream or 0
        if stream not in streams:
            streams[stream] = len(streams)
            trace.append({"name": "thread_name", "ph": "M", "pid": _GPU_PID_BASE + e.device,
                          "tid": streams[stream], "ts": 0, "args": {"name": _stream_label(stream)}})

    for e in events:
        args: dict[str, Any] = {
            "input_shapes": [list(s) for s in e.input_shapes],
            "output_shape": None if e.output_shape is None else list(e.output_shape),
            "dtype": e.dtype,
            "bytes": e.bytes,
            "flops": e.flops,
            "device": e.device,
            "stream": None if e.stream is None else f"0x{e.stream:x}",
            "in_graph_capture": e.in_graph_capture,
        }
        if e.gpu_duration_ns is not None:
            args["gpu_duration_us"] = e.gpu_duration_ns / 1e3
        trace.append({"name": e.name, "cat": e.kind, "ph": "X", "ts": us(e.host_start_ns),
                      "dur": round(e.host_duration_ns / 1e3, 3), "pid": pid, "tid": e.thread_id,
                      "args": args})
        if e.gpu_start_ns is not None and e.gpu_duration_ns is not None and e.device is not None:
            trace.append({"name": e.name, "cat": "gpu_" + e.kind, "ph": "X",
                          "ts": us(e.gpu_start_ns), "dur": round(e.gpu_duration_ns / 1e3, 3),
                          "pid": _GPU_PID_BASE + e.device,
                          "tid": gpu_tids[e.device][e.stream or 0], "args": args})
    doc: dict[str, Any] = {"traceEvents": trace, "displayTimeUnit": "ms"}
    if other_data:
        doc["otherData"] = other_data
    return doc


# ---- the profile -------------------------------------------------------------------


class Profile:
    """One profiling session; use it as ``with cudalab.profiler.profile() as prof:``.

    A Profile records once. After the ``with`` block, :meth:`events`,
    :meth:`key_averages` and :meth:`export_chrome_trace` report what it saw.
    Only one profile records at a time in a process (RuntimeError otherwise).
    """

    def __init__(self) -> None:
        self._state = "new"  # -> "recording" -> "done"
        self._events: list[ProfilerEvent] = []
        self._start_ns: Optional[int] = None
        self._end_ns: Optional[int] = None
        self._origins: dict[int, tuple[int, int]] = {}
        self._thread_names: dict[int, str] = {}

    @classmethod
    def from_events(
        cls,
        events: Iterable[ProfilerEvent],
        start_ns: Optional[int] = None,
        end_ns: Optional[int] = None,
    ) -> Profile:
        """A finished Profile holding `events` (saved ones, or built by hand)."""
        prof = cls()
        prof._events = sorted(events, key=lambda e: e.host_start_ns)
        prof._start_ns, prof._end_ns = start_ns, end_ns
        prof._state = "done"
        return prof

    def __enter__(self) -> Profile:
        if self._state != "new":
            raise RuntimeError("a Profile records only once; use a new cudalab.profiler.profile()")
        _core._profiler_enable()
        self._state = "recording"
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        raw = _core._profiler_disable()
        self._state = "done"
        self._events = sorted(
            (ProfilerEvent(**d) for d in raw["events"]), key=lambda e: e.host_start_ns
        )
        self._start_ns, self._end_ns = raw["start_ns"], raw["end_ns"]
        self._origins = dict(raw["origins"])
        self._thread_names = {
            t.native_id: t.name for t in threading.enumerate() if t.native_id is not None
        }
        return False

    def _require_done(self, what: str) -> None:
        if self._state != "done":
            raise RuntimeError(
                f"{what}: the profile has not "
                + ("started" if self._state == "new" else "finished; leave the with block first")
            )

    @property
    def start_ns(self) -> Optional[int]:
        """Host time the profile started (None for from_events without one)."""
        return self._start_ns

    @property
    def end_ns(self) -> Optional[int]:
        return self._end_ns

    @property
    def gpu_clock_uncertainty_ns(self) -> dict[int, int]:
        """Per device: the bound on the offset error of GPU timestamps (ns)."""
        return {d: u for d, (_, u) in self._origins.items()}

    def events(self) -> list[ProfilerEvent]:
        """Every recorded op and range, ordered by host start time."""
        self._require_done("events()")
        return list(self._events)

    def key_averages(self, group_by_input_shape: bool = False) -> KeyAverages:
        """Totals per op name (and input shapes with ``group_by_input_shape``)."""
        self._require_done("key_averages()")
        if not isinstance(group_by_input_shape, bool):
            raise TypeError(
                "key_averages() argument 'group_by_input_shape': expected a bool, got "
                f"{type(group_by_input_shape).__name__}"
            )
        return KeyAverages.from_events(self._events, group_by_input_shape)

    def export_chrome_trace(self, path: Union[str, os.PathLike[str]]) -> None:
        """Write the events as Trace Event Format JSON (Perfetto, chrome://tracing).

        Timestamps are microseconds since the profile started. See
        :func:`chrome_trace` for the layout.
        """
        self._require_done("export_chrome_trace()")
        other = {
            "producer": "cudalab.profiler",
            "clock": "CLOCK_MONOTONIC",
            "start_ns": self._start_ns,
            "gpu_clock_uncertainty_us": {
                str(d): u / 1e3 for d, u in self.gpu_clock_uncertainty_ns.items()
            },
        }
        doc = chrome_trace(self._events, self._start_ns, self._thread_names, other)
        Path(path).write_text(json.dumps(doc))

    def __repr__(self) -> str:
        return f"<cudalab.profiler.Profile {self._state}, {len(self._events)} events>"


def profile() -> Profile:
    """Record every cudalab op in a ``with`` block: ``with profile() as prof:``."""
    return Profile()


class record_function:
    """Mark a named range: ``with record_function("step"):`` or ``@record_function("step")``.

    Inside a profile the range is recorded with host times and, when a GPU
    exists, GPU events on the current stream (so its GPU time spans the work
    enqueued inside it); it appears in the table and trace beside the ops.
    With an NVTX tool attached it is also an NVTX range. Otherwise it costs a
    C call on entry and exit.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(
                f"record_function() argument 'name': expected a str, got {type(name).__name__}"
            )
        self.name = name
        self._tokens: list[Any] = []  # a stack: the same object may be entered again inside

    def __enter__(self) -> record_function:
        self._tokens.append(_core._profiler_range_begin(self.name))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        _core._profiler_range_end(self._tokens.pop())
        return False

    def __call__(self, fn: _F) -> _F:
        if not callable(fn):
            raise TypeError(
                f"record_function({self.name!r}) decorates a callable, got {type(fn).__name__}"
            )
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with record_function(name):  # a fresh object per call: threads never share one
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"record_function({self.name!r})"
