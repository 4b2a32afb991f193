"""Run by renewal_bench.py in a subprocess: one gevent process holding N locks.

Usage: python _gevent_renewal.py URLS SIZES SECONDS TTL

For each size N (and first for no lock at all, the baseline), takes N locks
with ``auto_renew=True``, 100 greenlets at a time (the process heartbeat
renews them, as it renews a gevent worker's task locks), then runs a
greenlet that asks to sleep 1 ms and records how long each sleep really
took, for SECONDS seconds, and how much CPU time the loop's thread spent
between two wake-ups (its own work, without the time the machine gave to
other processes). Prints one
JSON line: per size, the locks taken and the acquisitions that found no
quorum in time, the longest gap, the gaps over 20 and 50 ms, the
renewal rounds seen, the longest renewal round, renewals lost, and the CPU
time of the process per renewed lock.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
from gevent.pool import Pool  # noqa: E402

from celery_redlock import Redlock  # noqa: E402
from celery_redlock.errors import QuorumUnavailable  # noqa: E402
from celery_redlock.lock.renewal import Heartbeat, heartbeat  # noqa: E402

TICK = 0.001


def take(lock: Any) -> int:
    """Take ``lock`` (one attempt); 1 if no quorum answered in time, else 0."""
    try:
        lock.acquire(blocking=False)
    except QuorumUnavailable:
        return 1
    return 0


def main() -> None:
    urls = sys.argv[1].split(",")
    sizes = [int(n) for n in sys.argv[2].split(",")]
    seconds, ttl = float(sys.argv[3]), float(sys.argv[4])
    redlock = Redlock(urls)
    # Each renewal round's wall time, as the heartbeat runs it.
    rounds: list[float] = []
    renew = Heartbeat._renew

    def timed(self: Heartbeat, *args: Any) -> None:
        began = time.perf_counter()
        renew(self, *args)
        rounds.append(time.perf_counter() - began)

    Heartbeat._renew = timed  # type: ignore[method-assign]
    found: dict[str, Any] = {}
    for size in [0, *sizes]:
        locks = [redlock.lock(f"renewal:{size}:{n}", ttl=ttl, auto_renew=True) for n in range(size)]
        failures = sum(Pool(100).map(take, locks))
        taken = sum(lock.locked() for lock in locks)
        gevent.sleep(ttl / 3 + 0.2)  # past the first round, which runs as the locks come in
        rounds.clear()
        gaps: list[float] = []
        cpu_gaps: list[float] = []
        cpu = time.process_time()
        end = time.perf_counter() + seconds
        last, last_cpu = time.perf_counter(), time.thread_time()
        while last < end:
            gevent.sleep(TICK)
            now, now_cpu = time.perf_counter(), time.thread_time()
            gaps.append(now - last - TICK)
            # The loop's own work between two ticks, whatever else the machine runs.
            cpu_gaps.append(now_cpu - last_cpu)
            last, last_cpu = now, now_cpu
        cpu = time.process_time() - cpu
        lost = taken - sum(lock.locked() for lock in locks)
        renewed = len(rounds) * taken
        found[str(size)] = {
            "taken": taken,
            "acquire_failures": failures,
            "worst_gap": max(gaps),
            "worst_cpu_gap": max(cpu_gaps),
            "cpu_over_20ms": sum(gap > 0.020 for gap in cpu_gaps),
            "over_20ms": sum(gap > 0.020 for gap in gaps),
            "over_50ms": sum(gap > 0.050 for gap in gaps),
            "rounds": len(rounds),
            "worst_round": max(rounds, default=0.0),
            "lost": lost,
            "cpu_per_renewal": cpu / renewed if renewed else 0.0,
            "heartbeat_count": heartbeat().count,
        }
        Pool(200).map(lambda lock: lock.locked() and lock.release(), locks)
        print(f"{size} locks done", file=sys.stderr, flush=True)
    redlock.close()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
