"""Lock benchmark: celery_redlock's Redlock against a bare floor and peer libraries.

In one run, on its own ``redis-server`` processes (free 127.0.0.1 ports):

1. uncontended acquire + release, one process: operations per second and
   latency (median, p99) for the floor (bare redis-py ``SET NX PX`` plus an
   ``EVALSHA`` compare-and-delete on one node; the same on 3 nodes one after
   another, for scale), celery_redlock on 1, 3 and 5 nodes, pottery's
   Redlock on 1 and 3 nodes, redis-py's ``Lock`` and python-redis-lock;
2. hand-off: 4 processes contend for one lock; the time from the holder's
   ``release()`` returning to the next waiter's ``acquire()`` returning;
3. stray keys left on each node after 1,000 acquire + release pairs.

Usage::

    python benchmarks/lock_bench.py             # about 1.5 minutes
    python benchmarks/lock_bench.py --quick     # about 20 seconds
    python benchmarks/lock_bench.py --markdown  # tables for docs/performance.md
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import secrets
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
    verdict,
)
from pottery import Redlock as PotteryRedlock

from celery_redlock import Redlock

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
        fence = sum(key.endswith(":fence") for key in ours_keys)
        pottery_keys = sum(1 for _ in client.scan_iter("redlock:*", count=1000))
        rows.append([f"node {number}", str(len(ours_keys) - fence), str(fence), str(pottery_keys)])
    return rows


def stray_table(rows: list[list[str]], markdown: bool) -> str:
    header = ["node", "celery_redlock lock keys", "celery_redlock :fence keys", "pottery keys"]
    return table(header, rows, markdown)


# -- report -------------------------------------------------------------------------


def targets(
    timings: dict[str, Timing], found: dict[str, HandOffs], strays: list[list[str]]
) -> list[list[str]]:
    base, three = timings[FLOOR], timings["celery_redlock, 3 nodes"]
    pottery_three = timings["pottery Redlock, 3 nodes"]
    ours_handoffs = found["celery_redlock, 3 nodes"].latencies
    p50, p99 = percentile(ours_handoffs, 0.5), percentile(ours_handoffs, 0.99)
    stray = sum(int(row[1]) for row in strays)
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
        ("hand-off p50 ≤ 1 ms", f"{millis(p50)} ms", p50 <= 0.001),
        ("hand-off p99 ≤ 3 ms", f"{millis(p99)} ms", p99 <= 0.003),
        ("0 stray lock keys", str(stray), stray == 0),
    ]
    return [[goal, measured, verdict(reached)] for goal, measured, reached in checks]


def main() -> None:
    args = parser(__doc__.split("\n\n")[0]).parse_args()
    count, rounds = (500, 2) if args.quick else (2000, 5)
    contenders, hold = 4, 0.002
    began = time.monotonic()
    with redis_servers(5) as servers:
        urls = servers.urls
        about = environment(
            urls[0],
            f"pottery {version('pottery')}",
            f"python-redis-lock {version('python-redis-lock')}",
        )
        timings = uncontended(urls, count, rounds)
        found = contended(urls, args.quick, contenders, hold)
        strays = stray_keys(urls[:3], 1000)
    save(args.save, about, timings=timings, handoffs=found)
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    print(f"{heading}Uncontended acquire + release, one process\n")
    print(f"{count:,} pairs per round, {rounds} rounds interleaved, best median round shown.\n")
    print(uncontended_table(timings, args.markdown))
    three = timings["celery_redlock, 3 nodes"].per_second
    pottery_three = timings["pottery Redlock, 3 nodes"].per_second
    print(f"\ncelery_redlock 3 nodes vs pottery 3 nodes: {three / pottery_three:.2f}x ops/s\n")
    print(f"{heading}Hand-off, {contenders} processes contending\n")
    print(
        f"Each holder keeps the lock {hold * 1000:g} ms; a hand-off is counted when another "
        "process was waiting at the release.\n"
    )
    print(handoff_table(found, args.markdown))
    print(f"\n{heading}Keys left after 1,000 acquire + release pairs, 3 nodes\n")
    print(stray_table(strays, args.markdown))
    print(f"\n{heading}Targets\n")
    print(table(["target", "measured", "result"], targets(timings, found, strays), args.markdown))


if __name__ == "__main__":
    main()
