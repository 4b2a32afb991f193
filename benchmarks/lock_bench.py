"""Lock benchmark: celery_redlock's Redlock against a bare floor and peer libraries.

In one run, on its own ``redis-server`` processes (free 127.0.0.1 ports):

1. uncontended acquire + release, one process: operations per second and
   latency (median, p99) for the floor (bare redis-py ``SET NX PX`` plus an
   ``EVALSHA`` compare-and-delete on one node; the same on 3 nodes one after
   another, for scale), celery_redlock on 1, 3 and 5 nodes, pottery's
   Redlock on 1 and 3 nodes, redis-py's ``Lock`` and python-redis-lock;
   the same on 3 nodes with one of them paused (SIGSTOP), against the same
   healthy, interleaved;
2. hand-off: 4 processes contend for one lock; the time from the holder's
   ``release()`` returning to the next waiter's ``acquire()`` returning;
3. keys left on each node after 1,000 acquire + release pairs;
4. fencing state: keys and bytes per node after 10,000 (and, with
   ``--full``, 100,000) distinct names were acquired and released, and the
   script calls per node per acquisition once the nodes' clocks are known;
5. renewal: one process holding 10,000 locks renews them all
   (``Redlock.renew``, what the heartbeat does each round): the round's
   time, its CPU time and its round trips per node, with the script cache
   warm and right after ``SCRIPT FLUSH``;
6. semaphore: acquire + release of one slot of a semaphore (limit 3, the
   other 2 slots held) beside a lock pair, on 1 and 3 nodes, latency and
   CPU per pair; and the hand-off of a slot of a limit-1 semaphore to a
   waiting process, beside the lock's.

Usage::

    python benchmarks/lock_bench.py             # about 2 minutes
    python benchmarks/lock_bench.py --quick     # about 40 seconds
    python benchmarks/lock_bench.py --full      # also 100,000 names (a few minutes more)
    python benchmarks/lock_bench.py --markdown  # tables for docs/performance.md
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import redis
import redis_lock
from _common import (
    Timing,
    best_rounds,
    environment,
    micros,
    millis,
    parser,
    percentile,
    progress,
    redis_servers,
    save,
    table,
    time_calls,
    verdict,
)
from pottery import Redlock as PotteryRedlock

import celery_redlock.lock.renewal_batch as renewal_module
from celery_redlock import Redlock
from celery_redlock.lock.redlock import RENEWED
from celery_redlock.lock.renewal import Heartbeat

TTL = 30.0  # seconds: never expires during a measurement
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
FLOOR = "floor (SET NX PX + EVALSHA, 1 node)"


# -- 1. uncontended acquire + release ------------------------------------------


def floor(urls: list[str]) -> Callable[[], object]:
    """Bare redis-py: SET NX PX, then EVALSHA compare-and-delete, node after node."""
    clients = [redis.Redis.from_url(url) for url in urls]
    for client in clients:
        sha = client.script_load(COMPARE_AND_DELETE)
    ttl_ms = int(TTL * 1000)

    def once() -> None:
        token = secrets.token_hex(16)
        for client in clients:
            if not client.set("floor", token, nx=True, px=ttl_ms):
                raise RuntimeError("floor: SET NX failed")
        for client in clients:
            client.evalsha(sha, 1, "floor", token)

    return once


def ours(urls: list[str]) -> Callable[[], object]:
    lock = Redlock(urls).lock("bench", ttl=TTL)

    def once() -> None:
        if not lock.acquire():
            raise RuntimeError("celery_redlock: not acquired")
        lock.release()

    return once


def pottery(urls: list[str]) -> Callable[[], object]:
    masters = {redis.Redis.from_url(url) for url in urls}
    lock = PotteryRedlock(key="bench", masters=masters, auto_release_time=TTL)

    def once() -> None:
        if not lock.acquire():
            raise RuntimeError("pottery: not acquired")
        lock.release()

    return once


def redis_py(urls: list[str]) -> Callable[[], object]:
    lock = redis.Redis.from_url(urls[0]).lock("redis-py", timeout=TTL)

    def once() -> None:
        if not lock.acquire():
            raise RuntimeError("redis-py: not acquired")
        lock.release()

    return once


def python_redis_lock(urls: list[str]) -> Callable[[], object]:
    lock = redis_lock.Lock(redis.Redis.from_url(urls[0]), "bench", expire=int(TTL))

    def once() -> None:
        if not lock.acquire():
            raise RuntimeError("python-redis-lock: not acquired")
        lock.release()

    return once


UNCONTENDED: list[tuple[str, Callable[[list[str]], Callable[[], object]], int]] = [
    (FLOOR, floor, 1),
    ("bare redis-py, 3 nodes one after another", floor, 3),
    ("celery_redlock, 1 node", ours, 1),
    ("celery_redlock, 3 nodes", ours, 3),
    ("celery_redlock, 5 nodes", ours, 5),
    ("pottery Redlock, 1 node", pottery, 1),
    ("pottery Redlock, 3 nodes", pottery, 3),
    ("redis-py Lock, 1 node", redis_py, 1),
    ("python-redis-lock, 1 node", python_redis_lock, 1),
]


def uncontended(urls: list[str], count: int, rounds: int) -> dict[str, Timing]:
    variants = {name: make(urls[:nodes]) for name, make, nodes in UNCONTENDED}
    return best_rounds(variants, count, rounds)


def uncontended_table(timings: dict[str, Timing], markdown: bool) -> str:
    base = timings[FLOOR]
    rows = [
        [
            name,
            f"{timing.per_second:,.0f}",
            micros(timing.median),
            micros(timing.p99),
            f"{timing.median / base.median:.2f}x",
            f"{timing.per_second / base.per_second:.2f}x",
        ]
        for name, timing in timings.items()
    ]
    header = ["lock", "ops/s", "median µs", "p99 µs", "latency vs floor", "ops/s vs floor"]
    return table(header, rows, markdown)


# -- 1b. one node of three paused -----------------------------------------------


HEALTHY = "3 nodes, all answering"
PAUSED = "3 nodes, one paused (SIGSTOP)"


def paused_node(servers: Any, count: int, rounds: int) -> dict[str, Timing]:
    """Acquire + release on 3 nodes, healthy and with the third node paused, interleaved.

    The same Redlock serves both. Once a majority has answered, the paused
    node is waited for only a moment more, and not at all once it has left
    a command unanswered past its deadline (it is *suspect* until it
    answers); resumed, it answers again and is waited for as before.
    """
    redlock = Redlock(servers.urls[:3])
    lock = redlock.lock("paused", ttl=TTL)

    def once() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("celery_redlock: not acquired")
        if not lock.release():
            raise RuntimeError("celery_redlock: release found the lock gone")

    best: dict[str, Timing] = {}
    for _ in range(rounds):
        for name in (HEALTHY, PAUSED):
            if name == PAUSED:
                servers[2].pause()
            try:
                timing = time_calls(once, count, warmup=0)
            finally:
                servers[2].resume()
            if name not in best or timing.median < best[name].median:
                best[name] = timing
        # Let the resumed node run what was queued for it while it was stopped.
        time.sleep(0.2)
    redlock.close()
    progress("paused node done")
    return best


def paused_table(timings: dict[str, Timing], markdown: bool) -> str:
    base = timings[HEALTHY]
    rows = [
        [
            name,
            micros(timing.median),
            micros(timing.p99),
            millis(max(timing.latencies)),
            f"{timing.median / base.median:.2f}x",
        ]
        for name, timing in timings.items()
    ]
    header = ["celery_redlock", "median µs", "p99 µs", "max ms", "median vs healthy"]
    return table(header, rows, markdown)


# -- 2. hand-off between contending processes ---------------------------------


@dataclass(frozen=True)
class Holding:
    """One acquisition by one process, on the shared monotonic clock."""

    pid: int
    called: float  # acquire() called
    acquired: float  # acquire() returned
    releasing: float  # release() called
    released: float  # release() returned


def contender(
    make_lock: Callable[[], Any],
    acquisitions: int,
    hold: float,
    shared: dict[str, Any],
    results: Any,
) -> None:
    """Take the lock ``acquisitions`` times, holding it ``hold`` seconds each.

    After a release the process does not try again until another process has
    taken the lock: every release is then a hand-off to a waiter, never the
    releaser barging back in.
    """
    lock = make_lock()
    turn, taken, finished = shared["turn"], shared["taken"], shared["finished"]
    contenders = shared["contenders"]
    holdings = []
    shared["start"].wait()
    for _ in range(acquisitions):
        called = time.monotonic()
        lock.acquire()
        acquired = time.monotonic()
        with turn:
            taken.value += 1
            mine = taken.value
            turn.notify_all()
        time.sleep(hold)
        releasing = time.monotonic()
        lock.release()
        released = time.monotonic()
        holdings.append(Holding(os.getpid(), called, acquired, releasing, released))
        with turn:
            turn.wait_for(
                lambda mine=mine: taken.value != mine or finished.value == contenders - 1,
                timeout=5.0,
            )
    with turn:
        finished.value += 1
        turn.notify_all()
    results.put(holdings)


@dataclass(frozen=True)
class HandOffs:
    latencies: list[float]
    overlaps: int  # next holder got the lock before the holder called release()
    elapsed: float


def hand_offs(make_lock: Callable[[], Any], contenders: int, total: int, hold: float) -> HandOffs:
    context = multiprocessing.get_context("fork")
    turn = context.Condition()
    shared = {
        "turn": turn,
        "taken": context.RawValue("i", 0),
        "finished": context.RawValue("i", 0),
        "contenders": contenders,
        "start": context.Barrier(contenders),
    }
    results = context.Queue()
    per_process = total // contenders
    processes = [
        context.Process(target=contender, args=(make_lock, per_process, hold, shared, results))
        for _ in range(contenders)
    ]
    began = time.monotonic()
    for process in processes:
        process.start()
    holdings: list[Holding] = []
    for _ in processes:
        holdings.extend(results.get(timeout=300))
    for process in processes:
        process.join()
    elapsed = time.monotonic() - began
    holdings.sort(key=lambda holding: holding.acquired)
    latencies, overlaps = [], 0
    for holder, successor in itertools.pairwise(holdings):
        overlaps += successor.acquired < holder.releasing
        waiting = any(
            other.pid != holder.pid and other.called < holder.released < other.acquired
            for other in holdings
        )
        if waiting:
            latencies.append(successor.acquired - holder.released)
    return HandOffs(latencies, overlaps, elapsed)


def ours_handoff(urls: list[str]) -> Callable[[], Any]:
    return lambda: Redlock(urls).lock("handoff", ttl=10.0)


def pottery_handoff(urls: list[str]) -> Callable[[], Any]:
    return lambda: PotteryRedlock(
        key="handoff", masters={redis.Redis.from_url(url) for url in urls}, auto_release_time=10.0
    )


def python_redis_lock_handoff(urls: list[str]) -> Callable[[], Any]:
    return lambda: redis_lock.Lock(redis.Redis.from_url(urls[0]), "handoff", expire=10)


def contended(urls: list[str], quick: bool, contenders: int, hold: float) -> dict[str, HandOffs]:
    scale = 4 if quick else 1
    plans = [
        ("celery_redlock, 3 nodes", ours_handoff(urls[:3]), 400 // scale),
        ("python-redis-lock, 1 node", python_redis_lock_handoff(urls[:1]), 400 // scale),
        ("pottery Redlock, 3 nodes", pottery_handoff(urls[:3]), 120 // scale),
    ]
    found = {}
    for name, make_lock, total in plans:
        found[name] = hand_offs(make_lock, contenders, total, hold)
        progress(f"hand-off: {name} done")
    return found


def handoff_table(found: dict[str, HandOffs], markdown: bool) -> str:
    rows = [
        [
            name,
            str(len(result.latencies)),
            millis(percentile(result.latencies, 0.5)),
            millis(percentile(result.latencies, 0.99)),
            millis(max(result.latencies)),
            str(sum(latency > 0.01 for latency in result.latencies)),
            str(result.overlaps),
        ]
        for name, result in found.items()
    ]
    header = ["lock", "hand-offs", "p50 ms", "p99 ms", "max ms", "over 10 ms", "overlaps"]
    return table(header, rows, markdown)


# -- 3. stray keys ---------------------------------------------------------------


def stray_keys(urls: list[str], pairs: int) -> list[list[str]]:
    """Per library, per node: keys left after ``pairs`` acquire + release pairs."""
    clients = [redis.Redis.from_url(url) for url in urls]
    for client in clients:
        client.flushall()
    ours_redlock = Redlock(urls, key_prefix="stray:")
    masters = set(clients)
    for index in range(pairs):
        lock = ours_redlock.lock(f"job:{index}", ttl=TTL)
        lock.acquire()
        lock.release()
        theirs = PotteryRedlock(key=f"job:{index}", masters=masters, auto_release_time=TTL)
        theirs.acquire()
        theirs.release()
    time.sleep(0.5)  # pottery returns before every node has answered; let them finish
    rows = []
    for number, client in enumerate(clients, 1):
        ours_keys = [key.decode() for key in client.scan_iter("stray:*", count=1000)]
        fence = sum(key.startswith("stray:fence:") for key in ours_keys)
        pottery_keys = sum(1 for _ in client.scan_iter("redlock:*", count=1000))
        rows.append([f"node {number}", str(len(ours_keys) - fence), str(fence), str(pottery_keys)])
    ours_redlock.close()
    return rows


def stray_table(rows: list[list[str]], markdown: bool) -> str:
    header = [
        "node",
        "celery_redlock lock keys",
        "celery_redlock fencing buckets",
        "pottery keys",
    ]
    return table(header, rows, markdown)


# -- 4. fencing state per node ----------------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    """What ``names`` distinct lock names left on each node, acquired and released once."""

    names: int
    keys: list[int]  # per node
    key_bytes: list[int]  # per node: MEMORY USAGE summed over those keys
    seconds: float


def footprint(urls: list[str], names: int) -> Footprint:
    clients = [redis.Redis.from_url(url) for url in urls]
    for client in clients:
        client.flushall()
    redlock = Redlock(urls, key_prefix="foot:")
    began = time.monotonic()
    for index in range(names):
        lock = redlock.lock(f"sync-user:{index}", ttl=TTL)
        if not lock.acquire(blocking=False):
            raise RuntimeError("celery_redlock: not acquired")
        lock.release()
    seconds = time.monotonic() - began
    keys, key_bytes = [], []
    for client in clients:
        found = list(client.scan_iter(count=1000))
        keys.append(len(found))
        key_bytes.append(sum(client.memory_usage(key) or 0 for key in found))
        client.close()
    redlock.close()
    return Footprint(names, keys, key_bytes, seconds)


def round_trips_per_acquisition(urls: list[str], pairs: int) -> float:
    """Script calls per node per acquisition, once the nodes' clocks are known."""
    clients = [redis.Redis.from_url(url) for url in urls]
    redlock = Redlock(urls, key_prefix="trips:")
    lock = redlock.lock("steady", ttl=TTL)
    for _ in range(3):
        lock.acquire()
        lock.release()

    def evalsha() -> list[int]:
        stats = [client.info("commandstats").get("cmdstat_evalsha", {}) for client in clients]
        return [int(stat.get("calls", 0)) for stat in stats]

    before = evalsha()
    for _ in range(pairs):
        lock.acquire()
        lock.release()
    after = evalsha()
    redlock.close()
    # Each pair is one release call per node, and the acquisition's calls.
    return max(b - a for a, b in zip(before, after, strict=True)) / pairs - 1


def footprint_table(found: list[Footprint], markdown: bool) -> str:
    rows = [
        [
            f"{item.names:,}",
            " / ".join(f"{keys:,}" for keys in item.keys),
            " / ".join(f"{size / 1024:,.0f}" for size in item.key_bytes),
            f"{item.names / item.seconds:,.0f}",
        ]
        for item in found
    ]
    header = ["distinct names", "keys per node", "KiB in keys per node", "pairs/s"]
    return table(header, rows, markdown)


# -- 5. renewal of many held locks ---------------------------------------------------


@dataclass(frozen=True)
class Renewal:
    """Renewal rounds of ``locks`` held locks: wall time, CPU time, round trips per node."""

    locks: int
    warm: list[float]  # seconds per round, script cache loaded
    warm_cpu: list[float]
    warm_trips: int  # fan-outs (one send and one read per node each) per round
    cold: float  # the round right after SCRIPT FLUSH
    cold_trips: int
    heartbeat: list[float]  # a heartbeat thread's whole round, every lock due


def renewal(urls: list[str], count: int, rounds: int) -> Renewal:
    clients = [redis.Redis.from_url(url) for url in urls]
    redlock = Redlock(urls, key_prefix="renew:")
    locks = [redlock.lock(f"held:{index}", ttl=60.0) for index in range(count)]
    for lock in locks:
        if not lock.acquire(blocking=False):
            raise RuntimeError("celery_redlock: not acquired")
    fan_outs = [0]
    real_fan_out = renewal_module.fan_out

    def counting(*args: Any, **kwargs: Any) -> Any:
        fan_outs[0] += 1
        return real_fan_out(*args, **kwargs)

    renewal_module.fan_out = counting  # type: ignore[assignment]
    try:

        def one_round() -> tuple[float, float, int]:
            fan_outs[0] = 0
            began, cpu = time.perf_counter(), time.process_time()
            outcomes = redlock.renew(locks)
            elapsed, used = time.perf_counter() - began, time.process_time() - cpu
            if any(outcome != RENEWED for outcome in outcomes):
                raise RuntimeError("celery_redlock: a renewal failed")
            if not fan_outs[0]:
                raise RuntimeError("no fan-out counted: the counter wraps the wrong module")
            return elapsed, used, fan_outs[0]

        warm, warm_cpu, trips = [], [], []
        for _ in range(rounds):
            elapsed, used, fans = one_round()
            warm.append(elapsed)
            warm_cpu.append(used)
            trips.append(fans)
        for client in clients:
            client.script_flush()
        cold, _, cold_trips = one_round()
    finally:
        renewal_module.fan_out = real_fan_out  # type: ignore[assignment]
    heartbeat = heartbeat_rounds(locks, rounds)
    for client in clients:
        client.flushall()
        client.close()
    redlock.close()
    return Renewal(count, warm, warm_cpu, max(trips), cold, cold_trips, heartbeat)


def heartbeat_rounds(locks: list[Any], rounds: int) -> list[float]:
    """A heartbeat's round (the thread's whole work) with every one of ``locks`` due."""
    beat = Heartbeat()
    # Run the rounds here, timed, instead of on the heartbeat's own thread.
    beat._thread = threading.current_thread()
    held = [beat.hold(lock) for lock in locks]
    times = []
    for _ in range(rounds):
        for entry in held:
            entry.next_due = 0.0
        began = time.perf_counter()
        beat._round()
        times.append(time.perf_counter() - began)
        if any(entry.lost for entry in held):
            raise RuntimeError("celery_redlock: the heartbeat lost a lock")
    return times


def renewal_table(result: Renewal, markdown: bool) -> str:
    rows = [
        [
            "script cache warm",
            millis(percentile(result.warm, 0.5)),
            millis(max(result.warm)),
            millis(percentile(result.warm_cpu, 0.5)),
            str(result.warm_trips),
        ],
        [
            "right after SCRIPT FLUSH",
            millis(result.cold),
            millis(result.cold),
            "",
            str(result.cold_trips),
        ],
        [
            "heartbeat round, every lock due",
            millis(percentile(result.heartbeat, 0.5)),
            millis(max(result.heartbeat)),
            "",
            str(result.warm_trips),
        ],
    ]
    header = ["round", "median ms", "max ms", "CPU ms (median)", "round trips per node"]
    return table(header, rows, markdown)


# -- 6. semaphore beside a lock -------------------------------------------------------

SEMAPHORE_LIMIT = 3


def semaphore_pair(urls: list[str], limit: int = SEMAPHORE_LIMIT) -> Callable[[], object]:
    """One slot of a semaphore whose other slots are held: the acquire looks past them."""
    redlock = Redlock(urls)
    name = f"bench-sem-{limit}"
    for _ in range(min(limit, SEMAPHORE_LIMIT) - 1):
        if not redlock.semaphore(name, limit, TTL).acquire(blocking=False):
            raise RuntimeError("celery_redlock semaphore: not acquired")
    sem = redlock.semaphore(name, limit, TTL)

    def once() -> None:
        if not sem.acquire(blocking=False):
            raise RuntimeError("celery_redlock semaphore: not acquired")
        sem.release()

    return once


SEMAPHORE_VARIANTS: list[tuple[str, Callable[[list[str]], Callable[[], object]], int]] = [
    ("lock pair, 1 node", ours, 1),
    ("semaphore pair, 1 node", semaphore_pair, 1),
    ("lock pair, 3 nodes", ours, 3),
    ("semaphore pair, 3 nodes", semaphore_pair, 3),
    # The script's work grows with the slots held, not with the limit.
    ("semaphore pair, limit 100,000, 1 node", lambda urls: semaphore_pair(urls, 100_000), 1),
]


@dataclass(frozen=True)
class PairCost:
    timing: Timing
    cpu: float  # CPU seconds per pair, this process


def semaphores(urls: list[str], count: int, rounds: int) -> dict[str, PairCost]:
    clients = [redis.Redis.from_url(url) for url in urls]
    for client in clients:
        client.flushall()
    variants = {name: make(urls[:nodes]) for name, make, nodes in SEMAPHORE_VARIANTS}
    timings = best_rounds(variants, count, rounds)
    cpu: dict[str, float] = {}
    for _ in range(rounds):
        for name, operation in variants.items():
            began = time.process_time()
            for _ in range(count):
                operation()
            used = (time.process_time() - began) / count
            cpu[name] = min(cpu.get(name, used), used)
    for client in clients:
        client.flushall()
        client.close()
    return {name: PairCost(timings[name], cpu[name]) for name in variants}


def semaphore_table(found: dict[str, PairCost], markdown: bool) -> str:
    rows = []
    for name, cost in found.items():
        lock = found[f"lock pair, {name.rsplit(', ', 1)[-1]}"]
        rows.append(
            [
                name,
                f"{cost.timing.per_second:,.0f}",
                micros(cost.timing.median),
                micros(cost.timing.p99),
                micros(cost.cpu),
                f"{cost.timing.median / lock.timing.median:.2f}x",
                f"{cost.cpu / lock.cpu:.2f}x",
            ]
        )
    header = ["pair", "ops/s", "median µs", "p99 µs", "CPU µs", "latency vs lock", "CPU vs lock"]
    return table(header, rows, markdown)


def semaphore_handoff(urls: list[str]) -> Callable[[], Any]:
    return lambda: Redlock(urls).semaphore("handoff-sem", 1, 10.0)


def semaphore_handoffs(
    urls: list[str], quick: bool, contenders: int, hold: float
) -> dict[str, HandOffs]:
    total = 400 // (4 if quick else 1)
    found = {}
    for name, make in (
        ("lock, 3 nodes", ours_handoff(urls[:3])),
        ("semaphore limit 1, 3 nodes", semaphore_handoff(urls[:3])),
    ):
        found[name] = hand_offs(make, contenders, total, hold)
        progress(f"hand-off: {name} done")
    return found


# -- report -------------------------------------------------------------------------


def targets(
    timings: dict[str, Timing],
    paused: dict[str, Timing],
    found: dict[str, HandOffs],
    strays: list[list[str]],
    footprints: list[Footprint],
    trips: float,
    renewed: Renewal,
    sems: dict[str, PairCost],
    sem_handoffs: dict[str, HandOffs],
) -> list[list[str]]:
    base, three = timings[FLOOR], timings["celery_redlock, 3 nodes"]
    pottery_three = timings["pottery Redlock, 3 nodes"]
    ours_handoffs = found["celery_redlock, 3 nodes"].latencies
    p50, p99 = percentile(ours_handoffs, 0.5), percentile(ours_handoffs, 0.99)
    stray = sum(int(row[1]) for row in strays)
    most_keys = max(max(item.keys) for item in footprints)
    renewal_ms = percentile(renewed.heartbeat, 0.5)
    checks = [
        (
            "3-node median latency ≤ 1.5x floor",
            f"{three.median / base.median:.2f}x",
            three.median <= 1.5 * base.median,
        ),
        (
            "3-node ops/s ≥ 4x pottery 3-node",
            f"{three.per_second / pottery_three.per_second:.2f}x",
            three.per_second >= 4 * pottery_three.per_second,
        ),
        (
            "one node of three paused: median ≤ 2x healthy",
            f"{paused[PAUSED].median / paused[HEALTHY].median:.2f}x",
            paused[PAUSED].median <= 2 * paused[HEALTHY].median,
        ),
        ("hand-off p50 ≤ 1 ms", f"{millis(p50)} ms", p50 <= 0.001),
        ("hand-off p99 ≤ 3 ms", f"{millis(p99)} ms", p99 <= 0.003),
        ("0 stray lock keys", str(stray), stray == 0),
        (
            "fencing keys per node ≤ 1,024 whatever the names",
            f"{most_keys:,} after {footprints[-1].names:,} names",
            most_keys <= 1024,
        ),
        ("one round trip per acquisition", f"{trips:.2f}", trips <= 1.01),
        (
            f"renewal round of {renewed.locks:,} locks ≤ 50 ms",
            f"{millis(renewal_ms)} ms",
            renewal_ms <= 0.05,
        ),
        (
            "renewal ≤ 3 round trips per node",
            f"{max(renewed.warm_trips, renewed.cold_trips)}",
            max(renewed.warm_trips, renewed.cold_trips) <= 3,
        ),
    ]
    for nodes in ("1 node", "3 nodes"):
        sem, lock = sems[f"semaphore pair, {nodes}"], sems[f"lock pair, {nodes}"]
        ratio = sem.timing.median / lock.timing.median
        checks.append((f"semaphore pair ≤ 1.3x lock pair, {nodes}", f"{ratio:.2f}x", ratio <= 1.3))
    sem_p50 = percentile(sem_handoffs["semaphore limit 1, 3 nodes"].latencies, 0.5)
    checks.append(("semaphore hand-off p50 ≤ 1 ms", f"{millis(sem_p50)} ms", sem_p50 <= 0.001))
    return [[goal, measured, verdict(reached)] for goal, measured, reached in checks]


def main() -> None:
    options = parser(__doc__.split("\n\n")[0])
    options.add_argument("--full", action="store_true", help="also 100,000 distinct names")
    options.add_argument(
        "--semaphore", action="store_true", help="only section 6, the semaphore beside a lock"
    )
    args = options.parse_args()
    count, rounds = (500, 2) if args.quick else (2000, 5)
    contenders, hold = 4, 0.002
    began = time.monotonic()
    if args.semaphore:
        with redis_servers(3) as servers:
            sems = semaphores(servers.urls, count, rounds)
            sem_handoffs = semaphore_handoffs(servers.urls, args.quick, contenders, hold)
        print(semaphore_table(sems, args.markdown) + "\n")
        print(handoff_table(sem_handoffs, args.markdown))
        return
    with redis_servers(5) as servers:
        urls = servers.urls
        about = environment(
            urls[0],
            f"pottery {version('pottery')}",
            f"python-redis-lock {version('python-redis-lock')}",
        )
        timings = uncontended(urls, count, rounds)
        paused = paused_node(servers, count, rounds)
        found = contended(urls, args.quick, contenders, hold)
        strays = stray_keys(urls[:3], 1000)
        progress("stray keys done")
        footprints = [
            footprint(urls[:3], names) for names in (10_000, 100_000)[: 2 if args.full else 1]
        ]
        trips = round_trips_per_acquisition(urls[:3], 1000)
        progress("fencing footprint done")
        renewed = renewal(urls[:3], 10_000, 3 if args.quick else 5)
        progress("renewal done")
        sems = semaphores(urls[:3], count, rounds)
        sem_handoffs = semaphore_handoffs(urls, args.quick, contenders, hold)
        progress("semaphore done")
    save(
        args.save,
        about,
        timings=timings,
        paused=paused,
        handoffs=found,
        semaphores=sems,
        semaphore_handoffs=sem_handoffs,
    )
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    print(f"{heading}Uncontended acquire + release, one process\n")
    print(f"{count:,} pairs per round, {rounds} rounds interleaved, best median round shown.\n")
    print(uncontended_table(timings, args.markdown))
    three = timings["celery_redlock, 3 nodes"].per_second
    pottery_three = timings["pottery Redlock, 3 nodes"].per_second
    print(f"\ncelery_redlock 3 nodes vs pottery 3 nodes: {three / pottery_three:.2f}x ops/s\n")
    print(f"{heading}One node of three paused\n")
    print(
        f"{count:,} acquire + release pairs per round on one Redlock, healthy and with the "
        f"third node stopped (SIGSTOP), {rounds} rounds interleaved, best median round "
        "shown; max ms is the slowest pair of that round.\n"
    )
    print(paused_table(paused, args.markdown))
    print()
    print(f"{heading}Hand-off, {contenders} processes contending\n")
    print(
        f"Each holder keeps the lock {hold * 1000:g} ms; a hand-off is counted when another "
        "process was waiting at the release.\n"
    )
    print(handoff_table(found, args.markdown))
    print(f"\n{heading}Keys left after 1,000 acquire + release pairs, 3 nodes\n")
    print(stray_table(strays, args.markdown))
    print(f"\n{heading}Fencing state after many distinct names, 3 nodes\n")
    print("Each name acquired and released once; values per node, nodes separated by /.\n")
    print(footprint_table(footprints, args.markdown))
    print(f"\nScript calls per node per acquisition, clocks known: {trips:.2f}")
    print(f"\n{heading}Renewing {renewed.locks:,} held locks in one process, 3 nodes\n")
    print(renewal_table(renewed, args.markdown))
    print(f"\n{heading}Semaphore acquire + release beside a lock pair\n")
    print(
        f"One slot of a semaphore of limit {SEMAPHORE_LIMIT} whose other slots are held; "
        f"{count:,} pairs per round, {rounds} rounds interleaved, best median round shown; "
        "CPU: this process, per pair.\n"
    )
    print(semaphore_table(sems, args.markdown))
    print(f"\n{heading}Hand-off to a waiting process, {contenders} processes contending\n")
    print(handoff_table(sem_handoffs, args.markdown))
    print(f"\n{heading}Targets\n")
    checks = targets(timings, paused, found, strays, footprints, trips, renewed, sems, sem_handoffs)
    print(table(["target", "measured", "result"], checks, args.markdown))


if __name__ == "__main__":
    main()
