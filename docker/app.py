"""The Celery app ``docker/compose.yaml`` runs: the examples' tasks, driven by beat.

``celery -A app worker`` and ``celery -A app beat`` load this module. It puts
the examples together in one app on three lock nodes:

* ``examples.sync_user``: ``LockedTask`` per user with heartbeat progress
  (``examples/locked_sync.py``); beat asks for a sync every 2 s, a sync takes
  3 s, and a tick that finds its user's sync still running is skipped;
* ``reports.nightly``: a plain task made a singleton by ``redlock_tasks``
  alone (``examples/nightly_singleton.py``); published every 10 s here, it
  runs 15 s, so every other publish returns the copy still running;
* ``examples.fetch_price``: a global rate limit of 2/s shared by every worker,
  published by beat 4 times a second (``examples/rate_limited_beat.py``), so
  half the ticks are not published.

Settings come from the environment: ``BROKER_URL``, ``REDLOCK_NODES`` (comma
separated), ``METRICS_PORT`` (Prometheus metrics of the worker; ``0``: none).
Lock events are logged on ``celery_redlock.events``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from celery.signals import worker_init

import celery_redlock
from celery_redlock import LockedTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://broker:6379/0")
REDLOCK_NODES = os.environ.get(
    "REDLOCK_NODES", "redis://redis1:6379/0,redis://redis2:6379/0,redis://redis3:6379/0"
).split(",")
METRICS_PORT = int(os.environ.get("METRICS_PORT", "9808"))

app = Celery("celery_redlock_example", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    redlock_nodes=REDLOCK_NODES,
    redlock_key_prefix="example:",
    redlock_tasks={"reports.nightly": {"singleton": True}},
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "sync-user-1": {"task": "examples.sync_user", "schedule": 2.0, "args": (1,)},
        # crontab(hour=2, minute=0) in real life; every 10 s to watch it here.
        "nightly-report": {"task": "reports.nightly", "schedule": 10.0, "args": ("today",)},
        "acme-price": {"task": "examples.fetch_price", "schedule": 0.25, "args": ("ACME",)},
    },
)


@app.task(
    base=LockedTask,
    bind=True,
    name="examples.sync_user",
    shared=False,
    lock_key="sync-user:{user_id}",
    lock_ttl=10,
    lock_progress_timeout=30,
    on_lock_busy="skip",  # the running sync covers this tick
)
def sync_user(self: Any, user_id: int) -> int:
    """Sync one user page by page, reporting progress after each page."""
    for _page in range(6):
        time.sleep(0.5)
        self.heartbeat()
    return int(self.lock.fencing_token)


@app.task(name="reports.nightly", shared=False)
def nightly(day: str) -> str:
    """A plain task; ``redlock_tasks`` makes it a singleton."""
    time.sleep(15)
    return f"report for {day} built"


@app.task(
    base=LockedTask,
    name="examples.fetch_price",
    shared=False,
    global_rate_limit="2/s",
    rate_limit_key="prices-api",
    rate_limit_algorithm="sliding",
)
def fetch_price(symbol: str) -> float:
    """Stands in for a call to a rate-limited external API."""
    return 100.0 + len(symbol)


celery_redlock.setup(app)


@worker_init.connect(weak=False)
def serve_metrics(sender: Any = None, **_: Any) -> None:
    """Count lock events into Prometheus and log them (threads pool: one process)."""
    if getattr(sender, "app", None) is not app or not METRICS_PORT:
        return
    import prometheus_client

    from celery_redlock.contrib import prometheus

    prometheus.install(log_events=True)
    prometheus_client.start_http_server(METRICS_PORT)
