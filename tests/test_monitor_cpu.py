"""CPU tier: cudalab._nvml and cudalab.monitor.GpuMonitor against a fake NVML.

No GPU and no real NVML: a fake ``pynvml`` module is put in ``sys.modules``,
the CUDA device -> PCI bus id lookup is replaced, and where timing matters the
monitor's clock and stop event are scripted, so every assertion is exact.
"""

from __future__ import annotations

import csv
import io
import math
import sys
import threading
import types
from dataclasses import FrozenInstanceError, fields

import pytest

import cudalab
from cudalab import _nvml, monitor
from cudalab.cli import check as cli
from cudalab.monitor import FIELDS, GpuMonitor, GpuSample, NvmlError, NvmlUnavailableError
from _support import assert_arg_error, no_gpu_only


# ---- a fake pynvml -------------------------------------------------------------

class _NVMLError(Exception):
    def __init__(self, message: str = "NVML error") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _error_class(name: str, message: str) -> type[_NVMLError]:
    def __init__(self: _NVMLError) -> None:
        _NVMLError.__init__(self, message)
    return type(name, (_NVMLError,), {"__init__": __init__})


def reading(k: int) -> dict:
    """The fake device's k-th reading (k = 0, 1, ...): distinct, known values."""
    return {"gpu": 10 + k, "memory": 20 + k, "used": (1 + k) << 30, "temp": 40 + k,
            "power_mw": 100_000 + 1000 * k, "limit_mw": 700_000, "sm": 1500 + 10 * k,
            "mem_clock": 2600 + k}


class FakeNvml(types.ModuleType):
    """Enough of pynvml for cudalab._nvml. One reading per nvmlDeviceGetUtilizationRates call."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVMLError = _NVMLError
    NVMLError_NotSupported = _error_class("NVMLError_NotSupported", "Not Supported")
    NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound",
                                             "NVML Shared Library Not Found")
    NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", "Driver Not Loaded")
    NVMLError_NotFound = _error_class("NVMLError_NotFound", "Not Found")
    NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", "GPU is lost")

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.bus_ids = {"00000000:01:00.0", "00000000:02:00.0"}
        self.refcount = 0
        self.init_calls = 0
        self.init_error: Exception | None = None
        self.unsupported: set[str] = set()
        self.failures: dict[str, tuple[range, Exception]] = {}  # name -> (readings, error)
        self.readings = 0  # readings started
        self.on_read = lambda: None  # called at each reading (the tests' clock hook)

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        assert self.refcount > 0, "nvmlShutdown without nvmlInit"
        self.refcount -= 1

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: bytes) -> tuple:
        assert isinstance(bus_id, bytes)
        if bus_id.decode() not in self.bus_ids:
            raise self.NVMLError_NotFound()
        return ("handle", bus_id.decode())

    def _value(self, name: str, handle: tuple, key: str) -> int:
        assert self.refcount > 0, f"{name} outside nvmlInit/nvmlShutdown"
        assert handle[0] == "handle"
        if name in self.unsupported:
            raise self.NVMLError_NotSupported()
        if name in self.failures and self.readings - 1 in self.failures[name][0]:
            raise self.failures[name][1]
        return reading(self.readings - 1)[key]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.readings += 1
        self.on_read()
        return types.SimpleNamespace(
            gpu=self._value("nvmlDeviceGetUtilizationRates", handle, "gpu"),
            memory=self._value("nvmlDeviceGetUtilizationRates", handle, "memory"))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=self._value("nvmlDeviceGetMemoryInfo", handle, "used"),
                                     total=80 << 30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._value("nvmlDeviceGetTemperature", handle, "temp")

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._value("nvmlDeviceGetPowerUsage", handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._value("nvmlDeviceGetEnforcedPowerLimit", handle, "limit_mw")

    def nvmlDeviceGetClockInfo(self, handle, clock):
        key = {self.NVML_CLOCK_SM: "sm", self.NVML_CLOCK_MEM: "mem_clock"}[clock]
        return self._value("nvmlDeviceGetClockInfo", handle, key)


def expected(k: int) -> dict:
    """What cudalab reports for reading k."""
    r = reading(k)
    return {"gpu_utilization_pct": r["gpu"], "memory_utilization_pct": r["memory"],
            "memory_used_bytes": r["used"], "temperature_c": r["temp"],
            "power_w": r["power_mw"] / 1000.0, "power_limit_w": r["limit_mw"] / 1000.0,
            "sm_clock_mhz": r["sm"], "memory_clock_mhz": r["mem_clock"]}


@pytest.fixture
def fake_nvml(monkeypatch) -> FakeNvml:
    """A fake pynvml, two fake CUDA devices (0 current) and their PCI bus ids."""
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(_nvml, "_pci_bus_id", lambda device: f"00000000:{device + 1:02X}:00.0")
    monkeypatch.setattr(monitor, "_core", types.SimpleNamespace(
        current_device=lambda: 0, device_count=lambda: 2, NoDeviceError=cudalab.NoDeviceError))
    return fake


@pytest.fixture
def no_pynvml(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail


class ScriptedClock:
    """Stands in for the monitor's `time` module: time moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


class ScriptedStopEvent:
    """The monitor's stop event: each wait(delay) advances the clock by `delay`
    (a perfect sleep); the wait after `waits` of them reports a stop."""

    def __init__(self, clock: ScriptedClock, waits: int) -> None:
        self.clock = clock
        self.waits = waits
        self.delays: list[float] = []
        self._set = False

    def wait(self, timeout: float) -> bool:
        if self._set or len(self.delays) == self.waits:
            return True
        self.delays.append(timeout)
        self.clock.now += timeout
        return False

    def set(self) -> None:
        self._set = True


def scripted_monitor(monkeypatch, interval_ms: float, waits: int):
    clock = ScriptedClock()
    monkeypatch.setattr(monitor, "time", clock)
    mon = GpuMonitor(interval_ms=interval_ms)
    event = ScriptedStopEvent(clock, waits)
    mon._stop_event = event
    return mon, clock, event


def finished(mon: GpuMonitor) -> GpuMonitor:
    """Wait for a scripted monitor's thread to end by itself, then stop it."""
    mon._thread.join()
    mon.stop()
    return mon


# ---- cudalab._nvml ---------------------------------------------------------------

def test_sample_reads_every_field(fake_nvml):
    assert _nvml.sample(0) == expected(0)
    assert _nvml.sample(1) == expected(1)
    assert list(_nvml.sample(0)) == list(FIELDS)
    assert fake_nvml.refcount == 0  # each sample shut NVML down again


def test_session_nests_and_keeps_nvml_initialized(fake_nvml):
    with _nvml.session() as nvml:
        assert nvml is fake_nvml
        for k in range(3):
            assert _nvml.sample(0) == expected(k)
            assert fake_nvml.refcount == 1  # still held by the outer session
    assert fake_nvml.refcount == 0
    assert fake_nvml.init_calls == 4


def test_unsupported_queries_give_none(fake_nvml):
    fake_nvml.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
                             "nvmlDeviceGetUtilizationRates"}
    got = _nvml.sample(0)
    assert got == {**expected(0), "power_w": None, "power_limit_w": None,
                   "gpu_utilization_pct": None, "memory_utilization_pct": None}


def test_other_query_errors_raise(fake_nvml):
    fake_nvml.failures["nvmlDeviceGetClockInfo"] = (range(1), FakeNvml.NVMLError_GpuIsLost())
    with pytest.raises(NvmlError, match="^nvmlDeviceGetClockInfo failed: GPU is lost$") as info:
        _nvml.sample(0)
    assert not isinstance(info.value, NvmlUnavailableError)
    assert info.value.function == "nvmlDeviceGetClockInfo"
    assert info.value.nvml_message == "GPU is lost"
    assert fake_nvml.refcount == 0


def test_exception_hierarchy():
    assert issubclass(NvmlUnavailableError, NvmlError)
    assert issubclass(NvmlError, cudalab.CudalabError)
    assert issubclass(NvmlError, RuntimeError)


def test_missing_package(no_pynvml):
    assert _nvml.sample(0) is None
    with pytest.raises(NvmlUnavailableError) as info:
        _nvml.query(0)
    message = str(info.value)
    assert "nvidia-ml-py" in message
    assert "pip install nvidia-ml-py" in message
    assert "pip install 'cudalab[nvml]'" in message
    assert info.value.function is None and info.value.nvml_message is None


def test_library_not_found(fake_nvml):
    fake_nvml.init_error = FakeNvml.NVMLError_LibraryNotFound()
    assert _nvml.sample(0) is None
    with pytest.raises(NvmlUnavailableError, match="libnvidia-ml.so.1") as info:
        _nvml.query(0)
    assert "NVIDIA driver" in str(info.value)
    assert info.value.nvml_message == "NVML Shared Library Not Found"
    assert fake_nvml.refcount == 0


def test_driver_not_loaded(fake_nvml):
    fake_nvml.init_error = FakeNvml.NVMLError_DriverNotLoaded()
    with pytest.raises(NvmlUnavailableError, match="kernel driver is not loaded"):
        _nvml.query(0)


def test_device_unknown_to_nvml(fake_nvml):
    fake_nvml.bus_ids = {"00000000:02:00.0"}
    assert _nvml.sample(0) is None
    with pytest.raises(NvmlUnavailableError, match="no device with PCI bus id 00000000:01:00.0"):
        _nvml.query(0)
    assert _nvml.sample(1) == expected(0)
    assert fake_nvml.refcount == 0


# ---- cudalab check's live line goes through _nvml -------------------------------

def test_cli_live_state(fake_nvml):
    live = cli._nvml_sample(0)
    assert live == expected(0)
    assert cli._live_line(live) == "10% busy, SM 1500 MHz, memory 2600 MHz, 40 C, 100 / 700 W, " \
                                   "1.00 GiB used"


def test_cli_live_state_unsupported_fields_read_na(fake_nvml):
    fake_nvml.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"}
    line = cli._live_line(cli._nvml_sample(0))
    assert line == "10% busy, SM 1500 MHz, memory 2600 MHz, 40 C, n/a / n/a W, 1.00 GiB used"


def test_cli_live_state_without_nvml(no_pynvml):
    assert cli._nvml_sample(0) is None


def test_cli_live_state_nvml_error(fake_nvml):
    fake_nvml.init_error = FakeNvml.NVMLError_LibraryNotFound()
    assert cli._nvml_sample(0) == {"error": "NVML Shared Library Not Found"}


# ---- GpuMonitor: arguments ---------------------------------------------------------

def test_public_names():
    assert "monitor" in cudalab.__all__
    assert cudalab.monitor.GpuMonitor is GpuMonitor


def test_sample_fields():
    assert [f.name for f in fields(GpuSample)] == ["t_s", *FIELDS]
    s = GpuSample(0.0, *range(len(FIELDS)))
    with pytest.raises(FrozenInstanceError):
        s.t_s = 1.0


@pytest.mark.parametrize("bad", ["100", None, True, [100], 1j])
def test_interval_type(no_pynvml, bad):
    with assert_arg_error(TypeError, "GpuMonitor", "interval_ms", match="^must be a number"):
        GpuMonitor(interval_ms=bad)


@pytest.mark.parametrize("bad", [0, -5, 0.5, math.nan, math.inf, 3_600_001])
def test_interval_value(no_pynvml, bad):
    # Checked before NVML: the missing package does not hide the bad argument.
    with assert_arg_error(ValueError, "GpuMonitor", "interval_ms",
                          match="^must be between 1 and 3600000 ms"):
        GpuMonitor(interval_ms=bad)


def test_interval_accepts_numpy_numbers(fake_nvml):
    np = pytest.importorskip("numpy")
    assert GpuMonitor(interval_ms=np.int64(50)).interval_ms == 50.0
    assert GpuMonitor(interval_ms=np.float32(2.5)).interval_ms == 2.5


@pytest.mark.parametrize("bad", ["0", 1.0, True])
def test_device_type(no_pynvml, bad):
    with assert_arg_error(TypeError, "GpuMonitor", "device", match="^must be an int"):
        GpuMonitor(device=bad)


def test_device_negative(no_pynvml):
    with assert_arg_error(ValueError, "GpuMonitor", "device",
                          match="^must be a non-negative device index, got -1"):
        GpuMonitor(device=-1)


def test_device_out_of_range(fake_nvml):
    with assert_arg_error(ValueError, "GpuMonitor", "device",
                          match=r"^device 2 does not exist \(2 devices visible\)"):
        GpuMonitor(device=2)


def test_device_default_is_current(fake_nvml):
    assert GpuMonitor().device == 0
    assert GpuMonitor(device=1).device == 1


def test_missing_package_at_construction(no_pynvml):
    with pytest.raises(NvmlUnavailableError, match=r"pip install nvidia-ml-py"):
        GpuMonitor()


@no_gpu_only
def test_no_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    with pytest.raises(cudalab.NoDeviceError, match=r"^GpuMonitor\(\): no CUDA device"):
        GpuMonitor()


def test_library_not_found_at_start(fake_nvml):
    fake_nvml.init_error = FakeNvml.NVMLError_LibraryNotFound()
    mon = GpuMonitor()
    with pytest.raises(NvmlUnavailableError, match="libnvidia-ml.so.1"):
        mon.start()
    assert not mon.running
    with pytest.raises(NvmlUnavailableError):
        with GpuMonitor():
            pass


def test_device_unknown_to_nvml_at_start(fake_nvml):
    fake_nvml.bus_ids = set()
    mon = GpuMonitor()
    with pytest.raises(NvmlUnavailableError, match="PCI bus id"):
        mon.start()
    assert not mon.running
    assert fake_nvml.refcount == 0  # the failed start released NVML


# ---- GpuMonitor: running --------------------------------------------------------------

def test_context_manager_samples_at_start_and_stop(fake_nvml):
    # An hour between samples: the thread's only sample would come after stop(),
    # so exactly the start and stop samples exist, and stop() must not wait an hour.
    with GpuMonitor(interval_ms=3_600_000) as mon:
        assert mon.running
        assert fake_nvml.refcount == 1  # NVML held for the whole run
    assert not mon.running
    assert fake_nvml.refcount == 0
    samples = mon.samples
    assert len(samples) == 2
    for k, s in enumerate(samples):
        assert {f: getattr(s, f) for f in FIELDS} == expected(k)
    assert 0.0 <= samples[0].t_s <= samples[1].t_s


def test_start_stop_and_idempotent_stop(fake_nvml):
    mon = GpuMonitor(interval_ms=3_600_000, device=1)
    mon.stop()  # never started: nothing to do
    assert mon.start() is mon
    with pytest.raises(RuntimeError, match="GpuMonitor.start\\(\\): the monitor is running"):
        mon.start()
    mon.stop()
    mon.stop()
    assert len(mon.samples) == 2
    assert repr(mon) == "GpuMonitor(interval_ms=3600000, device=1): stopped, 2 samples"
    with pytest.raises(RuntimeError, match="records once"):
        mon.start()


def test_samples_follow_the_interval(fake_nvml, monkeypatch):
    mon, clock, event = scripted_monitor(monkeypatch, interval_ms=100, waits=4)
    finished(mon.start())
    # start, four samples 100 ms apart from the thread, then stop (no time passed).
    assert [s.t_s for s in mon.samples] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.4])
    assert event.delays == pytest.approx([0.1] * 4)
    for k, s in enumerate(mon.samples):
        assert s.sm_clock_mhz == expected(k)["sm_clock_mhz"]


def test_samples_keep_a_fixed_schedule(fake_nvml, monkeypatch):
    # Each read takes 30 ms: the waits shrink so that samples stay 100 ms apart.
    mon, clock, event = scripted_monitor(monkeypatch, interval_ms=100, waits=3)
    fake_nvml.on_read = lambda: setattr(clock, "now", clock.now + 0.03)
    finished(mon.start())
    assert event.delays == pytest.approx([0.07] * 3)
    assert [s.t_s for s in mon.samples][:4] == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_slow_reads_do_not_cause_a_burst(fake_nvml, monkeypatch):
    # Each read takes 250 ms, longer than the 100 ms interval: the monitor samples
    # back to back (waits of 0) instead of catching up with a burst.
    mon, clock, event = scripted_monitor(monkeypatch, interval_ms=100, waits=3)
    fake_nvml.on_read = lambda: setattr(clock, "now", clock.now + 0.25)
    finished(mon.start())
    assert event.delays == [0.0, 0.0, 0.0]
    assert [s.t_s for s in mon.samples] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_thread_exception_surfaces_on_stop(fake_nvml, monkeypatch):
    mon, clock, event = scripted_monitor(monkeypatch, interval_ms=100, waits=10)
    # The start sample (reading 0) and the thread's first (reading 1) work, reading 2
    # fails; reading 3 (stop's) would work again, so only the thread's error can fail stop().
    fake_nvml.failures["nvmlDeviceGetPowerUsage"] = (range(2, 3), FakeNvml.NVMLError_GpuIsLost())
    mon.start()
    mon._thread.join()  # the thread died on reading 2
    assert len(event.delays) == 2
    with pytest.raises(NvmlError, match="nvmlDeviceGetPowerUsage failed: GPU is lost"):
        mon.stop()
    assert fake_nvml.refcount == 0
    assert [s.power_w for s in mon.samples] == [100.0, 101.0]  # the samples before it are kept
    mon.stop()  # raised once; now a no-op


def test_stop_is_prompt_and_thread_safe(fake_nvml):
    # A real thread at the smallest interval, read while it runs.
    mon = GpuMonitor(interval_ms=1).start()
    seen = [len(mon.samples) for _ in range(50)]
    mon.stop()
    assert seen == sorted(seen)
    assert len(mon.samples) >= 2
    assert not any(t.name.startswith("cudalab-GpuMonitor") for t in threading.enumerate())


# ---- GpuMonitor: results ---------------------------------------------------------------

def test_to_csv(fake_nvml, monkeypatch, tmp_path):
    fake_nvml.unsupported = {"nvmlDeviceGetPowerUsage"}
    mon, clock, event = scripted_monitor(monkeypatch, interval_ms=500, waits=1)
    finished(mon.start())
    header = ("t_s,gpu_utilization_pct,memory_utilization_pct,memory_used_bytes,temperature_c,"
              "power_w,power_limit_w,sm_clock_mhz,memory_clock_mhz\n")
    text = mon.to_csv()
    assert text == (header
                    + "0.0,10,20,1073741824,40,,700.0,1500,2600\n"
                    + "0.5,11,21,2147483648,41,,700.0,1510,2601\n"
                    + "0.5,12,22,3221225472,42,,700.0,1520,2602\n")
    path = tmp_path / "gpu.csv"
    assert mon.to_csv(path) == text
    assert path.read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [float(r["t_s"]) for r in rows] == [0.0, 0.5, 0.5]


def test_to_csv_without_samples(fake_nvml):
    assert GpuMonitor().to_csv() == "t_s," + ",".join(FIELDS) + "\n"


def test_summary(fake_nvml, monkeypatch):
    fake_nvml.unsupported = {"nvmlDeviceGetPowerUsage"}
    mon, clock, event = scripted_monitor(monkeypatch, interval_ms=200, waits=3)
    finished(mon.start())
    summary = mon.summary()
    assert summary.samples == 5  # start, 3 from the thread, stop
    assert summary.duration_s == pytest.approx(0.6)
    for field in FIELDS:
        values = [expected(k)[field] for k in range(5)]
        if field == "power_w":
            assert summary.mean[field] is None and summary.max[field] is None
        else:
            assert summary.mean[field] == pytest.approx(sum(values) / 5)
            assert summary.max[field] == max(values)
    assert summary.mean["sm_clock_mhz"] == pytest.approx(1520.0)
    text = str(summary)
    assert text.startswith("5 samples over 0.600 s")
    assert "n/a" in text and "sm_clock_mhz" in text


def test_summary_without_samples(fake_nvml):
    summary = GpuMonitor().summary()
    assert summary.samples == 0 and summary.duration_s == 0.0
    assert all(v is None for v in summary.mean.values())
    assert set(summary.max) == set(FIELDS)


def test_plot_without_matplotlib(fake_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    mon = GpuMonitor(interval_ms=3_600_000)
    with mon:
        pass
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        mon.plot()


def test_plot_fields_are_checked(fake_nvml):
    mon = GpuMonitor()
    with assert_arg_error(ValueError, "GpuMonitor.plot", "fields", match="^unknown field 'watts'"):
        mon.plot(fields=["power_w", "watts"])
    with assert_arg_error(ValueError, "GpuMonitor.plot", "fields", match="at least one field"):
        mon.plot(fields=[])


def test_plot(fake_nvml):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with GpuMonitor(interval_ms=3_600_000) as mon:
        pass
    figure = mon.plot()
    try:
        assert len(figure.axes) == 4
        assert [ax.get_ylabel() for ax in figure.axes] == list(monitor.DEFAULT_PLOT_FIELDS)
        line = figure.axes[1].get_lines()[0]
        assert list(line.get_ydata()) == [s.sm_clock_mhz for s in mon.samples]
    finally:
        plt.close(figure)

    figure, ax = plt.subplots()
    try:
        assert mon.plot(ax=ax, fields=("power_w", "power_limit_w")) is figure
        assert [line.get_label() for line in ax.get_lines()] == ["power_w", "power_limit_w"]
        assert ax.get_legend() is not None
    finally:
        plt.close(figure)

    figure, axes = plt.subplots(2)  # a NumPy array of Axes: one per field
    try:
        assert mon.plot(ax=axes, fields=("temperature_c", "memory_used_bytes")) is figure
        assert [ax.get_ylabel() for ax in axes] == ["temperature_c", "memory_used_bytes"]
        with assert_arg_error(ValueError, "GpuMonitor.plot", "ax",
                              match="^got 2 Axes for 1 fields"):
            mon.plot(ax=axes, fields="temperature_c")
    finally:
        plt.close(figure)
