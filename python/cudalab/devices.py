"""Device queries: properties, theoretical peaks, and the ``device`` context.

The C extension reports raw ``cudaDeviceProp``-style values
(``_core._device_properties``); this module turns them into a frozen
:class:`DeviceProperties` with two derived ceilings that the lessons compare
measurements against:

* peak memory bandwidth, ``2 * memory clock (Hz) * bus width (bytes)``
  (GDDR and HBM transfer on both clock edges);
* peak dense FLOP/s per dtype, ``SMs * SM clock (Hz) * FLOPs per clock per SM``.

Source of the FLOPs-per-clock table
-----------------------------------
The per-SM rates in :data:`FLOPS_PER_CLOCK_PER_SM` are derived from NVIDIA's
architecture whitepapers and product datasheets (Tesla V100 / Volta whitepaper,
Turing whitepaper and T4 datasheet, A100 / GA100 whitepaper, GA102 whitepaper
with the A40 and A10 datasheets, Jetson AGX Orin technical brief, Ada
whitepaper with the L4 and L40 datasheets, H100 / Hopper whitepaper and
datasheet): the datasheet's dense (no structured sparsity) TFLOP/s divided by
SM count and the clock the datasheet uses. An FMA counts as 2 FLOPs.
"float16"/"bfloat16"/"tfloat32" are tensor-core rates with FP32 accumulation
(what cuBLAS uses for these GEMMs); "float64" on 8.0 and 9.0 is the DMMA
tensor-core rate, which cuBLAS DGEMM uses; "float32" is the CUDA-core FMA rate.

The table lists data-center parts. GeForce cards of compute capability 7.5,
8.6 and 8.9 run FP32-accumulate tensor math (float16, bfloat16, tfloat32) at
half the listed rate, so their true ceilings are half of what is reported here.

``clock_rate_khz`` is the maximum boost clock (e.g. 1980 MHz on H100 SXM),
while datasheets quote tensor-core peaks at a lower sustained clock (1830 MHz
on H100 SXM), so every FLOP/s figure here is an upper bound. An architecture
missing from the table gets ``None`` for every dtype: we never guess.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _core
from .memory import format_bytes

__all__ = [
    "FLOPS_PER_CLOCK_PER_SM",
    "PEAK_FLOPS_DTYPES",
    "DeviceProperties",
    "device",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
]

# Keys of ``peak_flops``, in the order they are reported.
PEAK_FLOPS_DTYPES: tuple[str, ...] = ("float64", "float32", "tfloat32", "float16", "bfloat16")

# Dense FLOPs per clock per SM (FMA = 2), by compute capability; see the module
# docstring for the sources. None: the architecture has no such unit.
#
# Cross-check (H100 SXM, 9.0): 132 SMs x 1830 MHz x 4096 = 989.4 TFLOP/s bf16
# dense, the datasheet's figure. The device reports its 1980 MHz max boost
# clock, which gives 1070 TFLOP/s: our figure is an upper bound.
FLOPS_PER_CLOCK_PER_SM: dict[tuple[int, int], dict[str, int | None]] = {
    # V100: 80 SMs x 1530 MHz -> 7.8 fp64, 15.7 fp32, 125 fp16 TFLOP/s.
    (7, 0): {"float64": 64, "float32": 128, "tfloat32": None, "float16": 1024, "bfloat16": None},
    # T4: 40 SMs x 1590 MHz -> 8.1 fp32, 65 fp16 TFLOP/s; fp64 is 1/32 of fp32.
    (7, 5): {"float64": 4, "float32": 128, "tfloat32": None, "float16": 1024, "bfloat16": None},
    # A100: 108 SMs x 1410 MHz -> 19.5 fp64 (DMMA), 19.5 fp32, 156 tf32, 312 fp16/bf16.
    (8, 0): {"float64": 128, "float32": 128, "tfloat32": 1024, "float16": 2048, "bfloat16": 2048},
    # A40: 84 SMs x 1740 MHz -> 37.4 fp32, 74.8 tf32, 149.7 fp16/bf16; fp64 is 1/64.
    (8, 6): {"float64": 4, "float32": 256, "tfloat32": 512, "float16": 1024, "bfloat16": 1024},
    # Jetson Orin (GA10B): the GA10x per-SM rates; not cross-checked against a datasheet.
    (8, 7): {"float64": 4, "float32": 256, "tfloat32": 512, "float16": 1024, "bfloat16": 1024},
    # L4: 58 SMs x 2040 MHz -> 30.3 fp32, 60 tf32, 121 fp16/bf16 (datasheet's
    # 120 / 242 "with sparsity" halved). L40 gives the same per-SM rates.
    (8, 9): {"float64": 4, "float32": 256, "tfloat32": 512, "float16": 1024, "bfloat16": 1024},
    # H100 SXM: 132 SMs; fp64 DMMA 256, tf32 2048, fp16/bf16 4096 (see cross-check above).
    (9, 0): {"float64": 256, "float32": 256, "tfloat32": 2048, "float16": 4096, "bfloat16": 4096},
}


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """Properties of one CUDA device, with theoretical peaks derived from them.

    Build it with :meth:`from_raw` (or :func:`get_device_properties`). Every raw
    field keeps the name and unit ``_core._device_properties`` uses.

    Attributes
    ----------
    device : int
        Device index.
    name : str
        Marketing name, e.g. ``"NVIDIA H100 80GB HBM3"``.
    major, minor : int
        Compute capability.
    total_memory : int
        Device memory in bytes.
    multi_processor_count : int
        Number of SMs.
    l2_cache_size : int
        L2 cache in bytes.
    clock_rate_khz : int
        Peak (max boost) SM clock in kHz.
    memory_clock_rate_khz : int
        Peak memory clock in kHz.
    memory_bus_width : int
        Memory bus width in bits.
    max_threads_per_block, max_threads_per_multi_processor : int
        Thread limits.
    shared_memory_per_block, shared_memory_per_block_optin, shared_memory_per_multiprocessor : int
        Shared memory limits in bytes (``optin``: the most a kernel can request
        with ``cudaFuncAttributeMaxDynamicSharedMemorySize``).
    regs_per_multiprocessor, warp_size : int
        32-bit registers per SM; threads per warp.
    pci_bus_id, uuid : str
        PCI address (``"0000:00:00.0"``) and device UUID.
    ecc_enabled, integrated, concurrent_kernels : bool
        ECC on; integrated (shares host memory); can run kernels concurrently.
    async_engine_count : int
        Number of copy engines.
    compute_capability : tuple of int
        ``(major, minor)``. Derived.
    peak_memory_bandwidth : float or None
        Theoretical DRAM bandwidth in bytes/s, ``2 * memory clock (Hz) * bus
        width / 8``; None when the device reports no memory clock or bus width.
        Derived.
    peak_flops : dict of str to float or None
        Theoretical dense FLOP/s for each of "float64", "float32", "tfloat32",
        "float16", "bfloat16" (see the module docstring); None where the
        architecture has no such unit or is not in the table. Derived. The
        dataclass is frozen but this dict is not: treat it as read-only.
    """

    device: int
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    l2_cache_size: int
    clock_rate_khz: int
    memory_clock_rate_khz: int
    memory_bus_width: int
    max_threads_per_block: int
    max_threads_per_multi_processor: int
    shared_memory_per_block: int
    shared_memory_per_block_optin: int
    shared_memory_per_multiprocessor: int
    regs_per_multiprocessor: int
    warp_size: int
    pci_bus_id: str
    uuid: str
    ecc_enabled: bool
    integrated: bool
    async_engine_count: int
    concurrent_kernels: bool
    # Derived in __post_init__ so that they always agree with the raw fields.
    compute_capability: tuple[int, int] = dataclasses.field(init=False)
    peak_memory_bandwidth: float | None = dataclasses.field(init=False)
    # hash=False: a dict is unhashable and would break hash() of the instance.
    peak_flops: dict[str, float | None] = dataclasses.field(init=False, hash=False)

    def __post_init__(self) -> None:
        # object.__setattr__ because the dataclass is frozen.
        object.__setattr__(self, "compute_capability", (self.major, self.minor))
        object.__setattr__(self, "peak_memory_bandwidth", self._bandwidth())
        object.__setattr__(self, "peak_flops", self._flops())

    def _bandwidth(self) -> float | None:
        if self.memory_clock_rate_khz <= 0 or self.memory_bus_width <= 0:
            return None
        return 2.0 * self.memory_clock_rate_khz * 1e3 * self.memory_bus_width / 8

    def _flops(self) -> dict[str, float | None]:
        rates = FLOPS_PER_CLOCK_PER_SM.get(self.compute_capability)
        sm_hz = self.multi_processor_count * self.clock_rate_khz * 1e3
        peaks: dict[str, float | None] = {}
        for dtype in PEAK_FLOPS_DTYPES:
            per_clock = None if rates is None else rates[dtype]
            peaks[dtype] = None if per_clock is None or sm_hz <= 0 else float(per_clock * sm_hz)
        return peaks

    @classmethod
    def from_raw(cls, device: int, raw: dict[str, Any]) -> DeviceProperties:
        """Build from the dict ``_core._device_properties(device)`` returns.

        Parameters
        ----------
        device : int
            The device index the dict describes.
        raw : dict
            Raw properties. Keys not listed as fields are ignored, so a newer
            extension can report more without breaking this class.

        Returns
        -------
        DeviceProperties

        Raises
        ------
        KeyError
            If ``raw`` lacks a property; the message names every missing key.
        """
        names = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "device"]
        missing = [n for n in names if n not in raw]
        if missing:
            raise KeyError(f"DeviceProperties.from_raw(): raw properties lack {', '.join(missing)}")
        return cls(device=device, **{n: raw[n] for n in names})

    def __str__(self) -> str:
        def flops(value: float | None) -> str:
            return "n/a" if value is None else f"{value / 1e12:.2f} TFLOP/s"

        bandwidth = (
            "n/a" if self.peak_memory_bandwidth is None else f"{self.peak_memory_bandwidth / 1e9:.1f} GB/s"
        )
        rows = [
            ("Compute capability", f"{self.major}.{self.minor}"),
            ("Total memory", format_bytes(self.total_memory)),
            ("Multiprocessors (SMs)", str(self.multi_processor_count)),
            ("L2 cache", format_bytes(self.l2_cache_size)),
            ("SM clock (max boost)", f"{self.clock_rate_khz / 1e3:.0f} MHz"),
            ("Memory clock", f"{self.memory_clock_rate_khz / 1e3:.0f} MHz"),
            ("Memory bus width", f"{self.memory_bus_width} bits"),
            ("Peak memory bandwidth", bandwidth),
        ]
        rows += [(f"Peak {dtype} (dense)", flops(self.peak_flops[dtype])) for dtype in PEAK_FLOPS_DTYPES]
        rows += [
            ("Max threads per block", str(self.max_threads_per_block)),
            ("Max threads per SM", str(self.max_threads_per_multi_processor)),
            ("Shared memory per block", format_bytes(self.shared_memory_per_block)),
            ("Shared memory per block (opt-in)", format_bytes(self.shared_memory_per_block_optin)),
            ("Shared memory per SM", format_bytes(self.shared_memory_per_multiprocessor)),
            ("Registers per SM", str(self.regs_per_multiprocessor)),
            ("Warp size", str(self.warp_size)),
            ("Copy engines", str(self.async_engine_count)),
            ("Concurrent kernels", "yes" if self.concurrent_kernels else "no"),
            ("ECC", "enabled" if self.ecc_enabled else "disabled"),
            ("Integrated", "yes" if self.integrated else "no"),
            ("PCI bus id", self.pci_bus_id),
            ("UUID", self.uuid),
        ]
        width = max(len(label) for label, _ in rows) + 1
        lines = [f"Device {self.device}: {self.name}"]
        lines += [f"  {label + ':':<{width}} {value}" for label, value in rows]
        return "\n".join(lines)


# Every function below hands its own name to the C extension, which checks
# the argument and raises from the frame of the function the user called.


def get_device_properties(device: int | None = None) -> DeviceProperties:
    """Return the properties of a device.

    Parameters
    ----------
    device : int, optional
        Device index; None (the default) means the current device.

    Returns
    -------
    DeviceProperties

    Raises
    ------
    TypeError, ValueError
        If ``device`` is not a non-negative int, or names no visible device.
    NoDeviceError
        If no CUDA device (or no driver) is available.
    """
    index = _core._parse_device(device, "get_device_properties")
    return DeviceProperties.from_raw(index, _core._device_properties(index))


def get_device_name(device: int | None = None) -> str:
    """Return the name of a device (None: the current device).

    Raises as :func:`get_device_properties` does.
    """
    index = _core._parse_device(device, "get_device_name")
    return _core._device_properties(index)["name"]


def get_device_capability(device: int | None = None) -> tuple[int, int]:
    """Return the ``(major, minor)`` compute capability of a device (None: the current one).

    Raises as :func:`get_device_properties` does.
    """
    index = _core._parse_device(device, "get_device_capability")
    raw = _core._device_properties(index)
    return (raw["major"], raw["minor"])


class device:
    """Context manager that makes a device current, then restores the previous one.

    Like ``torch.cuda.device``::

        with cudalab.device(1):
            x = cudalab.zeros(10)  # on device 1

    Parameters
    ----------
    device : int or None
        Device index to make current; None makes the context a no-op.

    Raises
    ------
    TypeError
        If ``device`` is not an int (a bool counts as not an int) or None.
    ValueError
        If ``device`` is negative, or (on enter) names no visible device.
    NoDeviceError
        On enter, if no CUDA device (or no driver) is available.

    Notes
    -----
    The argument's type and sign are checked here, before any CUDA call, so
    those errors need no GPU; whether the device exists is checked on enter.
    """

    def __init__(self, device: int | None) -> None:
        self.idx: int | None = _core._parse_device(device, "device", check_only=True)
        # A stack, so that one instance can be entered again while already active.
        self._previous: list[int] = []

    def __enter__(self) -> device:
        if self.idx is not None:
            self._previous.append(_core._exchange_device(self.idx, "device"))
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.idx is not None:
            _core._exchange_device(self._previous.pop(), "device")
