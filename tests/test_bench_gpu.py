"""cudalab.bench on a GPU: the timer against a known-length kernel, and the harness's modes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cudalab
from cudalab import _core
from cudalab.bench import (CopyCase, LaunchCase, MatmulCase, Measurement, Timer, TransferCase, ceiling,
                           measure)
from _support import F32, random_array, rel_err, torch_cuda

pytestmark = pytest.mark.gpu


def _sm_clock_hz() -> float:
    """The SM clock now: NVML's reading when available, else the max boost clock."""
    try:
        from cudalab import _nvml

        live = _nvml.sample(cudalab.current_device())
    except ImportError:
        live = None
    if live and live.get("sm_clock_mhz"):
        return live["sm_clock_mhz"] * 1e6
    return cudalab.get_device_properties().clock_rate_khz * 1e3


@pytest.mark.parametrize("expected_s", [2e-3, 2e-4])
def test_timer_measures_a_spin_kernel_within_5_percent(expected_s):
    """A kernel spinning a known number of cycles takes cycles / clock seconds."""
    cycles = int(expected_s * cudalab.get_device_properties().clock_rate_khz * 1e3)
    m = measure(_core._spin, cycles, label="spin")
    clock = _sm_clock_hz()  # read again: the clock at the end of the run
    expected = cycles / clock
    assert m.median == pytest.approx(expected, rel=0.05), (m.summary(), clock)
    assert not m.held and m.repeats >= 10  # long calls keep the queue full unheld


def test_short_ops_are_batched_and_report_host_time_and_launch_gap():
    a = cudalab.asarray(np.arange(1, 1025, dtype=np.float32))
    m = measure(lambda: a.__iadd__(1.0), label="add_", min_run_time=0.05)
    assert m.number_per_run > 1  # a few-us kernel: many calls per timed repeat
    assert m.held  # launch-bound: each repeat is queued behind a spin kernel
    assert m.host_time is not None and m.host_time > 0
    assert m.launch_gap is not None and m.launch_gap >= 0
    # The GPU time per call of a 4 KiB add is far below the host's per-call cost.
    assert m.median < 1e-4


def test_measure_returns_rates_and_ceiling_percent(rng):
    n = 1537  # odd size
    a = cudalab.asarray(random_array(rng, (n, n), F32))
    m = measure(cudalab.add, a, a, bytes=3 * a.nbytes, label="add")
    assert m.ceiling_name == "copy" and m.ceiling_unit == "B/s"
    assert 1 < m.percent_of_ceiling < 150
    assert m.gbps == pytest.approx(3 * a.nbytes / m.median / 1e9)
    assert m.device == cudalab.get_device_properties().name
    data = json.loads(m.to_json())
    assert Measurement.from_dict(data) == m


def test_flush_l2_times_cold_single_calls(rng):
    x = cudalab.asarray(random_array(rng, 1 << 20, F32))  # 4 MiB: fits L2
    warm = measure(cudalab.sum, x, min_run_time=0.05)
    cold = measure(cudalab.sum, x, flush_l2=True, min_run_time=0.05)
    assert cold.flush_l2 and cold.number_per_run == 1 and cold.launch_gap is None
    assert cold.median > warm.median  # reading from DRAM, not L2


def test_measure_on_a_stream_and_result_is_unchanged(rng):
    s = cudalab.Stream()
    host = random_array(rng, (301, 77), F32)
    a = cudalab.asarray(host)
    m = measure(lambda: cudalab.mul(a, 2.0), stream=s, min_run_time=0.02)
    assert m.repeats >= 10
    np.testing.assert_allclose(cudalab.mul(a, 2.0).get(), host * 2)


def test_fp16_matmul_is_faster_than_fp64():
    n = 2048
    results = {}
    for dtype in ("float16", "float64"):
        a = cudalab.random.normal((n, n), dtype=dtype, seed=3)
        results[dtype] = measure(cudalab.matmul, a, a, flops=2 * n**3, min_run_time=0.05)
    assert results["float16"].tflops > 3 * results["float64"].tflops


def test_ceilings_are_measured_once_and_plausible():
    props = cudalab.get_device_properties()
    copy = ceiling("copy")
    assert ceiling("copy") is copy  # cached per process
    assert 0.3 * props.peak_memory_bandwidth < copy.value < 1.05 * props.peak_memory_bandwidth
    launch = ceiling("launch")
    assert 1e-7 < launch.value < 1e-4
    h2d = ceiling("h2d")
    assert 1e9 < h2d.value < 200e9


def test_measure_times_torch_work_on_the_shared_default_stream():
    torch = torch_cuda()
    x = torch.randn(4096, 4096, device="cuda")
    m = measure(lambda: torch.mm(x, x), flops=2 * 4096**3, min_run_time=0.05)
    # A 4096^3 fp32 GEMM takes well over a millisecond on any current GPU at
    # fp32 rates; an untimed (empty) measurement would be microseconds.
    assert m.median > 1e-4 and m.tflops < 200


def test_measure_leaves_memory_as_it_found_it(memory_baseline, rng):
    x = cudalab.asarray(random_array(rng, 100_003, F32))
    before = cudalab.memory_allocated()
    measure(cudalab.sum, x, flush_l2=True, min_run_time=0.02)
    import gc

    gc.collect()
    cudalab.synchronize()
    assert cudalab.memory_allocated() == before  # the L2-flush buffer was given back


def test_measurement_records_its_preset_and_hold():
    a = cudalab.asarray(np.arange(1, 4097, dtype=np.float32))
    m = measure(lambda: a.__iadd__(1.0), preset="quick", min_run_time=0.03)
    assert m.settings["name"] == "quick" and m.settings["min_run_time"] == 0.03
    assert m.settings["hold"] is True
    unheld = Timer("quick", hold=False).measure(lambda: a.__iadd__(1.0))
    assert not unheld.held and unheld.launch_gap is None


def test_measure_result_returns_the_first_call(rng):
    host = random_array(rng, 5003, F32)
    a = cudalab.asarray(host)
    calls = []

    def scaled():
        calls.append(None)
        return cudalab.mul(a, float(len(calls)))

    m, first = Timer("quick").measure_result(scaled)
    np.testing.assert_array_equal(first.get(), host)  # the first call multiplied by 1
    assert m.repeats >= 10 and len(calls) > m.repeats


def test_cases_measure_what_they_say():
    timer = Timer("quick")
    copy = CopyCase(64 << 20).measure(timer)
    assert copy.bytes == 2 * (64 << 20) and copy.gbps > 10
    n = 1031
    prepared = MatmulCase("float32", n).prepare()
    mm = prepared.measure(timer)
    a, b = (prepared.operands[k].get().astype(np.float64) for k in ("a", "b"))
    expected = a @ b
    got = prepared.operands["out"].get()
    assert rel_err(got, expected) < 1e-5  # "highest": true fp32
    assert mm.flops == 2.0 * n ** 3 and mm.metadata["precision"] == "highest"
    for memory in ("pinned", "pageable"):
        d2h = TransferCase("d2h", memory, 8 << 20).prepare()
        m = d2h.measure(timer)
        if memory == "pageable":
            assert not m.held  # a synchronous copy is never held behind a spin kernel
        np.testing.assert_array_equal(d2h.operands["host"], d2h.operands["device"].get())
    launch = LaunchCase(1000, repeats=5).measure(timer)
    assert 1e-7 < launch.median < 1e-4 and launch.number_per_run == 1000


def test_cases_torch_twins_share_the_data():
    torch = torch_cuda()
    prepared = MatmulCase("tf32", 512).prepare()
    twin = prepared.torch_twin(torch)
    before = torch.backends.cuda.matmul.allow_tf32
    out = twin.fn()
    assert torch.backends.cuda.matmul.allow_tf32 == before  # set for the call only
    ours = prepared.fn()
    np.testing.assert_allclose(out.cpu().numpy(), ours.get(), rtol=2e-2, atol=1e-1)
    m = twin.measure(Timer("quick"), description="torch")
    assert m.description == "torch" and m.flops == prepared.flops
