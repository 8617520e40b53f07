"""CPU tier: matmul's API and the argument errors that need no device array.

Checked before any device access (so the same with or without a GPU):
the float32 precision setting, the padding mode, matmul's `precision` and
`pad` arguments (validated first),
non-DeviceArray operands (the one "expected a cudalab.DeviceArray" message with
the asarray() hint), the order of the checks, and the calling convention.
Dtype/shape/out errors need real DeviceArrays and live in test_matmul_gpu.py.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from _support import DTYPE_IDS, DTYPES, arg_error, is_float

import cudalab


def test_public_names():
    for name in (
        "matmul",
        "set_float32_matmul_precision",
        "get_float32_matmul_precision",
        "set_matmul_padding",
        "get_matmul_padding",
    ):
        assert name in cudalab.__all__
        assert getattr(cudalab, name) is getattr(cudalab._core, name)


def test_matmul_signature_and_doc():
    sig = inspect.signature(cudalab.matmul)
    assert list(sig.parameters) == ["a", "b", "out", "precision", "pad"]
    assert sig.parameters["out"].default is None
    assert sig.parameters["precision"].default is None
    assert sig.parameters["pad"].default is None
    doc = cudalab.matmul.__doc__
    assert "Parameters" in doc and "Returns" in doc and "precision" in doc and "pad :" in doc
    assert list(inspect.signature(cudalab.set_float32_matmul_precision).parameters) == [
        "precision"
    ]
    assert list(inspect.signature(cudalab.get_float32_matmul_precision).parameters) == []


def test_devicearray_has_matmul_operator():
    assert hasattr(cudalab.DeviceArray, "__matmul__")
    assert hasattr(cudalab.DeviceArray, "__rmatmul__")


# ------------------------------------------------------------ precision ----


def test_default_precision_is_highest():
    # Nothing in this process should have changed it outside a restoring fixture.
    assert cudalab.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("value", ["high", "highest"])
def test_set_get_precision_round_trip(restore_precision, value):
    cudalab.set_float32_matmul_precision(value)
    assert cudalab.get_float32_matmul_precision() == value
    cudalab.set_float32_matmul_precision(precision="highest")
    assert cudalab.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("value", ["medium", "HIGH", "", "tf32", "highest "])
def test_set_precision_bad_string_is_value_error(restore_precision, value):
    before = cudalab.get_float32_matmul_precision()
    with pytest.raises(ValueError, match=arg_error("set_float32_matmul_precision", "precision")):
        cudalab.set_float32_matmul_precision(value)
    assert cudalab.get_float32_matmul_precision() == before


@pytest.mark.parametrize("value", [None, 1, b"high", 0.5, ["high"]])
def test_set_precision_non_string_is_type_error(restore_precision, value):
    with pytest.raises(TypeError, match=arg_error("set_float32_matmul_precision", "precision")):
        cudalab.set_float32_matmul_precision(value)


def test_set_precision_calling_convention():
    with pytest.raises(TypeError, match="missing required argument 'precision'"):
        cudalab.set_float32_matmul_precision()
    with pytest.raises(TypeError, match="unexpected keyword argument 'mode'"):
        cudalab.set_float32_matmul_precision(mode="high")
    with pytest.raises(TypeError):
        cudalab.get_float32_matmul_precision("high")


# --------------------------------------------------------------- matmul ----


@pytest.mark.parametrize("value", ["medium", "HIGHEST", "tf32"])
def test_matmul_bad_precision_string_is_value_error(value):
    """`precision` is validated before the operands (so no arrays are needed)."""
    with pytest.raises(ValueError, match=arg_error("matmul", "precision")):
        cudalab.matmul(np.ones((2, 2)), np.ones((2, 2)), precision=value)


@pytest.mark.parametrize("value", [1, True, 3.0, b"high"])
def test_matmul_non_string_precision_is_type_error(value):
    with pytest.raises(TypeError, match=arg_error("matmul", "precision")):
        cudalab.matmul(np.ones((2, 2)), np.ones((2, 2)), precision=value)


@pytest.mark.parametrize(
    ("a", "type_name"),
    [
        (np.ones((2, 2), dtype=np.float32), "numpy.ndarray"),
        ([[1.0, 2.0]], "list"),
        (3.0, "float"),
        (None, "NoneType"),
        ("a", "str"),
    ],
    ids=["ndarray", "list", "float", "None", "str"],
)
def test_matmul_non_devicearray_operand_is_type_error(a, type_name):
    expected = (
        f"matmul() argument 'a': expected a cudalab.DeviceArray, got {type_name} "
        "(copy host data to the device with cudalab.asarray())"
    )
    with pytest.raises(TypeError) as info:
        cudalab.matmul(a, np.ones((2, 2), dtype=np.float32))
    assert str(info.value) == expected
    with pytest.raises(TypeError) as info:
        cudalab.matmul(b=np.ones((2, 2), dtype=np.float32), a=a)
    assert str(info.value) == expected


def test_matmul_checks_a_before_b():
    with pytest.raises(TypeError, match=arg_error("matmul", "a")):
        cudalab.matmul([1.0], "not an array")
    with pytest.raises(TypeError, match=arg_error("matmul", "a")):
        cudalab.matmul([1.0], "not an array", out="not an array either")


def test_matmul_precision_checked_before_operands():
    """A bad precision is reported even when the operands are bad too; None
    (the process-wide setting) passes on to the operand checks."""
    with pytest.raises(ValueError, match=arg_error("matmul", "precision")):
        cudalab.matmul(None, None, precision="low")
    with pytest.raises(TypeError, match=arg_error("matmul", "precision")):
        cudalab.matmul(None, None, out=1, precision=3)
    with pytest.raises(TypeError, match=arg_error("matmul", "a")):
        cudalab.matmul(None, None, precision=None)


def test_matmul_calling_convention():
    with pytest.raises(TypeError, match="missing required argument 'b'"):
        cudalab.matmul(np.ones((2, 2)))
    with pytest.raises(TypeError, match="at most 5 positional"):
        cudalab.matmul(1, 2, None, None, None, 6)
    with pytest.raises(TypeError, match="unexpected keyword argument 'alpha'"):
        cudalab.matmul(1, 2, alpha=2.0)
    with pytest.raises(TypeError, match="multiple values for argument 'b'"):
        cudalab.matmul(1, 2, b=3)


# -------------------------------------------------------------- padding ----


def test_default_padding_is_auto():
    # Nothing in this process should have changed it outside a restoring fixture.
    assert cudalab.get_matmul_padding() == "auto"


def test_padding_api_signatures_and_docs():
    assert list(inspect.signature(cudalab.set_matmul_padding).parameters) == ["mode"]
    assert list(inspect.signature(cudalab.get_matmul_padding).parameters) == []
    doc = cudalab.set_matmul_padding.__doc__
    assert "Parameters" in doc and "'auto'" in doc


@pytest.mark.parametrize("value", ["auto", True, False])
def test_set_get_padding_round_trip(restore_padding, value):
    cudalab.set_matmul_padding(value)
    got = cudalab.get_matmul_padding()
    assert got == value and type(got) is type(value)
    cudalab.set_matmul_padding(mode="auto")
    assert cudalab.get_matmul_padding() == "auto"


@pytest.mark.parametrize("value", ["on", "AUTO", "", "true", "auto "])
def test_set_padding_bad_string_is_value_error(restore_padding, value):
    before = cudalab.get_matmul_padding()
    with pytest.raises(ValueError, match=arg_error("set_matmul_padding", "mode") + "expected"):
        cudalab.set_matmul_padding(value)
    assert cudalab.get_matmul_padding() == before


@pytest.mark.parametrize("value", [None, 1, 0, b"auto", 0.5, ["auto"], np.bool_(True)])
def test_set_padding_non_bool_is_type_error(restore_padding, value):
    """Only the bool singletons and 'auto': 1/0 and NumPy bools are refused."""
    before = cudalab.get_matmul_padding()
    with pytest.raises(TypeError, match=arg_error("set_matmul_padding", "mode")):
        cudalab.set_matmul_padding(value)
    assert cudalab.get_matmul_padding() == before


def test_set_padding_calling_convention():
    with pytest.raises(TypeError, match="missing required argument 'mode'"):
        cudalab.set_matmul_padding()
    with pytest.raises(TypeError, match="unexpected keyword argument 'pad'"):
        cudalab.set_matmul_padding(pad=True)
    with pytest.raises(TypeError):
        cudalab.get_matmul_padding(True)


@pytest.mark.parametrize("value", ["on", "Auto", "yes"])
def test_matmul_bad_pad_string_is_value_error(value):
    """`pad` is validated before the operands (so no arrays are needed)."""
    with pytest.raises(ValueError, match=arg_error("matmul", "pad") + "expected 'auto'"):
        cudalab.matmul(np.ones((2, 2)), np.ones((2, 2)), pad=value)


@pytest.mark.parametrize("value", [1, 0, 3.0, b"auto", np.bool_(False)])
def test_matmul_non_bool_pad_is_type_error(value):
    with pytest.raises(TypeError, match=arg_error("matmul", "pad")):
        cudalab.matmul(np.ones((2, 2)), np.ones((2, 2)), pad=value)


def test_matmul_pad_checked_after_precision_before_operands():
    with pytest.raises(ValueError, match=arg_error("matmul", "precision")):
        cudalab.matmul(None, None, precision="low", pad="bad")
    with pytest.raises(ValueError, match=arg_error("matmul", "pad")):
        cudalab.matmul(None, None, pad="bad")
    for ok in (None, "auto", True, False):
        with pytest.raises(TypeError, match=arg_error("matmul", "a")):
            cudalab.matmul(None, None, pad=ok)


def test_private_backend_switch_round_trip():
    """_set_matmul_backend (for benchmarks) returns the previous backend."""
    set_backend = cudalab._core._set_matmul_backend
    assert set_backend("float64", "cublas") == "cublas"  # float64's default
    assert set_backend(np.float32, "lt") == "lt"  # everything else defaults to cuBLASLt
    assert set_backend("float32", "cublas") == "lt"
    assert set_backend("float32", "lt") == "cublas"
    with pytest.raises(ValueError, match=arg_error("_set_matmul_backend", "backend")):
        set_backend("float32", "cutlass")
    with pytest.raises(TypeError, match=arg_error("_set_matmul_backend", "dtype")):
        set_backend("int32", "lt")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_private_backend_switch_takes_float_dtypes_only(dtype):
    set_backend = cudalab._core._set_matmul_backend
    if not is_float(dtype):
        with pytest.raises(TypeError) as info:
            set_backend(dtype, "lt")
        assert str(info.value) == (
            f"_set_matmul_backend() argument 'dtype': unsupported dtype {dtype.name}"
        )
        return
    before = set_backend(dtype, "cublas")
    try:
        assert set_backend(dtype, "lt") == "cublas"
    finally:
        set_backend(dtype, before)
