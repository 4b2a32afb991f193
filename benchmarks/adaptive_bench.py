"""Adaptive rate limits: the convergence curve on a hidden limit, and the cost per decision.

Calls offered at 10/s to a service that refuses above a limit it keeps to
itself (8/s, 4/s from 16 s, 8/s again from 28 s), through a
``RateLimiter`` limit of ``"40/s"`` taken as a ceiling: each refusal is
reported with ``limiter.refused(..., adapt=True)`` and the call waits for
the pause, as ``self.rate_limited()`` makes a task do. One process, real
time, one Redis. Then the cost of one decision on a key with an adaptive
rate in force and a pause record, against a plain limit, interleaved, in
the same run.

    .venv/bin/python benchmarks/adaptive_bench.py --save benchmarks/results/adaptive.json
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque

from _common import environment, parser, redis_servers, save, table

from celery_redlock import RateLimiter
from celery_redlock.ratelimit import Limit

SCHEDULE = ((0.0, 8), (16.0, 4), (28.0, 8))
OFFERED = 10.0
SECONDS = 44.0
#: Where each hidden limit has settled: (label, start s, end s).
WINDOWS = (("8/s", 6.0, 16.0), ("4/s", 20.0, 28.0), ("8/s again", 34.0, 44.0))


def convergence(url: str, seconds: float) -> list[tuple[float, bool, float]]:
    """``(time, went through, hidden limit)`` of each call to the service."""
    limiter = RateLimiter(url, margin=0.05)
    ceiling = Limit("api", "40/s")
    log: deque[float] = deque()
    calls = []
    due = [(i / OFFERED, i) for i in range(int(seconds * OFFERED))]
    heapq.heapify(due)
    began = time.monotonic()
    while due:
        at, n = heapq.heappop(due)
        if at >= seconds:
            break
        time.sleep(max(0.0, began + at - time.monotonic()))
        now = time.monotonic() - began
        decision = limiter.hit([ceiling])
        if not decision.allowed:
            spread = random.uniform(0.0, 1.0 / decision.limit)
            heapq.heappush(due, (now + decision.retry_after + spread, n))
            continue
        hidden = next(limit for start, limit in reversed(SCHEDULE) if now >= start)
        while log and log[0] <= now - 1.0:
            log.popleft()
        if len(log) < hidden:
            log.append(now)
            calls.append((now, True, hidden))
            continue
        calls.append((now, False, hidden))
        backoff = limiter.refused(ceiling, retry_after=log[0] + 1.0 - now, adapt=True)
        heapq.heappush(due, (now + backoff.paused_for + random.uniform(0.0, 0.05), n))
    limiter.close()
    return calls


def cost(url: str, rounds: int, hits: int) -> dict[str, float]:
    """Best µs per decision over ``rounds``: a plain limit, and one with an adaptive backoff."""
    limiter = RateLimiter(url)
    limiter.refused(Limit("adaptive", "1000000/s"), retry_after=0.001, adapt=True)
    time.sleep(0.01)
    best = {"plain limit": float("inf"), "adaptive rate in force": float("inf")}
    for _ in range(rounds):
        for name, key in (("plain limit", "plain"), ("adaptive rate in force", "adaptive")):
            limit = [Limit(key, "1000000/s")]
            began = time.perf_counter()
            for _ in range(hits):
                limiter.hit(limit)
            best[name] = min(best[name], (time.perf_counter() - began) / hits * 1e6)
    limiter.close()
    return best


def main() -> None:
    args = parser(__doc__.split("\n\n")[0]).parse_args()
    seconds = 24.0 if args.quick else SECONDS
    with redis_servers(1) as servers:
        url = servers.urls[0]
        about = environment(url)
        calls = convergence(url, seconds)
        costs = cost(url, 3 if args.quick else 5, 1000 if args.quick else 3000)
    save(args.save, about, calls=calls, costs=costs)
    print(f"Measured on: {about}\n")

    def phase(start: float, end: float) -> list[str]:
        inside = [ok for at, ok, _ in calls if start <= at < end]
        went = sum(inside)
        return [f"{went / (end - start):.2f}/s", f"{1 - went / max(len(inside), 1):.1%}"]

    # A shorter run (--quick) reports the windows it reached, cut at its end.
    rows = [
        [f"{label}, {start:g}-{min(end, seconds):g} s", *phase(start, min(end, seconds))]
        for label, start, end in WINDOWS
        if start < seconds
    ]
    print(table(["hidden limit, window", "admitted", "refused"], rows, args.markdown))
    print()
    rows = [[name, f"{us:.0f}"] for name, us in costs.items()]
    print(table(["decision", "µs per decision (best round)"], rows, args.markdown))


if __name__ == "__main__":
    main()
