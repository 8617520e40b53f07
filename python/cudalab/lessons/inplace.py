"""Lesson 5 `inplace`: new arrays at every step vs writing into one buffer.

The chain y = relu(y * a + b), repeated, written the natural way makes a new
array for every op: the pool hands out and takes back memory at each step,
and the peak holds several arrays at once. Written with out= it runs the same
kernels over the same bytes into a single result buffer. The lesson measures
what that changes: GPU time (events: the kernels are the same, so it should
barely move), host time per call (the allocator's cost shows here), the pool's
peak bytes during one call, and the number of allocations (memory_stats()).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

import cudalab

from ._measuring import host_time, random_array, ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson

# The chain's constants: |y| stays bounded (fixed point 0.5), so repeats never overflow.
SCALE, SHIFT = 0.5, 0.25
# In-place counts as faster when the out-of-place host time is at least this much larger.
INPLACE_FASTER = 1.05
# In-place counts as saving memory when the out-of-place peak is at least this much larger.
MEMORY_SAVES = 1.2
# The tutorial's 2048 x 2048 figures on a T4: 1.13x faster, 1.45x less peak memory.
TUTORIAL_SIZE = 2048
TUTORIAL_SPEEDUP = 1.13
TUTORIAL_MEMORY = 1.45
# Both versions run the same float32 kernels in the same order: equal up to rounding.
TOL = 1e-6


def allocator_cost(host_out: float, host_in: float, allocs_out: int,
                   allocs_in: int) -> float | None:
    """Host seconds per extra allocation, or None when there are no extra allocations
    or the out-of-place version was not slower."""
    extra = allocs_out - allocs_in
    if extra <= 0 or host_out <= host_in:
        return None
    return (host_out - host_in) / extra


def speed_finding(size: int, speedup: float, per_alloc: float | None) -> str:
    """One sentence on the host-time ratio out-of-place / in-place at `size`."""
    where = f"at {size}x{size}"
    if speedup >= INPLACE_FASTER:
        cost = "" if per_alloc is None else f", about {per_alloc * 1e6:.2f} us per allocation"
        return f"{where} in-place is {speedup:.2f}x faster from Python{cost}"
    if speedup <= 1 / INPLACE_FASTER:
        return f"{where} in-place is slower ({speedup:.2f}x): the allocations cost nothing here"
    return (f"{where} in-place and out-of-place take the same time ({speedup:.2f}x): "
            f"the pool's allocations are too cheap to matter beside the kernels")


def memory_finding(size: int, peak_out: float, peak_in: float) -> str:
    """One sentence on the pool's peak during one call, out-of-place vs in-place."""
    saving = ratio(peak_out, peak_in)
    if saving >= MEMORY_SAVES:
        return (f"at {size}x{size} the out-of-place chain peaks at {peak_out / 2**20:.1f} MiB, "
                f"{saving:.2f}x the in-place chain's {peak_in / 2**20:.1f} MiB")
    return (f"at {size}x{size} both chains peak alike ({peak_out / 2**20:.1f} vs "
            f"{peak_in / 2**20:.1f} MiB): the pool reuses freed blocks at once")


def _pool_use(fn: Callable[[], Any], allocated: Callable[[], int], peak: Callable[[], int],
              reset: Callable[[], None], count: Callable[[], int],
              sync: Callable[[], None]) -> tuple[int, int]:
    """(peak bytes above what was live before, allocations) of one call of `fn`."""
    sync()
    base = allocated()
    reset()
    before = count()
    result = fn()
    sync()
    used, made = peak() - base, count() - before
    del result
    return used, made


def _cudalab_pool(fn: Callable[[], Any]) -> tuple[int, int]:
    return _pool_use(fn, cudalab.memory_allocated, cudalab.max_memory_allocated,
                     cudalab.reset_peak_memory_stats,
                     lambda: int(cudalab.memory_stats()["allocation.all.allocated"]),
                     cudalab.synchronize)


def _torch_pool(torch: Any, fn: Callable[[], Any]) -> tuple[int, int]:
    c = torch.cuda
    return _pool_use(fn, c.memory_allocated, c.max_memory_allocated, c.reset_peak_memory_stats,
                     lambda: int(c.memory_stats().get("allocation.all.allocated", 0)),
                     c.synchronize)


def _numpy_chain(x: np.ndarray, steps: int) -> np.ndarray:
    y = x
    for _ in range(steps):
        y = np.maximum(y * np.float32(SCALE) + np.float32(SHIFT), np.float32(0))
    return y


def _chains(x: Any, steps: int, torch: Any = None) -> dict[str, Callable[[], Any]]:
    """The out-of-place and in-place chain on `x` (cudalab, or torch when given)."""
    lib = cudalab if torch is None else torch

    def out_of_place() -> Any:
        y = x
        for _ in range(steps):
            y = lib.relu(y * SCALE + SHIFT)
        return y

    def in_place() -> Any:
        y = lib.mul(x, SCALE)  # the one allocation: the result
        for i in range(steps):
            if i:
                lib.mul(y, SCALE, out=y)
            if torch is None:
                cudalab.add(y, SHIFT, out=y)
                cudalab.relu(y, out=y)
            else:
                y.add_(SHIFT).relu_()
        return y

    return {"out-of-place": out_of_place, "in-place": in_place}


def _measure(r: LessonRun, impl: str, size: int, chains: dict[str, Callable[[], Any]],
             pool: Callable[[Callable[[], Any]], tuple[int, int]], nbytes: int,
             steps: int) -> dict[str, dict[str, float]]:
    moved = 3 * steps * 2 * nbytes  # every op reads and writes one array
    prefix = "" if impl == "cudalab" else "torch "
    out: dict[str, dict[str, float]] = {}
    for method, fn in chains.items():
        label = f"{prefix}{method} {size}"
        gpu = r.measure(label, fn, bytes=moved, ceiling=None)
        host = host_time(r, f"{label} host", fn).median
        peak, allocs = pool(fn)
        out[method] = {"host": host, "peak": peak, "allocs": allocs}
        r.row(size=size, impl=impl, method=method, gpu_ms=gpu.median * 1e3, host_ms=host * 1e3,
              gbps=gpu.gbps, peak_mib=peak / 2**20, peak_arrays=peak / nbytes,
              allocations=allocs)
    return out


def _one_size(r: LessonRun, size: int, steps: int) -> dict[str, dict[str, float]]:
    x_h = random_array(size, (size, size))
    ref = _numpy_chain(x_h, steps)
    x = cudalab.asarray(x_h)
    chains = _chains(x, steps)
    got = {k: fn().get() for k, fn in chains.items()}
    r.check(f"out-of-place {size} vs NumPy", rel_error(got["out-of-place"], ref), TOL)
    r.check(f"in-place {size} vs NumPy", rel_error(got["in-place"], ref), TOL)
    r.check(f"in-place {size} vs out-of-place", rel_error(got["in-place"], got["out-of-place"]),
            TOL)
    numbers = _measure(r, "cudalab", size, chains, _cudalab_pool, x_h.nbytes, steps)
    torch = r.torch()
    if torch is not None and size == _reference_size(r.params["sizes"]):
        tx = torch.as_tensor(x_h, device="cuda")
        tchains = _chains(tx, steps, torch)
        r.check(f"torch in-place {size} vs NumPy",
                rel_error(tchains["in-place"]().cpu().numpy(), ref), TOL)
        _measure(r, "torch", size, tchains, lambda fn: _torch_pool(torch, fn), x_h.nbytes, steps)
    return numbers


def _reference_size(sizes) -> int:
    return min(sizes, key=lambda s: abs(s - TUTORIAL_SIZE))


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    steps = int(p["steps"])
    if steps < 1:
        raise ValueError(f"lesson 'inplace': steps must be >= 1, got {steps}")
    P.int_lists("inplace", p, "sizes")


@lesson(5, "inplace", title="In-place ops: fewer allocations, lower peak memory",
        seed="Colab notebook lesson 5 (in-place operations: x + y, * 2 vs add_, mul_ on "
             "2048 x 2048, 1.13x faster and 1.45x less peak memory on a T4); guides' in-place "
             "sections",
        params={"sizes": (256, 2048, 8192), "steps": 4},
        quick_params={"sizes": (256, 2048)},
        check=check_params)
def run(r: LessonRun) -> None:
    check_params(r.params)
    steps = int(r.params["steps"])
    sizes = tuple(int(s) for s in r.params["sizes"])
    results = {s: _one_size(r, s, steps) for s in sizes}
    for s in sizes:
        o, i = results[s]["out-of-place"], results[s]["in-place"]
        labels = (f"out-of-place {s} host", f"in-place {s} host")
        speedup = ratio(o["host"], i["host"])
        per_alloc = allocator_cost(o["host"], i["host"], int(o["allocs"]), int(i["allocs"]))
        r.finding(speed_finding(s, speedup, per_alloc), value=speedup, unit="x", labels=labels)
        r.finding(memory_finding(s, o["peak"], i["peak"]), value=ratio(o["peak"], i["peak"]),
                  unit="x", labels=(f"out-of-place {s}", f"in-place {s}"))
    ref = _reference_size(sizes)
    o, i = results[ref]["out-of-place"], results[ref]["in-place"]
    tutorial = ref == TUTORIAL_SIZE
    speedup, saving = ratio(o["host"], i["host"]), ratio(o["peak"], i["peak"])
    r.claim("in-place ops are faster than making new arrays (~1.13x)",
            tutorial=TUTORIAL_SPEEDUP if tutorial else None, measured=speedup, unit="x",
            held=speedup >= INPLACE_FASTER,
            why=f"{speedup:.2f}x host time at {ref}x{ref}; holds at >= {INPLACE_FASTER}x")
    r.claim("in-place ops lower peak memory (~1.45x)",
            tutorial=TUTORIAL_MEMORY if tutorial else None, measured=saving, unit="x",
            held=saving >= MEMORY_SAVES,
            why=f"{o['allocs']:.0f} vs {i['allocs']:.0f} allocations per call, peak "
                f"{saving:.2f}x; holds at >= {MEMORY_SAVES}x")


@run.plot
def plot(result, ax) -> None:
    for method, style in (("out-of-place", "o-"), ("in-place", "s-")):
        rows = [x for x in result.rows if x["impl"] == "cudalab" and x["method"] == method]
        ax.plot([x["size"] for x in rows], [x["host_ms"] for x in rows], style,
                label=f"{method}: host ms per call")
        for x in rows:
            ax.annotate(f"{x['peak_arrays']:.1f} arrays peak, {x['allocations']} allocs",
                        (x["size"], x["host_ms"]), fontsize=6, textcoords="offset points",
                        xytext=(4, -10 if method == "in-place" else 4))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("array size n (n x n float32)")
    ax.set_ylabel("host time per call (ms)")
    ax.legend(fontsize=8)
