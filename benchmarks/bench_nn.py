"""Benchmark: cudalab.nn training steps and fused AdamW beside PyTorch.

MLP step. An MLP of 4 hidden layers of 4096 (in 1024, out 1024 classes,
GELU (tanh) between layers, PyTorch's initialization) trained with AdamW on
softmax cross-entropy, at batch 256 (launch and element-wise bound) and 8192
(GEMM bound), in every precision: fp32, tf32, fp16 (with a dynamic loss
scaler) and bf16, float32 master weights throughout. Implementations:

* ``cudalab``: ``nn.train_step`` issued from Python step after step;
* ``cudalab graph``: ``nn.Trainer(graph=True)``, the whole step one CUDA graph
  replay (the batch is copied into the graph's input buffers each step);
* ``torch``: the same network with the same initial weights on the same
  batches (shared through DLPack), eager: torch.autocast for fp16/bf16,
  torch.amp.GradScaler for fp16, torch.optim.AdamW(fused=True),
  ``zero_grad(set_to_none=True)``; TF32 through
  ``torch.backends.cuda.matmul.allow_tf32``.

GELU layers run with GELU in the GEMM's epilogue or as a separate kernel,
as ``nn.fusion`` measured faster for each problem; cudalab rows list which
(``gelu_fused``, ``gelu_split``).

Step time is what a training loop sees: CUDA events around back-to-back steps
with no spin-kernel hold (`Timer(..., hold=False)`), so a step that Python
issues slower than the GPU runs it is timed at the host's pace. The GPU-only
time (the queue held behind a spin kernel, so host cost is hidden) is kept
beside it as ``gpu_ms``. TFLOP/s counts the GEMMs only (forward, input and
weight gradients: 6 x batch x sum of in x out).

Fused AdamW. One optimizer step over 100.7M float32 parameters (6 of
4096 x 4096 and 6 of 4096) with float32 gradients: 28 bytes per parameter
(parameter, gradient and both moments read; parameter and moments written),
GB/s beside torch.optim.AdamW(fused=True) on the same sizes, and as a
percentage of the measured device copy ceiling.

Module API for the benchmark driver: run(quick: bool) -> list[dict] (rows of
benchlib.row; cudalab rows get "vs_torch": torch's median time over ours,
above 1 when cudalab is faster). Run as a script to print the table:
python benchmarks/bench_nn.py [--quick] [--json]
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402

IN_FEATURES, HIDDEN, CLASSES = 1024, (4096,) * 4, 1024
BATCHES = (256, 8192)
QUICK_BATCHES = (256, 2048)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DATA_BATCHES = 4  # distinct batches cycled through, made once on the device
LR = 1e-4
SEED = 0

ADAMW_SHAPES = [(4096, 4096)] * 6 + [(4096,)] * 6
ADAMW_BYTES_PER_PARAM = 28


def _ours(nn: Any, sizes: tuple[int, ...], name: str, graph: bool) -> Callable[[Any, Any], Any]:
    model = nn.MLP(sizes, "gelu", seed=SEED)
    opt = nn.AdamW(model.parameters(), lr=LR)
    scaler = nn.GradScaler() if nn.PRECISIONS[name].needs_scaler else None
    if graph:
        return nn.Trainer(model, opt, name, scaler, graph=True).step
    return lambda x, labels: nn.train_step(model, opt, x, labels, name, scaler)


def _theirs(torch: Any, nn: Any, sizes: tuple[int, ...], name: str) -> Callable[[Any, Any], Any]:
    from cudalab.nn import torch_twin as TT

    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=SEED))
    opt = torch.optim.AdamW(twin.parameters(), lr=LR, fused=True)
    scaler = TT.torch_grad_scaler(torch, 2.0**16, 2000) if name == "fp16" else None
    return TT.torch_train_step(torch, twin, opt, scaler, name)


def _gelu_forms(nn: Any, batch: int, name: str) -> tuple[list[str], list[str]]:
    """The GELU layers nn.fusion measured for this batch and precision: fused, split."""
    prec = nn.PRECISIONS[name]
    fused, split = [], []
    for key, d in nn.fusion.decisions().items():
        direction, rows, n_in, n_out, dtype, mp = key
        if rows == batch and dtype == prec.compute_dtype.name and mp == prec.matmul_precision:
            (fused if d["fused"] else split).append(f"{direction} {n_in}->{n_out}")
    return fused, split


def _time(timer: Any, one: Callable[[], Any], flops: float, label: str, impl: str,
          name: str) -> tuple[Any, Any]:
    """(loop-paced measurement, GPU-only measurement) of one step."""
    loop = timer.replace(hold=False).measure(one, flops=flops, label=label, sub_label=name,
                                             description=impl)
    gpu = timer.measure(one, flops=flops, label=label, sub_label=name, description=impl)
    return loop, gpu


def mlp_rows(cudalab: Any, torch: Any, timer: Any, batch: int) -> list[dict]:
    from cudalab import nn
    from cudalab.lessons import training as T
    from cudalab.nn import torch_twin as TT

    sizes = (IN_FEATURES, *HIDDEN, CLASSES)
    flops = T.step_flops(sizes, batch)
    batches = T.teacher_batches(sizes, batch, DATA_BATCHES, SEED)
    label = f"mlp_step b{batch}"
    rows: list[dict] = []
    for name in PRECISIONS:
        steps = {"cudalab": (_ours(nn, sizes, name, False), batches),
                 "cudalab graph": (_ours(nn, sizes, name, True), batches)}
        if torch is not None:
            steps["torch"] = (_theirs(torch, nn, sizes, name), TT.torch_batches(torch, batches))
        got = {}
        # TF32 on or off for torch's float32 matmuls (cudalab's come from the precision).
        with TT.Tf32(torch, name == "tf32") if torch is not None else contextlib.nullcontext():
            for impl, (step, data) in steps.items():
                loop, gpu = _time(timer, T.cycle(step, data), flops, label, impl, name)
                got[impl] = row(loop, (batch, *sizes), name, precision=name, batch=batch,
                                gpu_ms=gpu.median * 1e3, gpu_iqr_ms=gpu.iqr * 1e3)
        fused, split = _gelu_forms(nn, batch, name)
        for impl in ("cudalab", "cudalab graph"):
            got[impl].update(gelu_fused=fused, gelu_split=split)
        if "torch" in got:
            for impl, r in got.items():
                if impl != "torch":
                    r["vs_torch"] = got["torch"]["median_ms"] / r["median_ms"]
                    r["gpu_vs_torch"] = got["torch"]["gpu_ms"] / r["gpu_ms"]
        rows += got.values()
        cudalab.synchronize()
        cudalab.empty_cache()
    return rows


def adamw_rows(cudalab: Any, torch: Any, timer: Any) -> list[dict]:
    import numpy as np
    from cudalab import nn

    numel = sum(int(np.prod(s)) for s in ADAMW_SHAPES)
    nbytes = ADAMW_BYTES_PER_PARAM * numel
    params = [nn.Parameter(f"p{i}", cudalab.random.normal(s, seed=i))
              for i, s in enumerate(ADAMW_SHAPES)]
    for i, p in enumerate(params):  # before the optimizer, which may keep the grad arrays
        p.grad = cudalab.random.normal(p.shape, seed=100 + i)
    opt = nn.AdamW(params, lr=1e-3)
    shape = (numel,)
    m = timer.measure(opt.step, bytes=nbytes, ceiling="copy", label="adamw_step",
                      sub_label="100.7M params", description="cudalab")
    rows = [row(m, shape, "float32")]
    if torch is not None:
        tp = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in ADAMW_SHAPES]
        for t in tp:
            t.grad = torch.randn_like(t)
        topt = torch.optim.AdamW(tp, lr=1e-3, fused=True)
        mt = timer.measure(topt.step, bytes=nbytes, ceiling="copy", label="adamw_step",
                           sub_label="100.7M params", description="torch fused")
        rows.append(row(mt, shape, "float32"))
        rows[0]["vs_torch"] = mt.median / m.median
    return rows


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_nn")
    import cudalab
    from cudalab.bench import Timer

    torch = torch_cuda()
    timer = Timer(preset(quick))
    rows = adamw_rows(cudalab, torch, timer)
    cudalab.synchronize()
    cudalab.empty_cache()
    for batch in (QUICK_BATCHES if quick else BATCHES):
        rows += mlp_rows(cudalab, torch, timer, batch)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        f"{'op':<16} {'impl':<14} {'variant':<14} {'step ms':>9} {'IQR':>7} {'gpu ms':>8} "
        f"{'TFLOP/s':>8} {'GB/s':>7} {'% copy':>7} {'vs torch':>9}"
    ]
    for r in rows:
        ratio = r.get("vs_torch")
        lines.append(
            f"{r['op']:<16} {r['impl']:<14} {str(r.get('variant', '')):<14} "
            f"{r['median_ms']:>9.4f} {r['iqr_ms']:>7.4f} "
            f"{r['gpu_ms'] if 'gpu_ms' in r else float('nan'):>8.4f} "
            f"{r.get('tflops') or float('nan'):>8.1f} {r.get('gb_per_s') or float('nan'):>7.0f} "
            f"{r.get('pct_of_ceiling') or float('nan'):>7.1f} "
            f"{'-' if ratio is None else format(ratio, '.3f'):>9}"
            + (f"  ({r['warning']})" if r.get("warning") else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(run, table))
