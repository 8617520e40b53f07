"""Lesson 1 `creation`: make data where it will be used.

An array built on the host and then copied pays twice: the host generates it
(one CPU core, a few GB/s at best) and the copy crosses PCIe, which moves tens
of GB/s against the thousands of GB/s of the GPU's own memory. Generated on
the device, the same array costs one kernel writing at HBM speed. The lesson
times both paths over a range of sizes, splits the host path into generation
and copy, and places each against the measured PCIe (``h2d``) and HBM
(``copy``) ceilings.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

import cudalab

from ..bench import ceiling, host_clock, host_measurement
from .analysis import MIB, claim_at_least, claim_within, first_at_least
from . import _params as P
from .registry import LessonRun, lesson

# The host path's cost as a multiple of device generation that the lesson
# reports a crossing for: an order of magnitude.
RATIO_MARK = 10.0
# The tutorial's T4 figures: 1024 x 1024 float32, 7.84 ms host + copy vs 0.04 ms on
# the device (206x); PCIe ~16 GB/s against ~1500 GB/s of device memory.
TUTORIAL_N = 1024
TUTORIAL_SPEEDUP = 206.32
TUTORIAL_MEMORY_OVER_PCIE = 1500.0 / 16.0
# A statistic of the device normals may sit this many standard errors from
# its expected value (a 1 in ~10^9 event for a correct generator).
STAT_Z = 6.0
HOST_TIMER = "host clock: call, then synchronize"
# Two guides disagree on `cpu_tensor + gpu_tensor`: "GPU Acceleration in
# PyTorch" (4.1) says it transfers the CPU tensor; the CUDA chapter (17.4)
# says CPU-GPU ops crash with a RuntimeError. The lesson runs it.
MIXING_CLAIM = "cpu_tensor + gpu_tensor moves the CPU tensor to the GPU automatically"


def normal_stats_z(values: np.ndarray) -> tuple[float, float]:
    """normal_stats_z(values) -> (mean_z, std_z)

    How many standard errors the sample mean lies from 0 and the sample
    standard deviation from 1, for standard normal samples.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    n = x.size
    return (abs(float(x.mean())) * math.sqrt(n),
            abs(float(x.std()) - 1.0) * math.sqrt(2.0 * n))


def mixing_verdict(torch_error: str | None) -> tuple[bool, str]:
    """mixing_verdict(torch_error) -> (moves, text)

    Which guide is right about PyTorch's ``cpu_tensor + gpu_tensor``, from the
    error it raised (None: it returned a result).
    """
    if torch_error is None:
        return True, ("PyTorch added a 3x3 CPU tensor to a CUDA tensor without an error: the "
                      "guide that says it transfers is right here")
    first = torch_error.strip().splitlines()[0] if torch_error.strip() else "(no message)"
    return False, (f"PyTorch raised on a 3x3 CPU tensor + a CUDA tensor ({first[:160]}): the "
                   f"guide that says CPU-GPU ops raise a RuntimeError is right; only 0-d CPU "
                   f"tensors (scalars) mix with CUDA tensors")


def _raises(fn: Callable[[], Any]) -> str | None:
    """The exception fn() raises, as 'Type: message', or None when it returns."""
    try:
        fn()
    except Exception as exc:  # whatever it is, the lesson reports it
        return f"{type(exc).__name__}: {exc}"
    return None


def _mixing(r: LessonRun, torch: Any) -> None:
    """Host and device operands in one op: cudalab's answer, and PyTorch's where installed."""
    d = cudalab.full((3, 3), 1.5, "float32")
    h = np.full((3, 3), 2.0, dtype=np.float32)
    ours = {"device_array + numpy_array": _raises(lambda: d + h),
            "numpy_array + device_array": _raises(lambda: h + d)}
    r.check("cudalab refuses a host array in an element-wise op, both orders (ops that ran)",
            sum(e is None for e in ours.values()), 0)
    message = ours["device_array + numpy_array"] or ""
    r.finding(f"cudalab never uploads implicitly: device_array + numpy_array raises "
              f"{message[:200]}; numpy_array + device_array raises too "
              f"({(ours['numpy_array + device_array'] or '').split(':')[0]}); NumPy scalars and "
              f"0-d values are accepted as scalars")
    if torch is None:
        return
    target = f"cuda:{cudalab.current_device()}"
    gpu = torch.full((3, 3), 1.5, device=target)
    error = _raises(lambda: torch.full((3, 3), 2.0) + gpu)
    scalar = torch.tensor(2.0) + gpu
    r.check("torch: a 0-d CPU tensor + a CUDA tensor computes 3.5 on the GPU",
            float((scalar - 3.5).abs().max()) + (0.0 if scalar.is_cuda else 1.0), 0.0)
    moves, text = mixing_verdict(error)
    r.finding(text[0].upper() + text[1:])
    r.claim(MIXING_CLAIM, tutorial=None, measured=None, unit=None, held=moves, why=text)


def _cases(n: int, rng: np.random.Generator, host: np.ndarray,
           torch: Any) -> dict[str, Callable[[], Any]]:
    def host_path() -> None:
        cudalab.asarray(rng.standard_normal((n, n), dtype=np.float32))
        cudalab.synchronize()

    def copy() -> None:
        cudalab.asarray(host)
        cudalab.synchronize()

    def device() -> None:
        cudalab.random.normal((n, n))
        cudalab.synchronize()

    cases = {"host normal + copy": host_path,
             "host normal": lambda: rng.standard_normal((n, n), dtype=np.float32),
             "copy": copy, "device normal": device}
    if torch is not None:
        target = f"cuda:{cudalab.current_device()}"

        def torch_host() -> None:
            torch.randn(n, n).to(target)
            torch.cuda.synchronize(target)

        def torch_device() -> None:
            torch.randn(n, n, device=target)
            torch.cuda.synchronize(target)

        cases["torch host randn + .to(cuda)"] = torch_host
        cases["torch randn on device"] = torch_device
    return cases


def _ms(r: LessonRun, label: str) -> float | None:
    m = r.measurements.get(label)
    return None if m is None else m.median * 1e3


def _size_rows(r: LessonRun, n: int, h2d: float) -> list[dict[str, Any]]:
    nbytes = 4 * n * n
    host_total, device, copy = (_ms(r, f"{k} {n}") for k in
                                ("host normal + copy", "device normal", "copy"))
    gen = r.measurements[f"device normal {n} (GPU time)"]
    copy_gbps = nbytes / (copy * 1e-3) / 1e9
    rows = [{"impl": "cudalab", "n": n, "mib": nbytes / MIB,
             "host_create_ms": _ms(r, f"host normal {n}"), "copy_ms": copy,
             "host_total_ms": host_total, "device_ms": device, "device_gpu_ms": gen.median * 1e3,
             "ratio": host_total / device, "copy_gbps": copy_gbps,
             "pct_h2d_ceiling": 100.0 * copy_gbps * 1e9 / h2d, "gen_gbps": gen.gbps,
             "pct_copy_ceiling": gen.percent_of_ceiling}]
    torch_host = _ms(r, f"torch host randn + .to(cuda) {n}")
    if torch_host is not None:
        torch_device = _ms(r, f"torch randn on device {n}")
        rows.append({**{k: None for k in rows[0]}, "impl": "torch", "n": n, "mib": nbytes / MIB,
                     "host_total_ms": torch_host, "device_ms": torch_device,
                     "ratio": torch_host / torch_device})
    return rows


def _measure_size(r: LessonRun, n: int, rng: np.random.Generator, torch: Any) -> None:
    nbytes = 4 * n * n
    host = rng.standard_normal((n, n), dtype=np.float32)
    times = host_clock(_cases(n, rng, host, torch), int(r.params["repeats"]),
                       warmup=r.timer.settings.warmup)
    for name, t in times.items():
        r.add(host_measurement(t, calls=1, label=f"{name} {n}", timer=HOST_TIMER,
                               bytes=float(nbytes), host_time=False,
                               metadata={"n": n, "dtype": "float32"}))
    r.measure(f"device normal {n} (GPU time)", cudalab.random.normal, (n, n),
              bytes=float(nbytes), ceiling="copy", metadata={"n": n})
    r.measure(f"full {n} (GPU time)", cudalab.full, (n, n), 1.5, "float32",
              bytes=float(nbytes), ceiling="copy", metadata={"n": n})


def _check(r: LessonRun, n: int, rng: np.random.Generator) -> None:
    host = rng.standard_normal((n, n), dtype=np.float32)
    back = cudalab.asarray(host).get()
    r.check(f"host -> device -> host copy of {n}x{n} float32 is bit-exact",
            float(np.max(np.abs(back - host))), 0.0)
    mean_z, std_z = normal_stats_z(cudalab.random.normal((n, n), seed=12345).get())
    r.check(f"mean of {n * n:,} device normals, in standard errors from 0", mean_z, STAT_Z)
    r.check(f"std of {n * n:,} device normals, in standard errors from 1", std_z, STAT_Z)
    filled = cudalab.full((n, n), 1.5, "float32").get()
    r.check("full((n, n), 1.5) holds 1.5 everywhere", float(np.max(np.abs(filled - 1.5))), 0.0)


def _findings(r: LessonRun, sizes: list[int], rows: list[dict[str, Any]], h2d: float,
              copy_ceiling: float) -> None:
    ours = [x for x in rows if x["impl"] == "cudalab"]
    big = ours[-1]
    n = big["n"]
    r.finding(f"At {n}x{n} float32 ({big['mib']:.0f} MiB), creating on the host and copying "
              f"costs {big['ratio']:.3g}x generating on the device ({big['host_total_ms']:.2f} vs "
              f"{big['device_ms']:.3f} ms, each call to synchronize)", value=big["ratio"],
              unit="x", labels=(f"host normal + copy {n}", f"device normal {n}"))
    gen_share = 100.0 * big["host_create_ms"] / big["host_total_ms"]
    r.finding(f"Of the host path, NumPy's generation takes {gen_share:.0f}% and the copy the rest; "
              f"the pageable copy moves {big['copy_gbps']:.1f} GB/s, {big['pct_h2d_ceiling']:.0f}% "
              f"of the pinned PCIe ceiling ({h2d / 1e9:.1f} GB/s)", value=big["copy_gbps"],
              unit="GB/s", labels=(f"host normal {n}", f"copy {n}"))
    r.finding(f"Device generation writes {big['gen_gbps']:.0f} GB/s, "
              f"{big['pct_copy_ceiling']:.0f}% of the rate of a device copy "
              f"({copy_ceiling / 1e9:.0f} GB/s read + written)", value=big["gen_gbps"],
              unit="GB/s", labels=(f"device normal {n} (GPU time)",))
    cross = first_at_least(sizes, [x["ratio"] for x in ours], RATIO_MARK)
    text = (f"from {cross}x{cross} up, host creation + copy costs at least {RATIO_MARK:.0f}x "
            f"device generation" if cross is not None else
            f"host creation + copy stays under {RATIO_MARK:.0f}x device generation at the "
            f"largest size of the sweep")
    r.finding(text[0].upper() + text[1:], value=cross, unit="n",
              labels=tuple(f"device normal {m}" for m in sizes))


def _claims(r: LessonRun, sizes: list[int], rows: list[dict[str, Any]], h2d: float,
            copy_ceiling: float) -> None:
    ours = [x for x in rows if x["impl"] == "cudalab"]
    near = min(ours, key=lambda x: abs(math.log(x["n"] / TUTORIAL_N)))
    claim_at_least(r, f"creating {TUTORIAL_N}x{TUTORIAL_N} on the GPU is ~206x faster than on "
                   f"the CPU + copy", TUTORIAL_SPEEDUP, near["ratio"], "x",
                   f"{near['ratio']:.3g}x at {near['n']}x{near['n']}")
    claim_within(r, "device memory is ~94x faster than PCIe (1500 vs 16 GB/s)",
                 TUTORIAL_MEMORY_OVER_PCIE, copy_ceiling / h2d, "x",
                 f"copy ceiling {copy_ceiling / 1e9:.0f} GB/s over pinned h2d {h2d / 1e9:.1f} GB/s")


def _torch_twin(label: str) -> str | None:
    """torch.randn on the device is the twin of device generation (its CPU
    generator has none: the host path here is NumPy's)."""
    prefix = "torch randn on device "
    return "device normal " + label[len(prefix):] if label.startswith(prefix) else None


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.int_lists("creation", p, "sizes")
    P.ints("creation", p, "repeats")


@lesson(1, "creation", title="Create on the device, not on the host and copy",
        seed="Colab notebook lesson 1 (device management and tensor creation)",
        params={"sizes": (256, 512, 1024, 2048, 4096), "repeats": 20},
        quick_params={"sizes": (256, 1024, 2048), "repeats": 5},
        torch_twin=_torch_twin,
        check=check_params)
def run(r: LessonRun) -> None:
    sizes = sorted(int(n) for n in r.params["sizes"])
    rng = np.random.default_rng(1)
    torch = r.torch()
    h2d, copy_ceiling = ceiling("h2d").value, ceiling("copy").value
    _check(r, sizes[0], rng)
    _mixing(r, torch)
    rows = []
    for n in sizes:
        _measure_size(r, n, rng, torch)
        rows += _size_rows(r, n, h2d)
    for row in rows:
        r.row(**row)
    _findings(r, sizes, rows, h2d, copy_ceiling)
    _claims(r, sizes, rows, h2d, copy_ceiling)


@run.plot
def plot(result, ax) -> None:
    for impl, style in (("cudalab", "-"), ("torch", "--")):
        rows = [x for x in result.rows if x["impl"] == impl]
        if not rows:
            continue
        mib = [x["mib"] for x in rows]
        ax.plot(mib, [x["host_total_ms"] for x in rows], style, marker="o",
                label=f"{impl}: host create + copy")
        ax.plot(mib, [x["device_ms"] for x in rows], style, marker="s",
                label=f"{impl}: create on device")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("array size (MiB, float32)")
    ax.set_ylabel("time per array, synchronized (ms)")
    ax.legend(fontsize=8)
