"""cudalab.bench.results without a GPU: the one results schema, its writer, reader and machine block."""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import types

import numpy as np
import pytest

import cudalab
from cudalab.bench import Measurement
from cudalab.bench import results as R
from _support import fake_gpu_measurement as fake


MACHINE = {"hostname": "h"}


# ---- writing and reading back ----------------------------------------------------------


def test_results_dict_layout():
    rows = [fake("add", 1e-3, bytes=3e6),
            R.Row(fake("mm", 2e-3, flops=2e9), {"nodeid": "t.py::test_mm"}),
            {"op": "copy", "impl": "torch", "measurement": fake("copy", 5e-4)}]
    data = R.results_dict("demo", rows, machine=MACHINE, command="demo --x",
                          extra={"settings": {"a": 1}})
    assert list(data)[:6] == ["schema", "kind", "created", "command", "machine", "rows"]
    assert data["schema"] == R.RESULTS_SCHEMA == "cudalab.results/1"
    assert (data["kind"], data["command"], data["machine"]) == ("demo", "demo --x", MACHINE)
    assert data["created"].endswith("+00:00")
    assert data["settings"] == {"a": 1}
    assert data["rows"][0] == {"measurement": rows[0].to_dict()}
    assert data["rows"][1]["nodeid"] == "t.py::test_mm"
    assert (data["rows"][2]["op"], data["rows"][2]["impl"]) == ("copy", "torch")
    assert data["rows"][2]["measurement"]["derived"]["median"] == pytest.approx(5e-4)
    json.dumps(data)


def test_results_dict_defaults_to_this_machine_and_argv():
    data = R.results_dict("demo", [])
    assert data["machine"]["hostname"] == socket.gethostname()
    assert data["command"].split()[1:] == sys.argv[1:]


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"kind": ""}, TypeError, "'kind'"),
    ({"kind": 3}, TypeError, "'kind'"),
    ({"rows": [1.0]}, TypeError, "expected Measurements, Rows or dicts"),
    ({"rows": [{"measurement": {"label": "x"}}]}, TypeError, "expected Measurements"),
    ({"extra": {"rows": []}}, ValueError, "'rows' belong to the schema"),
    ({"max_times": 4}, ValueError, "'max_times': expected an int >= 5"),
])
def test_results_dict_argument_errors(kwargs, exc, message):
    call = {"kind": "demo", "rows": [], "machine": MACHINE, **kwargs}
    with pytest.raises(exc, match=message):
        R.results_dict(call.pop("kind"), call.pop("rows"), **call)


def test_write_and_read_back_every_row(tmp_path, rng):
    m = Measurement(label="add", sub_label="4096", description="cudalab", times=tuple(rng.uniform(1, 2, 11)),
                    number_per_run=7, host_time=3e-6, launch_gap=1e-6, bytes=6.0, ceiling_name="copy",
                    ceiling_value=1e12, ceiling_unit="B/s", device="GPU", device_index=0,
                    clocks={"sm_mhz": 1980}, held=True, settings={"name": "quick", "hold": True},
                    metadata={"shape": [3, 5]})
    path = R.write_results(tmp_path / "r.json", "demo", [R.Row(m, {"op": "add"}), fake("x", 1.0)],
                           machine=MACHINE, extra={"note": "n"})
    assert path == tmp_path / "r.json"
    back = R.read_results(path)
    assert (back.kind, back.machine, back.data["note"]) == ("demo", MACHINE, "n")
    assert back.rows[0] == R.Row(m, {"op": "add"})
    assert back.rows[0].measurement.settings == {"name": "quick", "hold": True}
    assert back.rows[0].measurement.metadata == {"shape": [3, 5]}
    assert back.measurements[1] == fake("x", 1.0)
    assert back.rows[1].get("op", "-") == "-"


def test_raw_times_stay_on_one_line(tmp_path):
    R.write_results(tmp_path / "r.json", "demo", [fake("x", 1e-3)], machine=MACHINE)
    text = (tmp_path / "r.json").read_text()
    [line] = [line for line in text.splitlines() if '"times"' in line]
    assert line.strip().startswith('"times": [') and line.strip().endswith("],")
    assert line.count(",") == 5


def test_dumps_puts_only_number_lists_on_one_line():
    data = {"shape": [16384, 16384], "times": [1.5e-06, -2.25, 3], "names": ["a", "b"],
            "nested": {"empty": [], "x": 1.0}, "text": "[1,   2]", "np": np.int64(7)}
    text = R.dumps(data)
    assert json.loads(text) == {**data, "np": 7}
    assert '"shape": [16384, 16384]' in text
    assert '"times": [1.5e-06, -2.25, 3]' in text
    assert '"names": [\n' in text


def test_numpy_values_in_metadata_are_written_as_json(tmp_path):
    m = fake("np", 1e-3, metadata={"n": np.int64(7), "x": np.float32(0.5), "shape": np.array([3, 5])})
    R.write_results(tmp_path / "r.json", "demo", [m], machine=MACHINE)
    back = R.read_results(tmp_path / "r.json").measurements[0]
    assert back.metadata == {"n": 7, "x": 0.5, "shape": [3, 5]}


def test_max_times_keeps_order_statistics_with_exact_quartiles(tmp_path, rng):
    m = Measurement(label="long", times=tuple(rng.uniform(1e-4, 2e-4, 1003)))
    R.write_results(tmp_path / "r.json", "demo", [m, fake("short", 1.0)], machine=MACHINE,
                    max_times=201)
    data = json.loads((tmp_path / "r.json").read_text())
    kept = data["rows"][0]["measurement"]
    assert len(kept["times"]) == 201 and "1003 repeats" in kept["times_kept"]
    assert kept["derived"]["repeats"] == 1003  # derived from every time
    assert "times_kept" not in data["rows"][1]["measurement"]
    back = R.read_results(tmp_path / "r.json").measurements[0]
    assert back.median == pytest.approx(m.median, rel=1e-12)
    assert back.iqr == pytest.approx(m.iqr, rel=1e-9)
    assert (back.min, back.max) == (m.min, m.max)
    assert back.mean == pytest.approx(statistics.fmean(m.times), rel=1e-2)


def test_write_results_never_creates_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        R.write_results(tmp_path / "missing" / "r.json", "demo", [], machine=MACHINE)
    assert not (tmp_path / "missing").exists()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        R.write_results(tmp_path, "demo", [], machine=MACHINE)


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "is not valid JSON"),
        ("[1, 2]", "is not a cudalab results file"),
        ('{"rows": []}', "is not a cudalab results file"),
        ('{"schema": "other/1", "rows": []}', "unknown schema 'other/1'"),
        ('{"schema": "cudalab.results/1", "rows": {}}', "expected a 'rows' list"),
        ('{"schema": "cudalab.results/1", "rows": [{"nodeid": "a"}]}', "row #0 is malformed"),
        ('{"schema": "cudalab.results/1", "rows": [{"measurement": 5}]}', "row #0 is malformed"),
        ('{"schema": "cudalab.results/1", "rows": ["x"]}', "row #0 is malformed"),
        ('{"schema": "cudalab.results/1", "rows": [{"measurement": {"label": "a", "times": []}}]}',
         "row #0 is malformed"),
    ],
)
def test_read_results_rejects_other_files(tmp_path, content, message):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        R.read_results(path)


def test_empty_results_round_trip(tmp_path):
    R.write_results(tmp_path / "r.json", "demo", [], machine={})
    back = R.read_results(tmp_path / "r.json")
    assert back.rows == [] and back.machine == {} and back.kind == "demo"


# ---- the machine block -----------------------------------------------------------------


def test_machine_info_fields(tmp_path):
    info = R.machine_info(tmp_path)
    assert info["hostname"] == socket.gethostname()
    assert info["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["versions"]["cudalab"] == cudalab.__version__
    assert info["versions"]["numpy"] == np.__version__
    assert info["cuda"]["runtime_version"] == cudalab.runtime_version()
    assert info["cuda"]["driver_version"] == cudalab.driver_version()
    assert info["cuda"]["available"] == cudalab.is_available()
    expected = cudalab.device_count() if cudalab.is_available() else 0
    assert len(info["devices"]) == expected
    assert info["git"] is None  # tmp_path is no git checkout
    json.dumps(info)


def test_machine_info_lists_only_installed_optional_packages(monkeypatch):
    monkeypatch.setattr(R, "_package_version", lambda name: "9.9" if name == "torch" else None)
    versions = R.machine_info()["versions"]
    assert versions["torch"] == "9.9"
    assert "cupy" not in versions and "nvidia-ml-py" not in versions


def test_machine_info_without_root_has_no_git():
    assert R.machine_info()["git"] is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_machine_info_records_the_commit(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("one")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert R.machine_info(tmp_path)["git"] == {"commit": head, "dirty": False}
    (tmp_path / "f.txt").write_text("two")
    assert R.machine_info(tmp_path)["git"] == {"commit": head, "dirty": True}


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a stand-in cudalab._nvml whose sample() the test sets."""
    module = types.ModuleType("cudalab._nvml")
    monkeypatch.setitem(sys.modules, "cudalab._nvml", module)
    monkeypatch.setattr(cudalab, "_nvml", module, raising=False)
    return module


def test_live_clocks_come_from_nvml_sample(fake_nvml):
    fake_nvml.sample = lambda device: {"sm_clock_mhz": 1980 + device, "memory_clock_mhz": 2619}
    assert R._live_clocks(1) == {"sm_clock_mhz": 1981, "memory_clock_mhz": 2619}


def test_live_clocks_none_and_errors(fake_nvml):
    fake_nvml.sample = lambda device: None
    assert R._live_clocks(0) is None

    def broken(device):
        raise RuntimeError("NVML went away")

    fake_nvml.sample = broken
    assert R._live_clocks(0) == {"error": "NVML went away"}


def test_live_clocks_and_driver_without_the_module(monkeypatch):
    monkeypatch.delattr(cudalab, "_nvml", raising=False)
    monkeypatch.setitem(sys.modules, "cudalab._nvml", None)  # import raises ImportError
    assert R._live_clocks(0) is None
    assert R._driver_release() is None


def test_driver_release_from_nvml(fake_nvml):
    fake_nvml.driver_release = lambda: "580.159.04"
    assert R._driver_release() == "580.159.04"
