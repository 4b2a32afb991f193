"""Singleton tasks: one queued-or-running copy per task and arguments.

At publish time (``delay``/``apply_async``, so also beat) the publisher
takes a lock named after the task and a canonical hash of its bound
arguments, holding the new task id for ``singleton_ttl`` -- the time the
message may wait in the queue. A second publish with the same arguments
finds it held and gets the queued task's ``AsyncResult`` back (or
:class:`~celery_redlock.errors.DuplicateTask`). When the worker starts the
task it takes over that same lock (value ``token|task_id|queued`` becomes
``token|task_id|host:pid``), the heartbeat keeps it, and it is released
when the run ends.

Argument hashing is canonical (:func:`..key_templates.canonical_hash`):
arguments are bound to the task's signature with defaults applied, so
``f(7)``, ``f(x=7)`` and ``f(7, flag=False)`` (when ``flag`` defaults to
``False``) are one key, whatever the keyword order. Numbers compare as
Python does: ``1`` and ``1.0`` are the same key (as ``1 == 1.0``), but
``True`` is not ``1``; tuples and lists are the same; dict keys are sorted.
Values that are not JSON-like (``str``, numbers, ``bool``, ``None``, lists,
tuples, dicts with string keys) cannot be hashed stably and raise
:class:`~celery_redlock.errors.ConfigurationError`: pass a ``singleton_key``
for such tasks.

Publish-side limits: ``app.send_task`` and ``signature.apply_async()`` for a
task not registered in the publishing app do not go through the task
class, so they take no publish-time lock; the worker still refuses to run a
second copy while one runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..._layout import QUEUED, LockValue

if TYPE_CHECKING:
    from ...lock.redlock import Redlock

__all__ = [
    "KEY_HEADER",
    "queued_marker",
    "seconds_held",
    "task_id_of",
]

logger = logging.getLogger("celery_redlock.singleton")

#: The header naming the key a run's next copy (a retry, a re-queue) takes over:
#: the one its run handed back, whatever the copy's own arguments render
#: (``self.retry(args=...)``), so that the call keeps one key to its end.
KEY_HEADER = "redlock_singleton"


def queued_marker(task_id: str) -> str:
    """The end of a publisher's lock value, which the worker takes over."""
    return LockValue.suffix(task_id, QUEUED)


def task_id_of(value: str | None) -> str | None:
    """The task id in a lock value ``token|task_id|where``, if there is one."""
    parsed = LockValue.parse(value)
    if parsed is None or parsed.where is None:
        return None
    return parsed.task_id


def seconds_held(redlock: Redlock, name: str, task_id: str) -> float:
    """Seconds lock ``name`` still holds for ``task_id`` on a majority of nodes (``0.0``: not).

    Unless renewed. One look at every node (:meth:`Redlock.inspect`).
    """
    left = sorted(
        (
            entry[1]
            for entry in redlock.inspect(name)
            if isinstance(entry, tuple) and task_id_of(entry[0]) == task_id
        ),
        reverse=True,
    )
    return left[redlock.quorum - 1] if len(left) >= redlock.quorum else 0.0
