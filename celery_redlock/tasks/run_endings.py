"""What a run does when it does not run now: the ways a run ends without its body.

A run that finds its lock busy or its concurrency limit full is re-queued
with a growing backoff that never spends ``max_retries``, or skipped, or
fails, as ``on_lock_busy`` says; a duplicate singleton ends as a duplicate;
a copy whose twin (same task id) still runs is re-queued behind it; a copy
of a run that already ended is dropped; unreachable lock nodes re-queue the
run. :class:`RunSetbacks` holds these for :class:`~celery_redlock.tasks.run.TaskRun`,
which inherits them; each one either returns (nothing to do) or ends the run
by raising.
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
from ..errors import DuplicateTask, LockNotAcquired, QuorumUnavailable
from ..lock.redlock import Lock
from ..transport.failure_text import short_error
from .app_state import redlock_for
from .feature_policies import ConcurrencyPolicy, LockPolicy
from .features.redelivery import finished, held_at_most, in_canvas, stand_in
from .policies import TaskPolicy

__all__ = [
    "BUSY_BACKOFF_MAX",
    "BUSY_HEADER",
    "TWIN_HEADER",
    "UNAVAILABLE_RETRY",
    "BusyPolicy",
    "RunSetbacks",
    "Taken",
    "busy_countdown",
]

logger = logging.getLogger("celery_redlock.task")

#: Seconds before a task whose Redis nodes were unreachable is tried again.
UNAVAILABLE_RETRY = 5.0
#: Message header: a copy re-queued because its twin (same task id) was running.
TWIN_HEADER = "redlock_twin"
#: Message header: how many times this run was re-queued because its lock was busy
#: (or its concurrency limit full).
#: Celery's ``retries`` stays as it was (busy re-queues do not spend ``max_retries``),
#: so the backoff and ``lock_busy_max_requeues`` count here.
BUSY_HEADER = "redlock_busy"
#: The longest countdown between two busy re-queues of a run, whatever the lock's ttl.
BUSY_BACKOFF_MAX = 30.0
#: Busy-lock re-queues back off as ``2 ** requeues`` seconds, up to this power.
_MAX_BACKOFF_POWER = 10


def busy_countdown(requeues: int, ttl: float, jitter: float) -> float:
    """Seconds before a run that found its lock busy tries again.

    ``2 ** requeues`` (``requeues``: the run's busy re-queues so far), capped
    at the lock's ttl (a holder that dies frees the lock by then) and at
    :data:`BUSY_BACKOFF_MAX`, times ``jitter`` (drawn from 0.5-1.5) so
    waiting runs spread out. Runs waiting on one key come back ever more
    rarely: once capped, each at most once every 15-45 s, however long it waits.
    """
    power = min(max(requeues, 0), _MAX_BACKOFF_POWER)
    return min(float(2**power), ttl, BUSY_BACKOFF_MAX) * jitter


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


class RunSetbacks:
    """The ways a :class:`~celery_redlock.tasks.run.TaskRun` ends without running its body."""

    task: Any
    request: Any
    policy: TaskPolicy
    task_id: str

    @property
    def ttl(self) -> float:
        """The time to live of the locks held while running."""
        assert self.policy.ttl is not None, "policy not resolved"
        return self.policy.ttl

    def on_busy(self, policy: LockPolicy | None, key: str, waited: float) -> NoReturn:
        """Apply ``on_lock_busy`` for a lock another owner holds."""
        assert policy is not None
        self.give_up_waiting(
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

    def give_up_waiting(self, taken: Taken, policy: BusyPolicy, waited: float) -> NoReturn:
        """The wait for a lock or a slot ended with it still taken: apply ``on_lock_busy``.

        ``"retry"`` re-queues without spending ``max_retries``, counted in
        :data:`BUSY_HEADER`, backing off, and failing once the run has been
        re-queued ``lock_busy_max_requeues`` times; ``"skip"`` ends the run
        as ignored; ``"raise"`` (and any direct call) fails it.
        """
        task, request = self.task, self.request
        action = policy.on_busy
        requeues = self.busy_requeues() if action == "retry" else 0
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
        self.requeue_busy(requeues, error)

    def requeue_busy(self, requeues: int, error: LockNotAcquired) -> NoReturn:
        """Re-queue a run that found its lock busy or its concurrency limit full, backing off.

        ``requeues`` is :meth:`busy_requeues`; the new message counts one more
        in :data:`BUSY_HEADER`, and no ``max_retries`` is spent.
        """
        countdown = busy_countdown(requeues, self.ttl, random.uniform(0.5, 1.5))
        self.requeue_uncounted(countdown, error, headers={BUSY_HEADER: requeues + 1})

    def end_as_duplicate(self, key: str, holder_id: str | None) -> NoReturn:
        """A singleton run found another copy queued or running: end as a duplicate.

        The copy is not run. A copy in a canvas waits for the holder's result
        and ends with it (:func:`~.copies.stand_in`). Otherwise, unless it is
        the holder's own twin (same task id, whose result must stay the
        holder's) or the holder cannot be told (``holder_id`` ``None``:
        perhaps that twin), its result becomes a failure with
        :class:`DuplicateTask` naming the holder, so that ``result.get()`` on
        a copy sent with ``send_task`` raises instead of waiting forever.
        """
        task, request = self.task, self.request
        if holder_id and in_canvas(request) and not request.called_directly:
            stand_in(task, request, self.policy, key, holder_id)
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
        # No holder to name (it ended between the failed take and the look at
        # the key, or the nodes did not say): this may be a copy of the run's
        # own id, whose result a duplicate's failure must never overwrite.
        if request.id and holder_id is not None and request.id != holder_id:
            self._store_duplicate(duplicate)
        raise Ignore()

    def drop_if_finished(self, *, backend: bool) -> None:
        """End a copy as ignored if its task id already finished, keeping the result it left.

        ``backend``: ask the result backend too, not only the lock nodes.
        """
        # A task without locks or a slot (a global rate limit only) leaves no
        # mark on lock nodes.
        policy = self.policy
        holds = (policy.lock, policy.singleton, policy.concurrency)
        locked = any(part is not None for part in holds)
        redlock = redlock_for(self.task.app) if locked else None
        why = finished(self.task, redlock, self.task_id, backend=backend)
        if why is not None:
            logger.info("task %s: already finished (%s); this copy is not run", self.task_id, why)
            raise Ignore()

    def requeue_behind_twin(self, key: str, lock: Lock) -> NoReturn:
        """A copy with our task id holds the lock: come back when it must have ended."""
        task, request = self.task, self.request
        if request.called_directly:
            raise LockNotAcquired(
                f"task {task.name!r} ({request.id}): lock {key!r} is held by a run with the "
                "same id",
                key=key,
                timeout=0.0,
            )
        left = max(
            (entry[1] for entry in lock.redlock.inspect(key) if isinstance(entry, tuple)),
            default=1.0,
        )
        countdown = held_at_most(task.app, left + random.uniform(0.5, 1.5))
        logger.info(
            "task %s: a copy with the same id holds %r; re-queued to check again in %.1f s",
            request.id,
            key,
            countdown,
        )
        signals.lock_busy.send(sender=task, task_id=request.id, key=key, waited=0.0, action="twin")
        copy = task.signature_from_request(
            request, request.args, request.kwargs, countdown=countdown
        )
        copy.options["headers"] = {**(copy.options.get("headers") or {}), TWIN_HEADER: True}
        copy.apply_async()
        raise Ignore()

    def requeue_unavailable(self, what: str, exc: QuorumUnavailable) -> NoReturn:
        """Lock nodes unreachable at task start: re-queue (not counted as a retry).

        Logged, and handed to Celery's retry, as one line with a node summary.
        A direct call or an eager run, which nothing can re-queue, raises ``exc``.
        """
        task, request = self.task, self.request
        if request.called_directly or request.is_eager:
            raise exc
        countdown = UNAVAILABLE_RETRY * random.uniform(0.5, 1.5)
        short = short_error(exc, what)
        logger.warning(
            "task %s (%s): %s; re-queued to run in %.1f s", task.name, request.id, short, countdown
        )
        self.requeue_uncounted(countdown, short)

    def requeue_uncounted(
        self, countdown: float, exc: BaseException, *, headers: dict[str, Any] | None = None
    ) -> NoReturn:
        """Re-queue the current run without using up one of its ``max_retries``.

        ``headers`` are set on the new message, beside those of the current one.
        """
        request = self.request
        request.retries = max(request.retries - 1, -1)
        options: dict[str, Any] = {}
        if headers:
            options["headers"] = {**(request.headers or {}), **headers}
        # Celery's own retry: the locks are released by run() as Retry passes.
        raise Task.retry(self.task, countdown=countdown, exc=exc, max_retries=None, **options)

    def busy_requeues(self) -> int:
        """Busy re-queues of this run so far: busy lock or full limit (:data:`BUSY_HEADER`)."""
        headers = self.request.headers or {}
        count = headers.get(BUSY_HEADER)
        if count is None:
            count = getattr(self.request, BUSY_HEADER, None)
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def _store_duplicate(self, duplicate: DuplicateTask) -> None:
        task, request = self.task, self.request
        if task.ignore_result or getattr(request, "ignore_result", False):
            return
        try:
            task.backend.store_result(request.id, duplicate, states.FAILURE, request=request)
        except Exception as exc:  # no result backend, or it is down: the log line stays
            logger.debug(
                "task %s: duplicate not recorded in the result backend: %s", request.id, exc
            )
