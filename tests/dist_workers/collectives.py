"""Worker: every collective and every dtype against NumPy, on any world size.

    python -m cudalab.distributed.run --nproc-per-node 2 collectives.py [--quick] [--timeout S]
    python collectives.py                 # a world of 1 (no launcher variables)

Every rank makes every rank's data (random, never zero, seeded by check and
rank), so each can compute the NumPy reference itself. Each check runs in
its own try block and is reported by name: one GPU run tells about all of
them. The ranks run the same checks in the same order; a check that fails
on one rank only would leave the other waiting in NCCL, which the watchdog
(--timeout) turns into errors instead of a hang.

Reports ``{"checks": [{"name", "ok", "error"}], "world_size", "env", ...}``
into rank<r>.json (see _common.py) and exits 0 when every check passed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import _common

RANK = _common.started()

import numpy as np  # noqa: E402

import cudalab  # noqa: E402
import cudalab.distributed as dist  # noqa: E402
from _support import BF16, BOOL, DTYPES, is_float, random_array, rel_err, tolerance  # noqa: E402

OPS = ("sum", "prod", "max", "min", "avg")
_seeds = itertools.count(1)


def data(seed: int, rank: int, shape, dtype) -> np.ndarray:
    """Rank `rank`'s input of a check: the same on every rank that asks."""
    rng = np.random.default_rng([seed, rank])
    dtype = np.dtype(dtype)
    if dtype == BOOL or is_float(dtype):
        return random_array(rng, shape, dtype)
    # Small integers: a sum or product over a few ranks stays inside int8.
    limits = {"int8": (-5, 6), "uint8": (1, 8)}.get(dtype.name, (-1000, 1001))
    return random_array(rng, shape, dtype, low=limits[0], high=limits[1])


def reference(arrays, op: str, dtype) -> np.ndarray:
    """NumPy's `op` over the ranks' arrays, in float64 / int64 (bool: logical)."""
    dtype = np.dtype(dtype)
    stack = np.stack([np.asarray(a) for a in arrays])
    if dtype == BOOL:
        return stack.any(0) if op in ("sum", "avg", "max") else stack.all(0)
    wide = stack.astype(np.float64 if is_float(dtype) else np.int64)
    if op == "sum":
        return wide.sum(0)
    if op == "prod":
        return wide.prod(0)
    if op == "max":
        return wide.max(0)
    if op == "min":
        return wide.min(0)
    return wide.sum(0) / len(arrays)


def expect(got, want, dtype, what: str, exact: bool = False) -> None:
    """`got` (DeviceArray or ndarray) equals `want` (exactly for ints, bool, copies)."""
    dtype = np.dtype(dtype)
    host = got.get() if isinstance(got, cudalab.DeviceArray) else np.asarray(got)
    want = np.asarray(want)
    assert host.dtype == dtype, f"{what}: dtype {host.dtype}, expected {dtype}"
    assert host.shape == want.shape, f"{what}: shape {host.shape}, expected {want.shape}"
    if exact or not is_float(dtype):
        bad = host != want.astype(dtype)
        assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements differ; first "
                               f"at {np.argwhere(bad)[0].tolist()}: got "
                               f"{host[bad].ravel()[0]!r}, expected "
                               f"{want.astype(dtype)[bad].ravel()[0]!r}")
        return
    err = rel_err(host.astype(np.float64), want.astype(np.float64))
    assert err < tolerance(dtype), f"{what}: relative error {err:.3g} >= {tolerance(dtype):g}"


def raises(exc_type, fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return str(exc)
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


class Checks:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def run(self, name: str, fn, *args) -> None:
        start = time.perf_counter()
        try:
            fn(*args)
        except Exception as exc:  # reported by name; the next check still runs
            self.items.append({"name": name, "ok": False, "error": _common.error_text(exc)})
        else:
            self.items.append({"name": name, "ok": True,
                               "ms": round((time.perf_counter() - start) * 1e3, 2)})


# ---- the checks -----------------------------------------------------------------------


def check_all_reduce(W, r, dtype, op, shape, i):
    seed = next(_seeds)
    hosts = [data(seed, q, shape, dtype) for q in range(W)]
    x = cudalab.asarray(hosts[r])
    op_arg = op if i % 2 else dist.ReduceOp(op)  # names and members both
    if op == "avg" and dtype != BOOL and not is_float(dtype):
        raises(ValueError, dist.all_reduce, x, op_arg)
        return
    assert dist.all_reduce(x, op_arg) is None, "the synchronous form returns None"
    expect(x, reference(hosts, op, dtype), dtype, f"all_reduce {op}")


def check_all_reduce_async(W, r, dtype):
    seed = next(_seeds)
    hosts = [data(seed, q, (257,), dtype) for q in range(W)]
    x = cudalab.asarray(hosts[r])
    work = dist.all_reduce(x, "max", async_op=True)
    assert isinstance(work, dist.Work), f"async_op=True returned {type(work).__name__}"
    assert work.wait() is True
    expect(x, reference(hosts, "max", dtype), dtype, "all_reduce async (wait)")
    y = cudalab.asarray(hosts[r])
    work = dist.all_reduce(y, "min", async_op=True)
    work.synchronize()
    assert work.is_completed(), "is_completed() is False after synchronize()"
    expect(y, reference(hosts, "min", dtype), dtype, "all_reduce async (synchronize)")


def check_all_reduce_strided(W, r, dtype, layout):
    seed = next(_seeds)
    roots = [data(seed, q, (5, 14), dtype) for q in range(W)]
    view_of = {"stepped": lambda a: a[:, ::2], "transposed": lambda a: a.T,
               "offset": lambda a: a[1:, 3:]}[layout]
    root = cudalab.asarray(roots[r])
    view = view_of(root)
    assert not view.is_contiguous
    dist.all_reduce(view, "sum")
    want = roots[r].copy()
    view_of(want)[...] = reference([view_of(h) for h in roots], "sum", dtype).astype(dtype)
    expect(root, want, dtype, f"all_reduce of a {layout} view (the whole root)")


def check_broadcast(W, r, dtype, src, layout):
    seed = next(_seeds)
    if layout == "contiguous":
        hosts = [data(seed, q, (3, 67), dtype) for q in range(W)]
        x = cudalab.asarray(hosts[r])
        assert dist.broadcast(x, src) is None
        expect(x, hosts[src], dtype, f"broadcast from {src}", exact=True)
        return
    roots = [data(seed, q, (9, 8), dtype) for q in range(W)]
    root = cudalab.asarray(roots[r])
    work = dist.broadcast(root[::2, 1:], src=src, async_op=True)
    work.wait()
    want = roots[r].copy()
    want[::2, 1:] = roots[src][::2, 1:]
    expect(root, want, dtype, f"broadcast of a strided view from {src}, async", exact=True)


def check_reduce(W, r, dtype, op, dst):
    seed = next(_seeds)
    hosts = [data(seed, q, (131,), dtype) for q in range(W)]
    x = cudalab.asarray(hosts[r])
    assert dist.reduce(x, dst, op) is None
    if r == dst:
        expect(x, reference(hosts, op, dtype), dtype, f"reduce {op} to {dst}")
    else:
        expect(x, hosts[r], dtype, f"reduce {op} to {dst}: a non-root's array", exact=True)


def check_all_gather(W, r, dtype, form):
    seed = next(_seeds)
    shape = (3, 11)
    hosts = [data(seed, q, shape, dtype) for q in range(W)]
    want = np.stack(hosts)
    if form == "array":
        x = cudalab.asarray(hosts[r])
        out = cudalab.empty((W, *shape), dtype=dtype)
        assert dist.all_gather(out, x) is None
        expect(out, want, dtype, "all_gather", exact=True)
    elif form == "list":
        x = cudalab.asarray(hosts[r])
        outs = [cudalab.empty(shape, dtype=dtype) for _ in range(W)]
        dist.all_gather(outs, x)
        for q, o in enumerate(outs):
            expect(o, hosts[q], dtype, f"all_gather list item {q}", exact=True)
    else:  # strided input and output, async
        roots = [data(seed, q, (3, 22), dtype) for q in range(W)]
        x = cudalab.asarray(roots[r])[:, ::2]
        out_root = cudalab.zeros((W, 3, 23), dtype=dtype)
        dist.all_gather(out_root[:, :, 1::2], x, async_op=True).wait()
        want = np.zeros((W, 3, 23), dtype=dtype)
        want[:, :, 1::2] = np.stack([h[:, ::2] for h in roots])
        expect(out_root, want, dtype, "all_gather strided, async", exact=True)


def check_reduce_scatter(W, r, dtype, op, form):
    seed = next(_seeds)
    shape = (2, 9)
    hosts = [data(seed, q, (W, *shape), dtype) for q in range(W)]
    want = reference([h[r] for h in hosts], op, dtype)
    if form == "array":
        x = cudalab.asarray(hosts[r])
        out = cudalab.empty(shape, dtype=dtype)
        assert dist.reduce_scatter(out, x, op) is None
        expect(out, want, dtype, f"reduce_scatter {op}")
    elif form == "list":
        xs = [cudalab.asarray(hosts[r][q]) for q in range(W)]
        out = cudalab.empty(shape, dtype=dtype)
        dist.reduce_scatter(out, xs, op)
        expect(out, want, dtype, f"reduce_scatter {op}, list input")
    else:  # strided output, async
        x = cudalab.asarray(hosts[r])
        out_root = cudalab.asarray(np.asarray(hosts[r][0]).T.copy())  # (9, 2) holder
        view = out_root.T  # (2, 9), not contiguous
        dist.reduce_scatter(view, x, op, async_op=True).wait()
        expect(view.copy(), want, dtype, f"reduce_scatter {op}, strided output, async")


def check_all_to_all(W, r, dtype, async_op):
    seed = next(_seeds)
    hosts = [data(seed, q, (W, 37), dtype) for q in range(W)]
    x = cudalab.asarray(hosts[r])
    out = cudalab.empty((W, 37), dtype=dtype)
    work = dist.all_to_all(out, x, async_op=async_op)
    if async_op:
        work.wait()
    want = np.stack([hosts[q][r] for q in range(W)])
    expect(out, want, dtype, f"all_to_all{' async' if async_op else ''}", exact=True)


def check_send_recv(W, r, dtype, strided):
    """Rank 0 sends to 1, then 1 sends back to 0 (each receives before it sends)."""
    seed = next(_seeds)
    shape = (4, 33)
    a = data(seed, 0, shape, dtype)   # 0 -> 1
    b = data(seed, 1, shape, dtype)   # 1 -> 0

    def recv_into(src):
        if not strided:
            buf = cudalab.empty(shape, dtype=dtype)
            dist.recv(buf, src)
            return buf
        holder = cudalab.zeros((shape[1], shape[0]), dtype=dtype)
        dist.recv(holder.T, src)  # a non-contiguous target
        return holder.T

    def send_from(host, dst):
        if not strided:
            dist.send(cudalab.asarray(host), dst)
        else:
            dist.send(cudalab.asarray(np.ascontiguousarray(host.T)).T, dst)

    if r == 0:
        send_from(a, 1)
        expect(recv_into(1), b, dtype, "recv on rank 0 from rank 1", exact=True)
    elif r == 1:
        expect(recv_into(0), a, dtype, "recv on rank 1 from rank 0", exact=True)
        send_from(b, 0)


def check_barrier(W, r):
    dist.barrier()  # line up
    start = time.perf_counter()
    if r == 1:
        time.sleep(0.5)  # the late rank: the others must wait for it in barrier()
    dist.barrier()
    waited = time.perf_counter() - start
    if r == 0 and W > 1:
        assert waited >= 0.3, f"barrier() returned after {waited:.3f} s, before rank 1 arrived"


def check_graph(W, r, dtype):
    seed = next(_seeds)
    hosts = [data(seed, q, (1001,), dtype) for q in range(W)]
    x = cudalab.asarray(hosts[r])
    out = cudalab.empty((W, 1001), dtype=dtype)
    g = cudalab.CUDAGraph()
    with cudalab.graph(g):
        dist.all_reduce(x, "sum")
        dist.all_gather(out, x)
    expect(x, hosts[r], dtype, "capture must not run the all_reduce", exact=True)
    once = reference(hosts, "sum", dtype)
    g.replay()
    expect(x, once, dtype, "all_reduce replayed once")
    expect(out, np.stack([once] * W), dtype, "all_gather replayed once")
    g.replay()
    expect(x, once * W, dtype, "all_reduce replayed twice")


def check_argument_errors(W, r):
    x = cudalab.ones((6,), dtype=np.float32)
    msg = raises(TypeError, dist.all_gather, cudalab.empty((W * 6,), dtype=np.int32), x)
    assert "dtype" in msg, msg
    raises(ValueError, dist.all_gather, cudalab.empty((W * 6 + 1,), dtype=np.float32), x)
    raises(ValueError, dist.reduce_scatter, cudalab.empty((7,), dtype=np.float32), x)
    raises(ValueError, dist.broadcast, x, W)
    raises(ValueError, dist.all_reduce, cudalab.ones((3,), dtype=np.int32), "avg")
    raises(ValueError, dist.send, x, r)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few dtypes and shapes")
    parser.add_argument("--timeout", type=float, default=60.0, help="watchdog seconds")
    args = parser.parse_args()
    start = time.monotonic()
    try:
        group = dist.init(timeout=args.timeout)
    except Exception as exc:
        _common.report(RANK, init_error=_common.error_text(exc), checks=[])
        return 1
    W, r = group.world_size, group.rank
    launch = dist.env.from_environ()
    dtypes = [np.dtype(np.float32), BF16, np.dtype(np.int64), BOOL] if args.quick else DTYPES
    shapes = [(1001,)] if args.quick else [(1,), (1001,), (3, 5, 7)]
    checks = Checks()
    for i, dtype in enumerate(dtypes):
        for op in OPS:
            for shape in shapes:
                checks.run(f"all_reduce {op} {dtype.name} {shape}", check_all_reduce,
                           W, r, dtype, op, shape, i)
        checks.run(f"all_reduce async {dtype.name}", check_all_reduce_async, W, r, dtype)
        for src in range(W):
            for layout in ("contiguous", "strided"):
                checks.run(f"broadcast {dtype.name} src={src} {layout}", check_broadcast,
                           W, r, dtype, src, layout)
        for dst in range(W):
            for op in ("sum", "max"):
                checks.run(f"reduce {op} {dtype.name} dst={dst}", check_reduce,
                           W, r, dtype, op, dst)
        for form in ("array", "list", "strided"):
            checks.run(f"all_gather {dtype.name} {form}", check_all_gather, W, r, dtype, form)
            for op in ("sum", "min"):
                checks.run(f"reduce_scatter {op} {dtype.name} {form}", check_reduce_scatter,
                           W, r, dtype, op, form)
        for async_op in (False, True):
            checks.run(f"all_to_all {dtype.name} async={async_op}", check_all_to_all,
                       W, r, dtype, async_op)
        if W > 1:
            for strided in (False, True):
                checks.run(f"send/recv {dtype.name} strided={strided}", check_send_recv,
                           W, r, dtype, strided)
    for dtype in (np.dtype(np.float32), np.dtype(np.int32)):
        for layout in ("stepped", "transposed", "offset"):
            checks.run(f"all_reduce {dtype.name} {layout} view", check_all_reduce_strided,
                       W, r, dtype, layout)
    checks.run("argument errors", check_argument_errors, W, r)
    checks.run("barrier", check_barrier, W, r)
    for dtype in (np.dtype(np.float32), np.dtype(np.int32)):
        checks.run(f"CUDA graph {dtype.name}", check_graph, W, r, dtype)
    try:
        cudalab.synchronize()
        dist.barrier()
        dist.destroy()
    except Exception as exc:
        checks.items.append({"name": "final barrier and destroy", "ok": False,
                             "error": _common.error_text(exc)})
    _common.report(
        r, world_size=W, device=group.device, local_rank=group.local_rank,
        launcher=group.launcher, env=launch.__dict__, hosts=[p.get("host") for p in group.peers],
        nccl_version=list(dist.nccl_version()), seconds=round(time.monotonic() - start, 2),
        checks=checks.items)
    return 0 if all(c["ok"] for c in checks.items) else 1


if __name__ == "__main__":
    sys.exit(main())
