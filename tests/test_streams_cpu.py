"""CPU tier: streams, events and graphs — argument checking, no-device errors
and the pure-Python capture context. Runs without a GPU (the tests that need
one to get past argument checking are skipped when a GPU is present only
where the outcome differs)."""

from __future__ import annotations

import pytest
from _support import assert_arg_error, no_gpu_only

import cudalab
from cudalab import CUDAGraph, Event, Stream


def test_public_names():
    for name in ("Stream", "Event", "CUDAGraph", "current_stream", "default_stream", "graph",
                 "stream"):
        assert hasattr(cudalab, name)
        assert name in cudalab.__all__


@pytest.mark.parametrize("bad", ["a", 1.5, None, True, [0]])
def test_stream_priority_type(bad):
    with assert_arg_error(TypeError, "Stream", "priority", match="^expected an int"):
        Stream(priority=bad)


def test_stream_priority_out_of_range_value():
    with assert_arg_error(ValueError, "Stream", "priority"):
        Stream(priority=10**30)


@pytest.mark.parametrize("bad", ["0", 1.0, True])
def test_stream_device_type(bad):
    with assert_arg_error(TypeError, "Stream", "device"):
        Stream(device=bad)


def test_stream_device_negative():
    with assert_arg_error(ValueError, "Stream", "device"):
        Stream(device=-1)


def test_stream_unknown_keyword():
    with pytest.raises(TypeError):
        Stream(prio=0)


def test_stream_not_subclassable():
    with pytest.raises(TypeError):
        type("S", (Stream,), {})


def test_event_too_many_arguments():
    with pytest.raises(TypeError):
        Event(True, False, 3)


def test_event_flag_truthiness_errors_propagate():
    class Bad:
        def __bool__(self):
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        Event(enable_timing=Bad())


def test_graph_requires_cudagraph():
    with assert_arg_error(TypeError, "graph", "cuda_graph", match="^expected a CUDAGraph"):
        cudalab.graph(object())
    with assert_arg_error(TypeError, "graph", "cuda_graph"):
        cudalab.graph(None)


def test_graph_stream_type():
    with assert_arg_error(TypeError, "graph", "stream", match="^expected a Stream"):
        cudalab.graph(CUDAGraph(), stream="s")


def test_cudagraph_arguments():
    with pytest.raises(TypeError, match="takes no positional arguments"):
        CUDAGraph(1)
    with pytest.raises(TypeError):
        CUDAGraph(x=1)
    with pytest.raises(TypeError, match="'keep_temporaries' expected a bool or None, got int"):
        CUDAGraph(keep_temporaries=1)


def test_cudagraph_keep_temporaries(monkeypatch):
    monkeypatch.delenv("CUDALAB_GRAPH_KEEP_TEMPORARIES", raising=False)
    assert CUDAGraph().keep_temporaries is False
    assert CUDAGraph(keep_temporaries=True).keep_temporaries is True
    # None reads the environment when the graph is made (what sanitize.sh sets).
    monkeypatch.setenv("CUDALAB_GRAPH_KEEP_TEMPORARIES", "1")
    assert CUDAGraph().keep_temporaries is True
    assert CUDAGraph(keep_temporaries=None).keep_temporaries is True
    assert CUDAGraph(keep_temporaries=False).keep_temporaries is False
    monkeypatch.setenv("CUDALAB_GRAPH_KEEP_TEMPORARIES", "0")
    assert CUDAGraph().keep_temporaries is False


def test_cudagraph_fresh_state():
    g = CUDAGraph()
    assert g.capturing is False
    assert g.captured is False
    with pytest.raises(cudalab.CudalabError, match=r"^replay\(\): nothing captured"):
        g.replay()
    g.reset()  # nothing to reset: fine
    with pytest.raises(cudalab.CudalabError, match=r"^capture_end\(\): .*not capturing"):
        g.capture_end()
    g._abort_capture()  # no-op


def test_capture_begin_type():
    with assert_arg_error(TypeError, "capture_begin", "stream", match="^expected a Stream"):
        CUDAGraph().capture_begin(3)


def test_stream_helper_type():
    with assert_arg_error(TypeError, "stream", "s"):
        cudalab.stream(5)  # checked when called, before any `with`
    with cudalab.stream(None) as s:  # None: a no-op, as torch.cuda.stream(None)
        assert s is None


@no_gpu_only
@pytest.mark.parametrize(
    "make",
    [lambda: Stream(), lambda: Stream(priority=0), lambda: Stream(device=0), lambda: Event(),
     lambda: Event(enable_timing=False, blocking=True), lambda: cudalab.current_stream(),
     lambda: cudalab.default_stream()],
)
def test_no_device(make):
    with pytest.raises(cudalab.NoDeviceError):
        make()


@no_gpu_only
def test_graph_context_no_device():
    with pytest.raises(cudalab.NoDeviceError, match=r"^graph\(\): no CUDA device"):
        with cudalab.graph(CUDAGraph()):
            pass


@no_gpu_only
def test_stream_exit_without_enter_is_checked_by_type():
    # Without a device no Stream exists; the unbound method still validates.
    with pytest.raises(TypeError):
        Stream.__exit__(object(), None, None, None)
