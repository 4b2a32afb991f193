"""Singletons in ``"queued"`` mode: one running copy plus at most one queued follow-up.

::

    @app.task(base=LockedTask, singleton=True, singleton_mode="queued")
    def rebuild_index(shard): ...

The default mode (``"one"``) keeps one copy queued *or* running: a publish
while a copy runs returns the running copy, so whatever changed after that
run read its input is never processed. In ``"queued"`` mode a publish while a
copy runs queues one follow-up, and further publishes return that follow-up
until it starts. The guarantee: **every publish is followed by a run whose
body starts after the publish** — either its own, or the queued copy it
returns, which has not started yet.

Two locks per singleton name (see :mod:`.singleton`):

- ``<name>:queued`` is taken by the publisher, holding the new task id with
  ``singleton_ttl``, as the one key in the default mode is; a publish that
  finds it held returns (or raises :class:`~celery_redlock.errors.DuplicateTask`
  for) the task that holds it;
- ``<name>`` is the running copy's, taken when the copy starts in the
  worker and kept by the heartbeat. Only once it holds ``<name>`` does the
  copy free ``<name>:queued``, before its body starts, so that the next
  publish queues the next follow-up.

A copy that comes up while another runs waits as the follow-up: it is
re-queued (not counted as a retry) every second or so, jittered, keeping
``<name>:queued``, until the running copy ends. A copy that never went through
the publish-time check (``app.send_task``) takes ``<name>:queued`` when it
comes up, or ends as a duplicate of the follow-up that holds it. A retry
(``self.retry()``) hands ``<name>`` back to the retried copy, so between its
attempts a copy is still the current one and the follow-up keeps waiting. A
message re-delivered while its twin runs is put back behind it, as in the
default mode.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, NoReturn

from ... import signals
from ..._layout import QUEUED, LockValue
from ...errors import LockNotAcquired, QuorumUnavailable
from ...lock.renewal import HeldLock
from ..app_state import redlock_for
from .singleton import queued_marker, queued_name, task_id_of

if TYPE_CHECKING:
    from ..run import TaskRun

__all__ = ["FOLLOW_UP_POLL", "take_running"]

logger = logging.getLogger("celery_redlock.task")

#: Seconds (times a jitter of 0.5-1.5) before a waiting follow-up looks again.
FOLLOW_UP_POLL = 1.0


def take_running(run: TaskRun, name: str) -> HeldLock:
    """Make the run the singleton's running copy, or wait as its follow-up, or end it.

    Takes ``name`` (over from the copy's own retry, if it left it "queued"),
    then frees the copy's ``<name>:queued``, so a new follow-up can queue.
    """
    held = run.take(
        name,
        replaces=queued_marker(run.task_id),
        busy=lambda key, holder: _wait_or_end(run, key, holder),
    )
    redlock = redlock_for(run.task.app)
    queued = queued_name(name)
    # Freed with its publish's argument preview: the copy no longer waits.
    # Not ours, or no longer held, is the usual case for a copy sent by name
    # or a retry. Held by us on a majority still would make later publishes
    # return this running copy until singleton_ttl: say so.
    if (
        redlock.release_owner(queued, run.task_id, QUEUED) < redlock.quorum
        and task_id_of(redlock.holder(queued)) == run.task_id
    ):
        logger.warning(
            "singleton %r: task %s runs but could not free %r; publishes return it "
            "until that key expires",
            name,
            run.task_id,
            queued,
        )
    return held


def _wait_or_end(run: TaskRun, name: str, holder_id: str | None) -> NoReturn:
    """Another copy runs: wait as the follow-up, or end as a duplicate of the one that is."""
    task = run.task
    singleton = run.policy.singleton
    assert singleton is not None
    redlock = redlock_for(task.app)
    queued = queued_name(name)
    try:
        waiting = task_id_of(redlock.holder(queued))
        if waiting is None:
            claim = redlock.lock(
                queued, ttl=singleton.ttl, owner=LockValue.owner_text(run.task_id, QUEUED)
            )
            waiting = run.task_id if claim.acquire(blocking=False) else None
            if waiting is None:
                waiting = task_id_of(redlock.holder(queued))
    except QuorumUnavailable as exc:
        run.requeue_unavailable(f"singleton {queued!r} not checked", exc)
    if waiting is not None and waiting != run.task_id:
        run.end_as_duplicate(queued, waiting)
    countdown = FOLLOW_UP_POLL * random.uniform(0.5, 1.5)
    signals.lock_busy.send(
        sender=task, task_id=run.task_id, key=name, waited=0.0, action="follow-up"
    )
    logger.info(
        "task %s: singleton %r runs as task %s; waiting as its follow-up (%.1f s)",
        run.task_id,
        name,
        holder_id,
        countdown,
    )
    run.requeue_uncounted(
        countdown,
        LockNotAcquired(
            f"task {task.name!r} ({run.task_id}): singleton {name!r} runs as task "
            f"{holder_id}; this copy is its follow-up",
            key=name,
            timeout=0.0,
        ),
    )
