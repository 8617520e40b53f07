"""cudalab.models.weights: ResNet-50's weights as torchvision's state_dict, on the host.

A *state* is a dict from torchvision's ``state_dict`` key names
(``"layer1.0.conv2.weight"``, ``"layer1.0.bn2.running_var"``, ``"fc.bias"``)
to float32 C-contiguous NumPy arrays in torchvision's layouts: conv weights
(cout, cin, kh, kw), BatchNorm vectors (cout,), fc weight (1000, 2048).
BatchNorm's ``num_batches_tracked`` counters are dropped (eval mode never
reads them). :func:`cudalab.models.params.fold` turns a state into the
GEMM-ready, BatchNorm-folded parameters.

Three sources, all checked key by key and shape by shape:

* :func:`load_weights` reads a safetensors file (``pip install "cudalab[models]"``),
  for example one written from a torchvision model with
  ``safetensors.torch.save_file(model.state_dict(), path)``;
* :func:`from_torchvision` copies a torch module's ``state_dict``;
* :func:`init_weights` draws torchvision's own initialisation from a seed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._check import arg_error, check_bool, check_seed
from .arch import RESNET50, Conv, Linear, state_shapes

__all__ = ["check_state", "from_torchvision", "init_weights", "load_weights", "save_weights"]

_EXTRA_HINT = 'pip install "cudalab[models]"'
_SKIPPED_SUFFIX = ".num_batches_tracked"


def _safetensors_numpy(func: str):
    try:
        from safetensors import numpy as st_numpy
    except ImportError:
        raise ImportError(f"{func}() needs the safetensors package: {_EXTRA_HINT}") from None
    return st_numpy


def _few(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_state(state: Any, func: str = "check_state", param: str = "state") -> dict[str, np.ndarray]:
    """check_state(state) -> dict

    A copy of `state` as ResNet-50's weights: exactly torchvision's keys
    (``num_batches_tracked`` ignored), each of the right shape, each a
    finite float32 C-contiguous array.

    Parameters
    ----------
    state : mapping of str to array-like
        Keys as torchvision's ``resnet50().state_dict()``.

    Returns
    -------
    dict of str to ndarray

    Raises
    ------
    TypeError
        `state` is not a mapping, or a value is not a real-valued array.
    ValueError
        A key is missing or unexpected, a shape differs, or a value is not finite.
    """
    if not isinstance(state, Mapping):
        raise arg_error(TypeError, func, param,
                        f"expected a mapping of names to arrays, got {type(state).__name__}")
    shapes = state_shapes(RESNET50)
    keys = [k for k in state if not str(k).endswith(_SKIPPED_SUFFIX)]
    missing = [k for k in shapes if k not in state]
    unexpected = [str(k) for k in keys if k not in shapes]
    if missing:
        raise arg_error(ValueError, func, param, f"missing ResNet-50 weights: {_few(missing)}")
    if unexpected:
        raise arg_error(ValueError, func, param, f"unexpected keys: {_few(unexpected)}")
    out = {}
    for key, shape in shapes.items():
        value = np.asarray(state[key])
        if value.dtype.kind not in "fiu":
            raise arg_error(TypeError, func, param,
                            f"{key!r} must hold real numbers, got dtype {value.dtype}")
        if value.shape != shape:
            raise arg_error(ValueError, func, param,
                            f"{key!r} has shape {value.shape}, expected {shape}")
        value = np.ascontiguousarray(value, dtype=np.float32)
        if not np.isfinite(value).all():
            raise arg_error(ValueError, func, param, f"{key!r} holds inf or NaN")
        out[key] = value
    return out


def load_weights(path: Any) -> dict[str, np.ndarray]:
    """load_weights(path) -> dict

    ResNet-50's weights from a safetensors file with torchvision's key names.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.safetensors`` file (any float dtype; values become float32).

    Returns
    -------
    dict of str to ndarray
        A checked state (see :func:`check_state`).

    Raises
    ------
    ImportError
        The safetensors package is missing (``pip install "cudalab[models]"``).
    FileNotFoundError
        No such file.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise arg_error(TypeError, "load_weights", "path",
                        f"expected a str or os.PathLike, got {type(path).__name__}")
    st_numpy = _safetensors_numpy("load_weights")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_weights(): no such file: {os.fspath(path)!r}")
    return check_state(st_numpy.load_file(path), "load_weights", "path")


def save_weights(state: Any, path: Any) -> None:
    """save_weights(state, path)

    Write ResNet-50's weights (checked, float32) to a safetensors file that
    :func:`load_weights` and ``safetensors.torch.load_file`` read back.

    Parameters
    ----------
    state : mapping of str to array-like
        As :func:`check_state` accepts.
    path : str or os.PathLike
    """
    if not isinstance(path, (str, os.PathLike)):
        raise arg_error(TypeError, "save_weights", "path",
                        f"expected a str or os.PathLike, got {type(path).__name__}")
    st_numpy = _safetensors_numpy("save_weights")
    st_numpy.save_file(check_state(state, "save_weights"), path)


def from_torchvision(module: Any) -> dict[str, np.ndarray]:
    """from_torchvision(module) -> dict

    The weights of a torchvision ResNet-50 (``torchvision.models.resnet50()``,
    trained or not), copied to the host as float32.

    Parameters
    ----------
    module : torch.nn.Module or mapping
        The model, or its ``state_dict()``. Tensors on a GPU are copied back.

    Returns
    -------
    dict of str to ndarray
        A checked state (see :func:`check_state`).
    """
    if isinstance(module, Mapping):
        tensors = module
    elif callable(getattr(module, "state_dict", None)):
        tensors = module.state_dict()
    else:
        raise arg_error(TypeError, "from_torchvision", "module",
                        "expected a torch.nn.Module or its state_dict(), "
                        f"got {type(module).__name__}")
    arrays = {}
    for key, value in tensors.items():
        if str(key).endswith(_SKIPPED_SUFFIX):
            continue
        if hasattr(value, "detach"):  # a torch tensor: NumPy sees float32 CPU memory only
            value = value.detach().to("cpu").float().numpy()
        arrays[key] = value
    return check_state(arrays, "from_torchvision", "module")


def init_weights(seed: int = 0, *, random_stats: bool = False) -> dict[str, np.ndarray]:
    """init_weights(seed=0, *, random_stats=False) -> dict

    Fresh ResNet-50 weights drawn as torchvision initialises ``resnet50()``:
    conv weights He-normal with fan_out (std = sqrt(2 / (cout * kh * kw))),
    BatchNorm weight 1, bias 0, running mean 0, running var 1, and the fc
    layer as torch.nn.Linear's default (weight and bias uniform in
    +-1/sqrt(2048)). The same seed gives the same weights.

    Parameters
    ----------
    seed : int, optional
        In [0, 2**64).
    random_stats : bool, optional
        Instead of the identity BatchNorm, draw weight in [0.5, 1.5), bias
        and running mean from N(0, 0.1^2) and running var in [0.5, 1.5), so
        that folding BatchNorm changes every value (for tests).

    Returns
    -------
    dict of str to ndarray
    """
    seed = check_seed(seed, "init_weights")
    random_stats = check_bool(random_stats, "init_weights", "random_stats")
    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {}
    for layer in RESNET50:
        if isinstance(layer, Conv):
            std = np.sqrt(2.0 / (layer.cout * layer.kh * layer.kw))
            shape = (layer.cout, layer.cin, layer.kh, layer.kw)
            state[f"{layer.name}.weight"] = rng.standard_normal(shape, np.float32) * np.float32(std)
            state.update(_batchnorm(rng, layer.bn, layer.cout, random_stats))
        elif isinstance(layer, Linear):
            bound = 1.0 / np.sqrt(layer.cin)
            state[f"{layer.name}.weight"] = rng.uniform(-bound, bound, (layer.cout, layer.cin))
            state[f"{layer.name}.bias"] = rng.uniform(-bound, bound, layer.cout)
    return {k: v.astype(np.float32) for k, v in state.items()}


def _batchnorm(rng: np.random.Generator, name: str, channels: int,
               random_stats: bool) -> dict[str, np.ndarray]:
    if not random_stats:
        one, zero = np.ones(channels), np.zeros(channels)
        return {f"{name}.weight": one, f"{name}.bias": zero,
                f"{name}.running_mean": zero.copy(), f"{name}.running_var": one.copy()}
    return {f"{name}.weight": rng.uniform(0.5, 1.5, channels),
            f"{name}.bias": rng.normal(0.0, 0.1, channels),
            f"{name}.running_mean": rng.normal(0.0, 0.1, channels),
            f"{name}.running_var": rng.uniform(0.5, 1.5, channels)}
