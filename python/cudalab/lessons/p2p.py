"""Lesson 21 `p2p`: copies between GPUs, with peer access on and off, beside the host path.

The tutorials move tensors between GPUs with ``.to('cuda:1')`` (model
parallelism hands each stage's output to the next GPU that way). How fast
that is depends on the link between the GPUs and on peer access: with it on,
the copy engines write straight into the other GPU's memory over NVLink or
PCIe; with it off, the driver stages the bytes through host memory. The
lesson times a copy between every ordered pair of GPUs over a range of sizes,
with peer access on and off (`enable_peer_access` / `disable_peer_access`),
fits each sweep as ``time = latency + bytes / bandwidth``, and sets beside it
the same copy within one GPU (the device's own copy rate), the copy through
pinned host memory done by hand, and ``DeviceArray.to`` beside torch's
``.to('cuda:N')``. Every copy is checked bit for bit. Bandwidths count the
bytes copied once (a copy within one GPU also reads them: its DRAM traffic is
twice that). Peer access is left as the lesson found it.

On one GPU only the device's own copy is measured, and the lesson says what
the rest needs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from ..bench import host_clock, host_measurement
from .analysis import fit_latency_bandwidth, format_bytes_short
from . import multi_gpu as M
from .registry import LessonRun, lesson

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SEED = 21
# Peer access "changes something" when a large copy is at least this many times faster on.
PEER_HELPS = 1.1
# The direct path "beats the host" when the host-staged copy takes this many times as long.
DIRECT_BEATS_HOST = 1.5
# A peer copy "runs at the device's own rate" from this fraction of it.
NEAR_LOCAL = 0.8
# Another copy between the same GPUs (torch's) this many times faster shows that cudalab's
# peer copy leaves the link's speed unused.
LINK_UNUSED = 1.5
# A fit whose largest relative residual exceeds this does not describe the sweep.
FIT_RESIDUAL_OK = 0.25
TIMER_STAGED = "host clock: device -> pinned host -> device, synchronized"

ROW_KEYS = ("path", "src", "dst", "size", "bytes", "us", "gbps", "peer_access",
            "fit_latency_us", "fit_gbps")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def ordered_pairs(n: int) -> list[tuple[int, int]]:
    """Every ordered pair (src, dst) of n devices with src != dst."""
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def check_params(p: Mapping[str, Any]) -> tuple[int, ...]:
    """The sizes in bytes (sorted, repeats dropped) from the params; ValueError on a bad one."""
    sizes = M.float32_byte_sizes("p2p", p["sizes"])
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if len(sizes) < 2:
        raise ValueError(f"lesson 'p2p': sizes needs at least 2 different sizes (latency and "
                         f"bandwidth are fitted), got {sizes!r}")
    M.check_gpus("p2p", p["gpus"])
    v = p["repeats"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 3:
        raise ValueError(f"lesson 'p2p': repeats must be an int >= 3, got {v!r}")
    if not isinstance(p["torch"], bool):
        raise ValueError(f"lesson 'p2p': torch must be True or False, got {p['torch']!r}")
    return sizes


def peer_text(src: int, dst: int, on: tuple[float, float], off: tuple[float, float] | None,
              ratio: float | None, top: int) -> str:
    """One sentence on a pair's fitted (latency s, bandwidth B/s) with peer access on and off,
    `ratio` being the largest copy's time off / on."""
    text = (f"{src}->{dst} with peer access: {on[0] * 1e6:.1f} us + {on[1] / 1e9:.1f} GB/s")
    if off is None or ratio is None:
        return text + " (peer access could not be turned off and on here)"
    text += f"; without: {off[0] * 1e6:.1f} us + {off[1] / 1e9:.1f} GB/s"
    if ratio >= PEER_HELPS:
        return text + (f": peer access makes a {format_bytes_short(top)} copy {ratio:.2f}x "
                       f"faster (no staging through the host)")
    if ratio <= 1 / PEER_HELPS:
        return text + f": peer access made a {format_bytes_short(top)} copy slower ({ratio:.2f}x)"
    return text + (f": peer access changes nothing that matters at {format_bytes_short(top)} "
                   f"({ratio:.2f}x)")


def local_text(peer_bw: float, local_bw: float, top: int, other_bw: float | None = None) -> str:
    """The best peer bandwidth against the device's own copy of the same size, and against
    `other_bw`, the fastest other copy between the same GPUs (torch's .to), when given."""
    share = peer_bw / local_bw if local_bw > 0 else math.nan
    text = (f"At {format_bytes_short(top)} the fastest peer copy moves {peer_bw / 1e9:.1f} GB/s, "
            f"{100 * share:.0f}% of a copy within one GPU ({local_bw / 1e9:.1f} GB/s, counting "
            f"the bytes once)")
    if other_bw is not None and other_bw >= LINK_UNUSED * peer_bw:
        return text + (f"; torch's .to moves {other_bw / 1e9:.1f} GB/s between the same GPUs: "
                       f"the link carries {other_bw / peer_bw:.1f}x more, so cudalab's copy is "
                       f"not going GPU to GPU at the link's speed")
    if share >= NEAR_LOCAL:
        return text + ": the link keeps up with the GPU's own memory"
    return text + ": the link, not the GPU's memory, bounds a copy between GPUs"


def fit_or_none(sizes: Sequence[int],
                seconds: Sequence[float]) -> tuple[float, float, float] | None:
    """fit_latency_bandwidth, or None with fewer than two sizes."""
    if len(set(sizes)) < 2:
        return None
    return fit_latency_bandwidth(sizes, seconds)


# ---- measuring -----------------------------------------------------------------------------


def _label(path: str, src: int, dst: int, nbytes: int) -> str:
    return f"{path} {src}->{dst} {format_bytes_short(nbytes)}"


class _Buffers:
    """Per device: a source filled from SEED + device, a destination, and torch's view."""

    def __init__(self, cudalab: Any, devices: Sequence[int], count: int, torch: Any) -> None:
        self.cl = cudalab
        self.src, self.dst, self.torch_src = {}, {}, {}
        for d in devices:
            with cudalab.device(d):
                self.src[d] = cudalab.random.normal((count,), dtype="float32", seed=SEED + d)
                self.dst[d] = cudalab.empty((count,), dtype="float32")
        for d in devices:
            cudalab.synchronize(d)
            if torch is not None:
                self.torch_src[d] = torch.from_dlpack(self.src[d])

    def spoil(self, dst: int) -> None:
        """Fill the destination with -1, so a copy that does nothing fails its check."""
        with self.cl.device(dst):
            self.cl.copyto(self.dst[dst], self.cl.full((1,), -1.0, dtype="float32"))

    def copy_error(self, src: int, dst: int, count: int) -> float:
        """max |dst - src's data| over the first `count` elements, on the destination GPU
        (the source's data regenerated there from its seed: the same values on any GPU)."""
        cl = self.cl
        with cl.device(dst):
            want = cl.random.normal((count,), dtype="float32", seed=SEED + src)
            diff = cl.abs(cl.sub(self.dst[dst][:count], want))
            return float(cl.max(diff).get())


def _timed(r: LessonRun, label: str, device: int, fn: Callable[[], Any], nbytes: int) -> Any:
    import cudalab

    with cudalab.device(device):
        return r.measure(label, fn, bytes=float(nbytes), ceiling=None,
                         metadata={"bytes": nbytes})


def _peer_state(cudalab: Any, pairs: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """Peer access of each ordered pair now: 'untouched' (the first copy turns it on),
    'on', 'off' or 'unavailable' (cudalab's own record; CUDA has no query)."""
    return {(i, j): cudalab._core._peer_access_state(i, j) for i, j in pairs}


def _set_peer(cudalab: Any, i: int, j: int, on: bool) -> None:
    """Peer access both ways between i and j, on or off."""
    for a, b in ((i, j), (j, i)):
        if on:
            cudalab.enable_peer_access(b, device=a)
        else:
            cudalab.disable_peer_access(b, device=a)


def _restore(cudalab: Any, state: Mapping[tuple[int, int], str]) -> None:
    """Peer access as it was: on again where it was on or untouched (what the first copy
    between the two would do), off where someone had turned it off."""
    for (i, j), was in state.items():
        if was in ("on", "untouched"):
            cudalab.enable_peer_access(j, device=i)
        elif was == "off":
            cudalab.disable_peer_access(j, device=i)


def _staged(r: LessonRun, bufs: _Buffers, src: int, dst: int, sizes: Sequence[int]) -> dict:
    """Device -> pinned host -> device, by hand, timed with the host clock per size."""
    import cudalab

    host = cudalab.pinned_empty((max(sizes) // 4,), dtype="float32")
    out = {}
    for nbytes in sizes:
        count = nbytes // 4
        view = host[:count]

        def staged(count: int = count, view: Any = view) -> None:
            bufs.src[src][:count].get(out=view)
            with cudalab.device(dst):
                cudalab.copyto(bufs.dst[dst][:count], cudalab.asarray(view))
            cudalab.synchronize(dst)

        label = _label("staged via host", src, dst, nbytes)
        [times] = host_clock({label: staged}, r.params["repeats"],
                             warmup=r.timer.settings.warmup).values()
        out[nbytes] = r.add(host_measurement(times, calls=1, label=label, timer=TIMER_STAGED,
                                             bytes=float(nbytes), host_time=False,
                                             metadata={"bytes": nbytes}))
    return out


# ---- the lesson ---------------------------------------------------------------------------


# PyTorch's spelling -> cudalab's (versus_torch pairs them).
def _torch_twin(label: str) -> str | None:
    return label.replace("torch .to", ".to", 1) if label.startswith("torch .to ") else None


@lesson(21, "p2p", title="Copies between GPUs: peer access, the link, the host path",
        seed="PyTorch 'Single-Machine Model Parallel Best Practices' (.to('cuda:1') between "
             "stages); CUDA peer-to-peer access (cudaDeviceEnablePeerAccess)",
        params={"sizes": (4 * KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB, GIB), "gpus": None,
                "repeats": 20, "torch": True},
        quick_params={"sizes": (4 * KIB, 64 * MIB), "gpus": 2, "repeats": 5},
        torch_twin=_torch_twin,
        check=check_params)
def run(r: LessonRun) -> None:
    import cudalab

    p = r.params
    sizes = check_params(p)
    present = M.gpu_count()
    n = M.gpus_used(p["gpus"], present)
    devices = list(range(n))
    torch = r.torch() if p["torch"] else None
    bufs = _Buffers(cudalab, devices, max(sizes) // 4, torch)
    top = max(sizes)
    local = {d: _local(r, bufs, d, sizes) for d in devices}
    pairs = ordered_pairs(n)
    state = _peer_state(cudalab, pairs)
    results: dict[tuple[int, int], dict[str, dict[int, Any]]] = {}
    try:
        for i, j in pairs:
            results[(i, j)] = _pair(r, cudalab, bufs, i, j, sizes, torch)
    finally:
        _restore(cudalab, state)
    for i, j in pairs:
        bufs.spoil(j)
        results[(i, j)]["staged via host"] = _staged(r, bufs, i, j, sizes)
        # The largest size is timed last: the whole destination holds its copy.
        r.check(f"staged copy {i}->host->{j} of {format_bytes_short(top)} is bit-exact "
                f"(max |difference|)", bufs.copy_error(i, j, top // 4), 0.0)
    _rows(r, local, results, sizes)
    _findings(r, local, results, state, sizes, n, present)


def _local(r: LessonRun, bufs: _Buffers, d: int, sizes: Sequence[int]) -> dict[int, Any]:
    import cudalab

    out = {}
    for nbytes in sizes:
        count = nbytes // 4
        s, t = bufs.src[d][:count], bufs.dst[d][:count]
        out[nbytes] = _timed(r, _label("copy", d, d, nbytes), d,
                             lambda s=s, t=t: cudalab.copyto(t, s), nbytes)
    bufs.spoil(d)
    cudalab.copyto(bufs.dst[d], bufs.src[d])
    r.check(f"copy within device {d} of {format_bytes_short(max(sizes))} is bit-exact "
            f"(max |difference|)", bufs.copy_error(d, d, max(sizes) // 4), 0.0)
    return out


def _pair(r: LessonRun, cudalab: Any, bufs: _Buffers, i: int, j: int, sizes: Sequence[int],
          torch: Any) -> dict[str, dict[int, Any]]:
    """One ordered pair: copyto with peer access on (and .to, torch's .to), then off."""
    out: dict[str, dict[int, Any]] = {}
    top = max(sizes)
    modes = [True, False] if cudalab.can_access_peer(i, j) and cudalab.can_access_peer(j, i) \
        else [False]
    for on in modes:
        _set_peer(cudalab, i, j, on)
        path = "peer on" if on else "peer off"
        bufs.spoil(j)
        out[path] = {}
        for nbytes in sizes:
            count = nbytes // 4
            s, t = bufs.src[i][:count], bufs.dst[j][:count]
            out[path][nbytes] = _timed(r, _label(path, i, j, nbytes), i,
                                       lambda s=s, t=t: cudalab.copyto(t, s), nbytes)
        cudalab.synchronize(j)
        r.check(f"{path} copyto {i}->{j} of {format_bytes_short(top)} is bit-exact "
                f"(max |difference|)", bufs.copy_error(i, j, top // 4), 0.0)
        if on or len(modes) == 1:
            out[".to"] = {}
            for nbytes in sizes:
                s = bufs.src[i][:nbytes // 4]
                out[".to"][nbytes] = _timed(r, _label(".to", i, j, nbytes), i,
                                            lambda s=s: s.to(j), nbytes)
            bufs.spoil(j)
            got = bufs.src[i].to(j)
            with cudalab.device(j):
                cudalab.copyto(bufs.dst[j], got)
            r.check(f"DeviceArray.to({j}) from device {i} of {format_bytes_short(top)} is "
                    f"bit-exact (max |difference|)", bufs.copy_error(i, j, top // 4), 0.0)
            if torch is not None:
                out["torch .to"] = _torch_to(r, torch, bufs, i, j, sizes)
    return out


def _torch_to(r: LessonRun, torch: Any, bufs: _Buffers, i: int, j: int,
              sizes: Sequence[int]) -> dict[int, Any]:
    out = {}
    target = f"cuda:{j}"
    for nbytes in sizes:
        t = bufs.torch_src[i][:nbytes // 4]
        out[nbytes] = _timed(r, _label("torch .to", i, j, nbytes), i,
                             lambda t=t: t.to(target), nbytes)
    import cudalab

    got = bufs.torch_src[i].to(target)
    torch.cuda.synchronize(j)
    bufs.spoil(j)
    with cudalab.device(j):
        cudalab.copyto(bufs.dst[j], cudalab.from_dlpack(got))
    r.check(f"torch .to('{target}') from cuda:{i} of {format_bytes_short(max(sizes))} is "
            f"bit-exact (max |difference|)", bufs.copy_error(i, j, max(sizes) // 4), 0.0)
    return out


def _fit_cols(fit: tuple[float, float, float] | None) -> dict[str, float | None]:
    if fit is None:
        return {"fit_latency_us": None, "fit_gbps": None}
    return {"fit_latency_us": fit[0] * 1e6, "fit_gbps": fit[1] / 1e9}


def _rows(r: LessonRun, local: dict, results: dict, sizes: Sequence[int]) -> None:
    def add(path: str, i: int, j: int, ms: dict[int, Any], peer: Any) -> None:
        fit = fit_or_none(list(ms), [m.median for m in ms.values()])
        for nbytes, m in ms.items():
            r.row(path=path, src=i, dst=j, size=format_bytes_short(nbytes), bytes=nbytes,
                  us=m.median * 1e6, gbps=nbytes / m.median / 1e9, peer_access=peer,
                  **_fit_cols(fit))

    for d, ms in local.items():
        add("copy", d, d, ms, None)
    for (i, j), paths in results.items():
        for path, ms in paths.items():
            peer = {"peer on": True, "peer off": False}.get(path)
            add(path, i, j, ms, peer)


def _findings(r: LessonRun, local: dict, results: dict, state: dict, sizes: Sequence[int],
              n: int, present: int) -> None:
    top = max(sizes)
    for d, ms in local.items():
        fit = fit_or_none(sizes, [ms[s].median for s in sizes])
        lat, bw, res = fit
        r.finding(f"Within device {d}: {lat * 1e6:.1f} us + {bw / 1e9:.0f} GB/s (bytes copied "
                  f"once; the fit holds within {100 * res:.0f}%)", value=bw / 1e9, unit="GB/s",
                  labels=tuple(m.label for m in ms.values()))
    if n < 2:
        r.finding(M.needs_text("Copies between GPUs (peer access on and off, the host path, "
                               ".to('cuda:1'))", 2, present), value=present, unit="GPUs")
        return
    capable = [k for k in ordered_pairs(n) if results[k].get("peer on") is not None]
    on_before = [k for k, v in state.items() if v == "on"]
    r.finding(f"{len(capable)} of {len(state)} ordered pairs of GPUs can access each other's "
              f"memory (can_access_peer both ways); {len(on_before)} had peer access on before "
              f"the lesson ({', '.join(f'{i}->{j}' for i, j in on_before) or 'none'}), and the "
              f"lesson left it so", value=len(capable))
    best_peer, best_pair = 0.0, None
    ratios, host_ratios = [], []
    for (i, j), paths in results.items():
        on, off = paths.get("peer on"), paths.get("peer off")
        main = on if on is not None else off
        fit_on = fit_or_none(sizes, [main[s].median for s in sizes])
        fit_off = None if on is None or off is None else fit_or_none(
            sizes, [off[s].median for s in sizes])
        ratio = None if on is None or off is None else off[top].median / on[top].median
        if ratio is not None:
            ratios.append(ratio)
        labels = [m.label for d in (on, off) if d is not None for m in d.values()]
        r.finding(peer_text(i, j, fit_on[:2], None if fit_off is None else fit_off[:2], ratio,
                            top), value=fit_on[1] / 1e9, unit="GB/s", labels=tuple(labels))
        bw = top / main[top].median
        if bw > best_peer:
            best_peer, best_pair = bw, (i, j)
        host = paths["staged via host"][top]
        host_ratios.append(host.median / main[top].median)
    i, j = best_pair
    local_bw = top / local[i][top].median
    main = results[best_pair].get("peer on") or results[best_pair]["peer off"]
    theirs = results[best_pair].get("torch .to")
    other = None if theirs is None else top / theirs[top].median
    labels = (main[top].label, local[i][top].label) + (() if theirs is None else
                                                        (theirs[top].label,))
    r.finding(local_text(best_peer, local_bw, top, other), value=best_peer / local_bw, unit="x",
              labels=labels)
    host = results[best_pair]["staged via host"][top]
    r.finding(f"Through pinned host memory by hand, {i}->{j} moves "
              f"{format_bytes_short(top)} at {top / host.median / 1e9:.1f} GB/s: the direct "
              f"copy is {host.median / main[top].median:.1f}x faster",
              value=host.median / main[top].median, unit="x", labels=(host.label, main[top].label))
    _torch_finding(r, results, best_pair, top)
    worst_host = min(host_ratios)
    r.claim("Copying between GPUs (.to('cuda:1')) goes GPU to GPU, far faster than through "
            "the host", tutorial=None, measured=worst_host, unit="x",
            held=worst_host >= DIRECT_BEATS_HOST,
            why=f"at {format_bytes_short(top)} the slowest pair's direct copy is "
                f"{worst_host:.1f}x the host-staged one; holds from {DIRECT_BEATS_HOST}x")
    if ratios:
        low = min(ratios)
        r.claim("Enabling peer access speeds up copies between GPUs", tutorial=None,
                measured=low, unit="x", held=low >= PEER_HELPS,
                why=f"{format_bytes_short(top)} copies, peer access off / on: {low:.2f}x to "
                    f"{max(ratios):.2f}x over {len(ratios)} pairs; holds from {PEER_HELPS}x")


def _torch_finding(r: LessonRun, results: dict, pair: tuple[int, int], top: int) -> None:
    paths = results[pair]
    ours, theirs = paths.get(".to"), paths.get("torch .to")
    if ours is None or theirs is None:
        return
    i, j = pair
    small = min(ours)
    big, little = theirs[top].median / ours[top].median, theirs[small].median / ours[small].median
    r.finding(f"DeviceArray.to({j}) from device {i} vs torch's .to('cuda:{j}'): torch takes "
              f"{big:.2f}x cudalab's time at {format_bytes_short(top)} and {little:.2f}x at "
              f"{format_bytes_short(small)} (both allocate the destination from their pool)",
              value=big, unit="x",
              labels=(ours[top].label, theirs[top].label, ours[small].label, theirs[small].label))


@run.plot
def plot(result: Any, ax: Any) -> None:
    styles = {"copy": "k-", "peer on": "o-", "peer off": "s--", ".to": "^-",
              "torch .to": "v:", "staged via host": "x-."}
    seen = set()
    for x in result.rows:
        key = (x["path"], x["src"], x["dst"])
        if key in seen:
            continue
        seen.add(key)
        pts = sorted((y["bytes"], y["gbps"]) for y in result.rows
                     if (y["path"], y["src"], y["dst"]) == key)
        ax.plot([q[0] for q in pts], [q[1] for q in pts], styles.get(x["path"], "-"),
                label=f"{x['path']} {x['src']}->{x['dst']}", alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("copy size (bytes)")
    ax.set_ylabel("GB/s (bytes copied once)")
    ax.legend(fontsize=6, ncol=2)
