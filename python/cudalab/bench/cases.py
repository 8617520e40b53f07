"""The benchmark cases, defined once: copy, matmul per dtype, transfers, launch.

The measured ceilings (`cudalab.bench.ceilings`), ``cudalab bench`` on the
command line and ``benchmarks/`` all build their cudalab measurements from
these. A case is a small frozen description (sizes, dtype, direction);
``case.prepare()`` allocates on the current device and returns a `Prepared`:
the callable to time, its work per call (bytes moved, FLOPs) and metadata.
``prepared.measure(timer)`` times it; ``prepared.torch_twin(torch)`` is the
same work through PyTorch on the same data, for side-by-side columns.

==============================  =====================================  =====================
case                            what one call does                     work per call
==============================  =====================================  =====================
``CopyCase(nbytes)``            ``src.copy()`` of a float32 buffer     bytes: 2 x nbytes
                                (a new array each call)                (read + written)
``MatmulCase(dtype, n)``        ``matmul(a, b, out=c)``, n x n x n,    flops: 2 n^3
                                random normal operands
``TransferCase(direction,       h2d: ``asarray(host)``; d2h:           bytes: nbytes
memory, nbytes)``               ``dev.get(out=host)``; pinned memory
                                with non_blocking copies, or pageable
``LaunchCase(launches)``        `launches` empty kernels, then a       per launch
                                synchronize (host clock)
==============================  =====================================  =====================
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .. import _core
from .. import _precision
from .measurement import Measurement

__all__ = [
    "MATMUL_DTYPES",
    "Case",
    "CopyCase",
    "LaunchCase",
    "MatmulCase",
    "Prepared",
    "TransferCase",
    "torch_cuda",
]

MIB = 1 << 20
GIB = 1 << 30
# "tf32" is float32 storage with TF32 tensor-core math (cudalab._precision).
MATMUL_DTYPES: tuple[str, ...] = ("float64", "float32", "tf32", "float16", "bfloat16")
TRANSFER_DIRECTIONS = ("h2d", "d2h")
HOST_MEMORIES = ("pinned", "pageable")


def torch_cuda() -> Any:
    """PyTorch when it is installed and sees a CUDA device, else None: the one test
    every PyTorch comparison (cases, CLI, benchmarks, lessons) makes."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _check_size(func: str, name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{func}() argument '{name}': expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{func}() argument '{name}': expected an int >= {minimum}, got {value}")
    return value


def _check_choice(func: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{func}() argument '{name}': expected one of "
                         f"{', '.join(map(repr, choices))}, got {value!r}")
    return value


def _size_label(nbytes: int) -> str:
    return f"{nbytes / GIB:g} GiB" if nbytes >= GIB and nbytes % GIB == 0 else f"{nbytes / MIB:g} MiB"


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A case set up on the device: what to time and how much work one call is.

    Attributes
    ----------
    case : Case
        The case it came from.
    fn : callable
        One call of the work (no arguments); it keeps its operands alive.
    flops, bytes : float or None
        Work per call.
    hold : bool
        Whether `measure()` may hold the calls behind a spin kernel (False for
        calls that synchronize, such as pageable copies).
    metadata : dict
        Sizes, dtype and the like, stored with the Measurement.
    operands : dict
        The arrays the calls use, by name (to check results afterwards).
    """

    case: Case
    fn: Callable[[], Any]
    flops: float | None = None
    bytes: float | None = None
    hold: bool = True
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    operands: dict[str, Any] = dataclasses.field(default_factory=dict)
    _torch: Callable[[Any], Callable[[], Any]] | None = None

    def measure(self, timer: Any, *, label: str | None = None, sub_label: str | None = None,
                description: str | None = "cudalab", ceiling: Any = None,
                metadata: dict[str, Any] | None = None) -> Measurement:
        """Time `fn` with `timer` (a `Timer`); names default to the case's."""
        if not self.hold and timer.hold:
            timer = timer.replace(hold=False)
        return timer.measure(
            self.fn, flops=self.flops, bytes=self.bytes, ceiling=ceiling,
            label=self.case.label if label is None else label,
            sub_label=self.case.sub_label if sub_label is None else sub_label,
            description=description, metadata={**self.metadata, **(metadata or {})})

    def torch_twin(self, torch: Any) -> Prepared:
        """The same work through PyTorch on the same data (same bytes/FLOPs and names).

        Raises
        ------
        ValueError
            The case has no PyTorch counterpart.
        """
        if self._torch is None:
            raise ValueError(f"case {self.case.name!r} has no PyTorch counterpart")
        return dataclasses.replace(self, fn=self._torch(torch), _torch=None)


class Case:
    """What every case has: a name, default names for its Measurement, and a ceiling.

    Attributes
    ----------
    name : str
        ``"copy"``, ``"matmul_float16"``, ``"h2d_pinned"``, ``"launch"``, ...
    label, sub_label : str or None
        The Measurement's names unless the caller gives others.
    ceiling : str or None
        The measured ceiling (`cudalab.bench.CEILING_NAMES`) it compares with.
    """

    name: str
    label: str
    sub_label: str | None
    ceiling: str | None

    def _name(self, name: str, label: str, sub_label: str | None, ceiling: str | None) -> None:
        # Derived from the fields once; set past the frozen dataclass's guard.
        for attr, value in (("name", name), ("label", label), ("sub_label", sub_label),
                            ("ceiling", ceiling)):
            object.__setattr__(self, attr, value)

    def prepare(self) -> Prepared:  # pragma: no cover - every case defines it
        raise NotImplementedError

    def measure(self, timer: Any, **names: Any) -> Measurement:
        """``self.prepare().measure(timer, **names)``."""
        return self.prepare().measure(timer, **names)


@dataclasses.dataclass(frozen=True)
class CopyCase(Case):
    """Device-to-device copy of a contiguous float32 buffer of `nbytes` (default 1 GiB)."""

    nbytes: int = GIB

    def __post_init__(self) -> None:
        _check_size("CopyCase", "nbytes", self.nbytes, 4)
        self._name("copy", "copy", _size_label(self.nbytes), "copy")

    @classmethod
    def sized_for(cls, free_bytes: int, nbytes: int = GIB) -> CopyCase:
        """`nbytes`, or a quarter of `free_bytes` when that is less (64 KiB multiples)."""
        return cls(max(64 << 10, min(nbytes, (free_bytes // 4) & ~0xFFFF)))

    def prepare(self) -> Prepared:
        src = _core.full(self.nbytes // 4, 1.5, dtype="float32")

        def torch_clone(torch: Any) -> Callable[[], Any]:
            return torch.from_dlpack(src).clone

        return Prepared(self, src.copy, bytes=2.0 * self.nbytes, metadata={"nbytes": self.nbytes},
                        operands={"src": src}, _torch=torch_clone)


@dataclasses.dataclass(frozen=True)
class MatmulCase(Case):
    """``matmul(a, b, out=c)`` of n x n operands in `dtype` (one of MATMUL_DTYPES)."""

    dtype: str
    n: int = 8192

    def __post_init__(self) -> None:
        # Any spelling of the table ("fp16", "half") reads as bench's own ("float16").
        object.__setattr__(self, "dtype", _precision.long_name(self.dtype) or self.dtype)
        _check_choice("MatmulCase", "dtype", self.dtype, MATMUL_DTYPES)
        _check_size("MatmulCase", "n", self.n)
        self._name(f"matmul_{self.dtype}", "matmul", self.dtype, f"matmul_{self.dtype}")

    @classmethod
    def sized_for(cls, dtype: str, free_bytes: int) -> MatmulCase:
        """n = 8192, or 4096 when three float64 8192^2 operands would not fit twice."""
        return cls(dtype, 8192 if free_bytes > 3 * 8192 * 8192 * 8 * 2 else 4096)

    @property
    def storage(self) -> str:
        """The array dtype: float32 for tf32."""
        return _precision.storage(self.dtype)

    @property
    def precision(self) -> str | None:
        """matmul()'s precision: "high" (TF32) for tf32, "highest" for float32, else None."""
        return _precision.matmul_precision(self.dtype)

    @property
    def peak_key(self) -> str:
        """The key of this dtype in `DeviceProperties.peak_flops`."""
        return "tfloat32" if self.dtype == "tf32" else self.dtype

    @property
    def flops(self) -> float:
        return 2.0 * self.n ** 3

    def prepare(self) -> Prepared:
        from .. import random

        n, precision = self.n, self.precision
        a = random.normal((n, n), dtype=self.storage, seed=1)  # never zeros: they run faster
        b = random.normal((n, n), dtype=self.storage, seed=2)
        out = _core.empty((n, n), dtype=self.storage)

        def ours() -> Any:
            return _core.matmul(a, b, out=out, precision=precision)

        def torch_mm(torch: Any) -> Callable[[], Any]:
            ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
            tout = torch.empty_like(ta)
            tf32 = _precision.resolve(self.dtype).torch_allow_tf32

            def theirs() -> Any:
                with _precision.TorchTf32(torch, tf32):
                    return torch.mm(ta, tb, out=tout)
            return theirs

        meta = {"m": n, "n": n, "k": n, "dtype": self.dtype, "precision": precision}
        return Prepared(self, ours, flops=self.flops, metadata=meta,
                        operands={"a": a, "b": b, "out": out}, _torch=torch_mm)


@dataclasses.dataclass(frozen=True)
class TransferCase(Case):
    """A host <-> device copy of `nbytes` (default 256 MiB) of float32.

    Pinned host memory (``cudalab.pinned_empty``) is copied with
    ``non_blocking=True``; pageable (NumPy) memory synchronously, so those
    calls are never held behind a spin kernel.
    """

    direction: str
    memory: str = "pinned"
    nbytes: int = 256 * MIB

    def __post_init__(self) -> None:
        _check_choice("TransferCase", "direction", self.direction, TRANSFER_DIRECTIONS)
        _check_choice("TransferCase", "memory", self.memory, HOST_MEMORIES)
        # Compared with the pinned transfer in the same direction.
        self._name(f"{self.direction}_{self.memory}", self.direction, self.memory, self.direction)

    def prepare(self) -> Prepared:
        import numpy as np

        count = self.nbytes // 4
        pinned = self.memory == "pinned"
        host = _core.pinned_empty(count, "float32") if pinned else np.empty(count, np.float32)
        host[:] = 1.25
        dev = _core.full(count, 2.5, dtype="float32")
        if self.direction == "h2d":
            def ours() -> Any:
                return _core.asarray(host, non_blocking=pinned)
        else:
            def ours() -> Any:
                return dev.get(out=host, non_blocking=pinned)

        def torch_copy(torch: Any) -> Callable[[], Any]:
            # torch's own pinned memory, so torch sees it as pinned.
            th = (torch.empty(count, dtype=torch.float32, pin_memory=True) if pinned
                  else torch.from_numpy(np.empty(count, np.float32)))
            th.fill_(1.25)
            if self.direction == "h2d":
                target = f"cuda:{_core.current_device()}"
                return lambda: th.to(target, non_blocking=pinned)
            tdev = torch.from_dlpack(dev)
            return lambda: th.copy_(tdev, non_blocking=pinned)

        meta = {"nbytes": self.nbytes, "memory": self.memory, "direction": self.direction}
        return Prepared(self, ours, bytes=float(self.nbytes), hold=pinned, metadata=meta,
                        operands={"host": host, "device": dev}, _torch=torch_copy)


@dataclasses.dataclass(frozen=True)
class LaunchCase(Case):
    """`launches` empty kernels launched back to back from C, then a synchronize.

    Timed with the host clock (`cudalab.bench.host_clock`): the per-launch
    cost when the host feeds the GPU as fast as it can, `repeats` times.
    """

    launches: int = 10_000
    repeats: int = 15

    def __post_init__(self) -> None:
        _check_size("LaunchCase", "launches", self.launches)
        _check_size("LaunchCase", "repeats", self.repeats)
        self._name("launch", "launch", None, None)

    def prepare(self) -> Prepared:
        launches = self.launches

        def ours() -> None:
            _core._empty_kernel(launches)
            _core.synchronize()

        return Prepared(self, ours, hold=False, metadata={"launches": launches})

    def measure(self, timer: Any, *, label: str | None = None, sub_label: str | None = None,
                description: str | None = "cudalab", ceiling: Any = None,
                metadata: dict[str, Any] | None = None) -> Measurement:
        """Host-clock timing after the timer's warm-up; seconds per launch (no ceiling)."""
        from .hostclock import host_clock, host_measurement

        if ceiling is not None:
            raise ValueError("LaunchCase.measure() argument 'ceiling': a launch is a time, "
                             "not a rate to compare against; expected None")
        prepared = self.prepare()
        [times] = host_clock({self.name: prepared.fn}, self.repeats,
                             warmup=timer.settings.warmup).values()
        return host_measurement(
            times, calls=self.launches, label=self.label if label is None else label,
            sub_label=self.sub_label if sub_label is None else sub_label,
            description=description, host_time=False,
            metadata={**prepared.metadata, **(metadata or {})},
            timer=f"host clock around {self.launches:,} empty-kernel launches + synchronize")
