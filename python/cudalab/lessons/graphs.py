"""Lesson 14 `graphs`: CUDA graphs against launch overhead.

A chain of K tiny element-wise ops is all overhead: each op costs a Python
call, argument checks and a kernel launch, while its kernel runs for a
microsecond or two. Captured once into a CUDA graph, the K launches replay
with one call. The lesson sweeps K and measures, per op, the host time of the
eager chain and of a replay (host clock: the point is launch overhead), the
GPU time of both (CUDA events), and the cost of capturing, so it can say how
many replays a capture needs to pay for itself, and whether a graph used only
once ever wins.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab

from ..bench import ceiling, host_clock, host_measurement
from ._measuring import break_even_uses, host_time, random_array, ratio, rel_error
from . import _params as P
from .registry import LessonRun, lesson

# Replay counts as a real win per op when it is at least this much faster than eager.
GRAPH_WIN = 2.0
# The chain's constants (op 0 resets y from x, so every run computes the same values).
START, SCALE, SHIFT = 0.5, 0.75, 0.125
# Replay runs the same kernels on the same data as the eager chain: bitwise equal.
TOL_REPLAY = 0.0
# Against the float32 NumPy chain (same ops, same order).
TOL_NUMPY = 1e-6


def one_use_break_even_k(ks: Sequence[int], once_s: Sequence[float],
                         eager_s: Sequence[float]) -> int | None:
    """The smallest K whose capture + one replay (`once_s`) beats one eager run, else None."""
    for k, once, eager in zip(ks, once_s, eager_s):
        if once < eager:
            return k
    return None


def per_op_change(eager_over_replay: float) -> str:
    """How replay changes the host cost per op, from eager / replay."""
    if eager_over_replay >= 1:
        return f"{eager_over_replay:.1f}x less"
    return f"{1 / eager_over_replay:.1f}x more"


def break_even_text(ks: Sequence[int], replays: Sequence[int | None]) -> str:
    """One sentence listing the replays each K needs before its capture has paid off."""
    parts = [f"K={k}: {'never' if n is None else n}" for k, n in zip(ks, replays)]
    return "replays needed before a capture pays for itself: " + ", ".join(parts)


def _chain_ops(lib: Any, x: Any, y: Any, k: int) -> None:
    """K element-wise ops on y (op 0 writes y from x); `lib` is cudalab or torch."""
    lib.mul(x, START, out=y)
    for i in range(1, k):
        j = i % 3
        if j == 1:
            lib.add(y, x, out=y)
        elif j == 2:
            lib.mul(y, SCALE, out=y)
        else:
            lib.sub(y, SHIFT, out=y)


def _numpy_chain(x: np.ndarray, k: int) -> np.ndarray:
    y = x * np.float32(START)
    for i in range(1, k):
        j = i % 3
        y = y + x if j == 1 else (y * np.float32(SCALE) if j == 2 else y - np.float32(SHIFT))
    return y


def _capture_cost(r: LessonRun, label: str, capture_once: Callable[[], Any], sync,
                  repeats: int, k: int) -> float:
    """Host seconds of a capture and its first replay (the cost of a graph used once)."""
    def once() -> None:
        capture_once()
        sync()

    [times] = host_clock({label: once}, repeats, warmup=0.0).values()
    m = host_measurement(times, calls=1, label=label, host_time=False,
                         timer="host clock around capture + first replay + synchronize",
                         metadata={"ops": k})
    return r.add(m, label).median


def _measure_k(r: LessonRun, impl: str, k: int, x: Any, x_h: np.ndarray, lib: Any,
               graph_of: Callable[[Callable[[], None]], Any], sync) -> dict[str, Any]:
    """Check and time eager vs replay for K ops with `lib` (cudalab or torch)."""
    p = "" if impl == "cudalab" else "torch "
    y_eager, y_graph = lib.empty_like(x), lib.empty_like(x)
    eager = lambda: _chain_ops(lib, x, y_eager, k)  # noqa: E731
    eager()  # warm up on the eager stream before any capture
    sync()
    g = graph_of(lambda: _chain_ops(lib, x, y_graph, k))
    g.replay()
    sync()
    got_eager, got_graph = (_host(lib, y) for y in (y_eager, y_graph))
    r.check(f"{p}replay K={k} vs eager", rel_error(got_graph, got_eager), TOL_REPLAY)
    r.check(f"{p}eager K={k} vs NumPy", rel_error(got_eager, _numpy_chain(x_h, k)), TOL_NUMPY)

    def capture_once() -> None:
        graph_of(lambda: _chain_ops(lib, x, y_graph, k)).replay()

    captures = int(r.params["captures"])
    once = _capture_cost(r, f"{p}capture + replay K={k} host", capture_once, sync, captures, k)
    eager_host = host_time(r, f"{p}eager K={k} host", eager, calls=k).median
    replay_host = host_time(r, f"{p}replay K={k} host", g.replay, calls=k).median
    eager_gpu = r.measure(f"{p}eager K={k}", eager).median / k
    replay_gpu = r.measure(f"{p}replay K={k}", g.replay).median / k
    replays = break_even_uses(once - replay_host * k, eager_host * k, replay_host * k)
    r.row(k=k, impl=impl, eager_host_us_per_op=eager_host * 1e6,
          replay_host_us_per_op=replay_host * 1e6, eager_gpu_us_per_op=eager_gpu * 1e6,
          replay_gpu_us_per_op=replay_gpu * 1e6, capture_plus_replay_ms=once * 1e3,
          break_even_replays=replays, one_use_wins=once < eager_host * k)
    return {"eager": eager_host * k, "replay": replay_host * k, "once": once,
            "replays": replays, "eager_op": eager_host, "replay_op": replay_host,
            "eager_gpu_op": eager_gpu, "replay_gpu_op": replay_gpu}


def _host(lib: Any, y: Any) -> np.ndarray:
    return y.get() if lib is cudalab else y.cpu().numpy()


def _cudalab_graph(work: Callable[[], None]) -> Any:
    g = cudalab.CUDAGraph()
    with cudalab.graph(g):
        work()
    return g


def _torch_graph(torch: Any) -> Callable[[Callable[[], None]], Any]:
    def capture(work: Callable[[], None]) -> Any:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            work()
        return g
    return capture


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    ks = sorted(int(k) for k in p["ks"])
    if not ks or ks[0] < 1 or int(p["captures"]) < 1:
        raise ValueError("lesson 'graphs': every K and 'captures' must be >= 1")
    P.ints("graphs", p, "elements")


@lesson(14, "graphs", title="CUDA graphs: per-op cost, capture cost and break-even",
        seed="Guides' CUDA graph sections (torch.cuda.CUDAGraph capture and replay: 'much "
             "faster for repeated patterns'); Colab notebook summary (overhead-bound regime)",
        params={"ks": (1, 4, 16, 64, 256), "elements": 1024, "captures": 5},
        quick_params={"ks": (1, 16, 64), "captures": 3},
        check=check_params)
def run(r: LessonRun) -> None:
    check_params(r.params)
    ks = sorted(int(k) for k in r.params["ks"])
    x_h = random_array(len(ks), (int(r.params["elements"]),))
    x = cudalab.asarray(x_h)
    res = [_measure_k(r, "cudalab", k, x, x_h, cudalab, _cudalab_graph, cudalab.synchronize)
           for k in ks]
    torch = r.torch()
    if torch is not None:
        tx = torch.as_tensor(x_h, device="cuda")
        _measure_k(r, "torch", ks[-1], tx, x_h, torch, _torch_graph(torch),
                   torch.cuda.synchronize)

    launch = ceiling("launch").value
    big, kb = res[-1], ks[-1]
    win = ratio(big["eager_op"], big["replay_op"])
    r.finding(f"at K={kb} an eager op costs {big['eager_op'] * 1e6:.2f} us from Python and a "
              f"replayed one {big['replay_op'] * 1e6:.2f} us ({per_op_change(win)}); the bare "
              f"launch ceiling is {launch * 1e6:.2f} us", value=win, unit="x",
              labels=(f"eager K={kb} host", f"replay K={kb} host"))
    gpu_win = ratio(big["eager_gpu_op"], big["replay_gpu_op"])
    r.finding(f"on the GPU alone an op takes {big['eager_gpu_op'] * 1e6:.2f} us eager and "
              f"{big['replay_gpu_op'] * 1e6:.2f} us replayed ({gpu_win:.2f}x): "
              + ("the graph also shortens the gaps between kernels" if gpu_win >= 1.1 else
                 "the kernels themselves cost the same, the saving is on the host"),
              value=gpu_win, unit="x", labels=(f"eager K={kb}", f"replay K={kb}"))
    replays = [x["replays"] for x in res]
    finite = [n for n in replays if n is not None]
    r.finding(break_even_text(ks, replays), value=None if not finite else min(finite),
              unit="replays", labels=tuple(f"capture + replay K={k} host" for k in ks))
    k_one = one_use_break_even_k(ks, [x["once"] for x in res], [x["eager"] for x in res])
    r.finding(f"used once, capture + replay beats eager from K={k_one} on" if k_one is not None
              else f"used once, a graph never beats eager up to K={kb}: capturing issues the "
                   f"same {kb} ops and then builds the graph",
              value=k_one, unit="K",
              labels=tuple(f"capture + replay K={k} host" for k in ks)
              + tuple(f"eager K={k} host" for k in ks))
    r.claim("replaying a CUDA graph is much faster than issuing the ops for repeated patterns",
            tutorial=None, measured=win, unit="x", held=win >= GRAPH_WIN,
            why=f"{per_op_change(win)} host time per op at K={kb}; holds at >= {GRAPH_WIN}x")


@run.plot
def plot(result, ax) -> None:
    rows = [x for x in result.rows if x["impl"] == "cudalab"]
    ks = [x["k"] for x in rows]
    ax.plot(ks, [x["eager_host_us_per_op"] for x in rows], "o-", label="eager (host)")
    ax.plot(ks, [x["replay_host_us_per_op"] for x in rows], "s-", label="replay (host)")
    ax.plot(ks, [x["capture_plus_replay_ms"] * 1e3 / x["k"] for x in rows], "^--",
            label="capture + one replay (host)")
    ax.plot(ks, [x["eager_gpu_us_per_op"] for x in rows], "o:", alpha=0.6, label="eager (GPU)")
    ax.plot(ks, [x["replay_gpu_us_per_op"] for x in rows], "s:", alpha=0.6, label="replay (GPU)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ops in the chain (K)")
    ax.set_ylabel("time per op (us)")
    ax.legend(fontsize=7)
