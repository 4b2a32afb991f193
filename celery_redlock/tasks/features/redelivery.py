"""Copies of a run: a message delivered again after its run ended, a duplicate in a canvas.

A re-delivered copy (same task id) must never run after its twin ended: a run whose message
may come again writes a *done mark* before releasing its locks, and a possible copy drops itself
if it finds the mark or a ready state in the result backend. A run that may wait first holds a
*delivery lock* on its task id, so two copies never look for the mark at once. A run the worker
killed gets an *ended mark* first, so its late release tells no loss. Protocol and limits:
docs/operations.md, "Broker visibility_timeout and acks_late".

A duplicate singleton in a canvas cannot just end (``group.get()`` or the chain would wait
forever): it is re-queued until the winner ends, then ends with its value or ``DuplicateTask``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NoReturn

from celery import states
from celery.exceptions import Ignore

from ... import signals
from ..._clock import to_ms
from ..._layout import done_key, ended_key
from ...errors import DuplicateTask
from ...lock.quorum import failed, reply
from ...lock.redlock import Redlock
from ...transport.nodes import Command, fan_out
from ..key_templates import queued_name
from ..run_context import RunContext
from ..run_endings import end_as_duplicate, held_at_most, jittered, resend_with
from .singleton import seconds_held, task_id_of

__all__ = [
    "DONE_TTL_FACTOR",
    "WINNER_HEADER",
    "delivery_name",
    "drop_if_finished",
    "duplicate_found",
    "ended_by_worker",
    "finished",
    "in_canvas",
    "leaves_mark",
    "look_at_winner",
    "mark_done",
    "mark_ended",
    "redelivered",
    "stand_in",
    "winner_outcome",
]

logger = logging.getLogger("celery_redlock.task")

#: A done mark lives this many times the run's lock ttl: a copy re-queued
#: behind its twin comes back within the ttl and a second and a half.
DONE_TTL_FACTOR = 2.0
#: Message header of a canvas copy waiting for the run of this task id.
WINNER_HEADER = "redlock_winner"
#: Longest wait, in seconds, before a waiting canvas copy looks at its winner again.
_WINNER_POLL = 2.0


def delivery_name(task_id: str) -> str:
    """The name of the lock a run of ``task_id`` holds while it waits and runs."""
    return f"delivery:{task_id}"


def redelivered(request: Any) -> bool:
    """Whether the broker marked this delivery as one made before (kombu's ``redelivered``)."""
    info = getattr(request, "delivery_info", None) or {}
    return bool(info.get("redelivered"))


def leaves_mark(task: Any, request: Any) -> bool:
    """Whether the message may come again after the run (``acks_late``, or an unacked ``eta``)."""
    return bool(getattr(task, "acks_late", False) or getattr(request, "eta", None))


def mark_done(redlock: Redlock, task_id: str, ttl: float) -> None:
    """Record on every lock node that a run of ``task_id`` ended; best effort."""
    try:
        _mark(redlock, done_key(redlock.key_prefix, task_id), ttl)
    except Exception as exc:  # the result backend still tells, where there is one
        logger.warning("task %s: done mark not written: %s", task_id, exc)


def mark_ended(redlock: Redlock, task_id: str, where: str, ttl: float) -> None:
    """Record on every lock node that the worker ended the run of ``task_id`` at ``where``.

    Written before the worker frees the run's locks; ``ttl``: as long as the run could think it
    still holds them.
    """
    _mark(redlock, ended_key(redlock.key_prefix, task_id, where), ttl)


def ended_by_worker(redlock: Redlock, task_id: str, where: str) -> bool:
    """Whether the worker ended this run (:func:`mark_ended`); if unsure ``False``: loss shows."""
    try:
        return _marked(redlock, ended_key(redlock.key_prefix, task_id, where))
    except Exception:
        return False


def _mark(redlock: Redlock, key: str, ttl: float) -> None:
    command = Command(("SET", key, "1", "PX", to_ms(ttl)))
    nodes = redlock.nodes
    results = fan_out(nodes, [[command]] * len(nodes), redlock.node_timeout)
    missed = sum(failed(reply(result)) for result in results)
    if missed:
        logger.debug("mark %r not written on %d node(s)", key, missed)


def _marked(redlock: Redlock, key: str) -> bool:
    """Whether any lock node that answers has ``key``."""
    nodes = redlock.nodes
    command = Command(("EXISTS", key))
    for result in fan_out(nodes, [[command]] * len(nodes), redlock.node_timeout):
        answer = reply(result)
        if not failed(answer) and answer:
            return True
    return False


def finished(task: Any, redlock: Redlock, task_id: str, *, backend: bool = True) -> str | None:
    """Why ``task_id`` counts as finished (a done mark, a ready state), or ``None``.

    ``backend=False`` reads the mark only: enough for a run that is no copy and has no ``eta``.
    """
    if _marked(redlock, done_key(redlock.key_prefix, task_id)):
        return "its run left a done mark"
    if not backend:
        return None
    try:
        state = task.backend.get_state(task_id)
    except Exception:  # no result backend, or it is down: the mark is all there is
        return None
    if state in states.READY_STATES:
        return f"the result backend has it in {state}"
    return None


def drop_if_finished(run: RunContext, *, backend: bool) -> None:
    """End a copy as ignored if its task id already finished, keeping the result it left."""
    why = finished(run.task, run.redlock, run.task_id, backend=backend)
    if why is not None:
        logger.info("task %s: already finished (%s); this copy is not run", run.task_id, why)
        raise Ignore()


# -- canvas copies ---------------------------------------------------------------------


def in_canvas(request: Any) -> bool:
    """Whether something waits for this run's result or runs after it (group, chord, chain...)."""
    names = ("group", "chord", "chain", "callbacks", "errbacks")
    return any(getattr(request, name, None) for name in names)


def duplicate_found(run: RunContext, key: str, holder_id: str | None) -> NoReturn:
    """A singleton run found another copy: a canvas copy stands in, any other ends duplicate."""
    if holder_id and in_canvas(run.request) and not run.request.called_directly:
        stand_in(run, key, holder_id)
    end_as_duplicate(run, key, holder_id)


def stand_in(run: RunContext, key: str, holder_id: str) -> NoReturn:
    """A duplicate singleton in a canvas: fail now (``"raise"``) or wait for the holder's end."""
    task = run.task
    signals.duplicate_suppressed.send(sender=task, task_id=holder_id, key=key, where="worker")
    assert run.policy.singleton is not None
    if run.policy.singleton.on_duplicate == "raise":
        raise DuplicateTask(
            f"task {task.name!r}: singleton {key!r} is queued or running as task {holder_id}",
            task_name=task.name,
            task_id=holder_id,
            key=key,
            ttl=seconds_held(run.redlock, key, holder_id),
        )
    entries = run.redlock.inspect(key)
    left = max((entry[1] for entry in entries if isinstance(entry, tuple)), default=1.0)
    _wait_for_winner(run, key, holder_id, left)


def look_at_winner(run: RunContext, winner: str) -> tuple[bool, Any]:
    """A canvas copy back from waiting for ``winner``: its result, or wait again.

    ``(True, value)``: end with it; ``(False, None)``: the winner is gone, run as its own singleton.
    """
    task, singleton = run.task, run.policy.singleton
    assert singleton is not None
    key = singleton.name(task.name, run.args, run.kwargs)
    if singleton.on_duplicate == "raise":
        stand_in(run, key, winner)  # a duplicate fails, whether its winner ended or not
    # In "queued" mode the winner may still wait as the follow-up.
    names = (key, queued_name(key)) if singleton.mode == "queued" else (key,)
    ended, value = winner_outcome(task, run.redlock, names, winner)
    if ended:
        logger.info("task %s: ends with the result of singleton %s", run.request.id, winner)
        return True, value
    if value is not None:
        _wait_for_winner(run, key, winner, value, again=True)
    return False, None


def _wait_for_winner(
    run: RunContext, key: str, holder_id: str, left: float, *, again: bool = False
) -> NoReturn:
    """Re-queue a canvas copy until ``holder_id`` ends; ``left``: its lock's ttl, seconds."""
    countdown = held_at_most(run.task.app, jittered(max(0.2, min(left, _WINNER_POLL))))
    logger.log(
        logging.DEBUG if again else logging.INFO,
        "task %s: duplicate of singleton %s (%r) in a canvas; waiting for its result",
        run.request.id,
        holder_id,
        key,
    )
    resend_with(run, WINNER_HEADER, holder_id, countdown)


def winner_outcome(
    task: Any, redlock: Redlock, names: Sequence[str], winner: str
) -> tuple[bool, Any]:
    """What a canvas copy waiting for ``winner`` (holder of one of ``names``) does now.

    ``(True, value)``: the winner succeeded. ``(False, seconds)``: it still holds a name or its
    result is on its way; wait. ``(False, None)``: gone without a result; run as its own singleton.
    Raises ``DuplicateTask`` if the winner ended without succeeding.
    """
    meta = _meta(task, winner)
    state = meta.get("status", states.PENDING)
    if state == states.SUCCESS:
        return True, meta.get("result")
    if state in states.READY_STATES:
        raise DuplicateTask(
            f"task {task.name!r}: singleton {names[0]!r} ran as task {winner}, "
            f"which ended in {state}",
            task_name=task.name,
            task_id=winner,
            key=names[0],
        )
    for name in names:
        entries = [entry for entry in redlock.inspect(name) if isinstance(entry, tuple)]
        if winner in {task_id_of(value) for value, _ in entries if value}:
            return False, max(ttl for _, ttl in entries)
    if finished(task, redlock, winner):
        return False, 0.2  # ended; its result is being stored
    return False, None


def _meta(task: Any, task_id: str) -> dict[str, Any]:
    try:
        meta = task.backend.get_task_meta(task_id)
    except Exception:  # no result backend, or it is down: the winner's end cannot be seen
        return {}
    return meta if isinstance(meta, dict) else {}
