"""CPU tier: the nn Linear GEMMs' API and the argument checks that need no device array.

``_core._nn_linear``, ``_nn_linear_backward_input`` and
``_nn_linear_backward_weight`` check their options (precision, activation,
accumulate) and the type of ``out`` before any array, then each array operand
in order; everything here happens before any CUDA call, so it behaves the same
with and without a GPU. The checks that need real DeviceArrays (dtypes,
shapes, layouts, aux, overlaps) are in test_nn_linear_gpu.py.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
from _support import assert_arg_error

import cudalab
from cudalab import _core

FUNCS = {
    "_nn_linear": ["x", "weight", "bias", "activation", "out", "aux", "precision"],
    "_nn_linear_backward_input": ["grad_y", "weight", "out", "aux", "activation", "bias_grad",
                                  "precision"],
    "_nn_linear_backward_weight": ["grad_y", "x", "out", "bias_grad", "accumulate",
                                   "precision"],
}
WITH_ACTIVATION = ["_nn_linear", "_nn_linear_backward_input"]
HOST = np.ones((4, 3), np.float32)


@pytest.mark.parametrize("name", FUNCS)
def test_private_documented_and_stubbed(name):
    f = getattr(_core, name)
    assert name not in cudalab.__all__
    params = inspect.signature(f).parameters
    assert list(params) == FUNCS[name]
    first_two = FUNCS[name][:2]
    for p in FUNCS[name]:
        if p not in first_two:
            assert params[p].default is (False if p == "accumulate" else None), p
    for section in ("Parameters\n----------", "Returns\n-------", "Raises\n------"):
        assert section in f.__doc__
    assert "float32, float16 or bfloat16" in f.__doc__
    stub = (Path(cudalab.__file__).parent / "_core.pyi").read_text()
    assert f"def {name}(" in stub


def test_docs_name_the_epilogue_rules():
    doc = _core._nn_linear.__doc__
    assert "tanh" in doc and "0.044715" in doc  # the GELU form cuBLASLt computes
    assert "uint8" in doc and "ceil(out_features / 128) * 16" in doc  # the ReLU mask
    assert "multiple of 8 elements" in doc  # the GELU aux leading dimension
    assert "DRELU_BGRAD / DGELU_BGRAD" in _core._nn_linear_backward_input.__doc__
    assert "BGRADB" in _core._nn_linear_backward_weight.__doc__


@pytest.mark.parametrize("name", FUNCS)
def test_missing_and_unknown_arguments(name):
    f = getattr(_core, name)
    with pytest.raises(TypeError, match=rf"{name}\(\) missing required argument"):
        f(HOST)
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'bogus'"):
        f(HOST, HOST, bogus=1)
    with pytest.raises(TypeError, match=rf"{name}\(\) takes at most {len(FUNCS[name])} positional"):
        f(*([HOST] * (len(FUNCS[name]) + 1)))


# ------------------------------------------------------------ options first ----


@pytest.mark.parametrize("name", WITH_ACTIVATION)
@pytest.mark.parametrize("value", ["tanh", "ReLU", "", "gelu_tanh", "relu "])
def test_activation_bad_name(name, value):
    with assert_arg_error(ValueError, name, "activation",
                          match=r"expected None, 'relu' or 'gelu', got '"):
        getattr(_core, name)(HOST, HOST, activation=value)


@pytest.mark.parametrize("name", WITH_ACTIVATION)
@pytest.mark.parametrize("value", [1, b"relu", ["gelu"], True])
def test_activation_bad_type(name, value):
    with assert_arg_error(TypeError, name, "activation",
                          match=r"expected None, 'relu' or 'gelu', got "):
        getattr(_core, name)(HOST, HOST, activation=value)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("value", ["medium", "HIGH", "tf32"])
def test_precision_bad_name(name, value):
    with assert_arg_error(ValueError, name, "precision", match="expected 'highest' or 'high'"):
        getattr(_core, name)(HOST, HOST, precision=value)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("value", [1, 0.5, b"high"])
def test_precision_bad_type(name, value):
    with assert_arg_error(TypeError, name, "precision", match="expected 'highest' or 'high'"):
        getattr(_core, name)(HOST, HOST, precision=value)


@pytest.mark.parametrize("value", [1, 0, "yes", None, np.bool_(True)])
def test_accumulate_must_be_bool(value):
    with assert_arg_error(TypeError, "_nn_linear_backward_weight", "accumulate",
                          match="expected a bool"):
        _core._nn_linear_backward_weight(HOST, HOST, accumulate=value)


def test_options_are_checked_before_the_arrays():
    # Both the precision and x are bad: precision is named.
    with assert_arg_error(ValueError, "_nn_linear", "precision"):
        _core._nn_linear("not an array", None, precision="low", activation="relu")
    # Activation before the arrays as well.
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "activation"):
        _core._nn_linear_backward_input(None, None, activation="swish")


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("out", [np.zeros((4, 3), np.float32), 0, "out", [0.0]])
def test_out_type_is_checked_before_the_arrays(name, out):
    with assert_arg_error(TypeError, name, "out",
                          match="expected a cudalab.DeviceArray or None, got .*cudalab.asarray"):
        getattr(_core, name)(HOST, HOST, out=out)


# ------------------------------------------------------------ array operands ----


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("bad", [HOST, [[1.0]], 3.0, None])
def test_first_operand_must_be_device_array(name, bad):
    param = FUNCS[name][0]
    with assert_arg_error(TypeError, name, param,
                          match="expected a cudalab.DeviceArray, got .*cudalab.asarray"):
        getattr(_core, name)(bad, HOST)


@pytest.mark.parametrize("name", FUNCS)
def test_valid_options_reach_the_operand_check(name):
    """Good options (all of them at once) pass; the first operand is what fails."""
    f = getattr(_core, name)
    kw = {"precision": "high", "out": None}
    if name in WITH_ACTIVATION:
        kw["activation"] = "gelu"
    if name == "_nn_linear_backward_weight":
        kw["accumulate"] = False
    with assert_arg_error(TypeError, name, FUNCS[name][0], match="expected a cudalab.DeviceArray"):
        f(HOST, HOST, **kw)
