"""Lesson 4 `batching`: many small GEMMs, one call at a time or all at once.

A loop of N small matrix products pays one Python call, one dispatch and one
kernel launch per product, and each small GEMM leaves most of the GPU idle.
One batched call on (N, m, k) x (N, k, n) issues a single strided-batched
GEMM that fills the GPU. A CUDA graph of the same loop keeps the N kernels
but replays them with one launch from the host. The lesson times all three
per GEMM, on the GPU (CUDA events, back to back) and as the caller sees it
(host clock around the call and a synchronize), and puts the loop's extra
cost per GEMM beside the bare kernel-launch ceiling.
"""

from __future__ import annotations

from typing import Any, Mapping

import cudalab
from cudalab import _precision

from ..bench import ceiling
from ._measuring import host_time, pick, random_array, ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson

# A method at least this many times faster than another counts as a real win;
# closer than that the two are "about the same" (run-to-run noise is ~10%).
BATCH_WIN = 1.5
# The tutorial's "batching is ~5x faster" holds when batching is at least this much faster.
CLAIM_HOLDS = 2.0
# A GEMM is launch-bound when its host time per call exceeds its GPU time by this factor.
LAUNCH_BOUND = 1.5
# The tutorial's workload: 32 products of 256 x 256 matrices, 5.03x on a T4.
TUTORIAL_SIZE = 256
TUTORIAL_SPEEDUP = 5.03
# Relative-error bounds: float32 GEMMs (true fp32) against float64 NumPy, and two
# float32 GEMM paths (loop vs batched) that may pick different cuBLAS kernels.
TOL_NUMPY = 1e-4
TOL_PATHS = 1e-5


def compare_methods(size: int, loop_s: float, batched_s: float, graph_s: float) -> str:
    """One finding sentence on per-GEMM host times of the three methods at `size`."""
    batch_x = ratio(loop_s, batched_s)
    graph_x = ratio(loop_s, graph_s)
    head = pick(batch_x, BATCH_WIN,
                f"at {size}x{size}, one batched call is {{x:.1f}}x faster than the loop",
                f"at {size}x{size}, the loop is {{inv:.1f}}x faster than one batched call "
                f"(the batched kernel choice is worse here)",
                f"at {size}x{size}, batched and loop are about the same ({{x:.2f}}x): each "
                f"GEMM is big enough to keep the GPU busy")
    tail = pick(graph_x, BATCH_WIN,
                "; the graph-replayed loop is {x:.1f}x faster than the eager loop",
                "; the graph-replayed loop is {inv:.1f}x slower than the eager loop",
                "; replaying the loop as a CUDA graph changes little ({x:.2f}x)")
    return head + tail


def launch_overhead(loop_host_s: float, loop_gpu_s: float) -> float:
    """Host seconds per GEMM the loop spends beyond its GPU time (0 when GPU-bound)."""
    return max(loop_host_s - loop_gpu_s, 0.0)


def _torch_rows(r: LessonRun, torch: Any, size: int, a_h, b_h, ref, flops: float) -> None:
    # True fp32 like ours (precision="highest"), whatever an earlier lesson set.
    with _precision.TorchTf32(torch, False):
        _torch_methods(r, torch, size, a_h, b_h, ref, flops)


def _torch_methods(r: LessonRun, torch: Any, size: int, a_h, b_h, ref, flops: float) -> None:
    n = a_h.shape[0]
    ta = torch.as_tensor(a_h, device="cuda")
    tb = torch.as_tensor(b_h, device="cuda")
    tc_loop, tc_batch = torch.empty_like(ta), torch.empty_like(ta)
    pairs = [(ta[i], tb[i], tc_loop[i]) for i in range(n)]

    def loop() -> None:
        for x, y, o in pairs:
            torch.mm(x, y, out=o)

    def batched() -> None:
        torch.bmm(ta, tb, out=tc_batch)

    loop()
    batched()
    torch.cuda.synchronize()
    r.check(f"torch bmm {size} vs float64 NumPy", rel_error(tc_batch.cpu().numpy(), ref),
            TOL_NUMPY)
    loop_host = host_time(r, f"torch loop {size} host", loop, calls=n).median
    for method, fn in (("loop", loop), ("batched", batched)):
        gpu = r.measure(f"torch {method} {size}", fn, flops=flops, ceiling=None)
        host = loop_host if method == "loop" else \
            host_time(r, f"torch {method} {size} host", fn, calls=n).median
        r.row(size=size, impl="torch", method=method, gpu_us_per_gemm=gpu.median / n * 1e6,
              host_us_per_gemm=host * 1e6, tflops=gpu.tflops,
              speedup_vs_loop=ratio(loop_host, host))


def _measure_size(r: LessonRun, size: int, n: int) -> dict[str, float]:
    """Check and time loop, batched and graph at `size`.

    Returns host seconds per GEMM by method, and GPU seconds per GEMM under
    "<method> gpu".
    """
    a_h = random_array(size, (n, size, size))
    b_h = random_array(size + 1, (n, size, size))
    ref = a_h.astype("float64") @ b_h.astype("float64")
    a, b = cudalab.asarray(a_h), cudalab.asarray(b_h)
    c_loop, c_batch, c_graph = (cudalab.empty((n, size, size), "float32") for _ in range(3))
    # Views made once, so the timed loop does only the GEMM calls.
    operands = [(a[i], b[i]) for i in range(n)]
    loop_out, graph_out = [c_loop[i] for i in range(n)], [c_graph[i] for i in range(n)]

    def loop(outs=loop_out) -> None:
        for (x, y), o in zip(operands, outs):
            cudalab.matmul(x, y, out=o, precision="highest")

    def batched() -> None:
        cudalab.matmul(a, b, out=c_batch, precision="highest")

    # Run eagerly first: cuBLAS handles, workspaces and plans are made outside the
    # capture, which then records only the GEMM kernels into out= buffers made before it.
    loop()
    batched()
    g = cudalab.CUDAGraph()
    with cudalab.graph(g):
        loop(graph_out)
    g.replay()
    got_loop, got_batch, got_graph = c_loop.get(), c_batch.get(), c_graph.get()
    r.check(f"loop {size} vs float64 NumPy", rel_error(got_loop, ref), TOL_NUMPY)
    r.check(f"batched {size} vs float64 NumPy", rel_error(got_batch, ref), TOL_NUMPY)
    r.check(f"batched {size} vs loop", rel_error(got_batch, got_loop), TOL_PATHS)
    r.check(f"graph replay {size} vs eager loop", rel_error(got_graph, got_loop), TOL_PATHS)

    flops = 2.0 * n * size**3
    hosts: dict[str, float] = {}
    for method, fn in (("loop", loop), ("batched", batched), ("graph", g.replay)):
        gpu = r.measure(f"{method} {size}", fn, flops=flops, ceiling=None)
        host = host_time(r, f"{method} {size} host", fn, calls=n)
        hosts[method] = host.median
        hosts[f"{method} gpu"] = gpu.median / n
    for method in ("loop", "batched", "graph"):
        r.row(size=size, impl="cudalab", method=method,
              gpu_us_per_gemm=hosts[f"{method} gpu"] * 1e6, host_us_per_gemm=hosts[method] * 1e6,
              tflops=flops / n / hosts[f"{method} gpu"] / 1e12,
              speedup_vs_loop=ratio(hosts["loop"], hosts[method]))
    torch = r.torch()
    if torch is not None and size == _reference_size(r.params["sizes"]):
        _torch_rows(r, torch, size, a_h, b_h, ref, flops)
    return hosts


def _reference_size(sizes) -> int:
    """The tutorial's size when swept, else the closest one."""
    return min(sizes, key=lambda s: abs(s - TUTORIAL_SIZE))


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("batching", p, "batch")
    P.int_lists("batching", p, "sizes")


@lesson(4, "batching", title="Many small GEMMs: a loop, one batched call, a CUDA graph",
        seed="Colab notebook lesson 4 (batching for arithmetic intensity: 32 x 256^2 mm loop "
             "vs bmm, 5.03x on a T4); guides' batching sections",
        params={"batch": 32, "sizes": (64, 128, 256, 512, 1024)},
        quick_params={"sizes": (64, 256)},
        check=check_params)
def run(r: LessonRun) -> None:
    n = int(r.params["batch"])
    sizes = tuple(int(s) for s in r.params["sizes"])
    by_size = {s: _measure_size(r, s, n) for s in sizes}
    launch = ceiling("launch").value
    for s in sizes:
        h = by_size[s]
        r.finding(compare_methods(s, h["loop"], h["batched"], h["graph"]),
                  value=ratio(h["loop"], h["batched"]), unit="x",
                  labels=(f"loop {s} host", f"batched {s} host", f"graph {s} host"))
    ref = _reference_size(sizes)
    h = by_size[ref]
    extra = launch_overhead(h["loop"], h["loop gpu"])
    bound = h["loop"] >= LAUNCH_BOUND * h["loop gpu"]
    r.finding(
        f"at {ref}x{ref} the loop costs {h['loop'] * 1e6:.1f} us per GEMM from Python vs "
        f"{h['loop gpu'] * 1e6:.1f} us of GPU time: "
        + (f"launch-bound, {extra * 1e6:.1f} us of overhead per GEMM, "
           f"{ratio(extra, launch):.0f}x the bare launch ceiling ({launch * 1e6:.2f} us)"
           if bound else "the GPU work dominates, so launch overhead matters little"),
        value=extra * 1e6, unit="us", labels=(f"loop {ref} host", f"loop {ref}"))
    measured = ratio(h["loop"], h["batched"])
    r.claim(f"batching {n} GEMMs of {ref}x{ref} into one call is ~5x faster than a loop",
            tutorial=TUTORIAL_SPEEDUP if ref == TUTORIAL_SIZE and n == 32 else None,
            measured=measured, unit="x", held=measured >= CLAIM_HOLDS,
            why=f"{measured:.1f}x here (host time per GEMM); holds at >= {CLAIM_HOLDS}x")


@run.plot
def plot(result, ax) -> None:
    styles = {"loop": "o-", "batched": "s-", "graph": "^-"}
    for method, style in styles.items():
        rows = [x for x in result.rows if x["impl"] == "cudalab" and x["method"] == method]
        sizes = [x["size"] for x in rows]
        ax.plot(sizes, [x["host_us_per_gemm"] for x in rows], style, label=f"{method} (host)")
        ax.plot(sizes, [x["gpu_us_per_gemm"] for x in rows], style[0] + ":",
                label=f"{method} (GPU)", alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("matrix size n (n x n, float32)")
    ax.set_ylabel("time per GEMM (us)")
    ax.legend(fontsize=7, ncol=2)
