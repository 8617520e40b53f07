"""Pipeline: GPipe pipeline (model) parallelism for an nn.MLP, in one process.

The MLP's layers are split into one contiguous *stage* per device, balanced
by parameter count (an MLP layer's FLOPs are proportional to its weights),
and each stage's layers are moved to its device. A training step splits the
batch into micro-batches (torch.chunk's split) and runs GPipe's schedule:
every micro-batch's forward, stage after stage, then every backward in
reverse (last micro-batch first), the gradients accumulating over the
micro-batches; then one optimizer step per stage. While stage s works on
micro-batch k, stage s + 1 works on micro-batch k - 1: the stages overlap,
except for the pipeline's fill and drain, the *bubble*, which GPipe's
analysis puts at ``(S - 1) / (m + S - 1)`` of the step for S stages and m
micro-batches.

How it runs. Each stage computes on its device's current stream. An
activation (forward) or its gradient (backward) crosses to the next device
in one peer copy made while two transfer streams of the boundary are current
on the two devices: the sending stream first waits for an event recorded on
the producing stage's stream after the work that wrote the array, and the
receiving stage's stream waits for an event recorded on the receiving
stream after the copy. So no stage waits for more than the one array it
needs, and copies overlap computation. The host enqueues the schedule clock
by clock (at clock t stage s takes micro-batch t - s), never waiting for the
devices.

Buffers. nn.Linear keeps one set of activation buffers per layer, so each
stage keeps one *twin* of each of its layers per micro-batch: a Linear that
shares the layer's Parameters (master weights, gradients) and its weight
casts (made once per step) but owns its activation buffers. All
micro-batches' activations are alive between their forward and backward, as
GPipe without re-materialization keeps them: a stage's memory is its weights
and optimizer state plus the whole batch's activations of its layers.

Why the result equals the unsplit MLP's (up to float32 rounding): every row
goes through the same layers with the same weights; the last stage's loss
gradient is the mean cross-entropy's over the *whole* batch (each
micro-batch's summed loss scaled by 1 / N on the device), and a layer's
weight gradient is a sum over rows, which the micro-batches' backwards add
up (accumulate=True after the first). Inside a stage the activation
derivative is fused into the next layer's input-gradient GEMM, as in
MLP.backward; at a stage boundary the aux lives on the other device, so the
receiving stage applies it explicitly (gelu_grad on the pre-activation,
relu_grad on the output) before its last layer's backward: the same function
as the fused DGELU / DRELU epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import _core
from ..devices import device as _device
from .._buffers import Buffers
from .._check import arg_error, check_array
from ..nn.layers import MLP, Linear, backward_layers
from ..nn.precision import Precision, get_precision
from .data_parallel import (_check_count, _on_device, check_devices, check_present,
                            enable_peers, split_rows)

__all__ = ["Pipeline", "PipelineTimings", "split_stages"]

# Losses and loss scales are float32, as nn computes them.
F32 = np.dtype(np.float32)


def split_stages(costs: Sequence[int], stages: int) -> list[tuple[int, int]]:
    """split_stages(costs, stages) -> list of (start, stop)

    Split items of the given costs (an MLP's layers: their parameter counts)
    into `stages` contiguous, non-empty ranges whose largest total is as
    small as possible (exact, by dynamic programming). Among equally good
    splits, the one with the earliest cuts.

    Parameters
    ----------
    costs : sequence of int
        >= 0 each; at least `stages` of them.
    stages : int
        >= 1.
    """
    n = len(costs)
    stages = _check_count(stages, "split_stages", "stages")
    if n < stages:
        raise arg_error(ValueError, "split_stages", "stages",
                        f"{stages} stages need at least {stages} items, got {n}")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + int(c))
    inf = float("inf")
    # best[p][j]: the smallest largest-stage cost of items [0, j) in p stages; cut[p][j]
    # the start of the last of those stages.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for p in range(1, stages + 1):
        for j in range(p, n + 1):
            for i in range(p - 1, j):
                value = max(best[p - 1][i], prefix[j] - prefix[i])
                if value < best[p][j]:  # strict: the earliest cut wins a tie
                    best[p][j], cut[p][j] = value, i
    bounds, j = [], n
    for p in range(stages, 0, -1):
        i = cut[p][j]
        bounds.append((i, j))
        j = i
    return bounds[::-1]


@dataclass(frozen=True)
class PipelineTimings:
    """What the last step's events measured (see :meth:`Pipeline.timings`).

    Attributes
    ----------
    step_ms : float
        From the first forward on the first stage to the end of its last
        backward (the whole schedule; the weight casts before it and the
        optimizer steps after it excluded).
    forward_ms, backward_ms : list of list of float
        Per stage, per micro-batch: the stage's work on it (the loss and its
        gradient count as the last stage's forward).
    busy_ms : list of float
        Per stage: its forwards and backwards together.
    bubble : list of float
        Per stage: ``1 - busy / step``, the fraction of the step it was idle.
    bubble_theory : float
        GPipe's ``(S - 1) / (m + S - 1)``.
    stages, micro_batches : int
    """

    step_ms: float
    forward_ms: list[list[float]]
    backward_ms: list[list[float]]
    busy_ms: list[float]
    bubble: list[float]
    bubble_theory: float
    stages: int
    micro_batches: int

    @property
    def bubble_mean(self) -> float:
        """The stages' mean bubble fraction."""
        return sum(self.bubble) / len(self.bubble)


class _Stage:
    """One stage: its device, layers, per-micro-batch twins, streams, events, buffers."""

    def __init__(self, index: int, device: int, layers: list[Linear], chunks: int) -> None:
        self.index, self.device = index, device
        self.layers = layers
        # twins[k]: the layers micro-batch k runs through (k = 0: the layers themselves).
        self.twins = [layers] + [[layer.twin() for layer in layers] for _ in range(1, chunks)]
        self.ctx = _device(device)
        with self.ctx:
            self.fwd_in = _core.Stream(device=device)   # receives activations
            self.fwd_out = _core.Stream(device=device)  # sends activations
            self.bwd_in = _core.Stream(device=device)   # receives gradients
            self.bwd_out = _core.Stream(device=device)  # sends gradients
            self.fwd_done = [_core.Event(enable_timing=False) for _ in range(chunks)]
            self.fwd_arrived = [_core.Event(enable_timing=False) for _ in range(chunks)]
            self.bwd_done = [_core.Event(enable_timing=False) for _ in range(chunks)]
            self.bwd_arrived = [_core.Event(enable_timing=False) for _ in range(chunks)]
        self.timing: list[tuple[Any, Any, Any, Any]] = []  # per k: fwd start, end, bwd start, end
        self.inbox = Buffers()      # activations from the previous stage, per micro-batch
        self.grad_box = Buffers()   # gradients from the next stage (ReLU boundary)
        self.inputs: list[Any] = [None] * chunks   # what micro-batch k entered with
        self.outputs: list[Any] = [None] * chunks  # its output (the logits, last stage)
        self.grads: list[Any] = [None] * chunks    # the gradient of that output

    def parameters(self) -> list:
        return [p for layer in self.layers for p in layer.parameters()]

    def timing_events(self, chunks: int) -> None:
        while len(self.timing) < chunks:
            with self.ctx:
                self.timing.append(tuple(_core.Event() for _ in range(4)))


def _check_mlp(mlp: Any) -> MLP:
    if not isinstance(mlp, MLP):
        raise arg_error(TypeError, "Pipeline", "mlp",
                        f"expected a cudalab.nn.MLP, got {type(mlp).__name__}")
    return mlp


class Pipeline:
    """Pipeline(mlp, devices, chunks, *, timing=False)

    GPipe pipeline parallelism for an nn.MLP in one process (this module's
    docstring tells how it runs).

    Parameters
    ----------
    mlp : nn.MLP
        Its layers are split into ``len(devices)`` contiguous stages balanced
        by parameter count and *moved* to their devices (Linear.to): the
        Pipeline owns them from then on (``mlp.forward`` no longer works
        across the devices; use :meth:`forward`).
    devices : sequence of int
        Distinct devices, one stage each, in order; at most as many as the
        MLP has layers.
    chunks : int
        Micro-batches per step (>= 1); a batch of fewer rows makes fewer
        (torch.chunk's split).
    timing : bool, optional
        Record CUDA events around every stage's work on every micro-batch, for
        :meth:`timings` (a few microseconds per event; off by default).

    Attributes
    ----------
    mlp : nn.MLP
    devices : list of int
    chunks : int
    bounds : list of (start, stop)
        The layers of each stage.
    timing : bool
    last_split : list of (start, stop)
        The rows of each micro-batch in the last step.

    Examples
    --------
    >>> pipe = Pipeline(nn.MLP([1024, 4096, 4096, 4096, 10]), devices=[0, 1], chunks=8)
    >>> opts = pipe.optimizers(nn.AdamW, lr=1e-3)   # one per stage, state on its device
    >>> loss = pipe.train_step(x, labels, opts, "bf16")
    """

    def __init__(self, mlp: MLP, devices: Sequence[int], chunks: int, *,
                 timing: bool = False) -> None:
        mlp = _check_mlp(mlp)
        devices = check_devices(devices, "Pipeline", "devices")
        chunks = _check_count(chunks, "Pipeline", "chunks")
        if not isinstance(timing, bool):
            raise arg_error(TypeError, "Pipeline", "timing",
                            f"expected a bool, got {type(timing).__name__}")
        if len(devices) > len(mlp.layers):
            raise arg_error(ValueError, "Pipeline", "devices",
                            f"{len(devices)} stages need at least {len(devices)} layers; the "
                            f"MLP has {len(mlp.layers)}")
        check_present(devices, "Pipeline", "devices")
        self.mlp, self.devices, self.chunks, self.timing = mlp, devices, chunks, timing
        self.bounds = split_stages([sum(p.size for p in layer.parameters())
                                    for layer in mlp.layers], len(devices))
        for d, (start, stop) in zip(devices, self.bounds):
            for layer in mlp.layers[start:stop]:
                layer.to(d)
        mlp.forget_activations()
        for a, b in zip(devices[:-1], devices[1:]):
            enable_peers(a, b)
        self.stages = [_Stage(s, d, mlp.layers[start:stop], chunks)
                       for s, (d, (start, stop)) in enumerate(zip(devices, self.bounds))]
        self.last_split: list[tuple[int, int]] = []
        self._inputs = Buffers()   # x copied to the first device, when it was elsewhere
        self._labels = Buffers()   # labels copied to the last device
        self._scales: dict[int, Any] = {}  # 1 / N on the last device, per batch size
        self._losses = Buffers()
        self._logits = Buffers()
        # The last timed step's (start event, end event, micro-batches, with backward).
        self._timed: Optional[tuple[Any, Any, int, bool]] = None
        self._compute: list[Any] = []

    # ---- set-up helpers --------------------------------------------------------------------

    def stage_parameters(self) -> list[list]:
        """Each stage's Parameters (on its device), for its optimizer."""
        return [st.parameters() for st in self.stages]

    def parameters(self) -> list:
        """Every Parameter, in the MLP's order."""
        return self.mlp.parameters()

    def optimizers(self, factory: Callable[..., Any], **kwargs: Any) -> list:
        """optimizers(factory, **kwargs) -> list

        One optimizer per stage, ``factory(stage_parameters, **kwargs)`` (for
        instance ``nn.AdamW``), made with the stage's device current so that
        its state lives there.
        """
        out = []
        for st in self.stages:
            with st.ctx:
                out.append(factory(st.parameters(), **kwargs))
        return out

    def peak_memory(self) -> list[int]:
        """cudalab.max_memory_allocated() of every stage's device (reset it with
        cudalab.reset_peak_memory_stats(device) before the steps to measure)."""
        return [_core.max_memory_allocated(d) for d in self.devices]

    # ---- the step --------------------------------------------------------------------------

    def _check_x(self, x: Any, func: str) -> _core.DeviceArray:
        check_array(x, func, "x")
        n_in = self.mlp.sizes[0]
        if x.ndim != 2 or x.shape[1] != n_in or x.shape[0] < 1:
            raise arg_error(ValueError, func, "x",
                            f"expected shape (N, {n_in}) with N >= 1, got {x.shape}")
        return x

    def _prepare(self, x: Any, precision: Any, func: str) -> tuple[Precision, Any, list]:
        """Checks, the row split, the current streams, x on the first device, and every
        stage's weight casts (shared by its twins)."""
        prec = get_precision(precision, func)
        x = self._check_x(x, func)
        parts = split_rows(x.shape[0], self.chunks)
        self._compute = [_core.current_stream(d) for d in self.devices]
        x0 = _on_device(x, self.devices[0], self._inputs, "x")
        for st in self.stages:
            with st.ctx:
                for layer in st.layers:
                    layer.cast_weights(prec)
                for twins in st.twins[1:len(parts)]:
                    for twin, layer in zip(twins, st.layers):
                        twin.share_cast(layer)
        self.last_split = parts
        return prec, x0, parts

    def forward_backward(self, x: _core.DeviceArray, labels: _core.DeviceArray,
                         precision: Any = "fp32", *,
                         accumulate: bool = False) -> _core.DeviceArray:
        """forward_backward(x, labels, precision='fp32', *, accumulate=False) -> DeviceArray

        One GPipe schedule: the forward of every micro-batch, the mean
        softmax cross-entropy over the whole batch, and the backward of every
        micro-batch, leaving each Parameter's float32 gradient (on its
        stage's device) equal to the unsplit MLP's for the whole batch. No
        host synchronization.

        Parameters
        ----------
        x : DeviceArray
            (N, sizes[0]), any float dtype, on any device (copied to the first
            stage's when elsewhere).
        labels : DeviceArray
            (N,) int32 or int64 class indices, every one in [0, classes) (no
            ignore_index: a bad label makes the loss NaN), on any device.
        precision : {'fp32', 'tf32', 'bf16'} or Precision, optional
            fp16 needs a GradScaler, which does not run across devices here.
        accumulate : bool, optional
            Add into the gradients (several steps' batches) instead of
            starting from the first micro-batch's.

        Returns
        -------
        DeviceArray
            The mean loss, a new 0-d float32 array on the last stage's device.
        """
        func = "forward_backward"
        prec = get_precision(precision, func)
        if prec.needs_scaler:
            raise arg_error(ValueError, func, "precision",
                            f"{prec.name!r} needs loss scaling (GradScaler), which Pipeline "
                            "does not do across devices; use 'bf16'")
        rows = self._check_x(x, func).shape[0]
        check_array(labels, func, "labels")
        if labels.shape != (rows,) or labels.dtype not in (np.int32, np.int64):
            raise arg_error(ValueError, func, "labels",
                            f"expected an int32 or int64 array of shape ({rows},), got "
                            f"{labels.shape} {labels.dtype}")
        prec, x0, parts = self._prepare(x, prec, func)
        last = self.stages[-1]
        n, m = x0.shape[0], len(parts)
        labels = _on_device(labels, last.device, self._labels, "labels")
        with last.ctx:
            if n not in self._scales:
                self._scales[n] = _core.full((1,), 1.0 / n, dtype=F32)
            losses = self._losses.get("losses", (m,), F32)
        scale = self._scales[n]

        def loss(k: int, logits: Any) -> None:
            start, stop = parts[k]
            # Summed over the micro-batch, its gradient scaled by 1 / N: the whole
            # batch's mean loss gradient; written over the logits.
            _core._nn_cross_entropy(logits, labels[start:stop], logits, "sum", scale,
                                    losses[k:k + 1], None)
            last.grads[k] = logits

        self._run(x0, parts, prec, loss, bool(accumulate))
        with last.ctx:
            total = _core.sum(losses)
            _core.mul(total, 1.0 / n, out=total)
        return total

    def train_step(self, x: _core.DeviceArray, labels: _core.DeviceArray,
                   optimizers: Sequence[Any], precision: Any = "fp32") -> _core.DeviceArray:
        """train_step(x, labels, optimizers, precision='fp32') -> DeviceArray

        :meth:`forward_backward`, then every stage's optimizer steps (on its
        device's current stream). Returns the mean loss (0-d float32, on the
        last stage's device; reading it synchronizes).

        Parameters
        ----------
        x, labels, precision :
            As forward_backward takes them.
        optimizers : sequence
            One per stage, over that stage's Parameters (:meth:`optimizers`).
        """
        if isinstance(optimizers, (str, bytes)) or not hasattr(optimizers, "__len__") or (
                len(optimizers) != len(self.stages)):
            raise arg_error(ValueError, "train_step", "optimizers",
                            f"expected one optimizer per stage ({len(self.stages)}), got "
                            f"{optimizers!r}")
        total = self.forward_backward(x, labels, precision)
        for st, opt in zip(self.stages, optimizers):
            with st.ctx:
                opt.step()
        return total

    def forward(self, x: _core.DeviceArray, precision: Any = "fp32") -> _core.DeviceArray:
        """forward(x, precision='fp32') -> DeviceArray

        The logits of every row of `x` through the pipeline (micro-batched,
        no backward): (N, sizes[-1]) in the compute dtype on the last stage's
        device, in a buffer overwritten by the next call.
        """
        prec, x0, parts = self._prepare(x, precision, "forward")
        last = self.stages[-1]
        with last.ctx:
            logits = self._logits.get("logits", (x0.shape[0], self.mlp.sizes[-1]),
                                      prec.compute_dtype)

        def keep(k: int, out: Any) -> None:
            start, stop = parts[k]
            _core.copyto(logits[start:stop], out)

        self._run(x0, parts, prec, keep, None)
        return logits

    __call__ = forward

    # ---- the schedule ------------------------------------------------------------------------

    def _run(self, x0: Any, parts: list, prec: Precision, at_last: Callable[[int, Any], None],
             accumulate: Optional[bool]) -> None:
        """GPipe's schedule, enqueued clock by clock; accumulate None: forward only."""
        S, m = len(self.stages), len(parts)
        timed = self.timing
        if timed:
            for st in self.stages:
                st.timing_events(m)
            with self.stages[0].ctx:
                start, end = _core.Event(), _core.Event()
            start.record(self._compute[0])
        for t in range(m + S - 1):
            for s in range(S):
                k = t - s
                if 0 <= k < m:
                    self._forward(s, k, x0, parts, prec, at_last)
        if accumulate is not None:
            for t in range(m + S - 1):
                for s in range(S - 1, -1, -1):
                    k = m - 1 - t + (S - 1 - s)
                    if 0 <= k < m:
                        self._backward(s, k, accumulate or k != m - 1)
        if timed:
            end.record(self._compute[0])
            self._timed = (start, end, m, accumulate is not None)

    def _forward(self, s: int, k: int, x0: Any, parts: list, prec: Precision,
                 at_last: Callable[[int, Any], None]) -> None:
        st, stream = self.stages[s], self._compute[s]
        with st.ctx:
            if s == 0:
                start, stop = parts[k]
                h = x0[start:stop]
            else:
                stream.wait_event(st.fwd_arrived[k])
                h = st.inputs[k]
            if self.timing:
                st.timing[k][0].record(stream)
            for layer in st.twins[k]:
                h = layer.forward(h, prec, cast_weights=False)
            st.outputs[k] = h
            if s == len(self.stages) - 1:
                at_last(k, h)
            if self.timing:
                st.timing[k][1].record(stream)
            if s + 1 < len(self.stages):
                st.fwd_done[k].record(stream)
        if s + 1 < len(self.stages):
            nxt = self.stages[s + 1]
            nxt.inputs[k] = self._send(h, st, st.fwd_out, st.fwd_done[k], nxt, nxt.fwd_in,
                                       nxt.fwd_arrived[k], nxt.inbox, f"x{k}")

    def _backward(self, s: int, k: int, accumulate: bool) -> None:
        st, stream = self.stages[s], self._compute[s]
        twins = st.twins[k]
        with st.ctx:
            if s + 1 < len(self.stages):
                stream.wait_event(st.bwd_arrived[k])
            g = st.grads[k]
            if self.timing:
                st.timing[k][2].record(stream)
            if s + 1 < len(self.stages):
                # The boundary: the derivative of this stage's last activation, which the
                # next stage's GEMM cannot fuse (its aux is here).
                last = twins[-1]
                if last.activation == "gelu":
                    _core.gelu_grad(g, last.aux, approximate="tanh", out=g)
                elif last.activation == "relu":
                    _core.relu_grad(g, st.outputs[k], out=g)
            # A stage after the first sends its input's gradient back, written over its
            # input (the received activation, which the weight gradient has read).
            gin = backward_layers(twins, g, accumulate, None,
                                   twins[0].input if s > 0 else None)
            if self.timing:
                st.timing[k][3].record(stream)
            if s > 0:
                st.bwd_done[k].record(stream)
        if s > 0:
            prev = self.stages[s - 1]
            # GELU's derivative needs the pre-activation (aux), not the output: the
            # gradient can land in the output's buffer. ReLU's needs the output.
            into = None if prev.layers[-1].activation == "relu" else prev.outputs[k]
            prev.grads[k] = self._send(gin, st, st.bwd_out, st.bwd_done[k], prev, prev.bwd_in,
                                       prev.bwd_arrived[k], prev.grad_box, f"g{k}", into)

    @staticmethod
    def _send(a: Any, src: _Stage, out_stream: Any, ready: Any, dst: _Stage, in_stream: Any,
              arrived: Any, boxes: Buffers, name: str, into: Any = None) -> Any:
        """Copy `a` (on src's device, written before `ready`) to dst's device: on the
        boundary's two transfer streams, so only they wait for each other; `arrived`
        is recorded after the copy. Returns the copy there (in `into` when given)."""
        out_stream.wait_event(ready)
        with out_stream, in_stream:  # current on their two devices
            if into is None:
                with dst.ctx:  # allocated in stream order on in_stream (first step only)
                    into = boxes.get(name, a.shape, a.dtype)
            _core.copyto(into, a)
        arrived.record(in_stream)
        return into

    # ---- measuring ---------------------------------------------------------------------------

    def timings(self) -> PipelineTimings:
        """timings() -> PipelineTimings

        The last step's event timings (waits for its events; needs
        ``timing=True`` when the step ran).
        """
        if self._timed is None:
            raise RuntimeError("Pipeline.timings(): no step ran with timing=True")
        start, end, m, backward = self._timed
        step = start.elapsed_time(end)
        S = len(self.stages)
        fwd = [[st.timing[k][0].elapsed_time(st.timing[k][1]) for k in range(m)]
               for st in self.stages]
        bwd = [[st.timing[k][2].elapsed_time(st.timing[k][3]) if backward else 0.0
                for k in range(m)] for st in self.stages]
        busy = [sum(f) + sum(b) for f, b in zip(fwd, bwd)]
        return PipelineTimings(step_ms=step, forward_ms=fwd, backward_ms=bwd, busy_ms=busy,
                               bubble=[1.0 - b / step for b in busy],
                               bubble_theory=(S - 1) / (m + S - 1), stages=S, micro_batches=m)

    def __repr__(self) -> str:
        stages = ", ".join(f"{d}: layers {a}-{b - 1}" for d, (a, b) in
                           zip(self.devices, self.bounds))
        return f"Pipeline({self.mlp!r}, stages=[{stages}], chunks={self.chunks})"
