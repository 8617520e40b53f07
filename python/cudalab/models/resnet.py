"""cudalab.models.resnet: ResNet-50 inference on the GPU, one C call per batch.

:func:`resnet50` folds the weights (BatchNorm into the GEMMs), uploads them
once in the precision's dtype, and runs the forward as a compiled program
(:mod:`~cudalab.models.plan`): per batch shape, the steps are compiled and a
workspace allocated on first use, then every call is a single
``_core._convnet_run`` that enqueues 54 cuBLASLt GEMMs and the im2col and
pooling kernels on the current stream. :meth:`ResNet50.capture` records that
call in a CUDA graph, so a forward becomes one graph launch.

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
from ..nn._util import check_int
from ..nn.precision import PRECISIONS as _NN_PRECISIONS
from ..nn.precision import get_precision
from ..streams import graph as _graph
from .arch import RESNET50, Conv, Linear, NUM_CLASSES
from .imagenet import preprocess
from .params import FoldedParams, fold
from .plan import (ITEMSIZE, SLOT_FC_BIAS, SLOT_IMAGES, SLOT_LOGITS, SLOT_WEIGHTS,
                   SLOT_WORKSPACE, gemm_flops, plan_forward, weight_layout)
from .weights import from_torchvision, init_weights, load_weights

__all__ = ["GraphedForward", "PRECISIONS", "ResNet50", "resnet50"]

# The precision names, as cudalab.nn's (their dtypes and matmul precisions come from there).
PRECISIONS = tuple(_NN_PRECISIONS)


def _state_from(weights: Any, seed: int) -> dict:
    """torchvision-named float32 weights from any of resnet50()'s `weights` forms."""
    if weights is None:
        return init_weights(seed=seed)
    if isinstance(weights, (str, bytes)) or hasattr(weights, "__fspath__"):
        return load_weights(weights)
    if isinstance(weights, dict):
        return weights
    if hasattr(weights, "state_dict"):
        return from_torchvision(weights)
    raise TypeError("resnet50() argument 'weights': expected None, a path, a dict of arrays "
                    f"or a torch module, got {type(weights).__name__}")


def resnet50(weights: Any = None, *, precision: str = "fp32", seed: int = 0) -> "ResNet50":
    """resnet50(weights=None, *, precision='fp32', seed=0) -> ResNet50

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
    """
    get_precision(precision, "resnet50")
    return ResNet50(fold(_state_from(weights, seed)), precision=precision)


class ResNet50:
    """ResNet50(params, precision='fp32')

    The GPU model (build it with :func:`resnet50`).

    Attributes
    ----------
    params : FoldedParams
        The host weights it was built from.
    precision : str
    dtype : str
        Of activations and weights: 'float32', 'float16' or 'bfloat16'.
    device : int
        Where the weights are and the forward runs (see :meth:`to`).
    """

    def __init__(self, params: FoldedParams, precision: str = "fp32") -> None:
        prec = get_precision(precision, "ResNet50")
        self.precision = prec.name
        self.dtype = str(prec.compute_dtype)
        self._matmul_precision = prec.matmul_precision or "highest"  # unused by half GEMMs
        self.params = params
        self.layers = RESNET50
        self._layout = weight_layout(self.layers, self.dtype)
        self._weights = self._upload()
        self._fc_bias = _core.asarray(np.ascontiguousarray(params.gemms["fc"].bias,
                                                           dtype=np.float32))
        self._compiled: dict[tuple[int, int, int], tuple[Any, _core.DeviceArray]] = {}

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
        self._compiled = {}
        return self

    # ---- the forward -------------------------------------------------------------------

    def _program(self, shape: tuple) -> tuple[Any, _core.DeviceArray]:
        n, h, w, _ = shape
        key = (n, h, w)
        if key not in self._compiled:
            plan = plan_forward(n, self.dtype, self._matmul_precision, self._layout, h, w,
                                self.layers)
            workspace = _core.empty(max(plan.workspace_bytes, 1), dtype="uint8")
            images = _core.empty((n, h, w, 3), dtype="float32")
            logits = _core.empty((n, NUM_CLASSES), dtype="float32")
            slots = self._slots(workspace, images, logits)
            program = _core._convnet_compile(plan.steps, slots, "resnet50")
            self._compiled[key] = (program, workspace)
        return self._compiled[key]

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
        out : DeviceArray, optional
            float32 (N, 1000), C-contiguous, on the model's device.

        Returns
        -------
        DeviceArray
            float32 (N, 1000) logits (`out` if given), on the model's device.
        """
        dev = self.device
        if dev != _core.current_device():
            with _device(dev):  # programs, workspaces and outputs are allocated here
                return self.forward(x, out)
        x = self._images(x, "forward")
        n = x.shape[0]
        if out is None:
            out = _core.empty((n, NUM_CLASSES), dtype="float32")
        elif (not isinstance(out, _core.DeviceArray) or out.shape != (n, NUM_CLASSES)
              or out.dtype != np.float32 or not out.is_contiguous):
            raise ValueError(f"forward() argument 'out': expected a C-contiguous float32 "
                             f"DeviceArray of shape ({n}, {NUM_CLASSES})")
        elif out.device != dev:
            raise ValueError(f"forward() argument 'out': is on device {out.device} but the "
                             f"model is on device {dev}")
        program, workspace = self._program(x.shape)
        _core._convnet_run(program, self._slots(workspace, x, out))
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
                            width, self.layers).workspace_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of the uploaded weights."""
        return self._weights.nbytes + self._fc_bias.nbytes

    def release(self, batch: Optional[int] = None) -> None:
        """Drop the compiled forward and workspace of one batch size (None: all)."""
        for key in list(self._compiled):
            if batch is None or key[0] == batch:
                del self._compiled[key]

    def __repr__(self) -> str:
        return f"ResNet50(precision={self.precision!r})"


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
                model.forward(self.input, out=self.output)
        # What the graph reads: kept alive even if the model moves (to()) or drops its
        # compiled forward (release()), so a replay never reads freed memory.
        self._captured = (model._weights, model._fc_bias,
                          model._compiled[(batch, height, width)])

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
