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
from typing import NoReturn

from ... import signals
from ..._layout import QUEUED, LockValue
from ...errors import LockNotAcquired, QuorumUnavailable
from ..key_templates import queued_name
from ..run_context import RunContext
from ..run_endings import jittered, requeue_unavailable, requeue_uncounted
from .redelivery import duplicate_found
from .singleton import task_id_of

__all__ = ["FOLLOW_UP_POLL", "running", "wait_or_end"]

logger = logging.getLogger("celery_redlock.task")

#: Seconds (times a jitter of 0.5-1.5) before a waiting follow-up looks again.
FOLLOW_UP_POLL = 1.0


def running(run: RunContext, name: str) -> None:
    """The run took ``name``, as the singleton's running copy: free its ``<name>:queued``.

    So a new follow-up can queue. (Taken over from the copy's own retry, if
    it left ``name`` "queued"; a busy ``name`` went to :func:`wait_or_end`.)
    """
    redlock = run.redlock
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


def wait_or_end(run: RunContext, name: str, holder_id: str | None) -> NoReturn:
    """Another copy runs: wait as the follow-up, or end as a duplicate of the one that is."""
    task = run.task
    singleton = run.policy.singleton
    assert singleton is not None
    redlock = run.redlock
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
        requeue_unavailable(run, f"singleton {queued!r} not checked", exc)
    if waiting is not None and waiting != run.task_id:
        duplicate_found(run, queued, waiting)
    countdown = jittered(FOLLOW_UP_POLL)
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
    requeue_uncounted(
        run,
        countdown,
        LockNotAcquired(
            f"task {task.name!r} ({run.task_id}): singleton {name!r} runs as task "
            f"{holder_id}; this copy is its follow-up",
            key=name,
            timeout=0.0,
        ),
    )
