"""GPU tier: cudalab._nvml and GpuMonitor against the real NVML while the GPU works."""

from __future__ import annotations

import csv
import io
import re
import time

import numpy as np
import pytest

import cudalab
from cudalab import _nvml
from cudalab.monitor import FIELDS, GpuMonitor
from _support import F32, assert_arg_error, doc_python_blocks, random_array

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_pynvml():
    pytest.importorskip("pynvml")


def busy_gpu(seconds: float, rng: np.random.Generator) -> None:
    """Run float32 matmuls back to back for about `seconds`, then synchronize."""
    n = 4096
    a = cudalab.asarray(random_array(rng, (n, n), F32))
    b = cudalab.asarray(random_array(rng, (n, n), F32))
    c = cudalab.empty((n, n), dtype=np.float32)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):  # a few GEMMs per check keeps the queue short
            cudalab.matmul(a, b, out=c)
        cudalab.synchronize()
    assert np.isfinite(c.get()[:4, :4]).all()


def test_handle_is_the_cuda_device():
    # Matching by PCI bus id finds the same physical GPU: the UUIDs agree.
    props = cudalab.get_device_properties(0)
    with _nvml.session() as nvml:
        handle = _nvml.device_handle(nvml, 0)
        uuid = nvml.nvmlDeviceGetUUID(handle)
    assert (uuid.decode() if isinstance(uuid, bytes) else uuid) == props.uuid


def test_sample_is_plausible():
    live = _nvml.sample(0)
    assert live is not None and list(live) == list(FIELDS)
    assert live["sm_clock_mhz"] > 0 and live["memory_clock_mhz"] > 0
    assert 0 < live["memory_used_bytes"] <= cudalab.get_device_properties(0).total_memory
    assert 0 < live["temperature_c"] < 120
    assert 0 <= live["gpu_utilization_pct"] <= 100


def test_monitor_while_busy(rng):
    with GpuMonitor(interval_ms=20) as mon:
        busy_gpu(0.5, rng)
    samples = mon.samples
    assert len(samples) >= 5  # start, stop and the thread's (about 25 at 20 ms)
    assert [s.t_s for s in samples] == sorted(s.t_s for s in samples)
    assert samples[-1].t_s >= 0.5
    for s in samples:
        assert s.sm_clock_mhz > 0
        assert s.memory_used_bytes > 0
        assert 0 < s.temperature_c < 120
    assert max(s.gpu_utilization_pct for s in samples) > 0
    summary = mon.summary()
    assert summary.samples == len(samples)
    assert summary.max["sm_clock_mhz"] == max(s.sm_clock_mhz for s in samples)

    rows = list(csv.DictReader(io.StringIO(mon.to_csv())))
    assert len(rows) == len(samples)
    for row, s in zip(rows, samples):
        assert float(row["t_s"]) == s.t_s
        assert int(row["sm_clock_mhz"]) == s.sm_clock_mhz
        assert int(row["memory_used_bytes"]) == s.memory_used_bytes
        if s.power_w is not None:
            assert float(row["power_w"]) == s.power_w


def test_monitor_device_argument():
    last = cudalab.device_count() - 1
    with GpuMonitor(interval_ms=3_600_000, device=last) as mon:
        pass
    assert mon.device == last and len(mon.samples) == 2
    with assert_arg_error(ValueError, "GpuMonitor", "device", match="does not exist"):
        GpuMonitor(device=last + 1)


def test_docs_monitor_example_runs(monkeypatch, tmp_path, capsys):
    blocks = [b for b in doc_python_blocks("measuring") if "GpuMonitor" in b]
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)  # it writes gpu.csv
    exec(compile(blocks[0], "docs/measuring.md", "exec"), {"__name__": "__readme__"})
    assert re.match(r"\d+ samples over ", capsys.readouterr().out)
    rows = list(csv.DictReader((tmp_path / "gpu.csv").open()))
    assert len(rows) >= 2 and list(rows[0]) == ["t_s", *FIELDS]
