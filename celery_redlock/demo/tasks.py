"""The demo's Celery app and tasks; workers load it with ``-A celery_redlock.demo.tasks``.

Configured from ``DEMO_BROKER``, ``DEMO_NODES`` and ``DEMO_WITNESS`` so workers and demo build one
app. Tasks record what they do on the witness, a Redis apart from the lock nodes.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready

from ..errors import LockLost
from ..tasks.locked_task import LockedTask


def create_app(broker: str, nodes: list[str], witness_url: str) -> Celery:
    """The demo app: four tasks showing locks, singletons, rate limits and a hang."""
    app = Celery("celery_redlock_demo", broker=broker, backend=broker, set_as_current=False)
    app.conf.update(
        redlock_nodes=nodes,
        redlock_key_prefix="demo:",
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        task_default_queue="celery_redlock_demo",
    )
    witness = redis.Redis.from_url(witness_url)
    task = functools.partial(app.task, base=LockedTask, bind=True, shared=False)

    @task(
        name="demo.sync_account",
        lock_key="account:{account_id}",
        # Waits for the account's lock, to show the hand-off (default: re-queue when busy).
        lock_timeout=60,
        lock_ttl=5,
    )
    def sync_account(self: Any, account_id: int, work: float = 0.15) -> int:
        if witness.incr(f"inside:{account_id}") > 1:
            witness.incr("overlaps")
        time.sleep(work)
        self.heartbeat()
        witness.decr(f"inside:{account_id}")
        witness.incr("sync:done")
        return int(self.lock.fencing_token)

    @task(name="demo.rebuild_report", singleton=True)
    def rebuild_report(self: Any, day: str) -> str:
        witness.incr("report:runs")
        time.sleep(1.0)
        return f"report for {day} rebuilt by {self.request.id}"

    @task(name="demo.call_api", global_rate_limit="5/s")
    def call_api(self: Any, n: int) -> int:
        witness.rpush("api:calls", f"{time.monotonic():.6f} {os.getpid()}")
        return n

    @task(
        name="demo.hung_job",
        lock_key="nightly-export",
        lock_ttl=1.0,
        lock_progress_timeout=0.5,
    )
    def hung_job(self: Any, hang: float = 3.0) -> str:
        self.heartbeat()
        witness.set("hung:started", time.monotonic())
        time.sleep(hang)  # stuck, reporting no progress
        try:
            self.heartbeat()
        except LockLost:
            return "lost"
        return "kept"

    return app


def app_from_environment() -> Celery:
    """The app the demo's workers run."""
    return create_app(
        os.environ["DEMO_BROKER"], os.environ["DEMO_NODES"].split(","), os.environ["DEMO_WITNESS"]
    )


if "DEMO_BROKER" in os.environ:
    app = app_from_environment()
    _witness = redis.Redis.from_url(os.environ["DEMO_WITNESS"])

    @worker_ready.connect(weak=False)
    def _announce(sender: Any = None, **_: Any) -> None:
        _witness.incr("workers:ready")
