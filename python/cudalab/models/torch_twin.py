"""The PyTorch twin of cudalab.models' ResNet-50, for side-by-side comparisons.

torchvision's ``resnet50()`` holding our weights (copied in through its
``state_dict``), in each precision, NCHW or channels_last, eager or replayed
from a ``torch.cuda.CUDAGraph``, with torch's TF32 and cuDNN settings pinned
for the precision and restored after. Lessons ``inference`` and
``multi_gpu_inference`` and benchmarks/bench_resnet.py measure cudalab's
forward beside it.

torch is never imported here (every function takes the ``torch`` module);
torchvision only by `torchvision_or_none`. Both are optional.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from .. import _precision
from ..nn.precision import PRECISIONS as _NN_PRECISIONS

__all__ = ["DTYPE_OF", "TorchPrecision", "TorchTwin", "torch_resnet50", "torch_session",
           "torchvision_or_none"]

# The torch dtype each of cudalab.models' precisions (cudalab.nn's names) stores
# activations and weights in (the one table's torch_dtype): the twin runs the
# whole model in it.
DTYPE_OF = {name: _precision.resolve(name).torch_dtype for name in _NN_PRECISIONS}


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


class TorchPrecision(_precision.TorchTf32):
    """``with TorchPrecision(torch, precision):`` TF32 on only for "tf32" (matmul and
    cuDNN), cuDNN autotuning on; torch's previous settings restored after."""

    def __init__(self, torch: Any, precision: str) -> None:
        spec = _precision.lookup(precision)
        super().__init__(torch, spec is not None and spec.torch_allow_tf32, cudnn=True)
        self.tf32 = self.on

    def __enter__(self) -> TorchPrecision:
        super().__enter__()
        b = self.torch.backends
        self.saved_benchmark = b.cudnn.benchmark
        b.cudnn.benchmark = True
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.torch.backends.cudnn.benchmark = self.saved_benchmark


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
