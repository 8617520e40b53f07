"""CPU tier: the ResNet50 per-shape cache and its misaligned-buffer handling, no GPU.

* ``models.cache.LRUCache``: least recently used first out, both bounds, room
  made before an entry is added, the newest entry always kept, bounds changed
  in place, argument checks;
* ``ResNet50``'s use of it on a stand-in ``_core`` (fake device arrays with
  addresses; _convnet_run refuses a slot not 256-byte aligned, as the C side
  does): a new shape drops the oldest one *before* its workspace is
  allocated, the bounds are attributes, release() and to() clear; a forward
  inside a graph capture keeps its workspace alive past eviction (until
  release()) and frees nothing while capturing; a misaligned input is copied
  to an aligned buffer and a misaligned or strided ``out`` is written through
  a temporary and one copy.

The GPU tier (test_models_edges_gpu.py) runs the same on a device.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np
import pytest

from cudalab import _core
from cudalab.models import LRUCache, ResNet50, arch
from cudalab.models import resnet as resnet_module
from cudalab.models.plan import plan_forward, weight_layout
from _support import assert_arg_error

# ---- LRUCache -----------------------------------------------------------------------------


def test_lru_drops_the_least_recently_used_first():
    c = LRUCache(max_entries=2)
    assert c.put("a", 1, 10) == []
    assert c.put("b", 2, 10) == []
    assert c.get("a") == 1           # "a" is now the most recent
    assert c.put("c", 3, 10) == [("b", 2)]
    assert c.keys() == ["a", "c"] and len(c) == 2 and c.nbytes == 20
    assert "b" not in c and c.get("b") is None
    assert c.put("a", 4, 5) == []    # replacing a key drops nothing else
    assert c.keys() == ["c", "a"] and c.get("a") == 4 and c.nbytes == 15


def test_lru_make_room_before_adding():
    c = LRUCache(max_entries=2, max_bytes=100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.make_room(30) == [("a", 1)]       # count: one slot must be free
    assert c.keys() == ["b"]
    assert c.make_room(60) == []               # 40 + 60 fits 100
    assert c.make_room(61) == [("b", 2)]
    assert len(c) == 0 and c.nbytes == 0


def test_lru_byte_bound_keeps_the_newest_even_if_too_large():
    c = LRUCache(max_entries=None, max_bytes=100)
    c.put("a", 1, 30)
    c.put("b", 2, 30)
    c.put("c", 3, 30)
    assert c.keys() == ["a", "b", "c"]
    assert c.put("d", 4, 500) == [("a", 1), ("b", 2), ("c", 3)]
    assert c.keys() == ["d"] and c.nbytes == 500
    c.max_bytes = 10                           # still the newest: stays
    assert c.keys() == ["d"]


def test_lru_lowering_a_bound_drops_at_once():
    c = LRUCache(max_entries=None)
    for i in range(5):
        c.put(i, str(i), 10)
    c.max_entries = 2
    assert c.keys() == [3, 4] and c.nbytes == 20
    c.max_entries = None
    c.max_bytes = 10
    assert c.keys() == [4]
    assert c.pop(4) == "4" and c.pop(4) is None and c.nbytes == 0
    c.put(1, "x", 1)
    c.clear()
    assert len(c) == 0 and c.nbytes == 0 and list(c) == []


def test_lru_argument_checks():
    with assert_arg_error(ValueError, "LRUCache", "max_entries", ">= 1"):
        LRUCache(max_entries=0)
    with assert_arg_error(TypeError, "LRUCache", "max_entries", "expected an int"):
        LRUCache(max_entries=2.0)
    with assert_arg_error(ValueError, "LRUCache", "max_bytes", ">= 0"):
        LRUCache(max_bytes=-1)
    c = LRUCache()
    assert c.max_entries == 4 and c.max_bytes is None
    with assert_arg_error(TypeError, "LRUCache", "max_entries"):
        c.max_entries = True


# ---- ResNet50 on a stand-in _core ---------------------------------------------------------------

ALIGN = 256


class FakeArray:
    """A device array as ResNet50 sees it: shape, dtype, an address, contiguity."""

    _next = itertools.count(1)

    def __init__(self, shape, dtype="float32", ptr=None, contiguous=True, device=0):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        self.dtype = np.dtype(dtype)
        self.data_ptr = ptr if ptr is not None else next(self._next) * (1 << 20)
        self.is_contiguous = contiguous
        self.device = device

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def copy(self):
        return FakeArray(self.shape, self.dtype, device=self.device)

    def astype(self, dtype):
        return FakeArray(self.shape, dtype, device=self.device)


class StandIn:
    """The _core calls ResNet50's forward makes, recording what happens."""

    def __init__(self):
        self.capturing = False
        self.workspaces = weakref.WeakSet()  # the live ones
        self.log = []

    def empty(self, shape, dtype="float32"):
        a = FakeArray(shape, dtype)
        if a.dtype == np.uint8:  # a workspace
            self.log.append(("workspace", len(self.workspaces)))
            self.workspaces.add(a)
        return a

    def compile(self, steps, slots, name):
        return object()

    def run(self, program, slots):
        for i, s in enumerate(slots):
            if not s.is_contiguous or s.data_ptr % ALIGN:
                raise ValueError(f"_convnet_run(): slot {i} must hold ... aligned to {ALIGN}")
        self.log.append(("run", slots[resnet_module.SLOT_IMAGES], slots[resnet_module.SLOT_LOGITS]))

    def copyto(self, dst, src):
        assert dst.shape == src.shape
        self.log.append(("copyto", dst, src))

    def install(self, monkeypatch):
        for name, value in (("empty", self.empty), ("_convnet_compile", self.compile),
                            ("_convnet_run", self.run), ("copyto", self.copyto),
                            ("is_current_stream_capturing", lambda: self.capturing),
                            ("current_device", lambda: 0), ("DeviceArray", FakeArray)):
            monkeypatch.setattr(_core, name, value)


@pytest.fixture
def core(monkeypatch):
    stand_in = StandIn()
    stand_in.install(monkeypatch)
    return stand_in


def bare_model(max_cached_shapes=4, max_cached_bytes=None) -> ResNet50:
    """A ResNet50 without weights: what the forward's bookkeeping looks at."""
    m = object.__new__(ResNet50)
    m.precision, m.dtype, m._matmul_precision = "fp32", "float32", "highest"
    m.layers = arch.RESNET50
    m._layout = weight_layout(m.layers, m.dtype)
    m._weights, m._fc_bias = FakeArray(m._layout.nbytes // 4), FakeArray(1000)
    # The same bound checks and containers as __init__.
    m._cache = LRUCache(max_cached_shapes, max_cached_bytes)
    m._graph_held = {}
    return m


def images(n, size=32, **kw):
    return FakeArray((n, size, size, 3), **kw)


def test_a_new_shape_drops_the_oldest_before_allocating(core):
    m = bare_model(max_cached_shapes=2)
    for n in (1, 2, 3):
        m.forward(images(n))
    assert m.cached_shapes == [(2, 32, 32), (3, 32, 32)]
    # Live workspaces at each allocation: 0, 1, then 1 (batch 1's went first).
    assert [e[1] for e in core.log if e[0] == "workspace"] == [0, 1, 1]
    assert len(core.workspaces) == 2
    m.forward(images(2))        # a hit: now the most recent
    m.forward(images(4))        # drops batch 3
    assert m.cached_shapes == [(2, 32, 32), (4, 32, 32)]
    assert m.cached_bytes == sum(ws.nbytes for _, ws in m._compiled.values())


def test_the_bounds_are_attributes(core):
    m = bare_model(max_cached_shapes=None)
    for n in (1, 2, 3, 4, 5):
        m.forward(images(n))
    assert len(m.cached_shapes) == 5 and m.max_cached_shapes is None
    m.max_cached_shapes = 3
    assert m.cached_shapes == [(3, 32, 32), (4, 32, 32), (5, 32, 32)]
    assert len(core.workspaces) == 3
    one = plan_forward(5, "float32", "highest", m._layout, 32, 32).workspace_bytes
    m.max_cached_bytes = one
    assert m.cached_shapes == [(5, 32, 32)] and m.max_cached_bytes == one
    with assert_arg_error(ValueError, "ResNet50", "max_cached_shapes", ">= 1"):
        m.max_cached_shapes = 0
    with assert_arg_error(TypeError, "ResNet50", "max_cached_bytes", "expected an int"):
        m.max_cached_bytes = 1.5


def test_default_bound_is_four_shapes(core):
    assert resnet_module.DEFAULT_MAX_CACHED_SHAPES == 4
    m = bare_model()
    for n in range(1, 7):
        m.forward(images(n))
    assert m.cached_shapes == [(n, 32, 32) for n in (3, 4, 5, 6)]


def test_release_drops_shapes_and_their_workspaces(core):
    m = bare_model()
    for n in (1, 2, 2, 3):
        m.forward(images(n))
    m.release(2)
    assert m.cached_shapes == [(1, 32, 32), (3, 32, 32)]
    m.release()
    assert m.cached_shapes == [] and m.cached_bytes == 0 and len(core.workspaces) == 0


def test_a_captured_forward_keeps_its_workspace_until_release(core):
    m = bare_model(max_cached_shapes=1)
    m.forward(images(1))
    core.capturing = True
    m.forward(images(1))         # inside a (user's) graph capture: held for the graph
    core.capturing = False
    m.forward(images(2))         # evicts batch 1 from the LRU...
    assert m.cached_shapes == [(2, 32, 32)]
    assert len(core.workspaces) == 2  # ...but the graph's workspace stays
    assert set(m._compiled) == {(1, 32, 32), (2, 32, 32)}
    allocations = len([e for e in core.log if e[0] == "workspace"])
    m.forward(images(1))         # back: the held one is reused, not compiled again
    assert len([e for e in core.log if e[0] == "workspace"]) == allocations
    assert m.cached_shapes == [(1, 32, 32)]
    m.release(1)
    assert set(m._compiled) == set() and len(core.workspaces) == 0


def test_nothing_is_freed_while_capturing(core):
    m = bare_model(max_cached_shapes=1)
    m.forward(images(1))
    core.capturing = True
    m.forward(images(2))         # a new shape inside a capture: batch 1 is not dropped
    assert len(core.workspaces) == 2 and m.cached_shapes == [(1, 32, 32)]
    core.capturing = False
    assert set(m._compiled) == {(1, 32, 32), (2, 32, 32)}


def test_a_misaligned_input_is_copied_to_an_aligned_buffer(core):
    m = bare_model()
    x = images(3, size=33, ptr=(1 << 30) + 33 * 33 * 3 * 4)  # like batch[1:]
    assert x.data_ptr % ALIGN
    out = m.forward(x)
    [(_, seen_images, seen_logits)] = [e for e in core.log if e[0] == "run"]
    assert seen_images is not x and seen_images.shape == x.shape
    assert seen_images.data_ptr % ALIGN == 0
    assert seen_logits is out and out.shape == (3, 1000)
    aligned = images(3, size=33)
    m.forward(aligned)
    assert [e for e in core.log if e[0] == "run"][-1][1] is aligned  # no copy when aligned


@pytest.mark.parametrize("offset, contiguous", [(32, True), (0, False)],
                         ids=["misaligned", "strided"])
def test_out_that_cannot_be_a_slot_goes_through_a_temporary(core, offset, contiguous):
    m = bare_model()
    out = FakeArray((2, 1000), ptr=(1 << 30) + offset, contiguous=contiguous)
    assert m.forward(images(2), out=out) is out
    run = [e for e in core.log if e[0] == "run"][-1]
    temp = run[2]
    assert temp is not out and temp.data_ptr % ALIGN == 0
    assert core.log[-1] == ("copyto", out, temp)
    good = FakeArray((2, 1000))
    assert m.forward(images(2), out=good) is good
    assert core.log[-1][0] == "run" and core.log[-1][2] is good  # direct: no copy


def test_out_of_the_wrong_shape_or_dtype_is_refused(core):
    m = bare_model()
    for bad in (FakeArray((2, 999)), FakeArray((2, 1000), "float16"), np.zeros((2, 1000))):
        with pytest.raises(ValueError, match=r"forward\(\) argument 'out': expected a float32 "
                                             r"DeviceArray of shape \(2, 1000\)"):
            m.forward(images(2), out=bad)
