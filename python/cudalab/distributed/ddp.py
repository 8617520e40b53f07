"""DistributedDataParallel: one process per GPU, gradients all-reduced while the backward runs.

Each process holds the whole nn.MLP and trains it on its own shard of the
batch. At construction the parameters are broadcast from rank 0 and the
gradients are laid out in *buckets*: flat float32 buffers filled in reverse
layer order (the order the backward produces them), each Parameter's
``grad`` becoming a view into its bucket (torch's
``gradient_as_bucket_view``: no copy in or out, and the fused optimizers
read the views as they are).

The overlap. ``backward`` runs the module's backward with a hook that fires
right after each layer's weight gradients are enqueued. When a bucket's
last gradient has been enqueued, an event is recorded on the compute
stream (the caller's current stream), the communication stream waits for
that event, and the bucket is all-reduced there (NCCL, op AVG), while the
compute stream goes on with the input-gradient GEMMs of the layers below.
After the last layer, the compute stream waits for an event recorded on the
communication stream after the last all-reduce, so whatever follows (the
optimizer step) sees averaged gradients. The host never waits: a step can
be captured in a CUDA graph.

``grad_dtype='bf16'`` (or 'fp16') sends half the bytes: on the
communication stream each bucket is cast into a reusable half buffer,
all-reduced with AVG (the 1 / world_size scaling of torch's
``bf16_compress_hook``, done inside NCCL), and cast back into the float32
bucket.

``no_sync()``: backwards inside it skip the all-reduce and accumulate
locally (pass ``accumulate=True`` to every micro-batch after the first);
the first backward after it all-reduces the accumulated gradients.

``optimize_in_backward(nn.AdamW, lr=...)`` (opt-in) goes one step further:
one optimizer per bucket, each stepped on a third stream as soon as its
bucket is averaged *and* the backward has read its weights for the last time
(the input-gradient GEMM of the bucket's lowest layer, which follows that
layer's hook: an fp32 forward uses the master weights themselves), so the
optimizer's memory-bound update of one bucket overlaps the all-reduce of the
next, and only the last bucket's update remains after the communication.
Per-parameter optimizers (SGD, AdamW) give exactly the updates of one
optimizer over all parameters.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from .. import _core
from ..devices import device as _device
from .._check import arg_error
from ..nn.precision import PRECISIONS
from .group import ProcessGroup, get_group

__all__ = ["Bucket", "DistributedDataParallel", "assign_buckets"]

# NCCL's reduction code for the average (sum / world_size), as the C layer takes it.
_AVG = 4
# Parameters, their gradients and the flat buckets are float32 (nn's master dtype).
F32 = np.dtype(np.float32)
# Each gradient starts this many elements into its bucket after the previous one
# (256 bytes, the pool's alignment): a view looks to cuBLASLt and the optimizers
# like an allocation of its own.
ALIGN = 64
_MIB = 1024 * 1024
_WIRE_DTYPES = {
    "bf16": PRECISIONS["bf16"].compute_dtype,
    "bfloat16": PRECISIONS["bf16"].compute_dtype,
    "fp16": np.dtype(np.float16),
    "float16": np.dtype(np.float16),
}


def assign_buckets(sizes: Sequence[int], cap_bytes: int, itemsize: int = 4) -> list[list[int]]:
    """assign_buckets(sizes, cap_bytes, itemsize=4) -> list of lists of int

    Group tensors of `sizes` elements (given in the model's parameter order)
    into buckets, torch's rule: walk them in reverse (the order the backward
    produces their gradients), add each to the open bucket, and close it once
    it holds at least `cap_bytes` (so a bucket may exceed the cap by its last
    tensor, and a tensor larger than the cap closes a bucket of its own).

    Returns
    -------
    list of lists of int
        The tensors' indices in each bucket, buckets in communication order.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    nbytes = 0
    for i in range(len(sizes) - 1, -1, -1):
        current.append(i)
        nbytes += int(sizes[i]) * itemsize
        if nbytes >= cap_bytes:
            buckets.append(current)
            current, nbytes = [], 0
    if current:
        buckets.append(current)
    return buckets


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Bucket:
    """One bucket: what it holds and where.

    Attributes
    ----------
    index : int
        Its place in communication order (0 is all-reduced first).
    params : tuple of str
        The Parameters' names, in the order they sit in the buffer.
    offsets : tuple of int
        Each one's first element in the buffer (multiples of ALIGN).
    layers : tuple of int
        The layers the Parameters belong to, last first.
    ready_after : int
        The layer whose hook completes the bucket (its smallest layer).
    elements : int
        Gradient elements it holds (without the alignment padding).
    numel : int
        The buffer's elements, padding included (what is all-reduced).
    nbytes : int
        The float32 buffer's bytes.
    """

    index: int
    params: tuple[str, ...]
    offsets: tuple[int, ...]
    layers: tuple[int, ...]
    ready_after: int
    elements: int
    numel: int
    nbytes: int


def plan_buckets(layer_params: Sequence[Sequence[tuple[str, int]]],
                 cap_bytes: int) -> list[Bucket]:
    """The buckets of a model whose layer i holds the (name, elements) of `layer_params[i]`
    (in parameter order), with `cap_bytes` as assign_buckets takes it."""
    flat = [(i, name, n) for i, params in enumerate(layer_params) for name, n in params]
    out = []
    for b, members in enumerate(assign_buckets([n for _, _, n in flat], cap_bytes)):
        offsets, at = [], 0
        for j in members:
            offsets.append(at)
            at += _aligned(flat[j][2])
        layers = tuple(sorted({flat[j][0] for j in members}, reverse=True))
        out.append(Bucket(index=b, params=tuple(flat[j][1] for j in members),
                          offsets=tuple(offsets), layers=layers, ready_after=layers[-1],
                          elements=sum(flat[j][2] for j in members), numel=at,
                          nbytes=at * F32.itemsize))
    return out


def _wire_dtype(grad_dtype: Any) -> Optional[np.dtype]:
    """None (float32 on the wire) or the half dtype gradients are sent in."""
    if grad_dtype is None:
        return None
    if isinstance(grad_dtype, str):
        if grad_dtype in ("fp32", "float32"):
            return None
        if grad_dtype in _WIRE_DTYPES:
            return _WIRE_DTYPES[grad_dtype]
    else:
        try:
            dt = np.dtype(grad_dtype)
        except TypeError:
            raise arg_error(TypeError, "DistributedDataParallel", "grad_dtype",
                            f"expected None, 'bf16' or 'fp16', got "
                            f"{type(grad_dtype).__name__}") from None
        if dt == F32:
            return None
        if dt in (_WIRE_DTYPES["bf16"], _WIRE_DTYPES["fp16"]):
            return dt
    raise arg_error(ValueError, "DistributedDataParallel", "grad_dtype",
                    f"expected None, 'bf16' or 'fp16', got {grad_dtype!r}")


def _check_module(module: Any) -> Any:
    """An nn.MLP, or anything shaped like one (layers with parameters(), forward,
    backward(grad, accumulate=, hook=))."""
    ok = (hasattr(module, "layers") and callable(getattr(module, "parameters", None))
          and callable(getattr(module, "backward", None))
          and callable(getattr(module, "forward", None)))
    if not ok:
        raise arg_error(TypeError, "DistributedDataParallel", "module",
                        f"expected a cudalab.nn.MLP, got {type(module).__name__}")
    return module


class DistributedDataParallel:
    """DistributedDataParallel(module, *, group=None, bucket_cap_mb=25, grad_dtype=None, broadcast_parameters=True)

    Data-parallel training of an nn.MLP, one process per GPU: gradients
    all-reduced (averaged) in buckets on a communication stream while the
    backward still runs (this module's docstring tells how).

    Parameters
    ----------
    module : nn.MLP
        On the group's device (every layer).
    group : ProcessGroup, optional
        Default: the default group (:func:`cudalab.distributed.init`).
    bucket_cap_mb : float, optional
        > 0: a bucket is closed once it holds this many MiB (torch's 25).
    grad_dtype : {None, 'bf16', 'fp16'}, optional
        The dtype gradients travel in (None: float32).
    broadcast_parameters : bool, optional
        Copy rank 0's parameters to every rank at construction (torch does).

    Attributes
    ----------
    module : nn.MLP
    group : ProcessGroup
    buckets : list of Bucket
        In communication order (the last layers' first).
    comm_stream : Stream
        Where the all-reduces run (high priority where the GPU has it).
    grad_dtype : numpy.dtype or None
    require_backward_grad_sync : bool
        False inside :meth:`no_sync`.
    local_backwards : int
        Backwards since the gradients were last all-reduced (no_sync
        micro-batches); 0 after a synchronizing backward.
    bucket_optimizers : list
        The per-bucket optimizers of :meth:`optimize_in_backward` (empty
        until then); they step on ``optim_stream``.

    Notes
    -----
    The Parameters' ``grad`` arrays are replaced by views of the buckets:
    make the optimizer after wrapping (or at least do not keep old grad
    arrays), and do not move the module afterwards.

    Measuring the overlap: a backward inside :meth:`no_sync` is the backward
    with no communication; :meth:`all_reduce_buckets` is the communication
    alone (same buckets, streams and casts); the communication a synchronizing
    backward leaves exposed is its time minus the no_sync one, and the share
    it hides is ``1 - exposed / alone``. :attr:`buckets` and
    :attr:`bucket_bytes` say what is sent.
    """

    def __init__(self, module: Any, *, group: Any = None, bucket_cap_mb: float = 25,
                 grad_dtype: Any = None, broadcast_parameters: bool = True) -> None:
        func = "DistributedDataParallel"
        module = _check_module(module)
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)):
            raise arg_error(TypeError, func, "bucket_cap_mb",
                            f"expected a number, got {type(bucket_cap_mb).__name__}")
        if not bucket_cap_mb > 0 or bucket_cap_mb == float("inf"):
            raise arg_error(ValueError, func, "bucket_cap_mb",
                            f"must be a finite number > 0, got {bucket_cap_mb}")
        wire = _wire_dtype(grad_dtype)
        if not isinstance(broadcast_parameters, bool):
            raise arg_error(TypeError, func, "broadcast_parameters",
                            f"expected a bool, got {type(broadcast_parameters).__name__}")
        group = self._resolve_group(group)
        devices = sorted({p.value.device for p in module.parameters()})
        if devices != [group.device]:
            raise arg_error(ValueError, func, "module",
                            f"is on device{'s' if len(devices) > 1 else ''} "
                            f"{', '.join(map(str, devices))} but this rank's device is "
                            f"{group.device} (rank {group.rank}, local rank "
                            f"{getattr(group, 'local_rank', '?')}): move it with "
                            f"module.to({group.device}); a rank's GPU is its local rank, not "
                            f"its global rank")
        self.module = module
        self.group = group
        self.device = group.device
        self.grad_dtype = wire
        self.bucket_cap_mb = bucket_cap_mb
        self.require_backward_grad_sync = True
        self.local_backwards = 0
        layer_params = [[(p.name, int(p.size)) for p in layer.parameters()]
                        for layer in module.layers]
        self.buckets = plan_buckets(layer_params, int(bucket_cap_mb * _MIB))
        # The buckets each layer's hook completes (most layers complete one; a small
        # layer may complete none, its bucket closing with a lower layer).
        self._launch_at: list[tuple[int, ...]] = [() for _ in module.layers]
        for b in self.buckets:
            self._launch_at[b.ready_after] += (b.index,)
        with _device(self.device):
            self._flat = [_core.zeros((b.numel,), dtype=F32) for b in self.buckets]
            self._wire_views: list[Any] = []
            if wire is not None:
                shared = _core.empty((max(b.numel for b in self.buckets),), dtype=wire)
                self._wire_views = [shared[:b.numel] for b in self.buckets]
            self.comm_stream = self._make_stream()
            self._ready = [_core.Event(enable_timing=False) for _ in self.buckets]
            self._done = _core.Event(enable_timing=False)
        self._views_into_buckets(module)
        self._compute: Any = None
        self._launched = 0
        self._step_in_backward = False
        self.bucket_optimizers: list = []
        self.optim_stream: Any = None
        self._pending: list[int] = []  # reduced buckets whose weights the backward still reads
        if broadcast_parameters and group.world_size > 1:
            comm = group._comm
            for p in module.parameters():
                comm.broadcast(p.value, p.value, 0)

    @staticmethod
    def _resolve_group(group: Any) -> Any:
        if group is None:
            group = get_group()
        elif not isinstance(group, ProcessGroup):
            raise arg_error(TypeError, "DistributedDataParallel", "group",
                            f"expected a ProcessGroup or None, got {type(group).__name__}")
        if group._comm is None:
            raise _core.DistributedError("DistributedDataParallel(): the process group was "
                                         "destroyed")
        return group

    def _make_stream(self) -> Any:
        # NCCL's kernels then take SMs ahead of queued GEMM blocks: the all-reduce starts
        # as soon as its bucket is ready instead of after the GEMM in flight drains.
        try:
            return _core.Stream(priority=-1, device=self.device)
        except ValueError:  # a GPU with a single priority
            return _core.Stream(device=self.device)

    def _views_into_buckets(self, module: Any) -> None:
        """Every Parameter's grad becomes a view of its bucket (its values copied in)."""
        by_name = {p.name: p for p in module.parameters()}
        if len(by_name) != len(module.parameters()):
            raise arg_error(ValueError, "DistributedDataParallel", "module",
                            "has two parameters of one name")
        for b, flat in zip(self.buckets, self._flat):
            for name, off in zip(b.params, b.offsets):
                p = by_name[name]
                view = flat[off:off + p.size].reshape(p.shape)
                _core.copyto(view, p.grad)
                p.grad = view

    # ---- the step ----------------------------------------------------------------------

    def parameters(self) -> list:
        return self.module.parameters()

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def forward(self, x: Any, precision: Any = "fp32", *, cast_weights: bool = True) -> Any:
        """forward(x, precision='fp32', *, cast_weights=True): the module's forward."""
        return self.module.forward(x, precision, cast_weights=cast_weights)

    __call__ = forward

    def optimize_in_backward(self, factory: Any, **kwargs: Any) -> list:
        """optimize_in_backward(factory, **kwargs) -> list

        Step the optimizer inside every synchronizing backward, bucket by
        bucket: ``factory(bucket_parameters, **kwargs)`` (e.g. ``nn.AdamW``,
        ``lr=1e-3``) makes one optimizer per bucket (state on this rank's
        device); each steps on :attr:`optim_stream` once its bucket is
        all-reduced and the backward's last read of the bucket's weights (the
        input-gradient GEMM after its lowest layer's hook) is done,
        overlapping the next bucket's all-reduce. Do not call their
        ``step()`` yourself; no_sync backwards step nothing (they only
        accumulate). Not for fp16 training with a GradScaler (the unscale and
        the skip need every gradient first).

        Returns
        -------
        list
            The optimizers, in bucket order (their hyper-parameters and
            state, e.g. to change ``lr``).
        """
        if self.bucket_optimizers:
            raise RuntimeError("optimize_in_backward(): already called for this module")
        by_name = {p.name: p for p in self.module.parameters()}
        with _device(self.device):
            opts = [factory([by_name[n] for n in b.params], **kwargs) for b in self.buckets]
            self.optim_stream = _core.Stream(device=self.device)
            self._reduced = [_core.Event(enable_timing=False) for _ in self.buckets]
            self._free = [_core.Event(enable_timing=False) for _ in self.buckets]
        self.bucket_optimizers = opts
        self._step_in_backward = True
        return opts

    def backward(self, grad_logits: Any, *, accumulate: bool = False) -> None:
        """backward(grad_logits, *, accumulate=False) -> None

        The module's backward, with every bucket all-reduced (averaged over
        the ranks) on :attr:`comm_stream` as soon as its gradients are
        enqueued (and its optimizer stepped after it, with
        :meth:`optimize_in_backward`); the current stream waits for all of it
        before anything enqueued after this call. Inside :meth:`no_sync`
        nothing is communicated.

        Parameters
        ----------
        grad_logits : DeviceArray
            As MLP.backward takes it (the gradient of this rank's mean loss).
        accumulate : bool, optional
            Add into the grads (micro-batches after the first, with no_sync).
        """
        if not self.require_backward_grad_sync:
            self.module.backward(grad_logits, accumulate=accumulate)
            self.local_backwards += 1
            return
        self._compute = _core.current_stream(self.device)
        self._launched = 0
        self._pending = []
        try:
            self.module.backward(grad_logits, accumulate=accumulate, hook=self._hook)
            self._step_pending()  # the first layer's bucket: nothing reads it any more
        finally:
            if self._launched:
                self._join()
        if self._launched != len(self.buckets):
            raise RuntimeError(f"DistributedDataParallel.backward(): {self._launched} of "
                               f"{len(self.buckets)} buckets were all-reduced; the module's "
                               "backward must call hook(i) for every layer i")
        self.local_backwards = 0

    def _hook(self, layer: int) -> None:
        if self._pending:
            # Layer + 1's input-gradient GEMM, the last reader of the pending buckets'
            # weights, was enqueued before this layer's weight gradients.
            self._step_pending()
        for b in self._launch_at[layer]:
            self._launch(b)

    def _launch(self, b: int) -> None:
        """All-reduce bucket b on the communication stream once the compute stream's work
        so far (its gradients) is done."""
        ready = self._ready[b]
        ready.record(self._compute)
        comm_stream = self.comm_stream
        comm_stream.wait_event(ready)
        flat, comm = self._flat[b], self.group._comm
        with comm_stream:
            if self.grad_dtype is None:
                comm.all_reduce(flat, flat, _AVG)
            else:
                wire = self._wire_views[b]
                _core.copyto(wire, flat)
                comm.all_reduce(wire, wire, _AVG)
                _core.copyto(flat, wire)
        if self._step_in_backward:
            self._reduced[b].record(comm_stream)
            self._pending.append(b)
        self._launched += 1

    def _step_pending(self) -> None:
        """Step the optimizers of the pending buckets on the optimizer stream, after their
        all-reduce and after the compute stream's work so far (its reads of the weights)."""
        optim_stream = self.optim_stream
        for b in self._pending:
            free = self._free[b]
            free.record(self._compute)
            optim_stream.wait_event(self._reduced[b])
            optim_stream.wait_event(free)
            with optim_stream:
                self.bucket_optimizers[b].step()
        self._pending = []

    def _join(self) -> None:
        """The compute stream waits for everything enqueued on the communication stream
        (and on the optimizer stream, which waited for it)."""
        last = self.optim_stream if self._step_in_backward else self.comm_stream
        self._done.record(last)
        self._compute.wait_event(self._done)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """``with ddp.no_sync():`` backwards inside skip the all-reduce (gradient
        accumulation: the gradients add up locally; the first backward after the
        block all-reduces them). Nests; restored on errors."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # ---- measuring ---------------------------------------------------------------------

    def all_reduce_buckets(self) -> None:
        """all_reduce_buckets() -> None

        All-reduce every bucket now, as a backward does but with no backward
        to overlap: the communication stream waits for the current stream,
        runs every bucket's all-reduce (with the grad_dtype casts), and the
        current stream waits for it. Events recorded on the current stream
        around the call time the communication alone. The gradients are
        averaged again (no change where every rank holds the same values, up
        to rounding in a half grad_dtype). Bucket optimizers
        (:meth:`optimize_in_backward`) do not step.
        """
        self._compute = _core.current_stream(self.device)
        self._launched = 0
        stepping, self._step_in_backward = self._step_in_backward, False
        try:
            for b in range(len(self.buckets)):
                self._launch(b)
            self._join()
        finally:
            self._step_in_backward = stepping

    @property
    def bucket_bytes(self) -> list[int]:
        """Bytes each bucket's all-reduce sends (in grad_dtype), in communication order."""
        size = F32.itemsize if self.grad_dtype is None else self.grad_dtype.itemsize
        return [b.numel * size for b in self.buckets]

    def __repr__(self) -> str:
        wire = "float32" if self.grad_dtype is None else self.grad_dtype.name
        return (f"DistributedDataParallel({self.module!r}, rank={self.group.rank}, "
                f"world_size={self.group.world_size}, buckets={len(self.buckets)}, "
                f"grad_dtype={wire!r})")
