"""cudalab.models: ResNet-50 (torchvision's v1.5) as NHWC GEMMs, host side.

The pieces the GPU model is built from, all NumPy:

* :mod:`~cudalab.models.arch`: the network as data, :data:`RESNET50`, a
  tuple of layer descriptions in execution order (:class:`Conv` with its
  BatchNorm, ReLU and residual add, :class:`MaxPool`,
  :class:`GlobalAvgPool`, :class:`Linear`), with the activation each reads
  and writes;
* :mod:`~cudalab.models.weights`: torchvision-named weights from a
  safetensors file (:func:`load_weights`), a torch module
  (:func:`from_torchvision`) or a seed (:func:`init_weights`);
* :mod:`~cudalab.models.params`: :func:`fold` turns them into GEMM operands,
  BatchNorm folded in, conv weights (K = kh * kw * cin ordered (kh, kw, cin),
  cout) with K padded to a multiple of 8 (the stem's 147 -> 152);
* :mod:`~cudalab.models.imagenet`: :func:`preprocess`, ImageNet's
  resize / crop / normalise of uint8 images into float32 NHWC;
* :mod:`~cudalab.models.reference`: the forward in NumPy (im2col + matmul),
  the CPU side of the inference lesson and the GPU forward's reference;
* :mod:`~cudalab.models.cache`: :class:`LRUCache`, the bounded per-shape
  cache of compiled forwards the GPU model keeps.

::

    import cudalab.models as models

    params = models.fold(models.init_weights(seed=0))   # or load_weights("resnet50.safetensors")
    x = models.preprocess(images)                        # uint8 (N, H, W, 3) -> (N, 224, 224, 3)
    logits = models.reference.forward(params, x)         # (N, 1000) float32
"""

from . import arch, cache, imagenet, ops, params, plan, reference, weights
from .arch import (RESNET50, RESNET50_PARAMETERS, Conv, GlobalAvgPool, Linear, MaxPool,
                   parameter_count, tensor_shapes)
from .cache import LRUCache
from .params import FoldedParams, GemmWeights, fold
from .imagenet import IMAGENET_MEAN, IMAGENET_STD, preprocess
from .weights import from_torchvision, init_weights, load_weights, save_weights
from .resnet import PRECISIONS, GraphedForward, ResNet50, resnet50

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RESNET50",
    "RESNET50_PARAMETERS",
    "Conv",
    "FoldedParams",
    "GemmWeights",
    "GraphedForward",
    "LRUCache",
    "PRECISIONS",
    "ResNet50",
    "GlobalAvgPool",
    "Linear",
    "MaxPool",
    "arch",
    "cache",
    "fold",
    "imagenet",
    "from_torchvision",
    "init_weights",
    "load_weights",
    "ops",
    "params",
    "plan",
    "parameter_count",
    "preprocess",
    "reference",
    "resnet50",
    "save_weights",
    "tensor_shapes",
    "weights",
]
