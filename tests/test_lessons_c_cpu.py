"""Pure logic of lessons 8-10 and 15 (profiling, cpu_vs_gpu, memory, timing), without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from cudalab.lessons import profiling

ELEMENTWISE = frozenset({"add", "sub", "mul", "relu", "where"})


# ---- profiling ----------------------------------------------------------------------


def _loss(ops, args):
    return float(profiling.mlp_step(ops, *args)[0])


def test_mlp_step_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    args = [a.astype(np.float64) for a in profiling.mlp_inputs(rng, 7, 5, 9, 3)]
    ops = profiling.numpy_ops()
    _, grads, _ = profiling.mlp_step(ops, *args)
    eps = 1e-6
    for index, grad in zip((2, 3, 4, 5), grads):  # w1, b1, w2, b2
        param = args[index]
        assert grad.shape == param.shape
        for flat in rng.choice(param.size, size=min(6, param.size), replace=False):
            pos = np.unravel_index(flat, param.shape)
            saved = param[pos]
            param[pos] = saved + eps
            up = _loss(ops, args)
            param[pos] = saved - eps
            down = _loss(ops, args)
            param[pos] = saved
            assert grad[pos] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8)


def test_mlp_step_relu_mask_blocks_gradient():
    rng = np.random.default_rng(2)
    args = [a.astype(np.float64) for a in profiling.mlp_inputs(rng, 4, 3, 6, 2)]
    args[3][:] = -100.0  # every hidden unit off: no gradient reaches layer 1
    _, (dw1, db1, dw2, _), h = profiling.mlp_step(profiling.numpy_ops(), *args)
    assert not h.any() and not dw1.any() and not db1.any() and not dw2.any()


def test_step_flops_counts_five_matmuls():
    b, i, h, o = 3, 5, 7, 11
    assert profiling.step_flops(b, i, h, o) == 2 * (b * i * h + b * h * o + h * b * o
                                                    + b * o * h + i * b * h)


def test_op_category():
    assert profiling.op_category("matmul", ELEMENTWISE) == "gemm"
    assert profiling.op_category("relu", ELEMENTWISE) == "element-wise"
    assert profiling.op_category("sum", ELEMENTWISE) == "reduction"
    assert profiling.op_category("copy", ELEMENTWISE) == "other"


def test_category_shares_sum_to_one_and_split_by_kind():
    shares = profiling.category_shares({"matmul": 600, "add": 200, "relu": 100, "sum": 100},
                                       ELEMENTWISE)
    assert shares == pytest.approx({"gemm": 0.6, "element-wise": 0.3, "reduction": 0.1,
                                    "other": 0.0})
    assert profiling.category_shares({}, ELEMENTWISE)["gemm"] == 0.0


def test_bottleneck_text_follows_the_threshold():
    t = profiling.GEMM_DOMINATES
    assert profiling.bottleneck_text({"gemm": t + 0.01}).startswith("GEMMs dominate")
    assert profiling.bottleneck_text({"gemm": t - 0.01}).startswith("GEMMs take only")


def test_trace_counts():
    doc = {"traceEvents": [{"ph": "M", "name": "process_name"},
                           {"ph": "X", "cat": "op"}, {"ph": "X", "cat": "op"},
                           {"ph": "X", "cat": "gpu_op"}, {"ph": "X", "cat": "range"}]}
    assert profiling.trace_counts(doc) == (2, 1)


# ---- cpu_vs_gpu ---------------------------------------------------------------------

from cudalab.lessons import cpu_vs_gpu  # noqa: E402


def test_cpu_matmul_size_fits_the_target_time():
    m = cpu_vs_gpu.SIZE_MULTIPLE
    # 1 TFLOP/s for 1 s: n^3 = 5e11 -> 7937 -> 7936 (a multiple of 64)
    assert cpu_vs_gpu.cpu_matmul_size(1e12, 8192, 1.0) == 7936
    assert cpu_vs_gpu.cpu_matmul_size(1e15, 8192, 1.0) == 8192        # fast: the full size
    assert cpu_vs_gpu.cpu_matmul_size(1e6, 8192, 1.0) == m            # slow: the floor
    assert cpu_vs_gpu.cpu_matmul_size(1e15, 100, 1.0) == 100          # never above the size
    n = cpu_vs_gpu.cpu_matmul_size(2e9, 8192, 0.5)                     # a float16-like rate
    assert n % m == 0 and 2 * n ** 3 / 2e9 <= 0.5 < 2 * (n + m) ** 3 / 2e9
    with pytest.raises(ValueError, match="rate must be > 0"):
        cpu_vs_gpu.cpu_matmul_size(0.0, 8192, 1.0)


def test_cpu_repeats_fit_the_budget_within_bounds():
    low = cpu_vs_gpu.MIN_CPU_REPEATS
    assert cpu_vs_gpu.cpu_repeats(0.001, 100, 8.0) == 100     # cheap: all iterations
    assert cpu_vs_gpu.cpu_repeats(0.5, 100, 8.0) == 16        # cut to the budget
    assert cpu_vs_gpu.cpu_repeats(20.0, 100, 8.0) == low      # slow: the floor
    assert cpu_vs_gpu.cpu_repeats(20.0, 2, 8.0) == 2          # never above iterations
    assert cpu_vs_gpu.cpu_repeats(0.0, 5, 1.0) == 5


@pytest.mark.parametrize("speedup, held, word", [(20.0, False, "below"), (50.0, True, "within"),
                                                 (100.0, True, "within"),
                                                 (400.0, True, "above")])
def test_speedup_verdict(speedup, held, word):
    got, why = cpu_vs_gpu.speedup_verdict(speedup)
    assert got is held and word in why and f"{speedup:.0f}x" in why


def test_cpu_threads_reports_a_count_and_its_source():
    n, source = cpu_vs_gpu.cpu_threads()
    assert isinstance(n, int) and n >= 1 and str(n) in source


# ---- memory -------------------------------------------------------------------------

import cudalab  # noqa: E402
from cudalab.lessons import memory  # noqa: E402


class FakePool:
    """Allocations against a byte limit; over it, OutOfMemoryError as cudalab raises it."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.peak, self.calls = limit, 0, 0, 0

    def alloc(self, nbytes: int) -> int:
        if self.used + nbytes > self.limit:
            raise cudalab.OutOfMemoryError(f"fake: {nbytes} bytes over the limit")
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return nbytes

    def free(self, nbytes: int) -> None:
        self.used -= nbytes

    def ffn_step(self, rows: int, hidden: int) -> None:
        """The lesson's step: x, h, g alive, h freed, y; everything freed at the end,
        also when an allocation fails."""
        self.calls += 1
        held = []
        try:
            sizes = memory.ffn_bytes(rows, hidden)
            held.append(self.alloc(sizes["x"]))
            held.append(self.alloc(sizes["h"]))
            held.append(self.alloc(sizes["g"]))
            self.free(held.pop(1))
            held.append(self.alloc(sizes["y"]))
        finally:
            for n in held:
                self.free(n)


@pytest.mark.parametrize("budget_mib", [1, 40, 256, 511, 4096])
def test_bisection_on_a_fake_allocator_finds_the_models_batch(budget_mib):
    seq, hidden = 16, 256
    pool = FakePool(budget_mib << 20)
    fits = lambda b: memory.try_step(lambda: pool.ffn_step(b * seq, hidden))  # noqa: E731
    found, trials = memory.largest_fitting(fits)
    assert found == memory.predicted_largest_batch(budget_mib << 20, seq, hidden)
    assert pool.used == 0  # every OOM left the pool as it was
    assert len(trials) == pool.calls
    assert all(ok == (n <= found) for n, ok in trials)
    if found:
        pool.peak = 0
        pool.ffn_step(found * seq, hidden)
        assert pool.peak == memory.ffn_peak_bytes(found * seq, hidden)


def test_largest_fitting_edges():
    assert memory.largest_fitting(lambda n: False) == (0, [(1, False)])
    found, trials = memory.largest_fitting(lambda n: True, cap=100)
    assert found == 100 and trials[-1] == (100, True)
    found, trials = memory.largest_fitting(lambda n: n <= 37, start=8)
    assert found == 37 and len(trials) <= 2 + 2 * 37 .bit_length()
    found, _ = memory.largest_fitting(lambda n: n <= 5, start=8)  # start too big: bisect below
    assert found == 5
    with pytest.raises(ValueError, match="start <= cap"):
        memory.largest_fitting(lambda n: True, start=0)


def test_try_step_catches_only_out_of_memory():
    def oom():
        raise cudalab.OutOfMemoryError("no room")

    assert memory.try_step(oom) is False
    assert memory.try_step(lambda: 1) is True
    with pytest.raises(ValueError):
        memory.try_step(lambda: int("x"))


def test_ffn_memory_model():
    b = memory.ffn_bytes(10, 8)
    assert b == {"x": 320, "h": 1280, "g": 1280, "y": 320}
    assert memory.ffn_peak_bytes(10, 8) == 320 + 1280 + 1280  # x, h, g: h outweighs y
    assert memory.predicted_largest_batch(2880 * 3 + 2879, 10, 8) == 3


def test_linear_slope_and_limit_fraction():
    assert memory.linear_slope([16, 32, 64], [5 + 2 * 16, 5 + 2 * 32, 5 + 2 * 64]) == 2
    with pytest.raises(ValueError, match="two distinct"):
        memory.linear_slope([4, 4], [1, 2])
    assert memory.limit_fraction(100, 300, 1000) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="not below the device"):
        memory.limit_fraction(900, 200, 1000)


def test_release_share():
    assert memory.release_share(1000, 100, 100) == 1.0
    assert memory.release_share(1000, 550, 100) == pytest.approx(0.5)
    assert memory.release_share(100, 100, 100) == 1.0  # nothing cached


# ---- timing -------------------------------------------------------------------------

from cudalab.lessons import timing  # noqa: E402


@pytest.mark.parametrize("ratio, words", [(0.001, "misses 100%"), (0.3, "misses 70%"),
                                          (0.95, "agrees"), (1.08, "agrees"),
                                          (1.5, "reads 50% high"), (0.7, "reads 30% low")])
def test_timing_verdict(ratio, words):
    assert words in timing.verdict(ratio)


def test_timing_verdict_thresholds():
    assert "misses" in timing.verdict(timing.MISLEADING_RATIO - 1e-9)
    assert "misses" not in timing.verdict(timing.MISLEADING_RATIO)
    assert "agrees" in timing.verdict(1 + timing.AGREES_WITHIN - 1e-9)
    assert "agrees" not in timing.verdict(1 + timing.AGREES_WITHIN + 1e-6)


def test_timing_rows_describe_every_method():
    assert set(timing.WHAT) == {"host clock, no synchronize", "host clock + synchronize",
                                "CUDA events", "loop, one synchronize", "cudalab.bench"}


def test_times_text():
    assert cpu_vs_gpu.times(340.4) == "340x"
    assert cpu_vs_gpu.times(1.234) == "1.2x"
    assert cpu_vs_gpu.times(0.357) == "0.36x"


def test_profiling_hold_covers_the_enqueueing_and_is_capped():
    assert profiling.hold_seconds(1e-3, 10) == pytest.approx(profiling.HOLD_MARGIN * 1e-2 + 1e-3)
    assert profiling.hold_seconds(1.0, 100) == profiling.HOLD_MAX_S
    assert profiling.hold_seconds(0.0, 10) == pytest.approx(1e-3)
