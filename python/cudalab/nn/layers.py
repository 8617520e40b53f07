"""Parameters and layers: Parameter, Linear and MLP, with explicit backward passes.

There is no autograd. A layer's ``forward`` keeps what its backward needs
(its input and its activation's aux) in buffers it owns; ``backward`` takes
the gradient of the layer's *pre-activation* and writes float32 gradients
into its Parameters. The activation derivative is fused into the next
layer's input-gradient GEMM (cuBLASLt's DRELU / DGELU epilogues), which is
why an MLP walks its layers itself instead of calling an activation backward.

Every buffer a step touches is allocated by the first call with a given
batch shape and precision and reused afterwards, so once a step has run, the
next one makes no allocation of its own and can be captured in a CUDA graph.

Devices. A layer lives on the device of its weights (``.device``); ``to()``
moves it, and its forward and backward make that device current while they
run (allocations and the GELU fusion measurement happen there), whichever
device the caller has current, as a torch module does after ``.to()``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

import numpy as np

from .. import _core
from .. import devices as _devices
from .. import random as _random
from . import fusion
from .functional import _gelu_aux_row, _relu_mask_bytes
from .._buffers import Buffers
from .._check import arg_error, check_array, check_bool, check_int, check_seed
from ._util import F32, check_activation, derive_seed, fill_zero
from .precision import Precision, get_precision

__all__ = ["Linear", "MLP", "Parameter"]

U8 = np.dtype(np.uint8)
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _on_own_device(method: _Method) -> _Method:
    """Run `method` with its object's device (``self.device``) current.

    Buffers are allocated on the current device and nn.fusion times on the
    current stream, so a layer moved to another device switches to it for
    the call (one device query when it is current already).
    """
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        dev = self.device
        if dev == _core.current_device():
            return method(self, *args, **kwargs)
        with _devices.device(dev):
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


class Parameter:
    """Parameter(name, value)

    A trainable float32 tensor: the master ``value`` and its ``grad``.

    Parameters
    ----------
    name : str
    value : DeviceArray
        float32, C-contiguous (the fused optimizers read it packed). Kept,
        not copied.

    Attributes
    ----------
    name : str
    value : DeviceArray
        The float32 master weights, updated in place by the optimizers.
    grad : DeviceArray
        float32, value's shape, zero at construction; written by a layer's
        backward (added to with ``accumulate=True``).
    """

    __slots__ = ("name", "value", "grad")

    def __init__(self, name: str, value: _core.DeviceArray) -> None:
        if not isinstance(name, str):
            raise arg_error(TypeError, "Parameter", "name",
                            f"expected a str, got {type(name).__name__}")
        check_array(value, "Parameter", "value")
        if value.dtype != F32:
            raise arg_error(TypeError, "Parameter", "value",
                            f"master weights are float32, got {value.dtype}")
        if not value.is_contiguous:
            raise arg_error(ValueError, "Parameter", "value", "must be C-contiguous")
        self.name = name
        self.value = value
        with _devices.device(value.device):  # the grad lives beside the value
            self.grad = _core.zeros(value.shape, dtype=F32)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def device(self) -> int:
        return self.value.device

    @property
    def size(self) -> int:
        return self.value.size

    def zero_grad(self) -> None:
        """Set ``grad`` to zero on the device (inf and NaN included)."""
        fill_zero(self.grad)

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.shape})"


class Linear:
    """Linear(in_features, out_features, bias=True, activation=None, *, seed=0)

    ``y = act(x @ weight.T + bias)`` with PyTorch's layout and default
    initialization: weight and bias uniform in ``[-1/sqrt(in_features),
    1/sqrt(in_features))``, drawn on the device from `seed` (the same seed
    gives the same values).

    Parameters
    ----------
    in_features, out_features : int
        >= 1. Multiples of 8 suit cuBLASLt's fused epilogues best; other
        sizes may be refused by it (CudalabError on the first forward).
    bias : bool, optional
    activation : {None, 'relu', 'gelu'}, optional
        Applied in the GEMM's epilogue; GELU is the tanh form.
    seed : int, optional
        In [0, 2**64).

    Attributes
    ----------
    weight : Parameter
        (out_features, in_features).
    bias : Parameter or None
        (out_features,).
    input, aux : DeviceArray or None
        What the last forward kept for the backward: the layer's input in the
        compute dtype and the activation's aux (GELU: the pre-activation;
        ReLU: cuBLASLt's bit mask).
    device : int
        The device of the weights (the current one at construction); see
        :meth:`to`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: Optional[str] = None, *, seed: int = 0) -> None:
        self.in_features = check_int(in_features, "Linear", "in_features")
        self.out_features = check_int(out_features, "Linear", "out_features")
        check_bool(bias, "Linear", "bias")
        self.activation = check_activation(activation, "Linear")
        self.seed = check_seed(seed, "Linear")
        # Arguments first, then the device: without a GPU the error names Linear().
        _core._parse_device(None, "Linear")
        bound = 1.0 / math.sqrt(self.in_features)
        shape = (self.out_features, self.in_features)
        w = _random.uniform(shape, -bound, bound, F32, seed=derive_seed(self.seed, 0))
        self.weight = Parameter("weight", w)
        self.bias: Optional[Parameter] = None
        if bias:
            b = _random.uniform(self.out_features, -bound, bound, F32,
                                seed=derive_seed(self.seed, 1))
            self.bias = Parameter("bias", b)
        self.input: Optional[_core.DeviceArray] = None
        self.aux: Optional[_core.DeviceArray] = None
        self._buffers = Buffers()
        self._precision: Optional[Precision] = None
        self._w: Optional[_core.DeviceArray] = None  # weight in the compute dtype
        self._b: Optional[_core.DeviceArray] = None

    def parameters(self) -> list[Parameter]:
        """The layer's Parameters: weight, then bias (when it has one)."""
        return [self.weight] if self.bias is None else [self.weight, self.bias]

    @property
    def device(self) -> int:
        """The device of the layer's weights, where its forward and backward run."""
        return self.weight.value.device

    def to(self, device: Any) -> "Linear":
        """to(device) -> Linear

        Move the layer to `device`, as torch's ``Module.to``: the float32
        master weights and their grads are copied there (DeviceArray.to: one
        peer copy each, ordered on both devices' current streams) and replace
        the Parameters' arrays; the per-shape buffers, the weight casts and
        what the last forward kept are dropped, so the next forward allocates
        on the new device. Nothing happens when the layer is there already.

        Parameters
        ----------
        device : int or str
            A device index, 'cuda' (the current device) or 'cuda:N'.

        Returns
        -------
        Linear
            self.

        Notes
        -----
        The Parameter objects stay the same, but an optimizer made before the
        move keeps its state on the old device (its next step fails): make
        optimizers after moving, as in torch. A grad that was a view of a
        larger buffer (DistributedDataParallel's buckets) becomes an array
        of its own.
        """
        dev = _core._parse_device_spec(device, "to")
        if dev == self.device:
            return self
        for p in self.parameters():
            p.value = p.value.to(dev)
            p.grad = p.grad.to(dev)
        self._reset()
        return self

    def _reset(self) -> None:
        """Forget every buffer, the weight casts and the last forward's state."""
        self._buffers.clear()
        self._precision = None
        self._w = self._b = None
        self.input = self.aux = None

    def twin(self) -> "Linear":
        """A Linear sharing this one's Parameters (master weights and grads) with
        buffers of its own: one per micro-batch of a pipeline stage
        (cudalab.distributed.Pipeline), so several forwards can be live at once.
        Its weight casts are this layer's (:meth:`share_cast`); forward it with
        ``cast_weights=False``."""
        twin = object.__new__(Linear)
        twin.in_features, twin.out_features = self.in_features, self.out_features
        twin.activation, twin.seed = self.activation, self.seed
        twin.weight, twin.bias = self.weight, self.bias
        twin.input = twin.aux = None
        twin._buffers = Buffers()
        twin._precision = None
        twin._w = twin._b = None
        return twin

    def share_cast(self, source: "Linear") -> None:
        """Use `source`'s weight casts (same Parameters, cast by source.cast_weights)."""
        self._precision, self._w, self._b = source._precision, source._w, source._b

    @_on_own_device
    def cast_weights(self, precision: Any = "fp32") -> None:
        """Copy the float32 master weights into the compute dtype's buffers.

        ``forward`` does it by default; with gradient accumulation, call it once
        per optimizer step and pass ``cast_weights=False`` to the forwards.
        A float32 precision uses the master weights directly (no copy).
        """
        prec = get_precision(precision, "cast_weights")
        self._precision = prec
        if not prec.is_half:
            self._w = self.weight.value
            self._b = None if self.bias is None else self.bias.value
            return
        dt = prec.compute_dtype
        self._w = self._buffers.get("weight", self.weight.shape, dt)
        _core.copyto(self._w, self.weight.value)
        self._b = None
        if self.bias is not None:
            self._b = self._buffers.get("bias", self.bias.shape, dt)
            _core.copyto(self._b, self.bias.value)

    @_on_own_device
    def forward(self, x: _core.DeviceArray, precision: Any = "fp32", *,
                cast_weights: bool = True) -> _core.DeviceArray:
        """forward(x, precision='fp32', *, cast_weights=True) -> DeviceArray

        The layer's output (N, out_features) in the compute dtype, in a buffer
        the layer owns (overwritten by the next forward).

        Parameters
        ----------
        x : DeviceArray
            (N, in_features), any float dtype (cast to the compute dtype into
            a buffer when it differs), on the layer's device; kept, not
            copied, when it matches: leave it unchanged until the backward.
        precision : Precision or str, optional
        cast_weights : bool, optional
            False reuses the weight copies of the last cast (same precision).
        """
        prec = get_precision(precision, "forward")
        return self._forward(x, prec, cast_weights, self._buffers)

    def _forward(self, x: Any, prec: Precision, cast_weights: bool,
                 store: Any) -> _core.DeviceArray:
        """forward() on the current device, its output and aux taken from `store`
        (``get(name, shape, dtype)``: the layer's own buffers, or the shared ones of
        a checkpointed MLP's segment position)."""
        x = self._check_input(x)
        if cast_weights or self._precision is not prec or self._w is None:
            self.cast_weights(prec)
        dt = prec.compute_dtype
        if x.dtype != dt:
            xc = self._buffers.get("input", x.shape, dt)
            _core.copyto(xc, x)
            x = xc
        rows = x.shape[0]
        y = store.get("output", (rows, self.out_features), dt)
        aux = None
        if self.activation == "gelu":  # rows of the pre-activation a multiple of 8 elements apart
            aux = store.get("aux", (rows, _gelu_aux_row(self.out_features)), dt)
            aux = aux[:, : self.out_features]
        elif self.activation == "relu":
            aux = store.get("aux", (rows, _relu_mask_bytes(self.out_features)), U8)
        mp = prec.matmul_precision
        if self.activation == "gelu":
            self._gelu_forward(x, y, aux, mp)
        else:
            _core._nn_linear(x, self._w, self._b, self.activation, y, aux, mp)
        self.input, self.aux = x, aux
        return y

    def _gelu_forward(self, x: _core.DeviceArray, y: _core.DeviceArray,
                      aux: _core.DeviceArray, mp: Optional[str]) -> None:
        """y = gelu(z), aux = z = x @ W.T + b: in the GEMM's epilogue, or as a GEMM
        writing z and a GELU kernel, whichever nn.fusion measured faster."""
        def fused() -> None:
            _core._nn_linear(x, self._w, self._b, "gelu", y, aux, mp)

        def split() -> None:
            _core._nn_linear(x, self._w, self._b, None, aux, None, mp)
            _core.gelu(aux, approximate="tanh", out=y)

        key = ("gelu forward", x.shape[0], self.in_features, self.out_features, x.dtype.name, mp)
        (fused if fusion.use_fused(key, fused, split) else split)()

    def _check_input(self, x: Any) -> _core.DeviceArray:
        check_array(x, "forward", "x")
        dev = self.weight.value.device
        if x.device != dev:
            raise arg_error(ValueError, "forward", "x",
                            f"is on device {x.device} but the layer is on device {dev}: move "
                            f"the input (x.to({dev})) or the layer (.to({x.device}))")
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise arg_error(ValueError, "forward", "x",
                            f"expected shape (N, {self.in_features}), got {x.shape}")
        if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
            raise arg_error(TypeError, "forward", "x", f"expected a float array, got {x.dtype}")
        return x

    @_on_own_device
    def backward(self, grad: _core.DeviceArray, *, accumulate: bool = False,
                 input_grad: bool = True, activation: Optional[str] = None,
                 aux: Optional[_core.DeviceArray] = None,
                 out: Optional[_core.DeviceArray] = None) -> Optional[_core.DeviceArray]:
        """backward(grad, *, accumulate=False, input_grad=True, activation=None, aux=None, out=None)

        Gradients of the last forward: weight and bias into the Parameters
        (float32), and the input's gradient.

        Parameters
        ----------
        grad : DeviceArray
            (N, out_features) in the compute dtype: the gradient of this
            layer's *pre-activation* (of its output when it has no
            activation). For a layer with one, apply the activation's
            derivative first (``relu_grad`` on the layer's output,
            ``gelu_grad(..., approximate='tanh')`` on ``aux``), or let the next
            layer's backward fuse it, as MLP does.
        accumulate : bool, optional
            Add into the Parameters' grads instead of overwriting them.
        input_grad : bool, optional
            False skips the input gradient (the first layer needs none).
        activation, aux : optional
            The activation and aux of the layer that produced this layer's
            input: its derivative is fused into the input-gradient GEMM, which
            then returns the gradient of *that* layer's pre-activation.
        out : DeviceArray, optional
            Where the input gradient goes: (N, in_features) in the compute
            dtype. Default: a buffer the layer owns. It may be this layer's
            own input (the previous layer's output), which the weight
            gradient has read by then: MLP does so, and keeps no separate
            gradient buffers.

        Returns
        -------
        DeviceArray or None
            (N, in_features) in the compute dtype: `out`, or the layer's
            buffer; None when `input_grad` is False.
        """
        return self._backward(grad, bool(accumulate), input_grad, activation, aux, out)

    def _check_grad(self, grad: Any) -> None:
        """The backward's checks of `grad` against the last forward."""
        if self.input is None or self._precision is None:
            raise RuntimeError("Linear.backward() called before forward()")
        check_array(grad, "backward", "grad")
        want = (self.input.shape[0], self.out_features)
        dt = self._precision.compute_dtype
        if grad.shape != want or grad.dtype != dt:
            raise arg_error(ValueError, "backward", "grad",
                            f"expected shape {want} and dtype {dt} (the last "
                            f"forward's), got {grad.shape} {grad.dtype}")
        if grad.device != self.input.device:
            raise arg_error(ValueError, "backward", "grad",
                            f"is on device {grad.device} but the layer is on device "
                            f"{self.input.device}")

    def _backward(self, grad: _core.DeviceArray, accumulate: bool, input_grad: bool,
                  activation: Optional[str], aux: Optional[_core.DeviceArray],
                  out: Optional[_core.DeviceArray],
                  hook: Optional[Callable[[int], Any]] = None,
                  index: int = 0) -> Optional[_core.DeviceArray]:
        """backward() on the current device; ``hook(index)`` right after the weight
        and bias gradients are enqueued, before the input gradient's GEMM."""
        self._check_grad(grad)
        prec, x = self._precision, self.input
        self._weight_grads(grad, x, prec, accumulate)
        if hook is not None:
            hook(index)
        if not input_grad:
            return None
        if out is None:
            gx = self._buffers.get("grad_input", x.shape, prec.compute_dtype)
        else:
            gx = check_array(out, "backward", "out")
            if gx.shape != x.shape or gx.dtype != prec.compute_dtype:
                raise arg_error(ValueError, "backward", "out",
                                f"expected shape {x.shape} and dtype {prec.compute_dtype} (the "
                                f"last forward's input), got {gx.shape} {gx.dtype}")
        mp = prec.matmul_precision
        if activation != "gelu":
            _core._nn_linear_backward_input(grad, self._w, gx, aux, activation, None, mp)
            return gx

        def fused() -> None:
            _core._nn_linear_backward_input(grad, self._w, gx, aux, "gelu", None, mp)

        def split() -> None:
            _core._nn_linear_backward_input(grad, self._w, gx, None, None, None, mp)
            _core.gelu_grad(gx, aux, approximate="tanh", out=gx)

        key = ("gelu backward", x.shape[0], self.in_features, self.out_features, x.dtype.name,
               mp)
        (fused if fusion.use_fused(key, fused, split) else split)()
        return gx

    def _weight_grads(self, grad: _core.DeviceArray, x: _core.DeviceArray, prec: Precision,
                      accumulate: bool) -> None:
        """Weight and bias gradients from one GEMM into the float32 Parameter grads.

        The GEMM writes float32 whatever the compute dtype (half operands,
        float32 accumulator): no half copy to cast, accumulation in float32.
        """
        w, b, mp = self.weight, self.bias, prec.matmul_precision
        if not accumulate:
            _core._nn_linear_backward_weight(grad, x, w.grad, None if b is None else b.grad,
                                             False, mp)
            return
        # The GEMM adds into the weight grad; its bias-gradient epilogue cannot
        # accumulate, so the bias gradient is summed and added separately.
        _core._nn_linear_backward_weight(grad, x, w.grad, None, True, mp)
        if b is not None:
            db = self._buffers.get("bias_grad", b.shape, grad.dtype)
            _core.sum(grad, axis=0, out=db)
            _core.add(b.grad, db, out=b.grad)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.zero_grad()

    def __repr__(self) -> str:
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r})")


class MLP:
    """MLP(sizes, activation='gelu', *, seed=0, checkpoint_segments=None)

    Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with the
    activation after every layer but the last (the logits).

    Parameters
    ----------
    sizes : sequence of int
        At least two sizes, each >= 1.
    activation : {'gelu', 'relu', None}, optional
    seed : int, optional
        Layer i is initialized from its own key derived from (seed, i).
    checkpoint_segments : int or None, optional
        Gradient checkpointing (activation recomputation) in that many
        segments, as :meth:`checkpoint` sets it; None (the default) keeps
        every layer's activations.

    Attributes
    ----------
    layers : list of Linear
    device : int
        The first layer's device: where the input goes, and where every layer
        is unless a :class:`~cudalab.distributed.Pipeline` spread them.
    checkpoint_segments : int or None
        See :meth:`checkpoint`.

    Notes
    -----
    Gradient checkpointing, ``checkpoint(k)``: the layers are split into k
    contiguous segments (:func:`segment_bounds`: sizes differ by at most one,
    the larger ones last). The forward keeps each segment's *checkpoint*, the
    output and activation aux of its last layer (the next segment's input and
    what its backward's fused activation derivative reads); the layers inside
    a segment write their outputs and aux into one set of buffers shared by
    all segments (position j of every segment uses the same buffers, sized for
    the largest layer there). The backward recomputes a segment's inner layers
    from its input (same GEMMs, same precision, the same weight casts) just
    before running that segment's backward; the last segment is not
    recomputed (its activations are still in the shared buffers), as
    ``torch.utils.checkpoint.checkpoint_sequential`` runs its last segment
    without checkpointing.

    So the activations alive at once are k checkpoints plus one segment's
    inner layers instead of every layer's: about ``k + n / k`` layers' worth
    for n layers, smallest near ``k = sqrt(n)``; ``k = 1`` and ``k = n`` keep
    as much as no checkpointing. The price is one more forward GEMM for each
    recomputed layer (the inner layers of every segment but the last).

    The recomputation is deterministic (the same GEMMs on the same inputs), so
    the gradients equal those of the plain step bitwise. A step still makes no
    allocation once a step of the same batch shape and precision has run (the
    shared buffers are sized before each forward and reused), so a
    checkpointed step can be captured in a CUDA graph (``Trainer(graph=True)``).
    """

    def __init__(self, sizes: Sequence[int], activation: Optional[str] = "gelu", *,
                 seed: int = 0, checkpoint_segments: Optional[int] = None) -> None:
        if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__len__"):
            raise arg_error(TypeError, "MLP", "sizes",
                            f"expected a sequence of ints, got {type(sizes).__name__}")
        if len(sizes) < 2:
            raise arg_error(ValueError, "MLP", "sizes",
                            f"needs at least 2 sizes (input and output), got {len(sizes)}")
        self.sizes = tuple(check_int(s, "MLP", "sizes") for s in sizes)
        self.activation = check_activation(activation, "MLP")
        self.seed = check_seed(seed, "MLP")
        # Arguments first, then the device: without a GPU the error names MLP().
        _core._parse_device(None, "MLP")
        last = len(self.sizes) - 2
        self.layers = [
            Linear(n_in, n_out, True, None if i == last else self.activation,
                   seed=derive_seed(self.seed, i))
            for i, (n_in, n_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:]))
        ]
        for i, layer in enumerate(self.layers):
            for p in layer.parameters():
                p.name = f"{i}.{p.name}"  # torch.nn.Sequential's names
        # The backward overwrites the activations it reads: one backward per forward.
        self._activations_live = False
        self._segments: Optional[list[tuple[int, int]]] = None
        self._shared: list[SharedActivations] = []
        self._set_checkpoint(checkpoint_segments, "MLP", "checkpoint_segments")

    @property
    def checkpoint_segments(self) -> Optional[int]:
        """The number of checkpointed segments, or None (no checkpointing)."""
        return None if self._segments is None else len(self._segments)

    def checkpoint(self, segments: Optional[int]) -> "MLP":
        """checkpoint(segments) -> MLP

        Turn gradient checkpointing on in `segments` segments, or off (None);
        see the class notes for what is kept and what is recomputed.

        Every layer's activation buffers and weight casts are dropped (the
        next forward allocates what the new layout needs), and so is the last
        forward's state: run a forward before the next backward.

        Parameters
        ----------
        segments : int or None
            In [1, number of layers]. 1 and the number of layers keep as much
            as no checkpointing (one segment is never recomputed; segments of
            one layer have no inner layers); about ``sqrt(number of layers)``
            keeps least.

        Returns
        -------
        MLP
            self.
        """
        return self._set_checkpoint(segments, "checkpoint", "segments")

    def _set_checkpoint(self, segments: Optional[int], func: str, param: str) -> "MLP":
        n = len(self.layers)
        if segments is not None:
            segments = check_int(segments, func, param)
            if segments > n:
                raise arg_error(ValueError, func, param,
                                f"must be in [1, {n}] (the number of layers), got {segments}")
        for layer in self.layers:
            layer._reset()  # frees the activations of layers that now share buffers
        self._activations_live = False
        if segments is None:
            self._segments, self._shared = None, []
            return self
        self._segments = segment_bounds(n, segments)
        inner = max(b - a for a, b in self._segments) - 1
        self._shared = [SharedActivations() for _ in range(inner)]
        return self

    def parameters(self) -> list[Parameter]:
        """Every Parameter, layer by layer (weight, then bias), as torch orders them."""
        return [p for layer in self.layers for p in layer.parameters()]

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        return ((p.name, p) for p in self.parameters())

    @property
    def device(self) -> int:
        """The first layer's device (see the class attributes)."""
        return self.layers[0].weight.value.device

    def to(self, device: Any) -> "MLP":
        """to(device) -> MLP

        Move every layer to `device` (see :meth:`Linear.to`): master weights
        and grads are copied there, buffers and weight casts dropped, so the
        next forward allocates there. Make optimizers after moving.

        Parameters
        ----------
        device : int or str
            A device index, 'cuda' (the current device) or 'cuda:N'.

        Returns
        -------
        MLP
            self, as torch's ``Module.to``.
        """
        dev = _core._parse_device_spec(device, "to")
        if any(layer.device != dev for layer in self.layers):
            for layer in self.layers:
                layer.to(dev)
            for shared in self._shared:
                shared.clear()
            self._activations_live = False  # the last forward's state went with the buffers
        return self

    @_on_own_device
    def cast_weights(self, precision: Any = "fp32") -> None:
        """Copy every master weight into the compute dtype (see Linear.cast_weights)."""
        prec = get_precision(precision, "cast_weights")
        for layer in self.layers:
            layer.cast_weights(prec)

    @_on_own_device
    def forward(self, x: _core.DeviceArray, precision: Any = "fp32", *,
                cast_weights: bool = True) -> _core.DeviceArray:
        """forward(x, precision='fp32', *, cast_weights=True) -> DeviceArray

        The logits (N, sizes[-1]) in the compute dtype, in the last layer's
        output buffer (overwritten by the next forward).

        Parameters
        ----------
        x : DeviceArray
            (N, sizes[0]), any float dtype; kept as it is when it has the
            compute dtype: leave it unchanged until the backward.
        precision : Precision or str, optional
            "fp32", "tf32", "fp16", "bf16" or a Precision.
        cast_weights : bool, optional
            False reuses the last cast's weight copies (gradient accumulation:
            cast once per optimizer step).
        """
        prec = get_precision(precision, "forward")
        if self._segments is None:
            h = x
            for layer in self.layers:
                h = layer.forward(h, prec, cast_weights=cast_weights)
        else:
            h = self._checkpointed_forward(x, prec, cast_weights)
        self._activations_live = True
        return h

    def _checkpointed_forward(self, x: Any, prec: Precision,
                              cast_weights: bool) -> _core.DeviceArray:
        """The forward with checkpoints: each segment's last layer writes into its own
        buffers (kept until the backward), the layers inside a segment into the
        shared ones (overwritten by the next segment)."""
        x = self.layers[0]._check_input(x)
        self._size_shared(x.shape[0], prec)
        h = x
        for a, b in self._segments:
            for i in range(a, b):
                store = self.layers[i]._buffers if i == b - 1 else self._shared[i - a]
                h = self.layers[i]._forward(h, prec, cast_weights, store)
        return h

    def _size_shared(self, rows: int, prec: Precision) -> None:
        """Size every shared buffer for the largest layer at its position (before the
        forward, so that no view of an earlier layer points at a buffer replaced since)."""
        need: list[dict[str, tuple[int, Any]]] = [{} for _ in self._shared]
        dt = prec.compute_dtype
        for a, b in self._segments:
            for i in range(a, b - 1):
                for name, (elements, dtype) in activation_elements(
                        self.layers[i].out_features, rows, dt, self.layers[i].activation).items():
                    have = need[i - a].get(name, (0, dtype))[0]
                    need[i - a][name] = (max(have, elements), dtype)
        for shared, names in zip(self._shared, need):
            for name, (elements, dtype) in names.items():
                shared.reserve(name, elements, dtype)

    def _recompute(self, a: int, b: int) -> None:
        """Run segment [a, b)'s inner layers again from its input, into the shared
        buffers: the values the plain forward kept, bit for bit (same GEMMs, inputs,
        weight casts, and the GELU form nn.fusion chose for the forward)."""
        prec = self.layers[a]._precision
        h = self.layers[a].input  # the previous checkpoint (or the batch): not yet a gradient
        for i in range(a, b - 1):
            h = self.layers[i]._forward(h, prec, False, self._shared[i - a])
        self.layers[b - 1].input = h  # the same buffer as the forward's: sized beforehand

    __call__ = forward

    @_on_own_device
    def backward(self, grad_logits: _core.DeviceArray, *, accumulate: bool = False,
                 hook: Optional[Callable[[int], Any]] = None) -> None:
        """backward(grad_logits, *, accumulate=False, hook=None) -> None

        Every Parameter's gradient (float32) from the gradient of the logits.

        Each layer's weight and bias gradients come from one GEMM (the bias
        gradient fused as cuBLASLt's BGRADB epilogue); the input gradient's
        GEMM fuses the previous layer's activation derivative (DRELU / DGELU
        on its aux), so it returns the gradient of that layer's pre-activation.
        That gradient overwrites the previous layer's output, which the
        weight gradient has just read and nothing needs afterwards: the
        backward keeps no activation-sized buffers of its own, and runs once
        per forward (a second call raises RuntimeError, as PyTorch does
        without ``retain_graph``).

        Parameters
        ----------
        grad_logits : DeviceArray
            (N, sizes[-1]) in the compute dtype of the last forward (for
            instance the ``grad=`` of :func:`cross_entropy`, which may be the
            logits buffer itself).
        accumulate : bool, optional
            Add into the grads (micro-batches of one optimizer step) instead
            of overwriting them.
        hook : callable, optional
            ``hook(i)`` is called right after layer ``i``'s weight and bias
            gradients have been enqueued (on the current stream), before its
            input-gradient GEMM; layers run from last to first. Data-parallel
            training starts a bucket's all-reduce there, so communication
            overlaps the rest of the backward. The hook must not wait for the
            device.
        """
        if not self._activations_live and self.layers[0].input is not None:
            raise RuntimeError("MLP.backward() called twice after one forward(): the backward "
                               "overwrites the activations it reads (as PyTorch frees its "
                               "graph); run forward() again first")
        if hook is not None and not callable(hook):
            raise arg_error(TypeError, "backward", "hook",
                            f"expected a callable or None, got {type(hook).__name__}")
        self.layers[-1]._check_grad(grad_logits)
        # From here on the previous layers' outputs become gradients.
        self._activations_live = False
        if self._segments is None:
            backward_layers(self.layers, grad_logits, bool(accumulate), hook)
            return
        # Last segment first. Its inner activations are still in the shared buffers;
        # every other segment's are recomputed into them from its input (the previous
        # segment's checkpoint) just before its backward. At the peak the live
        # activation buffers are: every segment's checkpoint (output and aux of its
        # last layer; the later ones already hold gradients) and the shared buffers
        # of one segment, never all the layers' activations.
        g: Optional[_core.DeviceArray] = grad_logits
        last = len(self._segments) - 1
        for s in range(last, -1, -1):
            a, b = self._segments[s]
            if s < last:
                self._recompute(a, b)
            g = backward_layers_from(self.layers, a, b, g, bool(accumulate), hook)

    def forget_activations(self) -> None:
        """Mark the last forward's activations as gone (their buffers were moved or
        reused, as when a Pipeline spreads the layers over devices): a backward
        then needs a forward first."""
        self._activations_live = False

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.zero_grad()

    def __repr__(self) -> str:
        return f"MLP(sizes={list(self.sizes)}, activation={self.activation!r})"


def backward_layers_from(layers: Sequence[Linear], a: int, b: int, grad: _core.DeviceArray,
                         accumulate: bool, hook: Optional[Callable[[int], Any]] = None
                         ) -> Optional[_core.DeviceArray]:
    """The backward of layers[a:b] of an MLP, last to first, with the same calls as
    backward_layers makes for them: layer a's input gradient fuses layer a-1's
    activation derivative and overwrites its output (the gradient layer a-1's
    backward takes, returned); layer 0 computes no input gradient (None)."""
    g: Optional[_core.DeviceArray] = grad
    for i in range(b - 1, a - 1, -1):
        layer = layers[i]
        if i == 0:
            layer._backward(g, accumulate, False, None, None, None, hook, 0)
            return None
        prev = layers[i - 1]
        g = layer._backward(g, accumulate, True, prev.activation, prev.aux, layer.input, hook, i)
    return g


def backward_layers(layers: Sequence[Linear], grad: _core.DeviceArray, accumulate: bool,
                     hook: Optional[Callable[[int], Any]] = None,
                     input_grad_out: Optional[_core.DeviceArray] = None
                     ) -> Optional[_core.DeviceArray]:
    """The backward of consecutive layers (an MLP's, or a pipeline stage's), last to first.

    Public within cudalab (cudalab.distributed's pipeline stages call it), not
    part of nn's documented API (__all__).

    `grad` is the gradient of the last layer's pre-activation. Each input
    gradient fuses the previous layer's activation derivative and overwrites
    that layer's output (the current layer's input). ``hook(i)`` follows
    layer i's weight gradients. The first layer computes its input gradient
    only when `input_grad_out` is given (into it: it may be that layer's own
    input when the caller owns that buffer); returns it, or None. Runs on the
    current device: the caller makes the layers' device current.
    """
    g: Optional[_core.DeviceArray] = grad
    for i in range(len(layers) - 1, 0, -1):
        prev, layer = layers[i - 1], layers[i]
        g = layer._backward(g, accumulate, True, prev.activation, prev.aux, layer.input, hook, i)
    return layers[0]._backward(g, accumulate, input_grad_out is not None, None, None,
                               input_grad_out, hook, 0)


def segment_bounds(layers: int, segments: int) -> list[tuple[int, int]]:
    """segment_bounds(layers, segments) -> list of (start, stop)

    The contiguous layer ranges of a checkpointed MLP: `segments` of them
    (1 <= segments <= layers), sizes differing by at most one, the larger ones
    last (the last segment is never recomputed, so that costs least).
    Public within cudalab (the checkpointing lesson), not nn's API (__all__).
    """
    if not 1 <= segments <= layers:
        raise ValueError(f"{segments} segments of {layers} layers: need 1 <= segments <= layers")
    size, extra = divmod(layers, segments)
    bounds, start = [], 0
    for s in range(segments):
        stop = start + size + (1 if s >= segments - extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def activation_elements(features: int, rows: int, dtype: Any,
                        activation: Optional[str]) -> dict[str, tuple[int, Any]]:
    """The elements and dtype of the buffers a Linear's forward writes for the
    backward, by name: its output and (with an activation) its aux."""
    out = {"output": (rows * features, np.dtype(dtype))}
    if activation == "gelu":
        out["aux"] = (rows * _gelu_aux_row(features), np.dtype(dtype))
    elif activation == "relu":
        out["aux"] = (rows * _relu_mask_bytes(features), U8)
    return out


def activation_bytes(sizes: Sequence[int], rows: int, dtype: Any, activation: Optional[str],
                     segments: Optional[int] = None) -> int:
    """activation_bytes(sizes, rows, dtype, activation, segments=None) -> int

    The bytes of the activation buffers an MLP of `sizes` keeps for a batch of
    `rows` in compute dtype `dtype`: every layer's output and aux without
    checkpointing; with `segments`, the checkpoints (each segment's last layer)
    plus the shared buffers (at each position inside a segment, the largest
    layer's). Does not count the batch itself, nor a cast copy of it.
    Public within cudalab (the checkpointing lesson), not nn's API (__all__).
    """
    n = len(sizes) - 1
    acts = [None if i == n - 1 else activation for i in range(n)]

    def nbytes(i: int) -> int:
        return sum(e * d.itemsize
                   for e, d in activation_elements(sizes[i + 1], rows, dtype, acts[i]).values())

    if segments is None:
        return sum(nbytes(i) for i in range(n))
    bounds = segment_bounds(n, segments)
    kept = sum(nbytes(b - 1) for _, b in bounds)
    shared = 0
    for j in range(max(b - a for a, b in bounds) - 1):
        # per buffer name the largest layer at position j (as MLP sizes them)
        need: dict[str, int] = {}
        for a, b in bounds:
            if a + j < b - 1:
                for name, (e, d) in activation_elements(sizes[a + j + 1], rows, dtype,
                                                        acts[a + j]).items():
                    need[name] = max(need.get(name, 0), e * d.itemsize)
        shared += sum(need.values())
    return kept + shared


def recomputed_layers(layers: int, segments: Optional[int]) -> list[int]:
    """The layers a checkpointed backward runs forward again: the inner layers
    (all but the last) of every segment but the last one."""
    if segments is None:
        return []
    bounds = segment_bounds(layers, segments)
    return [i for a, b in bounds[:-1] for i in range(a, b - 1)]


class SharedActivations:
    """The output and aux buffers of one position inside a checkpointed MLP's
    segments, shared by the layers at that position in every segment (only one
    segment's inner activations exist at a time). Flat buffers sized by
    ``reserve`` for the largest of those layers; ``get`` (Buffers' interface,
    what Linear's forward asks) gives a C-contiguous view at their start.
    Public within cudalab, not nn's API (__all__).
    """

    def __init__(self) -> None:
        self._flat: dict[str, _core.DeviceArray] = {}

    def reserve(self, name: str, elements: int, dtype: Any) -> None:
        dtype = np.dtype(dtype)
        a = self._flat.get(name)
        if a is None or a.size != elements or a.dtype != dtype:
            self._flat[name] = _core.empty((elements,), dtype=dtype)

    def get(self, name: str, shape: tuple[int, ...], dtype: Any) -> _core.DeviceArray:
        a = self._flat[name]
        n = math.prod(shape)
        if a.dtype != np.dtype(dtype) or n > a.size:  # reserve() was not told of this layer
            raise RuntimeError(f"shared activation buffer {name!r}: {a.size} {a.dtype} "
                               f"reserved, {n} {np.dtype(dtype)} asked for")
        return a[:n].reshape(shape)

    def clear(self) -> None:
        self._flat.clear()
