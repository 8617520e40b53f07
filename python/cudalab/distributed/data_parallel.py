"""DataParallel: one process drives an nn.MLP on several local GPUs, as torch.nn.DataParallel.

Every ``forward`` splits the batch's rows across the devices (torch.chunk's
split), brings the weights from the module on ``device_ids[0]`` to a replica
on every other device, runs every replica's forward (each enqueued on its
device's current stream, so they run at the same time) and gathers the
outputs onto ``output_device``. ``backward`` splits the gradient the same
way, runs every replica's backward and sums the replicas' float32 gradients
into the module's (an NCCL reduce onto ``device_ids[0]``), where the user's
optimizer then steps the module alone.

What a step costs beyond one GPU's work (P parameters, n devices, N rows;
:meth:`DataParallel.step_traffic` gives the bytes for a batch):

* replication, every forward: the module's weights cast to the compute dtype
  on ``device_ids[0]`` and broadcast (NCCL, one group call) to the n - 1
  replicas: P x itemsize bytes to each (fp32: 4, bf16/fp16: 2). torch's
  DataParallel replicates the float32 parameters every forward too;
* scatter: each replica's rows of the input copied to its device (a peer copy;
  the rows on ``device_ids[0]`` are used in place), and in the backward each
  replica's rows of the logits gradient;
* gather: every replica's logits copied into one (N, classes) array on
  ``output_device``;
* gradient reduction, after the last replica's backward (nothing overlaps
  it, as in torch): an NCCL reduce (sum) of every float32 gradient onto
  ``device_ids[0]``: P x 4 bytes from each replica;
* the optimizer step runs on ``device_ids[0]`` only, and one Python thread
  enqueues every replica's work in turn (n times the launch overhead).

DistributedDataParallel (one process per GPU) has none of the replication,
scatter or gather, all-reduces the gradients while the backward still runs,
and every process steps its own optimizer: why torch recommends it.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import numpy as np

from .. import _core
from ..devices import device as _device
from .._buffers import Buffers
from .._check import arg_error, check_array
from ..nn.layers import MLP
from ..nn.precision import Precision, get_precision
from .library import load

__all__ = ["DataParallel", "split_rows"]

# Seconds the in-process communicators' watchdog lets a collective run.
TIMEOUT = 600.0
# NCCL's reduction codes (the C layer takes them as ints).
_SUM = 0


def split_rows(rows: int, parts: int) -> list[tuple[int, int]]:
    """split_rows(rows, parts) -> list of (start, stop)

    The row ranges torch.chunk makes of `rows` rows in `parts` pieces: each
    ``ceil(rows / parts)`` rows, the last one smaller; fewer than `parts`
    pieces when the rows run out first (10 rows in 4: 3, 3, 3, 1; 5 rows in 4:
    2, 2, 1).

    Parameters
    ----------
    rows : int
        >= 1.
    parts : int
        >= 1.
    """
    rows = _check_count(rows, "split_rows", "rows")
    parts = _check_count(parts, "split_rows", "parts")
    size = -(-rows // parts)
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]


def _check_count(value: Any, func: str, param: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise arg_error(TypeError, func, param, f"expected an int, got {type(value).__name__}")
    value = operator.index(value)
    if value < 1:
        raise arg_error(ValueError, func, param, f"must be >= 1, got {value}")
    return value


def check_devices(devices: Any, func: str, param: str) -> list[int]:
    """A non-empty sequence of distinct device indices (ints >= 0), checked
    without a GPU; whether each exists is checked against device_count()."""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__len__"):
        raise arg_error(TypeError, func, param,
                        f"expected a sequence of device indices, got {type(devices).__name__}")
    out = []
    for d in devices:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise arg_error(TypeError, func, param,
                            f"expected device indices (ints), got {type(d).__name__}")
        d = operator.index(d)
        if d < 0:
            raise arg_error(ValueError, func, param, f"device indices are >= 0, got {d}")
        out.append(d)
    if not out:
        raise arg_error(ValueError, func, param, "needs at least one device")
    if len(set(out)) != len(out):
        raise arg_error(ValueError, func, param, f"lists a device twice: {out}")
    return out


def check_present(devices: Sequence[int], func: str, param: str) -> None:
    """ValueError unless every device exists (needs the driver)."""
    count = _core.device_count()
    missing = [d for d in devices if d >= count]
    if missing:
        raise arg_error(ValueError, func, param,
                        f"device {missing[0]} does not exist ({count} device"
                        f"{'' if count == 1 else 's'} visible)")


def enable_peers(a: int, b: int) -> None:
    """Peer access both ways between devices a and b where the hardware allows it, so
    copies between them go over NVLink / PCIe directly instead of through host memory."""
    if a != b and _core.can_access_peer(a, b) and _core.can_access_peer(b, a):
        _core.enable_peer_access(b, a)
        _core.enable_peer_access(a, b)


def _check_module(module: Any, func: str) -> MLP:
    if not isinstance(module, MLP):
        raise arg_error(TypeError, func, "module",
                        f"expected a cudalab.nn.MLP, got {type(module).__name__}")
    return module


class DataParallel:
    """DataParallel(module, device_ids=None, output_device=None)

    Data parallelism in one process, as torch.nn.DataParallel: each forward
    splits the batch across `device_ids` and runs a replica of `module` on
    each; backward sums the replicas' gradients into `module`'s.

    Parameters
    ----------
    module : nn.MLP
        On ``device_ids[0]`` (every layer). Its Parameters stay the ones to
        optimize: make the optimizer over ``module.parameters()`` (on
        ``device_ids[0]``).
    device_ids : sequence of int, optional
        Distinct devices; default every visible device.
    output_device : int, optional
        Where ``forward`` gathers the output; default ``device_ids[0]``.

    Attributes
    ----------
    module : nn.MLP
    device_ids : list of int
    output_device : int
    replicas : list of nn.MLP
        ``replicas[0]`` is `module`; ``replicas[i]`` lives on ``device_ids[i]``
        and only computes (its weights arrive by broadcast each forward).
    last_split : list of (start, stop)
        The rows each replica received in the last forward (fewer pieces than
        devices when the batch has fewer rows: the rest sit idle).

    Notes
    -----
    The per-step costs are listed in this module's docstring; use
    ``forward(x, precision, cast_weights=False)`` for the micro-batches
    after the first of an accumulated step (the replication is skipped, as
    the weights have not changed).
    """

    def __init__(self, module: MLP, device_ids: Optional[Sequence[int]] = None,
                 output_device: Optional[int] = None) -> None:
        module = _check_module(module, "DataParallel")
        if device_ids is not None:
            device_ids = check_devices(device_ids, "DataParallel", "device_ids")
        if output_device is not None:
            output_device = check_devices([output_device], "DataParallel", "output_device")[0]
        if device_ids is None:
            device_ids = list(range(_core.device_count()))
            if not device_ids:
                raise _core.NoDeviceError("DataParallel(): no CUDA device is available")
        check_present(device_ids, "DataParallel", "device_ids")
        if output_device is None:
            output_device = device_ids[0]
        check_present([output_device], "DataParallel", "output_device")
        where = sorted({layer.device for layer in module.layers})
        if where != [device_ids[0]]:
            raise arg_error(ValueError, "DataParallel", "module",
                            f"must have its parameters on device_ids[0] (device "
                            f"{device_ids[0]}), found them on device"
                            f"{'s' if len(where) > 1 else ''} {', '.join(map(str, where))}: "
                            f"call module.to({device_ids[0]}) first")
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.replicas: list[MLP] = [module]
        self._comms: list[Any] = []
        if len(device_ids) > 1:
            load()
            self._comms = _core._nccl_init_all(device_ids, TIMEOUT)
            for d in device_ids[1:]:
                with _device(d):
                    self.replicas.append(MLP(module.sizes, module.activation, seed=module.seed))
        for d in device_ids[1:]:
            enable_peers(device_ids[0], d)
            enable_peers(output_device, d)
        enable_peers(output_device, device_ids[0])
        # Per replica: the scattered input rows and logits-gradient rows (other devices).
        self._inputs = [Buffers() for _ in device_ids]
        self._grads = [Buffers() for _ in device_ids]
        self._output = Buffers()  # the gathered logits, on output_device
        self._replicated: Optional[Precision] = None  # the precision replicas hold casts of
        self.last_split: list[tuple[int, int]] = []
        self._live = False  # a forward's activations wait for their backward

    # ---- the step ----------------------------------------------------------------------

    def parameters(self) -> list:
        """The module's Parameters (what the optimizer steps)."""
        return self.module.parameters()

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def replicate(self, precision: Any = "fp32") -> None:
        """replicate(precision='fp32') -> None

        Cast the module's weights to the compute dtype on ``device_ids[0]``
        and broadcast them to every replica (one NCCL group call over every
        weight and bias). ``forward`` does it (unless ``cast_weights=False``);
        public so that its cost can be timed alone.
        """
        prec = get_precision(precision, "replicate")
        self.module.cast_weights(prec)
        if self._replicated is not prec:
            for rep in self.replicas[1:]:
                rep.cast_weights(prec)  # allocates the casts (fp32: uses the masters)
            self._replicated = prec
        if not self._comms:
            return
        _core._nccl_group_start()
        try:
            for j, layer in enumerate(self.module.layers):
                for attr in ("_w", "_b"):
                    if getattr(layer, attr) is None:
                        continue
                    for rep, comm in zip(self.replicas, self._comms):
                        buf = getattr(rep.layers[j], attr)
                        comm.broadcast(buf, buf, 0)
        finally:
            _core._nccl_group_end()

    def forward(self, x: _core.DeviceArray, precision: Any = "fp32", *,
                cast_weights: bool = True) -> _core.DeviceArray:
        """forward(x, precision='fp32', *, cast_weights=True) -> DeviceArray

        The logits of every row of `x`, gathered on ``output_device``.

        Parameters
        ----------
        x : DeviceArray
            (N, sizes[0]), any float dtype, on any device: its rows are split
            as torch.chunk splits them and each piece copied to its replica's
            device (the piece already there is used in place).
        precision : Precision or str, optional
        cast_weights : bool, optional
            False skips the replication (the replicas keep the last weights).

        Returns
        -------
        DeviceArray
            (N, sizes[-1]) in the compute dtype on ``output_device``, in a
            buffer overwritten by the next forward.
        """
        prec = get_precision(precision, "forward")
        check_array(x, "forward", "x")
        if x.ndim != 2 or x.shape[1] != self.module.sizes[0] or x.shape[0] < 1:
            raise arg_error(ValueError, "forward", "x",
                            f"expected shape (N, {self.module.sizes[0]}) with N >= 1, got "
                            f"{x.shape}")
        if cast_weights or self._replicated is not prec:
            self.replicate(prec)
        parts = split_rows(x.shape[0], len(self.device_ids))
        outs = []
        for r, (start, stop) in enumerate(parts):
            d = self.device_ids[r]
            xr = _on_device(x[start:stop], d, self._inputs[r], "x")
            with _device(d):
                outs.append(self.replicas[r].forward(xr, prec, cast_weights=False))
        self.last_split = parts
        self._live = True
        if len(parts) == 1 and self.device_ids[0] == self.output_device:
            return outs[0]
        with _device(self.output_device):
            out = self._output.get("logits", (x.shape[0], self.module.sizes[-1]),
                                   prec.compute_dtype)
        for (start, stop), o in zip(parts, outs):
            _core.copyto(out[start:stop], o)
        return out

    __call__ = forward

    def backward(self, grad_logits: _core.DeviceArray, *, accumulate: bool = False) -> None:
        """backward(grad_logits, *, accumulate=False) -> None

        The module's float32 gradients: every replica's backward on its rows
        of `grad_logits`, then an NCCL reduce (sum) of the replicas'
        gradients into the module's on ``device_ids[0]``.

        Parameters
        ----------
        grad_logits : DeviceArray
            (N, sizes[-1]) in the compute dtype of the last forward (the
            gradient of the loss over the whole batch, e.g. cross_entropy's
            ``grad=`` on the gathered logits), on any device.
        accumulate : bool, optional
            Add into the module's grads instead of overwriting them.
        """
        if not self._live:
            raise RuntimeError("DataParallel.backward() called without a forward() before it "
                               "(one backward per forward)")
        parts = self.last_split
        rows = parts[-1][1]
        check_array(grad_logits, "backward", "grad_logits")
        if grad_logits.ndim != 2 or grad_logits.shape != (rows, self.module.sizes[-1]):
            raise arg_error(ValueError, "backward", "grad_logits",
                            f"expected shape {(rows, self.module.sizes[-1])} (the last "
                            f"forward's), got {grad_logits.shape}")
        self._live = False
        for r, (start, stop) in enumerate(parts):
            d = self.device_ids[r]
            g = _on_device(grad_logits[start:stop], d, self._grads[r], "grad")
            with _device(d):
                # Replicas other than the module start from zero: the reduce adds them.
                self.replicas[r].backward(g, accumulate=bool(accumulate) and r == 0)
        if not self._comms:
            return
        for rep in self.replicas[len(parts):]:  # idle this step: they add nothing
            with _device(rep.device):
                rep.zero_grad()
        params = [rep.parameters() for rep in self.replicas]
        _core._nccl_group_start()
        try:
            for j in range(len(params[0])):
                for rep_params, comm in zip(params, self._comms):
                    g = rep_params[j].grad
                    comm.reduce(g, g, _SUM, 0)
        finally:
            _core._nccl_group_end()

    # ---- what a step moves -------------------------------------------------------------

    def step_traffic(self, batch: int, precision: Any = "fp32",
                     x_dtype: Any = np.float32) -> dict[str, int]:
        """step_traffic(batch, precision='fp32', x_dtype=float32) -> dict

        Bytes one training step moves between devices, by part: 'replicate'
        (the weight broadcast, bytes received by all replicas together),
        'scatter' (input rows, from x on device_ids[0], and logits-gradient
        rows, from output_device, sent to other devices), 'gather' (logits
        brought to output_device) and 'reduce' (float32 gradients sent to
        device_ids[0]); 'total' sums them.
        DistributedDataParallel moves only an all-reduce of the gradients.
        """
        batch = _check_count(batch, "step_traffic", "batch")
        prec = get_precision(precision, "step_traffic")
        half = int(np.dtype(prec.compute_dtype).itemsize)
        xsize = int(np.dtype(x_dtype).itemsize)
        sizes = self.module.sizes
        n_params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
        parts = split_rows(batch, len(self.device_ids))
        remote = [(stop - start, self.device_ids[r]) for r, (start, stop) in enumerate(parts)]
        scatter = sum(rows * sizes[0] * xsize for rows, d in remote if d != self.device_ids[0])
        scatter += sum(rows * sizes[-1] * half for rows, d in remote if d != self.output_device)
        gather = sum(rows * sizes[-1] * half for rows, d in remote if d != self.output_device)
        replicas = len(self.device_ids) - 1
        traffic = {
            "replicate": replicas * n_params * (4 if not prec.is_half else half),
            "scatter": scatter,
            "gather": gather,
            "reduce": replicas * n_params * 4,
        }
        traffic["total"] = sum(traffic.values())
        return traffic

    def __repr__(self) -> str:
        return (f"DataParallel({self.module!r}, device_ids={self.device_ids}, "
                f"output_device={self.output_device})")


def _on_device(a: _core.DeviceArray, device: int, buffers: Buffers,
               name: str) -> _core.DeviceArray:
    """`a` itself when it is on `device`, else its copy in a buffer there (a peer copy,
    ordered after `a`'s device's current stream, before later work on both)."""
    if a.device == device:
        return a
    with _device(device):
        buf = buffers.get(name, a.shape, a.dtype)
    _core.copyto(buf, a)
    return buf
