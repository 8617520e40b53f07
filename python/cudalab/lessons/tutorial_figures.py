"""What the tutorials claim for each lesson, and what their own Tesla T4 run printed.

The tutorials cudalab's lessons come from make claims (some with a figure:
"1-2 GB of CUDA overhead", "a 16x penalty", "50-100x faster"), and one of
them, the Colab notebook, was run on a Tesla T4 with its outputs saved. These
are two different things: a claim is what a tutorial says, a T4 figure is what
that notebook's run printed (sometimes against its own claim). The README's
lessons table shows them in two columns (scripts/lessons_summary.py).

`figure(name)` gives a lesson's `TutorialFigure`, or None for a lesson this
module has no entry for (a new lesson shows "-" until one is added here).
Only the Colab notebook shows a run's output, so only lessons it covers
(0-8, and 17 through lesson 2's float16 GEMM) have a T4 figure. The
tutorials are named as in `TUTORIALS`; a comment beside each entry cites the
seed file (the reference copy of the tutorial) its text and figures are from.
"""

from __future__ import annotations

import dataclasses

__all__ = ["FIGURES", "TUTORIALS", "TutorialFigure", "figure"]

# The tutorials, short name -> title.
# The comments name the seed files; "seed 002" below is 002_28c195a36c20c874 and so on.
TUTORIALS: dict[str, str] = {
    # seed 000_2583f21620135e8f
    "optimization guide": "PyTorch CUDA Optimization Guide",
    # seed 001_05c6a21ddd862a7b
    "step-by-step guide": "Step-by-Step Implementation Guide: GPU Fundamentals",
    # seed 002_28c195a36c20c874 (an .ipynb with its outputs: the only tutorial run shown)
    "Colab notebook": "PyTorch CUDA 101: GPU Optimization Mastery (run on a Tesla T4)",
    # seed 003_3209b06320ceb79a
    "GPU acceleration guide": "GPU Acceleration in PyTorch",
    # seed 004_9bc94955b72a6ca6
    "torch with CUDA chapter": "Chapter 17: Using torch with CUDA",
}


@dataclasses.dataclass(frozen=True)
class TutorialFigure:
    """A lesson's tutorial claim and, where there is one, the tutorial's T4 figure.

    Attributes
    ----------
    claim : str
        What the tutorials claim, with the figure they give ("no figure" where
        they give none).
    tutorials : tuple of str
        Which tutorials claim it: keys of `TUTORIALS`.
    t4_run : str or None
        What the Colab notebook's saved Tesla T4 run printed for it; None where
        no tutorial shows a run.
    """

    claim: str
    tutorials: tuple[str, ...]
    t4_run: str | None = None

    def claim_text(self) -> str:
        """The tutorials that make the claim, then the claim: a table cell."""
        return f"{', '.join(self.tutorials)}: {self.claim}"


_NB, _OPT, _STEP = "Colab notebook", "optimization guide", "step-by-step guide"
_ACC, _CH17 = "GPU acceleration guide", "torch with CUDA chapter"

FIGURES: dict[str, TutorialFigure] = {
    # seed 002, lesson 0 and its output: allocated memory before and after a first tensor.
    "context": TutorialFigure(
        "CUDA takes 1-2 GB of device memory whatever the model's size", (_NB,),
        "0.0 MB: its memory_allocated() counts no context memory"),
    # seed 002, lesson 1 (randn 1024x1024 on the CPU + .cuda() vs on the GPU, 100 calls).
    "creation": TutorialFigure(
        "PCIe moves ~16 GB/s, device memory ~1500 GB/s, so create tensors on the device", (_NB,),
        "206x: 7.84 ms on the CPU + copy vs 0.04 ms on the GPU (1024x1024)"),
    # seed 002, lesson 2 (2048x2048 mm per dtype, randn of the operands inside the timing).
    "dtypes": TutorialFigure(
        "float16 enables tensor cores, 312 vs 19.5 TFLOP/s (a 16x cliff)", (_NB,),
        "float32 15.6x and float16 62x faster than float64 (71.54 / 4.58 / 1.15 ms, n=2048)"),
    # seed 002, lesson 3 (sum through .cpu().numpy() and back vs x.sum(), 1000x1000).
    "transfers": TutorialFigure(
        "each transfer costs ~10 us of latency", (_NB,),
        "75x: a sum through the host 1.64 ms vs on the GPU 0.02 ms (no latency measured)"),
    # seed 002, lesson 4 (32 mm of 256x256 in a loop vs one bmm, operands created inside).
    "batching": TutorialFigure(
        "batching raises arithmetic intensity (no figure)", (_NB, _ACC),
        "5.03x: a loop of 32 256x256 GEMMs 1.71 ms vs one batched call 0.34 ms"),
    # seed 002, lesson 5 (x + y, * 2 vs add_, mul_ on 2048x2048).
    "inplace": TutorialFigure(
        "in-place ops avoid the allocator's cost (no figure)", (_NB,),
        "1.13x faster (0.59 vs 0.52 ms), 1.45x lower peak (103.8 vs 71.8 MB), 2048x2048"),
    # seed 002, lesson 6: its table ran only sizes divisible by 16 (512 ... 2048).
    "tensor_cores": TutorialFigure(
        "misaligned float16 dimensions fall back to CUDA cores, a 16x penalty", (_NB,),
        "18.70 TFLOP/s float16 at 2048; every size it ran was aligned (no misaligned run)"),
    # seed 002, lesson 7 (sum(x.T, dim=0) vs sum(x.T.contiguous(), dim=0), 4096x4096).
    "access_patterns": TutorialFigure(
        ".contiguous() before reducing a transposed view is faster (no figure)", (_NB,),
        "0.21x: the view 0.27 ms, the contiguous copy 1.32 ms (slower, against its claim)"),
    # seed 002, lesson 8: its output is a RuntimeError from backward(), no table.
    "profiling": TutorialFigure(
        "the profiler shows the actual bottleneck (no figure)", (_NB, _OPT),
        "no figure: its example raised RuntimeError in backward() before any table"),
    # seed 001, Benchmark Results: "Expected Speedups"; the guide shows no run.
    "cpu_vs_gpu": TutorialFigure(
        "matrix multiplication 50-100x faster on the GPU (expected)", (_STEP,)),
    # seed 001 Phase 3 and seed 000 GPU Memory Management: no figure, no run.
    "memory": TutorialFigure(
        "empty_cache() frees GPU memory; reduce the batch size on OOM (no figure)",
        (_STEP, _OPT)),
    # seed 000 Pinned Memory, Asynchronous GPU Operations; seed 002 lessons 1 and 3.
    "pinned": TutorialFigure(
        "pinned memory makes transfers faster; ~10 us latency per transfer", (_OPT, _NB)),
    # seed 000 CUDA Streams.
    "streams": TutorialFigure(
        "streams overlap computation and data transfer (no figure)", (_OPT,)),
    # seed 000 Asynchronous Copy Pattern; seed 004's 'GPU idle, CPU overloaded' row.
    "prefetch": TutorialFigure(
        "asynchronous copies keep the GPU fed while the host loads (no figure)", (_OPT, _CH17)),
    # seed 000 CUDA Graph Optimization: "much faster for repeated patterns".
    "graphs": TutorialFigure(
        "replaying a CUDA graph is much faster for repeated patterns (no figure)", (_OPT,)),
    # seed 000 CUDA Synchronization Issues; seed 002 summary item 9.
    "timing": TutorialFigure(
        "always synchronize before timing (no figure)", (_OPT, _NB)),
    # seed 002 summary: the three performance regimes.
    "roofline": TutorialFigure(
        "work is overhead-, memory- or compute-bound (no figure)", (_NB,)),
    # seeds 000, 003, 004 (AMP sections); the T4 figure is seed 002 lesson 2's float16 GEMM
    # (4.58 / 1.15 ms), not a training step.
    "amp": TutorialFigure(
        "mixed precision trains faster in less memory (no figure)", (_OPT, _ACC, _CH17),
        "4.0x: a 2048x2048 float16 matmul vs float32 (1.15 vs 4.58 ms), not a training step"),
    # seed 001 memory tips and troubleshooting; seed 003 section 4.3.
    "grad_accumulation": TutorialFigure(
        "accumulating gradients simulates a larger batch (no figure)", (_STEP, _ACC)),
    # seed 001 Phase 4 and model_inference_comparison.py; no run shown.
    "inference": TutorialFigure(
        "batching and FP16/BF16 make inference faster (no figure)", (_STEP, _OPT)),
    # seed 002 summary: operator fusion for memory-bound work.
    "conv_as_gemm": TutorialFigure(
        "operator fusion helps memory-bound work (no figure)", (_NB,)),
    # seed 004 Multi-GPU Usage (.to('cuda:1')).
    "p2p": TutorialFigure(
        "move a model or tensor to another GPU with .to('cuda:1') (no figure)", (_CH17,)),
    # seed 001 Phase 5 and seed 000 DistributedDataParallel.
    "allreduce": TutorialFigure(
        "DistributedDataParallel is the recommended multi-GPU path (no figure)", (_STEP, _OPT)),
    # seed 001 Phase 5: DataParallel (simple) vs DDP (recommended).
    "data_parallel": TutorialFigure(
        "DataParallel is simple, DistributedDataParallel is recommended (no figure)", (_STEP,)),
    # seed 000 Multi-GPU Inference: DataParallel, "auto-distributed".
    "multi_gpu_inference": TutorialFigure(
        "DataParallel spreads inference over the GPUs (no figure)", (_OPT,)),
    # seed 001 memory tip 5 (model parallelism); seed 000's stream pipeline pattern.
    "pipeline_parallel": TutorialFigure(
        "model parallelism splits a model across GPUs (no figure)", (_STEP, _OPT)),
    # Lessons 26-29, being written: their tutorials' claims (no run shown for any).
    # seed 001 memory tip 2; seed 000 OOM solution 3.
    "checkpointing": TutorialFigure(
        "gradient checkpointing trades compute for memory (no figure)", (_STEP, _OPT)),
    # seed 001 memory tip 3.
    "amp_memory": TutorialFigure(
        "mixed precision training uses half the memory", (_STEP,)),
    # seed 001 Phase 4 (TorchScript, ONNX Runtime, TensorRT; the seeds do not name
    # torch.compile).
    "compilers": TutorialFigure(
        "TorchScript, ONNX Runtime and TensorRT make inference faster (no figure)", (_STEP,)),
    # seed 004 section 17.9.
    "determinism": TutorialFigure(
        "cudnn.benchmark auto-tunes convolutions; deterministic for exact reproducibility "
        "(no figure)", (_CH17,)),
}


def figure(name: str) -> TutorialFigure | None:
    """figure(name) -> TutorialFigure or None

    Lesson `name`'s tutorial claim and T4 figure; None for a lesson with no
    entry here (a lesson added after this module was last updated).
    """
    return FIGURES.get(name)
