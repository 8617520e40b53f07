"""CPU tier: argument checking of the fused cross-entropy, _core._nn_cross_entropy.

Needs no GPU. The arguments that need no array (reduction, ignore_index, the
types of grad, loss_scale and out) are checked before the arrays, so their
errors are tested here with stand-in operands; the checks against arrays
(dtypes, shapes, layouts, overlap) are in tests/test_nn_loss_gpu.py, since an
array needs a device.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from _support import assert_arg_error, no_gpu_only

FUNC = "_nn_cross_entropy"
ce = cudalab._core._nn_cross_entropy
HOST = np.ones((2, 3), dtype=np.float32)  # never reaches the device: refused first


def test_documented_and_stubbed():
    assert ce.__text_signature__ == ("(logits, labels, grad=None, reduction='mean', "
                                     "loss_scale=None, out=None, ignore_index=-100)")
    for section in ("Parameters\n----------", "Returns\n-------", "Raises\n------",
                    "Notes\n-----"):
        assert section in ce.__doc__
    assert "NaN" in ce.__doc__ and "loss_scale" in ce.__doc__
    assert "_nn_cross_entropy" not in cudalab.__all__  # private: cudalab.nn wraps it


@pytest.mark.parametrize("reduction", ["avg", "MEAN", "", "none "])
def test_reduction_name(reduction):
    with assert_arg_error(ValueError, FUNC, "reduction", "'mean', 'sum' or 'none'"):
        ce(HOST, HOST, reduction=reduction)


@pytest.mark.parametrize("reduction", [None, 0, b"mean", ["mean"]])
def test_reduction_type(reduction):
    with assert_arg_error(TypeError, FUNC, "reduction", "'mean', 'sum' or 'none', got"):
        ce(HOST, HOST, reduction=reduction)


@pytest.mark.parametrize("ignore_index", [1.0, "-100", True, [0]])
def test_ignore_index_type(ignore_index):
    with assert_arg_error(TypeError, FUNC, "ignore_index", "expected an int or None"):
        ce(HOST, HOST, ignore_index=ignore_index)


def test_ignore_index_range():
    with assert_arg_error(OverflowError, FUNC, "ignore_index", "int64"):
        ce(HOST, HOST, ignore_index=2**63)


@pytest.mark.parametrize("param", ["grad", "loss_scale"])
@pytest.mark.parametrize("bad", [HOST, 1.0, [1.0], "x"], ids=["ndarray", "float", "list", "str"])
def test_optional_arrays_must_be_device_arrays(param, bad):
    with assert_arg_error(TypeError, FUNC, param,
                          r"expected a cudalab\.DeviceArray or None, got .*asarray"):
        ce(HOST, HOST, **{param: bad})


@pytest.mark.parametrize("bad", [HOST, 0, "out"], ids=["ndarray", "int", "str"])
def test_out_must_be_a_device_array(bad):
    with assert_arg_error(TypeError, FUNC, "out", r"expected a cudalab\.DeviceArray or None"):
        ce(HOST, HOST, out=bad)


@pytest.mark.parametrize("bad", [HOST, [[1.0]], 2.0, None])
def test_logits_must_be_a_device_array(bad):
    with assert_arg_error(TypeError, FUNC, "logits",
                          r"expected a cudalab\.DeviceArray, got .*asarray"):
        ce(bad, HOST)


def test_order_of_checks():
    """Options first, then grad/loss_scale/out types, then the arrays."""
    with assert_arg_error(ValueError, FUNC, "reduction"):
        ce(HOST, HOST, grad=1, reduction="x", out=2)
    with assert_arg_error(TypeError, FUNC, "grad"):
        ce(HOST, HOST, grad=1, out=2)
    with assert_arg_error(TypeError, FUNC, "out"):
        ce(HOST, HOST, out=2)


def test_call_signature_errors():
    with pytest.raises(TypeError, match="missing required argument 'labels'"):
        ce(HOST)
    with pytest.raises(TypeError, match="unexpected keyword argument 'weight'"):
        ce(HOST, HOST, weight=None)
    with pytest.raises(TypeError, match="at most 7 positional"):
        ce(HOST, HOST, None, "mean", None, None, -100, 0)
    with pytest.raises(TypeError, match="multiple values for argument 'logits'"):
        ce(HOST, HOST, logits=HOST)


@no_gpu_only
def test_valid_options_reach_the_array_checks_without_a_gpu():
    # Every option accepted: the first error is the host array.
    for reduction in ("mean", "sum", "none"):
        for ignore_index in (-100, None, 3, -(2**63)):
            with assert_arg_error(TypeError, FUNC, "logits", "asarray"):
                ce(HOST, HOST, reduction=reduction, ignore_index=ignore_index)
