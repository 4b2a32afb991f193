"""One run of a LockedTask in the process that executes it.

A :class:`TaskRun` carries the task, request, policy, arguments and held locks, as Celery's
``Request`` carries a delivery. Order: twin check, debounce, a look at the rate limit (a limited
run is re-queued before it touches a lock), delivery lock, singleton, run lock, concurrency
slot, and last the rate limit's count (only a run that starts spends a unit); then the body;
then release on every way out (``self.retry()``: before the retry is published). Ways a run
ends without its body: :mod:`.run_endings`.

One task instance serves every pool thread, so a run lives in its own object, found through a
per-thread stack (:meth:`TaskRun.current`), never on the task.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from functools import cached_property, partial
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from .. import _clock, signals
from .._layout import QUEUED, LockValue
from ..errors import QuorumUnavailable
from ..lock.held_lease import HeldLock
from ..lock.lock import Lock
from ..lock.redlock import Redlock
from ..lock.renewal import heartbeat
from ..lock.semaphore import Semaphore
from ..ratelimit import RateLimiter
from .app_state import limiter_for, redlock_for
from .feature_policies import LockPolicy
from .features import debounce, redelivery
from .features import queued_singleton as followup
from .features.concurrency_limit import SlotGate
from .features.rate_limit import RateGate
from .features.redelivery import (
    DONE_TTL_FACTOR,
    WINNER_HEADER,
    delivery_name,
    ended_by_worker,
    leaves_mark,
    look_at_winner,
    mark_done,
    redelivered,
)
from .features.singleton import KEY_HEADER, queued_marker, task_id_of
from .policies import TaskPolicy
from .run_endings import TWIN_HEADER, lock_busy, requeue_behind_twin, requeue_unavailable

__all__ = ["TaskRun"]

logger = logging.getLogger("celery_redlock.task")


class _Runs(threading.local):
    """The runs in progress on this thread (or greenlet), innermost last.

    Not on the request: Celery copies unknown request attributes into a retry's headers.
    """

    def __init__(self) -> None:
        self.stack: list[TaskRun] = []


_runs = _Runs()


class TaskRun:
    """One run of a task under its policy (a ``RunContext``): ``TaskRun(...).run(call)``."""

    def __init__(self, task: Any, policy: TaskPolicy, args: Any, kwargs: Any) -> None:
        self.task = task
        self.request = task.request
        self.policy = policy
        self.args = args
        self.kwargs = kwargs
        #: The locks held, in the order taken: singleton, run lock, concurrency slot.
        self.held: list[HeldLock] = []
        #: The task id's delivery lock (:mod:`.features.redelivery`); released after the others.
        self.delivery: HeldLock | None = None
        #: The run lock a caller on this thread holds (re-entrant eager run); never released.
        self.borrowed: HeldLock | None = None
        self.task_id: str = self.request.id or f"direct-{os.urandom(8).hex()}"
        #: Singleton keys handed back to "queued" for the run's next copy.
        self.handed_back: list[str] = []

    @cached_property
    def redlock(self) -> Redlock:
        """The app's Redlock, looked up once for the run."""
        return redlock_for(self.task.app)

    @cached_property
    def limiter(self) -> RateLimiter:
        """The app's rate limiter, looked up once for the run."""
        return limiter_for(self.task.app)

    @property
    def ttl(self) -> float:
        """The time to live of the locks held while running."""
        assert self.policy.ttl is not None, "policy not resolved"
        return self.policy.ttl

    @classmethod
    def current(cls, task: Any) -> TaskRun | None:
        """The innermost run of ``task`` in progress on this thread, if any."""
        for run in reversed(_runs.stack):
            if run.task.name == task.name:
                return run
        return None

    @property
    def exposed(self) -> HeldLock | None:
        """The lock the task exposes as ``self.lock``: the run lock, else the singleton."""
        held = next((held for held in reversed(self.held) if not _is_slot(held)), None)
        return held or self.borrowed

    @property
    def slot(self) -> HeldLock | None:
        """The concurrency slot the run holds, if any."""
        return next((held for held in self.held if _is_slot(held)), None)

    def run(self, call: Callable[..., Any]) -> Any:
        """Call ``call(*args, **kwargs)`` inside the rate limit and the locks."""
        policy = self.policy
        request = self.request
        winner = self._header(WINNER_HEADER) if policy.singleton is not None else None
        if isinstance(winner, str) and winner and not request.called_directly:
            ended, value = look_at_winner(self, winner)
            if ended:
                return value
        # Maybe a copy of a run that already ended (and left a mark): re-delivered, re-queued
        # behind its twin, held for an eta, or a singleton. Eager runs have no copies.
        delivered = not (request.is_eager or request.called_directly)
        copy = delivered and bool(redelivered(request) or self._header(TWIN_HEADER))
        check = copy or (delivered and (policy.singleton is not None or bool(request.eta)))
        if policy.debounce is not None:
            debounce.admit(self)  # a superseded copy ends here, an early one is re-queued
        gate = None
        if policy.rate is not None:
            gate = RateGate(self.task, policy.rate, self.args, self.kwargs)
            holds = (policy.singleton, policy.lock, policy.concurrency)
            if any(part is not None for part in holds):
                gate.screen(self)
        _runs.stack.append(self)
        requeued = started = False
        try:
            if delivered and (copy or leaves_mark(self.task, request)) and _may_wait(policy):
                self.delivery = self.own_delivery()
            if policy.singleton is not None:
                handed = self._header(KEY_HEADER)  # a retry's: the key its run handed back
                name = handed if isinstance(handed, str) and handed else None
                name = name or policy.singleton.name(self.task.name, self.args, self.kwargs)
                queued = policy.singleton.mode == "queued"
                busy = partial(followup.wait_or_end, self) if queued else None
                self.held.append(self.take(name, replaces=queued_marker(self.task_id), busy=busy))
                if queued:
                    followup.running(self, name)
            if policy.lock is not None:
                name = policy.lock.key.render(self.args, self.kwargs)
                self.borrowed = _held_on_this_thread(name) if request.is_eager else None
                if self.borrowed is None:
                    self.held.append(self.take(name, lock_policy=policy.lock))
            if check:
                redelivery.drop_if_finished(self, backend=copy or bool(request.eta))
            if policy.concurrency is not None:
                # After the locks: a run waiting for a lock holds no slot others could use.
                self.held.append(SlotGate(self, policy.concurrency).take())
            if gate is not None:
                # Last, so that a run re-queued for a busy lock spends no unit.
                gate.admit(self)
            started = True
            return call(*self.args, **self.kwargs)
        except (Retry, Ignore, Reject) as exc:
            # Not an end of the task a later copy must respect.
            started = False
            requeued = isinstance(exc, Retry)
            raise
        finally:
            _runs.stack.remove(self)
            if started and delivered and (copy or leaves_mark(self.task, request)):
                # Before the locks go: a copy that takes them next sees it.
                mark_done(self.redlock, self.task_id, self.ttl * DONE_TTL_FACTOR)
            self.release_all(requeued=requeued)

    def take(
        self,
        key: str,
        *,
        lock_policy: LockPolicy | None = None,
        replaces: str | None = None,
        busy: Callable[[str, str | None], NoReturn] | None = None,
    ) -> HeldLock:
        """Acquire and hold one lock: the run lock with ``lock_policy``, else the singleton.

        A busy singleton is never waited for: a duplicate, or ``busy(key, holder_id)`` decides.
        """
        owner = LockValue.owner_text(self.task_id, self.worker())
        lock = self.redlock.lock(key, ttl=self.ttl, owner=owner, replaces=replaces)

        def taken(waited: float) -> NoReturn:
            holder_id = task_id_of(self.redlock.holder(key))
            if holder_id == self.request.id and self.request.id:
                requeue_behind_twin(self, key, lock)
            if lock_policy is None:
                (busy or partial(redelivery.duplicate_found, self))(key, holder_id)
            lock_busy(self, lock_policy, key, waited)

        timeout = lock_policy.timeout if lock_policy is not None else 0.0
        held = self.hold(lock, taken, timeout=timeout)
        singleton = self.policy.singleton
        held.singleton_ttl = singleton.ttl if replaces and singleton is not None else None
        return held

    def hold(
        self, lease: Lock | Semaphore, busy: Callable[[float], NoReturn], *, timeout: float = 0.0
    ) -> HeldLock:
        """Acquire ``lease`` (waiting up to ``timeout``) and keep it renewed with the run's others.

        Unreachable nodes re-queue the run; a lease still busy calls ``busy(waited)``.
        """
        task, task_id = self.task, self.task_id
        started = _clock.monotonic()
        try:
            acquired = lease.acquire(blocking=timeout > 0, timeout=timeout)
        except QuorumUnavailable as exc:
            what = "concurrency slot" if isinstance(lease, Semaphore) else "lock"
            requeue_unavailable(self, f"{what} {lease.name!r} not taken", exc)
        waited = _clock.monotonic() - started
        if not acquired:
            busy(waited)
        held = heartbeat().hold(
            lease,
            task_id=task_id,
            progress_timeout=self.policy.progress_timeout,
            on_lost=self._send_lost,
        )
        if isinstance(lease, Semaphore):
            signal, details = signals.slot_acquired, {"limit": lease.limit, "slot": lease.slot}
        else:
            signal, details = signals.lock_acquired, {"fencing_token": lease.fencing_token}
        signal.send(sender=task, task_id=task_id, key=lease.name, waited=waited, **details)
        return held

    def send_again(self, send: Callable[[], Any], options: dict[str, Any]) -> Any:
        """Send the run's own next copy (a retry, a re-queue) with ``send``, handing it the locks.

        Released just before the send, so the copy finds them free however soon it runs; a
        singleton's key goes back to "queued" (no duplicate can slip in) and is named in the
        copy's ``KEY_HEADER``. If the send fails, the key is freed.
        """
        self.release_all(requeued=True)
        for name in self.handed_back:
            options["headers"] = {**(options.get("headers") or {}), KEY_HEADER: name}
        try:
            return send()
        except BaseException:
            for name in self.handed_back:
                self.redlock.release_owner(name, self.task_id, QUEUED)
            raise

    def release_all(self, *, requeued: bool = False) -> None:
        """Release every lock of the run, last taken first; safe to call twice."""
        for held in reversed(self.held):
            self.release(held, requeued=requeued)
        delivery, self.delivery = self.delivery, None
        if delivery is not None:  # no lock of the task: no signal, no loss to tell
            heartbeat().drop(delivery)
            delivery.lock.release()

    def own_delivery(self) -> HeldLock:
        """Hold this task id's delivery lock: a copy delivered meanwhile is re-queued behind us."""
        name = delivery_name(self.task_id)
        owner = LockValue.owner_text(self.task_id, self.worker())
        lock = self.redlock.lock(name, ttl=self.ttl, owner=owner)
        try:
            acquired = lock.acquire(blocking=False)
        except QuorumUnavailable as exc:
            requeue_unavailable(self, f"lock {name!r} not taken", exc)
        if not acquired:
            requeue_behind_twin(self, name, lock)
        return heartbeat().hold(
            lock,
            task_id=self.task_id,
            progress_timeout=self.policy.progress_timeout,
        )

    def release(self, held: HeldLock, *, requeued: bool = False) -> None:
        """Stop renewing and release one lock; safe to call twice.

        With ``requeued``, a singleton goes back to "queued" for the re-queued copy instead.
        """
        if held.released:
            return
        held.released = True
        heartbeat().drop(held)
        lock = held.lock
        ttl = held.singleton_ttl
        if requeued and ttl and held.task_id and isinstance(lock, Lock) and lock.locked():
            try:
                if lock.hand_over(LockValue.owner_text(held.task_id, QUEUED), ttl):
                    self.handed_back.append(lock.name)
                    return
            except QuorumUnavailable:
                logger.warning("singleton %r could not be handed back to its retry", lock.name)
        if not lock.release() and not held.lost:
            # Gone before its release: the run's work may have overlapped another holder's.
            held.lost, held.lost_code = True, "lost_at_release"
            held.lost_reason = f"found gone at release: {lock.lost_reason or 'expired'}"
            self._send_lost(held, held.lost_reason)
        released = signals.slot_released if isinstance(lock, Semaphore) else signals.lock_released
        released.send(sender=self.task, task_id=held.task_id, key=lock.name, held=held.held_for)

    def worker(self) -> str:
        """``hostname:pid`` of the process running the task."""
        hostname = getattr(self.request, "hostname", None) or socket.gethostname()
        return f"{hostname}:{os.getpid()}"

    def _header(self, name: str) -> Any:
        return (self.request.headers or {}).get(name) or getattr(self.request, name, None)

    def _send_lost(self, held: HeldLock, reason: str) -> None:
        if ended_by_worker(self.redlock, self.task_id, self.worker()):
            # A hard time limit or a terminate: the worker freed it, no loss.
            logger.info(
                "%r of task %s freed by the worker, which ended the run", held.name, self.task_id
            )
            return
        signals.lock_lost.send(
            sender=self.task,
            task_id=held.task_id,
            key=held.lock.name,
            held=held.held_for,
            reason=reason,
            code=held.lost_code,
        )


def _held_on_this_thread(name: str) -> HeldLock | None:
    """The lock ``name`` if a run in progress on this thread holds it (re-entrant eager runs)."""
    for run in reversed(_runs.stack):
        for held in run.held:
            if held.lock.name == name and not held.released and not _is_slot(held):
                return held
    return None


def _may_wait(policy: TaskPolicy) -> bool:
    """Whether a run may wait, or run beside a copy of itself (in a slot; a bare rate limit)."""
    lock, bare = policy.lock, policy.singleton is None and policy.lock is None
    waits = lock is not None and lock.timeout > 0
    return waits or policy.concurrency is not None or (bare and policy.rate is not None)


def _is_slot(held: HeldLock) -> bool:
    return isinstance(held.target(), Semaphore)
