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
  (``stalled``, ``renewal_failed`` or ``expired``)
* ``rate_limited``: ``task_id``, ``key``, ``retry_after`` (seconds), ``action``
* ``duplicate_suppressed``: ``task_id`` (of the copy already queued or running),
  ``key``, ``where`` (``publish`` or ``worker``)
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "duplicate_suppressed",
    "lock_acquired",
    "lock_busy",
    "lock_lost",
    "lock_released",
    "rate_limited",
]

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
#: A singleton publish or run was refused because a copy is queued or running.
duplicate_suppressed = Signal(name="duplicate_suppressed")
