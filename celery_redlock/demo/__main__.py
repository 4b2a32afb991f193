"""``python -m celery_redlock.demo``: celery_redlock at work, start to finish.

Starts three lock nodes, a broker and a witness (throw-away ``redis-server``
processes, unless ``--nodes URL... --broker URL --witness URL`` name your own;
the witness database is flushed, so give it a scratch one) and two real
Celery workers (a threads pool and a prefork pool), then shows:

1. duplicate tasks for one account serialised by ``LockedTask`` while a lock
   node is killed mid-run;
2. twenty publishes of one singleton collapsed into one run;
3. a global rate limit of 5/s holding across both workers, no task lost;
4. a hung task losing its lock, so another owner can take it;
5. a waiter handed the lock within milliseconds, and no lock without a quorum.

It ends with a summary table and stops every process it started; the exit
status is 0 only if every check held.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from .. import errors
from ..lock.redlock import Redlock
from ..testing import RedisServer, ServerGroup
from .tasks import create_app

RATE = 5  # per second, as declared on demo.call_api


def say(message: str = "") -> None:
    """Print a line at once."""
    print(message, flush=True)


def progress(label: str, done: Callable[[], int], total: int, timeout: float) -> int:
    """Redraw ``label: done/total`` until all are done or ``timeout`` passes."""
    live = sys.stdout.isatty()
    deadline = time.monotonic() + timeout
    count = done()
    while count < total and time.monotonic() < deadline:
        if live:
            print(f"\r  {label}: {count}/{total}", end="", flush=True)
        time.sleep(0.1)
        count = done()
    print(f"\r  {label}: {count}/{total}" if live else f"  {label}: {count}/{total}", flush=True)
    return count


class Workers:
    """Two ``celery worker`` processes of the demo app."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        for name, pool, concurrency in (("threads", "threads", "4"), ("prefork", "prefork", "2")):
            log = (logs / f"worker-{name}.log").open("wb")
            self.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "celery_redlock.demo.tasks",
                        "worker",
                        "--pool",
                        pool,
                        "--concurrency",
                        concurrency,
                        "--loglevel",
                        "WARNING",
                        "--hostname",
                        f"demo-{name}@%h",
                        "--without-heartbeat",
                        "--without-mingle",
                        "--without-gossip",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        """Warm shutdown (SIGTERM); kill what does not stop within 20 s."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


@contextlib.contextmanager
def redis_nodes(options: argparse.Namespace) -> Iterator[tuple[list[str], str, str, Any]]:
    """Lock node URLs, broker URL, witness URL, and the servers started (if any)."""
    if options.nodes:
        yield options.nodes, options.broker, options.witness, None
        return
    with RedisServer.start_many(5) as group:
        say(
            "started 3 lock nodes, a broker and a witness: redis-server on "
            + ", ".join(url.rsplit(":", 1)[-1].split("/")[0] for url in group.urls)
        )
        yield group.urls[:3], group.urls[3], group.urls[4], group


def serialised_syncs(app: Any, witness: redis.Redis, group: ServerGroup | None) -> dict[str, Any]:
    """Step 1: sixteen syncs, twelve of them for one account, a node killed mid-run."""
    say("\n1. LockedTask: 12 syncs of account 1 and 4 of other accounts, 2 workers")
    sync = app.tasks["demo.sync_account"]
    results = [sync.delay(1) for _ in range(12)] + [sync.delay(n) for n in range(2, 6)]
    killed = False

    def done() -> int:
        nonlocal killed
        count = int(witness.get("sync:done") or 0)
        if group is not None and not killed and count >= 6:
            group[0].kill()
            killed = True
            prefix = "\r" if sys.stdout.isatty() else ""
            print(f"{prefix}  lock node {group[0].url} killed mid-run" + " " * 10, flush=True)
        return count

    ran = progress("syncs done", done, len(results), timeout=90)
    tokens = [result.get(timeout=10) for result in results[:12]]
    if group is not None:
        group[0].restart()
    overlaps = int(witness.get("overlaps") or 0)
    say(
        f"  overlaps: {overlaps}; account 1 fencing tokens {min(tokens)}..{max(tokens)}, "
        f"{len(set(tokens))} distinct"
    )
    return {
        "ran": ran,
        "total": len(results),
        "overlaps": overlaps,
        "killed": killed,
        "tokens_distinct": len(set(tokens)) == len(tokens),
    }


def collapsed_singleton(app: Any, witness: redis.Redis) -> dict[str, Any]:
    """Step 2: twenty publishes of one singleton."""
    say("\n2. singleton: rebuild_report('2026-11-22') published 20 times")
    report = app.tasks["demo.rebuild_report"]
    results = [report.delay("2026-11-22") for _ in range(20)]
    ids = {result.id for result in results}
    say(f"  task ids handed out: {len(ids)}")
    say(f"  {results[0].get(timeout=30)}")
    runs = int(witness.get("report:runs") or 0)
    say(f"  runs: {runs}, duplicates suppressed: {len(results) - len(ids)}")
    return {"ids": len(ids), "runs": runs, "suppressed": len(results) - len(ids)}


def held_rate(app: Any, witness: redis.Redis) -> dict[str, Any]:
    """Step 3: fifteen API calls at 5/s across both workers."""
    say(f"\n3. global rate limit: 15 API calls at {RATE}/s, shared by both workers")
    call = app.tasks["demo.call_api"]
    results = [call.delay(n) for n in range(15)]
    completed = progress("calls made", lambda: int(witness.llen("api:calls")), 15, timeout=60)
    values = sorted(result.get(timeout=30) for result in results)
    raw: list[bytes] = witness.lrange("api:calls", 0, -1)  # type: ignore[assignment]
    calls = [entry.decode().split() for entry in raw]
    times = sorted(float(entry[0]) for entry in calls)
    # Any window of one second, measured where the calls start.
    busiest = max(sum(1 for t in times[i:] if t < start + 1.0) for i, start in enumerate(times))
    pids = len({entry[1] for entry in calls})
    say(
        f"  busiest second: {busiest} calls; first to last: {times[-1] - times[0]:.1f} s; "
        f"worker processes used: {pids}; lost: {15 - len(values)}"
    )
    return {"completed": completed, "busiest": busiest, "lost": 15 - len(values), "pids": pids}


def hung_task(app: Any, redlock: Redlock, witness: redis.Redis) -> dict[str, Any]:
    """Step 4: a task that hangs past its progress timeout loses its lock."""
    say("\n4. heartbeat: a task hangs (no progress for 0.5 s, lock ttl 1 s)")
    result = app.tasks["demo.hung_job"].delay(3.0)
    deadline = time.monotonic() + 30
    while not witness.get("hung:started") and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    taken_after = None
    while time.monotonic() - started < 2.5:
        other = redlock.lock("nightly-export", ttl=5.0)
        if other.acquire(blocking=False):
            taken_after = time.monotonic() - started
            other.release()
            break
        time.sleep(0.05)
    outcome = result.get(timeout=30)
    if taken_after is None:
        say("  the hung task kept its lock: NOT expected")
    else:
        say(f"  another owner took the lock {taken_after:.1f} s into the hang")
    say(f"  the task, waking up, found its lock: {outcome}")
    return {"taken_after": taken_after, "outcome": outcome}


def handoff_and_quorum(redlock: Redlock, group: ServerGroup | None) -> dict[str, Any]:
    """Step 5: the lock itself, hand-off latency and behaviour without a quorum."""
    say("\n5. the lock: hand-off to a blocked waiter, then two nodes down")
    latencies = []
    for _ in range(20):
        holder = redlock.lock("handoff", ttl=5.0)
        holder.acquire()
        got: list[float] = []

        def wait(got: list[float] = got) -> None:
            with redlock.lock("handoff", ttl=5.0, timeout=5.0):
                got.append(time.perf_counter())

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.02)
        released = time.perf_counter()
        holder.release()
        thread.join()
        latencies.append((got[0] - released) * 1000)
    median = statistics.median(latencies)
    say(f"  hand-off median {median:.2f} ms, worst {max(latencies):.2f} ms")
    refused = None
    if group is not None:
        group[0].kill()
        group[1].kill()
        started = time.monotonic()
        try:
            redlock.lock("anything", ttl=5.0).acquire(blocking=False)
            refused = False
        except errors.QuorumUnavailable as exc:
            refused = True
            say(f"  after {1000 * (time.monotonic() - started):.0f} ms: QuorumUnavailable: {exc}")
    return {"handoff_ms": median, "refused": refused}


def parse_options(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo's command line: ``[--nodes URL... --broker URL --witness URL]``."""
    parser = argparse.ArgumentParser(
        prog="python -m celery_redlock.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", nargs="+", metavar="URL", help="your own lock nodes")
    parser.add_argument("--broker", metavar="URL", help="a Redis broker (with --nodes)")
    parser.add_argument(
        "--witness", metavar="URL", help="a scratch Redis database, flushed (with --nodes)"
    )
    options = parser.parse_args(argv)
    if options.nodes and not (options.broker and options.witness):
        parser.error("--nodes needs --broker and --witness too (the witness is flushed)")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the process exit status."""
    options = parse_options(argv)
    with (
        redis_nodes(options) as (nodes, broker, witness_url, group),
        tempfile.TemporaryDirectory(prefix="celery-redlock-demo-") as logs,
    ):
        witness = redis.Redis.from_url(witness_url)
        witness.flushdb()
        env = {
            **os.environ,
            "DEMO_BROKER": broker,
            "DEMO_NODES": ",".join(nodes),
            "DEMO_WITNESS": witness_url,
        }
        app = create_app(broker, nodes, witness_url)
        redlock = Redlock(nodes, key_prefix="demo:")
        workers = Workers(env, Path(logs))
        try:
            ready = progress(
                "workers ready", lambda: int(witness.get("workers:ready") or 0), 2, timeout=60
            )
            if ready < 2:
                say(Path(logs, "worker-threads.log").read_text()[-2000:])
                return 1
            syncs = serialised_syncs(app, witness, group)
            single = collapsed_singleton(app, witness)
            rate = held_rate(app, witness)
            hung = hung_task(app, redlock, witness)
        finally:
            workers.stop()
        lock = handoff_and_quorum(redlock, group)
        redlock.close()
        app.close()
    checks = [
        (
            "tasks run",
            f"{syncs['ran'] + single['runs'] + rate['completed'] + 1}",
            syncs["ran"] == syncs["total"],
        ),
        ("overlapping runs of one account", str(syncs["overlaps"]), syncs["overlaps"] == 0),
        (
            "fencing tokens all distinct",
            "yes" if syncs["tokens_distinct"] else "no",
            syncs["tokens_distinct"],
        ),
        ("lock node killed mid-run", "yes" if syncs["killed"] else "no (--nodes)", True),
        ("singleton runs for 20 publishes", str(single["runs"]), single["runs"] == 1),
        ("duplicates suppressed", str(single["suppressed"]), single["suppressed"] == 19),
        ("busiest second at 5/s", str(rate["busiest"]), rate["busiest"] <= RATE),
        ("rate-limited calls lost", str(rate["lost"]), rate["lost"] == 0),
        (
            "hung task lost its lock",
            hung["outcome"],
            hung["outcome"] == "lost" and hung["taken_after"] is not None,
        ),
        ("hand-off median", f"{lock['handoff_ms']:.2f} ms", True),
        (
            "refused without quorum",
            {True: "yes", False: "NO", None: "not tried"}[lock["refused"]],
            lock["refused"] is not False,
        ),
    ]
    say("\nsummary")
    width = max(len(name) for name, _, _ in checks)
    for name, value, ok in checks:
        say(f"  {name:<{width}}  {value:<10} {'ok' if ok else 'FAILED'}")
    return 0 if all(ok for _, _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
