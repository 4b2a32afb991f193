"""Singleton tasks: one queued-or-running copy per task and arguments.

The publisher takes a lock on the task and a canonical hash of its bound arguments (see
docs/configuration.md, "Singleton"), holding the new task id for ``singleton_ttl``; the worker
takes that same lock over (``token|id|queued`` becomes ``token|id|host:pid``) and releases it
when the run ends. A publish by name takes no publish-time lock; the worker still runs one copy.
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

#: Header naming the key a run's next copy (a retry, a re-queue) takes over, whatever its
#: own arguments render (``self.retry(args=...)``): one key to the call's end.
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
    """Seconds lock ``name`` still holds for ``task_id`` on a majority, unless renewed (or 0.0)."""
    left = sorted(
        (
            entry[1]
            for entry in redlock.inspect(name)
            if isinstance(entry, tuple) and task_id_of(entry[0]) == task_id
        ),
        reverse=True,
    )
    return left[redlock.quorum - 1] if len(left) >= redlock.quorum else 0.0
