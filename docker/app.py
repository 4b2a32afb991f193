"""The Celery app ``docker/compose.yaml`` runs: the quickstart's app, watched.

``celery -A app worker`` and ``celery -A app beat`` load this module. The
tasks are the quickstart's, ``docs/examples/quickstart/tasks.py`` (copied
beside this file in the image), one source for both:

* ``tasks.sync_user``: ``LockedTask`` per user with heartbeat progress; beat
  asks for a sync of user 1 every second and a sync takes 1.5 s, so syncs
  find the user's lock busy and are re-queued until it is free;
* ``reports.nightly``: a plain task made a singleton by ``redlock_tasks``;
  published every second here (nightly in the quickstart), it runs 2 s, so
  every other publish returns the copy still running;
* ``tasks.fetch_price``: a global rate limit of 2/s shared by every worker,
  published by beat 4 times a second, so half the ticks are not published.

Settings come from the environment: ``BROKER_URL``, ``REDLOCK_NODES`` (comma
separated), ``METRICS_PORT`` (Prometheus metrics of the worker; ``0``: none).
Lock events are logged on ``celery_redlock.events``.
"""

from __future__ import annotations

import os

from tasks import app

from celery_redlock.contrib import prometheus

METRICS_PORT = int(os.environ.get("METRICS_PORT", "9808"))

# Ticks fast enough to watch (the quickstart's nightly report is at 2 a.m.).
app.conf.beat_schedule = {
    "sync-user-1": {"task": "tasks.sync_user", "schedule": 1.0, "args": (1,)},
    "nightly-report": {"task": "reports.nightly", "schedule": 1.0, "args": ("today",)},
    "acme-price": {"task": "tasks.fetch_price", "schedule": 0.25, "args": ("ACME",)},
}

__all__ = ["app"]

if METRICS_PORT:
    # Lock events counted from every pool process and logged; served by the worker.
    prometheus.serve_worker(app, port=METRICS_PORT, log_events=True)
