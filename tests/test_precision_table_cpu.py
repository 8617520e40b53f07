"""The one precision table (cudalab._precision): aliases, round trips, errors, and
that no other module writes the tf32 -> "high" mapping or torch's TF32 flag."""

from __future__ import annotations

import ast
import pathlib
import types

import pytest

from cudalab import _precision as P

PACKAGE = pathlib.Path(P.__file__).resolve().parent
BENCHMARKS = PACKAGE.parents[1] / "benchmarks"

EXPECTED = {
    "fp64": {"fp64", "float64"},
    "fp32": {"fp32", "float32"},
    "tf32": {"tf32", "tfloat32"},
    "fp16": {"fp16", "float16", "half"},
    "bf16": {"bf16", "bfloat16"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_alias_resolves(name):
    for alias in EXPECTED[name]:
        assert P.resolve(alias).name == name
        assert P.lookup(alias) is P.resolve(alias)
    assert set(P.resolve(name).aliases) == EXPECTED[name]


def test_canonical_names_round_trip():
    assert [s.name for s in P.SPECS] == ["fp64", "fp32", "tf32", "fp16", "bf16"]
    assert [s.long_name for s in P.SPECS] == ["float64", "float32", "tf32", "float16", "bfloat16"]
    for spec in P.SPECS:
        assert P.resolve(spec.name) is spec and P.resolve(spec.long_name) is spec
        assert P.short_name(spec.long_name) == spec.name
        assert P.long_name(spec.name) == spec.long_name


def test_table_values():
    assert {s.name: s.storage for s in P.SPECS} == {
        "fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16",
        "bf16": "bfloat16"}
    assert {s.name: s.matmul_precision for s in P.SPECS} == {
        "fp64": None, "fp32": "highest", "tf32": "high", "fp16": None, "bf16": None}
    assert {s.name: s.torch_matmul_precision for s in P.SPECS} == {
        "fp64": None, "fp32": "highest", "tf32": "high", "fp16": None, "bf16": None}
    assert [s.name for s in P.SPECS if s.torch_allow_tf32] == ["tf32"]
    assert {s.name: s.torch_dtype for s in P.SPECS} == {
        "fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16",
        "bf16": "bfloat16"}
    # Helpers keep names outside the table as they are (storage) or None.
    assert P.storage("int32") == "int32" and P.matmul_precision("int32") is None
    assert P.storage("tf32") == "float32" and P.matmul_precision("float32") == "highest"


def test_unknown_names_give_one_clear_error():
    with pytest.raises(ValueError) as e:
        P.resolve("fp8", "f", "dtype")
    msg = str(e.value)
    assert msg.startswith("f() argument 'dtype': unknown precision 'fp8'; expected one of ")
    for aliases in EXPECTED.values():
        for alias in aliases:
            assert repr(alias) in msg
    with pytest.raises(TypeError, match=r"resolve\(\) argument 'precision': expected a str"):
        P.resolve(16)
    assert P.lookup("fp8") is None and P.lookup(None) is None


def test_torch_tf32_restores_flags():
    torch = types.SimpleNamespace(backends=types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32="m")),
        cudnn=types.SimpleNamespace(allow_tf32="c")))
    with P.TorchTf32(torch, True):
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.cudnn.allow_tf32 == "c"
    assert torch.backends.cuda.matmul.allow_tf32 == "m"
    with P.TorchTf32(torch, False, cudnn=True):
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is False
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == ("m", "c")


def test_apis_accept_either_spelling_and_keep_their_own():
    from cudalab.bench import MatmulCase
    from cudalab.nn.precision import PRECISIONS, get_precision

    for alias in ("fp16", "half", "float16"):
        case = MatmulCase(alias, 64)
        assert case.dtype == "float16" and case.name == "matmul_float16"
    assert MatmulCase("tf32", 64).precision == "high"
    assert MatmulCase("fp32", 64).precision == "highest"
    assert get_precision("float16") is PRECISIONS["fp16"]
    assert get_precision("bfloat16") is PRECISIONS["bf16"]
    assert get_precision("float32") is PRECISIONS["fp32"]
    with pytest.raises(ValueError, match=r"expected one of 'fp32', 'tf32', 'fp16', 'bf16', "
                                         r"got 'fp8'"):
        get_precision("fp8")
    with pytest.raises(ValueError, match=r"expected one of 'float64', 'float32', 'tf32', "
                                         r"'float16', 'bfloat16', got 'fp8'"):
        MatmulCase("fp8", 64)


def _sources():
    files = [p for p in PACKAGE.rglob("*.py") if p.name != "_precision.py"]
    files += sorted(BENCHMARKS.glob("*.py")) if BENCHMARKS.is_dir() else []
    assert len(files) > 50
    return files


def test_no_module_outside_the_table_hard_codes_the_tf32_mapping():
    """The literal "high" (TF32 matmul) and assignments to torch's allow_tf32 flag live
    only in cudalab/_precision.py; everything else reads the table."""
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "high":
                offenders.append(f"{path.name}:{node.lineno}: 'high'")
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == "allow_tf32":
                        offenders.append(f"{path.name}:{node.lineno}: allow_tf32 =")
    assert offenders == []
