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
  (one of :data:`LOCK_LOST_CODES`); also sent for a concurrency slot lost
  while its task ran (``key``: the concurrency key)
* ``rate_limited``: ``task_id``, ``key``, ``retry_after`` (seconds), ``action``
* ``rate_paused``: ``task_id``, ``key``, ``paused_for`` (seconds until hits are
  admitted again): a run reported that the service behind the limit refused
  (``self.rate_limited()``)
* ``rate_adapted``: ``task_id``, ``key``, ``change`` (``"decrease"``: a
  reported refusal lowered the rate in force; ``"increase"``: a period passed
  without one, and this run's decision is the one that found it), ``limit``
  (units per ``period`` in force after it), ``period`` (seconds)
* ``duplicate_suppressed``: ``task_id`` (of the copy already queued or running),
  ``key``, ``where`` (``publish`` or ``worker``)
* ``slot_acquired``: ``task_id``, ``key`` (the concurrency key), ``limit``,
  ``slot`` (its number, 0 to ``limit - 1``), ``waited`` (seconds)
* ``slot_busy``: ``task_id``, ``key``, ``limit``, ``waited``, ``action``
  (``retry``/``skip``/``raise``): every slot stayed taken for ``lock_timeout``
* ``slot_released``: ``task_id``, ``key``, ``held`` (seconds)
* ``debounce_published``: ``task_id`` (the new latest copy), ``key``, ``delay``
  (seconds until it may run), ``recorded`` (false when the debounce store did
  not answer: the copy is recorded when it reaches a worker)
* ``debounce_superseded``: ``task_id`` (the copy that does not run), ``key``,
  ``latest`` (the task id that replaced it)
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

#: The ``code`` of a ``lock_lost`` signal, the ``reason`` label of the metric:
#: ``stalled`` (no progress for ``lock_progress_timeout``: renewal stopped),
#: ``renewal_failed`` (a renewal found the lock gone or its validity ran out),
#: ``expired`` (the task's own ``heartbeat()`` found it expired first),
#: ``lost_at_release`` (the task's release found the lock no longer its own).
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
#: The adaptive rate in force of a key went down (a refusal) or up (a quiet period).
rate_adapted = Signal(name="rate_adapted")
#: A singleton publish or run was refused because a copy is queued or running.
duplicate_suppressed = Signal(name="duplicate_suppressed")
#: A task took a slot of its concurrency limit.
slot_acquired = Signal(name="slot_acquired")
#: A task found every slot of its concurrency limit taken (after waiting ``lock_timeout``).
slot_busy = Signal(name="slot_busy")
#: A task gave its concurrency slot up (on any exit path).
slot_released = Signal(name="slot_released")
#: A debounced task was published: it is now its key's latest copy.
debounce_published = Signal(name="debounce_published")
#: A copy of a debounced task reached a worker after a later publish of its key: not run.
debounce_superseded = Signal(name="debounce_superseded")
