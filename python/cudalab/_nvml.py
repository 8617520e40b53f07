"""The one place cudalab talks to NVML (the driver's management library).

NVML reports what the CUDA runtime cannot: live utilization, clocks,
temperature and power. cudalab reaches it through ``nvidia-ml-py`` (``import
pynvml``), an optional dependency (``pip install nvidia-ml-py`` or
``pip install 'cudalab[nvml]'``), which in turn loads the driver's
``libnvidia-ml.so.1``. Everything else in cudalab (``cudalab check``,
:class:`cudalab.monitor.GpuMonitor`, the benchmark harness) goes through this
module.

* :func:`sample` returns one device's live state as a dict, or None when NVML
  is unavailable; it never raises for a missing NVML.
* :func:`query` is the same but raises :class:`NvmlUnavailableError` saying
  what is missing and how to fix it.
* :func:`session` keeps NVML initialized across many reads (``nvmlInit`` is
  reference counted, so sessions nest and each :func:`sample` inside one is
  cheap); :func:`device_handle` and :func:`read` are the pieces a long-lived
  reader such as the monitor uses inside a session.

CUDA and NVML number devices differently (``CUDA_VISIBLE_DEVICES`` and the
CUDA device order only affect CUDA), so a cudalab device index is matched to
its NVML handle by PCI bus id.
"""

from __future__ import annotations

import contextlib
import functools
from types import ModuleType
from typing import Any, Callable, Iterator

from ._core import CudalabError

__all__ = [
    "FIELDS",
    "INSTALL_HINT",
    "NvmlError",
    "NvmlUnavailableError",
    "device_handle",
    "driver_release",
    "query",
    "read",
    "sample",
    "session",
]

# The keys of a sample, in the order cudalab reports them. A field is None
# where the device does not support that query (e.g. power on some boards).
FIELDS: tuple[str, ...] = (
    "gpu_utilization_pct",     # % of the last sample period with a kernel running
    "memory_utilization_pct",  # % of that period the memory was read or written
    "memory_used_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",           # the enforced limit
    "sm_clock_mhz",
    "memory_clock_mhz",
)

INSTALL_HINT = "pip install nvidia-ml-py (or pip install 'cudalab[nvml]')"


class NvmlError(CudalabError):
    """An NVML call failed.

    A :class:`cudalab.CudalabError` (so a ``RuntimeError``), like the other
    failures of the GPU stack below cudalab.

    Attributes
    ----------
    function : str or None
        The NVML function that failed, e.g. ``"nvmlDeviceGetPowerUsage"``;
        None when no NVML call was made (``nvidia-ml-py`` is not installed).
    nvml_message : str or None
        NVML's own description of the error, e.g. ``"GPU is lost"``; None when
        no NVML call was made.
    """

    def __init__(self, message: str, function: str | None = None,
                 nvml_message: str | None = None) -> None:
        super().__init__(message)
        self.function = function
        self.nvml_message = nvml_message


class NvmlUnavailableError(NvmlError):
    """NVML cannot be used: ``nvidia-ml-py`` is not installed, the driver's
    ``libnvidia-ml.so.1`` cannot be loaded or initialized, or NVML does not see
    the device. The message says which, and how to fix it."""


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError(
            "NVML is unavailable: the Python package nvidia-ml-py (module 'pynvml') is "
            f"not installed; install it with: {INSTALL_HINT}") from exc
    return pynvml


def require_package() -> None:
    """Raise :class:`NvmlUnavailableError` unless ``nvidia-ml-py`` is importable.

    A cheap early check: it does not load the driver's library.
    """
    _import_pynvml()


def _init_failure(nvml: ModuleType, exc: Exception) -> NvmlUnavailableError:
    if isinstance(exc, nvml.NVMLError_LibraryNotFound):
        message = (
            "NVML is unavailable: nvidia-ml-py is installed but the NVIDIA driver's NVML "
            "library libnvidia-ml.so.1 could not be loaded; install the NVIDIA driver "
            "(NVML ships with it), or make libnvidia-ml.so.1 findable (in a container, "
            "start it with the NVIDIA container toolkit so the driver's libraries are "
            "mounted)")
    elif isinstance(exc, nvml.NVMLError_DriverNotLoaded):
        message = ("NVML is unavailable: libnvidia-ml.so.1 was found but the NVIDIA kernel "
                   "driver is not loaded (nvmlInit: Driver Not Loaded)")
    else:
        message = f"NVML is unavailable: nvmlInit failed: {exc}"
    return NvmlUnavailableError(message, "nvmlInit", str(exc))


@contextlib.contextmanager
def session() -> Iterator[ModuleType]:
    """Keep NVML initialized inside a ``with`` block; yields the ``pynvml`` module.

    ``nvmlInit`` is reference counted, so sessions nest: while one is open,
    every :func:`sample` or :func:`query` (which open their own) costs no
    initialization. Wrap a loop of many samples in one session.

    Raises
    ------
    NvmlUnavailableError
        If ``nvidia-ml-py`` is missing or NVML cannot be initialized.
    """
    nvml = _import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise _init_failure(nvml, exc) from exc
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


@functools.cache
def _pci_bus_id(device: int) -> str:
    """The PCI bus id of cudalab device `device` (fixed for the process, so cached)."""
    from .devices import get_device_properties

    return get_device_properties(device).pci_bus_id


def device_handle(nvml: ModuleType, device: int) -> Any:
    """The NVML handle of cudalab device `device`, matched by PCI bus id.

    Call it inside a :func:`session` (`nvml` is what the session yields); the
    handle is valid while the session is open.

    Raises
    ------
    NvmlUnavailableError
        If NVML has no device with that PCI bus id (e.g. a container or VM where
        NVML sees other devices than CUDA does).
    """
    bus_id = _pci_bus_id(device)
    try:
        return nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
    except nvml.NVMLError as exc:
        raise NvmlUnavailableError(
            f"NVML is unavailable for device {device}: NVML has no device with PCI bus id "
            f"{bus_id} (nvmlDeviceGetHandleByPciBusId: {exc})",
            "nvmlDeviceGetHandleByPciBusId", str(exc)) from exc


def _call(nvml: ModuleType, function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)`, or None when the device does not support the query."""
    try:
        return function(*args)
    except nvml.NVMLError_NotSupported:
        return None
    except nvml.NVMLError as exc:
        raise NvmlError(f"{function.__name__} failed: {exc}", function.__name__,
                        str(exc)) from exc


def _milliwatts_to_watts(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def read(nvml: ModuleType, handle: Any) -> dict[str, Any]:
    """Read the live state of the device behind `handle` (see :data:`FIELDS`).

    Call it inside a :func:`session`. A query the device does not support gives
    None for its field(s).

    Raises
    ------
    NvmlError
        If an NVML query fails for another reason than being unsupported.
    """
    util = _call(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    memory = _call(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    return {
        "gpu_utilization_pct": None if util is None else util.gpu,
        "memory_utilization_pct": None if util is None else util.memory,
        "memory_used_bytes": None if memory is None else memory.used,
        "temperature_c": _call(nvml, nvml.nvmlDeviceGetTemperature, handle,
                               nvml.NVML_TEMPERATURE_GPU),
        "power_w": _milliwatts_to_watts(_call(nvml, nvml.nvmlDeviceGetPowerUsage, handle)),
        "power_limit_w": _milliwatts_to_watts(
            _call(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        "sm_clock_mhz": _call(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "memory_clock_mhz": _call(nvml, nvml.nvmlDeviceGetClockInfo, handle,
                                  nvml.NVML_CLOCK_MEM),
    }


def query(device: int) -> dict[str, Any]:
    """The live state of cudalab device `device`, as :func:`sample`, but raising.

    Raises
    ------
    NvmlUnavailableError
        If NVML is missing or cannot be used for this device (the message says
        how to fix it).
    NvmlError
        If an NVML query fails for another reason than being unsupported.
    """
    with session() as nvml:
        return read(nvml, device_handle(nvml, device))


def sample(device: int) -> dict[str, Any] | None:
    """The live state of cudalab device `device`, or None when NVML is unavailable.

    Parameters
    ----------
    device : int
        cudalab (CUDA) device index.

    Returns
    -------
    dict or None
        ``gpu_utilization_pct``, ``memory_utilization_pct`` (int, %),
        ``memory_used_bytes`` (int), ``temperature_c`` (int), ``power_w``,
        ``power_limit_w`` (float, W), ``sm_clock_mhz``, ``memory_clock_mhz``
        (int, MHz); a field is None where the device does not support it. None
        instead of a dict when ``nvidia-ml-py`` or the driver's NVML library is
        missing, or NVML does not see the device: this never raises for a
        missing NVML.

    Raises
    ------
    NvmlError
        If NVML is present but a query fails (e.g. the GPU fell off the bus).

    Notes
    -----
    Each call initializes and shuts down NVML unless a :func:`session` is open;
    open one around a loop of samples.
    """
    try:
        return query(device)
    except NvmlUnavailableError:
        return None


def driver_release() -> str | None:
    """The NVIDIA driver's version string (``"580.159.04"``), or None without NVML.

    Raises
    ------
    NvmlError
        If NVML is present but the query fails.
    """
    try:
        with session() as nvml:
            version = _call(nvml, nvml.nvmlSystemGetDriverVersion)
    except NvmlUnavailableError:
        return None
    return version.decode() if isinstance(version, bytes) else version
