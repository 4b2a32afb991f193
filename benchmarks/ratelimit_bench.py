"""Rate-limit decisions per second from one process, against a local redis-server.

For each algorithm of ``celery_redlock.RateLimiter`` it measures, in one run
and on the same server:

* ``RateLimiter.hit`` itself;
* the bare ``EVALSHA`` of the very same script through a plain redis-py
  client: the floor a Python wrapper can reach (goal: ``hit`` at >= 0.9x);
* the ``limits`` library's Redis limiter for the same job
  (``FixedWindowRateLimiter`` and ``MovingWindowRateLimiter`` on a
  ``RedisStorage``).

Two workloads: ``hot key`` hammers one key far over its limit (100/s, so most
decisions are refusals), ``many keys`` spreads hits over 1,000 keys that all
stay under their limit (every decision admits). Variants run interleaved,
``--rounds`` times each, and the best round counts, which damps the noise of
a busy machine.

Usage::

    python benchmarks/ratelimit_bench.py            # ~40 s
    python benchmarks/ratelimit_bench.py --quick    # a few seconds
    python benchmarks/ratelimit_bench.py --markdown # table for docs/performance.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from celery_redlock import RateLimiter
from celery_redlock._scripts import load
from celery_redlock.testing import RedisServer

try:
    import limits
    from limits.storage import RedisStorage
    from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter
except ImportError:  # pragma: no cover - told to the user below
    limits = None


@dataclass(frozen=True)
class Workload:
    name: str
    keys: int
    limit: int
    period: float


WORKLOADS = [
    Workload("hot key", keys=1, limit=100, period=1.0),
    Workload("many keys", keys=1000, limit=100, period=60.0),
]
ALGORITHMS = ["fixed", "sliding"]
LIMITS_STRATEGY = {"fixed": "FixedWindow", "sliding": "MovingWindow"}


def key_names(workload: Workload, tag: str) -> list[str]:
    return [f"{tag}:{i}" for i in range(workload.keys)]


def rate(calls: Callable[[int], None], duration: float) -> float:
    """Decisions per second: ``calls(n)`` makes n decisions; run for ``duration``."""
    calls(200)  # warm-up: connections, script caches
    batch = 100
    done = 0
    began = time.perf_counter()
    deadline = began + duration
    while True:
        calls(batch)
        done += batch
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - began)


def ours(url: str, algorithm: str, workload: Workload) -> Callable[[int], None]:
    limiter = RateLimiter(url, algorithm=algorithm)  # type: ignore[arg-type]
    keys = key_names(workload, "ours")
    hit, limit, period = limiter.hit, workload.limit, workload.period
    position = 0

    def calls(n: int) -> None:
        nonlocal position
        for _ in range(n):
            hit(keys[position % len(keys)], limit, period)
            position += 1

    return calls


def bare(url: str, algorithm: str, workload: Workload) -> Callable[[int], None]:
    script = load(f"ratelimit_{algorithm}")
    client = redis.Redis.from_url(url)
    client.script_load(script.source)
    evalsha, sha = client.evalsha, script.sha
    keys = [f"bare:{{{key}}}:{algorithm}" for key in key_names(workload, "bare")]
    limit, period_ms = workload.limit, round(workload.period * 1000)
    position = 0

    def calls(n: int) -> None:
        nonlocal position
        for _ in range(n):
            evalsha(sha, 1, keys[position % len(keys)], limit, period_ms, 1, 1)
            position += 1

    return calls


def theirs(url: str, algorithm: str, workload: Workload) -> Callable[[int], None]:
    assert limits is not None
    storage = RedisStorage(url)
    strategy = MovingWindowRateLimiter if algorithm == "sliding" else FixedWindowRateLimiter
    limiter = strategy(storage)
    seconds = int(workload.period)
    item = limits.RateLimitItemPerSecond(workload.limit, seconds)
    keys = key_names(workload, "limits")
    hit = limiter.hit
    position = 0

    def calls(n: int) -> None:
        nonlocal position
        for _ in range(n):
            hit(item, keys[position % len(keys)])
            position += 1

    return calls


VARIANTS: dict[str, Callable[[str, str, Workload], Callable[[int], None]]] = {
    "celery_redlock": ours,
    "bare EVALSHA": bare,
}
if limits is not None:
    VARIANTS["limits"] = theirs


def measure(url: str, duration: float, rounds: int) -> dict[tuple[str, str, str], float]:
    best: dict[tuple[str, str, str], float] = {}
    flusher = redis.Redis.from_url(url)
    for round_number in range(rounds):
        for workload in WORKLOADS:
            for algorithm in ALGORITHMS:
                names = list(VARIANTS)
                # alternate the order, so no variant always runs first
                if round_number % 2:
                    names.reverse()
                for name in names:
                    flusher.flushall()
                    per_second = rate(VARIANTS[name](url, algorithm, workload), duration)
                    slot = (workload.name, algorithm, name)
                    best[slot] = max(best.get(slot, 0.0), per_second)
        print(f"round {round_number + 1}/{rounds} done", file=sys.stderr)
    flusher.close()
    return best


def table(best: dict[tuple[str, str, str], float], markdown: bool) -> str:
    header = ["workload", "algorithm", "celery_redlock /s", "bare EVALSHA /s", "ratio"]
    if limits is not None:
        header += ["limits /s", "ratio"]
    rows = []
    for workload in WORKLOADS:
        for algorithm in ALGORITHMS:
            ours_rate = best[(workload.name, algorithm, "celery_redlock")]
            bare_rate = best[(workload.name, algorithm, "bare EVALSHA")]
            row = [
                workload.name,
                algorithm,
                f"{ours_rate:,.0f}",
                f"{bare_rate:,.0f}",
                f"{ours_rate / bare_rate:.2f}x",
            ]
            if limits is not None:
                theirs_rate = best[(workload.name, algorithm, "limits")]
                row += [
                    f"{theirs_rate:,.0f} ({LIMITS_STRATEGY[algorithm]})",
                    f"{ours_rate / theirs_rate:.2f}x",
                ]
            rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in [header, *rows]
    )


def environment(server: RedisServer) -> str:
    with server.client() as client:
        redis_version = client.info("server")["redis_version"]
    parts = [
        f"redis-server {redis_version}",
        f"Python {platform.python_version()}",
        f"redis-py {redis.__version__}",
        f"limits {limits.__version__}" if limits is not None else "limits not installed",
        f"{os.cpu_count()} CPUs",
        f"load {os.getloadavg()[0]:.2f}",
    ]
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run, one round")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--duration", type=float, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, help="measurements per variant (best counts)")
    args = parser.parse_args()
    duration = args.duration or (0.2 if args.quick else 1.0)
    rounds = args.rounds or (1 if args.quick else 3)
    if limits is None:
        print("limits is not installed: pip install -e '.[bench]'", file=sys.stderr)
    with RedisServer() as server:
        best = measure(server.url, duration, rounds)
        print(f"Rate-limit decisions per second, one process ({environment(server)}):")
        print(f"{rounds} round(s) of {duration:g} s per variant, best round shown\n")
        print(table(best, args.markdown))


if __name__ == "__main__":
    main()
