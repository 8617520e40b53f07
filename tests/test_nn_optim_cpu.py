"""CPU tier: argument checking of the fused scaler and optimizer kernels.

``_core._nn_unscale_``, ``_nn_update_scale_``, ``_nn_sgd_`` and ``_nn_adamw_``
check, before touching the device and in this order: the hyper-parameters,
the lists (type, then lengths), the device scalars, then every array. So
everything that needs no DeviceArray is checked here, without a GPU; the
checks of real arrays (dtype, contiguity, shapes, devices, overlap) are in
tests/test_nn_optim_gpu.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import arg_error, assert_arg_error, no_gpu_only

import cudalab
from cudalab import _core

UNSCALE = "_nn_unscale_"
UPDATE = "_nn_update_scale_"
SGD = "_nn_sgd_"
ADAMW = "_nn_adamw_"

SIGNATURES = {
    UNSCALE: "(grads, inv_scale, found_inf)",
    UPDATE: "(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, "
            "growth_interval=2000)",
    SGD: "(params, grads, momentum_buffers, lr, momentum=0.0, dampening=0.0, "
         "weight_decay=0.0, nesterov=False, found_inf=None, grad_scale=None, first_step=False)",
    ADAMW: "(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, "
           "weight_decay=0.01, found_inf=None, grad_scale=None)",
}


# ---- documentation ---------------------------------------------------------------


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_private_and_documented(name):
    f = getattr(_core, name)
    assert f.__text_signature__ == SIGNATURES[name]
    for section in ("Parameters\n----------", "Returns\n-------", "Raises\n------"):
        assert section in f.__doc__
    assert name not in cudalab.__all__


@pytest.mark.parametrize("name", [UNSCALE, SGD, ADAMW])
def test_docstring_counts_bytes(name):
    """The lead computes GB/s from the bytes per element the docstring states."""
    assert "Bytes moved" in getattr(_core, name).__doc__


def test_adamw_docstring_states_the_skip_and_graph_rules():
    doc = _core._nn_adamw_.__doc__
    assert "step count included" in doc
    assert "captured CUDA graph" in doc


# ---- signatures -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "required"), [(UNSCALE, "grads"), (UPDATE, "scale"),
                                                (SGD, "params"), (ADAMW, "params")])
def test_missing_and_unknown_arguments(name, required):
    f = getattr(_core, name)
    with pytest.raises(TypeError, match=f"missing required argument '{required}'"):
        f()
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        f(bogus=1)
    with pytest.raises(TypeError, match="at most"):
        f(*range(20))


def test_sgd_requires_lr():
    with pytest.raises(TypeError, match="missing required argument 'lr'"):
        _core._nn_sgd_([], [], None)


def test_adamw_requires_step_and_lr():
    with pytest.raises(TypeError, match="missing required argument 'step'"):
        _core._nn_adamw_([], [], [], [])
    with pytest.raises(TypeError, match="missing required argument 'lr'"):
        _core._nn_adamw_([], [], [], [], None)


# ---- hyper-parameters ---------------------------------------------------------------

BAD_TYPES = ["0.1", 1j, None, [0.1], object()]


@pytest.mark.parametrize("bad", BAD_TYPES, ids=repr)
@pytest.mark.parametrize("param", ["lr", "momentum", "dampening", "weight_decay"])
def test_sgd_numbers_must_be_real(param, bad):
    kw = {"lr": 0.1, param: bad}
    with assert_arg_error(TypeError, SGD, param, match="^expected a real number"):
        _core._nn_sgd_([], [], None, **kw)


@pytest.mark.parametrize("bad", BAD_TYPES, ids=repr)
@pytest.mark.parametrize("param", ["lr", "beta1", "beta2", "eps", "weight_decay"])
def test_adamw_numbers_must_be_real(param, bad):
    kw = {"lr": 1e-3, param: bad}
    with assert_arg_error(TypeError, ADAMW, param, match="^expected a real number"):
        _core._nn_adamw_([], [], [], [], "step", **kw)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("param", ["lr", "momentum", "dampening", "weight_decay"])
def test_sgd_numbers_must_be_finite(param, bad):
    kw = {"lr": 0.1, param: bad}
    with assert_arg_error(ValueError, SGD, param, match="^must be finite"):
        _core._nn_sgd_([], [], None, **kw)


@pytest.mark.parametrize(
    ("param", "value", "text"),
    [
        ("lr", -1e-3, r"^must be >= 0, got -0\.001$"),
        ("momentum", -0.5, r"^must be >= 0, got -0\.5$"),
        ("weight_decay", -1, r"^must be >= 0, got -1$"),
    ],
)
def test_sgd_ranges(param, value, text):
    kw = {"lr": 0.1, param: value}
    with assert_arg_error(ValueError, SGD, param, match=text):
        _core._nn_sgd_([], [], None, **kw)


@pytest.mark.parametrize(
    ("param", "value", "text"),
    [
        ("lr", -1.0, r"^must be >= 0, got -1\.0$"),
        ("beta1", 1.0, r"^must be in \[0, 1\), got 1\.0$"),
        ("beta1", -0.1, r"^must be in \[0, 1\)"),
        ("beta2", 1, r"^must be in \[0, 1\), got 1$"),
        ("beta2", 1.5, r"^must be in \[0, 1\)"),
        ("eps", -1e-8, r"^must be >= 0"),
        ("weight_decay", -0.01, r"^must be >= 0"),
        ("eps", math.nan, r"^must be finite"),
    ],
)
def test_adamw_ranges(param, value, text):
    kw = {"lr": 1e-3, param: value}
    with assert_arg_error(ValueError, ADAMW, param, match=text):
        _core._nn_adamw_([], [], [], [], "step", **kw)


@pytest.mark.parametrize("kw", [dict(momentum=0.0), dict(momentum=0.9, dampening=0.1),
                                dict(momentum=0.9, dampening=-0.1)])
def test_nesterov_needs_momentum_and_no_dampening(kw):
    with assert_arg_error(ValueError, SGD, "nesterov",
                          match=r"^requires momentum > 0 and dampening == 0$"):
        _core._nn_sgd_([], [], [], 0.1, nesterov=True, **kw)


def test_flags_use_truthiness():
    class Boom:
        def __bool__(self):
            raise ZeroDivisionError("truth")

    with pytest.raises(ZeroDivisionError):
        _core._nn_sgd_([], [], None, 0.1, nesterov=Boom())
    with pytest.raises(ZeroDivisionError):
        _core._nn_sgd_([], [], None, 0.1, first_step=Boom())


@pytest.mark.parametrize(
    ("param", "value", "exc", "text"),
    [
        ("growth_factor", 1.0, ValueError, r"^must be > 1, got 1\.0$"),
        ("growth_factor", 0.5, ValueError, r"^must be > 1"),
        ("growth_factor", math.inf, ValueError, r"^must be finite"),
        ("growth_factor", "2", TypeError, r"^expected a real number"),
        ("backoff_factor", 1.0, ValueError, r"^must be in \(0, 1\), got 1\.0$"),
        ("backoff_factor", 0.0, ValueError, r"^must be in \(0, 1\)"),
        ("backoff_factor", -0.5, ValueError, r"^must be in \(0, 1\)"),
        ("growth_interval", 0, ValueError, r"^must be in \[1, 2\*\*31 - 1\], got 0$"),
        ("growth_interval", -3, ValueError, r"^must be in \[1, 2\*\*31 - 1\]"),
        ("growth_interval", 2**31, ValueError, r"^must be in \[1, 2\*\*31 - 1\]"),
        ("growth_interval", 2**80, ValueError, r"^must be in \[1, 2\*\*31 - 1\]"),
        ("growth_interval", 2000.0, TypeError, r"^expected an int, got float$"),
        ("growth_interval", True, TypeError, r"^expected an int, got bool$"),
        ("growth_interval", "2000", TypeError, r"^expected an int"),
    ],
)
def test_update_scale_numbers(param, value, exc, text):
    with assert_arg_error(exc, UPDATE, param, match=text):
        _core._nn_update_scale_("s", "t", "f", **{param: value})


def test_update_scale_takes_numpy_ints():
    # An index-like growth_interval passes the number checks (the arrays fail next).
    with assert_arg_error(TypeError, UPDATE, "scale"):
        _core._nn_update_scale_("s", "t", "f", growth_interval=np.int64(7))


# ---- lists ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.ones(3, np.float32), 3, "abc", None, {1: 2}, iter([])],
                         ids=lambda b: type(b).__name__)
def test_lists_must_be_list_or_tuple(bad):
    text = r"^expected a list or tuple of DeviceArrays, got "
    with assert_arg_error(TypeError, UNSCALE, "grads", match=text):
        _core._nn_unscale_(bad, None, None)
    with assert_arg_error(TypeError, SGD, "params", match=text):
        _core._nn_sgd_(bad, [], None, 0.1)
    with assert_arg_error(TypeError, SGD, "grads", match=text):
        _core._nn_sgd_([], bad, None, 0.1)
    with assert_arg_error(TypeError, ADAMW, "exp_avg_sqs", match=text):
        _core._nn_adamw_([], [], [], bad, None, 1e-3)


def test_momentum_buffers_may_be_none_but_not_another_type():
    with assert_arg_error(TypeError, SGD, "momentum_buffers",
                          match=r"^expected a list or tuple of DeviceArrays or None, got int"):
        _core._nn_sgd_([], [], 0, 0.1)


def test_momentum_buffers_required_with_momentum():
    with assert_arg_error(ValueError, SGD, "momentum_buffers",
                          match=r"^is required when momentum > 0$"):
        _core._nn_sgd_([], [], None, 0.1, momentum=0.9)


@pytest.mark.parametrize(
    ("call", "func", "param", "text"),
    [
        (lambda: _core._nn_sgd_([1, 2], [1], None, 0.1), SGD, "grads",
         r"^has 1 arrays but 'params' has 2$"),
        (lambda: _core._nn_sgd_([1], [1], [1, 2], 0.1, momentum=0.9), SGD, "momentum_buffers",
         r"^has 2 arrays but 'params' has 1$"),
        (lambda: _core._nn_adamw_((1,), (1,), (), (1,), None, 1e-3), ADAMW, "exp_avgs",
         r"^has 0 arrays but 'params' has 1$"),
        (lambda: _core._nn_adamw_([1], [1], [1], [1, 1], None, 1e-3), ADAMW, "exp_avg_sqs",
         r"^has 2 arrays but 'params' has 1$"),
    ],
)
def test_list_lengths_must_match(call, func, param, text):
    with assert_arg_error(ValueError, func, param, match=text):
        call()


def test_elements_must_be_device_arrays():
    # SGD needs no device scalar, so its element check is reachable without a
    # GPU; the other entry points check their scalars first (GPU tier).
    host = np.ones(3, np.float32)
    text = r"^expected a cudalab\.DeviceArray, got numpy\.ndarray.*cudalab\.asarray"
    with assert_arg_error(TypeError, SGD, "params[0]", match=text):
        _core._nn_sgd_([host], [host], None, 0.1)
    with assert_arg_error(TypeError, SGD, "params[0]", match=text):
        _core._nn_sgd_((host, host), (host, host), (host, host), 0.1, momentum=0.5)


# ---- device scalars ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "func", "param", "or_none"),
    [
        (lambda: _core._nn_unscale_([], None, None), UNSCALE, "inv_scale", False),
        (lambda: _core._nn_update_scale_(2.0**16, None, None), UPDATE, "scale", False),
        (lambda: _core._nn_adamw_([], [], [], [], 1, 1e-3), ADAMW, "step", False),
        (lambda: _core._nn_sgd_([], [], None, 0.1, found_inf=0.0), SGD, "found_inf", True),
        (lambda: _core._nn_sgd_([], [], None, 0.1, grad_scale=np.ones(1, np.float32)), SGD,
         "grad_scale", True),
    ],
)
def test_scalars_must_be_device_arrays(call, func, param, or_none):
    text = r"^expected a cudalab\.DeviceArray" + (" or None" if or_none else "") + ", got "
    with assert_arg_error(TypeError, func, param, match=text):
        call()


# ---- order of the checks --------------------------------------------------------------


def test_numbers_are_checked_before_lists_and_arrays():
    with assert_arg_error(ValueError, SGD, "lr"):
        _core._nn_sgd_("not a list", 3, 4, -1.0)
    with assert_arg_error(ValueError, ADAMW, "beta2"):
        _core._nn_adamw_(1, 2, 3, 4, 5, 1e-3, beta2=2.0)
    with assert_arg_error(ValueError, UPDATE, "growth_interval"):
        _core._nn_update_scale_(1, 2, 3, growth_interval=0)


def test_lists_are_checked_before_scalars():
    with assert_arg_error(TypeError, UNSCALE, "grads"):
        _core._nn_unscale_(None, None, None)
    with assert_arg_error(ValueError, ADAMW, "grads"):
        _core._nn_adamw_([1], [], [], [], None, 1e-3)


def test_message_prefix():
    with pytest.raises(ValueError, match=arg_error(SGD, "lr")):
        _core._nn_sgd_([], [], None, -0.1)


# ---- valid arguments reach the device ---------------------------------------------------


@no_gpu_only
@pytest.mark.parametrize(
    "call",
    [
        lambda: _core._nn_sgd_([], [], None, 0.1),
        lambda: _core._nn_sgd_((), (), (), 0.0, momentum=0.9, dampening=0.0, nesterov=True,
                               weight_decay=1e-4, first_step=True),
    ],
)
def test_valid_arguments_need_a_device(call):
    with pytest.raises(cudalab.NoDeviceError, match="_nn_sgd_"):
        call()
