"""Contention benchmark: many runs on one busy lock key, a gevent worker with 200 greenlets.

On its own ``redis-server`` processes (3 lock nodes, a broker, a witness), a
``celery worker --pool gevent -c 200`` subprocess runs the test suite's
``t.sync_user`` (the README's task: ``lock_key="sync-user:{user_id}"``,
``lock_ttl=60``, no ``lock_timeout``, Celery's ``max_retries=3``). The
benchmark holds the user's lock, publishes ``--runs`` syncs of that user,
keeps holding it for ``--hold`` seconds, then releases it and waits for
every result. It reports how many runs ended in SUCCESS and FAILURE, the busy
re-queues (``lock_busy`` signals, recorded on the witness) in each 5 s
window while the lock was held, and how many times kombu logged that it
could not ack a message (``Couldn't ack``, ``MaxConnectionsError``).

Usage::

    python benchmarks/contention_bench.py                  # 200 runs, 40 s held; about 2 minutes
    python benchmarks/contention_bench.py --runs 50 --hold 20
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery_redlock import Redlock  # noqa: E402
from celery_redlock.testing import RedisServer  # noqa: E402
from tests.worker.support import create_app  # noqa: E402

WINDOW = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--hold", type=float, default=40.0)
    options = parser.parse_args()
    with RedisServer.start_many(5) as group, tempfile.TemporaryDirectory() as folder:
        nodes, broker, witness_url = group.urls[:3], group.urls[3], group.urls[4]
        env = {**os.environ, "CR_BROKER": broker, "CR_NODES": ",".join(nodes)}
        env["CR_WITNESS"] = witness_url
        log_path = Path(folder) / "worker.log"
        with log_path.open("wb") as log:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.worker.support",
                    "worker",
                    "--pool",
                    "gevent",
                    "--concurrency",
                    "200",
                    "--loglevel",
                    "INFO",
                    "--without-heartbeat",
                    "--without-mingle",
                    "--without-gossip",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        witness = redis.Redis.from_url(witness_url)
        deadline = time.monotonic() + 60
        while not witness.get("worker-ready"):
            if time.monotonic() > deadline or worker.poll() is not None:
                print(log_path.read_text(errors="replace")[-3000:])
                return 1
            time.sleep(0.1)
        app = create_app(broker, nodes, witness_url)
        holder = Redlock(nodes, key_prefix="t:")
        lock = holder.lock("sync-user:9", ttl=options.hold + 60)
        assert lock.acquire(blocking=False)
        try:
            results = [app.tasks["t.sync_user"].delay(9, 1, 0.02) for _ in range(options.runs)]
            time.sleep(options.hold)
            held_busy = [float(e[3]) for e in app.witness.events() if e[0] == "busy"]
        finally:
            lock.release()
        released = time.monotonic()
        succeeded = failed = 0
        for result in results:
            try:
                result.get(timeout=600)
                succeeded += 1
            except Exception:  # a run that failed: counted, not raised
                failed += 1
        done = time.monotonic() - released
        busy = [e for e in app.witness.events() if e[0] == "busy"]
        worker.terminate()
        worker.wait(60)
        holder.close()
        app.close()
        text = log_path.read_text(errors="replace")
    start = min(held_busy, default=0.0)
    windows = collections.Counter(int((stamp - start) // WINDOW) for stamp in held_busy)
    print(
        f"{options.runs} runs on one key, lock held {options.hold:g} s then released: "
        f"{succeeded} SUCCESS, {failed} FAILURE, all ended {done:.1f} s after the release"
    )
    print(
        f"busy re-queues per {WINDOW:g} s while held:",
        [windows[n] for n in range(int(options.hold // WINDOW))],
    )
    print(f"busy re-queues in all: {len(busy)}; kombu 'Couldn't ack': {text.count('Couldn')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
