"""ResNet-50 inference helpers shared by lesson ``inference``, ``cudalab inference``
and benchmarks/bench_resnet.py.

* argument parsing: batch sizes (``"1,8,16,32"``) and precisions
  (``"fp16"``, ``"fp32,bf16"``, dtype names accepted);
* rates: images per second, % of a GEMM ceiling;
* the PyTorch twin: torchvision's ``resnet50()`` holding our weights (copied
  in through its ``state_dict``), in each precision, NCHW or channels_last,
  eager or replayed from a ``torch.cuda.CUDAGraph``, with torch's TF32 and
  cuDNN settings pinned for the precision and restored after.

Nothing here needs a GPU at import time; torch and torchvision are optional.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from ..nn.precision import PRECISIONS as _NN_PRECISIONS

__all__ = ["CEILING_OF", "DTYPE_OF", "MAX_BATCH", "PRECISIONS", "TorchPrecision", "TorchTwin", "torch_session",
           "check_batch_sizes", "check_precisions", "images", "images_per_s",
           "parse_batch_sizes", "parse_precisions", "pct_of_peak", "torch_resnet50",
           "torchvision_or_none"]

# cudalab.models' precisions (cudalab.nn's names), and the dtype each stores
# activations and weights in.
PRECISIONS = tuple(_NN_PRECISIONS)
DTYPE_OF = {name: str(p.compute_dtype) for name, p in _NN_PRECISIONS.items()}
# The measured GEMM ceiling a precision's convolutions are compared with.
CEILING_OF = {"fp32": "matmul_float32", "tf32": "matmul_tf32", "fp16": "matmul_float16",
              "bf16": "matmul_bfloat16"}
# Other spellings accepted on the command line.
ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
           "tfloat32": "tf32"}
# The largest batch the lesson and the command take (the "up to 256").
MAX_BATCH = 256
# ImageNet's input size.
IMAGE_SIZE = 224


# ---- arguments ----------------------------------------------------------------------------


def check_batch_sizes(values: Iterable[Any], what: str = "batch_sizes") -> tuple[int, ...]:
    """check_batch_sizes(values) -> tuple of int

    Batch sizes as given (order kept, repeats dropped), each an int in
    [1, MAX_BATCH].

    Raises
    ------
    ValueError
        Empty, or a size out of range or not an integer.
    """
    out: list[int] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{what}: expected integers, got {v!r}")
        if not 1 <= int(v) <= MAX_BATCH:
            raise ValueError(f"{what}: each batch size must be in 1..{MAX_BATCH}, got {int(v)}")
        if int(v) not in out:
            out.append(int(v))
    if not out:
        raise ValueError(f"{what}: expected at least one batch size")
    return tuple(out)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """parse_batch_sizes("1,8,16,32") -> (1, 8, 16, 32)

    A comma list of batch sizes, each in [1, MAX_BATCH] (spaces allowed,
    repeats dropped, order kept).

    Raises
    ------
    ValueError
        An item is not an integer or is out of range, or the list is empty.
    """
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ValueError(f"batch sizes: expected integers, got {item!r}") from None
    return check_batch_sizes(values, "batch sizes")


def check_precisions(values: Iterable[Any], what: str = "precisions") -> tuple[str, ...]:
    """check_precisions(values) -> tuple of str

    Precisions among PRECISIONS (dtype names such as ``float16`` accepted),
    order kept, repeats dropped.
    """
    out: list[str] = []
    for v in values:
        name = ALIASES.get(str(v).strip().lower(), str(v).strip().lower())
        if name not in PRECISIONS:
            raise ValueError(f"{what}: unknown precision {v!r}; expected "
                             f"{', '.join(PRECISIONS)}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"{what}: expected at least one precision")
    return tuple(out)


def parse_precisions(text: str) -> tuple[str, ...]:
    """parse_precisions("fp32,fp16") -> ("fp32", "fp16")"""
    return check_precisions([t for t in str(text).split(",") if t.strip()], "precisions")


# ---- rates ---------------------------------------------------------------------------------


def images_per_s(batch: int, seconds: float) -> float:
    """Images per second of a forward over `batch` images taking `seconds` (inf at 0 s)."""
    return batch / seconds if seconds > 0 else float("inf")


def pct_of_peak(flops: float, seconds: float, peak_flops: float | None) -> float | None:
    """100 * (flops / seconds) / peak_flops, or None without a peak or a time."""
    if not peak_flops or seconds <= 0:
        return None
    return 100.0 * flops / seconds / peak_flops


def images(seed: int, batch: int) -> np.ndarray:
    """(batch, 224, 224, 3) float32 NHWC, standard normal: already-normalised images."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)


# ---- the PyTorch twin ----------------------------------------------------------------------


def torchvision_or_none() -> Any:
    """torchvision when it imports (with a torch it was built for), else None."""
    try:
        import torchvision
    except Exception:  # missing, or built for another torch: no torch columns either way
        return None
    return torchvision


def torch_resnet50(torch: Any, torchvision: Any, state: Mapping[str, np.ndarray]) -> Any:
    """torchvision's ``resnet50()`` on the CPU in eval mode, holding `state`'s weights.

    The weights are copied into the module's own ``state_dict`` tensors, key
    by key (``num_batches_tracked`` keeps torch's value, eval mode never
    reads it).
    """
    module = torchvision.models.resnet50()
    tensors = module.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            tensors[key].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return module.eval()


class TorchPrecision:
    """``with TorchPrecision(torch, precision):`` TF32 on only for "tf32" (matmul and
    cuDNN), cuDNN autotuning on; torch's previous settings restored after."""

    def __init__(self, torch: Any, precision: str) -> None:
        self.torch = torch
        self.tf32 = precision == "tf32"

    def __enter__(self) -> TorchPrecision:
        b = self.torch.backends
        self.saved = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark)
        b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = self.tf32
        b.cudnn.benchmark = True
        return self

    def __exit__(self, *exc: Any) -> None:
        b = self.torch.backends
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark = self.saved


def _torch_dtype(torch: Any, precision: str) -> Any:
    return getattr(torch, DTYPE_OF[precision])


class TorchTwin:
    """TorchTwin(torch, cpu_module, precision)

    The torchvision model in one precision on the GPU, twice: NCHW
    (``"eager"``) and channels_last (``"channels_last"``); fp16 and bf16 run
    the whole model in that dtype (``module.to(dtype)``, as the tutorial's
    ``model.half()``). Call inside `TorchPrecision` and ``torch.no_grad()``.
    """

    MODES = ("eager", "channels_last", "graph")

    def __init__(self, torch: Any, cpu_module: Any, precision: str) -> None:
        self.torch = torch
        self.dtype = _torch_dtype(torch, precision)
        nchw = copy.deepcopy(cpu_module).to(device="cuda", dtype=self.dtype)
        cl = copy.deepcopy(cpu_module).to(device="cuda", dtype=self.dtype)
        self.modules = {"eager": nchw, "channels_last": cl.to(memory_format=torch.channels_last)}

    def inputs(self, x_nhwc: np.ndarray) -> dict[str, Any]:
        """The batch as torch wants it per mode: NCHW contiguous, and channels_last."""
        t = self.torch.from_numpy(np.ascontiguousarray(x_nhwc)).to("cuda")
        t = t.permute(0, 3, 1, 2).to(self.dtype)  # NCHW shape, NHWC strides
        return {"eager": t.contiguous(),
                "channels_last": t.contiguous(memory_format=self.torch.channels_last)}

    def call(self, mode: str, x: Any) -> Callable[[], Any]:
        module = self.modules[mode]
        return lambda: module(x)

    def graph(self, x_cl: Any, warmup: int = 3) -> tuple[Callable[[], None], Any]:
        """(replay, output): the channels_last forward captured in a CUDA graph
        reading `x_cl` (warmed up on a side stream first, as torch requires)."""
        torch = self.torch
        module = self.modules["channels_last"]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                module(x_cl)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = module(x_cl)
        return g.replay, out

    def release(self) -> None:
        self.modules.clear()
        self.torch.cuda.empty_cache()


@contextlib.contextmanager
def torch_session(torch: Any, cpu_module: Any, precision: str) -> Iterator[TorchTwin | None]:
    """``with torch_session(torch, cpu_module, precision) as twin:`` a `TorchTwin` under
    `TorchPrecision` and ``torch.no_grad()``, released after; None without torch."""
    if torch is None or cpu_module is None:
        yield None
        return
    with TorchPrecision(torch, precision), torch.no_grad():
        twin = TorchTwin(torch, cpu_module, precision)
        try:
            yield twin
        finally:
            twin.release()
