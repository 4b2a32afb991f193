"""Transport race: the lock's own links against two designs on redis-py, on the same terms.

Three transports get what a Redlock fan-out needs (return once the outcome
is decided, skip a node that timed out, connects and logins that overlap
across nodes, a script reloaded when a node lost it; see
``_contenders.py``): (a) the lock's own links, one multiplexed connection
per node for the whole process; (b) a redis-py connection per node per
caller, from a pool; (c) one thread per node owning a redis-py connection
and pipelining what callers queue. A naive redis-py fan-out that waits for
every node stands beside them. In one run, on its own ``redis-server``
processes (free 127.0.0.1 ports):

1. an acquire + release pair on 1 and on 3 nodes, with the lock's scripts and
   arguments: wall time and CPU time per pair, pairs per second with 4 and
   with 200 threads (pairs that missed their majority counted apart), and
   connections per node afterwards;
2. 500 greenlets in one gevent process: pairs per second, CPU, pairs that
   missed their majority, the longest event-loop stall;
3. one node of three paused (SIGSTOP): pair p50, and how many of the keys the
   pairs took while it was paused were left on it once it resumed (a release
   that ran before the acquire it undoes);
4. two nodes of three paused while the first login (AUTH) is under way: how
   long one pair takes;
5. the lines of code each transport takes;
6. a large batch under gevent (own links): the longest time the event loop
   is held while 1k, 5k and 10k calls per node are packed, sent and parsed.

Every pair is checked: a majority granted the lock and deleted it.

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
from pathlib import Path
from typing import Any

import redis
from _common import environment, micros, millis, parser, percentile, progress, redis_servers, table
from _contenders import Enough, PerCaller, ThreadPerNode
from redis.connection import Connection
from redis.exceptions import NoScriptError, RedisError, ResponseError

from celery_redlock._scripts import load
from celery_redlock.lock.fencing import ahead_us
from celery_redlock.transport.commands import Call, NodeFailure
from celery_redlock.transport.fanout import fan_out
from celery_redlock.transport.nodes import make_nodes

ACQUIRE, RELEASE = load("acquire"), load("release")
TIMEOUT = 0.05
#: The "many callers" row: threads in one process, and greenlets under gevent.
MANY_THREADS, GREENLETS = 200, 500
#: Pairs each of the many threads makes.
MANY_PAIRS = 10
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


class LeanTransport:
    """The naive baseline: one ``LeanNodes`` per thread, every node waited for."""

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.urls, self.timeout = urls, timeout
        self.local = threading.local()
        self.made: list[LeanNodes] = []

    def fan_out(self, calls: Sequence[Call], enough: Enough) -> list[Any]:
        nodes = getattr(self.local, "nodes", None)
        if nodes is None:
            nodes = self.local.nodes = LeanNodes(self.urls, self.timeout)
            self.made.append(nodes)
        return nodes.fan_out(calls)

    def close(self) -> None:
        for nodes in self.made:
            nodes.close()


class OwnTransport:
    """The lock's own links (:func:`celery_redlock.transport.fanout.fan_out`)."""

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.nodes = make_nodes(list(urls), timeout)
        self.timeout = timeout

    @staticmethod
    def replies(results: Sequence[Any]) -> list[Any]:
        """Each node's one reply (a node's result lists its calls' replies), or its failure."""
        return [result[0] if isinstance(result, list) else result for result in results]

    def fan_out(self, calls: Sequence[Call], enough: Enough) -> list[Any]:
        return self.replies(
            fan_out(
                self.nodes,
                [[call] for call in calls],
                self.timeout,
                enough=lambda results: enough(self.replies(results)),
            )
        )

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def pair_on(transport: Any, nodes: int) -> Callable[[str], None]:
    """An acquire + release pair on ``nodes`` nodes, checked."""

    def pair(key: str) -> None:
        acquire, release = calls_for(key)
        checked(
            transport.fan_out([acquire] * nodes, granted),
            transport.fan_out([release] * nodes, released),
        )

    return pair


TRANSPORTS: dict[str, Callable[[Sequence[str], float], Any]] = {
    "(a) own links (product)": OwnTransport,
    "(b) redis-py per caller": PerCaller,
    "(c) thread per node": ThreadPerNode,
    "naive redis-py, every node waited for": LeanTransport,
}


# -- 1. healthy nodes -------------------------------------------------------------------------


def run_threads(
    pair: Callable[[str], None], threads: int, count: int, prefix: str = "bench"
) -> tuple[float, float, int]:
    """``count`` pairs per thread: (pairs per second, CPU seconds per pair, pairs failed).

    A pair that did not get its majority in the node timeout (callers
    queueing behind one another on a busy machine) counts as failed, not
    done, and the thread goes on.
    """
    start = threading.Barrier(threads + 1)
    failed: list[int] = []

    def work(number: int) -> None:
        start.wait()
        for index in range(count):
            try:
                pair(f"{prefix}:{number}:{index % 8}")
            except PairFailed:
                failed.append(1)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    cpu = time.process_time()
    began = time.perf_counter()
    start.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    done = threads * count - len(failed)
    return done / elapsed, (time.process_time() - cpu) / (threads * count), len(failed)


def latencies(pair: Callable[[str], None], count: int, prefix: str = "lat") -> list[float]:
    found = []
    for index in range(count):
        started = time.perf_counter()
        pair(f"{prefix}:{index % 8}")
        found.append(time.perf_counter() - started)
    return found


def healthy(urls: list[str], count: int, rounds: int) -> dict[str, dict[str, float]]:
    """Each transport on ``urls``, interleaved over ``rounds``; the round with the best median."""
    found: dict[str, dict[str, float]] = {}
    for round_number in range(rounds):
        names = list(TRANSPORTS)
        if round_number % 2:
            names.reverse()
        for name in names:
            transport = TRANSPORTS[name](urls, TIMEOUT)
            pair = pair_on(transport, len(urls))
            for index in range(100):
                pair(f"warm:{index}")
            cpu = time.process_time()
            timed = latencies(pair, count)
            cpu_per_pair = (time.process_time() - cpu) / count
            four, four_cpu, _ = run_threads(pair, 4, count // 2)
            many, _, many_failed = run_threads(pair, MANY_THREADS, MANY_PAIRS)
            clients = [redis.Redis.from_url(url) for url in urls]
            links = max(len(client.client_list()) - 1 for client in clients)
            for client in clients:
                client.close()
            transport.close()
            figures = {
                "median": percentile(timed, 0.5),
                "p99": percentile(timed, 0.99),
                "cpu": cpu_per_pair,
                "four": four,
                "four_cpu": four_cpu,
                "many": many,
                "many_failed": many_failed,
                "links": links,
            }
            best = found.get(name)
            if best is None or figures["median"] < best["median"]:
                found[name] = figures
        progress(f"healthy on {len(urls)} node(s): round {round_number + 1}/{rounds} done")
    return found


# -- 2. and 3. slow nodes ------------------------------------------------------------------------


def one_paused(servers: Any, count: int) -> dict[str, dict[str, float]]:
    """One node of three paused: pair p50, and how many of the pairs made while it was paused
    left their key on it once it came back (an undo that overtook the write it undoes)."""
    urls = servers.urls[:3]
    found = {}
    for name, make in TRANSPORTS.items():
        transport = make(urls, TIMEOUT)
        pair = pair_on(transport, 3)
        pair("warm")
        servers[2].pause()
        try:
            timed = latencies(pair, count, "paused")
            run_threads(pair, 4, 10, "paused")
        finally:
            servers[2].resume()
        time.sleep(0.5)  # what it was sent while paused runs now
        with redis.Redis.from_url(urls[2]) as client:
            keys = client.scan_iter("paused:*")
            left = sum(1 for key in keys if not key.endswith((b":fence", b":args")))
            client.flushall()
        transport.close()
        found[name] = {"median": percentile(timed, 0.5), "left": left, "pairs": count + 40}
        time.sleep(0.2)
    return found


def logins_paused(servers: Any) -> dict[str, float]:
    """Two of three nodes paused before the first AUTH: one pair's duration."""
    for server in servers.servers[:3]:
        with server.client() as client:
            client.config_set("requirepass", "s3cret")
    urls = [f"redis://:s3cret@127.0.0.1:{server.port}/0" for server in servers.servers[:3]]
    found = {}
    try:
        for name, make in TRANSPORTS.items():
            transport = make(urls, TIMEOUT)
            servers[0].pause()
            servers[1].pause()
            started = time.perf_counter()
            with contextlib.suppress(RedisError, OSError, PairFailed):
                pair_on(transport, 3)("login")
            found[name] = time.perf_counter() - started
            servers[0].resume()
            servers[1].resume()
            transport.close()
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
    )
    if done.returncode:
        raise RuntimeError(f"the gevent run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


GREENLET_SCRIPT = r"""
from gevent import monkey
monkey.patch_all()
import json, sys, time, gevent
sys.path.insert(0, sys.argv[3])
import transport_bench as bench

urls, greenlets = sys.argv[1].split(","), int(sys.argv[2])
found = {}
for name, make in bench.TRANSPORTS.items():
    transport = make(urls, bench.TIMEOUT)
    pair = bench.pair_on(transport, len(urls))
    for attempt in range(5):  # the first connects, on a busy machine, may take a node timeout
        try:
            pair("warm")
            break
        except bench.PairFailed:
            time.sleep(0.1)
    gaps, running = [], True
    def ticker():
        last = time.perf_counter()
        while running:
            gevent.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    failed = []
    def work(number):
        for index in range(4):
            try:
                pair(f"green:{number}:{index}")
            except bench.PairFailed:
                failed.append(1)
    tick = gevent.spawn(ticker)
    began, cpu = time.perf_counter(), time.process_time()
    gevent.joinall([gevent.spawn(work, n) for n in range(greenlets)], raise_error=True)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    running = False
    tick.join()
    transport.close()
    found[name] = {"rate": greenlets * 4 / elapsed, "cpu": cpu / (greenlets * 4),
                   "stall": max(gaps) - 0.001, "failed": len(failed)}
print(json.dumps(found))
"""


def greenlets(urls: list[str]) -> dict[str, dict[str, float]]:
    """``GREENLETS`` greenlets in one gevent process, 4 pairs each: pairs/s, CPU, longest stall."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            GREENLET_SCRIPT,
            ",".join(urls),
            str(GREENLETS),
            str(Path(__file__).parent),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise RuntimeError(f"the gevent run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- report ----------------------------------------------------------------------------------


#: The own transport's modules that (b) or (c) would replace (fan-out, links,
#: sockets, TLS, RESP); nodes, Sentinel and the reply checks would stay.
OWN_MODULES = ("fanout", "hub", "operation", "connection", "endpoint", "payload", "resp", "tls")


def code_lines() -> dict[str, int]:
    """Lines of code each transport takes for what the race measures."""
    import inspect

    import _contenders

    import celery_redlock.transport as package

    folder = Path(package.__file__).parent
    own = sum(len((folder / f"{name}.py").read_text().splitlines()) for name in OWN_MODULES)

    def lines(*objects: Any) -> int:
        return sum(len(inspect.getsource(item).splitlines()) for item in objects)

    shared = lines(_contenders._connection_kwargs)
    return {
        "(a) own links (product)": own,
        "(b) redis-py per caller": shared + lines(_contenders._Node, _contenders._ready, PerCaller),
        "(c) thread per node": shared
        + lines(_contenders._Ask, _contenders._NodeThread, ThreadPerNode),
        "naive redis-py, every node waited for": lines(LeanNodes, LeanTransport),
    }


def main() -> None:
    args = parser(__doc__.split("\n\n")[0]).parse_args()
    count, rounds = (500, 2) if args.quick else (2000, 3)
    began = time.monotonic()
    with redis_servers(3) as servers:
        urls = servers.urls
        about = environment(urls[0])
        one_node = healthy(urls[:1], count, rounds)
        three = healthy(urls, count, rounds)
        paused = one_paused(servers, 50 if args.quick else 200)
        logins = logins_paused(servers)
        green = greenlets(urls)
        stalls = gevent_stalls(urls, [1000, 5000, 10_000])
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    header = [
        "transport",
        "median µs",
        "p99 µs",
        "CPU µs/pair",
        "pairs/s 4 threads",
        "CPU µs/pair 4 threads",
        f"pairs/s {MANY_THREADS} threads",
        f"pairs failed of {MANY_THREADS * MANY_PAIRS:,}",
        "connections/node",
    ]
    for nodes, found in ((1, one_node), (3, three)):
        print(f"{heading}Acquire + release pair on {nodes} node(s), same scripts, healthy nodes\n")
        rows = [
            [
                name,
                micros(f["median"]),
                micros(f["p99"]),
                micros(f["cpu"]),
                f"{f['four']:,.0f}",
                micros(f["four_cpu"]),
                f"{f['many']:,.0f}",
                f"{f['many_failed']:.0f}",
                f"{f['links']:.0f}",
            ]
            for name, f in found.items()
        ]
        print(table(header, rows, args.markdown))
        print()
    print(f"{heading}{GREENLETS} greenlets in one gevent process, 4 pairs each, 3 nodes\n")
    rows = [
        [
            name,
            f"{f['rate']:,.0f}",
            micros(f["cpu"]),
            f"{f['failed']:.0f} of {GREENLETS * 4}",
            millis(f["stall"]),
        ]
        for name, f in green.items()
    ]
    header = [
        "transport",
        "pairs/s",
        "CPU µs/pair",
        "pairs failed (node timeout)",
        "longest loop stall ms",
    ]
    print(table(header, rows, args.markdown))
    print(f"\n{heading}Slow nodes, and what the race costs in code\n")
    lines = code_lines()
    rows = [
        [
            name,
            millis(paused[name]["median"]),
            f"{paused[name]['left']:.0f} of {paused[name]['pairs']:.0f}",
            millis(logins[name]),
            f"{lines[name]:,}",
        ]
        for name in TRANSPORTS
    ]
    header = [
        "transport",
        "pair p50 ms, 1 of 3 paused",
        "keys left on it when it resumed",
        f"one pair ms, 2 of 3 paused during AUTH (node timeout {TIMEOUT * 1000:.0f} ms)",
        "lines of code",
    ]
    print(table(header, rows, args.markdown))
    print(f"\n{heading}Event-loop stalls under gevent (own links)\n")
    rows = [[f"{int(size):,}", millis(gap)] for size, gap in stalls.items()]
    print(table(["calls per node in one batch", "longest stall ms"], rows, args.markdown))


if __name__ == "__main__":
    main()
