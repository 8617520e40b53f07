"""Lesson 28 `compilers`: graph compilers beside cudalab's compiled programs.

The guides name TorchScript ("JIT compilation"), torch.compile, ONNX Runtime
and TensorRT as the way to make a model faster. cudalab compiles too: its
ResNet-50 is a program planned once per batch shape (54 cuBLASLt GEMMs with
BatchNorm folded and bias, ReLU and the residual add in their epilogues),
issued by one C call or replayed from a CUDA graph, and its MLP training
step can be captured in a CUDA graph (`nn.Trainer(graph=True)`). The lesson
runs, on the same GPU with the same weights and inputs:

* ResNet-50 inference: cudalab's program (eager and graph), torchvision's
  model in PyTorch eager (NCHW, channels_last, a CUDA graph), and the
  compiled forms asked for in `resnet_modes`: torch.compile in a mode
  (``default``, ``reduce-overhead``, ``max-autotune``), TorchScript frozen
  (``jit``), ONNX Runtime's CUDA execution provider (``onnxruntime``) and
  TensorRT through torch_tensorrt (``tensorrt``) where installed;
* the MLP training step: cudalab's `train_step` and its CUDA graph against
  PyTorch eager and torch.compile of the same step in `mlp_modes`.

Every variant's wall-clock cost of getting ready (building or compiling and
its first calls, less what those calls take once warm) is a row beside its
time per call, and a finding gives the calls after which compiling pays off.
Every variant's output is checked: ResNet-50 logits against cudalab's at the
same batch (and cudalab's against the float32 NumPy reference), the MLP's
first loss against float64 NumPy. Compiling ResNet-50 costs tens of seconds
on a fresh inductor cache (max-autotune minutes), so the default run keeps
to the modes its time budget affords and says which it left out.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn

from ..models import torch_twin as TW
# Getting ready is timed as bench_resnet and lesson inference time it: one shared place.
from ..models.torch_twin import COMPILE_MODES, FIRST_CALLS, compiling, setup_cost
from ..nn import torch_twin as TT
from . import resnet as R
from . import training as T
from . import _params as P
from ._measuring import break_even_uses, host_time, rel_error
from .inference import TOLERANCE
from .registry import LessonCheckError, LessonRun, lesson

# What `resnet_modes` may name: torch.compile's modes and the other compilers.
RESNET_MODES = (*COMPILE_MODES, "jit", "onnxruntime", "tensorrt")
MLP_MODES = COMPILE_MODES
# The full run's compiled ResNet-50 forms: what fits 120 s on a fresh machine. torch.compile
# default of ResNet-50 takes ~30-60 s per batch shape on an empty cache; max-autotune
# benchmarks every GEMM/conv choice (minutes), reduce-overhead compiles as default again,
# and a TensorRT engine build takes about a minute. max-autotune of the MLP step alone took
# 142 s on an H200 with an empty cache, so the full run leaves it out too.
FULL_RESNET_MODES = ("default", "jit", "onnxruntime")
FULL_MLP_MODES = ("default",)
# Modes that replay CUDA graphs (what they add to default's fusion).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
# The MLP step's precisions: fp16 needs a loss scaler (lesson `amp`), which in PyTorch
# reads found_inf on the host every step and would break the compiled graph.
MLP_PRECISIONS = ("fp32", "tf32", "bf16")
# A compiled variant "wins" when its baseline takes at least this many times as long.
COMPILE_WINS = 1.05
# A CUDA graph "helps" (the work is launch-bound) from this ratio of eager to replay on.
GRAPH_HELPS = 1.1
# cudalab within this fraction of torch's speed either way counts as level.
LEVEL = 0.95
# ResNet-50 logits of any variant against cudalab's at the same batch, relative to the
# largest |logit|: each is within TOLERANCE of the float32 reference, so within twice that
# of each other.
TOL_VS_CUDALAB = {name: 2 * tol for name, tol in TOLERANCE.items()}
# The MLP's first loss (initial weights, first batch) against float64 NumPy, per precision:
# float32 GEMMs, TF32's 10-bit mantissa, bf16's 7 bits through the logits.
MLP_LOSS_TOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}
# A CUDA-graph replay runs the very kernels of the eager forward on the same images.
TOL_REPLAY = 1e-6
# Teacher batches the MLP steps cycle through.
MLP_BATCHES = 8
SEED = 0
ROW_KEYS = ("part", "impl", "variant", "batch", "ms", "per_s", "setup_s", "break_even_calls",
            "vs", "timer")
EVENTS = "CUDA events, loop-paced"
HOST = "host clock around the call and a synchronize"


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def baseline_of(part: str, impl: str, variant: str) -> tuple[str, str] | None:
    """The (impl, variant) that a compiled variant of `part` ("resnet" or "mlp") replaces,
    whose per-call time it must beat to pay for its setup; None for a variant that
    replaces nothing measured here (cudalab's eager program, torch's eager models)."""
    if impl == "cudalab":
        return ("cudalab", "eager") if variant == "graph" else None
    if variant in ("eager", "channels_last"):
        return None
    return ("torch", "channels_last") if part == "resnet" else ("torch", "eager")


def variant_label(part: str, impl: str, variant: str, batch: int) -> str:
    """A measurement label: 'resnet graph b128' (cudalab), 'torch resnet compile default
    b128', 'onnxruntime resnet b128', 'mlp step graph', 'torch mlp step compile default'."""
    head = "" if impl == "cudalab" else f"{impl} "
    if part == "mlp":  # one batch size
        return f"{head}mlp step {variant}"
    tail = "" if impl in ("onnxruntime", "tensorrt") else f" {variant}"
    return f"{head}resnet{tail} b{batch}"


def torch_twin_label(label: str) -> str | None:
    """cudalab's label of the same work for torch labels the naming rules do not pair:
    channels_last and TorchScript pair with cudalab's eager program, compiled modes with
    its CUDA graph (compiled beside compiled)."""
    if label.startswith("torch resnet "):
        rest = label[len("torch resnet "):]
        variant, _, batch = rest.rpartition(" ")
        if variant in ("channels_last", "jit"):
            return f"resnet eager {batch}"
        if variant.startswith("compile "):
            return f"resnet graph {batch}"
    if label.startswith("torch mlp step compile "):
        return "mlp step graph"
    return None


def break_even_text(what: str, setup_s: float, base: str, base_s: float,
                    fast_s: float) -> tuple[int | None, str]:
    """(calls after which paying `setup_s` once beats running `base`, one sentence)."""
    n = break_even_uses(setup_s, base_s, fast_s)
    head = (f"{what}: {setup_s:.2f} s to get ready, then {fast_s * 1e3:.3f} ms per call vs "
            f"{base}'s {base_s * 1e3:.3f} ms")
    if n is None:
        return None, head + ": not faster per call, so the setup never pays off"
    return n, head + f": pays off after {n:,} calls"


def versus_text(where: str, ours: str, ours_s: float, theirs: str,
                theirs_s: float) -> tuple[float, str]:
    """(theirs / ours, one sentence): above 1, cudalab is faster."""
    ratio = theirs_s / ours_s if ours_s > 0 else float("inf")
    head = (f"{where}: cudalab {ours} {ours_s * 1e3:.3f} ms vs {theirs} "
            f"{theirs_s * 1e3:.3f} ms: ")
    if ratio >= 1 / LEVEL:
        return ratio, head + f"cudalab {ratio:.2f}x faster"
    if ratio >= LEVEL:
        return ratio, head + "level"
    return ratio, head + f"torch.compile {1 / ratio:.2f}x faster"


def why_text(where: str, mode: str, eager_s: float, compiled_s: float,
             graph_s: float | None) -> tuple[float, str]:
    """(eager / compiled, one sentence on where torch.compile's gain comes from).

    `graph_s` is the same eager model replayed from a CUDA graph (no fusion, no
    launches): what launch overhead alone costs.
    """
    gain = eager_s / compiled_s if compiled_s > 0 else float("inf")
    head = (f"{where}: torch.compile {mode} {compiled_s * 1e3:.3f} ms vs eager "
            f"{eager_s * 1e3:.3f} ms ({gain:.2f}x)")
    launch = None if graph_s is None or graph_s <= 0 else eager_s / graph_s
    graphs = mode in CUDAGRAPH_MODES
    if launch is not None and launch >= GRAPH_HELPS:
        head += f"; a CUDA graph of the eager model alone gives {launch:.2f}x"
        if not graphs and gain < launch:
            return gain, (head + ": the work is launch-bound here, so a mode that replays CUDA "
                          "graphs (reduce-overhead, max-autotune) would gain more than fusion")
    if gain >= COMPILE_WINS:
        how = ("fused kernels (fewer launches and memory passes) replayed from CUDA graphs"
               if graphs else "fused kernels: fewer launches and fewer passes over memory")
        return gain, head + f": compile wins by {how}"
    # Without a graph of the eager model there is no measured split of the time into launches
    # and kernels, so say only what was measured.
    return gain, head + (": no gain: the compiled form is no faster than eager at this size")


def check_modes(lesson_name: str, p: Mapping[str, Any], name: str,
                allowed: Sequence[str]) -> tuple[str, ...]:
    """A sequence (possibly empty) of distinct names from `allowed`."""
    v = p[name]
    if (isinstance(v, (str, bytes)) or not hasattr(v, "__len__")
            or not all(isinstance(x, str) and x in allowed for x in v)
            or len(set(v)) != len(v)):
        raise ValueError(f"lesson {lesson_name!r}: {name} must be a sequence of distinct names "
                         f"among {', '.join(allowed)} (empty: none), got {v!r}")
    return tuple(v)


def check_params(p: Mapping[str, Any]) -> dict[str, Any]:
    """The lesson's parameters, checked: ResNet batches, compile batches (a subset),
    precision, modes, the MLP's sizes and precision."""
    batches = R.check_batch_sizes(p["batch_sizes"], "lesson 'compilers': batch_sizes")
    compile_batches = R.check_batch_sizes(p["compile_batch_sizes"],
                                          "lesson 'compilers': compile_batch_sizes")
    missing = [b for b in compile_batches if b not in batches]
    if missing:
        raise ValueError(f"lesson 'compilers': compile_batch_sizes must be among batch_sizes "
                         f"{batches} (the eager baselines), got {missing}")
    [precision] = R.check_precisions([p["precision"]], "lesson 'compilers': precision")
    resnet_modes = check_modes("compilers", p, "resnet_modes", RESNET_MODES)
    mlp_modes = check_modes("compilers", p, "mlp_modes", MLP_MODES)
    sizes = T.check_sizes("compilers", p)
    T.check_positive("compilers", p, "batch")
    if p["mlp_precision"] not in MLP_PRECISIONS:
        raise ValueError(f"lesson 'compilers': mlp_precision must be one of "
                         f"{', '.join(MLP_PRECISIONS)} (fp16 needs a loss scaler: see lesson "
                         f"'amp'), got {p['mlp_precision']!r}")
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'compilers': lr must be a number in (0, 1), got {lr!r}")
    P.seed("compilers", p)
    return {"batches": batches, "compile_batches": compile_batches, "precision": precision,
            "resnet_modes": resnet_modes, "mlp_modes": mlp_modes, "sizes": sizes,
            "batch": int(p["batch"])}


def backend_status(module: str, torch: Any = None) -> tuple[bool, str]:
    """(usable, why) for an optional compiler: 'onnxruntime' (needs its
    CUDAExecutionProvider) or 'tensorrt' (torch_tensorrt, needs torch)."""
    name = {"onnxruntime": "onnxruntime", "tensorrt": "torch_tensorrt"}[module]
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # missing, or built for another torch / CUDA
        what = "not installed" if isinstance(exc, ImportError) else "does not import"
        return False, f"{name} {what} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    version = getattr(mod, "__version__", "?")
    if module == "onnxruntime":
        providers = list(mod.get_available_providers())
        if "CUDAExecutionProvider" not in providers:
            return False, (f"onnxruntime {version} is installed without CUDAExecutionProvider "
                           f"(it has {', '.join(providers)}): install onnxruntime-gpu")
    elif torch is None:
        return False, f"torch_tensorrt {version} is installed but torch sees no GPU"
    return True, f"{name} {version}"


def failure_text(what: str, exc: BaseException) -> str:
    """One line on a compiler that failed: its error's type and first line."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{what} failed, so it has no row: {type(exc).__name__}: {first}"


# ---- one variant: getting ready, then timing --------------------------------------------


class Variant:
    """One timed variant: where it ran, its Measurement, what getting ready cost."""

    def __init__(self, part: str, impl: str, variant: str, batch: int, m: Any,
                 first_s: float, timer: str) -> None:
        self.part, self.impl, self.variant, self.batch = part, impl, variant, batch
        self.m, self.timer = m, timer
        self.setup_s = setup_cost(first_s, FIRST_CALLS, m.median)

    @property
    def key(self) -> tuple[str, str, str, int]:
        return self.part, self.impl, self.variant, self.batch


def _timed(r: LessonRun, label: str, fn: Callable[[], Any], flops: float | None,
           on_host: bool) -> Any:
    """GPU time per call, loop-paced (no spin-kernel hold: what a serving or training loop
    sees), or the host clock for work on another library's own stream."""
    if on_host:
        return host_time(r, label, fn)
    m = r.timer.replace(hold=False).measure(fn, flops=flops, ceiling=None, label=label)
    return r.add(m, label)


# ---- ResNet-50 inference -----------------------------------------------------------------


class ResnetRun:
    """The ResNet-50 side: one set of weights and images, cudalab's model, torch's twin."""

    def __init__(self, r: LessonRun, cfg: Mapping[str, Any], notes: list[str]) -> None:
        from .. import models

        self.r, self.cfg, self.notes = r, cfg, notes
        self.precision = cfg["precision"]
        self.state = models.init_weights(seed=SEED)
        self.params = models.fold(self.state)
        self.x_h = R.images(SEED, max(cfg["batches"]))
        self.ref1 = models.reference.forward(self.params, self.x_h[:1])
        self.model: Any = None
        self.logits: dict[int, np.ndarray] = {}  # cudalab's eager logits per batch
        self.variants: list[Variant] = []

    def add(self, impl: str, variant: str, b: int, fn: Callable[[], Any], first_s: float,
            on_host: bool = False) -> Variant:
        label = variant_label("resnet", impl, variant, b)
        m = _timed(self.r, label, fn, self.model.gemm_flops(b), on_host)
        v = Variant("resnet", impl, variant, b, m, first_s, HOST if on_host else EVENTS)
        self.variants.append(v)
        return v

    def check(self, what: str, got: np.ndarray, b: int) -> None:
        self.r.check(f"{what} b{b}: logits vs cudalab's eager program (same weights, same "
                     f"images), relative to max |logit|", rel_error(got, self.logits[b]),
                     TOL_VS_CUDALAB[self.precision])

    # -- cudalab --

    def ours(self) -> None:
        from .. import models

        self.model = models.resnet50(self.state, precision=self.precision)
        sync = cudalab.synchronize
        for b in self.cfg["batches"]:
            x = cudalab.asarray(self.x_h[:b])
            out = cudalab.empty((b, 1000), dtype="float32")
            first_s, logits, _ = TW.first_calls(lambda: self.model.forward(x, out=out), sync,
                                              lambda a: a.get())
            self.logits[b] = logits
            if b == self.cfg["batches"][0]:
                self.r.check(f"cudalab {self.precision} logits of image 0 vs the float32 NumPy "
                             f"reference, relative to max |logit|",
                             rel_error(logits[:1], self.ref1), TOLERANCE[self.precision])
            self.add("cudalab", "eager", b, lambda: self.model.forward(x, out=out), first_s)

            def capture() -> Callable[[], Any]:
                g = self.model.capture(b)
                cudalab.copyto(g.input, x)  # the graph reads its own input buffer
                return g.replay
            first_s, replayed, replay = TW.first_calls(None, sync, lambda a: a.get(),
                                                     make=capture)
            self.r.check(f"cudalab graph replay b{b} vs its eager forward",
                         rel_error(replayed, logits), TOL_REPLAY)
            self.add("cudalab", "graph", b, replay, first_s)
            del replay
            self.model.release(b)  # this batch's program and workspace are done with

    # -- torch --

    def theirs(self, torch: Any) -> None:
        tv = TW.torchvision_or_none()
        if tv is None:
            self.notes.append("torchvision does not import: no torch ResNet-50 rows")
            return
        cpu_module = TW.torch_resnet50(torch, tv, self.state)
        sync = torch.cuda.synchronize
        with TW.torch_session(torch, cpu_module, self.precision) as twin:
            made: dict[str, Any] = {}  # TorchScript made once, reused at other batches (the
            # twin keeps torch.compile's model per mode: recompiled at a new batch shape)
            for b in self.cfg["batches"]:
                inputs = twin.inputs(self.x_h[:b])
                keep = TW.host_copy
                for mode in ("eager", "channels_last"):
                    fn = twin.call(mode, inputs[mode])
                    first_s, got, _ = TW.first_calls(fn, sync, keep)
                    self.check(f"torch {mode}", got, b)
                    self.add("torch", mode, b, fn, first_s)
                first_s, got, replay = TW.first_calls(
                    None, sync, keep, make=lambda: _graph_call(twin, inputs["channels_last"]))
                self.check("torch graph", got, b)
                self.add("torch", "graph", b, replay, first_s)
                if b in self.cfg["compile_batches"]:
                    for mode in self.cfg["resnet_modes"]:
                        self._compiled(torch, twin, inputs, b, mode, made)

    def _compiled(self, torch: Any, twin: Any, inputs: dict, b: int, mode: str,
                  made: dict) -> None:
        sync, x_cl = torch.cuda.synchronize, inputs["channels_last"]
        module = twin.modules["channels_last"]
        try:
            if mode in COMPILE_MODES:
                def make() -> Callable[[], Any]:  # compiled once per mode, as bench_resnet's
                    return twin.compiled_call(mode, x_cl)
                label, on_host = f"compile {mode}", False
            elif mode == "jit":
                def make() -> Callable[[], Any]:
                    if mode not in made:
                        made[mode] = _torchscript(torch, module, x_cl)
                    return lambda: made[mode](x_cl)
                label, on_host = "jit", False
            else:
                name = "ONNX Runtime" if mode == "onnxruntime" else "TensorRT"
                ok, why = backend_status(mode, torch)
                if not ok:
                    self.notes.append(f"{name}: {why}")
                    return
                label, on_host = mode, mode == "onnxruntime"  # ORT runs on its own stream

                def make() -> Callable[[], Any]:
                    if mode == "onnxruntime":
                        return _onnxruntime(torch, module, inputs["eager"])
                    return _tensorrt(torch, module, x_cl, twin.dtype)
            first_s, got, fn = TW.first_calls(None, sync, TW.host_copy, make=make)
        except LessonCheckError:
            raise
        except Exception as exc:  # an optional compiler that does not handle this model here
            self.notes.append(failure_text(f"{mode} at batch {b}", exc))
            return
        impl = label if label in ("onnxruntime", "tensorrt") else "torch"
        self.check(label, got, b)
        self.add(impl, label, b, fn, first_s, on_host)


def _graph_call(twin: Any, x_cl: Any) -> Callable[[], Any]:
    replay, out = twin.graph(x_cl)

    def call() -> Any:
        replay()
        return out
    return call


def _torchscript(torch: Any, module: Any, x: Any) -> Any:
    """TorchScript of `module`, frozen (weights inlined, conv + BatchNorm folded): scripted,
    or traced on `x` where scripting fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notices
        try:
            scripted = torch.jit.script(module)
        except Exception:
            scripted = torch.jit.trace(module, x)
        return torch.jit.freeze(scripted.eval())


def _onnxruntime(torch: Any, module: Any, x: Any) -> Callable[[], Any]:
    """`module` exported to ONNX (static shapes) and run by ONNX Runtime's CUDA execution
    provider on `x`'s memory through an IO binding (no host copies); returns the call."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resnet50.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(module, (x,), path, input_names=["x"], output_names=["y"],
                                  dynamo=False)
            except TypeError:  # a torch whose export has no `dynamo` argument
                torch.onnx.export(module, (x,), path, input_names=["x"], output_names=["y"])
        device = x.device.index or 0
        sess = ort.InferenceSession(path, providers=[("CUDAExecutionProvider",
                                                      {"device_id": device})])
    if "CUDAExecutionProvider" not in sess.get_providers():
        raise RuntimeError(f"the session fell back to {sess.get_providers()}")
    np_dtype = {torch.float16: np.float16, torch.float32: np.float32}.get(x.dtype)
    if np_dtype is None:
        raise RuntimeError(f"no ONNX Runtime binding for {x.dtype} here")
    out = torch.empty((x.shape[0], 1000), dtype=x.dtype, device=x.device)
    binding = sess.io_binding()
    binding.bind_input("x", "cuda", device, np_dtype, tuple(x.shape), x.data_ptr())
    binding.bind_output("y", "cuda", device, np_dtype, tuple(out.shape), out.data_ptr())

    def call() -> Any:
        sess.run_with_iobinding(binding)
        return out
    return call


def _tensorrt(torch: Any, module: Any, x: Any, dtype: Any) -> Callable[[], Any]:
    """`module` built into a TensorRT engine for `x`'s shape by torch_tensorrt."""
    import torch_tensorrt

    engine = torch_tensorrt.compile(module, ir="dynamo", inputs=[x],
                                    enabled_precisions={dtype})
    return lambda: engine(x)


# ---- the MLP training step -----------------------------------------------------------------


class MlpRun:
    """The training side: the same MLP, weights and batches for every variant."""

    def __init__(self, r: LessonRun, cfg: Mapping[str, Any]) -> None:
        p = r.params
        self.r, self.cfg = r, cfg
        self.sizes, self.precision = cfg["sizes"], p["mlp_precision"]
        self.batch, self.seed, self.lr = p["batch"], p["seed"], p["lr"]
        self.batches = T.teacher_batches(self.sizes, self.batch, MLP_BATCHES, self.seed)
        fresh = nn.MLP(self.sizes, "gelu", seed=self.seed)
        x, labels = self.batches[0]
        self.numpy_loss = T.numpy_loss(fresh, x.get(), labels.get())
        self.flops = T.step_flops(self.sizes, self.batch)
        self.variants: list[Variant] = []

    def add(self, impl: str, variant: str, fn: Callable[[], Any], first_s: float,
            first_loss: float) -> None:
        self.r.check(f"{impl} {variant} step: first loss (initial weights, first batch) vs "
                     f"float64 NumPy, {self.precision}",
                     rel_error(np.float64(first_loss), self.numpy_loss),
                     MLP_LOSS_TOL[self.precision])
        label = variant_label("mlp", impl, variant, self.batch)
        m = _timed(self.r, label, fn, self.flops, False)
        self.variants.append(Variant("mlp", impl, variant, self.batch, m, first_s, EVENTS))

    def _model(self) -> tuple[Any, Any]:
        model = nn.MLP(self.sizes, "gelu", seed=self.seed)
        return model, nn.AdamW(model.parameters(), lr=self.lr)

    def ours(self) -> None:
        model, opt = self._model()
        prec = self.precision

        def step(x: Any, labels: Any) -> Any:
            return nn.train_step(model, opt, x, labels, prec, None)
        fn = T.cycle(step, self.batches)
        first_s, loss, _ = TW.first_calls(fn, cudalab.synchronize, lambda a: a.get())
        self.add("cudalab", "eager", fn, first_s, float(loss))
        model, opt = self._model()
        trainer = nn.Trainer(model, opt, prec, None, graph=True)
        fn = T.cycle(trainer.step, self.batches)
        first_s, loss, _ = TW.first_calls(fn, cudalab.synchronize, lambda a: a.get())
        self.add("cudalab", "graph", fn, first_s, float(loss.reshape(-1)[0]))

    def theirs(self, torch: Any, notes: list[str]) -> None:
        tb = TT.torch_batches(torch, self.batches)
        with TT.Tf32(torch, self.precision == "tf32"):
            for mode in ("eager", *self.cfg["mlp_modes"]):
                variant = "eager" if mode == "eager" else f"compile {mode}"
                try:
                    step = self._torch_step(torch, None if mode == "eager" else mode)
                    fn = T.cycle(step, tb)
                    first_s, loss, _ = TW.first_calls(fn, torch.cuda.synchronize,
                                                    lambda t: float(t))
                except LessonCheckError:
                    raise
                except Exception as exc:
                    notes.append(failure_text(f"torch.compile {mode} of the MLP step", exc))
                    continue
                self.add("torch", variant, fn, first_s, loss)

    def _torch_step(self, torch: Any, mode: str | None) -> Callable[[Any, Any], Any]:
        """PyTorch's step of a fresh twin: the forward and loss (compiled in `mode`, backward
        included through AOTAutograd), then fused AdamW."""
        model, _ = self._model()
        twin = TT.torch_twin(torch, model)
        opt = TT.torch_adamw(torch, twin.parameters(), self.lr)
        dtype = torch.bfloat16 if self.precision == "bf16" else None
        ce = torch.nn.functional.cross_entropy

        def loss_of(x: Any, labels: Any) -> Any:
            if dtype is None:
                return ce(twin(x), labels)
            with torch.autocast("cuda", dtype=dtype):
                return ce(twin(x), labels)
        if mode is not None:
            loss_of = torch.compile(loss_of, mode=mode, dynamic=False)

        def step(x: Any, labels: Any) -> Any:
            opt.zero_grad(set_to_none=True)
            loss = loss_of(x, labels)
            loss.backward()
            opt.step()
            return loss.detach().clone()  # CUDA-graph modes reuse the loss's buffer
        return step


# ---- rows and findings ----------------------------------------------------------------------


def _rows_and_break_even(r: LessonRun, variants: Sequence[Variant]) -> None:
    by_key = {v.key: v for v in variants}
    for v in variants:
        base = baseline_of(v.part, v.impl, v.variant)
        b = by_key.get((v.part, *base, v.batch)) if base is not None else None
        n = None
        if b is not None:
            what = variant_label(v.part, v.impl, v.variant, v.batch)
            n, text = break_even_text(what, v.setup_s, f"{b.impl} {b.variant}", b.m.median,
                                      v.m.median)
            if (v.impl, v.variant) != ("torch", "graph"):  # a graph, not a compiler
                r.finding(text, value=n, unit="calls", labels=(v.m.label, b.m.label))
        per = v.batch / v.m.median if v.m.median > 0 else float("inf")
        r.row(part="resnet50" if v.part == "resnet" else "mlp step", impl=v.impl,
              variant=v.variant, batch=v.batch, ms=v.m.median * 1e3, per_s=per,
              setup_s=v.setup_s, break_even_calls=n,
              vs=None if b is None else f"{b.impl} {b.variant}", timer=v.timer)


def _find(variants: Sequence[Variant], part: str, impl: str, variant: str,
          batch: int) -> Variant | None:
    return next((v for v in variants if v.key == (part, impl, variant, batch)), None)


def _versus_findings(r: LessonRun, variants: Sequence[Variant], cfg: Mapping[str, Any]) -> None:
    """cudalab's compiled program against each torch.compile mode, and where compile's gain
    comes from, per batch."""
    cases = [("resnet", b, f"ResNet-50 {cfg['precision']} batch {b}")
             for b in cfg["compile_batches"]]
    cases.append(("mlp", cfg["batch"], f"MLP training step, batch {cfg['batch']}"))
    for part, b, where in cases:
        ours = [v for v in (_find(variants, part, "cudalab", m, b) for m in ("eager", "graph"))
                if v is not None]
        eager = _find(variants, part, *baseline_of(part, "torch", "compile default"), b)
        tgraph = _find(variants, part, "torch", "graph", b)
        for mode in COMPILE_MODES:
            c = _find(variants, part, "torch", f"compile {mode}", b)
            if c is None or not ours:
                continue
            best = min(ours, key=lambda v: v.m.median)
            ratio, text = versus_text(where, best.variant, best.m.median,
                                      f"torch.compile {mode}", c.m.median)
            r.finding(text, value=ratio, unit="x", labels=(best.m.label, c.m.label))
            if eager is not None:
                gain, text = why_text(where, mode, eager.m.median, c.m.median,
                                      None if tgraph is None else tgraph.m.median)
                labels = (eager.m.label, c.m.label) + (() if tgraph is None else
                                                       (tgraph.m.label,))
                r.finding(text, value=gain, unit="x", labels=labels)


def _claims(r: LessonRun, variants: Sequence[Variant], cfg: Mapping[str, Any]) -> None:
    b = max(cfg["compile_batches"])
    eager = _find(variants, "resnet", "torch", "channels_last", b)
    compiled = [v for v in variants if v.part == "resnet" and v.batch == b
                and baseline_of(v.part, v.impl, v.variant) == ("torch", "channels_last")
                and v.variant != "graph"]
    if eager is not None and compiled:
        best = min(compiled, key=lambda v: v.m.median)
        gain = eager.m.median / best.m.median
        r.claim("A graph compiler (TorchScript, ONNX Runtime, TensorRT, torch.compile) makes "
                "inference faster than the eager model", tutorial=None, measured=gain, unit="x",
                held=gain >= COMPILE_WINS,
                why=f"best compiled form at batch {b}, {best.variant}: {gain:.2f}x torch "
                    f"channels_last; holds from {COMPILE_WINS}x")
    mlp = [v for v in variants if v.part == "mlp" and v.impl == "torch"
           and v.variant.startswith("compile ")]
    eager = next((v for v in variants if v.key[:3] == ("mlp", "torch", "eager")), None)
    if eager is not None and mlp:
        best = min(mlp, key=lambda v: v.m.median)
        gain = eager.m.median / best.m.median
        r.claim("JIT compilation and operator fusion speed up overhead-bound work (a small "
                "model's training step)", tutorial=None, measured=gain, unit="x",
                held=gain >= COMPILE_WINS,
                why=f"torch.compile {best.variant[len('compile '):]} step vs eager: "
                    f"{gain:.2f}x; holds from {COMPILE_WINS}x")


def left_out_text(resnet_modes: Sequence[str], mlp_modes: Sequence[str],
                  quick: bool) -> str:
    """One sentence on the compiled modes this run did not run, and how to run them."""
    rest = [m for m in RESNET_MODES if m not in resnet_modes]
    rest_mlp = [m for m in MLP_MODES if m not in mlp_modes]
    if not rest and not rest_mlp:
        return "Every compiled mode ran"
    parts = []
    if rest:
        parts.append(f"for ResNet-50, {', '.join(rest)}")
    if rest_mlp:
        parts.append(f"for the MLP step, torch.compile {', '.join(rest_mlp)}")
    why = ("quick mode skips torch.compile of ResNet-50 (tens of seconds)" if quick and
           not any(m in resnet_modes for m in COMPILE_MODES) else
           "max-autotune benchmarks every kernel choice (minutes on a fresh cache) and a "
           "TensorRT build takes about a minute")
    sets = [f"--set {name}={','.join(modes)}" for name, modes in
            (("resnet_modes", rest), ("mlp_modes", rest_mlp)) if modes]
    return (f"This run left out {'; '.join(parts)}: {why}. Run them with "
            f"`cudalab lesson compilers {' '.join(sets)}`")


# ---- the lesson -------------------------------------------------------------------------------


@lesson(28, "compilers",
        title="Graph compilers: torch.compile, TorchScript, ONNX Runtime, TensorRT vs "
              "cudalab's compiled programs",
        seed="step-by-step guide, Phase 4 inference optimization (TorchScript, ONNX Runtime, "
             "TensorRT); Colab notebook's summary (overhead-bound work: tracing, operator "
             "fusion, JIT compilation)",
        params={"batch_sizes": (1, 128), "compile_batch_sizes": (128,), "precision": "fp16",
                "resnet_modes": FULL_RESNET_MODES, "mlp_modes": FULL_MLP_MODES,
                "in_features": 256, "hidden": (1024, 1024), "classes": 16, "batch": 1024,
                "mlp_precision": "bf16", "lr": 1e-3, "seed": 0},
        quick_params={"batch_sizes": (8,), "compile_batch_sizes": (8,), "resnet_modes": (),
                      "mlp_modes": (), "in_features": 64, "hidden": (256,),
                      "batch": 256},
        torch_twin=torch_twin_label,
        check=check_params)
def run(r: LessonRun) -> None:
    cfg = check_params(r.params)
    notes: list[str] = []
    torch = r.torch()
    res = ResnetRun(r, cfg, notes)
    res.ours()
    mlp = MlpRun(r, cfg)
    mlp.ours()
    if torch is None:
        notes.append("PyTorch is not installed or sees no GPU: only cudalab's side ran "
                     "(no torch.compile, TorchScript, ONNX Runtime or TensorRT rows)")
    else:
        with compiling(torch):
            res.theirs(torch)
            mlp.theirs(torch, notes)
    res.model.release()
    variants = res.variants + mlp.variants
    _rows_and_break_even(r, variants)
    _versus_findings(r, variants, cfg)
    for module, name in (("onnxruntime", "ONNX Runtime"), ("tensorrt", "TensorRT")):
        if not any(n.startswith(name + ":") for n in notes):
            ok, why = backend_status(module, torch)
            notes.append(f"{name}: {why}" + ("" if ok or module in cfg["resnet_modes"]
                                             else " (not asked for in resnet_modes)"))
    notes.append(left_out_text(cfg["resnet_modes"], cfg["mlp_modes"], r.quick))
    for text in dict.fromkeys(notes):  # a missing compiler is said once, not per batch
        r.finding(text)
    _claims(r, variants, cfg)


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = list(result.rows)
    labels = [f"{x['part']} b{x['batch']}: {x['impl']} {x['variant']}" for x in rows]
    ys = list(range(len(rows)))
    ax.barh(ys, [x["ms"] for x in rows],
            color=["C0" if x["impl"] == "cudalab" else "C1" for x in rows])
    for y, x in zip(ys, rows):
        ax.annotate(f" setup {x['setup_s']:.2f} s", (x["ms"], y), fontsize=6, va="center")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per call (blue: cudalab); annotation: seconds to get ready")
