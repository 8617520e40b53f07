"""Zero-copy with Numba (CUDA Array Interface) and JAX (DLPack), where installed."""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from _support import jax_gpus, numba_cuda, random_array

pytestmark = pytest.mark.gpu


def test_numba_both_ways(rng):
    cuda = numba_cuda()
    h = random_array(rng, (37, 129), np.float32)
    theirs = cuda.to_device(h)
    ours = cudalab.asarray(theirs)  # through __cuda_array_interface__
    assert ours.data_ptr == theirs.__cuda_array_interface__["data"][0]
    cudalab.add(ours, 1, out=ours)
    cudalab.synchronize()
    np.testing.assert_array_equal(theirs.copy_to_host(), h + 1)

    mine = cudalab.asarray(h)
    view = cuda.as_cuda_array(mine)  # Numba reads our interface
    assert view.__cuda_array_interface__["data"][0] == mine.data_ptr
    np.testing.assert_array_equal(view.copy_to_host(), h)


def test_jax_both_ways(rng):
    jax, gpus = jax_gpus()
    h = random_array(rng, (37, 129), np.float32)
    x = jax.device_put(h, gpus[0])
    ours = cudalab.from_dlpack(x)
    assert ours.data_ptr == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(ours.get(), h)

    mine = cudalab.asarray(h)
    j = jax.dlpack.from_dlpack(mine)
    assert j.unsafe_buffer_pointer() == mine.data_ptr
    np.testing.assert_array_equal(np.asarray(j), h)
