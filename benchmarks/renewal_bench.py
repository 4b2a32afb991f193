"""Renewal benchmark: the longest event-loop stall under gevent while the heartbeat renews.

In one run, on its own ``redis-server`` processes (3 lock nodes, free
127.0.0.1 ports): one gevent process takes 1,000, 5,000 and 10,000 locks
with ``auto_renew=True`` (the process heartbeat renews them, as it renews
the task locks of a ``celery worker --pool gevent``), and a greenlet that
asks to sleep 1 ms every time records how late each wake-up is (wall time)
and how much CPU time the loop spent between two wake-ups (its own work:
on a busy machine the wall time also counts the moments the OS ran other
processes, the CPU time does not). A row with
no lock held is the baseline of the same run: what the loop costs anyway.

Reported per number of locks: the longest stall in loop CPU time and in
wall time (how late the 1 ms ticker woke, at worst), how many passed 20 ms
(CPU) and 20 and 50 ms (wall), the renewal rounds
seen and the longest one (wall time, the loop kept running meanwhile), the
locks lost (none expected), and the process's CPU time per renewed lock.
Also reported: how many of the locks were taken, and how many acquisitions
(100 greenlets at a time, while the heartbeat renews the ones already
taken) found no quorum within the node timeout.

Usage::

    python benchmarks/renewal_bench.py             # about a minute
    python benchmarks/renewal_bench.py --quick     # shorter watch per size
    python benchmarks/renewal_bench.py --markdown  # tables for docs/operations.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import environment, micros, millis, parser, progress, redis_servers, save, table

SIZES = [1000, 5000, 10_000]
#: The locks' ttl: the heartbeat renews every ttl/3 s.
TTL = 3.0
#: The target: no stall longer than this at 10,000 locks.
TARGET = 0.020


def measure(urls: list[str], sizes: list[int], seconds: float) -> dict[str, Any]:
    child = Path(__file__).with_name("_gevent_renewal.py")
    done = subprocess.run(
        [sys.executable, str(child), ",".join(urls), ",".join(map(str, sizes)), str(seconds),
         str(TTL)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"the gevent process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    args = parser(__doc__.split("\n\n")[0]).parse_args()
    seconds = 4.0 if args.quick else 10.0
    began = time.monotonic()
    with redis_servers(3) as servers:
        about = environment(servers.urls[0], "gevent")
        progress(f"watching the loop for {seconds:.0f} s per size: {SIZES}")
        found = measure(servers.urls, SIZES, seconds)
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    print(f"{heading}Event-loop stalls under gevent while the heartbeat renews (ttl {TTL:.0f} s)\n")
    rows = []
    for size, row in found.items():
        rows.append(
            [
                f"{int(size):,}" if int(size) else "none (baseline)",
                f"{row['taken']:,}",
                str(row["acquire_failures"]),
                millis(row["worst_cpu_gap"]),
                str(row["cpu_over_20ms"]),
                millis(row["worst_gap"]),
                str(row["over_20ms"]),
                str(row["over_50ms"]),
                str(row["rounds"]),
                millis(row["worst_round"]),
                str(row["lost"]),
                micros(row["cpu_per_renewal"]) if int(size) else "-",
            ]
        )
    header = [
        "locks",
        "held",
        "acquires without quorum",
        "longest stall, loop CPU ms",
        "CPU stalls > 20 ms",
        "longest stall, wall ms",
        "stalls > 20 ms",
        "stalls > 50 ms",
        "renewal rounds",
        "longest round ms",
        "locks lost",
        "CPU µs per renewed lock",
    ]
    print(table(header, rows, args.markdown))
    worst = found[str(SIZES[-1])]["worst_cpu_gap"]
    print(
        f"\nTarget: no stall over {millis(TARGET)} ms of loop CPU at {SIZES[-1]:,} locks: "
        f"{'reached' if worst <= TARGET else 'NOT reached'} ({millis(worst)} ms)"
    )
    save(args.save, about, sizes=SIZES, ttl=TTL, seconds=seconds, results=found)


if __name__ == "__main__":
    main()
