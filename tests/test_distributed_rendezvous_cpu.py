"""CPU tier: the TCP rendezvous on 127.0.0.1, in threads and in processes.

Every wait is bounded: the tests check the errors (rank, address, seconds)
and that they come within the timeout. Servers bind port 0 where the test
can hand the port to the other ranks, so parallel runs do not collide.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from _distributed import free_port, worker_env
from cudalab.distributed import DistributedError
from cudalab.distributed.rendezvous import (
    PROTOCOL,
    RendezvousResult,
    RendezvousServer,
    check_payloads,
    join,
    rendezvous,
    rendezvous_store,
)

ADDR = "127.0.0.1"
# Slack on top of a timeout for a thread to notice it and report.
MARGIN = 2.0


class Ranks:
    """Run rank 1..n-1 as threads joining a server; collect results and errors by rank."""

    def __init__(self) -> None:
        self.results: dict[int, RendezvousResult] = {}
        self.errors: dict[int, BaseException] = {}
        self.elapsed: dict[int, float] = {}
        self.threads: list[threading.Thread] = []

    def start(self, rank: int, fn, *args, **kwargs) -> None:
        def run():
            t0 = time.monotonic()
            try:
                self.results[rank] = fn(*args, **kwargs)
            except BaseException as exc:  # reported to the test thread
                self.errors[rank] = exc
            finally:
                self.elapsed[rank] = time.monotonic() - t0

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join_all(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in self.threads if t.is_alive()]
        assert not alive, f"{len(alive)} rank thread(s) still waiting after {seconds} s"


def payload(rank: int, **more) -> dict:
    return {"host": "testhost", "pid": 1000 + rank, "local_rank": rank,
            "device_uuid": f"GPU-{rank:04d}", **more}


def serve_and_join(world: int, *, timeout: float = 10.0, missing=(), payloads=None,
                   extra=None, same=()):
    """Rank 0 in this thread (a server on a free port), the others in threads."""
    payloads = payloads or {r: payload(r) for r in range(world)}
    ranks = Ranks()
    with RendezvousServer(world, 0, master_addr=ADDR) as server:
        for r in range(1, world):
            if r not in missing:
                ranks.start(r, join, r, world, ADDR, server.port, payloads[r], timeout=timeout)
        t0 = time.monotonic()
        try:
            ranks.results[0] = server.run(payloads[0], extra, timeout=timeout, same=same)
        except DistributedError as exc:
            ranks.errors[0] = exc
        ranks.elapsed[0] = time.monotonic() - t0
        ranks.join_all(timeout + MARGIN)
    return ranks, server.port


# ---- success ------------------------------------------------------------------------------


def test_world_of_one_needs_no_network():
    result = rendezvous(0, 1, "no-such-host.invalid", 1, payload={"a": 1}, extra={"id": "ab"},
                        timeout=0.1)
    assert result == RendezvousResult(0, 1, ({"a": 1},), {"id": "ab"})


@pytest.mark.parametrize("world", [2, 5])
def test_threads_meet_and_share_payloads_and_extra(world):
    ranks, _ = serve_and_join(world, extra={"nccl_id": "00ff" * 32})
    assert not ranks.errors, ranks.errors
    expected = tuple(payload(r) for r in range(world))
    for r in range(world):
        res = ranks.results[r]
        assert (res.rank, res.world_size) == (r, world)
        assert res.payloads == expected
        assert res.extra == {"nccl_id": "00ff" * 32}


def test_processes_meet_through_rendezvous():
    """Three processes call rendezvous() with the same address; all get the same answer."""
    port = free_port()
    code = (
        "import json, sys\n"
        "from cudalab.distributed.rendezvous import rendezvous\n"
        "r = int(sys.argv[1])\n"
        "res = rendezvous(r, 3, '127.0.0.1', int(sys.argv[2]), payload={'r': r, 'pid': r},\n"
        "                 extra={'id': 'x'} if r == 0 else None, timeout=20)\n"
        "print(json.dumps({'payloads': res.payloads, 'extra': res.extra}))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=worker_env()) for r in (2, 1, 0)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        got = json.loads(out)
        assert got == {"payloads": [{"r": 0, "pid": 0}, {"r": 1, "pid": 1}, {"r": 2, "pid": 2}],
                       "extra": {"id": "x"}}


def test_rank_started_before_rank_zero_retries_until_it_listens():
    port = free_port()
    ranks = Ranks()
    ranks.start(1, join, 1, 2, ADDR, port, payload(1), timeout=10)
    time.sleep(0.3)  # the scenario: rank 0 comes late (rank 1 meets a refused port first)
    result = rendezvous(0, 2, ADDR, port, payload=payload(0), timeout=10)
    ranks.join_all(10)
    assert not ranks.errors, ranks.errors
    assert ranks.results[1].payloads == result.payloads


def test_port_is_free_again_after_the_rendezvous():
    """The server closes cleanly and SO_REUSEADDR lets the next job bind the port at once."""
    for _ in range(2):
        with RendezvousServer(2, 0) as first:
            port = first.port
        ranks = Ranks()
        with RendezvousServer(2, port) as server:
            ranks.start(1, join, 1, 2, ADDR, port, payload(1), timeout=5)
            server.run(payload(0), timeout=5)
        ranks.join_all(5)
        assert not ranks.errors
    with RendezvousServer(2, port):  # and once more right after a finished one
        pass


def test_stray_connections_are_ignored():
    with RendezvousServer(2, 0) as server:
        garbage = socket.create_connection((ADDR, server.port))
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n")
        foreign = socket.create_connection((ADDR, server.port))
        body = json.dumps({"protocol": "other/1", "rank": 1, "world_size": 2}).encode()
        foreign.sendall(struct.pack(">I", len(body)) + body)
        ranks = Ranks()
        ranks.start(1, join, 1, 2, ADDR, server.port, payload(1), timeout=10)
        try:
            result = server.run(payload(0), timeout=10)
        finally:
            garbage.close()
            foreign.close()
        ranks.join_all(10)
    assert not ranks.errors, ranks.errors
    assert result.payloads[1] == payload(1)


# ---- a rank that never arrives -------------------------------------------------------------


def test_missing_rank_is_named_with_address_and_seconds_within_the_timeout():
    timeout = 1.0
    ranks, port = serve_and_join(4, timeout=timeout, missing={2})
    message = str(ranks.errors[0])
    assert "rank 2 never arrived" in message, message
    assert f"{ADDR}:{port}" in message, message
    assert "waited 1.0 s" in message and "arrived: 0, 1, 3" in message, message
    assert timeout <= ranks.elapsed[0] < timeout + MARGIN
    # The ranks that came hear rank 0's reason, within the timeout too.
    for r in (1, 3):
        assert isinstance(ranks.errors[r], DistributedError)
        assert "rank 2 never arrived" in str(ranks.errors[r]), ranks.errors[r]
        assert "reported by rank 0" in str(ranks.errors[r])
        assert ranks.elapsed[r] < timeout + MARGIN


def test_several_missing_ranks_are_listed():
    ranks, _ = serve_and_join(5, timeout=0.5, missing={1, 4})
    assert "ranks 1, 4 (2) never arrived" in str(ranks.errors[0]), ranks.errors[0]


def test_rank_zero_never_arrives():
    port = free_port()  # nobody listens there
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        join(3, 4, ADDR, port, payload(3), timeout=0.7)
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert message.startswith("rendezvous: rank 3 could not reach rank 0 at "
                              f"{ADDR}:{port} within 0.7 s"), message
    assert "MASTER_ADDR and MASTER_PORT" in message
    assert 0.7 <= elapsed < 0.7 + MARGIN


def test_rank_zero_silent_after_accepting():
    """A rank 0 that accepts and never answers: bounded by the timeout, named."""
    with socket.create_server((ADDR, 0)) as silent:
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(DistributedError, match=rf"rank 1 reached rank 0 at {ADDR}:{port} "
                                                   r"but had no answer within 0\.[5-9] s"):
            join(1, 2, ADDR, port, timeout=0.5)
        assert time.monotonic() - t0 < 0.5 + MARGIN


def resolver_answers(name: str) -> bool:
    """False when resolving `name` fails only for now (EAI_AGAIN: no DNS
    server reachable, as on a machine without a network)."""
    try:
        socket.getaddrinfo(name, 29500)
    except socket.gaierror as exc:
        return exc.errno != socket.EAI_AGAIN
    return True


def test_unresolvable_master_addr_fails_at_once():
    host = "no-such-host.invalid"  # RFC 6761: never resolves
    if not resolver_answers(host):
        pytest.skip("no DNS resolver answers here (EAI_AGAIN); the next two tests stand in")
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1 cannot resolve MASTER_ADDR "
                                               r"'no-such-host\.invalid'"):
        join(1, 2, host, 29500, timeout=30)
    assert time.monotonic() - t0 < 20


def refuse_to_resolve(monkeypatch, errno: int, calls: list) -> None:
    def create_connection(address, timeout=None):
        calls.append(address)
        raise socket.gaierror(errno, "made-up resolver error")

    monkeypatch.setattr(socket, "create_connection", create_connection)


def test_a_name_that_does_not_exist_fails_at_once(monkeypatch):
    calls = []
    refuse_to_resolve(monkeypatch, socket.EAI_NONAME, calls)
    with pytest.raises(DistributedError, match=r"rank 1 cannot resolve MASTER_ADDR 'h': "
                                               r"made-up resolver error"):
        join(1, 2, "h", 29500, timeout=30)
    assert calls == [("h", 29500)]


def test_a_resolver_that_fails_for_now_is_retried_until_the_timeout(monkeypatch):
    # A cluster's DNS may be back in a moment (and an offline machine never
    # answers): EAI_AGAIN is retried, and the timeout's error names it.
    calls = []
    refuse_to_resolve(monkeypatch, socket.EAI_AGAIN, calls)
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1 could not reach rank 0 at h:29500 "
                                               r"within .* s \(resolving 'h': made-up"):
        join(1, 2, "h", 29500, timeout=1)
    assert 1 <= time.monotonic() - t0 < 1 + MARGIN
    assert len(calls) > 1


# ---- inconsistent ranks ----------------------------------------------------------------------


def test_duplicate_rank():
    world = 3
    ranks = Ranks()
    with RendezvousServer(world, 0) as server:
        ranks.start(1, join, 1, world, ADDR, server.port, payload(1, pid=11), timeout=5)
        ranks.start(-1, join, 1, world, ADDR, server.port, payload(1, pid=12), timeout=5)
        with pytest.raises(DistributedError) as info:
            server.run(payload(0), timeout=5)
        ranks.join_all(5 + MARGIN)
    message = str(info.value)
    assert "rank 1 arrived twice: rank 1 (host testhost, pid 1" in message, message
    assert "every rank needs its own RANK" in message
    for r in (1, -1):
        assert "arrived twice" in str(ranks.errors[r]), ranks.errors


def test_a_second_rank_zero():
    with RendezvousServer(2, 0) as server:
        with socket.create_connection((ADDR, server.port)) as s:
            body = json.dumps({"protocol": PROTOCOL, "rank": 0, "world_size": 2,
                               "payload": {"host": "other"}}).encode()
            s.sendall(struct.pack(">I", len(body)) + body)
            with pytest.raises(DistributedError, match=r"rank 0 arrived twice: rank 0 "
                                                       r"\(host testhost, pid 1000\) and rank 0 "
                                                       r"\(host other\)"):
                server.run(payload(0), timeout=5)


def test_rank_out_of_range_at_rank_zero():
    with RendezvousServer(2, 0) as server:
        with socket.create_connection((ADDR, server.port)) as s:
            body = json.dumps({"protocol": PROTOCOL, "rank": 7, "world_size": 2,
                               "payload": {}}).encode()
            s.sendall(struct.pack(">I", len(body)) + body)
            with pytest.raises(DistributedError,
                               match=r"rank 7 is out of range for world size 2"):
                server.run(timeout=5)


def test_mismatched_world_sizes():
    ranks = Ranks()
    with RendezvousServer(2, 0) as server:
        ranks.start(2, join, 2, 3, ADDR, server.port, payload(2), timeout=5)
        with pytest.raises(DistributedError) as info:
            server.run(payload(0), timeout=5)
        ranks.join_all(5 + MARGIN)
    message = str(info.value)
    assert "rank 2 (host testhost, pid 1002) was started with world size 3, rank 0 with 2" \
        in message, message
    assert "same WORLD_SIZE" in message
    assert "world size 3" in str(ranks.errors[2])


def test_two_ranks_on_one_gpu():
    payloads = {0: payload(0), 1: payload(1, device_uuid="GPU-0000", device=0),
                2: payload(2)}
    ranks, _ = serve_and_join(3, payloads=payloads)
    message = str(ranks.errors[0])
    assert ("rank 0 (host testhost, pid 1000) and rank 1 (host testhost, pid 1001) both use "
            "GPU GPU-0000") in message, message
    assert "LOCAL_RANK, not RANK" in message
    for r in (1, 2):
        assert "both use GPU GPU-0000" in str(ranks.errors[r])


def test_disagreement_on_a_same_key():
    payloads = {r: payload(r, nccl_version=22809 if r != 1 else 22703) for r in range(3)}
    ranks, _ = serve_and_join(3, payloads=payloads, same=("nccl_version",))
    message = str(ranks.errors[0])
    assert message == ("rendezvous: the ranks disagree on nccl_version: 22809 on ranks [0, 2]; "
                       "22703 on ranks [1]"), message


def test_check_payloads_ignores_missing_uuids():
    check_payloads([{"device_uuid": ""}, {"device_uuid": ""}, {}])
    with pytest.raises(DistributedError, match="both use GPU u"):
        check_payloads([{"device_uuid": "u"}, {}, {"device_uuid": "u"}])


def test_port_in_use():
    with socket.create_server(("0.0.0.0", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(DistributedError, match=rf"rank 0 cannot listen on port {port} \(.*\); "
                                                   r"another job may be using it"):
            RendezvousServer(2, port)


def test_server_is_closed_after_a_failure():
    ranks, port = serve_and_join(2, timeout=0.3, missing={1})
    assert "never arrived" in str(ranks.errors[0])
    with RendezvousServer(2, port):  # the port was released
        pass


# ---- argument checks --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"rank": "0"}, TypeError, r"^rendezvous\(\) argument 'rank': expected an int, got str"),
    ({"rank": True}, TypeError, r"argument 'rank': expected an int, got bool"),
    ({"rank": -1}, ValueError, r"argument 'rank': must be >= 0, got -1"),
    ({"rank": 2}, ValueError, r"argument 'rank': must be below world_size \(2\), got 2"),
    ({"world_size": 0}, ValueError, r"argument 'world_size': must be >= 1, got 0"),
    ({"world_size": 2.0}, TypeError, r"argument 'world_size': expected an int, got float"),
    ({"timeout": 0}, ValueError, r"argument 'timeout': must be positive and finite, got 0"),
    ({"timeout": float("inf")}, ValueError, r"argument 'timeout': must be positive and finite"),
    ({"timeout": "5"}, TypeError, r"argument 'timeout': expected seconds as a number, got str"),
    ({"master_port": 0}, ValueError, r"argument 'port': must be in \[1, 65535\], got 0"),
    ({"master_port": 65536}, ValueError, r"argument 'port': must be in \[1, 65535\]"),
    ({"master_port": "29500"}, TypeError, r"argument 'port': expected an int, got str"),
])
def test_rendezvous_argument_errors(kwargs, exc, match):
    args = {"rank": 0, "world_size": 2, "master_addr": ADDR, "master_port": 29500,
            "timeout": 1.0, **kwargs}
    with pytest.raises(exc, match=match):
        rendezvous(args.pop("rank"), args.pop("world_size"), args.pop("master_addr"),
                   args.pop("master_port"), **args)


def test_join_refuses_rank_zero():
    with pytest.raises(ValueError, match=r"^join\(\) argument 'rank': rank 0 runs the server"):
        join(0, 2, ADDR, 29500, timeout=1)


def test_server_argument_errors():
    with pytest.raises(ValueError, match=r"RendezvousServer\(\) argument 'port': must be in "
                                         r"\[0, 65535\], got -1"):
        RendezvousServer(2, -1)
    with pytest.raises(ValueError, match=r"RendezvousServer\(\) argument 'world_size'"):
        RendezvousServer(0, 0)


# ---- through a key-value store (torchrun's agent store) ------------------------------------


class DictStore:
    """What rendezvous_store needs of torch's TCPStore, in memory, thread-safe."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key, value):
        with self.lock:
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key):
        with self.lock:
            return self.data[key]

    def check(self, keys):
        with self.lock:
            return all(k in self.data for k in keys)


def store_ranks(world, *, payloads=None, missing=(), timeout=5.0, sizes=None):
    store = DictStore()
    payloads = payloads or {r: payload(r) for r in range(world)}
    ranks = Ranks()
    for r in range(world):
        if r not in missing:
            ranks.start(r, rendezvous_store, store, r, (sizes or {}).get(r, world), "job/0/1",
                        payload=payloads[r], extra={"nccl_id": "ab"} if r == 0 else None,
                        timeout=timeout, where="the test store")
    ranks.join_all(timeout + MARGIN)
    return ranks


def test_store_rendezvous():
    ranks = store_ranks(3)
    assert not ranks.errors, ranks.errors
    for r in range(3):
        assert ranks.results[r].payloads == tuple(payload(q) for q in range(3))
        assert ranks.results[r].extra == {"nccl_id": "ab"}


def test_store_rendezvous_names_missing_ranks_within_the_timeout():
    ranks = store_ranks(3, missing={1}, timeout=0.5)
    for r in (0, 2):
        message = str(ranks.errors[r])
        assert f"rank {r} waited" in message and "on the test store" in message, message
        assert "rank 1 never arrived" in message
        assert ranks.elapsed[r] < 0.5 + MARGIN


def test_store_rendezvous_without_rank_zero_names_it():
    ranks = store_ranks(2, missing={0}, timeout=0.3)
    assert "rank 0 never arrived" in str(ranks.errors[1])


def test_store_rendezvous_checks_gpus_and_world_sizes():
    ranks = store_ranks(2, payloads={0: payload(0), 1: payload(1, device_uuid="GPU-0000")})
    assert all("both use GPU GPU-0000" in str(ranks.errors[r]) for r in (0, 1)), ranks.errors
    ranks = store_ranks(2, sizes={1: 3}, timeout=0.5)
    assert "rank 1 (host testhost, pid 1001) was started with world size 3, rank 0 with 2" \
        in str(ranks.errors[0]), ranks.errors
    assert "rank 2 never arrived" in str(ranks.errors[1]), ranks.errors
