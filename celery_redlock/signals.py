"""Signals sent by celery_redlock, for metrics and logs.

Connect like any Celery signal::

    from celery_redlock import signals

    @signals.lock_acquired.connect
    def count(sender, task_id, key, waited, **kwargs):
        metrics.histogram("lock.wait", waited)

``sender`` is the task. Keyword arguments:

* ``lock_acquired``: ``task_id``, ``key``, ``waited`` (seconds), ``fencing_token``
* ``lock_released``: ``task_id``, ``key``, ``held`` (seconds)
* ``lock_busy``: ``task_id``, ``key``, ``waited``, ``action`` (``retry``/``skip``/``raise``)
* ``lock_lost``: ``task_id``, ``key``, ``held``, ``reason`` (text), ``code``
  (:data:`LOCK_LOST_CODES`); also for a concurrency slot (``key``: the concurrency key)
* ``rate_limited``: ``task_id``, ``key``, ``retry_after`` (seconds), ``action``
* ``rate_paused``: ``task_id``, ``key``, ``paused_for`` (seconds)
* ``rate_adapted``: ``task_id``, ``key``, ``change`` (``"decrease"`` or ``"increase"``),
  ``limit`` per ``period`` (seconds) in force after it
* ``duplicate_suppressed``: ``task_id`` (of the copy queued or running), ``key``, ``where``
  (``publish`` or ``worker``)
* ``slot_acquired``: ``task_id``, ``key``, ``limit``, ``slot`` (0 to ``limit - 1``), ``waited``
* ``slot_busy``: ``task_id``, ``key``, ``limit``, ``waited``, ``action``
* ``slot_released``: ``task_id``, ``key``, ``held`` (seconds)
* ``debounce_published``: ``task_id``, ``key``, ``delay`` (seconds until it may run),
  ``recorded`` (false: the store did not answer; recorded when a worker gets it)
* ``debounce_superseded``: ``task_id`` (the copy not run), ``key``, ``latest`` (its successor)
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "debounce_published",
    "debounce_superseded",
    "duplicate_suppressed",
    "lock_acquired",
    "lock_busy",
    "lock_lost",
    "lock_released",
    "rate_adapted",
    "rate_limited",
    "rate_paused",
    "slot_acquired",
    "slot_busy",
    "slot_released",
]

#: ``lock_lost``'s ``code`` and the metric's ``reason`` (docs/operations.md, "Metrics"):
#: ``stalled`` (no progress: renewal stopped), ``renewal_failed``, ``expired`` (the task's
#: ``heartbeat()`` noticed first), ``lost_at_release``.
LOCK_LOST_CODES = ("stalled", "renewal_failed", "expired", "lost_at_release")

#: A task took its lock.
lock_acquired = Signal(name="lock_acquired")
#: A task gave its lock up (on any exit path).
lock_released = Signal(name="lock_released")
#: A task found its lock held by another owner.
lock_busy = Signal(name="lock_busy")
#: A running task's lock expired or could not be renewed.
lock_lost = Signal(name="lock_lost")
#: A global rate limit refused a task.
rate_limited = Signal(name="rate_limited")
#: A run reported a refusal by the service behind a limit: its key is paused.
rate_paused = Signal(name="rate_paused")
#: A key's adaptive rate went down (a refusal) or up (a quiet period; one run sees each step).
rate_adapted = Signal(name="rate_adapted")
#: A singleton publish or run was refused because a copy is queued or running.
duplicate_suppressed = Signal(name="duplicate_suppressed")
#: A task took a slot of its concurrency limit.
slot_acquired = Signal(name="slot_acquired")
#: Every slot of a task's concurrency limit stayed taken for ``lock_timeout``.
slot_busy = Signal(name="slot_busy")
#: A task gave its concurrency slot up (on any exit path).
slot_released = Signal(name="slot_released")
#: A debounced task was published: it is now its key's latest copy.
debounce_published = Signal(name="debounce_published")
#: A copy of a debounced task reached a worker after a later publish of its key: not run.
debounce_superseded = Signal(name="debounce_superseded")
