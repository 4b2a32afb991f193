"""Singletons in ``"queued"`` mode: one running copy plus at most one queued follow-up.

::

    @app.task(base=LockedTask, singleton=True, singleton_mode="queued")
    def rebuild_index(shard): ...

The guarantee: every publish is followed by a run whose body starts after it. Two locks per
name: ``<name>:queued``, taken at publish (a publish finding it held returns its holder), and
``<name>``, taken by the copy that runs, which frees ``<name>:queued`` only once it holds
``<name>``, before its body. A copy coming up while another runs is re-queued every second or
so as the follow-up. Details and tests: docs/debounce.md, "One running plus one queued".
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
    """The run took ``name`` as the running copy: free ``<name>:queued`` for a new follow-up."""
    redlock = run.redlock
    queued = queued_name(name)
    # Not ours or gone is usual (sent by name, a retry). Still ours on a majority would make
    # publishes return this running copy until singleton_ttl: say so.
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
