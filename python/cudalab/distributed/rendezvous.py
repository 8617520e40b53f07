"""The rendezvous: every rank meets rank 0 once, before NCCL, over plain TCP.

Rank 0 listens on ``MASTER_PORT`` (all interfaces, ``SO_REUSEADDR``); every
other rank connects to ``MASTER_ADDR:MASTER_PORT`` (retrying until rank 0
listens, up to the deadline) and sends one message: its rank, the world size
it was told and a small JSON payload (host, pid, local rank, GPU uuid, NCCL
version). When every rank has arrived, rank 0 checks the payloads together
and answers each rank with all of them plus its own extra data (the NCCL
unique id); or, when something is wrong, with one error that every rank
raises. Rank 0 acknowledges each hello at once with the seconds left before
its deadline, and the rank waits that long for the answer: a rank that came
reports rank 0's reason (which names the missing ranks) rather than a
timeout of its own. What rank 0 checks:

* every rank once, each with the same world size;
* no two ranks on one GPU (the same device uuid): the tutorials' "global
  rank as device index" bug on a second node, or ``LOCAL_RANK`` ignored;
* the same value of every key in ``same`` (the NCCL version).

Every wait is bounded by one deadline, ``timeout`` seconds after the call:
rank 0's error names the ranks that never arrived, the port and the seconds
it waited; another rank's names rank 0's address and the seconds.

Messages are length-prefixed JSON: a 4-byte big-endian length, then UTF-8
JSON of at most 1 MiB. A connection that does not speak the protocol (a port
scanner, a health check) is dropped and the rendezvous goes on.

Under a torchrun whose agent already serves ``MASTER_PORT`` (its TCPStore,
``TORCHELASTIC_USE_AGENT_STORE=True``), :func:`rendezvous_store` does the same
exchange through that store instead.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .._core import DistributedError

__all__ = ["PROTOCOL", "RendezvousResult", "RendezvousServer", "check_payloads", "join",
           "rendezvous", "rendezvous_store"]

PROTOCOL = "cudalab-rendezvous/1"
_MAX_MESSAGE = 1 << 20
# How long rank 0 gives an accepted connection to send its hello (ranks send
# it at once; a silent connection is not one of ours).
_HELLO_SECONDS = 5.0
# After rank 0's acknowledgement, a rank waits for the answer until rank 0's
# deadline plus this (rank 0's failure message is what it should report).
_ANSWER_SLACK = 2.0
# Rank 0 not listening yet: retry after 0.05 s, doubling up to 1 s.
_RETRY_FIRST, _RETRY_MAX = 0.05, 1.0


@dataclasses.dataclass(frozen=True)
class RendezvousResult:
    """What every rank knows after the rendezvous.

    Attributes
    ----------
    rank, world_size : int
        This rank and the world size.
    payloads : tuple of dict
        Every rank's payload, indexed by rank.
    extra : dict
        Rank 0's extra data (the NCCL unique id).
    """

    rank: int
    world_size: int
    payloads: tuple[dict, ...]
    extra: dict


# ---- checks ----------------------------------------------------------------------------


def _who(rank: int, payload: Mapping[str, Any]) -> str:
    host, pid = payload.get("host"), payload.get("pid")
    where = ", ".join(p for p in (f"host {host}" if host else "",
                                  f"pid {pid}" if pid is not None else "") if p)
    return f"rank {rank} ({where})" if where else f"rank {rank}"


def check_payloads(payloads: Sequence[Mapping[str, Any]], same: Sequence[str] = ()) -> None:
    """check_payloads(payloads, same=())

    Raise DistributedError when two ranks use one GPU (equal non-empty
    ``"device_uuid"``) or when the ranks disagree on a key of `same`.
    """
    seen: dict[str, int] = {}
    for rank, p in enumerate(payloads):
        uuid = p.get("device_uuid")
        if not uuid:
            continue
        if uuid in seen:
            first = seen[uuid]
            raise DistributedError(
                f"rendezvous: {_who(first, payloads[first])} and {_who(rank, p)} both use GPU "
                f"{uuid} (device {p.get('device')}); each rank needs its own GPU: pick the "
                "device from LOCAL_RANK, not RANK, and start at most as many processes per "
                "node as it has GPUs")
        seen[uuid] = rank
    for key in same:
        values = {}
        for rank, p in enumerate(payloads):
            values.setdefault(repr(p.get(key)), []).append(rank)
        if len(values) > 1:
            parts = "; ".join(f"{v} on ranks {r}" for v, r in values.items())
            raise DistributedError(f"rendezvous: the ranks disagree on {key}: {parts}")


# ---- framing ---------------------------------------------------------------------------


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 65536))
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict:
    (length,) = struct.unpack(">I", _recv_exact(sock, 4))
    if length > _MAX_MESSAGE:
        raise ValueError(f"message of {length} bytes")
    message = json.loads(_recv_exact(sock, length).decode("utf-8"))
    if not isinstance(message, dict) or message.get("protocol") != PROTOCOL:
        raise ValueError("not a cudalab rendezvous message")
    return message


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _check_args(func: str, rank: Any, world_size: Any, timeout: Any) -> float:
    for name, value, low in (("world_size", world_size, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{func}() argument '{name}': expected an int, "
                            f"got {type(value).__name__}")
        if value < low:
            raise ValueError(f"{func}() argument '{name}': must be >= {low}, got {value}")
    if rank >= world_size:
        raise ValueError(f"{func}() argument 'rank': must be below world_size "
                         f"({world_size}), got {rank}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{func}() argument 'timeout': expected seconds as a number, "
                        f"got {type(timeout).__name__}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"{func}() argument 'timeout': must be positive and finite, "
                         f"got {timeout}")
    return float(timeout)


def _check_port(func: str, port: Any, allow_zero: bool = False) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{func}() argument 'port': expected an int, got {type(port).__name__}")
    if not (0 if allow_zero else 1) <= port <= 65535:
        raise ValueError(f"{func}() argument 'port': must be in [{0 if allow_zero else 1}, "
                         f"65535], got {port}")
    return port


# ---- rank 0 ----------------------------------------------------------------------------


class RendezvousServer:
    """Rank 0's side: listens at once, then :meth:`run` waits for the others.

    RendezvousServer(world_size, port, *, host="", master_addr=None)

    Binding in the constructor lets a caller learn the port before the other
    ranks start (``port=0`` picks a free one). Use as a context manager or
    call :meth:`close`.

    Parameters
    ----------
    world_size : int
    port : int
        0 for any free port (see :attr:`port`).
    host : str
        The interface to bind; "" is every interface (IPv4 and, where the
        system has it, IPv6).
    master_addr : str, optional
        The address the other ranks were given, for messages.

    Raises
    ------
    DistributedError
        The port cannot be bound (in use by another job, ...).
    """

    def __init__(self, world_size: int, port: int, *, host: str = "",
                 master_addr: str | None = None) -> None:
        _check_args("RendezvousServer", 0, world_size, 1.0)
        _check_port("RendezvousServer", port, allow_zero=True)
        self.world_size = world_size
        self.master_addr = master_addr
        self._sock: socket.socket | None = None
        try:
            if host == "" and socket.has_dualstack_ipv6():
                try:
                    self._sock = socket.create_server(("", port), family=socket.AF_INET6,
                                                      dualstack_ipv6=True, backlog=128)
                except OSError:
                    self._sock = None
            if self._sock is None:
                # create_server sets SO_REUSEADDR on POSIX: a port left in
                # TIME_WAIT by the previous job can be bound again at once.
                self._sock = socket.create_server((host or "0.0.0.0", port), backlog=128)
        except OSError as exc:
            raise DistributedError(
                f"rendezvous: rank 0 cannot listen on port {port} ({exc.strerror or exc}); "
                "another job may be using it: pick another MASTER_PORT") from None
        self.port: int = self._sock.getsockname()[1]

    def __enter__(self) -> RendezvousServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _where(self) -> str:
        return f"{self.master_addr}:{self.port}" if self.master_addr else f"port {self.port}"

    def run(self, payload: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
            *, timeout: float = 600.0, same: Sequence[str] = ()) -> RendezvousResult:
        """run(payload=None, extra=None, *, timeout=600.0, same=()) -> RendezvousResult

        Wait up to `timeout` seconds for ranks 1..world_size-1, check them,
        and answer each with every payload and `extra`. Closes the server.

        Raises
        ------
        DistributedError
            Ranks missing at the deadline (named, with the seconds waited),
            a rank twice, another world size, two ranks on one GPU, a
            disagreement on a key of `same`. The ranks already connected
            are sent the same message.
        """
        timeout = _check_args("run", 0, self.world_size, timeout)
        if self._sock is None:
            raise DistributedError("rendezvous: the server was closed")
        start = time.monotonic()
        deadline = start + timeout
        payload = dict(payload or {})
        extra = dict(extra or {})
        conns: dict[int, tuple[socket.socket, dict]] = {}
        try:
            while len(conns) < self.world_size - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [r for r in range(1, self.world_size) if r not in conns]
                    arrived = [0, *sorted(conns)]
                    self._fail(conns, None, (
                        f"rendezvous timed out: rank 0 waited {time.monotonic() - start:.1f} s "
                        f"on {self._where()} for {self.world_size} ranks; "
                        f"{_ranks_text(missing)} never arrived (arrived: "
                        f"{', '.join(map(str, arrived))}). Did every rank start, with the same "
                        "MASTER_ADDR and MASTER_PORT?"))
                self._sock.settimeout(remaining)
                try:
                    conn, _ = self._sock.accept()
                except (socket.timeout, InterruptedError):
                    continue
                hello = self._hello(conn, min(remaining, _HELLO_SECONDS))
                if hello is None:
                    continue
                rank, size, their = hello
                if size != self.world_size:
                    self._fail(conns, conn, (
                        f"rendezvous: {_who(rank, their)} was started with world size {size}, "
                        f"rank 0 with {self.world_size}: every rank must get the same "
                        "WORLD_SIZE"))
                if not 0 <= rank < size or rank in conns or rank == 0:
                    if not 0 <= rank < size:
                        why = f"{_who(rank, their)} is out of range for world size {size}"
                    else:
                        first = payload if rank == 0 else conns[rank][1]
                        why = (f"rank {rank} arrived twice: {_who(rank, first)} and "
                               f"{_who(rank, their)}; every rank needs its own RANK")
                    self._fail(conns, conn, f"rendezvous: {why}")
                conns[rank] = (conn, their)
                # Tell the rank how long to wait for the answer: until this
                # deadline (its own may come sooner), so it hears why we failed.
                try:
                    _send(conn, {"protocol": PROTOCOL, "ack": True,
                                 "seconds_left": max(deadline - time.monotonic(), 0.0)})
                except OSError:
                    pass  # it left: noticed when the answer cannot be sent
            payloads = [payload] + [conns[r][1] for r in range(1, self.world_size)]
            try:
                check_payloads(payloads, same)
            except DistributedError as exc:
                self._fail(conns, None, str(exc))
            answer = {"protocol": PROTOCOL, "ok": True, "payloads": payloads, "extra": extra}
            lost = []
            for rank, (conn, _) in sorted(conns.items()):
                try:
                    conn.settimeout(max(deadline - time.monotonic(), _HELLO_SECONDS))
                    _send(conn, answer)
                except OSError:
                    lost.append(rank)
            if lost:
                raise DistributedError(
                    f"rendezvous: {_ranks_text(lost)} disconnected before rank 0's answer "
                    f"(on {self._where()}); the ranks that got it will wait for them in NCCL")
            return RendezvousResult(0, self.world_size, tuple(payloads), extra)
        finally:
            for conn, _ in conns.values():
                _close(conn)
            self.close()

    def _hello(self, conn: socket.socket, seconds: float) -> tuple[int, int, dict] | None:
        """(rank, world_size, payload) of a new connection; None (closed) if it is not a rank."""
        try:
            conn.settimeout(seconds)
            msg = _recv(conn)
            rank, size, their = msg["rank"], msg["world_size"], msg.get("payload", {})
            if not (type(rank) is int and type(size) is int and isinstance(their, dict)):
                raise ValueError("bad hello")
        except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError):
            _close(conn)
            return None
        return rank, size, their

    def _fail(self, conns: dict, conn: socket.socket | None, message: str) -> None:
        """Tell every connected rank (and `conn`) `message`, then raise it."""
        answer = {"protocol": PROTOCOL, "ok": False, "error": message}
        for c in [c for c, _ in conns.values()] + ([conn] if conn is not None else []):
            try:
                c.settimeout(1.0)
                _send(c, answer)
            except OSError:
                pass
        if conn is not None:
            _close(conn)
        raise DistributedError(message)


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, ranks[:16])) + (", ..." if len(ranks) > 16 else "")
    return f"ranks {shown} ({len(ranks)})"


# ---- the other ranks -------------------------------------------------------------------


def join(rank: int, world_size: int, master_addr: str, master_port: int,
         payload: Mapping[str, Any] | None = None, *, timeout: float = 600.0) -> RendezvousResult:
    """join(rank, world_size, master_addr, master_port, payload=None, *, timeout=600.0)

    A rank other than 0: reach rank 0 (retrying until it listens), send the
    payload, wait for the answer. Everything within `timeout` seconds.

    Raises
    ------
    DistributedError
        Rank 0 not reached, no answer, or rank 0's error (the rendezvous
        failed: its message says why). Names the rank, the address and the
        seconds.
    """
    timeout = _check_args("join", rank, world_size, timeout)
    _check_port("join", master_port)
    if rank == 0:
        raise ValueError("join() argument 'rank': rank 0 runs the server (RendezvousServer)")
    where = f"{master_addr}:{master_port}"
    start = time.monotonic()
    deadline = start + timeout
    delay, last = _RETRY_FIRST, "no attempt"
    conn = None
    while conn is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DistributedError(
                f"rendezvous: rank {rank} could not reach rank 0 at {where} within "
                f"{time.monotonic() - start:.1f} s ({last}); is rank 0 running, and are "
                "MASTER_ADDR and MASTER_PORT the same on every rank?")
        try:
            conn = socket.create_connection((master_addr, master_port),
                                            timeout=min(remaining, 5.0))
        except socket.gaierror as exc:
            if exc.errno != socket.EAI_AGAIN:
                raise DistributedError(f"rendezvous: rank {rank} cannot resolve MASTER_ADDR "
                                       f"{master_addr!r}: {exc.strerror}") from None
            last = f"resolving {master_addr!r}: {exc.strerror}"
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        if conn is None:
            # Rank 0 has not bound the port yet: poll with a growing interval.
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, _RETRY_MAX)
    try:
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            _send(conn, {"protocol": PROTOCOL, "rank": rank, "world_size": world_size,
                         "payload": dict(payload or {})})
            answer = _recv(conn)
            if answer.get("ack"):
                # Rank 0 answers by its own deadline, with the reason if it fails.
                left = answer.get("seconds_left")
                if isinstance(left, (int, float)) and 0 <= left < float("inf"):
                    conn.settimeout(left + _ANSWER_SLACK)
                answer = _recv(conn)
        except socket.timeout:
            raise DistributedError(
                f"rendezvous: rank {rank} reached rank 0 at {where} but had no answer within "
                f"{time.monotonic() - start:.1f} s: rank 0 answers when every rank has "
                "arrived, so another rank is missing (rank 0's error names it)") from None
        except (OSError, ValueError, struct.error) as exc:
            raise DistributedError(
                f"rendezvous: rank {rank} lost the connection to rank 0 at {where} after "
                f"{time.monotonic() - start:.1f} s ({exc}); rank 0 failed or is not a "
                "cudalab rendezvous") from None
    finally:
        _close(conn)
    if not answer.get("ok"):
        raise DistributedError(f"{answer.get('error', 'rendezvous failed')} "
                               f"[reported by rank 0 at {where} to rank {rank}]")
    payloads = answer.get("payloads")
    if not isinstance(payloads, list) or len(payloads) != world_size:
        raise DistributedError(f"rendezvous: rank {rank} got a malformed answer from {where}")
    return RendezvousResult(rank, world_size, tuple(payloads), dict(answer.get("extra") or {}))


def rendezvous(rank: int, world_size: int, master_addr: str, master_port: int, *,
               payload: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
               timeout: float = 600.0, same: Sequence[str] = ()) -> RendezvousResult:
    """rendezvous(rank, world_size, master_addr, master_port, *, payload=None, extra=None, timeout=600.0, same=())

    Meet every other rank: rank 0 serves on `master_port`, the others join.

    Parameters
    ----------
    rank, world_size : int
    master_addr : str
        Rank 0's host, as the other ranks reach it.
    master_port : int
    payload : mapping, optional
        This rank's JSON-serializable facts (``host``, ``pid``, ``device_uuid``...).
    extra : mapping, optional
        Rank 0 only: data for every rank (the NCCL unique id).
    timeout : float
        Seconds for the whole rendezvous.
    same : sequence of str
        Payload keys every rank must agree on.

    Returns
    -------
    RendezvousResult
        The same payloads and extra on every rank. A world of 1 needs no network.

    Raises
    ------
    DistributedError
        See :meth:`RendezvousServer.run` and :func:`join`.
    """
    timeout = _check_args("rendezvous", rank, world_size, timeout)
    _check_port("rendezvous", master_port)
    if world_size == 1:
        payloads = (dict(payload or {}),)
        check_payloads(payloads, same)
        return RendezvousResult(0, 1, payloads, dict(extra or {}))
    if rank == 0:
        server = RendezvousServer(world_size, master_port, master_addr=master_addr)
        return server.run(payload, extra, timeout=timeout, same=same)
    return join(rank, world_size, master_addr, master_port, payload, timeout=timeout)


# ---- through torchrun's store ----------------------------------------------------------


class Store(Protocol):
    """What :func:`rendezvous_store` needs of a key-value store (torch's TCPStore has it)."""

    def set(self, key: str, value: bytes | str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


def rendezvous_store(store: Store, rank: int, world_size: int, prefix: str, *,
                     payload: Mapping[str, Any] | None = None,
                     extra: Mapping[str, Any] | None = None, timeout: float = 600.0,
                     same: Sequence[str] = (), where: str = "the store") -> RendezvousResult:
    """rendezvous_store(store, rank, world_size, prefix, *, payload=None, extra=None, timeout=600.0, same=(), where="the store")

    The rendezvous through a key-value store that every rank reaches (the
    TCPStore torchrun's agent serves on MASTER_PORT). Each rank writes its
    payload under ``prefix/rank/<r>`` (rank 0 also ``prefix/extra``), polls
    until every key exists or the deadline passes, then checks the payloads
    itself: every rank reaches the same verdict.

    Raises
    ------
    DistributedError
        Ranks missing at the deadline (named, with `where` and the seconds),
        two ranks on one GPU, a disagreement on a key of `same`.
    """
    timeout = _check_args("rendezvous_store", rank, world_size, timeout)
    start = time.monotonic()
    deadline = start + timeout
    mine = {"world_size": world_size, "payload": dict(payload or {})}
    store.set(f"{prefix}/rank/{rank}", json.dumps(mine))
    if rank == 0:
        store.set(f"{prefix}/extra", json.dumps(dict(extra or {})))
    keys = [f"{prefix}/rank/{r}" for r in range(world_size)] + [f"{prefix}/extra"]
    waiting = list(keys)
    delay = _RETRY_FIRST / 5
    while waiting:
        waiting = [k for k in waiting if not store.check([k])]
        if not waiting:
            break
        if time.monotonic() >= deadline:
            missing = sorted({int(k.rsplit("/", 1)[1]) if "/rank/" in k else 0 for k in waiting})
            raise DistributedError(
                f"rendezvous timed out: rank {rank} waited {time.monotonic() - start:.1f} s on "
                f"{where} for {world_size} ranks; {_ranks_text(missing)} never arrived")
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, _RETRY_MAX / 2)
    payloads = []
    for r in range(world_size):
        theirs = json.loads(store.get(f"{prefix}/rank/{r}"))
        if theirs.get("world_size") != world_size:
            raise DistributedError(
                f"rendezvous: {_who(r, theirs.get('payload', {}))} was started with world size "
                f"{theirs.get('world_size')}, rank {rank} with {world_size}: every rank must "
                "get the same WORLD_SIZE")
        payloads.append(theirs.get("payload", {}))
    check_payloads(payloads, same)
    return RendezvousResult(rank, world_size, tuple(payloads),
                            json.loads(store.get(f"{prefix}/extra")))
