"""Lesson 7 `access_patterns`: strided views, contiguous copies and transposes.

A transposed or sliced array is a view with other strides, not a copy. How an
op walks those strides decides how many DRAM sectors it touches for the bytes
it uses. The lesson times sums over a transposed view along both axes, over
column slices x[:, ::k] (useful bytes per second fall as k grows, because
every 32-byte sector is fetched for one 4-byte value), and every transpose
kernel against the measured copy ceiling. It also shows the tutorial's
pitfall: "fixing" a strided op with a contiguous copy first must count the
copy, and the copy only pays off when the contiguous array is used again.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

import cudalab

from ._measuring import break_even_uses, pick, random_array, ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson

TRANSPOSE_METHODS = ("naive", "coalesced_write", "tiled", "tiled_padded", "best")
# Two times within this factor are "about the same" (run-to-run noise).
MARGIN = 1.1
# Strided reads "waste bandwidth" when useful GB/s at the largest step is this much lower.
STRIDE_PENALTY = 1.5
# The tutorial's own figure: view sum 0.27 ms vs copy + sum 1.32 ms on a T4 (4096^2):
# its "fix" ran at 0.21x the speed of the op it fixed.
TUTORIAL_FIX_SPEEDUP = 0.21
# float32 sums of up to 8192 normal values against float64 NumPy, relative to max |sum|.
TOL_SUM = 1e-4


def fix_finding(view_s: float, fix_s: float, copy_s: float, contiguous_s: float) -> str:
    """The pitfall in one sentence: strided op vs copy + contiguous op, and when the copy pays."""
    speedup = ratio(view_s, fix_s)
    verdict = pick(speedup, MARGIN, "copying first is {x:.2f}x faster even counting the copy",
                   "copying first is {inv:.2f}x slower once the copy is counted",
                   "copying first takes about the same time ({x:.2f}x)")
    uses = break_even_uses(copy_s, view_s, contiguous_s)
    reuse = ("the contiguous op is no faster than the strided one, so the copy never pays off"
             if uses is None else
             f"the copy pays off once the contiguous array is used {uses} times or more")
    return (f"sum of the strided view {view_s * 1e3:.3f} ms vs copy {copy_s * 1e3:.3f} ms + "
            f"contiguous sum {contiguous_s * 1e3:.3f} ms: {verdict}; {reuse}")


def stride_finding(steps: list[int], useful_gbps: list[float]) -> str:
    """How useful bandwidth falls with the slice step."""
    first, last = useful_gbps[0], useful_gbps[-1]
    loss = ratio(first, last)
    if loss >= STRIDE_PENALTY:
        return (f"summing x[:, ::{steps[-1]}] delivers {last:.0f} useful GB/s vs {first:.0f} at "
                f"step {steps[0]}: {loss:.1f}x less, since each fetched sector carries fewer "
                f"useful bytes")
    return (f"strided slices keep their useful bandwidth ({first:.0f} -> {last:.0f} GB/s "
            f"from step {steps[0]} to {steps[-1]}): the rows are short enough to stay in cache")


def _reduce_part(r: LessonRun, x: Any, x_h: np.ndarray) -> dict[str, float]:
    nbytes = x_h.nbytes
    xt_c = cudalab.ascontiguousarray(x.T)
    ref = {0: x_h.astype(np.float64).T.sum(axis=0), 1: x_h.astype(np.float64).T.sum(axis=1)}
    cases = {
        "x.T view, sum axis 0": (lambda: cudalab.sum(x.T, axis=0), 0, nbytes),
        "x.T view, sum axis 1": (lambda: cudalab.sum(x.T, axis=1), 1, nbytes),
        "contiguous copy, sum axis 0": (lambda: cudalab.sum(xt_c, axis=0), 0, nbytes),
        "contiguous copy, sum axis 1": (lambda: cudalab.sum(xt_c, axis=1), 1, nbytes),
        "copy + sum axis 0 (the fix)":
            (lambda: cudalab.sum(cudalab.ascontiguousarray(x.T), axis=0), 0, 3 * nbytes),
        "copy alone": (lambda: cudalab.ascontiguousarray(x.T), None, 2 * nbytes),
    }
    times: dict[str, float] = {}
    for name, (fn, axis, moved) in cases.items():
        got = fn().get()
        want = x_h.T if axis is None else ref[axis]
        r.check(f"{name} vs NumPy", rel_error(got, want), 0.0 if axis is None else TOL_SUM)
        m = r.measure(name, fn, bytes=moved, ceiling="copy")
        times[name] = m.median
        r.row(kind="reduce", impl="cudalab", variant=name, step=None, ms=m.median * 1e3,
              useful_gbps=m.gbps, pct_of_copy=m.percent_of_ceiling)
    return times


def _stride_part(r: LessonRun, x: Any, x_h: np.ndarray, steps: list[int]) -> list[float]:
    useful = []
    for k in steps:
        view_h = x_h[:, ::k]
        fn = (lambda k=k: cudalab.sum(x[:, ::k], axis=1))
        r.check(f"sum x[:, ::{k}] vs NumPy", rel_error(fn().get(),
                                                      view_h.astype(np.float64).sum(axis=1)),
                TOL_SUM)
        m = r.measure(f"sum x[:, ::{k}]", fn, bytes=view_h.size * view_h.itemsize,
                      ceiling="copy")
        useful.append(m.gbps)
        r.row(kind="stride", impl="cudalab", variant=f"sum x[:, ::{k}] axis 1", step=k,
              ms=m.median * 1e3, useful_gbps=m.gbps, pct_of_copy=m.percent_of_ceiling)
    return useful


def _transpose_part(r: LessonRun, x: Any, x_h: np.ndarray) -> dict[str, float]:
    pct: dict[str, float] = {}
    for method in TRANSPOSE_METHODS:
        fn = (lambda method=method: cudalab.transpose(x, method=method))
        r.check(f"transpose {method} vs NumPy", rel_error(fn().get(), x_h.T), 0.0)
        m = r.measure(f"transpose {method}", fn, bytes=2 * x_h.nbytes, ceiling="copy")
        pct[method] = m.percent_of_ceiling
        r.row(kind="transpose", impl="cudalab", variant=method, step=None, ms=m.median * 1e3,
              useful_gbps=m.gbps, pct_of_copy=m.percent_of_ceiling)
    return pct


def _torch_part(r: LessonRun, torch: Any, x_h: np.ndarray) -> None:
    tx = torch.as_tensor(x_h, device="cuda")
    cases = {
        "torch x.T view, sum dim 0": (lambda: torch.sum(tx.T, dim=0), x_h.nbytes),
        "torch copy + sum dim 0 (the fix)":
            (lambda: torch.sum(tx.T.contiguous(), dim=0), 3 * x_h.nbytes),
        "torch x.t().contiguous()": (lambda: tx.t().contiguous(), 2 * x_h.nbytes),
    }
    r.check("torch x.t().contiguous() vs NumPy",
            rel_error(tx.t().contiguous().cpu().numpy(), x_h.T), 0.0)
    for name, (fn, moved) in cases.items():
        m = r.measure(name, fn, bytes=moved, ceiling="copy")
        r.row(kind="transpose" if "contiguous()" in name else "reduce", impl="torch",
              variant=name, step=None, ms=m.median * 1e3, useful_gbps=m.gbps,
              pct_of_copy=m.percent_of_ceiling)


# PyTorch's spelling of the cases -> cudalab's (for versus_torch); the
# transposed copy x.t().contiguous() is the same work as the best transpose.
TORCH_TWINS = {"torch x.T view, sum dim 0": "x.T view, sum axis 0",
               "torch copy + sum dim 0 (the fix)": "copy + sum axis 0 (the fix)",
               "torch x.t().contiguous()": "transpose best"}


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("access_patterns", p, "size")
    P.int_lists("access_patterns", p, "steps")


@lesson(7, "access_patterns", title="Memory access patterns: strided views, copies, transposes",
        seed="Colab notebook lesson 7 (memory access patterns: sum of x.T vs "
             "x.T.contiguous() on 4096 x 4096, 0.27 vs 1.32 ms on a T4); guides' memory "
             "access and coalescing sections",
        params={"size": 8192, "steps": (1, 2, 4, 8, 16, 32)},
        quick_params={"size": 4096, "steps": (1, 8, 32)},
        torch_twin=TORCH_TWINS.get,
        check=check_params)
def run(r: LessonRun) -> None:
    n = int(r.params["size"])
    steps = sorted(int(k) for k in r.params["steps"])
    x_h = random_array(n, (n, n))
    x = cudalab.asarray(x_h)
    t = _reduce_part(r, x, x_h)
    useful = _stride_part(r, x, x_h, steps)
    pct = _transpose_part(r, x, x_h)
    torch = r.torch()
    if torch is not None:
        _torch_part(r, torch, x_h)

    view, fix = t["x.T view, sum axis 0"], t["copy + sum axis 0 (the fix)"]
    r.finding(fix_finding(view, fix, t["copy alone"], t["contiguous copy, sum axis 0"]),
              value=ratio(view, fix), unit="x",
              labels=("x.T view, sum axis 0", "copy + sum axis 0 (the fix)", "copy alone",
                      "contiguous copy, sum axis 0"))
    along = ratio(t["x.T view, sum axis 0"], t["x.T view, sum axis 1"])
    r.finding(f"summing the transposed view along its strided axis runs at {100 * along:.0f}% "
              f"of the rate along its contiguous axis",
              value=100 * along, unit="%", labels=("x.T view, sum axis 0", "x.T view, sum axis 1"))
    r.finding(stride_finding(steps, useful), value=ratio(useful[0], useful[-1]), unit="x",
              labels=(f"sum x[:, ::{steps[0]}]", f"sum x[:, ::{steps[-1]}]"))
    r.finding(f"transpose: naive {pct['naive']:.0f}%, coalesced write "
              f"{pct['coalesced_write']:.0f}%, tiled {pct['tiled']:.0f}%, tiled + padded "
              f"{pct['tiled_padded']:.0f}%, best {pct['best']:.0f}% of the copy ceiling",
              value=pct["best"], unit="%",
              labels=tuple(f"transpose {m}" for m in TRANSPOSE_METHODS))
    speedup = ratio(view, fix)
    r.claim("calling .contiguous() on a transposed view before reducing it is faster",
            tutorial=TUTORIAL_FIX_SPEEDUP, measured=speedup, unit="x",
            held=speedup >= MARGIN,
            why=f"strided view / (copy + contiguous sum) = {speedup:.2f}x at {n}x{n}; "
                f"holds at >= {MARGIN}x (the tutorial's own T4 run gave 0.21x)")
    loss = ratio(useful[0], useful[-1])
    r.claim("non-contiguous access costs extra memory transactions", tutorial=None,
            measured=loss, unit="x", held=loss >= STRIDE_PENALTY,
            why=f"useful GB/s at step {steps[0]} / step {steps[-1]} = {loss:.1f}x; holds at "
                f">= {STRIDE_PENALTY}x")


@run.plot
def plot(result, ax) -> None:
    rows = [x for x in result.rows if x["kind"] != "stride"]
    ax.barh([x["variant"] for x in rows], [x["pct_of_copy"] or 0.0 for x in rows],
            color=["tab:orange" if x["impl"] == "torch" else "tab:blue" for x in rows])
    ax.axvline(100, color="gray", linestyle=":")
    ax.set_xlabel("% of the measured copy ceiling (bytes moved / time)")
    ax.tick_params(axis="y", labelsize=7)
