"""Copies of a run: a message delivered again after its run ended, a duplicate in a canvas.

**Re-delivery.** A Redis or SQS broker delivers an unacknowledged message
again after its ``visibility_timeout`` (``acks_late``, or a message a worker
holds for its ``eta``), with the same task id. A copy delivered while its
twin runs is re-queued behind it (:mod:`..run`); a copy delivered after the
twin ended must not run at all, or it runs the body a second time and
overwrites the twin's result. So:

- a run whose message may come again (:func:`leaves_mark`: ``acks_late``,
  an ``eta``; or a re-delivered or re-queued copy) writes a
  *done mark* for its task id on the lock nodes when its body ends, before
  it releases its locks (if it holds any: a task with a global rate limit
  only writes one too), kept for :data:`DONE_TTL_FACTOR` times the lock's
  ttl;
- a run that may be such a copy (kombu marks it ``redelivered``, or it was
  re-queued behind its twin) checks, once it holds its locks, whether its
  task id has a done mark or a result in a ready state (``SUCCESS``,
  ``FAILURE``, ``REVOKED``) in the result backend (:func:`finished`), and
  ends as ignored if so, keeping the twin's result. A retry (``RETRY``) is
  no end: it runs;
- a run that may have been overtaken by its own copy (it has an ``eta``, or
  it is a singleton, whose worker may have held it while the broker
  delivered it again) looks for the done mark: the copy, if it ran, left
  one; with an ``eta``, also for a ready state in the result backend, since
  its copies (the broker's, and those a rate limit re-queues) may come after
  the mark expired;
- a run whose message may come again and that may wait (for its lock, with
  a ``lock_timeout``, or for a concurrency slot, which no copy can tell from
  another run's) first holds its task id's *delivery lock*
  (:func:`delivery_name`), renewed like its other locks, until its done mark
  is written. A copy delivered while it waits or runs finds that lock held by
  its own task id and is re-queued behind it, so the look for a done mark
  is never made by two copies at once, before or after a wait.

A run the worker ends itself (a hard time limit, ``revoke(terminate=True)``)
gets an *ended mark* (:func:`mark_ended`) written by the worker's main
process before it frees the run's locks by their owner: the killed run's
own release or renewal, which may still come, finds its locks gone by
design and tells no loss (:func:`ended_by_worker`).

Other runs neither write nor read anything more. Without a result backend
the mark alone tells: a copy arriving more than ``2 * lock_ttl`` after its
twin ended runs again (never beside it).

**Canvas.** A group or chord with two identical singleton signatures
freezes a task id for each; the second copy must end with a result or
``group.get()`` and the chord wait forever. So must a duplicate that is a
chain's step or carries ``link``/``link_error``, or the rest of the chain
never runs and ``chain(...).get()`` waits forever. Its publish is not suppressed
(:mod:`..publish`); in the worker the copy finds the singleton held by
the other id (in ``"queued"`` mode: the follow-up's key, by the copy that
waits as the follow-up), and is re-queued (:data:`WINNER_HEADER`) until that
run has ended: it then ends with the winner's return value, or fails with
:class:`~celery_redlock.errors.DuplicateTask` if the winner did not succeed
(:func:`winner_outcome`).
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
    """Whether a run's message may be delivered again once the run ended.

    ``acks_late`` keeps it unacknowledged while it runs; a message with an
    ``eta`` is held unacknowledged by the worker until then. (Copies are
    decided by the caller.)
    """
    return bool(getattr(task, "acks_late", False) or getattr(request, "eta", None))


def mark_done(redlock: Redlock, task_id: str, ttl: float) -> None:
    """Record on every lock node that a run of ``task_id`` ended; best effort."""
    try:
        _mark(redlock, done_key(redlock.key_prefix, task_id), ttl)
    except Exception as exc:  # the result backend still tells, where there is one
        logger.warning("task %s: done mark not written: %s", task_id, exc)


def mark_ended(redlock: Redlock, task_id: str, where: str, ttl: float) -> None:
    """Record on every lock node that the worker ended the run of ``task_id`` at ``where``.

    Best effort; written before the worker frees the run's locks, and kept
    for ``ttl``, the longest the run could still take its locks for held.
    """
    _mark(redlock, ended_key(redlock.key_prefix, task_id, where), ttl)


def ended_by_worker(redlock: Redlock, task_id: str, where: str) -> bool:
    """Whether the worker ended the run of ``task_id`` at ``where`` (:func:`mark_ended`).

    ``False`` when the nodes cannot tell: a loss is told rather than hidden.
    """
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

    ``redlock``: the lock nodes to look for a done mark on. ``backend``: ask
    the result backend too (a singleton that is no copy itself and has no
    ``eta`` only needs the mark: a copy that ran first left one).
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
    """End a copy as ignored if its task id already finished, keeping the result it left.

    ``backend``: ask the result backend too, not only the lock nodes.
    """
    why = finished(run.task, run.redlock, run.task_id, backend=backend)
    if why is not None:
        logger.info("task %s: already finished (%s); this copy is not run", run.task_id, why)
        raise Ignore()


# -- canvas copies ---------------------------------------------------------------------


def in_canvas(request: Any) -> bool:
    """Whether the run is part of a canvas: a group, a chord, a chain, or has callbacks.

    Someone waits for its result under its own task id, or something runs after it.
    """
    names = ("group", "chord", "chain", "callbacks", "errbacks")
    return any(getattr(request, name, None) for name in names)


def duplicate_found(run: RunContext, key: str, holder_id: str | None) -> NoReturn:
    """A singleton run found another copy queued or running: it is not run.

    A copy in a canvas waits for the holder's result and ends with it
    (:func:`stand_in`); any other ends as a duplicate (:func:`.run_endings.end_as_duplicate`).
    """
    if holder_id and in_canvas(run.request) and not run.request.called_directly:
        stand_in(run, key, holder_id)
    end_as_duplicate(run, key, holder_id)


def stand_in(run: RunContext, key: str, holder_id: str) -> NoReturn:
    """A duplicate singleton in a canvas: end with the result of ``holder_id``, later.

    Its task id was frozen by the canvas, which waits for a result under it.
    With ``on_duplicate="raise"`` it fails now with :class:`DuplicateTask`;
    otherwise it is re-queued until the holder has ended.
    """
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

    Returns ``(True, value)`` to end with the winner's value, ``(False,
    None)`` to run as a singleton of its own (the winner is gone).
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
    """Re-queue a canvas copy until ``holder_id``, which holds singleton ``key``, has ended.

    ``left`` is the holder's lock's time to live, in seconds. Told at INFO
    the first time, at DEBUG each time the copy looks again.
    """
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
    """What a canvas copy waiting for ``winner``, which held one of singleton ``names``, does now.

    Returns ``(True, value)`` when the winner succeeded: the copy ends with
    its value. Returns ``(False, seconds)`` while the winner still holds one
    of ``names`` (queued, waiting as the follow-up, or running), or its
    result is on its way: wait that long. Returns ``(False, None)`` when the
    winner is gone without a result: the copy runs as a singleton of its own.

    Raises:
        DuplicateTask: the winner ended without succeeding.
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
