"""cudalab.models.resnet: ResNet-50 inference on the GPU, one C call per batch.

:func:`resnet50` folds the weights (BatchNorm into the GEMMs), uploads them
once in the precision's dtype, and runs the forward as a compiled program
(:mod:`~cudalab.models.plan`): per batch shape, the steps are compiled and a
workspace allocated on first use, then every call is a single
``_core._convnet_run`` that enqueues 54 cuBLASLt GEMMs and the im2col and
pooling kernels on the current stream. :meth:`ResNet50.capture` records that
call in a CUDA graph, so a forward becomes one graph launch.

Memory per shape. A compiled forward's workspace holds every activation of
the batch (about 4.4 GB for fp32 at batch 256, 224 x 224). The model keeps the
compiled forwards of its ``max_cached_shapes`` (default 4) most recently used
input shapes (N, H, W), and optionally at most ``max_cached_bytes`` of
workspace, in an LRU (:class:`~cudalab.models.cache.LRUCache`); a new shape
first drops the least recently used ones, then allocates. A CUDA graph never
loses its memory to that: :class:`GraphedForward` holds what it captured, and
a shape whose forward ran inside any other graph capture stays allocated
(beyond the bound) until :meth:`ResNet50.release`.

Alignment. The compiled GEMMs are planned for slot buffers aligned to
256 bytes. A contiguous input that starts elsewhere (``x[1:]`` of a batch
whose image size is not a multiple of 256 bytes) is first copied to a fresh
buffer: one device copy of the batch, N x H x W x 12 bytes read and written
(estimated, not measured: about 0.05 ms for 128 images of 224 x 224 at
3 TB/s, 1 % of an fp16 forward); an aligned input costs nothing. An ``out``
that is misaligned or not C-contiguous is written through a temporary and
one copy of the logits.

Devices. The model lives on the device of its uploaded weights (``.device``,
the current one at construction); :meth:`ResNet50.to` moves it, and every
later allocation (compiled programs, workspaces, outputs, captures) is made
there, whichever device the caller has current. An input on another device
is refused, as torch refuses it, naming both devices.

Layout. Activations are NHWC and each GEMM computes ``out (M, cout) = cols
(M, K) @ W.T`` with W kept as PyTorch does, (cout, K): both operands are
K-contiguous ("TN", the tensor cores' native form). The host side
(:mod:`~cudalab.models.params`) stores W as (K, cout) for NumPy; the upload
transposes it.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import _core
from ..devices import device as _device
from .._check import check_int, check_seed
from ..nn.precision import PRECISIONS as _NN_PRECISIONS
from ..nn.precision import get_precision
from ..streams import graph as _graph
from .arch import RESNET50, Conv, Linear, NUM_CLASSES, tensor_shapes
from .cache import LRUCache
from .conv_routes import ConvShape, implicit_tiles
from .conv_routes import choose as choose_route
from .imagenet import preprocess
from .params import FoldedParams, fold
from .plan import (ITEMSIZE, SLOT_FC_BIAS, SLOT_IMAGES, SLOT_LOGITS, SLOT_WEIGHTS,
                   SLOT_WORKSPACE, gemm_flops, implicit_channels, needs_route, plan_forward,
                   weight_layout)
from .weights import from_torchvision, init_weights, load_weights

__all__ = ["DEFAULT_MAX_CACHED_SHAPES", "GraphedForward", "PRECISIONS", "ResNet50", "resnet50"]

# The precision names, as cudalab.nn's (their dtypes and matmul precisions come from there).
PRECISIONS = tuple(_NN_PRECISIONS)

# Compiled input shapes a model keeps (each with its workspace) unless told otherwise.
DEFAULT_MAX_CACHED_SHAPES = 4

# What a slot array's base must be aligned to: the most any compiled program asks
# (_convnet_run checks against the example arrays' alignment, capped at 256 by
# cl_mm_alignment_of); fresh allocations from the pool satisfy it.
_SLOT_ALIGNMENT = 256


def _weights_form(weights: Any) -> str:
    """Which of resnet50()'s `weights` forms this is ("seed", "path", "dict" or "torch");
    TypeError for anything else."""
    if weights is None:
        return "seed"
    if isinstance(weights, (str, bytes)) or hasattr(weights, "__fspath__"):
        return "path"
    if isinstance(weights, dict):
        return "dict"
    if hasattr(weights, "state_dict"):
        return "torch"
    raise TypeError("resnet50() argument 'weights': expected None, a path, a dict of arrays "
                    f"or a torch module, got {type(weights).__name__}")


def _state_from(weights: Any, seed: int) -> dict:
    """torchvision-named float32 weights from any of resnet50()'s `weights` forms."""
    form = _weights_form(weights)
    if form == "seed":
        return init_weights(seed=seed)
    if form == "path":
        return load_weights(weights)
    if form == "dict":
        return weights
    return from_torchvision(weights)


def resnet50(weights: Any = None, *, precision: str = "fp32", seed: int = 0,
             max_cached_shapes: Optional[int] = DEFAULT_MAX_CACHED_SHAPES,
             max_cached_bytes: Optional[int] = None) -> "ResNet50":
    """resnet50(weights=None, *, precision='fp32', seed=0, max_cached_shapes=4, max_cached_bytes=None) -> ResNet50

    torchvision's ResNet-50 (v1.5) for inference on cudalab's GPU kernels.

    Parameters
    ----------
    weights : None, path, dict or torch module, optional
        None: seeded He initialisation (:func:`~cudalab.models.init_weights`);
        a path: a safetensors file with torchvision's names; a dict of NumPy
        arrays with those names; a torch ``resnet50`` module (copied).
    precision : {'fp32', 'tf32', 'fp16', 'bf16'}, optional
        fp32 and tf32 keep float32 activations (tf32: TF32 tensor-core
        GEMMs); fp16 and bf16 run every GEMM in that dtype with float32
        accumulation. Logits are float32 in every case.
    seed : int, optional
        For the random initialisation.
    max_cached_shapes, max_cached_bytes : int or None, optional
        Bounds of the per-shape cache of compiled forwards (see
        :class:`ResNet50`).
    """
    # Every argument first, then the device, then the work: without a GPU the error
    # names resnet50(), before any weights are made or read.
    get_precision(precision, "resnet50")
    if _weights_form(weights) == "seed":
        check_seed(seed, "resnet50")
    _shape_bound(max_cached_shapes, "max_cached_shapes", 1, "resnet50")
    _shape_bound(max_cached_bytes, "max_cached_bytes", 0, "resnet50")
    _core._parse_device(None, "resnet50")
    return ResNet50(fold(_state_from(weights, seed)), precision=precision,
                    max_cached_shapes=max_cached_shapes, max_cached_bytes=max_cached_bytes)


class ResNet50:
    """ResNet50(params, precision='fp32', max_cached_shapes=4, max_cached_bytes=None)

    The GPU model (build it with :func:`resnet50`).

    Each input shape (N, H, W) gets a compiled forward and a workspace on
    first use (:meth:`workspace_bytes`; about 4.4 GB for fp32 at batch 256).
    The model keeps those of the most recently used shapes, least recently
    used dropped first, within two bounds: ``max_cached_shapes`` shapes
    (default 4; None: no bound) and ``max_cached_bytes`` bytes of workspace
    (default None: no bound; the newest shape stays even if larger). Both are
    attributes; lowering one drops shapes at once. A dropped shape compiles
    and allocates again on its next forward. Memory a CUDA graph replays on
    is never freed by this: a :class:`GraphedForward` holds its own, and a
    shape whose forward ran inside another graph capture stays allocated
    until :meth:`release`.

    Attributes
    ----------
    params : FoldedParams
        The host weights it was built from.
    precision : str
    dtype : str
        Of activations and weights: 'float32', 'float16' or 'bfloat16'.
    device : int
        Where the weights are and the forward runs (see :meth:`to`).
    max_cached_shapes : int or None
    max_cached_bytes : int or None
    cached_shapes : list of (N, H, W)
        The shapes with a compiled forward, least recently used first.
    """

    def __init__(self, params: FoldedParams, precision: str = "fp32",
                 max_cached_shapes: Optional[int] = DEFAULT_MAX_CACHED_SHAPES,
                 max_cached_bytes: Optional[int] = None) -> None:
        prec = get_precision(precision, "ResNet50")
        if not isinstance(params, FoldedParams):
            raise TypeError("ResNet50() argument 'params': expected FoldedParams (from "
                            f"cudalab.models.fold), got {type(params).__name__}")
        max_entries = _shape_bound(max_cached_shapes, "max_cached_shapes", 1)
        max_bytes = _shape_bound(max_cached_bytes, "max_cached_bytes", 0)
        # Arguments first, then the device: without a GPU the error names ResNet50().
        _core._parse_device(None, "ResNet50")
        self.precision = prec.name
        self.dtype = str(prec.compute_dtype)
        self._matmul_precision = prec.matmul_precision or "highest"  # unused by half GEMMs
        self.params = params
        self.layers = RESNET50
        self._layout = weight_layout(self.layers, self.dtype)
        self._weights = self._upload()
        self._fc_bias = _core.asarray(np.ascontiguousarray(params.gemms["fc"].bias,
                                                           dtype=np.float32))
        # (N, H, W) -> (program, workspace): the LRU, and the shapes used inside a
        # graph capture (kept until release(): a graph replays on that workspace).
        self._cache = LRUCache(max_entries, max_bytes)
        self._graph_held: dict[tuple[int, int, int], tuple[Any, _core.DeviceArray]] = {}

    # ---- the per-shape cache ----------------------------------------------------------

    @property
    def max_cached_shapes(self) -> Optional[int]:
        """Compiled input shapes kept, each with its workspace (None: no bound)."""
        return self._cache.max_entries

    @max_cached_shapes.setter
    def max_cached_shapes(self, value: Optional[int]) -> None:
        self._cache.max_entries = _shape_bound(value, "max_cached_shapes", 1)

    @property
    def max_cached_bytes(self) -> Optional[int]:
        """Workspace bytes kept over all cached shapes (None: no bound)."""
        return self._cache.max_bytes

    @max_cached_bytes.setter
    def max_cached_bytes(self, value: Optional[int]) -> None:
        self._cache.max_bytes = _shape_bound(value, "max_cached_bytes", 0)

    @property
    def cached_shapes(self) -> list:
        """The (N, H, W) with a compiled forward in the cache, least recently used first."""
        return self._cache.keys()

    @property
    def cached_bytes(self) -> int:
        """Workspace bytes of the cached shapes."""
        return self._cache.nbytes

    @property
    def _compiled(self) -> dict:
        """(N, H, W) -> (program, workspace) of every shape kept (a snapshot)."""
        return {**self._graph_held, **dict(self._cache.items())}

    def _upload(self) -> _core.DeviceArray:
        """Every GEMM weight as (cout, K padded), and every conv bias, in one buffer."""
        size = ITEMSIZE[self.dtype]
        host = np.zeros(self._layout.nbytes // size, np.float32)
        for layer in self.layers:
            if not isinstance(layer, (Conv, Linear)):
                continue
            gemm = self.params.gemms[layer.name]
            w_off, b_off = self._layout.offsets[layer.name]
            w = np.ascontiguousarray(gemm.weight.T, dtype=np.float32)
            host[w_off // size:w_off // size + w.size] = w.ravel()
            if b_off >= 0:
                host[b_off // size:b_off // size + gemm.bias.size] = gemm.bias
            at = self._layout.implicit.get(layer.name)
            if at is not None:
                # The implicit GEMM's copy: (cout, kh, kw, cin) widened with zero channels.
                cin = implicit_channels(layer.cin, self.dtype)
                krsc = np.zeros((layer.cout, layer.kh, layer.kw, cin), np.float32)
                krsc[..., :layer.cin] = w[:, :layer.k].reshape(layer.cout, layer.kh, layer.kw,
                                                               layer.cin)
                host[at // size:at // size + krsc.size] = krsc.ravel()
        return _core.asarray(host).astype(self.dtype)

    @property
    def device(self) -> int:
        """The device of the uploaded weights, where the forward runs."""
        return self._weights.device

    def to(self, device: Any) -> "ResNet50":
        """to(device) -> ResNet50

        Move the model to `device`, as torch's ``Module.to``: the uploaded
        weights and the fc bias are copied there (DeviceArray.to), and the
        compiled forwards and their workspaces are dropped (their cuBLASLt
        plans were made for the old device), so the next forward compiles and
        allocates on the new one. Nothing happens when it is there already.
        A :class:`GraphedForward` captured before keeps what it captured and
        goes on running on the old device.

        Parameters
        ----------
        device : int or str
            A device index, 'cuda' (the current device) or 'cuda:N'.

        Returns
        -------
        ResNet50
            self.
        """
        dev = _core._parse_device_spec(device, "to")
        if dev == self.device:
            return self
        weights, fc_bias = self._weights.to(dev), self._fc_bias.to(dev)
        self._weights, self._fc_bias = weights, fc_bias
        self._cache.clear()
        self._graph_held.clear()
        return self

    # ---- the forward -------------------------------------------------------------------

    def _program(self, shape: tuple) -> tuple[Any, _core.DeviceArray]:
        """(program, workspace) for images of `shape`, compiled and allocated on first use."""
        n, h, w, _ = shape
        key = (n, h, w)
        # While a graph is captured nothing may be freed (a free would be captured or
        # break the capture), so the LRU only changes outside captures.
        capturing = _core.is_current_stream_capturing()
        entry = self._cache.get(key)
        if entry is not None:
            return entry
        entry = self._graph_held.get(key)  # dropped from the LRU, kept for a graph
        if entry is not None:
            if not capturing:
                self._cache.put(key, entry, entry[1].nbytes)
            return entry
        plan = plan_forward(n, self.dtype, self._matmul_precision, self._layout, h, w,
                            self.layers, self._routes(n, h, w))
        nbytes = max(plan.workspace_bytes, 1)
        if not capturing:
            # Drop the least recently used shapes first, so their memory can serve this one.
            self._cache.make_room(nbytes)
        workspace = _core.empty(nbytes, dtype="uint8")
        images = _core.empty((n, h, w, 3), dtype="float32")
        logits = _core.empty((n, NUM_CLASSES), dtype="float32")
        slots = self._slots(workspace, images, logits)
        program = _core._convnet_compile(plan.steps, slots, "resnet50")
        entry = (program, workspace)
        if capturing:
            self._graph_held[key] = entry  # the graph replays on it: kept until release()
        else:
            self._cache.put(key, entry, nbytes)
        return entry

    def _routes(self, n: int, h: int, w: int) -> dict[str, tuple[str, int]]:
        """Each route-taking convolution's (route, tile) for this shape (conv_routes)."""
        shapes = tensor_shapes(n, h, w, self.layers)
        routes = {}
        for layer in self.layers:
            if isinstance(layer, Conv) and needs_route(layer):
                _, lh, lw, c = shapes[layer.src]
                shape = ConvShape(n, lh, lw, c, layer.cout, layer.kh, layer.kw, layer.stride,
                                  layer.padding, self.dtype, self._matmul_precision,
                                  "float32" if layer.src == "input" else None, layer.relu)
                routes[layer.name] = choose_route(shape, layer.residual is not None)
        return routes

    def conv_routes(self, batch: int, height: int = 224, width: int = 224) -> dict[str, str]:
        """conv_routes(batch, height=224, width=224) -> dict

        How each convolution that is not a plain GEMM runs at this shape:
        layer name -> ``"im2col"`` or ``"implicit <tile>"``, as the forward
        plans it (measured on first use, see :mod:`cudalab.models.conv_routes`).
        """
        func = "conv_routes"
        n = check_int(batch, func, "batch", 1)
        h, w = check_int(height, func, "height", 1), check_int(width, func, "width", 1)
        tiles = implicit_tiles(self.dtype)
        return {name: route if tile < 0 or route != "implicit" else
                f"implicit {tiles[tile] if tile < len(tiles) else 'default'}"
                for name, (route, tile) in self._routes(n, h, w).items()}

    def _slots(self, workspace: _core.DeviceArray, images: _core.DeviceArray,
               logits: _core.DeviceArray) -> tuple:
        slots: list[Any] = [None] * 5
        slots[SLOT_WORKSPACE] = workspace
        slots[SLOT_WEIGHTS] = self._weights
        slots[SLOT_IMAGES] = images
        slots[SLOT_LOGITS] = logits
        slots[SLOT_FC_BIAS] = self._fc_bias
        return tuple(slots)

    def _images(self, x: Any, func: str) -> _core.DeviceArray:
        """`x` as contiguous float32 images on the model's device (the current one)."""
        if isinstance(x, np.ndarray):
            x = _core.asarray(np.ascontiguousarray(x, dtype=np.float32))
        if not isinstance(x, _core.DeviceArray):
            raise TypeError(f"{func}() argument 'x': expected a DeviceArray or NumPy array, "
                            f"got {type(x).__name__}")
        dev = self.device
        if x.device != dev:
            raise ValueError(f"{func}() argument 'x': is on device {x.device} but the model is "
                             f"on device {dev}: move the images (x.to({dev})) or the model "
                             f"(model.to({x.device}))")
        if x.ndim != 4 or x.shape[3] != 3 or x.shape[0] < 1:
            raise ValueError(f"{func}() argument 'x': expected float32 NHWC images "
                             f"(N, H, W, 3), got shape {x.shape}")
        if x.dtype != np.float32:
            x = x.astype("float32")
        return x if x.is_contiguous else x.copy()

    def forward(self, x: Any, out: Optional[_core.DeviceArray] = None) -> _core.DeviceArray:
        """forward(x, out=None) -> DeviceArray

        Logits for a batch of preprocessed images, asynchronously on the
        current stream.

        Parameters
        ----------
        x : DeviceArray or ndarray
            float32 NHWC (N, H, W, 3), ImageNet-normalised
            (:func:`~cudalab.models.preprocess`); 224 x 224 for ImageNet. A
            DeviceArray must be on the model's device (ValueError otherwise).
            Any layout and offset: one that is not C-contiguous or not
            256-byte aligned (``batch[1:]``, say) is first copied to a fresh
            buffer on the device.
        out : DeviceArray, optional
            float32 (N, 1000), on the model's device. Written in place; when
            it is not C-contiguous or not 256-byte aligned, through a
            temporary and one copy.

        Returns
        -------
        DeviceArray
            float32 (N, 1000) logits (`out` if given), on the model's device.
        """
        return self._forward(x, out, "forward", hold_if_captured=True)

    def _forward(self, x: Any, out: Optional[_core.DeviceArray], func: str,
                 hold_if_captured: bool) -> _core.DeviceArray:
        dev = self.device
        if dev != _core.current_device():
            with _device(dev):  # programs, workspaces and outputs are allocated here
                return self._forward(x, out, func, hold_if_captured)
        x = self._images(x, func)
        if x.data_ptr % _SLOT_ALIGNMENT:
            x = x.copy()  # a view at an odd offset: the GEMMs are planned for aligned slots
        n = x.shape[0]
        if out is None:
            out = _core.empty((n, NUM_CLASSES), dtype="float32")
        elif (not isinstance(out, _core.DeviceArray) or out.shape != (n, NUM_CLASSES)
              or out.dtype != np.float32):
            raise ValueError(f"{func}() argument 'out': expected a float32 DeviceArray of "
                             f"shape ({n}, {NUM_CLASSES})")
        elif out.device != dev:
            raise ValueError(f"{func}() argument 'out': is on device {out.device} but the "
                             f"model is on device {dev}")
        direct = out.is_contiguous and out.data_ptr % _SLOT_ALIGNMENT == 0
        logits = out if direct else _core.empty((n, NUM_CLASSES), dtype="float32")
        key = (n, x.shape[1], x.shape[2])
        program, workspace = self._program(x.shape)
        _core._convnet_run(program, self._slots(workspace, x, logits))
        if hold_if_captured and _core.is_current_stream_capturing():
            # The graph being captured replays on this workspace: never free it under it.
            self._graph_held[key] = (program, workspace)
        if not direct:
            _core.copyto(out, logits)
        return out

    __call__ = forward

    def capture(self, batch_size: int, height: int = 224, width: int = 224) -> "GraphedForward":
        """capture(batch_size, height=224, width=224) -> GraphedForward

        The forward for this batch size recorded in a CUDA graph: calling the
        result copies the images into its input buffer and replays the graph
        (one launch for the whole network).
        """
        return GraphedForward(self, check_int(batch_size, "capture", "batch_size"), height, width)

    def predict(self, images: Any, top: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """predict(images, top=5) -> (indices, probabilities)

        The `top` most likely ImageNet classes of uint8 images.

        Parameters
        ----------
        images : ndarray
            uint8 (N, H, W, 3) or one (H, W, 3) RGB image, any size
            (resized and cropped to 224 by :func:`~cudalab.models.preprocess`).
        top : int, optional

        Returns
        -------
        indices : ndarray
            int64 (N, top), most likely first.
        probabilities : ndarray
            float32 (N, top), softmax of the logits.
        """
        top = check_int(top, "predict", "top")
        x = preprocess(images)
        logits = self.forward(x).get().astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        order = np.argsort(-probs, axis=1, kind="stable")[:, :top]
        return order.astype(np.int64), np.take_along_axis(probs, order, 1).astype(np.float32)

    def gemm_flops(self, batch: int, height: int = 224, width: int = 224) -> int:
        """Useful FLOPs of the forward's GEMMs for a batch (2 M N K, K unpadded)."""
        return gemm_flops(check_int(batch, "gemm_flops", "batch"), height, width, self.layers)

    def workspace_bytes(self, batch: int, height: int = 224, width: int = 224) -> int:
        """Bytes of the workspace a forward of this batch uses (allocated once, kept)."""
        batch = check_int(batch, "workspace_bytes", "batch")
        return plan_forward(batch, self.dtype, self._matmul_precision, self._layout, height,
                            width, self.layers, self._routes(batch, height, width)).workspace_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of the uploaded weights."""
        return self._weights.nbytes + self._fc_bias.nbytes

    def release(self, batch: Optional[int] = None) -> None:
        """Drop the compiled forward and workspace of one batch size (None: all).

        Also those kept for a forward that ran inside a graph capture: do not
        replay such a graph afterwards (a :class:`GraphedForward` keeps its own).
        """
        for key in self._cache.keys():
            if batch is None or key[0] == batch:
                self._cache.pop(key)
        for key in list(self._graph_held):
            if batch is None or key[0] == batch:
                del self._graph_held[key]

    def __repr__(self) -> str:
        return f"ResNet50(precision={self.precision!r})"


def _shape_bound(value: Any, param: str, minimum: int, func: str = "ResNet50") -> Optional[int]:
    """A cache bound: None, or an int >= minimum."""
    return None if value is None else check_int(value, func, param, minimum)


class GraphedForward:
    """The forward of one batch size as a CUDA graph (made by :meth:`ResNet50.capture`).

    Attributes
    ----------
    input : DeviceArray
        float32 (N, H, W, 3): what replay() reads.
    output : DeviceArray
        float32 (N, 1000): what replay() writes (overwritten by the next one).
    graph : CUDAGraph
    """

    def __init__(self, model: ResNet50, batch: int, height: int, width: int) -> None:
        self.model = model
        rng = np.random.default_rng(0)
        with _device(model.device):  # the buffers, the program and the graph live there
            self.input = _core.asarray(rng.standard_normal((batch, height, width, 3),
                                                           dtype=np.float32))
            self.output = _core.empty((batch, NUM_CLASSES), dtype="float32")
            model.forward(self.input, out=self.output)  # compiles and allocates outside capture
            self.graph = _core.CUDAGraph()
            with _graph(self.graph):
                # Not held by the model: this object holds what it captured (below).
                model._forward(self.input, self.output, "capture", hold_if_captured=False)
            # What the graph reads: kept alive even if the model moves (to()) or drops its
            # compiled forward (release(), or the LRU), so a replay never reads freed memory.
            self._captured = (model._weights, model._fc_bias,
                              model._program(self.input.shape))

    def replay(self) -> _core.DeviceArray:
        """Run the graph on the current stream; returns :attr:`output`."""
        self.graph.replay()
        return self.output

    def __call__(self, x: Any) -> _core.DeviceArray:
        """Copy `x` into :attr:`input`, replay, return :attr:`output`."""
        if isinstance(x, np.ndarray):
            with _device(self.input.device):
                x = _core.asarray(np.ascontiguousarray(x, dtype=np.float32))
        _core.copyto(self.input, x)  # from another device too (a peer copy)
        return self.replay()
