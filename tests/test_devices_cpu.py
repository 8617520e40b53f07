"""CPU tier: DeviceProperties derivations and device() logic, with fake raw dicts (no GPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _support import assert_arg_error

from cudalab import devices
from cudalab.devices import FLOPS_PER_CLOCK_PER_SM, PEAK_FLOPS_DTYPES, DeviceProperties


def raw_props(**overrides):
    """An H100 SXM-like raw dict, as _core._device_properties would return it."""
    raw = {
        "name": "NVIDIA H100 80GB HBM3",
        "major": 9,
        "minor": 0,
        "total_memory": 85_045_379_072,
        "multi_processor_count": 132,
        "l2_cache_size": 52_428_800,
        "clock_rate_khz": 1_980_000,
        "memory_clock_rate_khz": 2_619_000,
        "memory_bus_width": 5120,
        "max_threads_per_block": 1024,
        "max_threads_per_multi_processor": 2048,
        "shared_memory_per_block": 49_152,
        "shared_memory_per_block_optin": 232_448,
        "shared_memory_per_multiprocessor": 233_472,
        "regs_per_multiprocessor": 65_536,
        "warp_size": 32,
        "pci_bus_id": "0000:1b:00.0",
        "uuid": "GPU-12345678-1234-1234-1234-123456789abc",
        "ecc_enabled": True,
        "integrated": False,
        "async_engine_count": 3,
        "concurrent_kernels": True,
    }
    raw.update(overrides)
    return raw


# ---- derived fields --------------------------------------------------------


def test_h100_peaks_follow_the_formulas():
    p = DeviceProperties.from_raw(0, raw_props())
    clock_hz = 1_980_000 * 1e3
    assert p.compute_capability == (9, 0)
    assert p.peak_flops["bfloat16"] == pytest.approx(132 * clock_hz * 4096)
    assert p.peak_flops["float16"] == pytest.approx(132 * clock_hz * 4096)
    assert p.peak_flops["tfloat32"] == pytest.approx(132 * clock_hz * 2048)
    assert p.peak_flops["float32"] == pytest.approx(132 * clock_hz * 256)
    assert p.peak_flops["float64"] == pytest.approx(132 * clock_hz * 256)
    assert p.peak_memory_bandwidth == pytest.approx(2 * 2_619_000e3 * 5120 / 8)
    # 3.35 TB/s is the H100 SXM datasheet figure.
    assert p.peak_memory_bandwidth == pytest.approx(3.35e12, rel=0.01)


def test_peak_flops_keys_and_types():
    p = DeviceProperties.from_raw(0, raw_props())
    assert tuple(p.peak_flops) == PEAK_FLOPS_DTYPES
    assert all(isinstance(v, float) for v in p.peak_flops.values())


@pytest.mark.parametrize(
    "major, minor, sms, clock_mhz, dtype, datasheet_tflops",
    [
        # Dense datasheet figures at the clock the datasheet uses.
        (9, 0, 132, 1830, "bfloat16", 989.4),  # H100 SXM
        (8, 0, 108, 1410, "bfloat16", 312.0),  # A100
        (8, 0, 108, 1410, "tfloat32", 156.0),
        (8, 0, 108, 1410, "float64", 19.5),
        (8, 6, 84, 1740, "float16", 149.7),  # A40
        (8, 9, 58, 2040, "float16", 121.0),  # L4: 242 "with sparsity" / 2
        (8, 9, 58, 2040, "tfloat32", 60.0),  # L4: 120 "with sparsity" / 2
        (7, 5, 40, 1590, "float16", 65.0),  # T4
        (7, 0, 80, 1530, "float16", 125.0),  # V100 SXM2
        (7, 0, 80, 1530, "float64", 7.8),
    ],
)
def test_table_reproduces_datasheets(major, minor, sms, clock_mhz, dtype, datasheet_tflops):
    raw = raw_props(major=major, minor=minor, multi_processor_count=sms, clock_rate_khz=clock_mhz * 1000)
    p = DeviceProperties.from_raw(0, raw)
    assert p.peak_flops[dtype] / 1e12 == pytest.approx(datasheet_tflops, rel=0.01)


@pytest.mark.parametrize("dtype", ["tfloat32", "bfloat16"])
@pytest.mark.parametrize("cc", [(7, 0), (7, 5)])
def test_units_missing_before_ampere_are_none(cc, dtype):
    p = DeviceProperties.from_raw(0, raw_props(major=cc[0], minor=cc[1]))
    assert p.peak_flops[dtype] is None
    assert p.peak_flops["float16"] is not None


@pytest.mark.parametrize("cc", [(6, 1), (10, 0), (12, 0), (9, 1)])
def test_unknown_architecture_gives_none_everywhere(cc):
    p = DeviceProperties.from_raw(0, raw_props(major=cc[0], minor=cc[1]))
    assert cc not in FLOPS_PER_CLOCK_PER_SM
    assert set(p.peak_flops) == set(PEAK_FLOPS_DTYPES)
    assert all(v is None for v in p.peak_flops.values())
    # Bandwidth does not depend on the table.
    assert p.peak_memory_bandwidth == pytest.approx(2 * 2_619_000e3 * 5120 / 8)


def test_zero_clocks_give_none_not_zero():
    p = DeviceProperties.from_raw(0, raw_props(memory_clock_rate_khz=0, clock_rate_khz=0))
    assert p.peak_memory_bandwidth is None
    assert all(v is None for v in p.peak_flops.values())


def test_table_rows_are_complete():
    for cc, rates in FLOPS_PER_CLOCK_PER_SM.items():
        assert set(rates) == set(PEAK_FLOPS_DTYPES), cc
        assert rates["float32"] is not None and rates["float64"] is not None, cc


# ---- construction, immutability, text --------------------------------------


def test_from_raw_keeps_raw_fields_and_device_index():
    raw = raw_props()
    p = DeviceProperties.from_raw(3, raw)
    assert p.device == 3
    for key, value in raw.items():
        assert getattr(p, key) == value


def test_from_raw_ignores_extra_keys():
    p = DeviceProperties.from_raw(0, raw_props(some_future_key=1))
    assert not hasattr(p, "some_future_key")


def test_from_raw_names_missing_keys():
    raw = raw_props()
    del raw["memory_bus_width"]
    del raw["uuid"]
    with pytest.raises(KeyError, match="memory_bus_width.*uuid"):
        DeviceProperties.from_raw(0, raw)


def test_frozen():
    p = DeviceProperties.from_raw(0, raw_props())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.peak_memory_bandwidth = 1.0


def test_hashable_equal_and_asdict():
    a = DeviceProperties.from_raw(0, raw_props())
    b = DeviceProperties.from_raw(0, raw_props())
    assert a == b and hash(a) == hash(b)
    assert a != DeviceProperties.from_raw(1, raw_props())
    d = dataclasses.asdict(a)
    assert d["peak_flops"]["bfloat16"] == a.peak_flops["bfloat16"]
    assert d["compute_capability"] == (9, 0)


def test_str_reports_name_capability_and_units():
    text = str(DeviceProperties.from_raw(2, raw_props()))
    lines = text.splitlines()
    assert lines[0] == "Device 2: NVIDIA H100 80GB HBM3"
    assert len(lines) > 20
    assert "9.0" in text
    assert "79.20 GiB" in text  # total_memory
    assert "50.00 MiB" in text  # L2
    assert "3352.3 GB/s" in text  # 2 * 2619 MHz * 640 B
    assert f"{132 * 1.98e9 * 4096 / 1e12:.2f} TFLOP/s" in text
    assert "1980 MHz" in text
    assert "0000:1b:00.0" in text


def test_str_shows_na_for_unknown_peaks():
    text = str(DeviceProperties.from_raw(0, raw_props(major=12, minor=0)))
    assert "TFLOP/s" not in text
    assert "n/a" in text


# ---- device() context manager ----------------------------------------------

REAL_CORE = devices._core


class FakeCore:
    """The device functions of _core on a pretend machine: tracks a current device.

    Argument checks that need no GPU (check_only) go to the real extension,
    so the messages tested are the real ones.
    """

    def __init__(self, current=0):
        self.current = current
        self.calls = []

    def _parse_device(self, device, caller, check_only=False):
        self.calls.append(("_parse_device", device, caller))
        if check_only:
            return REAL_CORE._parse_device(device, caller, check_only=True)
        return self.current if device is None else device

    def _exchange_device(self, device, caller):
        self.calls.append(("_exchange_device", device, caller))
        previous, self.current = self.current, device
        return previous

    def _device_properties(self, index):
        self.calls.append(("_device_properties", index))
        return raw_props(name=f"fake {index}")


class CheckOnlyCore:
    """Fails the test if anything but a GPU-free argument check touches _core."""

    def _parse_device(self, device, caller, check_only=False):
        assert check_only, "_core._parse_device touched the GPU before the argument was checked"
        return REAL_CORE._parse_device(device, caller, check_only=True)

    def __getattr__(self, name):
        raise AssertionError(f"_core.{name} used before the argument was validated")


@pytest.mark.parametrize("bad", ["a", True, False, 1.0, [0]])
def test_device_rejects_non_int(monkeypatch, bad):
    monkeypatch.setattr(devices, "_core", CheckOnlyCore())
    with assert_arg_error(TypeError, "device", "device", match="^expected an int"):
        devices.device(bad)


def test_device_rejects_negative(monkeypatch):
    monkeypatch.setattr(devices, "_core", CheckOnlyCore())
    with assert_arg_error(ValueError, "device", "device", match="-1"):
        devices.device(-1)


def test_device_sets_and_restores(monkeypatch):
    core = FakeCore(current=0)
    monkeypatch.setattr(devices, "_core", core)
    with devices.device(1) as ctx:
        assert core.current == 1
        assert ctx.idx == 1
    assert core.current == 0
    exchanges = [c for c in core.calls if c[0] == "_exchange_device"]
    assert exchanges == [("_exchange_device", 1, "device"), ("_exchange_device", 0, "device")]


def test_device_restores_on_exception(monkeypatch):
    core = FakeCore(current=2)
    monkeypatch.setattr(devices, "_core", core)
    with pytest.raises(RuntimeError), devices.device(0):
        assert core.current == 0
        raise RuntimeError("boom")
    assert core.current == 2


def test_device_nested_and_reentered(monkeypatch):
    core = FakeCore(current=0)
    monkeypatch.setattr(devices, "_core", core)
    ctx = devices.device(1)
    with ctx:
        with devices.device(2):
            assert core.current == 2
            with ctx:
                assert core.current == 1
            assert core.current == 2
        assert core.current == 1
    assert core.current == 0


def test_device_same_as_current_keeps_it(monkeypatch):
    core = FakeCore(current=1)
    monkeypatch.setattr(devices, "_core", core)
    with devices.device(1):
        assert core.current == 1
    assert core.current == 1


def test_device_none_is_noop(monkeypatch):
    monkeypatch.setattr(devices, "_core", CheckOnlyCore())
    with devices.device(None) as ctx:
        assert ctx.idx is None


def test_device_accepts_index_like_ints(monkeypatch):
    core = FakeCore(current=0)
    monkeypatch.setattr(devices, "_core", core)
    with devices.device(np.int64(3)) as ctx:
        assert ctx.idx == 3 and type(ctx.idx) is int
        assert core.current == 3


# ---- query wrappers ---------------------------------------------------------


def test_get_device_properties_uses_current_device(monkeypatch):
    core = FakeCore(current=5)
    monkeypatch.setattr(devices, "_core", core)
    p = devices.get_device_properties()
    assert p.device == 5
    assert p.name == "fake 5"
    assert ("_parse_device", None, "get_device_properties") in core.calls
    assert ("_device_properties", 5) in core.calls


def test_get_device_name_and_capability(monkeypatch):
    core = FakeCore(current=0)
    monkeypatch.setattr(devices, "_core", core)
    assert devices.get_device_name(1) == "fake 1"
    assert devices.get_device_capability(1) == (9, 0)
    assert ("_parse_device", 1, "get_device_name") in core.calls
    assert ("_parse_device", 1, "get_device_capability") in core.calls


@pytest.mark.parametrize(
    "func", ["get_device_properties", "get_device_name", "get_device_capability"]
)
def test_device_queries_check_their_argument(func):
    """The real extension checks `device` before any GPU access, naming the caller."""
    with assert_arg_error(TypeError, func, "device", match="^expected an int"):
        getattr(devices, func)("0")
    with assert_arg_error(ValueError, func, "device", match="-2"):
        getattr(devices, func)(-2)
