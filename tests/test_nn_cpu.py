"""CPU tier: cudalab.nn without a GPU.

Imports (cudalab.nn loads lazily), the Precision table, and every argument
check that runs before the first device allocation: the functional wrappers
(which report errors under their public names), Parameter, Linear, MLP,
GradScaler, SGD and AdamW (torch.optim's wording), TeacherData, train_step and
Trainer; and the NumPy float64 reference (cudalab.nn.reference) against finite
differences. The GPU's numerics are in tests/test_nn_gpu.py.
"""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from _support import assert_arg_error, no_gpu_only

import cudalab
import cudalab.nn as nn
from cudalab.nn import functional as F
from cudalab.nn._util import derive_seed

HOST = np.ones((4, 8), dtype=np.float32)


# ---- imports ---------------------------------------------------------------------


def test_nn_loads_lazily():
    code = ("import sys, cudalab; assert 'cudalab.nn' not in sys.modules; "
            "m = cudalab.nn; assert 'cudalab.nn' in sys.modules; print(m.__name__)")
    # The cudalab this test imported (the source tree with its built module, or
    # an installed copy), not always the source tree: it has no _core once installed.
    env_path = str(Path(cudalab.__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": env_path, "PATH": ""}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cudalab.nn"


def test_public_names():
    assert "nn" in cudalab.__all__
    assert cudalab.nn is nn
    for name in nn.__all__:
        assert hasattr(nn, name), name
    for name in F.__all__:
        assert hasattr(F, name), name
    assert F.relu_grad is cudalab.relu_grad and F.gelu_grad is cudalab.gelu_grad


PUBLIC = [F.linear, F.linear_backward_input, F.linear_backward_weight, F.cross_entropy,
          F.empty_aux, F.relu_mask_bytes, nn.get_precision, nn.train_step,
          nn.Parameter, nn.Linear, nn.MLP, nn.GradScaler, nn.SGD, nn.AdamW, nn.TeacherData,
          nn.Trainer, nn.Precision]


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__name__)
def test_docstrings_start_with_the_signature(obj):
    doc = inspect.getdoc(obj)
    assert doc.startswith(obj.__name__ + "("), doc.splitlines()[0]


@pytest.mark.parametrize("obj", [o for o in PUBLIC if o is not nn.Precision],
                         ids=lambda o: o.__name__)
def test_docstrings_have_parameters(obj):
    assert "Parameters\n----------" in inspect.getdoc(obj)


# ---- Precision -------------------------------------------------------------------------


def test_precision_table():
    assert list(nn.PRECISIONS) == ["fp32", "tf32", "fp16", "bf16"]
    want = {
        "fp32": (np.float32, "highest", False),
        "tf32": (np.float32, "high", False),
        "fp16": (np.float16, None, True),
        "bf16": (ml_dtypes.bfloat16, None, False),
    }
    for name, (dtype, mm, scaler) in want.items():
        p = nn.PRECISIONS[name]
        assert p.name == name
        assert p.compute_dtype == np.dtype(dtype)
        assert p.matmul_precision == mm
        assert p.needs_scaler is scaler
        assert p.master_dtype == np.dtype(np.float32)
        assert p.is_half is (name in ("fp16", "bf16"))
        assert nn.get_precision(name) is p
        assert nn.get_precision(p) is p


def test_precision_is_frozen():
    with pytest.raises(AttributeError):
        nn.PRECISIONS["fp32"].name = "x"
    assert hash(nn.PRECISIONS["fp16"]) == hash(nn.PRECISIONS["fp16"])


def test_get_precision_errors():
    with assert_arg_error(ValueError, "get_precision", "precision", r"'fp32'.*got 'fp8'"):
        nn.get_precision("fp8")
    with assert_arg_error(TypeError, "get_precision", "precision", "got float"):
        nn.get_precision(1.0)
    with assert_arg_error(ValueError, "train_step", "precision"):
        nn.get_precision("float8", "train_step")


# ---- functional ------------------------------------------------------------------------


def test_functional_errors_use_public_names():
    with assert_arg_error(TypeError, "linear", "x", "asarray"):
        F.linear(HOST, HOST)
    with assert_arg_error(ValueError, "linear", "activation", "'tanh'"):
        F.linear(HOST, HOST, activation="tanh")
    with assert_arg_error(ValueError, "linear", "precision"):
        F.linear(HOST, HOST, precision="medium")
    with assert_arg_error(ValueError, "linear_backward_input", "activation"):
        F.linear_backward_input(HOST, HOST, activation="silu")
    with assert_arg_error(TypeError, "linear_backward_input", "grad_y"):
        F.linear_backward_input(HOST, HOST)
    with assert_arg_error(TypeError, "linear_backward_weight", "accumulate", "bool"):
        F.linear_backward_weight(HOST, HOST, accumulate=1)
    with assert_arg_error(TypeError, "linear_backward_weight", "grad_y"):
        F.linear_backward_weight(HOST, HOST)
    with assert_arg_error(ValueError, "cross_entropy", "reduction"):
        F.cross_entropy(HOST, HOST, reduction="avg")
    with assert_arg_error(TypeError, "cross_entropy", "logits"):
        F.cross_entropy(HOST, HOST)


def test_functional_keyword_only_options():
    with pytest.raises(TypeError):
        F.linear_backward_weight(HOST, HOST, None)  # out= is keyword-only
    with pytest.raises(TypeError):
        F.cross_entropy(HOST, HOST, None)


def test_functional_precision_object_maps_to_matmul_precision():
    # A Precision is accepted where a matmul precision is: the error is still x's.
    with assert_arg_error(TypeError, "linear", "x"):
        F.linear(HOST, HOST, precision=nn.PRECISIONS["tf32"])


@pytest.mark.parametrize("features,want", [(1, 16), (127, 16), (128, 16), (129, 32), (300, 48)])
def test_relu_mask_bytes(features, want):
    assert F.relu_mask_bytes(features) == want


def test_relu_mask_bytes_and_empty_aux_errors():
    with assert_arg_error(ValueError, "relu_mask_bytes", "features", ">= 1"):
        F.relu_mask_bytes(0)
    with assert_arg_error(TypeError, "relu_mask_bytes", "features"):
        F.relu_mask_bytes(2.0)
    with assert_arg_error(ValueError, "empty_aux", "activation"):
        F.empty_aux((3, 4), None)
    with assert_arg_error(ValueError, "empty_aux", "activation"):
        F.empty_aux((3, 4), "tanh")
    with assert_arg_error(ValueError, "empty_aux", "shape"):
        F.empty_aux((3, 0), "gelu")
    with assert_arg_error(ValueError, "empty_aux", "shape"):
        F.empty_aux((), "relu")


# ---- Parameter, Linear, MLP ----------------------------------------------------------------


def test_parameter_errors():
    with assert_arg_error(TypeError, "Parameter", "name"):
        nn.Parameter(1, HOST)
    with assert_arg_error(TypeError, "Parameter", "value", "DeviceArray"):
        nn.Parameter("w", HOST)


@pytest.mark.parametrize("args,kwargs,exc,param", [
    ((0, 4), {}, ValueError, "in_features"),
    ((4, 0), {}, ValueError, "out_features"),
    ((4.0, 4), {}, TypeError, "in_features"),
    ((4, True), {}, TypeError, "out_features"),
    ((4, 4, 1), {}, TypeError, "bias"),
    ((4, 4), {"activation": "tanh"}, ValueError, "activation"),
    ((4, 4), {"activation": 1}, TypeError, "activation"),
    ((4, 4), {"seed": -1}, ValueError, "seed"),
    ((4, 4), {"seed": 2**64}, ValueError, "seed"),
    ((4, 4), {"seed": 1.5}, TypeError, "seed"),
])
def test_linear_argument_errors(args, kwargs, exc, param):
    with assert_arg_error(exc, "Linear", param):
        nn.Linear(*args, **kwargs)


def test_linear_signature():
    sig = inspect.signature(nn.Linear)
    assert list(sig.parameters) == ["in_features", "out_features", "bias", "activation", "seed"]
    assert sig.parameters["seed"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("args,kwargs,exc,param", [
    (([8],), {}, ValueError, "sizes"),
    ((8,), {}, TypeError, "sizes"),
    (("88",), {}, TypeError, "sizes"),
    (([8, 0, 4],), {}, ValueError, "sizes"),
    (([8, 4.0],), {}, TypeError, "sizes"),
    (([8, 4], "swish"), {}, ValueError, "activation"),
    (([8, 4],), {"seed": -2}, ValueError, "seed"),
])
def test_mlp_argument_errors(args, kwargs, exc, param):
    with assert_arg_error(exc, "MLP", param):
        nn.MLP(*args, **kwargs)


@no_gpu_only
def test_valid_layers_need_a_device():
    with pytest.raises(cudalab.NoDeviceError):
        nn.Linear(4, 3, activation="gelu", seed=7)
    with pytest.raises(cudalab.NoDeviceError):
        nn.MLP([4, 8, 3], "relu")


def test_derive_seed_streams_differ_and_repeat():
    keys = {derive_seed(s, i) for s in range(20) for i in range(20)}
    assert len(keys) == 400
    assert all(0 <= k < 2**64 for k in keys)
    assert derive_seed(123, 4) == derive_seed(123, 4)


# ---- GradScaler ------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,exc,param", [
    ({"init_scale": 0.0}, ValueError, "init_scale"),
    ({"init_scale": -1.0}, ValueError, "init_scale"),
    ({"init_scale": math.inf}, ValueError, "init_scale"),
    ({"init_scale": "1"}, TypeError, "init_scale"),
    ({"growth_factor": 1.0}, ValueError, "growth_factor"),
    ({"growth_factor": math.nan}, ValueError, "growth_factor"),
    ({"backoff_factor": 1.0}, ValueError, "backoff_factor"),
    ({"backoff_factor": 0.0}, ValueError, "backoff_factor"),
    ({"growth_interval": 0}, ValueError, "growth_interval"),
    ({"growth_interval": 2**31}, ValueError, "growth_interval"),
    ({"growth_interval": 10.0}, TypeError, "growth_interval"),
    ({"growth_interval": True}, TypeError, "growth_interval"),
    ({"enabled": 1}, TypeError, "enabled"),
])
def test_grad_scaler_argument_errors(kwargs, exc, param):
    with assert_arg_error(exc, "GradScaler", param):
        nn.GradScaler(**kwargs)


def test_grad_scaler_defaults_are_torchs():
    sig = inspect.signature(nn.GradScaler)
    defaults = {k: v.default for k, v in sig.parameters.items()}
    assert defaults == {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
                        "growth_interval": 2000, "enabled": True}


def test_disabled_grad_scaler_is_a_no_op_without_a_device():
    s = nn.GradScaler(enabled=False)
    assert not s.is_enabled()
    assert s.scale is None and s.found_inf is None and s.growth_tracker is None
    assert s.get_scale() == 1.0
    s.unscale_([HOST])  # not even looked at
    s.update()
    assert "enabled=False" in repr(s)


@no_gpu_only
def test_enabled_grad_scaler_needs_a_device():
    with pytest.raises(cudalab.NoDeviceError):
        nn.GradScaler()


# ---- optimizers: torch.optim's checks and wording ---------------------------------------


SGD_ERRORS = [
    ({"lr": -0.1}, ValueError, "Invalid learning rate: -0.1"),
    ({"lr": math.nan}, ValueError, "Invalid learning rate: nan"),
    ({"lr": "0.1"}, TypeError, "Invalid learning rate"),
    ({"lr": 0.1, "momentum": -0.5}, ValueError, "Invalid momentum value: -0.5"),
    ({"lr": 0.1, "weight_decay": -1e-4}, ValueError, "Invalid weight_decay value: -0.0001"),
    ({"lr": 0.1, "nesterov": True}, ValueError,
     "Nesterov momentum requires a momentum and zero dampening"),
    ({"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}, ValueError,
     "Nesterov momentum requires a momentum and zero dampening"),
]

ADAMW_ERRORS = [
    ({"lr": -1e-3}, ValueError, "Invalid learning rate: -0.001"),
    ({"eps": -1e-8}, ValueError, "Invalid epsilon value: -1e-08"),
    ({"betas": (1.0, 0.999)}, ValueError, "Invalid beta parameter at index 0: 1.0"),
    ({"betas": (0.9, -0.1)}, ValueError, "Invalid beta parameter at index 1: -0.1"),
    ({"betas": (0.9,)}, TypeError, "betas"),
    ({"weight_decay": -0.01}, ValueError, "Invalid weight_decay value: -0.01"),
]


@pytest.mark.parametrize("kwargs,exc,message", SGD_ERRORS)
def test_sgd_hyper_parameter_errors(kwargs, exc, message):
    with pytest.raises(exc, match="^" + _escape(message)):
        nn.SGD([], **kwargs)


@pytest.mark.parametrize("kwargs,exc,message", ADAMW_ERRORS)
def test_adamw_hyper_parameter_errors(kwargs, exc, message):
    with pytest.raises(exc, match="^" + _escape(message)):
        nn.AdamW([], **kwargs)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("cls", [nn.SGD, nn.AdamW])
def test_optimizer_params_errors(cls):
    with pytest.raises(ValueError, match="^optimizer got an empty parameter list$"):
        cls([], lr=0.1)
    with pytest.raises(TypeError, match="should be an iterable of Parameters, but got int"):
        cls(3, lr=0.1)
    with pytest.raises(TypeError, match="^optimizer can only optimize Parameters, but one of "
                                        "the params is ndarray"):
        cls([HOST], lr=0.1)
    with pytest.raises(TypeError, match="^Tensor lr must be|Invalid learning rate"):
        cls([HOST], lr=[0.1])


def test_optimizer_errors_match_torch_wording():
    torch = pytest.importorskip("torch")
    w = torch.zeros(2, requires_grad=True)
    for kwargs, exc, message in SGD_ERRORS:
        if "Invalid learning rate" in message and not isinstance(kwargs["lr"], float):
            continue
        if isinstance(kwargs.get("lr"), float) and math.isnan(kwargs["lr"]):
            continue  # torch's `lr < 0.0` lets NaN through; cudalab refuses it
        with pytest.raises(exc, match="^" + _escape(message)):
            torch.optim.SGD([w], **kwargs)
    for kwargs, exc, message in ADAMW_ERRORS:
        if exc is TypeError:
            continue
        with pytest.raises(exc, match="^" + _escape(message)):
            torch.optim.AdamW([w], **kwargs)
    with pytest.raises(ValueError, match="^optimizer got an empty parameter list$"):
        torch.optim.SGD([], lr=0.1)


def test_optimizer_defaults_are_torchs():
    sgd = inspect.signature(nn.SGD).parameters
    assert [sgd[k].default for k in ("momentum", "dampening", "weight_decay", "nesterov")] == \
        [0, 0, 0, False]
    assert sgd["lr"].default is inspect.Parameter.empty
    adamw = inspect.signature(nn.AdamW).parameters
    assert {k: adamw[k].default for k in ("lr", "betas", "eps", "weight_decay")} == \
        {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}


# ---- TeacherData ---------------------------------------------------------------------------


@pytest.mark.parametrize("args,kwargs,exc,param", [
    ((0, 10, 32), {}, ValueError, "in_features"),
    ((8, 1, 32), {}, ValueError, "classes"),
    ((8, 10, 0), {}, ValueError, "batch_size"),
    ((8, 10, 32.0), {}, TypeError, "batch_size"),
    ((8, 10, 32), {"hidden": 64}, TypeError, "hidden"),
    ((8, 10, 32), {"hidden": (64, 0)}, ValueError, "hidden"),
    ((8, 10, 32), {"batches": 0}, ValueError, "batches"),
    ((8, 10, 32), {"seed": -1}, ValueError, "seed"),
])
def test_teacher_data_argument_errors(args, kwargs, exc, param):
    with assert_arg_error(exc, "TeacherData", param):
        nn.TeacherData(*args, **kwargs)


@no_gpu_only
def test_valid_teacher_data_needs_a_device():
    with pytest.raises(cudalab.NoDeviceError):
        nn.TeacherData(8, 10, 32, hidden=(16,), batches=3, seed=1)


# ---- train_step and Trainer --------------------------------------------------------------


def _fake_model_and_optimizer():
    """Instances that pass the type checks without touching a device."""
    return nn.MLP.__new__(nn.MLP), nn.SGD.__new__(nn.SGD)


@pytest.mark.parametrize("func", ["train_step", "Trainer"])
def test_training_setup_errors(func):
    model, opt = _fake_model_and_optimizer()

    def call(*args, **kwargs):
        if func == "train_step":
            return nn.train_step(*args[:2], HOST, HOST, *args[2:], **kwargs)
        return nn.Trainer(*args, **kwargs)

    with assert_arg_error(TypeError, func, "model", "MLP"):
        call(object(), opt)
    with assert_arg_error(TypeError, func, "optimizer", "SGD or AdamW"):
        call(model, object())
    with assert_arg_error(ValueError, func, "precision"):
        call(model, opt, "fp64")
    with assert_arg_error(TypeError, func, "scaler", "GradScaler"):
        call(model, opt, "bf16", object())
    with assert_arg_error(ValueError, func, "scaler", "needs a GradScaler"):
        call(model, opt, "fp16")


def test_train_step_checks_arrays():
    model, opt = _fake_model_and_optimizer()
    with assert_arg_error(TypeError, "train_step", "x", "DeviceArray"):
        nn.train_step(model, opt, HOST, HOST, "fp16", nn.GradScaler(enabled=False))


def test_trainer_graph_flag_and_step_checks():
    model, opt = _fake_model_and_optimizer()
    with assert_arg_error(TypeError, "Trainer", "graph", "bool"):
        nn.Trainer(model, opt, graph=1)
    t = nn.Trainer(model, opt, "bf16", graph=True)
    assert t.steps == 0 and t.loss is None and t.cuda_graph is None
    with assert_arg_error(TypeError, "step", "x", "DeviceArray"):
        t.step(HOST, HOST)


# ---- the NumPy reference (cudalab.nn.reference) ----------------------------------------------

from cudalab.nn import reference as ref  # noqa: E402


def _ref_params(rng, sizes):
    return [(rng.standard_normal((b, a)) / math.sqrt(a), 0.1 * rng.standard_normal(b))
            for a, b in zip(sizes[:-1], sizes[1:])]


def test_reference_gelu_is_torchs_tanh_form_and_its_derivative():
    z = np.linspace(-4.0, 4.0, 41)
    want = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    np.testing.assert_allclose(ref.gelu_tanh(z), want, rtol=1e-15)
    h = 1e-6
    fd = (ref.gelu_tanh(z + h) - ref.gelu_tanh(z - h)) / (2 * h)
    np.testing.assert_allclose(ref.gelu_tanh_grad(z), fd, atol=1e-8)


@pytest.mark.parametrize("activation", ["gelu", "relu", None])
def test_reference_gradients_match_finite_differences(activation):
    rng = np.random.default_rng(3)
    sizes = (5, 7, 6, 4)
    params = _ref_params(rng, sizes)
    x = rng.standard_normal((9, sizes[0]))
    labels = rng.integers(0, sizes[-1], 9)
    loss, grads = ref.loss_and_grads(params, x, labels, activation)
    h = 1e-6
    for i, (w, b) in enumerate(params):
        for arr, got in ((w, grads[i][0]), (b, grads[i][1])):
            assert got.shape == arr.shape
            for idx in [(0,) * arr.ndim, tuple(s - 1 for s in arr.shape)]:
                saved = arr[idx]
                arr[idx] = saved + h
                up = ref.loss_and_grads(params, x, labels, activation)[0]
                arr[idx] = saved - h
                down = ref.loss_and_grads(params, x, labels, activation)[0]
                arr[idx] = saved
                assert got[idx] == pytest.approx((up - down) / (2 * h), abs=1e-7), (i, idx)
    assert loss == pytest.approx(ref.cross_entropy(ref.forward(params, x, activation)[0][-1],
                                                   labels)[0])


def test_reference_cross_entropy_of_equal_logits_is_log_classes():
    loss, grad = ref.cross_entropy(np.zeros((3, 8)), np.array([0, 3, 7]))
    assert loss == pytest.approx(math.log(8))
    assert grad[0, 0] == pytest.approx((1 / 8 - 1) / 3) and grad[0, 1] == pytest.approx(1 / 24)
    np.testing.assert_allclose(grad.sum(axis=1), 0.0, atol=1e-15)


def test_reference_forward_rounds_stored_values_to_the_dtype():
    rng = np.random.default_rng(4)
    params = _ref_params(rng, (8, 16, 4))
    x = rng.standard_normal((5, 8))
    hs, zs = ref.forward(params, x, "gelu", ml_dtypes.bfloat16)
    for a in hs + zs:
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, a.astype(ml_dtypes.bfloat16).astype(np.float64))
    exact = ref.forward(params, x, "gelu")[0][-1]
    assert 0 < np.max(np.abs(hs[-1] - exact)) < 0.05 * np.max(np.abs(exact))


def test_reference_adamw_first_step_moves_by_lr_times_the_sign():
    p, g = np.array([1.0, -2.0, 0.5]), np.array([0.3, -4.0, 1e-3])
    new, m, v = ref.adamw_step(p, g, np.zeros(3), np.zeros(3), 1, 0.01, (0.9, 0.999), 1e-12, 0.1)
    np.testing.assert_allclose(m, 0.1 * g)
    np.testing.assert_allclose(v, 0.001 * g * g)
    np.testing.assert_allclose(new, p * (1 - 0.001) - 0.01 * np.sign(g), rtol=1e-9)
    # The second step's bias corrections: t = 2.
    new2, _, _ = ref.adamw_step(new, g, m, v, 2, 0.01, (0.9, 0.999), 0.0, 0.0)
    np.testing.assert_allclose(new2, new - 0.01 * np.sign(g), rtol=1e-9)


def test_reference_mlp_params_reads_every_layer_as_float64():
    class _V:
        def __init__(self, a):
            self.a = a

        def get(self):
            return self.a

    def layer(w, b):
        return type("L", (), {"weight": type("P", (), {"value": _V(w)})(),
                              "bias": None if b is None else type("P", (), {"value": _V(b)})()})

    w = np.ones((2, 3), np.float32)
    model = type("M", (), {"layers": [layer(w, np.ones(2, np.float32)), layer(w.T, None)]})
    (w0, b0), (w1, b1) = ref.mlp_params(model)
    assert w0.dtype == b0.dtype == np.float64 and w1.shape == (3, 2)
    np.testing.assert_array_equal(b1, np.zeros(3))
