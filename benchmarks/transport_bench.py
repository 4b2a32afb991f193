"""Transport benchmark: the lock's own links against a lean fan-out over redis-py's public API.

In one run, on its own ``redis-server`` processes (free 127.0.0.1 ports):

1. an acquire + release pair on 3 nodes, sent through each transport with
   the same Lua scripts: wall time and CPU time per pair, pairs per second
   with 1 and 4 threads, and connections per node afterwards;
2. one node of three paused (SIGSTOP): median pair latency;
3. two nodes of three paused while the first login (AUTH) is under way: how
   long one fan-out takes;
4. a large batch under gevent: the longest time the event loop is held
   while 1k, 5k and 10k calls per node are packed, sent and parsed.

The lean fan-out holds one redis-py ``Connection`` per node (per thread),
sends with ``send_packed_command`` to all, then reads with ``can_read`` and
``read_response`` under one shared deadline; it checks idle connections
before reuse and reloads a script missing from a node's cache, as the
lock's transport does. Both send the scripts the arguments the lock sends
(acquire.lua's fencing proposal, release.lua's preview key), and every pair
is checked: a majority granted the lock and deleted it, or the run stops.

Usage::

    python benchmarks/transport_bench.py             # about a minute
    python benchmarks/transport_bench.py --quick
    python benchmarks/transport_bench.py --markdown  # tables for docs/performance.md
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from _common import environment, micros, millis, parser, percentile, progress, redis_servers, table
from redis.connection import Connection
from redis.exceptions import NoScriptError, RedisError, ResponseError

from celery_redlock._scripts import load
from celery_redlock.lock.fencing import ahead_us
from celery_redlock.transport.commands import Call, NodeFailure
from celery_redlock.transport.fanout import fan_out
from celery_redlock.transport.nodes import make_nodes

ACQUIRE, RELEASE = load("acquire"), load("release")
TIMEOUT = 0.05
TTL_MS, FENCE_MS = 30_000, 3_600_000
#: The fencing proposal's lead past the nodes' clocks, as the lock's: the node timeout.
LEAD_US = int(TIMEOUT * 1e6)


class PairFailed(RuntimeError):
    """A pair that did not take and give back the lock on a majority: nothing was measured."""


# -- the lean fan-out over redis-py's public connection API ---------------------------------


class LeanNodes:
    """One held redis-py ``Connection`` per node, for one thread."""

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.connections = []
        for url in urls:
            given = redis.ConnectionPool.from_url(url).connection_kwargs
            kwargs = {key: given.get(key) for key in ("host", "port", "db", "username", "password")}
            kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout, protocol=2)
            self.connections.append(Connection(**kwargs))
        self.timeout = timeout

    def fan_out(self, calls: Sequence[Call]) -> list[Any]:
        """Each call to its node; one shared deadline; NOSCRIPT reloaded."""
        results: list[Any] = [None] * len(calls)
        sent = []
        for index, (conn, call) in enumerate(zip(self.connections, calls, strict=True)):
            try:
                if conn.can_read(timeout=0):
                    conn.disconnect()  # stale: closed by the server, or unasked bytes
                conn.send_packed_command([call.packed()])
                sent.append(index)
            except (RedisError, OSError) as exc:
                results[index] = NodeFailure(str(index), exc)
                conn.disconnect()
        deadline = time.monotonic() + self.timeout
        reload = []
        for index in sent:
            conn = self.connections[index]
            try:
                if not conn.can_read(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("no reply within the node timeout")
                results[index] = conn.read_response()
            except NoScriptError:
                reload.append(index)
            except ResponseError as exc:
                results[index] = exc
            except (RedisError, OSError) as exc:
                results[index] = NodeFailure(str(index), exc)
                conn.disconnect()
        for index in reload:
            conn = self.connections[index]
            try:
                conn.send_packed_command([calls[index].packed(by_sha=False)])
                if not conn.can_read(timeout=self.timeout):
                    raise TimeoutError("no reply within the node timeout")
                results[index] = conn.read_response()
            except (RedisError, OSError) as exc:
                results[index] = NodeFailure(str(index), exc)
                conn.disconnect()
        return results

    def close(self) -> None:
        for conn in self.connections:
            conn.disconnect()


def calls_for(key: str) -> tuple[Call, Call]:
    """The lock's acquire and release, with the arguments its scripts take.

    The fencing proposal is this host's clock plus the lead, as the lock's
    first acquire proposes it: the nodes run on this host, so each one grants
    and records it.
    """
    token = secrets.token_hex(16)
    proposal = f"{time.time_ns() // 1000 + LEAD_US} {ahead_us(LEAD_US)}"
    acquire = Call(ACQUIRE, (key, key + ":fence"), (token, TTL_MS, FENCE_MS, "", proposal))
    return acquire, Call(RELEASE, (key, key + ":args"), (token, ""))


def granted(results: Sequence[Any]) -> bool:
    """Whether a majority granted the lock (acquire.lua's reply ``{1, fence, now_us}``)."""
    return sum(isinstance(result, list) and result[0] == 1 for result in results) * 2 > len(results)


def released(results: Sequence[Any]) -> bool:
    """Whether a majority deleted the key (release.lua's reply 1)."""
    return sum(result == 1 for result in results) * 2 > len(results)


def checked(acquired: Sequence[Any], gave_back: Sequence[Any]) -> None:
    """Raise :class:`PairFailed` unless the pair held and released the lock on a majority."""
    if not granted(acquired) or not released(gave_back):
        raise PairFailed(f"acquire replies {list(acquired)}, release replies {list(gave_back)}")


def lean_pair(urls: Sequence[str]) -> tuple[Callable[[str], None], Callable[[], None]]:
    local = threading.local()
    made: list[LeanNodes] = []

    def pair(key: str) -> None:
        nodes = getattr(local, "nodes", None)
        if nodes is None:
            nodes = local.nodes = LeanNodes(urls, TIMEOUT)
            made.append(nodes)
        acquire, release = calls_for(key)
        checked(nodes.fan_out([acquire] * len(urls)), nodes.fan_out([release] * len(urls)))

    return pair, lambda: [nodes.close() for nodes in made] and None


def own_pair(urls: Sequence[str]) -> tuple[Callable[[str], None], Callable[[], None]]:
    nodes = make_nodes(list(urls), TIMEOUT)

    def replies(results: Sequence[Any]) -> list[Any]:
        """Each node's one reply (a node's result lists its calls' replies), or its failure."""
        return [result[0] if isinstance(result, list) else result for result in results]

    def pair(key: str) -> None:
        acquire, release = calls_for(key)
        checked(
            replies(
                fan_out(
                    nodes,
                    [[acquire]] * len(nodes),
                    TIMEOUT,
                    enough=lambda results: granted(replies(results)),
                )
            ),
            replies(
                fan_out(
                    nodes,
                    [[release]] * len(nodes),
                    TIMEOUT,
                    enough=lambda results: released(replies(results)),
                )
            ),
        )

    return pair, lambda: [node.close() for node in nodes] and None


TRANSPORTS = {"own links (product)": own_pair, "lean redis-py public API": lean_pair}


# -- 1. healthy nodes -------------------------------------------------------------------------


def run_threads(pair: Callable[[str], None], threads: int, count: int) -> tuple[float, float]:
    """``count`` pairs per thread; returns (pairs per second, CPU seconds per pair)."""
    start = threading.Barrier(threads + 1)

    def work(number: int) -> None:
        start.wait()
        for index in range(count):
            pair(f"bench:{number}:{index % 8}")

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    cpu = time.process_time()
    began = time.perf_counter()
    start.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    return threads * count / elapsed, (time.process_time() - cpu) / (threads * count)


def latencies(pair: Callable[[str], None], count: int) -> list[float]:
    found = []
    for index in range(count):
        started = time.perf_counter()
        pair(f"lat:{index % 8}")
        found.append(time.perf_counter() - started)
    return found


def healthy(urls: list[str], count: int, rounds: int) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    for round_number in range(rounds):
        names = list(TRANSPORTS)
        if round_number % 2:
            names.reverse()
        for name in names:
            pair, close = TRANSPORTS[name](urls)
            for index in range(100):
                pair(f"warm:{index}")
            cpu = time.process_time()
            timed = latencies(pair, count)
            cpu_per_pair = (time.process_time() - cpu) / count
            one, _ = run_threads(pair, 1, count)
            four, four_cpu = run_threads(pair, 4, count // 2)
            clients = [redis.Redis.from_url(url) for url in urls]
            links = max(len(client.client_list()) - 1 for client in clients)
            for client in clients:
                client.close()
            close()
            figures = {
                "median": percentile(timed, 0.5),
                "p99": percentile(timed, 0.99),
                "cpu": cpu_per_pair,
                "one": one,
                "four": four,
                "four_cpu": four_cpu,
                "links": links,
            }
            best = found.get(name)
            if best is None or figures["median"] < best["median"]:
                found[name] = figures
        progress(f"healthy: round {round_number + 1}/{rounds} done")
    return found


# -- 2. and 3. slow nodes ------------------------------------------------------------------------


def one_paused(servers: Any, count: int) -> dict[str, float]:
    urls = servers.urls[:3]
    found = {}
    for name, make in TRANSPORTS.items():
        pair, close = make(urls)
        pair("warm")
        servers[2].pause()
        try:
            timed = latencies(pair, count)
        finally:
            servers[2].resume()
        close()
        found[name] = percentile(timed, 0.5)
        time.sleep(0.2)
    return found


def logins_paused(servers: Any) -> dict[str, float]:
    """Two of three nodes paused before the first AUTH: one fan-out's duration."""
    for server in servers.servers[:3]:
        with server.client() as client:
            client.config_set("requirepass", "s3cret")
    urls = [f"redis://:s3cret@127.0.0.1:{server.port}/0" for server in servers.servers[:3]]
    found = {}
    try:
        for name, make in TRANSPORTS.items():
            pair, close = make(urls)
            servers[0].pause()
            servers[1].pause()
            started = time.perf_counter()
            with contextlib.suppress(RedisError, OSError, PairFailed):
                pair("login")
            found[name] = time.perf_counter() - started
            servers[0].resume()
            servers[1].resume()
            close()
    finally:
        for server in servers.servers[:3]:
            with server.client(password="s3cret") as client:
                client.config_set("requirepass", "")
    return found


# -- 4. gevent stalls --------------------------------------------------------------------------

STALL_SCRIPT = r"""
from gevent import monkey
monkey.patch_all()
import json, sys, time, gevent
from celery_redlock.transport.commands import Command
from celery_redlock.transport.fanout import fan_out
from celery_redlock.transport.nodes import make_nodes

urls, sizes = sys.argv[1].split(","), [int(n) for n in sys.argv[2].split(",")]
nodes = make_nodes(urls, 0.05)
worst = {}
for size in sizes:
    calls = [Command(("SET", f"{{stall}}:{n}", "x")) for n in range(size)]
    fan_out(nodes, [calls] * len(nodes), 0.05)  # warm: links open
    gaps, running = [], True
    def ticker():
        last = time.perf_counter()
        while running:
            gevent.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    tick = gevent.spawn(ticker)
    gevent.sleep(0.01)
    for _ in range(3):
        results = fan_out(nodes, [calls] * len(nodes), 0.05)
        assert all(isinstance(r, list) for r in results), results
    running = False
    tick.join()
    worst[size] = max(gaps)
print(json.dumps(worst))
"""


def gevent_stalls(urls: list[str], sizes: list[int]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", STALL_SCRIPT, ",".join(urls), ",".join(map(str, sizes))],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- report ----------------------------------------------------------------------------------


def main() -> None:
    args = parser(__doc__.split("\n\n")[0]).parse_args()
    count, rounds = (500, 2) if args.quick else (2000, 3)
    began = time.monotonic()
    with redis_servers(3) as servers:
        urls = servers.urls
        about = environment(urls[0])
        found = healthy(urls, count, rounds)
        paused = one_paused(servers, 50 if args.quick else 200)
        logins = logins_paused(servers)
        stalls = gevent_stalls(urls, [1000, 5000, 10_000])
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    print(f"{heading}Acquire + release pair on 3 nodes, same scripts, healthy nodes\n")
    rows = [
        [
            name,
            micros(f["median"]),
            micros(f["p99"]),
            micros(f["cpu"]),
            f"{f['one']:,.0f}",
            f"{f['four']:,.0f}",
            micros(f["four_cpu"]),
            f"{f['links']:.0f}",
        ]
        for name, f in found.items()
    ]
    header = [
        "transport",
        "median µs",
        "p99 µs",
        "CPU µs/pair",
        "pairs/s 1 thread",
        "pairs/s 4 threads",
        "CPU µs/pair 4 threads",
        "connections/node",
    ]
    print(table(header, rows, args.markdown))
    print(f"\n{heading}Slow nodes\n")
    rows = [
        [
            name,
            millis(paused[name]),
            millis(logins[name]),
        ]
        for name in TRANSPORTS
    ]
    header = [
        "transport",
        "pair p50 ms, 1 of 3 paused",
        f"one fan-out ms, 2 of 3 paused during AUTH (node timeout {TIMEOUT * 1000:.0f} ms)",
    ]
    print(table(header, rows, args.markdown))
    print(f"\n{heading}Event-loop stalls under gevent (own links)\n")
    rows = [[f"{int(size):,}", millis(gap)] for size, gap in stalls.items()]
    print(table(["calls per node in one batch", "longest stall ms"], rows, args.markdown))


if __name__ == "__main__":
    main()
