"""Build, execute and clean the lesson notebooks in notebooks/.

Every notebook is generated from the cells below, so they all have the same
shape and can be regenerated at any time::

    python scripts/build_notebooks.py             # write notebooks/ from the cells below
    python scripts/build_notebooks.py --check     # exit 1 if notebooks/ differs from them
    python scripts/build_notebooks.py --execute [--quick] [--timeout S] [NOTEBOOK ...]
    python scripts/build_notebooks.py --strip [NOTEBOOK ...]

Names: ``00_index.ipynb`` is the index; each lesson is ``NN_<name>.ipynb``
with NN its own number in `cudalab.lessons` (so ``00_context.ipynb`` shares
the index's 00). Building keeps the outputs of a notebook whose code cells did
not change (only its text did) and clears them otherwise.

``--execute`` runs notebooks in place with nbclient (kernel ``python3``),
quick parameters when ``--quick`` (the notebooks read CUDALAB_NOTEBOOK_QUICK),
prints each notebook's wall time and the total, strips what `strip_notebook`
drops, and exits 1 if any cell raised. ``--strip`` cleans executed notebooks
in place: outputs and execution counts stay; cell timing, widget state,
editor metadata, the kernel's Python version and absolute paths in outputs go.

Writing, stripping and checking need only the standard library; building
validates with nbformat when it is installed; executing needs nbclient and
ipykernel (``pip install ".[notebooks]"``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
INDEX = "00_index.ipynb"
QUICK_ENV = "CUDALAB_NOTEBOOK_QUICK"
DEFAULT_TIMEOUT_S = 1800
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# What ipykernel reports for Python, less its version (which changes from machine to machine).
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3"}
# Notebook metadata kept by strip_notebook; "cudalab" records how the outputs were made.
KEPT_METADATA = ("kernelspec", "language_info", "cudalab")


def notebook_name(number: int, name: str) -> str:
    """The file name of lesson `name` (number `number`): ``NN_name.ipynb``."""
    return f"{number:02d}_{name}.ipynb"


def lesson_files() -> dict[str, str]:
    """Lesson name -> its notebook's file name, for every registered lesson, in order."""
    from cudalab import lessons

    return {name: notebook_name(lessons.get(name).number, name) for name in lessons.names()}


# ---- the cells ---------------------------------------------------------------------------------


class Cell(NamedTuple):
    kind: str  # "markdown" or "code"
    source: str
    tags: tuple[str, ...] = ()


def md(text: str) -> Cell:
    return Cell("markdown", textwrap.dedent(text).strip())


def code(text: str, *tags: str) -> Cell:
    return Cell("code", textwrap.dedent(text).strip(), tuple(tags))


class Page(NamedTuple):
    """What is particular to one lesson's notebook.

    intro: what the lesson shows and why (markdown); claim: the tutorial's
    claim in our words; timed: a sentence before `cells`, the public-API
    lines that matter (the calls being timed); run_params: extra arguments of
    the lesson run; try_params: a suggestion for the last cell.
    """

    intro: str
    claim: str
    timed: str
    cells: tuple[str, ...]
    try_params: dict[str, Any]
    run_params: dict[str, Any] = {}  # noqa: RUF012 - never changed


PARAMETERS = code('''
    # Quick parameters (seconds instead of minutes) when CUDALAB_NOTEBOOK_QUICK=1, as in the tests.
    import os

    QUICK = os.environ.get("CUDALAB_NOTEBOOK_QUICK", "0") == "1"
''', "parameters")

DEVICE = '''
    if cudalab.is_available():
        props = cudalab.get_device_properties()
        driver, runtime = cudalab.driver_version(), cudalab.runtime_version()
        print(f"{cudalab.get_device_name()} (device {props.device}): compute capability "
              f"{props.major}.{props.minor}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2**30:.0f} GiB")
        print(f"CUDA driver {driver // 1000}.{driver % 1000 // 10}, runtime "
              f"{runtime // 1000}.{runtime % 1000 // 10}, cudalab {cudalab.__version__}")
    else:
        print("No CUDA device is visible to cudalab: the cells that measure need one.")
'''

SETUP = code('''
    %matplotlib inline
    import matplotlib.pyplot as plt
    import numpy as np
    from IPython.display import Markdown, display

    import cudalab

    plt.rcParams.update({"figure.dpi": 110, "font.size": 10})
    # The timing settings of the cells below: the lesson's own preset for this mode.
    timer = cudalab.bench.Timer("quick" if QUICK else "default")
''' + DEVICE)

FINDINGS = code('''
    lines = ["**Findings**", ""] + [f"- {f.text}" for f in result.findings]
    lines += ["", "**The tutorial's claims, measured here**", ""]
    lines += [f"- {'held' if c.held else 'did not hold'}: {c.claim} ({c.why})"
              for c in result.claims]
    passed = sum(c.passed for c in result.checks)
    lines += ["", f"**Checks**: {passed} of {len(result.checks)} passed"]
    Markdown("\\n".join(lines))
''')


def _call(name: str, params: dict[str, Any], quick: str) -> str:
    args = "".join(f", {k}={v!r}" for k, v in params.items())
    return f'cudalab.lessons.run("{name}", quick={quick}{args})'


def _params_text(params: Any) -> str:
    return ", ".join(f"`{k}={v!r}`" for k, v in params.items()) or "nothing"


def _plain(text: str) -> str:
    return textwrap.dedent(text).strip()


def lesson_cells(name: str, page: Page) -> list[Cell]:
    """The cells of lesson `name`'s notebook."""
    from cudalab import lessons

    x = lessons.get(name)
    head = (f"# Lesson {x.number} `{name}`: {x.title}\n\n{_plain(page.intro)}\n\n"
            f"From the tutorials: {x.seed}. [All lessons](00_index.ipynb)")
    claim = (f"## What the tutorial says\n\n{_plain(page.claim)}\n\nThe lesson measures the "
             f"same thing on this GPU and says below whether each claim held.")
    return [
        Cell("markdown", head),
        Cell("markdown", claim),
        PARAMETERS,
        SETUP,
        Cell("markdown", f"## The code being timed\n\n{_plain(page.timed)}"),
        *(code(c) for c in page.cells),
        md(f"""
            ## The whole lesson

            `cudalab.lessons.run` runs every size and variant, checks each result against NumPy,
            and computes its findings from its own numbers; the result shows as its table, its
            findings, the tutorial's claims beside the values measured here, and its checks. Full
            parameters:
            {_params_text(x.params)}. Quick mode changes {_params_text(x.quick_params)}.
        """),
        code(f"""
            result = {_call(name, page.run_params, "QUICK")}
            display(result, include=["text/markdown"])  # the table, findings, claims and checks
        """),
        md("## The plot"),
        code("""
            ax = result.plot()
            plt.show()
        """),
        md("## In short"),
        FINDINGS,
        md(f"""
            ## Try other parameters

            Any parameter can be overridden, on top of the full or the quick defaults; an unknown
            name raises an error that lists the valid ones. The same from a shell:
            `cudalab lesson {name} --quick --set KEY=VALUE`.
        """),
        code(f"""
            lesson = cudalab.lessons.get("{name}")
            print("full parameters: ", dict(lesson.params))
            print("quick parameters:", dict(lesson.quick_params))
            # For example (uncomment to run):
            # other = {_call(name, {**page.try_params, **page.run_params}, "True")}
            # other
        """),
    ]


def index_cells(files: dict[str, str]) -> list[Cell]:
    """The cells of the index notebook, linking every lesson notebook in `files`."""
    from cudalab import lessons

    rows = "\n".join(f"| {lessons.get(n).number} | [{f}]({f}) | {lessons.get(n).title} | "
                     f"{lessons.get(n).seed} |" for n, f in files.items())
    return [
        md("""
            # cudalab lessons

            One notebook per lesson of `cudalab.lessons`: each shows what the lesson is about, what
            the tutorial it comes from claims, the few lines of cudalab that do the work being
            timed, then runs the whole lesson on this GPU and shows its table, its plot, its
            findings (computed from the numbers measured here, not written in advance) and
            whether the tutorial's claims held.

            The outputs in these files come from a run on a real GPU; run them again to see what
            your GPU does.
        """),
        Cell("markdown", "| lesson | notebook | what it shows | from the tutorials |\n"
                         "|---|---|---|---|\n" + rows),
        md("""
            ## How to run them

            From the repository root, with a CUDA GPU and its driver:

            ```bash
            pip install ".[notebooks]"          # cudalab, JupyterLab, nbclient, matplotlib
            jupyter lab notebooks/
            ```

            Each notebook reads `CUDALAB_NOTEBOOK_QUICK`: with `CUDALAB_NOTEBOOK_QUICK=1` the lessons
            run with their quick parameters (seconds each), otherwise with the full ones.
            `scripts/run_notebooks.sh` executes every notebook in place and reports the time each
            took (`--quick` for quick parameters). Without Jupyter the same lessons run from a
            shell: `cudalab lesson NAME --quick`, or `cudalab run-all`.
        """),
        code('''
            import cudalab
        ''' + DEVICE),
        code("""
            for name in cudalab.lessons.names():
                lesson = cudalab.lessons.get(name)
                print(f"{lesson.number:2d}  {name:16s} {lesson.title}")
        """),
    ]


def _module(name: str) -> Any:
    return importlib.import_module(f"cudalab.lessons.{name}")


@functools.lru_cache(maxsize=None)
def pages() -> dict[str, Page]:
    """Lesson name -> its Page."""
    creation, dtypes, transfers = _module("creation"), _module("dtypes"), _module("transfers")
    batching, inplace, tensor_cores = _module("batching"), _module("inplace"), _module("tensor_cores")
    access, cpu_gpu, pinned = _module("access_patterns"), _module("cpu_vs_gpu"), _module("pinned")
    context = _module("context")
    p2p, allreduce = _module("p2p"), _module("allreduce")
    multi_gpu_inference, pipeline_parallel = (_module("multi_gpu_inference"),
                                              _module("pipeline_parallel"))
    return {
        "context": Page(
            intro="""
                Before the first byte of your data reaches the GPU, the process has already paid
                for its CUDA context (the driver's state for this process on the device), for the
                kernels its first op loads, and for the cuBLAS handle and workspace its first
                matmul creates. None of that comes from cudalab's memory pool, so
                `memory_allocated()` never shows it: only the driver's free-memory figure does. The
                lesson starts a fresh Python process for each reading and watches it from outside.
            """,
            claim=f"""
                CUDA's own overhead takes {context.CLAIM_LOW_MIB / 1024:.0f} to
                {context.CLAIM_HIGH_MIB / 1024:.0f} GB of device memory whatever the size of the
                model, and the framework's allocated-memory counter shows none of it (0.0 MB on the
                tutorial's T4).
            """,
            timed="""
                What the driver sees against what the pool counts, in this process (which already
                has its context). The first matmul below creates the cuBLAS handle and workspace.
            """,
            cells=('''
                free, total = cudalab.mem_get_info()
                print(f"driver: {(total - free) / 2**20:.0f} MiB of {total / 2**30:.0f} GiB in use "
                      f"on the device (all processes)")
                print(f"pool:   memory_allocated() = {cudalab.memory_allocated()} bytes")
            ''', '''
                before = cudalab.mem_get_info()[0]
                a = cudalab.full((64, 64), 0.5, dtype="float32")
                c = cudalab.matmul(a, a)
                cudalab.synchronize()
                after = cudalab.mem_get_info()[0]
                print(f"the first matmul took {(before - after) / 2**20:.1f} MiB more from the driver; "
                      f"the pool counts {cudalab.memory_allocated()} bytes (a and c are 16 KiB each)")
            '''),
            try_params={"runs": 2, "torch": False},
        ),
        "creation": Page(
            intro="""
                An array made on the host and then copied pays twice: one CPU core generates it,
                then the copy crosses PCIe, which moves tens of GB/s against the thousands of GB/s
                of the GPU's own memory. Generated on the device, the same array costs one kernel
                writing at memory speed. The lesson times both paths over a range of sizes and
                places each against the measured PCIe and device-memory ceilings.
            """,
            claim=f"""
                Creating a {creation.TUTORIAL_N}x{creation.TUTORIAL_N} tensor directly on the GPU is
                about {creation.TUTORIAL_SPEEDUP:.0f}x faster than creating it on the CPU and
                copying it over, and GPU memory is about
                {creation.TUTORIAL_MEMORY_OVER_PCIE:.0f}x faster than PCIe (1500 against 16 GB/s).
            """,
            timed="""
                The two halves of the host path and the device path, each timed with
                `cudalab.bench`. A copy from ordinary (pageable) NumPy memory makes the caller wait,
                so it is timed as the caller sees it (`hold=False`).
            """,
            cells=('''
                n = 1024 if QUICK else 4096
                host = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
                copy = timer.replace(hold=False).measure(cudalab.asarray, host, bytes=host.nbytes,
                                                         ceiling="h2d", label="asarray(host array)")
                made = timer.measure(cudalab.random.normal, (n, n), bytes=host.nbytes,
                                     ceiling="copy", label="random.normal on the device")
                print(copy)
                print(made)
                print(f"the copy alone takes {copy.median / made.median:.0f}x as long as "
                      f"generating on the device")
            ''',),
            try_params={"sizes": (512, 8192), "repeats": 5},
        ),
        "dtypes": Page(
            intro="""
                The same matrix product in float64, float32, TF32 (float32 arrays, tensor-core math
                with a 10-bit mantissa), float16 and bfloat16: how fast each runs, and how far each
                lands from a float64 NumPy product of the same inputs. Which dtype is fast depends
                on the GPU: consumer parts run float64 at a small fraction of float32, while
                A100/H100-class parts have float64 tensor cores.
            """,
            claim=f"""
                On the tutorial's T4 at n=2048, float32 matmul was
                {dtypes.TUTORIAL_FP32_OVER_FP64:.1f}x faster than float64 and float16
                {dtypes.TUTORIAL_FP16_OVER_FP64:.0f}x faster; float16 on tensor cores is a
                "{dtypes.TUTORIAL_FP16_OVER_FP32:.0f}x cliff" over float32 (312 against 19.5
                TFLOP/s on the datasheet).
            """,
            timed="""
                One matmul per precision on the same values. For float32 arrays `precision`
                chooses between true float32 (`"highest"`) and TF32 (`"high"`).
            """,
            cells=('''
                n = 2048 if QUICK else 8192
                a16 = cudalab.random.normal((n, n), dtype="float16", seed=1)
                b16 = cudalab.random.normal((n, n), dtype="float16", seed=2)
                a32, b32 = a16.astype("float32"), b16.astype("float32")
                runs = {
                    "float16": lambda: cudalab.matmul(a16, b16),
                    "tf32": lambda: cudalab.matmul(a32, b32, precision="high"),
                    "float32": lambda: cudalab.matmul(a32, b32, precision="highest"),
                }
                for label, fn in runs.items():
                    m = timer.measure(fn, flops=2 * n**3, label=f"matmul {label}")
                    print(f"{label:8s} {m.median * 1e3:8.3f} ms  {m.tflops:7.1f} TFLOP/s")
            ''',),
            try_params={"size": 4096, "dtypes": ("float32", "tf32", "bfloat16")},
        ),
        "transfers": Page(
            intro="""
                Every trip between host and device costs a fixed latency plus the bytes over the
                PCIe bandwidth. The lesson shows it twice: a sum kept on the GPU (one scalar comes
                back) against fetching the whole array and summing in NumPy, then copies from a few
                KiB to hundreds of MiB fitted as `time = latency + bytes / bandwidth`.
            """,
            claim=f"""
                Each transfer costs about {transfers.TUTORIAL_LATENCY_US:.0f} us of latency, and
                keeping a reduction on the GPU is about {transfers.TUTORIAL_REDUCTION_SPEEDUP:.0f}x
                faster than going through the host (1000x1000 float32 on a T4: 1.64 against
                0.02 ms).
            """,
            timed="""
                The two ways to get a sum, timed with the host clock (each call returns the sum on
                the host), then pageable copies of growing size.
            """,
            cells=('''
                x = cudalab.random.normal((1000, 1000), seed=3)
                times = cudalab.bench.host_clock({
                    "sum on the device, fetch the scalar": lambda: float(cudalab.sum(x).get()),
                    "fetch the array, sum in NumPy": lambda: float(x.get().sum()),
                }, repeats=20, warmup=0.1)
                for label, t in times.items():
                    print(f"{label:36s} {np.median(t) * 1e3:7.3f} ms")
            ''', '''
                pageable = timer.replace(hold=False)  # a pageable copy makes the caller wait
                for kib in (4, 1024, 65536):
                    host = np.full(kib * 256, 1.5, dtype=np.float32)
                    m = pageable.measure(cudalab.asarray, host, bytes=host.nbytes, ceiling="h2d",
                                         label=f"h2d {kib} KiB")
                    print(f"{kib:6d} KiB  {m.median * 1e6:9.1f} us  {m.gbps:6.2f} GB/s")
            '''),
            try_params={"size": 4000, "sweep_kib": (1, 32, 1024, 32768)},
        ),
        "batching": Page(
            intro="""
                A loop of small matrix products pays a Python call, a dispatch and a kernel launch
                for each one, and each small GEMM leaves most of the GPU idle. One batched call on
                (N, m, k) x (N, k, n) arrays issues a single GEMM for all of them. A CUDA graph of
                the loop keeps the N kernels but launches them with one call. The lesson times all
                three per GEMM, on the GPU and as the caller sees it.
            """,
            claim=f"""
                Batching 32 products of {batching.TUTORIAL_SIZE}x{batching.TUTORIAL_SIZE}
                matrices into one call is about {batching.TUTORIAL_SPEEDUP:.0f}x faster than a loop
                ({batching.TUTORIAL_SPEEDUP}x on the tutorial's T4).
            """,
            timed="""
                The loop and the batched call on the same operands, then the loop captured once
                into a CUDA graph and replayed; each timed with the host clock up to a
                synchronize, as a caller waits for it.
            """,
            cells=('''
                batch, n = 32, 256
                a = cudalab.random.normal((batch, n, n), seed=1)
                b = cudalab.random.normal((batch, n, n), seed=2)
                c = cudalab.empty((batch, n, n))
                pairs = [(a[i], b[i], c[i]) for i in range(batch)]  # views, made once


                def loop():
                    for x, y, out in pairs:
                        cudalab.matmul(x, y, out=out, precision="highest")


                def batched():
                    cudalab.matmul(a, b, out=c, precision="highest")
            ''', '''
                loop()  # run once eagerly: cuBLAS's handle and workspace exist before the capture
                graph = cudalab.CUDAGraph()
                with cudalab.graph(graph):
                    loop()


                def synced(fn):
                    return lambda: (fn(), cudalab.synchronize())


                times = cudalab.bench.host_clock({
                    "loop": synced(loop), "batched": synced(batched), "graph replay": synced(graph.replay),
                }, repeats=20, warmup=0.1)
                for label, t in times.items():
                    print(f"{label:12s} {np.median(t) / batch * 1e6:7.1f} us per GEMM")
            '''),
            try_params={"batch": 128, "sizes": (32, 64, 128)},
        ),
        "inplace": Page(
            intro="""
                The chain `y = relu(y * a + b)`, repeated, written the natural way makes a new
                array at every op: the pool hands memory out and takes it back at each step, and
                several arrays are alive at once. Written with `out=`, the same kernels run over
                the same bytes into one buffer. The lesson measures what that changes: GPU time,
                host time per call, peak memory and the number of allocations.
            """,
            claim=f"""
                In-place ops are faster than making new arrays and lower the peak memory: on the
                tutorial's T4, at {inplace.TUTORIAL_SIZE}x{inplace.TUTORIAL_SIZE}, in-place
                versions ran {inplace.TUTORIAL_SPEEDUP}x faster with {inplace.TUTORIAL_MEMORY}x
                less peak memory.
            """,
            timed="""
                Both versions of a four-step chain, and what the pool's counters say about each.
            """,
            cells=('''
                x = cudalab.random.normal((2048, 2048), seed=5)


                def out_of_place(steps=4):
                    y = x
                    for _ in range(steps):
                        y = cudalab.relu(y * 0.5 + 0.25)
                    return y


                def in_place(steps=4):
                    y = cudalab.mul(x, 0.5)  # the one allocation: the result
                    for i in range(steps):
                        if i:
                            cudalab.mul(y, 0.5, out=y)
                        cudalab.add(y, 0.25, out=y)
                        cudalab.relu(y, out=y)
                    return y
            ''', '''
                for fn in (out_of_place, in_place):
                    cudalab.synchronize()
                    base = cudalab.memory_allocated()
                    count = cudalab.memory_stats()["allocation.all.allocated"]
                    cudalab.reset_peak_memory_stats()
                    y = fn()
                    cudalab.synchronize()
                    peak = cudalab.max_memory_allocated() - base
                    count = cudalab.memory_stats()["allocation.all.allocated"] - count
                    m = timer.measure(fn, label=fn.__name__)
                    print(f"{fn.__name__:12s} GPU {m.median * 1e3:6.3f} ms, peak {peak / 2**20:5.0f} MiB "
                          f"above the input, {count} allocations")
                    del y
            '''),
            try_params={"sizes": (1024, 4096), "steps": 16},
        ),
        "tensor_cores": Page(
            intro="""
                Tensor-core GEMM kernels load their tiles 16 bytes at a time, so cuBLAS uses them
                only when every matrix row starts on a 16-byte boundary: K and N must be multiples
                of 8 half-precision or 4 float32 (TF32) elements. One element more or less and it
                falls back to slower kernels. The lesson sweeps sizes around powers of two, with
                matmul's padding off (the plain cuBLAS call) and on (operands copied into aligned,
                zero-padded buffers).
            """,
            claim=f"""
                Dimensions that are not multiples of 8 make float16 matmuls fall back from tensor
                cores to ordinary CUDA cores, a {tensor_cores.TUTORIAL_PENALTY:.0f}x penalty; with
                aligned sizes the tutorial's T4 ran a float16 2048^3 matmul at
                {tensor_cores.TUTORIAL_T4_TFLOPS_2048} TFLOP/s.
            """,
            timed="""
                One size on each side of the alignment boundary, padding off and on (`pad=`).
            """,
            cells=('''
                for n in (2048, 2049):
                    a = cudalab.random.normal((n, n), dtype="float16", seed=n)
                    b = cudalab.random.normal((n, n), dtype="float16", seed=n + 1)
                    for pad in (False, True):
                        m = timer.measure(lambda: cudalab.matmul(a, b, pad=pad), flops=2 * n**3,
                                          ceiling="matmul_float16", label=f"n={n} pad={pad}")
                        print(f"n={n} pad={pad!s:5s} {m.tflops:7.1f} TFLOP/s, "
                              f"{m.percent_of_ceiling:3.0f}% of the measured float16 ceiling")
            ''',),
            try_params={"sizes": (2047, 2048, 2049, 2056), "dtypes": ("bfloat16",)},
        ),
        "access_patterns": Page(
            intro="""
                A transposed or sliced array is a view with other strides, not a copy, and how an
                op walks those strides decides how many memory sectors it fetches for the bytes it
                uses. The lesson times sums over a transposed view along both axes, sums over
                column slices `x[:, ::k]`, and every transpose kernel against the copy ceiling. It
                also shows a pitfall: "fixing" a strided op with a contiguous copy must count the
                copy, which only pays off when the copy is used again.
            """,
            claim=f"""
                Non-contiguous access costs extra memory transactions, and calling `.contiguous()`
                on a transposed view before reducing it is faster. The tutorial's own T4 figures
                (4096x4096: 0.27 ms for the sum of the view, 1.32 ms with the copy) put that fix at
                {access.TUTORIAL_FIX_SPEEDUP}x the speed of what it fixed.
            """,
            timed="""
                The strided sum against the copy-then-sum "fix", then the transpose kernels, each
                against the measured copy bandwidth.
            """,
            cells=('''
                n = 4096
                x = cudalab.random.normal((n, n), seed=7)
                view = timer.measure(lambda: cudalab.sum(x.T, axis=0), bytes=4 * n * n,
                                     label="sum(x.T, axis=0)")
                fix = timer.measure(lambda: cudalab.sum(cudalab.ascontiguousarray(x.T), axis=0),
                                    bytes=3 * 4 * n * n, label="copy, then sum")
                print(view)
                print(fix)
            ''', '''
                for method in ("naive", "coalesced_write", "tiled", "tiled_padded", "best"):
                    m = timer.measure(lambda: cudalab.transpose(x, method=method), bytes=2 * 4 * n * n,
                                      ceiling="copy", label=f"transpose {method}")
                    print(f"{method:15s} {m.gbps:7.0f} GB/s, {m.percent_of_ceiling:3.0f}% of the copy ceiling")
            '''),
            try_params={"size": 2048, "steps": (1, 2, 4, 8, 16, 32, 64)},
        ),
        "profiling": Page(
            intro="""
                A real training step of `cudalab.nn` runs under `cudalab.profiler.profile()`: an
                MLP's forward pass (cuBLASLt GEMMs with bias and GELU fused in), the fused softmax
                cross-entropy and its gradient, the backward GEMMs and one fused AdamW step over
                every parameter, in bfloat16 by default (the float32 master weights cast in, the
                weight gradients written in float32 by the GEMMs). The lesson shows the busiest ops
                and the share of GPU time per kind of op (GEMM, loss, optimizer, cast, element-wise,
                reduction), whether the host or the GPU sets the pace, and writes a Chrome trace. It checks that the
                profiler's op times add up to the steps timed as a whole with CUDA events (a
                profile is only useful if it accounts for the time), and that the step's loss,
                gradients and AdamW update equal a float64 NumPy step's.
            """,
            claim="""
                The profiler shows which ops take the time of a training step. (The tutorial's own
                example crashes in its backward pass before it prints its table.)
            """,
            timed="""
                Three training steps of the MLP under the profiler, after a warm-up step, and
                their table of ops (the `_nn_*` names are cudalab.nn's GEMMs, loss and optimizer).
            """,
            cells=('''
                import cudalab.nn as nn

                sizes = [1024, 2048, 2048, 1024] if QUICK else [1024, 4096, 4096, 1024]
                x, labels = nn.TeacherData(sizes[0], sizes[-1], 4096).batch(0)
                model = nn.MLP(sizes, seed=0)
                opt = nn.AdamW(model.parameters(), lr=1e-4)


                def step():
                    return nn.train_step(model, opt, x, labels, "bf16")


                step()  # warm up: the layers' buffers, cuBLASLt's plans and the pool
                cudalab.synchronize()
                with cudalab.profiler.profile() as prof:
                    for _ in range(3):
                        with cudalab.profiler.record_function("train step"):
                            step()
                    cudalab.synchronize()
                print(prof.key_averages().table(row_limit=8))
            ''',),
            try_params={"precision": "fp32", "batch": 1024, "steps": 5},
            run_params={"trace_path": "profiling_trace.json"},
        ),
        "cpu_vs_gpu": Page(
            intro="""
                NumPy on the CPU against cudalab on the GPU, on three kinds of work: matrix
                multiplies per dtype (limited by arithmetic) and an element-wise add and a full sum
                (limited by memory). Rates are compared, GFLOP/s and GB/s, so a speedup means the
                same thing whatever size each side ran at; a CPU case too slow for the full size
                (NumPy's float16 GEMM has no BLAS behind it) runs smaller, as its row says.
            """,
            claim=f"""
                Matrix multiplication runs {cpu_gpu.CLAIM_LOW:.0f}-{cpu_gpu.CLAIM_HIGH:.0f}x faster
                on the GPU than on the CPU (the guide's benchmark: 8192x8192, 100 iterations).
            """,
            timed="""
                The same float32 product on both sides: NumPy timed with the host clock, cudalab
                with CUDA events.
            """,
            cells=('''
                n = 1024 if QUICK else 4096
                a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
                g = cudalab.asarray(a)
                cpu = cudalab.bench.host_clock({"numpy": lambda: a @ a}, repeats=5, warmup=0.0)["numpy"]
                gpu = timer.measure(lambda: cudalab.matmul(g, g, precision="highest"), flops=2 * n**3,
                                    label="cudalab.matmul float32")
                cpu_s = float(np.median(cpu))
                print(f"NumPy:   {2 * n**3 / cpu_s / 1e9:8.0f} GFLOP/s")
                print(f"cudalab: {gpu.tflops * 1e3:8.0f} GFLOP/s, {cpu_s / gpu.median:.0f}x NumPy")
            ''',),
            try_params={"matrix_size": 2048, "dtypes": ("float32",), "iterations": 20},
        ),
        "memory": Page(
            intro="""
                The feed-forward block of a transformer layer, `y = gelu(x @ w1) @ w2`, in float32:
                for each batch size the lesson reads the pool's counters and compares the peak with
                a model of which arrays are alive at once, follows one step allocation by
                allocation, shows what `empty_cache()` gives back, and then puts a memory limit a
                little above current use and finds the largest batch that fits, recovering from
                each out-of-memory error.
            """,
            claim="""
                Activations grow with the batch size; the caching allocator keeps freed blocks
                reserved, and `empty_cache()` hands them back to other processes but cannot free
                memory that live arrays hold; a per-process memory fraction caps what one process
                may take, and running out of memory is an error a program can catch and recover
                from.
            """,
            timed="""
                One step's peak from the pool's counters, then an out-of-memory error under a
                temporary limit, caught, with the limit put back.
            """,
            cells=('''
                hidden, rows = 1024, 16 * 128
                w1 = cudalab.random.normal((hidden, 4 * hidden), std=hidden ** -0.5, seed=1)
                w2 = cudalab.random.normal((4 * hidden, hidden), std=(4 * hidden) ** -0.5, seed=2)
                x = cudalab.random.normal((rows, hidden), seed=3)
                cudalab.synchronize()
                base = cudalab.memory_allocated()
                cudalab.reset_peak_memory_stats()
                y = cudalab.matmul(cudalab.gelu(cudalab.matmul(x, w1)), w2)
                cudalab.synchronize()
                print(f"peak during the step: {(cudalab.max_memory_allocated() - base) / 2**20:.0f} MiB "
                      f"above the weights and input; reserved {cudalab.memory_reserved() / 2**20:.0f} MiB")
            ''', '''
                stats = cudalab.memory_stats()
                budget = 256 * 2**20
                previous = cudalab.get_per_process_memory_fraction()
                cudalab.set_per_process_memory_fraction(
                    (stats["requested_bytes.all.current"] + budget) / stats["device_total_bytes"])
                try:
                    too_big = cudalab.empty(budget // 2, dtype="float32")  # twice the budget
                    print("no error: the limit did not apply")
                except cudalab.OutOfMemoryError as error:
                    print("OutOfMemoryError:", str(error).splitlines()[0])
                finally:
                    cudalab.set_per_process_memory_fraction(previous)
                print(f"allocated after the error: {(cudalab.memory_allocated() - base) / 2**20:.0f} MiB "
                      f"above the baseline (y is still alive)")
            '''),
            try_params={"batch_sizes": (64, 128, 256), "seq_len": 512, "limit_mib": 1024},
        ),
        "pinned": Page(
            intro="""
                The GPU's copy engines read and write host memory directly only when it is
                page-locked (pinned). From ordinary (pageable) NumPy memory the driver first copies
                through a pinned buffer of its own, so the transfer is slower and the call waits
                for it. From pinned memory (`cudalab.pinned_empty`) the copy runs at the link's
                speed and, with `non_blocking=True`, returns at once, so the host can work while
                the bytes move.
            """,
            claim=f"""
                Pinned memory makes host-to-device copies faster and lets non_blocking copies run
                while the host works; each transfer still pays about
                {pinned.TUTORIAL_LATENCY_US:.0f} us of latency, and the link is far slower than
                device memory (about {pinned.TUTORIAL_LINK_GAP:.0f}x on a T4: 16 against 1500
                GB/s).
            """,
            timed="""
                The same copy from pageable and from pinned memory, then a non_blocking copy: how
                long the call takes to return against how long the copy takes to finish.
            """,
            cells=('''
                n = (16 if QUICK else 256) * 2**20 // 4
                pageable = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
                pinned = cudalab.pinned_empty(n, dtype=np.float32)
                pinned[:] = pageable
                waits = timer.replace(hold=False)  # these copies make the caller wait
                for label, host in (("pageable", pageable), ("pinned", pinned)):
                    m = waits.measure(cudalab.asarray, host, bytes=host.nbytes, ceiling="h2d",
                                      label=f"h2d {label}")
                    print(f"{label:9s} {m.gbps:6.1f} GB/s, {m.percent_of_ceiling:3.0f}% of the pinned h2d ceiling")
            ''', '''
                import time

                cudalab.synchronize()
                t0 = time.perf_counter()
                d = cudalab.asarray(pinned, non_blocking=True)  # returns once the copy is queued
                returned = time.perf_counter() - t0
                cudalab.synchronize()
                done = time.perf_counter() - t0
                print(f"non_blocking copy of {pinned.nbytes / 2**20:.0f} MiB: the call returned after "
                      f"{returned * 1e3:.3f} ms, the copy was done after {done * 1e3:.3f} ms")
            '''),
            try_params={"sizes_kib": (4, 256, 65536), "overlap_mib": 128},
        ),
        "streams": Page(
            intro="""
                Work on one stream runs in order; work on different streams may run at the same
                time. That helps in two cases. Kernels too small to fill the GPU (a softmax over
                one long row runs on one block, so on one SM) run side by side when they are issued
                on several streams. And a stream of chunks through copy in, compute and copy out
                overlaps the three stages on the copy engines and the SMs when consecutive chunks
                go to different streams.
            """,
            claim="""
                Work on separate streams runs in parallel, and streams let computation overlap with
                data transfers.
            """,
            timed="""
                Sixteen one-block softmaxes on one stream and spread over four, then the
                copy/compute/copy pipeline on one stream and on three.
            """,
            cells=('''
                cols, count = (1 << 18, 16) if QUICK else (1 << 20, 32)
                xs = [cudalab.random.normal((1, cols), seed=i) for i in range(count)]
                ys = [cudalab.empty((1, cols)) for _ in range(count)]
                cudalab.synchronize()  # the inputs are ready for every stream


                def spread(streams):
                    def run():
                        for i, (x, y) in enumerate(zip(xs, ys)):
                            with streams[i % len(streams)]:
                                cudalab.softmax(x, out=y)
                        for s in streams:
                            s.synchronize()
                    return run


                times = cudalab.bench.host_clock({
                    "1 stream": spread([cudalab.Stream()]),
                    "4 streams": spread([cudalab.Stream() for _ in range(4)]),
                }, repeats=10, warmup=0.1)
                for label, t in times.items():
                    print(f"{label:9s} {np.median(t) * 1e3:7.3f} ms for {count} one-block softmaxes")
            ''', '''
                n = (64 if QUICK else 256) * 2**20 // 4
                host_in = cudalab.pinned_empty(n, dtype=np.float32)
                host_in[:] = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
                host_out = cudalab.pinned_empty(n, dtype=np.float32)


                def pipeline(streams, chunks=16):
                    def run():
                        step = n // chunks
                        for i in range(chunks):
                            part = slice(i * step, (i + 1) * step)
                            with streams[i % len(streams)]:
                                d = cudalab.asarray(host_in[part], non_blocking=True)
                                y = cudalab.tanh(cudalab.axpy(2.0, d, 1.0))
                                y.get(out=host_out[part], non_blocking=True)
                        for s in streams:
                            s.synchronize()
                    return run


                times = cudalab.bench.host_clock({
                    "1 stream": pipeline([cudalab.Stream()]),
                    "3 streams": pipeline([cudalab.Stream() for _ in range(3)]),
                }, repeats=5, warmup=0.1)
                for label, t in times.items():
                    print(f"{label:9s} {np.median(t) * 1e3:7.2f} ms for {n * 4 / 2**20:.0f} MiB in, "
                          f"computed and out")
            '''),
            try_params={"streams": (1, 2, 4, 8, 16), "chunks": (2, 8, 64)},
        ),
        "prefetch": Page(
            intro="""
                A training or inference loop feeds the GPU batches prepared on the host. Loaded
                synchronously, each batch is prepared, copied (the call waits) and then used. A
                prefetching loader prepares batch i+1 into a pinned buffer and copies it on a side
                stream while the GPU works on batch i: an event orders the GPU's work after the
                copy, and a buffer is refilled only once the copy that read it is done. The lesson
                also times the tutorial's own loader, and its check shows what timing alone misses.
            """,
            claim="""
                Prefetching on a side stream keeps the GPU fed while the host prepares data. The
                tutorial's loader calls `next(iter(loader))` for every batch, which restarts the
                loader each time: it hands out the first batch over and over.
            """,
            timed="""
                A small version of both loaders around the same GPU step (a few matmuls per
                batch), timed with the host clock over a dozen batches.
            """,
            cells=('''
                rows, features, batches = (2048 if QUICK else 4096), 1024, 12
                rng = np.random.default_rng(0)
                raw = [rng.integers(0, 256, (rows, features), dtype=np.uint8) for _ in range(4)]
                w = cudalab.random.normal((features, features), std=features ** -0.5, seed=1)


                def prepare(i, out):  # the host's work for batch i: normalize raw bytes to float32
                    np.multiply(raw[i % len(raw)], np.float32(1 / 255), out=out)
                    return out


                def step(batch):  # the GPU's work for one batch
                    for _ in range(4):
                        cudalab.matmul(batch, w, precision="highest")
            ''', '''
                def synchronous():
                    buffer = np.empty((rows, features), np.float32)
                    for i in range(batches):
                        step(cudalab.asarray(prepare(i, buffer)))  # waits for the copy
                    cudalab.synchronize()


                staging = [cudalab.pinned_empty((rows, features), dtype=np.float32) for _ in range(2)]
                side = cudalab.Stream()


                def prefetching():
                    copied = [None, None]  # the event of the last copy out of each staging buffer

                    def load(i):
                        slot = i % 2
                        if copied[slot] is not None:
                            copied[slot].synchronize()  # that copy has read the buffer: refill it
                        host = prepare(i, staging[slot])
                        with side:
                            batch = cudalab.asarray(host, non_blocking=True)
                            copied[slot] = side.record_event()
                        return batch, copied[slot]

                    upcoming = load(0)
                    for i in range(batches):
                        batch, ready = upcoming
                        consumer = cudalab.current_stream()
                        consumer.wait_event(ready)     # the step starts after the copy
                        batch.record_stream(consumer)  # and the batch is freed after the step
                        step(batch)
                        if i + 1 < batches:
                            upcoming = load(i + 1)     # the host prepares while the GPU works
                    cudalab.synchronize()


                times = cudalab.bench.host_clock({"synchronous": synchronous, "prefetching": prefetching},
                                                 repeats=3, warmup=0.0)
                for label, t in times.items():
                    print(f"{label:12s} {np.median(t) / batches * 1e3:7.2f} ms per batch")
            '''),
            try_params={"batches": 24, "rows": 8192, "pool": 8},
        ),
        "graphs": Page(
            intro="""
                A chain of many tiny element-wise ops is all overhead: each op costs a Python call,
                argument checks and a kernel launch, while its kernel runs for a microsecond or
                two. Captured once into a CUDA graph, the whole chain replays with one call. The
                lesson measures the host and GPU time per op of both, and the cost of a capture, to
                say how many replays a capture needs to pay for itself.
            """,
            claim="""
                Replaying a CUDA graph is much faster than issuing the same ops one by one when a
                pattern repeats (the overhead-bound regime of the tutorial's summary).
            """,
            timed="""
                A chain of 64 in-place ops on 1,024 values, issued eagerly and replayed from a
                graph, timed with the host clock up to a synchronize.
            """,
            cells=('''
                k = 64
                x = cudalab.random.normal(1024, seed=1)
                y = cudalab.empty_like(x)


                def chain():
                    cudalab.mul(x, 0.5, out=y)
                    for _ in range(k - 1):
                        cudalab.add(y, x, out=y)


                chain()  # once eagerly before the capture
                graph = cudalab.CUDAGraph()
                with cudalab.graph(graph):
                    chain()
                times = cudalab.bench.host_clock({
                    "eager": lambda: (chain(), cudalab.synchronize()),
                    "graph replay": lambda: (graph.replay(), cudalab.synchronize()),
                }, repeats=50, warmup=0.1)
                for label, t in times.items():
                    print(f"{label:12s} {np.median(t) / k * 1e6:6.2f} us per op")
            ''',),
            try_params={"ks": (2, 8, 32, 128, 512), "elements": 1 << 20},
        ),
        "timing": Page(
            intro="""
                A large matmul is asynchronous: the call returns once the kernel is queued, long
                before the GPU has finished it. The lesson times the same matmul with the host
                clock around the call alone, with the host clock and a synchronize, with CUDA
                events, with the tutorial's loop (many calls, one synchronize), and with
                `cudalab.bench`, and puts each beside the bench's median.
            """,
            claim="""
                Always synchronize before reading the clock, or the timing is wrong; the tutorial's
                benchmark helper (calls in a loop, one synchronize at the end) times GPU work
                correctly.
            """,
            timed="""
                Four of those ways on one matmul.
            """,
            cells=('''
                import time

                n = 4096 if QUICK else 8192
                a = cudalab.random.normal((n, n), seed=15)
                b = cudalab.random.normal((n, n), seed=16)
                cudalab.matmul(a, b)
                cudalab.synchronize()  # warm up, and start from an idle GPU

                t0 = time.perf_counter()
                cudalab.matmul(a, b)
                no_sync = time.perf_counter() - t0
                cudalab.synchronize()

                t0 = time.perf_counter()
                cudalab.matmul(a, b)
                cudalab.synchronize()
                synced = time.perf_counter() - t0

                start, end = cudalab.Event(), cudalab.Event()
                start.record()
                cudalab.matmul(a, b)
                end.record()
                end.synchronize()
                events = start.elapsed_time(end) * 1e-3  # elapsed_time is in milliseconds

                bench = timer.measure(cudalab.matmul, a, b, flops=2 * n**3, label="matmul")
                for label, s in (("host clock, no synchronize", no_sync), ("host clock + synchronize", synced),
                                 ("CUDA events", events), ("cudalab.bench median", bench.median)):
                    print(f"{label:28s} {s * 1e3:8.3f} ms")
            ''',),
            try_params={"size": 2048, "dtype": "float16", "samples": 30},
        ),
        "roofline": Page(
            intro="""
                A kernel's speed is capped by two roofs: the bytes it moves over the memory
                bandwidth, and the arithmetic peak. Which one binds depends on its arithmetic
                intensity (FLOPs per byte): below the ridge point (peak / bandwidth) a kernel is
                memory-bound, above it compute-bound. Under both sits a third regime: a kernel so
                short that its launch, not its work, sets its time. Here the roofs are measured on
                this GPU, not taken from a datasheet.
            """,
            claim="""
                Three regimes: element-wise ops are memory-bound (low FLOP/s, high bandwidth), a
                large matmul is compute-bound, and a tiny op is overhead-bound, its time not
                following its size; arithmetic intensity (FLOPs over bytes accessed) says which.
            """,
            timed="""
                An element-wise add and a float16 matmul, each timed with its FLOPs and bytes, and
                the measured roofs they sit under.
            """,
            cells=('''
                n = 1 << 24 if QUICK else 1 << 26
                a, b = cudalab.random.normal(n, seed=11), cudalab.random.normal(n, seed=12)
                c = cudalab.empty(n)
                add = timer.measure(lambda: cudalab.add(a, b, out=c), flops=n, bytes=12 * n,
                                    ceiling="copy", label="add")
                m = 4096
                x = cudalab.random.normal((m, m), dtype="float16", seed=13)
                z = cudalab.empty((m, m), dtype="float16")
                mm = timer.measure(lambda: cudalab.matmul(x, x, out=z), flops=2 * m**3, bytes=3 * 2 * m * m,
                                   ceiling="matmul_float16", label="matmul float16")
                ridge = cudalab.bench.ceiling("matmul_float16").value / cudalab.bench.ceiling("copy").value
                print(f"ridge point: {ridge:.0f} FLOP/byte (measured float16 peak / copy bandwidth)")
                for k in (add, mm):
                    print(f"{k.label:15s} {k.flops / k.bytes:8.2f} FLOP/byte  {k.tflops:8.3f} TFLOP/s  "
                          f"{k.gbps:7.0f} GB/s  {k.percent_of_ceiling:3.0f}% of {k.ceiling_name}")
            ''',),
            try_params={"dtypes": ("float64", "bfloat16"), "small_n": 128, "large_n": 2048},
        ),
        "amp": Page(
            intro="""
                Mixed-precision training keeps float32 master weights, gradients and optimizer
                state, and runs the GEMMs and activations in a narrower type: TF32 (float32 storage,
                tensor-core math), float16 or bfloat16. float16's small range makes small gradients
                underflow, so its loss gradient is multiplied by a scale that a GradScaler lowers
                when a step overflows (the step is then skipped) and raises after a run of clean
                steps. cudalab's scaler keeps found_inf and the scale on the GPU and the optimizer
                skips on the GPU, so a step never waits for the host; the lesson also measures what
                waiting would cost. The same MLP trains in each mode from the same weights.
            """,
            claim="""
                Mixed precision (autocast with a GradScaler) makes training faster and lighter
                without hurting it. The guides give no figure for training; the Colab notebook's
                lesson 2 measured a lone float16 GEMM at 4x float32's speed on a T4.
            """,
            timed="""
                One training step per precision mode (forward, loss, backward, unscale, AdamW,
                scale update) timed with CUDA events, then the float16 loop with and without a
                host read of the scale after every step, timed with the host clock.
            """,
            cells=('''
                import itertools

                import cudalab.nn as nn

                sizes = [64, 256, 256, 16] if QUICK else [512, 4096, 4096, 4096, 4096, 16]
                batch = 256 if QUICK else 1024
                batches = list(nn.TeacherData(sizes[0], sizes[-1], batch, batches=8))


                def trainer(precision):
                    model = nn.MLP(sizes, seed=0)
                    opt = nn.AdamW(model.parameters(), lr=1e-3)
                    scaler = nn.GradScaler() if precision == "fp16" else None
                    data = itertools.cycle(batches)

                    def step():
                        x, labels = next(data)
                        return nn.train_step(model, opt, x, labels, precision, scaler)
                    return step, scaler


                steps = {p: trainer(p)[0] for p in ("fp32", "fp16", "bf16")}
                times = {p: timer.measure(step, label=f"step {p}") for p, step in steps.items()}
                for p, m in times.items():
                    print(f"{p}: {m.median * 1e3:7.3f} ms per step, {times['fp32'].median / m.median:5.2f}x fp32")
            ''', '''
                step, scaler = trainer("fp16")


                def loop(read_scale, n=20):
                    for _ in range(n):
                        step()
                        if read_scale:
                            scaler.get_scale()  # a host read: the host waits for the GPU
                    cudalab.synchronize()


                t = cudalab.bench.host_clock({"sync-free": lambda: loop(False),
                                              "get_scale() every step": lambda: loop(True)},
                                             repeats=5, warmup=0.1)
                for label, s in t.items():
                    print(f"{label:24s} {np.median(s) / 20 * 1e3:7.3f} ms per step")
            '''),
            try_params={"precisions": ("fp32", "bf16"), "batch": 4096, "steps": 100},
        ),
        "grad_accumulation": Page(
            intro="""
                An optimizer step over a batch can be taken in k smaller passes: each micro-batch's
                forward and backward adds its gradients into the same buffers (its loss gradient
                scaled by 1/k, so the sum is the big batch's), and the optimizer steps once. Only
                one micro-batch's activations are alive at a time, so a step needs less memory,
                while the GEMMs get thinner and the launches more numerous. The lesson measures the
                memory pool's peak and the time per optimizer step for k = 1, 2, 4, 8 and shows the
                accumulated gradients equal the big batch's.
            """,
            claim="""
                When a batch does not fit, accumulate gradients over micro-batches (divide each
                loss by the number of steps, call backward on each, step once): it simulates the
                larger batch in less memory, at some cost in time.
            """,
            timed="""
                One optimizer step over the whole batch and over four micro-batches: the pool's
                peak during the first step, then the step's GPU time.
            """,
            cells=('''
                import cudalab.nn as nn

                sizes = [64, 256, 256, 16] if QUICK else [1024, 4096, 4096, 4096, 16]
                batch = 1024 if QUICK else 8192
                x, labels = nn.TeacherData(sizes[0], sizes[-1], batch).batch(0)


                def accumulated_step(model, opt, k):
                    inv_k = cudalab.full((1,), 1.0 / k, dtype="float32")  # scales each loss gradient
                    n = batch // k

                    def step():
                        for j in range(k):
                            rows = slice(j * n, (j + 1) * n)
                            logits = model.forward(x[rows])
                            nn.functional.cross_entropy(logits, labels[rows], grad=logits, loss_scale=inv_k)
                            model.backward(logits, accumulate=j > 0)  # add into the grads after the first
                        opt.step()
                    return step


                for k in (1, 4):
                    model = nn.MLP(sizes, seed=0)
                    step = accumulated_step(model, nn.AdamW(model.parameters(), lr=1e-4), k)
                    cudalab.synchronize()
                    base = cudalab.memory_allocated()
                    cudalab.reset_peak_memory_stats()
                    step()
                    cudalab.synchronize()
                    peak = cudalab.max_memory_allocated() - base
                    m = timer.measure(step, label=f"k={k}")
                    print(f"k={k}: {peak / 2**20:8.1f} MiB above the model, {m.median * 1e3:7.2f} ms per step")
            ''',),
            try_params={"ks": (2, 16), "precision": "bf16", "batch": 4096},
        ),
        "inference": Page(
            intro="""
                ResNet-50 inference, the tutorial's model comparison, on cudalab's own pieces:
                NHWC activations, every convolution a cuBLASLt GEMM (kxk ones after an im2col
                kernel), BatchNorm folded into the weights at load, bias and ReLU in the GEMM's
                epilogue and the residual add through the GEMM's C input. The whole forward is one
                call into C, and `capture()` records it in a CUDA graph. The lesson compares the
                CPU (the NumPy reference, and torch when installed) with the GPU per batch size
                and precision, eager against graph, beside torchvision when it is installed.
            """,
            claim="""
                The GPU runs inference far faster than the CPU; larger batches raise throughput;
                FP16/BF16 make inference faster; CUDA graphs cut the launch overhead of small
                batches.
            """,
            timed="""
                One forward at batch 1 and at batch 32 in fp16, eager and as a graph replay.
            """,
            cells=('''
                import cudalab.models as models

                model = models.resnet50(precision="fp16")
                paced = timer.replace(hold=False)  # eager pays the host's launch pace: measure it
                for n in (1, 8) if QUICK else (1, 32):
                    x = cudalab.asarray(np.random.default_rng(0).standard_normal((n, 224, 224, 3), dtype=np.float32))
                    eager = paced.measure(model, x, label=f"eager b{n}")
                    g = model.capture(n)
                    graph = paced.measure(g.replay, label=f"graph b{n}")
                    print(f"batch {n:3d}: eager {eager.median * 1e3:6.3f} ms, graph {graph.median * 1e3:6.3f} ms, "
                          f"{n / graph.median:8.0f} images/s")
            ''',),
            try_params={"batch_sizes": (1, 64, 256), "precisions": ("bf16", "tf32")},
        ),
        "conv_as_gemm": Page(
            intro="""
                A convolution is a GEMM over the windows of its input: im2col writes each output
                pixel's window as one row (kh * kw * C columns), and a (cout, K) weight multiplies
                them all at once. A 1x1 convolution needs no im2col: its rows are the activation
                itself. The lesson times one 3x3 and one 1x1 layer of ResNet-50: the im2col copy's
                share of the time, and what fusing BatchNorm, the residual add and ReLU into the
                GEMM's epilogue saves over separate kernels.
            """,
            claim="""
                Fusing element-wise work into the kernel that produces its input saves memory
                passes; data movement, not math, is often what a layer costs.
            """,
            timed="""
                im2col for a 3x3 layer, then its GEMM with the bias and ReLU fused.
            """,
            cells=('''
                from cudalab.models import ops

                n = 8 if QUICK else 32
                x = cudalab.asarray(np.random.default_rng(0).standard_normal((n, 28, 28, 128), dtype=np.float32)).astype("float16")
                w = cudalab.asarray(np.random.default_rng(1).standard_normal((128, 9 * 128), dtype=np.float32)).astype("float16")
                b = cudalab.asarray(np.random.default_rng(2).standard_normal(128, dtype=np.float32)).astype("float16")
                cols = ops.im2col(x, 3, 3, 1, 1)
                m_cols = timer.measure(ops.im2col, x, 3, 3, 1, 1, None, None, cols, label="im2col")
                m_gemm = timer.measure(ops.conv_gemm, cols, w, b, True, label="gemm+bias+relu")
                print(f"im2col {m_cols.median * 1e3:.3f} ms, GEMM {m_gemm.median * 1e3:.3f} ms "
                      f"({m_cols.median / (m_cols.median + m_gemm.median):.0%} of the layer in im2col)")
            ''',),
            try_params={"batch": 128, "dtype": "bfloat16"},
        ),
        "p2p": Page(
            intro="""
                A copy from one GPU to another is what `.to('cuda:1')` does between two stages of a
                model split across GPUs. With peer access on, the copy engines write straight into
                the other GPU's memory over NVLink or PCIe; with it off, the driver stages the
                bytes through host memory. The lesson copies between every ordered pair of GPUs,
                from a few KiB (where the latency is all there is) to a GiB (where the link's
                bandwidth is), with peer access on and off, and sets beside it a copy within one
                GPU, the trip through pinned host memory done by hand, and torch's
                `.to('cuda:N')`. Each sweep is fitted as latency + bytes / bandwidth; read the
                bandwidths as bytes copied once per second.
            """,
            claim=f"""
                Moving a tensor to another GPU with `.to('cuda:1')` is a direct GPU-to-GPU copy,
                much faster than going through the host, and enabling peer access speeds copies
                between GPUs up. The lesson counts the first as holding from
                {p2p.DIRECT_BEATS_HOST}x over the host path, the second from
                {p2p.PEER_HELPS}x between peer access off and on.
            """,
            timed="""
                One copy between devices (device 0 to device 1, or within device 0 on a machine
                with one GPU) timed with CUDA events on the source device, and `DeviceArray.to`.
            """,
            cells=('''
                n = cudalab.device_count()
                dst = 1 if n > 1 else 0
                size = (16 if QUICK else 256) << 20
                src = cudalab.random.normal((size // 4,), seed=1)
                with cudalab.device(dst):
                    out = cudalab.empty((size // 4,))
                if n > 1:
                    print("peer access possible 0 <-> 1:", cudalab.can_access_peer(0, 1),
                          cudalab.can_access_peer(1, 0))
                m = timer.measure(cudalab.copyto, out, src, bytes=size, ceiling=None,
                                  label=f"copy 0->{dst}")
                print(f"{size >> 20} MiB from device 0 to device {dst}: {m.median * 1e3:.3f} ms, "
                      f"{m.gbps:.1f} GB/s")
                moved = src.to(dst)
                print(f"src.to({dst}) is on device {moved.device}; same values:",
                      bool((moved.get() == src.get()).all()))
            ''',),
            try_params={"sizes": (4096, 1 << 20, 1 << 28), "gpus": 2, "torch": False},
        ),
        "allreduce": Page(
            intro="""
                Every data-parallel step ends with an all_reduce of the gradients, so how fast
                NCCL sums a buffer across GPUs decides how far training scales. The lesson starts
                one process per GPU (`cudalab.distributed.run.launch`) and times all_reduce of
                float32 buffers from 8 B to 4 GiB, with cudalab's NCCL binding and with
                torch.distributed beside it in the same processes, each after a barrier, the
                slowest rank's median reported. Read it as nccl-tests does: the algorithm
                bandwidth is bytes / time, and the bus bandwidth, algbw x 2(n-1)/n, is what each
                GPU's link carries in a ring all_reduce, comparable with the link's speed and
                across GPU counts. Small messages cost a latency instead, shown for an 8-byte
                all_reduce from a Python loop and replayed from a CUDA graph.
            """,
            claim=f"""
                NCCL is the engine for GPU collectives, so calling it directly should reach
                torch.distributed's bus bandwidth (parity from {allreduce.PARITY}x), and CUDA
                graphs cut the launch cost of small, repeated work, collectives included. Issue 20
                adds a figure: an 8-byte all_reduce from Python within
                {allreduce.LOOP_TARGET_US:g} us per call, where torch.distributed took
                {allreduce.TORCH_LOOP_H200_US:g} us on two H200s.
            """,
            timed="""
                What each worker does, as a script run on every GPU through the launcher: join
                the process group, check one all_reduce, time twenty. Then a copy of the same
                buffer within one GPU, for scale.
            """,
            cells=('''
                import pathlib
                import tempfile

                from cudalab.distributed import run as launcher

                script = """
                import cudalab, cudalab.distributed as dist
                dist.init()
                x = cudalab.ones((16 << 20,), dtype="float32")  # 64 MiB
                dist.all_reduce(x)                               # every element is now world_size
                assert float(x[:1].get()[0]) == dist.get_world_size()
                dist.barrier()
                start, end = cudalab.Event(), cudalab.Event()
                start.record()
                for _ in range(20):
                    dist.all_reduce(x)
                end.record()
                end.synchronize()
                ms, n = start.elapsed_time(end) / 20, dist.get_world_size()
                print(f"rank {dist.get_rank()} of {n}: {ms:.3f} ms per all_reduce of 64 MiB, "
                      f"busbw {x.nbytes / ms / 1e6 * 2 * (n - 1) / n:.1f} GB/s", flush=True)
                dist.destroy()
                """
                path = pathlib.Path(tempfile.mkdtemp()) / "allreduce_demo.py"
                path.write_text(script)
                status = launcher.launch([str(path)], nproc_per_node=cudalab.device_count())
                print("the launcher returned", status)
            ''', '''
                x = cudalab.ones((16 << 20,), dtype="float32")
                y = cudalab.empty_like(x)
                m = timer.measure(cudalab.copyto, y, x, bytes=x.nbytes, ceiling=None,
                                  label="copy 64 MiB")
                print(f"the same 64 MiB copied within one GPU: {m.median * 1e3:.3f} ms")
            '''),
            try_params={"sizes": (8, 1 << 20, 1 << 30), "gpus": 2, "latency_calls": 500},
        ),
        "data_parallel": Page(
            intro="""
                Data parallelism keeps the whole model on every GPU, gives each GPU its own rows
                and averages the gradients before the optimizer steps. The lesson trains the
                4 x 4096 GELU MLP in bf16 with AdamW at a large and a small per-GPU batch:
                DistributedDataParallel with one process per GPU (gradients sent in float32 and
                in bfloat16, torch's DDP beside it), and DataParallel driving every GPU from one
                process. It reports samples/s and scaling efficiency (throughput on n GPUs over n
                times one GPU's), and splits a DDP step into its parts: the step with no
                communication, the gradient all-reduces alone, and the overlapped step, so the
                share of the communication the backward hides can be read off. It then takes the
                tutorials' own DDP code apart: the global rank used as the GPU index, no
                DistributedSampler, and DDP wrapped around inference.
            """,
            claim="""
                DataParallel splits the batch across the GPUs automatically; DDP is nonetheless
                preferred because it is faster (one process per GPU, no weights copied each
                step, the gradient all-reduce overlapped with the backward). Issue 20 asks
                for >= 1.9x one GPU on 2 GPUs at a per-GPU batch of 8192 and >= 1.5x at 256
                (torch's DDP measured 1.79x and 1.26x on two H200s).
            """,
            timed="""
                DataParallel's training step, timed on device 0 (the gradient reduce ends every
                step there), and what its batch split and per-step traffic are; then the tutorial
                DDP setup's device choice for rank 2 of a 2 x 2 job, from the launcher's
                variables.
            """,
            cells=('''
                import cudalab.nn as nn
                from cudalab.distributed import DataParallel

                n = cudalab.device_count()
                sizes = [512, 1024, 1024, 16] if QUICK else [512, 4096, 4096, 4096, 4096, 16]
                batch = n * (1024 if QUICK else 8192)
                x, labels = nn.TeacherData(sizes[0], sizes[-1], batch).batch(0)
                model = nn.MLP(sizes)
                dp = DataParallel(model, device_ids=list(range(n)))
                opt = nn.AdamW(model.parameters(), lr=1e-4)


                def step():
                    logits = dp.forward(x, "bf16")
                    nn.functional.cross_entropy(logits, labels, grad=logits)
                    dp.backward(logits)
                    opt.step()


                m = timer.replace(hold=False).measure(step, label=f"DataParallel on {n} GPU(s)")
                print(f"{batch / m.median:.0f} samples/s on {n} GPU(s); rows per GPU: "
                      f"{dp.last_split}")
                traffic = dp.step_traffic(batch, "bf16")
                print({k: f"{v / 2**20:.0f} MiB" for k, v in traffic.items()})
            ''', '''
                from cudalab.distributed.env import from_environ

                env = from_environ({
                    "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                    "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
                print(f"rank {env.rank} of {env.world_size} on node {env.node_rank}: the tutorial "
                      f"calls set_device({env.rank}); its node has {env.local_world_size} GPUs, "
                      f"its own is local rank {env.local_rank}")
            '''),
            try_params={"batches": (4096,), "gpu_counts": (1, 2), "torch": False},
        ),
        "multi_gpu_inference": Page(
            intro="""
                Inference needs no gradients, so nothing has to travel between GPUs but the
                batch and the logits: one replica of ResNet-50 per GPU (`ResNet50.to(d)`), each
                with its part of the batch already on its device, every forward enqueued before
                any is waited for, the logits gathered on device 0. The lesson times whole steps
                for every GPU count at the same per-GPU batch, eager and replayed from each
                replica's CUDA graph, and gives images/s, the speed-up over one GPU and the
                scaling efficiency. Where torch is installed, torchvision's resnet50 runs the
                same way beside it.
            """,
            claim=f"""
                DataParallel splits each batch over the GPUs so inference throughput grows with
                their number. Issue 20's bar is a scaling efficiency of
                {multi_gpu_inference.SCALING_TARGET}
                ({2 * multi_gpu_inference.SCALING_TARGET:.2f}x on two GPUs) for ResNet-50 in fp16.
            """,
            timed="""
                A replica per GPU, each forward captured in a CUDA graph, and one step replaying
                them all, timed with the host clock until every device is done.
            """,
            cells=('''
                import cudalab.models as models

                n = cudalab.device_count()
                b = 32 if QUICK else 128
                params = models.fold(models.init_weights(seed=0))
                replicas = [models.ResNet50(params, precision="fp16").to(d) for d in range(n)]
                graphs = [m.capture(b) for m in replicas]  # each replays on its own device


                def step(k):
                    for d in range(k):
                        with cudalab.device(d):
                            graphs[d].replay()
                    for d in range(k):
                        cudalab.synchronize(d)


                times = cudalab.bench.host_clock({k: (lambda k=k: step(k)) for k in {1, n}},
                                                 repeats=5 if QUICK else 20, warmup=0.1)
                for k, t in times.items():
                    print(f"{k} GPU(s): {k * b / np.median(t):.0f} images/s")
            ''',),
            try_params={"batch": 64, "precision": "bf16", "graph": False},
        ),
        "pipeline_parallel": Page(
            intro="""
                Pipeline (model) parallelism gives each GPU a block of the model's layers, so each
                holds only its share of weights, optimizer state and activations. Run naively, as
                torch's model-parallel tutorial first does, one GPU works while the others wait;
                split into micro-batches (GPipe), stage s works on micro-batch k while stage s + 1
                works on k - 1, and only the fill and drain of the pipeline, the bubble, stay
                idle. The lesson runs the MLP through `cudalab.distributed.Pipeline` for every
                stage count and several micro-batch counts, and reads each stage's busy time from
                the pipeline's own CUDA events: the measured bubble sits beside GPipe's formula
                and beside what the schedule allows with the stage times measured. It also gives
                every GPU's peak memory against the whole model on one GPU, torch's tutorial code
                beside it, and checks the pipeline's gradients against the unsplit MLP's.
            """,
            claim=f"""
                GPipe puts the bubble at (S - 1) / (m + S - 1) of the step for S equal stages and
                m micro-batches (the lesson counts it as holding when the GPUs are busy at least
                {1 - pipeline_parallel.BUBBLE_TOLERANCE:.2f}x the formula's share); torch's
                tutorial shows that pipelining the input beats running the stages one after the
                other, and that splitting the model lets each GPU hold only part of it.
            """,
            timed="""
                The same MLP as a two-stage pipeline (one stage on a machine with one GPU), with
                one and with four micro-batches: the step's host time and the pipeline's own
                bubble figure.
            """,
            cells=('''
                import cudalab.nn as nn
                from cudalab.distributed import Pipeline

                n = min(2, cudalab.device_count())
                width = 1024 if QUICK else 4096
                sizes = [width] * 5 + [16]
                x, labels = nn.TeacherData(sizes[0], sizes[-1], 1024 if QUICK else 8192).batch(0)
                for chunks in (1, 4):
                    pipe = Pipeline(nn.MLP(sizes), devices=list(range(n)), chunks=chunks,
                                    timing=True)
                    opts = pipe.optimizers(nn.AdamW, lr=1e-4)


                    def step():
                        pipe.train_step(x, labels, opts, "bf16")
                        for d in range(n):
                            cudalab.synchronize(d)


                    [t] = cudalab.bench.host_clock({"step": step}, repeats=5, warmup=0.1).values()
                    tm = pipe.timings()
                    print(f"{n} stage(s), {chunks} micro-batches: {np.median(t) * 1e3:.2f} ms, "
                          f"bubble {tm.bubble_mean:.3f} (GPipe: {tm.bubble_theory:.3f})")
            ''',),
            try_params={"chunks": (1, 2, 4, 8, 16, 32), "batch": 4096, "torch": False},
        ),
    }


# ---- notebooks as JSON -------------------------------------------------------------------------


def _cell_id(stem: str, i: int) -> str:
    return f"{stem.replace('_', '-')}-{i:02d}"[-64:]


def make_notebook(stem: str, cells: list[Cell]) -> dict[str, Any]:
    """An unexecuted nbformat 4.5 notebook of `cells`; cell ids are stable (stem and position)."""
    out = []
    for i, c in enumerate(cells):
        cell: dict[str, Any] = {"cell_type": c.kind, "id": _cell_id(stem, i), "metadata": {},
                                "source": c.source}
        if c.tags:
            cell["metadata"]["tags"] = list(c.tags)
        if c.kind == "code":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)
    return {"cells": out, "metadata": {"kernelspec": dict(KERNELSPEC),
                                       "language_info": copy.deepcopy(LANGUAGE_INFO)},
            "nbformat": 4, "nbformat_minor": 5}


def generate() -> dict[str, dict[str, Any]]:
    """File name -> notebook, for the index and every registered lesson."""
    files = lesson_files()
    missing = [name for name in files if name not in pages()]
    if missing:
        raise SystemExit(f"build_notebooks: no cells for lesson(s) {', '.join(missing)}: add a Page "
                         f"to pages() in {Path(__file__).name}")
    out = {INDEX: make_notebook("index", index_cells(files))}
    for name, file in files.items():
        out[file] = make_notebook(Path(file).stem, lesson_cells(name, pages()[name]))
    return out


def _split(value: Any) -> Any:
    return value.splitlines(True) if isinstance(value, str) else value


def dumps(nb: dict[str, Any]) -> str:
    """The notebook as nbformat writes it: multi-line strings split into lines, sorted
    keys, one-space indent, a final newline."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        cell["source"] = _split(cell["source"])
        for output in cell.get("outputs", []):
            if output.get("output_type") in ("execute_result", "display_data"):
                data = output.get("data", {})
                for key in data:
                    if key.startswith("text/") or key in ("application/javascript", "image/svg+xml"):
                        data[key] = _split(data[key])
            elif output.get("output_type") == "stream":
                output["text"] = _split(output["text"])
    return json.dumps(nb, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def joined(nb: dict[str, Any]) -> dict[str, Any]:
    """`nb` with multi-line strings (lists of lines in files) joined back into one string."""
    for cell in nb.get("cells", []):
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for key, value in data.items():
                if isinstance(value, list) and not key.endswith("json"):
                    data[key] = "".join(value)
            if isinstance(output.get("text"), list):
                output["text"] = "".join(output["text"])
    return nb


def read(path: Path) -> dict[str, Any]:
    """A notebook file as a dict, multi-line strings joined."""
    return joined(json.loads(Path(path).read_text(encoding="utf-8")))


def write(path: Path, nb: dict[str, Any]) -> None:
    """Validate `nb` with nbformat when it is installed, then write it as nbformat does."""
    try:
        import nbformat
    except ImportError:
        nbformat = None
    if nbformat is not None:
        nbformat.validate(nbformat.from_dict(nb))
    Path(path).write_text(dumps(nb), encoding="utf-8")


# ---- strip ---------------------------------------------------------------------------------------

# An absolute path of at least two parts ("/x/y"), not part of a longer token.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~/-])/(?:[\w.+@-]+/)+[\w.+@-]*")


def _short_path(match: re.Match) -> str:
    path = match.group(0)
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path[path.index(marker) + len(marker):]
    return ".../" + path.rstrip("/").rsplit("/", 1)[-1]


# Terminal colour codes (tracebacks have them): a path may start right after one.
ANSI = re.compile(r"(\x1b\[[0-9;]*[A-Za-z])")


def scrub(text: str) -> str:
    """`text` with every absolute path cut to its last part (``.../name``), or to the part
    after site-packages for installed modules."""
    parts = ANSI.split(text)
    return "".join(p if i % 2 else ABSOLUTE_PATH.sub(_short_path, p) for i, p in enumerate(parts))


def _scrub_output(output: dict[str, Any]) -> None:
    if isinstance(output.get("text"), str):
        output["text"] = scrub(output["text"])
    for key, value in output.get("data", {}).items():
        if isinstance(value, str) and (not key.startswith("image/") or key == "image/svg+xml"):
            output["data"][key] = scrub(value)
    if "traceback" in output:
        output["traceback"] = [scrub(line) for line in output["traceback"]]
    output.get("metadata", {}).pop("execution", None)


def strip_notebook(nb: dict[str, Any]) -> dict[str, Any]:
    """A copy of `nb` without what changes from run to run or machine to machine.

    Kept: sources, outputs, execution counts, cell tags, and the notebook's
    kernelspec, language_info and "cudalab" metadata. Dropped: every other cell
    and notebook metadata (execution timing, widget state, editor state), the
    Python version in language_info; the kernelspec becomes the standard
    ``python3`` one; absolute paths in outputs are cut (`scrub`).
    """
    nb = copy.deepcopy(nb)
    meta = nb.get("metadata", {})
    kept = {k: meta[k] for k in KEPT_METADATA if k in meta}
    kept["kernelspec"] = dict(KERNELSPEC)
    info = kept.get("language_info")
    kept["language_info"] = ({k: v for k, v in info.items() if k != "version"}
                             if isinstance(info, dict) else copy.deepcopy(LANGUAGE_INFO))
    nb["metadata"] = json.loads(scrub(json.dumps(kept)))
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = {"tags": tags} if tags else {}
        for output in cell.get("outputs", []):
            _scrub_output(output)
    return nb


# ---- execute -------------------------------------------------------------------------------------


def kernel_env(quick: bool, extra_path: Iterable[str] = ()) -> dict[str, str]:
    """The kernel's environment: this one, CUDALAB_NOTEBOOK_QUICK set, PYTHONPATH made
    absolute (the kernel starts in the notebook's directory) with `extra_path` first."""
    env = dict(os.environ)
    env[QUICK_ENV] = "1" if quick else "0"
    paths = [*extra_path, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths)
    # debugpy (in ipykernel) warns on stderr about frozen modules otherwise.
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def execute(source: Path, target: Path, quick: bool, timeout: float,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> str | None:
    """Execute notebook `source` with nbclient, write it (stripped) to `target`.

    The kernel (``python3``) starts in `cwd` (default: `target`'s directory)
    with `env` (default: `kernel_env(quick)`). Returns None, or the error of
    the cell that raised (the notebook is written up to that cell).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(str(source), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(cwd or Path(target).parent)}})
    error = None
    try:
        client.execute(env=env if env is not None else kernel_env(quick))
    except CellExecutionError as exc:
        error = ANSI.sub("", str(exc))
    except Exception as exc:  # a dead kernel or a timeout: report it like a failing cell
        error = f"{type(exc).__name__}: {exc}"
    data = joined(json.loads(json.dumps(nb)))
    data["metadata"]["cudalab"] = {"executed": {"quick": quick, "complete": error is None}}
    write(target, strip_notebook(data))
    return error


# ---- commands ------------------------------------------------------------------------------------


def _paths(args: list[str]) -> list[Path]:
    if args:
        return [Path(p) for p in args]
    return [NOTEBOOKS / INDEX] + [NOTEBOOKS / f for f in lesson_files().values()]


def _code_sources(nb: dict[str, Any]) -> list[str]:
    return [c["source"] for c in nb["cells"] if c["cell_type"] == "code"]


def differences(path: Path, want: dict[str, Any]) -> list[str]:
    """How the notebook at `path` differs from `want` in its cells (sources, types, tags)."""
    if not path.exists():
        return [f"{path.name}: missing"]
    have = read(path)
    if len(have["cells"]) != len(want["cells"]):
        return [f"{path.name}: {len(have['cells'])} cells, expected {len(want['cells'])}"]
    out = []
    for i, (h, w) in enumerate(zip(have["cells"], want["cells"])):
        for key in ("cell_type", "source"):
            if h.get(key) != w.get(key):
                out.append(f"{path.name}: cell {i}: {key} differs")
        if h.get("metadata", {}).get("tags") != w["metadata"].get("tags"):
            out.append(f"{path.name}: cell {i}: tags differ")
    return out


def build(directory: Path = NOTEBOOKS) -> list[str]:
    """Write every notebook; keep the outputs of one whose code cells are unchanged.
    Returns the names written."""
    directory.mkdir(exist_ok=True)
    written, notebooks = [], generate()
    for file, nb in notebooks.items():
        path = directory / file
        if path.exists():
            old = read(path)
            if _code_sources(old) == _code_sources(nb) and len(old["cells"]) == len(nb["cells"]):
                for new_cell, old_cell in zip(nb["cells"], old["cells"]):
                    if new_cell["cell_type"] == "code":
                        new_cell["outputs"] = old_cell.get("outputs", [])
                        new_cell["execution_count"] = old_cell.get("execution_count")
                if "cudalab" in old.get("metadata", {}):
                    nb["metadata"]["cudalab"] = old["metadata"]["cudalab"]
            if dumps(read(path)) == dumps(nb):
                continue
        write(path, nb)
        written.append(file)
    stale = sorted(p.name for p in directory.glob("*.ipynb") if p.name not in notebooks)
    if stale:
        print(f"not a lesson notebook any more (remove them): {', '.join(stale)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if notebooks/ is not up to date")
    mode.add_argument("--execute", action="store_true", help="execute notebooks in place")
    mode.add_argument("--strip", action="store_true", help="strip volatile metadata in place")
    parser.add_argument("--quick", action="store_true", help="with --execute: quick parameters")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"with --execute: seconds per cell (default {DEFAULT_TIMEOUT_S})")
    parser.add_argument("notebooks", nargs="*", help="notebooks (default: all of notebooks/)")
    args = parser.parse_args(argv)
    if args.check:
        problems = [d for f, nb in generate().items() for d in differences(NOTEBOOKS / f, nb)]
        print("\n".join(problems) or "notebooks/ is up to date")
        return 1 if problems else 0
    if args.strip:
        for path in _paths(args.notebooks):
            write(path, strip_notebook(read(path)))
        return 0
    if args.execute:
        return run_all(_paths(args.notebooks), args.quick, args.timeout)
    for file in build():
        print(f"wrote notebooks/{file}")
    return 0


def run_all(paths: list[Path], quick: bool, timeout: float) -> int:
    """Execute each notebook in place; print its wall time, then the total; 1 on any error."""
    failed, total = [], 0.0
    print(f"executing {len(paths)} notebook(s) with {'quick' if quick else 'full'} parameters",
          flush=True)
    for path in paths:
        start = time.perf_counter()
        error = execute(path, path, quick, timeout)
        seconds = time.perf_counter() - start
        total += seconds
        print(f"{seconds:8.1f} s  {path.name}{'  FAILED' if error else ''}", flush=True)
        if error:
            failed.append(path.name)
            tail = "\n".join(error.strip().splitlines()[-12:])
            print(textwrap.indent(tail, "    "), file=sys.stderr, flush=True)
    print(f"{total:8.1f} s  total, {len(paths) - len(failed)} of {len(paths)} notebooks ran "
          f"without error", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
