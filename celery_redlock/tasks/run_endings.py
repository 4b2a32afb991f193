"""The ways a run ends without its body: busy, duplicate, twin running, Redis unavailable.

Each takes the run's :class:`~.run_context.RunContext` and ends the run by raising; re-queues
never spend ``max_retries``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, NoReturn

from celery import Task, states
from celery.exceptions import Ignore
from celery.utils.dispatch import Signal

from .. import signals
from ..errors import (
    DebounceUnavailable,
    DuplicateTask,
    LockNotAcquired,
    QuorumUnavailable,
    RateLimiterUnavailable,
)
from ..lock.redlock import Lock
from ..transport.failure_text import short_error
from .feature_policies import ConcurrencyPolicy, LockPolicy
from .run_context import RunContext

__all__ = [
    "BUSY_BACKOFF_MAX",
    "BUSY_HEADER",
    "TWIN_HEADER",
    "UNAVAILABLE_RETRY",
    "BusyPolicy",
    "Taken",
    "busy_countdown",
    "busy_requeues",
    "end_as_duplicate",
    "give_up_waiting",
    "held_at_most",
    "jittered",
    "lock_busy",
    "requeue_behind_twin",
    "requeue_unavailable",
    "requeue_uncounted",
    "resend_with",
]

logger = logging.getLogger("celery_redlock.task")

#: Seconds (times a jitter of 0.5-1.5) before a run that found a Redis unreachable
#: (lock nodes, rate limiter, debounce store) is tried again.
UNAVAILABLE_RETRY = 5.0
#: Message header: a copy re-queued because its twin (same task id) was running.
TWIN_HEADER = "redlock_twin"
#: Message header: busy re-queues so far (lock busy or limit full). Celery's ``retries``
#: is left alone, so the backoff and ``lock_busy_max_requeues`` count here.
BUSY_HEADER = "redlock_busy"
#: The longest countdown between two busy re-queues of a run, whatever the lock's ttl.
BUSY_BACKOFF_MAX = 30.0
#: kombu's ``visibility_timeout`` where it is not set, by broker URL scheme, when
#: shorter than a lock's ttl could be (Redis: 3600 s).
_DEFAULT_VISIBILITY = {"sqs": 30.0}
#: Busy-lock re-queues back off as ``2 ** requeues`` seconds, up to this power.
_MAX_BACKOFF_POWER = 10


def busy_countdown(requeues: int, ttl: float, jitter: float) -> float:
    """Seconds before a busy run tries again: ``2 ** requeues``, times ``jitter``.

    Capped at the lock's ttl (a dead holder's lock is gone by then) and :data:`BUSY_BACKOFF_MAX`.
    """
    power = min(max(requeues, 0), _MAX_BACKOFF_POWER)
    return min(float(2**power), ttl, BUSY_BACKOFF_MAX) * jitter


def jittered(seconds: float) -> float:
    """``seconds`` times a jitter drawn from 0.5-1.5, so that runs waiting alike spread out."""
    return seconds * random.uniform(0.5, 1.5)


def held_at_most(app: Any, countdown: float) -> float:
    """``countdown``, shortened to half the broker's ``visibility_timeout`` if that is less.

    A message held unacked past the visibility timeout is delivered again, copy after copy.
    """
    options = app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout")
    if timeout is None:
        scheme = str(app.conf.broker_url or "").partition("://")[0]
        timeout = _DEFAULT_VISIBILITY.get(scheme)
    if isinstance(timeout, int | float) and timeout > 0:
        return min(countdown, timeout / 2)
    return countdown


#: A policy that says how long to wait for what is taken, and what to do then.
BusyPolicy = LockPolicy | ConcurrencyPolicy


@dataclass(frozen=True)
class Taken:
    """What a run found taken when its wait ended: its lock, or every slot of its limit."""

    #: The lock or concurrency key.
    key: str
    #: What is taken, for logs: ``"lock 'k'"``.
    subject: str
    #: Its state, for logs: ``"busy"``, ``"full"``.
    state: str
    #: The finding, for errors: ``"lock 'k' is held by another run"``.
    found: str
    #: The signal telling it (sent with ``task_id``, ``key``, ``waited``, ``action``).
    signal: Signal
    #: More fields for the signal.
    details: dict[str, Any] = field(default_factory=dict)


def lock_busy(ctx: RunContext, policy: LockPolicy, key: str, waited: float) -> NoReturn:
    """Apply ``on_lock_busy`` for a lock another owner holds."""
    give_up_waiting(
        ctx,
        Taken(
            key=key,
            subject=f"lock {key!r}",
            state="busy",
            found=f"lock {key!r} is held by another run",
            signal=signals.lock_busy,
        ),
        policy,
        waited,
    )


def give_up_waiting(ctx: RunContext, taken: Taken, policy: BusyPolicy, waited: float) -> NoReturn:
    """The wait for a lock or a slot ended with it still taken: apply ``on_lock_busy``.

    ``"retry"`` fails once ``lock_busy_max_requeues`` is spent; a direct call always raises.
    """
    task, request = ctx.task, ctx.request
    action = policy.on_busy
    requeues = busy_requeues(request) if action == "retry" else 0
    budget = policy.max_requeues
    spent = action == "retry" and budget is not None and requeues >= budget
    taken.signal.send(
        sender=task,
        task_id=request.id,
        key=taken.key,
        waited=waited,
        action="raise" if spent else action,
        **taken.details,
    )
    error = LockNotAcquired(
        f"task {task.name!r} ({request.id}): {taken.found}; "
        "raise lock_timeout to wait longer, or choose on_lock_busy",
        key=taken.key,
        timeout=policy.timeout,
    )
    if action == "skip":
        logger.info("task %s: %s %s; skipped", request.id, taken.subject, taken.state)
        raise Ignore()
    if action == "raise" or request.called_directly:
        raise error
    if spent:
        logger.warning(
            "task %s: %s still %s after %d re-queues (lock_busy_max_requeues); failed",
            request.id,
            taken.subject,
            taken.state,
            requeues,
        )
        raise LockNotAcquired(
            f"task {task.name!r} ({request.id}): {taken.found}, still after {requeues} "
            f"busy re-queues (lock_busy_max_requeues={budget})",
            key=taken.key,
            timeout=policy.timeout,
        )
    logger.info(
        "task %s: %s %s; re-queued (busy re-queue %d)",
        request.id,
        taken.subject,
        taken.state,
        requeues + 1,
    )
    # Backing off; the new message counts one more busy re-queue, no max_retries spent.
    countdown = busy_countdown(requeues, ctx.ttl, jittered(1.0))
    requeue_uncounted(ctx, countdown, error, headers={BUSY_HEADER: requeues + 1})


def end_as_duplicate(ctx: RunContext, key: str, holder_id: str | None) -> NoReturn:
    """A singleton run found another copy queued or running: end as a duplicate.

    Its result becomes a ``DuplicateTask`` failure (``result.get()`` on a ``send_task`` copy
    raises, not waits forever), unless it may be the holder's twin, whose result must stay.
    """
    task, request = ctx.task, ctx.request
    signals.duplicate_suppressed.send(sender=task, task_id=holder_id, key=key, where="worker")
    logger.info("task %s: duplicate of singleton %s (%r); not run", request.id, holder_id, key)
    duplicate = DuplicateTask(
        f"task {task.name!r}: singleton {key!r} is queued or running as task {holder_id}",
        task_name=task.name,
        task_id=holder_id,
        key=key,
    )
    if request.called_directly:
        raise duplicate
    # No holder to name: this may be a copy of our own id, whose result must stay.
    if request.id and holder_id is not None and request.id != holder_id:
        _store_duplicate(ctx, duplicate)
    raise Ignore()


def requeue_behind_twin(ctx: RunContext, key: str, lock: Lock) -> NoReturn:
    """A copy with our task id holds the lock: come back when it must have ended."""
    task, request = ctx.task, ctx.request
    if request.called_directly:
        raise LockNotAcquired(
            f"task {task.name!r} ({request.id}): lock {key!r} is held by a run with the same id",
            key=key,
            timeout=0.0,
        )
    left = max(
        (entry[1] for entry in ctx.redlock.inspect(key) if isinstance(entry, tuple)),
        default=1.0,
    )
    countdown = held_at_most(task.app, left + jittered(1.0))
    logger.info(
        "task %s: a copy with the same id holds %r; re-queued to check again in %.1f s",
        request.id,
        key,
        countdown,
    )
    signals.lock_busy.send(sender=task, task_id=request.id, key=key, waited=0.0, action="twin")
    resend_with(ctx, TWIN_HEADER, True, countdown)


def resend_with(ctx: RunContext, header: str, value: Any, countdown: float) -> NoReturn:
    """Send this run again in ``countdown`` s with one more ``header``; end it as ignored."""
    request = ctx.request
    copy = ctx.task.signature_from_request(
        request, request.args, request.kwargs, countdown=countdown
    )
    copy.options["headers"] = {**(copy.options.get("headers") or {}), header: value}
    copy.apply_async()
    raise Ignore()


def requeue_unavailable(
    ctx: RunContext,
    what: str,
    error: QuorumUnavailable | RateLimiterUnavailable | DebounceUnavailable,
    *,
    quiet: bool = False,
) -> NoReturn:
    """A Redis the run needs did not answer: re-queue it in :data:`UNAVAILABLE_RETRY` s, jittered.

    ``quiet`` logs at DEBUG (the limiter tells its outage once). A direct call or an eager run,
    which nothing can re-queue, raises ``error``.
    """
    task, request = ctx.task, ctx.request
    if request.called_directly or request.is_eager:
        raise error
    countdown = jittered(UNAVAILABLE_RETRY)
    short: BaseException
    if isinstance(error, DebounceUnavailable):
        short = DebounceUnavailable(f"{what}, Redis unavailable: {error}", node=error.node)
        short.__cause__ = error
    else:
        short = short_error(error, what)
    logger.log(
        logging.DEBUG if quiet else logging.WARNING,
        "task %s (%s): %s; re-queued to run in %.1f s",
        task.name,
        request.id,
        short,
        countdown,
    )
    requeue_uncounted(ctx, countdown, short)


def requeue_uncounted(
    ctx: RunContext, countdown: float, exc: BaseException, *, headers: dict[str, Any] | None = None
) -> NoReturn:
    """Re-queue the current run without using up one of its ``max_retries``."""
    request = ctx.request
    request.retries = max(request.retries - 1, -1)
    options: dict[str, Any] = {}
    if headers:
        options["headers"] = {**(request.headers or {}), **headers}
    # Celery's own retry: the locks are released by run() as Retry passes.
    raise Task.retry(ctx.task, countdown=countdown, exc=exc, max_retries=None, **options)


def busy_requeues(request: Any) -> int:
    """Busy re-queues of this run so far: busy lock or full limit (:data:`BUSY_HEADER`)."""
    headers = request.headers or {}
    count = headers.get(BUSY_HEADER)
    if count is None:
        count = getattr(request, BUSY_HEADER, None)
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def _store_duplicate(ctx: RunContext, duplicate: DuplicateTask) -> None:
    task, request = ctx.task, ctx.request
    if task.ignore_result or getattr(request, "ignore_result", False):
        return
    try:
        task.backend.store_result(request.id, duplicate, states.FAILURE, request=request)
    except Exception as exc:  # no result backend, or it is down: the log line stays
        logger.debug("task %s: duplicate not recorded in the result backend: %s", request.id, exc)
