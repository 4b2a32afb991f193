"""Prometheus metrics from celery_redlock's signals.

``pip install 'celery_redlock[prometheus]'``, then in the module the worker
loads (``celery -A proj worker``), beside the app::

    from celery_redlock.contrib import prometheus

    prometheus.serve_worker(app, port=9808)

The worker's main process serves ``/metrics`` with the counts of every pool process; a process
that only publishes calls ``prometheus.install()``. Each metric is labelled ``task`` and
otherwise only from small fixed sets, so lock keys never become label values:

* ``celery_redlock_lock_wait_seconds``, ``celery_redlock_slot_wait_seconds`` (histograms):
  from asking for a lock (a ``concurrency_limit`` slot) to holding it; ``_count``: acquisitions.
* ``celery_redlock_lock_held_seconds``, ``celery_redlock_slot_held_seconds`` (histograms).
* ``celery_redlock_lock_busy_total``, ``celery_redlock_slot_busy_total`` (``action``: ``retry``,
  ``skip``, ``raise``; locks also ``twin``, ``follow-up``).
* ``celery_redlock_locks_lost_total`` (``reason``: the signal's ``code``: ``stalled``,
  ``renewal_failed``, ``expired``, ``lost_at_release``): locks lost while the task ran.
* ``celery_redlock_rate_limited_total`` (``action``: ``retry``, ``skip``, ``raise``,
  ``skip-publish``): runs or beat publishes refused by a global rate limit.
* ``celery_redlock_rate_backoff_total`` (``change``: ``pause``, ``decrease``, ``increase``).
* ``celery_redlock_duplicates_suppressed_total`` (``where``: ``publish``, ``worker``, ``beat``).
* ``celery_redlock_debounce_published_total`` (``recorded``: ``false`` when the store did not
  answer) and ``celery_redlock_debounce_superseded_total``: their difference is the runs let
  through.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import Any

try:
    from prometheus_client import (
        REGISTRY,
        CollectorRegistry,
        Counter,
        Histogram,
        multiprocess,
        start_http_server,
        values,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "celery_redlock.contrib.prometheus needs prometheus_client: "
        "pip install 'celery_redlock[prometheus]'"
    ) from exc

from celery import Celery
from celery.signals import worker_init, worker_process_shutdown, worker_shutdown

from .. import signals
from .eventlog import EventLogger, install_logging, task_name_of

__all__ = [
    "HELD_BUCKETS",
    "WAIT_BUCKETS",
    "RedlockMetrics",
    "install",
    "reason_label",
    "serve_worker",
]

#: The directory of prometheus_client's multiprocess mode.
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

#: Wait buckets, seconds: most acquisitions take a round trip; waiting for a holder, minutes.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0, 300.0)  # fmt: skip
#: Buckets for the time a lock is held, seconds: a task's run time.
HELD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                3600.0, 14400.0)  # fmt: skip


def reason_label(reason: Any) -> str:
    """Map a ``lock_lost`` reason sent without a ``code`` (by your own senders) onto a label."""
    text = str(reason or "").lower()
    if text.startswith("no progress"):
        return "stalled"
    if text.startswith("renewal failed"):
        return "renewal_failed"
    if text.startswith("expired") or not text:
        return "expired"
    return "other"


class RedlockMetrics:
    """The metrics of one registry and the signal receivers that feed them (:func:`install`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.wait_seconds = Histogram(
            "celery_redlock_lock_wait_seconds",
            "Seconds from asking for a task's lock to holding it.",
            ["task"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.held_seconds = Histogram(
            "celery_redlock_lock_held_seconds",
            "Seconds a task held its lock, observed when it was released.",
            ["task"],
            buckets=HELD_BUCKETS,
            registry=registry,
        )
        self.busy = Counter(
            "celery_redlock_lock_busy",
            "Runs that found their lock held by another owner, by what was done about it.",
            ["task", "action"],
            registry=registry,
        )
        self.lost = Counter(
            "celery_redlock_locks_lost",
            "Locks that expired or failed to renew while their task ran.",
            ["task", "reason"],
            registry=registry,
        )
        self.rate_limited = Counter(
            "celery_redlock_rate_limited",
            "Runs or beat publishes refused by a global rate limit, by what was done about it.",
            ["task", "action"],
            registry=registry,
        )
        self.rate_backoff = Counter(
            "celery_redlock_rate_backoff",
            "Pauses reported by runs, and changes of adaptive rates in force, by change.",
            ["task", "change"],
            registry=registry,
        )
        self.duplicates = Counter(
            "celery_redlock_duplicates_suppressed",
            "Singleton publishes or runs refused because a copy was queued or running.",
            ["task", "where"],
            registry=registry,
        )
        self.slot_wait_seconds = Histogram(
            "celery_redlock_slot_wait_seconds",
            "Seconds from asking for a slot of a task's concurrency limit to holding one.",
            ["task"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.slot_held_seconds = Histogram(
            "celery_redlock_slot_held_seconds",
            "Seconds a task held its concurrency slot, observed when it was released.",
            ["task"],
            buckets=HELD_BUCKETS,
            registry=registry,
        )
        self.slot_busy = Counter(
            "celery_redlock_slot_busy",
            "Runs that found every slot of their concurrency limit taken, by what was done.",
            ["task", "action"],
            registry=registry,
        )
        self.debounce_published = Counter(
            "celery_redlock_debounce_published",
            "Debounced publishes, each its key's latest copy when sent.",
            ["task", "recorded"],
            registry=registry,
        )
        self.debounce_superseded = Counter(
            "celery_redlock_debounce_superseded",
            "Debounced copies not run because a later publish of their key replaced them.",
            ["task"],
            registry=registry,
        )
        #: The event logger ``install(log_events=True)`` connected, if any.
        self.event_logger: EventLogger | None = None
        self._connected: list[tuple[Any, str]] = []

    # -- receivers -------------------------------------------------------------

    def on_lock_acquired(self, sender: Any = None, waited: float = 0.0, **_: Any) -> None:
        """``lock_acquired``: observe the wait."""
        self.wait_seconds.labels(task_name_of(sender)).observe(max(float(waited or 0.0), 0.0))

    def on_lock_released(self, sender: Any = None, held: float = 0.0, **_: Any) -> None:
        """``lock_released``: observe the time held."""
        self.held_seconds.labels(task_name_of(sender)).observe(max(float(held or 0.0), 0.0))

    def on_lock_busy(self, sender: Any = None, action: Any = None, **_: Any) -> None:
        """``lock_busy``: count it by action."""
        self.busy.labels(task_name_of(sender), str(action or "unknown")).inc()

    def on_lock_lost(
        self, sender: Any = None, reason: Any = None, code: Any = None, **_: Any
    ) -> None:
        """``lock_lost``: count it by kind of reason."""
        self.lost.labels(task_name_of(sender), code or reason_label(reason)).inc()

    def on_rate_limited(self, sender: Any = None, action: Any = None, **_: Any) -> None:
        """``rate_limited``: count it by action."""
        self.rate_limited.labels(task_name_of(sender), str(action or "unknown")).inc()

    def on_rate_paused(self, sender: Any = None, **_: Any) -> None:
        """``rate_paused``: count it."""
        self.rate_backoff.labels(task_name_of(sender), "pause").inc()

    def on_rate_adapted(self, sender: Any = None, change: Any = None, **_: Any) -> None:
        """``rate_adapted``: count it by direction."""
        self.rate_backoff.labels(task_name_of(sender), str(change or "unknown")).inc()

    def on_duplicate_suppressed(self, sender: Any = None, where: Any = None, **_: Any) -> None:
        """``duplicate_suppressed``: count it by where it was caught."""
        self.duplicates.labels(task_name_of(sender), str(where or "unknown")).inc()

    def on_slot_acquired(self, sender: Any = None, waited: float = 0.0, **_: Any) -> None:
        """``slot_acquired``: observe the wait."""
        self.slot_wait_seconds.labels(task_name_of(sender)).observe(max(float(waited or 0.0), 0.0))

    def on_slot_released(self, sender: Any = None, held: float = 0.0, **_: Any) -> None:
        """``slot_released``: observe the time held."""
        self.slot_held_seconds.labels(task_name_of(sender)).observe(max(float(held or 0.0), 0.0))

    def on_slot_busy(self, sender: Any = None, action: Any = None, **_: Any) -> None:
        """``slot_busy``: count it by action."""
        self.slot_busy.labels(task_name_of(sender), str(action or "unknown")).inc()

    def on_debounce_published(self, sender: Any = None, recorded: Any = True, **_: Any) -> None:
        """``debounce_published``: count it."""
        self.debounce_published.labels(task_name_of(sender), "true" if recorded else "false").inc()

    def on_debounce_superseded(self, sender: Any = None, **_: Any) -> None:
        """``debounce_superseded``: count it."""
        self.debounce_superseded.labels(task_name_of(sender)).inc()

    # -- wiring ----------------------------------------------------------------

    def connect(self) -> RedlockMetrics:
        """Connect the receivers to :mod:`celery_redlock.signals` (once)."""
        if self._connected:
            return self
        receivers = {
            signals.lock_acquired: self.on_lock_acquired,
            signals.lock_released: self.on_lock_released,
            signals.lock_busy: self.on_lock_busy,
            signals.lock_lost: self.on_lock_lost,
            signals.rate_limited: self.on_rate_limited,
            signals.rate_paused: self.on_rate_paused,
            signals.rate_adapted: self.on_rate_adapted,
            signals.duplicate_suppressed: self.on_duplicate_suppressed,
            signals.slot_acquired: self.on_slot_acquired,
            signals.slot_released: self.on_slot_released,
            signals.slot_busy: self.on_slot_busy,
            signals.debounce_published: self.on_debounce_published,
            signals.debounce_superseded: self.on_debounce_superseded,
        }
        for signal, receiver in receivers.items():
            uid = f"celery_redlock.prometheus:{id(self)}:{signal.name}"
            signal.connect(receiver, weak=False, dispatch_uid=uid)
            self._connected.append((signal, uid))
        return self

    def disconnect(self) -> None:
        """Stop updating the metrics (and logging events, if ``install`` started that)."""
        for signal, uid in self._connected:
            signal.disconnect(dispatch_uid=uid)
        self._connected = []
        if self.event_logger is not None:
            self.event_logger.disconnect()
            self.event_logger = None


#: One RedlockMetrics per registry, so a second install() does not register twice.
_installed: dict[int, tuple[CollectorRegistry, RedlockMetrics]] = {}


def install(
    registry: CollectorRegistry | None = None, *, log_events: bool = False
) -> RedlockMetrics:
    """Count celery_redlock's signals into ``registry`` (default: prometheus_client's).

    Safe to call again. ``log_events`` also logs each event (:mod:`.eventlog`)::

        registry = CollectorRegistry()
        metrics = prometheus.install(registry)
        registry.get_sample_value("celery_redlock_locks_lost_total",
                                  {"task": "crm.sync", "reason": "stalled"})
    """
    target = REGISTRY if registry is None else registry
    known = _installed.get(id(target))
    if known is not None and known[0] is target:
        metrics = known[1]
    else:
        metrics = RedlockMetrics(target)
        _installed[id(target)] = (target, metrics)
    metrics.connect()
    if log_events and not metrics.event_logger:
        metrics.event_logger = install_logging()
    return metrics


def serve_worker(
    app: Celery, port: int = 9808, *, addr: str = "0.0.0.0", log_events: bool = False
) -> None:
    """Serve the metrics of ``app``'s worker on ``port``, from every pool process.

    Call it where the worker loads the app. The main process switches prometheus_client to
    multiprocess mode, so prefork children's counts add up. The directory is
    ``PROMETHEUS_MULTIPROC_DIR`` if set (emptied first; set it before anything imports
    prometheus_client), else a temporary one removed at shutdown.
    """

    def start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=_multiprocess_mode())  # type: ignore[no-untyped-call]
        install(log_events=log_events)
        start_http_server(port, addr, registry=registry)

    uid = f"celery_redlock.prometheus.serve_worker:{id(app)}"
    worker_init.connect(start, weak=False, dispatch_uid=uid)
    worker_process_shutdown.connect(_mark_dead, weak=False, dispatch_uid=_mark_dead.__name__)
    worker_shutdown.connect(_remove_own_directory, weak=False, dispatch_uid=uid)


#: The directory serve_worker made, when PROMETHEUS_MULTIPROC_DIR was not set.
_own_directory: list[str] = []


def _multiprocess_mode() -> str:
    """Make prometheus_client count into files this process's children share."""
    directory = os.environ.get(MULTIPROC_DIR)
    if directory:
        os.makedirs(directory, exist_ok=True)
        mine = f"_{os.getpid()}.db"
        for stale in glob.glob(os.path.join(directory, "*.db")):
            if not stale.endswith(mine):
                os.remove(stale)
    else:
        directory = tempfile.mkdtemp(prefix="celery_redlock-metrics-")
        _own_directory.append(directory)
        os.environ[MULTIPROC_DIR] = directory
    # prometheus_client picks its value class at import; switch it for metrics made from now on.
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return directory


def _mark_dead(pid: int | None = None, **_: Any) -> None:
    """``worker_process_shutdown`` (in the exiting child): its live gauges go."""
    if pid and os.environ.get(MULTIPROC_DIR):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def _remove_own_directory(**_: Any) -> None:
    while _own_directory:
        shutil.rmtree(_own_directory.pop(), ignore_errors=True)
