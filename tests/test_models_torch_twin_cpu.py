"""cudalab.models.torch_twin's compile pieces without a GPU or torch: the readiness
arithmetic, the FX graph cache's state, and compiling once per mode (with stand-ins)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from cudalab.models import torch_twin as TW


def test_setup_cost_is_the_first_calls_less_the_warm_ones():
    assert TW.setup_cost(10.0, 3, 0.5) == pytest.approx(8.5)
    assert TW.setup_cost(1.0, 3, 0.5) == 0.0  # never below 0


def test_first_calls_times_make_and_the_calls_and_keeps_the_first_output():
    calls, syncs = [], []

    def make():
        return lambda: calls.append(len(calls)) or len(calls)
    seconds, first, made = TW.first_calls(None, lambda: syncs.append(1), lambda x: x * 10,
                                          make=make)
    assert len(calls) == TW.FIRST_CALLS and first == 10 and callable(made)
    assert len(syncs) == 2 and seconds >= 0
    seconds, first, made = TW.first_calls(lambda: 7, lambda: None, lambda x: x)
    assert first == 7 and made is None


@pytest.mark.parametrize("before,after,want", [
    ((0, 0), (0, 3), "cold"), ((2, 1), (5, 1), "warm"), ((0, 0), (1, 2), "partly warm"),
    ((4, 4), (4, 4), None),  # no graph compiled (e.g. already compiled in this process)
    (None, (1, 1), None), ((1, 1), None, None),
    ((5, 5), (0, 1), None),  # counters cleared in between
])
def test_cache_state(before, after, want):
    assert TW.cache_state(before, after) == want


class _Out:
    """A torch output stand-in: host_copy reads .float().cpu().numpy()."""

    def float(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return np.full(3, 2.0, np.float32)


def test_compiled_once_per_mode_and_compile_ready(monkeypatch):
    from collections import Counter

    inductor = Counter()
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils",
                        types.SimpleNamespace(counters={"inductor": inductor}))
    made = []

    def compile(module, mode, dynamic):
        made.append((mode, dynamic))
        inductor["fxgraph_cache_hit"] += 1  # as if inductor loaded it from its cache
        return module

    torch = types.SimpleNamespace(compile=compile,
                                  cuda=types.SimpleNamespace(synchronize=lambda: None))
    twin = TW.TorchTwin.__new__(TW.TorchTwin)  # no GPU: the model is a stand-in
    twin.torch, twin.compiled_modules = torch, {}
    out = _Out()
    twin.modules = {"channels_last": lambda x: out}
    assert twin.compiled("default") is twin.compiled("default")
    assert made == [("default", False)]
    seconds, first, call, cache = TW.compile_ready(torch, twin, "max-autotune", "x")
    assert made[-1] == ("max-autotune", False) and cache == "warm"
    assert seconds >= 0 and (first == 2.0).all() and call() is out
    assert TW.fx_cache_counts(torch) == (2, 0)


def test_fx_cache_counts_without_torch_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", None)  # import fails
    assert TW.fx_cache_counts(object()) is None
