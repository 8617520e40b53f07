"""Zero-copy with Numba (CUDA Array Interface) and JAX (DLPack), where installed."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cudalab

pytestmark = pytest.mark.gpu


def _data(rng, shape=(37, 129)):
    return (rng.standard_normal(shape) + 2.0).astype(np.float32)


def test_numba_both_ways(rng):
    numba_cuda = pytest.importorskip("numba.cuda")
    if not numba_cuda.is_available():
        pytest.skip("numba.cuda sees no GPU")
    h = _data(rng)
    theirs = numba_cuda.to_device(h)
    ours = cudalab.asarray(theirs)  # through __cuda_array_interface__
    assert ours.data_ptr == theirs.__cuda_array_interface__["data"][0]
    cudalab.add(ours, 1, out=ours)
    cudalab.synchronize()
    np.testing.assert_array_equal(theirs.copy_to_host(), h + 1)

    mine = cudalab.asarray(h)
    view = numba_cuda.as_cuda_array(mine)  # Numba reads our interface
    assert view.__cuda_array_interface__["data"][0] == mine.data_ptr
    np.testing.assert_array_equal(view.copy_to_host(), h)


def test_jax_both_ways(rng):
    # Without this JAX would take 75% of the GPU for itself at start.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    h = _data(rng)
    x = jax.device_put(h, gpus[0])
    ours = cudalab.from_dlpack(x)
    assert ours.data_ptr == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(ours.get(), h)

    mine = cudalab.asarray(h)
    j = jax.dlpack.from_dlpack(mine)
    assert j.unsafe_buffer_pointer() == mine.data_ptr
    np.testing.assert_array_equal(np.asarray(j), h)
