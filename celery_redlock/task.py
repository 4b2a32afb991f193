"""LockedTask: locks, singletons and global rate limits around a Celery task.

::

    @app.task(base=LockedTask, bind=True, lock_key="sync-user:{user_id}", lock_ttl=60)
    def sync_user(self, user_id):
        for page in pages(user_id):
            self.heartbeat()          # progress: keeps the lock; LockLost if it is gone
            store(page, fencing_token=self.lock.fencing_token)

In the worker, a run goes through, in order: the global rate limit (so a
limited task never holds a lock), the singleton lock (taken over from the
publisher), and the run lock. Locks are taken in the task's call path (not
in a signal handler, whose exceptions Celery swallows), kept alive by the
process's heartbeat thread while the task makes progress, and released on
every way out: return, exception, ``self.retry()`` (before the retry is
published), ``Ignore``, ``Reject``, soft time limit. When the task's process
dies (hard time limit, revoke with terminate, a crashed pool process) the
worker's main process frees them by the owner's task id; if the whole
worker dies, they expire within their ttl.

A message delivered again while a copy with the same task id still runs (a
Redis broker's ``visibility_timeout``, ``acks_late`` after a lost worker) is
never run beside it and never overwrites its result: it is put back on the
queue for when the lock's ttl has run out, and dropped then only if the
result backend shows the task finished.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from typing import Any

from celery import Task, states
from celery.exceptions import Ignore, Retry
from celery.result import EagerResult
from celery.utils import uuid

from . import _clock, signals
from ._keys import KeySource, task_signature
from .config import limiter_for, redlock_for, settings_for
from .errors import (
    DuplicateTask,
    LockNotAcquired,
    QuorumUnavailable,
    RateLimited,
    RateLimiterUnavailable,
)
from .heartbeat import HeldLock, heartbeat
from .policies import OPTION_NAMES, LockPolicy, TaskPolicy
from .redlock import Lock
from .singleton import queued_marker, singleton_key, task_id_of

__all__ = ["LockedTask"]

logger = logging.getLogger("celery_redlock.task")

#: Seconds before a task whose Redis nodes were unreachable is tried again.
UNAVAILABLE_RETRY = 5.0
#: Message header: a copy re-queued because its twin (same task id) was running.
TWIN_HEADER = "redlock_twin"
#: Message header: the rate limit was already counted when beat published it.
RATE_CHECKED_HEADER = "redlock_rate_checked"


class LockedTask(Task):  # type: ignore[misc]
    """A Celery task base class with locks, singletons and global rate limits.

    Options are task attributes (``@app.task(base=LockedTask, lock_ttl=30)``);
    those left at ``None`` take their defaults from ``app.conf``. Bad values
    raise :class:`~celery_redlock.errors.ConfigurationError` when the task
    is defined.
    """

    #: ``str.format`` template over the task's arguments (``"sync:{user_id}"``),
    #: or a callable ``(args, kwargs) -> str``; ``None``: one run at a time per task.
    lock_key: KeySource = None
    #: Lock time to live in seconds, renewed by the heartbeat
    #: (default ``app.conf.redlock_default_ttl``, 60).
    lock_ttl: float | None = None
    #: Seconds to wait for a busy lock before ``on_lock_busy`` applies (default 0).
    lock_timeout: float | None = None
    #: What to do when the lock is busy: ``"retry"`` (re-queue with a jittered
    #: backoff, honouring ``max_retries``), ``"skip"`` (end as ignored) or ``"raise"``.
    on_lock_busy: str | None = None
    #: Stop renewing when the task reported no progress for this many seconds,
    #: so a hung task loses its lock; ``None``: renew while the task runs.
    lock_progress_timeout: float | None = None
    #: Take a run lock at all (default: yes, unless the task only asks for a
    #: singleton or a rate limit and names no ``lock_key``).
    lock_enabled: bool | None = None
    #: One queued-or-running copy per task and arguments (see :mod:`.singleton`).
    singleton: bool | None = None
    #: Template or callable naming the singleton instead of the argument hash.
    singleton_key: KeySource = None
    #: Seconds a published singleton holds its key while queued (default 3600).
    singleton_ttl: float | None = None
    #: A duplicate publish: ``"return"`` the queued task's result (default) or ``"raise"``.
    on_duplicate: str | None = None
    #: Beat publishes this close together (seconds) are one tick (default 0.5):
    #: two beat processes on one schedule publish once.
    singleton_beat_window: float | None = None
    #: Global rate in Celery's syntax (``"10/s"``, ``"100/m"``, ``"1000/h"``).
    global_rate_limit: str | None = None
    #: Template or callable naming the limit (default: the task name).
    rate_limit_key: KeySource = None
    #: A limited run: ``"retry"`` when the window allows (default; not counted
    #: against ``max_retries``), ``"skip"`` or ``"raise"``.
    on_rate_limited: str | None = None
    #: ``"fixed"`` window (default) or ``"sliding"`` (see :mod:`.ratelimit`).
    rate_limit_algorithm: str | None = None

    _redlock_policy: TaskPolicy | None = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Check the options as soon as the task is bound to its app."""
        super().on_bound(app)
        if cls.__dict__.get("name") is None and cls.run is Task.run:
            return  # an abstract base, not a task
        options = {name: getattr(cls, name, None) for name in OPTION_NAMES}
        cls._redlock_policy = TaskPolicy.from_options(cls.name, task_signature(cls), options)
        connect_cleanup(app)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task body inside its limits and locks (worker, eager or direct call)."""
        policy = self._redlock_policy
        if policy is None or not policy.active:
            return super().__call__(*args, **kwargs)
        return run_guarded(self, policy, args, kwargs, super().__call__)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        """Publish, taking the singleton lock first and applying beat rate limits.

        Returns the queued task's ``AsyncResult`` for a duplicate singleton
        (``on_duplicate="return"``) instead of queueing another copy.

        Raises:
            DuplicateTask: a duplicate singleton with ``on_duplicate="raise"``.
        """
        policy = self._redlock_policy
        if policy is None or not (policy.singleton or policy.rate):
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        return publish_guarded(self, policy, args, kwargs, task_id, options)

    # -- inside the task ---------------------------------------------------------

    @property
    def lock(self) -> Lock | None:
        """The lock held by the current run (``validity``, ``fencing_token``), if any."""
        held = current_held(self)
        return held.lock if held is not None else None

    @property
    def lock_lost(self) -> bool:
        """True once the current run's lock expired or failed to renew."""
        held = current_held(self)
        return held is not None and (held.lost or not held.lock.locked())

    def heartbeat(self) -> None:
        """Report progress and renew the run's locks now if they are due.

        Raises:
            LockLost: a lock is gone; work done from here on is unprotected.
        """
        for held in current_run(self):
            heartbeat().progress(held, renew_now=True)

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        """Store task state (Celery's ``update_state``); counts as progress."""
        super().update_state(*args, **kwargs)
        now = _clock.monotonic()
        for held in current_run(self):
            held.last_progress = now

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``retry``, after giving up the run's locks so the retried copy can take them.

        A singleton's key goes back to "queued" for the retried copy, so no
        duplicate can be published in between.
        """
        for held in reversed(current_run(self)):
            release_held(self, held, requeued=True)
        return super().retry(*args, **kwargs)


# -- the locks of the runs in progress ---------------------------------------------


class _Runs(threading.local):
    """Locks held by the runs in progress on this thread (or greenlet), innermost last.

    Not on the request: Celery copies unknown request attributes into the
    message headers of a retry, and a lock is no message header.
    """

    def __init__(self) -> None:
        self.stack: list[tuple[str, list[HeldLock]]] = []


_runs = _Runs()


def current_run(task: Any) -> list[HeldLock]:
    """The locks held by the task's current run (singleton first, then run lock)."""
    for name, held in reversed(_runs.stack):
        if name == task.name:
            return held
    return []


def current_held(task: Any) -> HeldLock | None:
    """The lock the task's current run exposes as ``self.lock``: its run lock if any."""
    held = current_run(task)
    return held[-1] if held else None


def worker_identity(task: Any) -> str:
    """``hostname:pid`` of the process running the task."""
    hostname = getattr(task.request, "hostname", None) or socket.gethostname()
    return f"{hostname}:{os.getpid()}"


# -- the worker side ---------------------------------------------------------------


def run_guarded(task: Any, policy: TaskPolicy, args: Any, kwargs: Any, call: Any) -> Any:
    """Run ``call(*args, **kwargs)`` inside the task's rate limit and locks."""
    request = task.request
    task_id = request.id or f"direct-{os.urandom(8).hex()}"
    headers = request.headers or {}
    if (headers.get(TWIN_HEADER) or getattr(request, TWIN_HEADER, None)) and _finished(
        task, task_id
    ):
        logger.info("task %s: already finished by its twin; dropping this copy", task_id)
        raise Ignore()
    if policy.rate is not None and not (
        headers.get(RATE_CHECKED_HEADER) or getattr(request, RATE_CHECKED_HEADER, None)
    ):
        check_rate(task, policy, args, kwargs)

    held: list[HeldLock] = []
    _runs.stack.append((task.name, held))
    requeued = False
    try:
        ttl = policy.ttl or settings_for(task.app).default_ttl
        if policy.singleton is not None:
            key = singleton_key(policy.singleton, task.name, args, kwargs)
            held.append(take(task, policy, key, ttl, task_id, replaces=queued_marker(task_id)))
        if policy.lock is not None:
            key = policy.lock.key.render(args, kwargs)
            held.append(take(task, policy, key, ttl, task_id, lock_policy=policy.lock))
        return call(*args, **kwargs)
    except Retry:
        requeued = True
        raise
    finally:
        _runs.stack.remove((task.name, held))
        for entry in reversed(held):
            release_held(task, entry, requeued=requeued)


def take(
    task: Any,
    policy: TaskPolicy,
    key: str,
    ttl: float,
    task_id: str,
    *,
    lock_policy: LockPolicy | None = None,
    replaces: str | None = None,
) -> HeldLock:
    """Acquire one lock of the run and register it with the heartbeat.

    ``lock_policy`` is given for the run lock (its timeout and busy action);
    without it, this is the singleton lock: never waited for, and a busy one
    means a duplicate.
    """
    redlock = redlock_for(task.app)
    lock = redlock.lock(key, ttl=ttl, owner=f"{task_id}|{worker_identity(task)}", replaces=replaces)
    timeout = lock_policy.timeout if lock_policy is not None else 0.0
    started = _clock.monotonic()
    try:
        acquired = lock.acquire(blocking=timeout > 0, timeout=timeout)
    except QuorumUnavailable as exc:
        on_unavailable(task, f"lock {key!r} not taken", exc)
    waited = _clock.monotonic() - started
    if not acquired:
        holder = redlock.holder(key)
        if task_id_of(holder) == task.request.id and task.request.id:
            requeue_behind_twin(task, key, lock)
        if lock_policy is None:
            on_duplicate_run(task, key, task_id_of(holder))
        on_busy(task, lock_policy, key, waited)
    held = heartbeat().hold(
        lock,
        task_id=task_id,
        progress_timeout=policy.progress_timeout,
        on_lost=lambda held, reason: _send_lost(task, held, reason),
    )
    held.singleton_ttl = policy.singleton.ttl if replaces and policy.singleton else None
    signals.lock_acquired.send(
        sender=task, task_id=task_id, key=key, waited=waited, fencing_token=lock.fencing_token
    )
    return held


def release_held(task: Any, held: HeldLock, *, requeued: bool = False) -> None:
    """Stop renewing and release; safe to call twice.

    With ``requeued``, a singleton lock goes back to the "queued" state for
    the copy just re-queued (same task id) instead of being freed.
    """
    if held.released:
        return
    held.released = True
    heartbeat().drop(held)
    lock = held.lock
    if requeued and held.singleton_ttl and held.task_id and lock.locked():
        handback = lock.redlock.lock(
            lock.name,
            ttl=held.singleton_ttl,
            owner=f"{held.task_id}|queued",
            replaces=f"|{lock.owner}",
        )
        try:
            if handback.acquire(blocking=False):
                lock._forget()
                return
        except QuorumUnavailable:
            logger.warning("singleton %r could not be handed back to its retry", lock.name)
    lock.release()
    signals.lock_released.send(sender=task, task_id=held.task_id, key=lock.name, held=held.held_for)


def _finished(task: Any, task_id: str) -> bool:
    try:
        return task.AsyncResult(task_id).state in states.READY_STATES
    except Exception:  # no result backend, or it is down: cannot tell
        return False


def requeue_behind_twin(task: Any, key: str, lock: Lock) -> None:
    """A copy with our task id holds the lock: come back when it must have ended."""
    request = task.request
    if request.called_directly:
        raise LockNotAcquired(
            f"task {task.name!r} ({request.id}): lock {key!r} is held by a run with the same id",
            key=key,
            timeout=0.0,
        )
    left = max(
        (entry[1] for entry in lock.redlock.inspect(key) if isinstance(entry, tuple)),
        default=1.0,
    )
    countdown = left + random.uniform(0.5, 1.5)
    logger.info(
        "task %s: a copy with the same id holds %r; re-queued to check again in %.1f s",
        request.id,
        key,
        countdown,
    )
    signals.lock_busy.send(sender=task, task_id=request.id, key=key, waited=0.0, action="twin")
    copy = task.signature_from_request(request, request.args, request.kwargs, countdown=countdown)
    copy.options["headers"] = {**(copy.options.get("headers") or {}), TWIN_HEADER: True}
    copy.apply_async()
    raise Ignore()


def on_duplicate_run(task: Any, key: str, holder_id: str | None) -> None:
    """A singleton run found another copy queued or running: end as a duplicate.

    The copy is not run. Unless it is the holder's own twin (same task id,
    whose result must stay the holder's), its result becomes a failure with
    :class:`DuplicateTask` naming the holder, so that ``result.get()`` on a
    copy sent with ``send_task`` raises instead of waiting forever.
    """
    request = task.request
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
    if request.id and request.id != holder_id:
        _store_duplicate(task, duplicate)
    raise Ignore()


def _store_duplicate(task: Any, duplicate: DuplicateTask) -> None:
    request = task.request
    if task.ignore_result or getattr(request, "ignore_result", False):
        return
    try:
        task.backend.store_result(request.id, duplicate, states.FAILURE, request=request)
    except Exception as exc:  # no result backend, or it is down: the log line stays
        logger.debug("task %s: duplicate not recorded in the result backend: %s", request.id, exc)


def on_busy(task: Any, policy: LockPolicy | None, key: str, waited: float) -> None:
    """Apply ``on_lock_busy`` for a lock another owner holds."""
    assert policy is not None
    request = task.request
    action = policy.on_busy
    signals.lock_busy.send(sender=task, task_id=request.id, key=key, waited=waited, action=action)
    error = LockNotAcquired(
        f"task {task.name!r} ({request.id}): lock {key!r} is held by another run; "
        "raise lock_timeout to wait for it, or choose on_lock_busy",
        key=key,
        timeout=policy.timeout,
    )
    if action == "skip":
        logger.info("task %s: lock %r busy; skipped", request.id, key)
        raise Ignore()
    if action == "raise" or request.called_directly:
        raise error
    countdown = min(float(2 ** min(request.retries, 10)), policy.ttl or 60.0)
    raise task.retry(countdown=countdown * random.uniform(0.5, 1.5), exc=error)


def check_rate(task: Any, policy: TaskPolicy, args: Any, kwargs: Any) -> None:
    """Count this run against the global rate limit; re-queue, skip or raise if over."""
    rate = policy.rate
    assert rate is not None
    request = task.request
    key = rate.key.render(args, kwargs)
    try:
        decision = rate.hit(limiter_for(task.app), key)
    except RateLimiterUnavailable as exc:
        on_unavailable(task, f"rate limit {key!r} not checked", exc)
    if decision.allowed:
        return
    action = rate.on_limited
    signals.rate_limited.send(
        sender=task, task_id=request.id, key=key, retry_after=decision.retry_after, action=action
    )
    error = RateLimited(
        f"task {task.name!r} ({request.id}): rate limit {rate.rate} on {key!r} reached; "
        f"allowed again in {decision.retry_after:.2f} s",
        key=key,
        retry_after=decision.retry_after,
    )
    if action == "skip":
        logger.info("task %s: rate limit %r reached; skipped", request.id, key)
        raise Ignore()
    if action == "raise" or request.called_directly:
        raise error
    # Spread the waiting runs over one slot so they do not all come back at once.
    spread = rate.rate.period / rate.rate.limit
    requeue_uncounted(task, decision.retry_after + random.uniform(0.0, spread), error)


def on_unavailable(task: Any, what: str, exc: Exception) -> None:
    """Redis unreachable at task start: re-queue (not counted as a retry)."""
    request = task.request
    if request.called_directly:
        raise exc
    countdown = UNAVAILABLE_RETRY * random.uniform(0.5, 1.5)
    logger.warning(
        "task %s (%s): %s, Redis unavailable (%s); re-queued to run in %.1f s",
        task.name,
        request.id,
        what,
        exc,
        countdown,
    )
    requeue_uncounted(task, countdown, exc)


def requeue_uncounted(task: Any, countdown: float, exc: BaseException) -> None:
    """Re-queue the current run without using up one of its ``max_retries``."""
    request = task.request
    request.retries = max(request.retries - 1, -1)
    raise Task.retry(task, countdown=countdown, exc=exc, max_retries=None)


def _send_lost(task: Any, held: HeldLock, reason: str) -> None:
    signals.lock_lost.send(
        sender=task,
        task_id=held.task_id,
        key=held.lock.name,
        held=held.held_for,
        reason=reason,
        code=held.lost_code,
    )


# -- the publishing side -----------------------------------------------------------


def publish_guarded(
    task: Any,
    policy: TaskPolicy,
    args: Any,
    kwargs: Any,
    task_id: str | None,
    options: dict[str, Any],
) -> Any:
    """``apply_async`` with the beat rate limit and the singleton lock applied."""
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    headers = dict(options.get("headers") or {})
    if policy.rate is not None and headers.get("celery_beat_task"):
        key = policy.rate.key.render(args, kwargs)
        try:
            decision = policy.rate.hit(limiter_for(task.app), key)
        except RateLimiterUnavailable as exc:
            # Beat would only log an error and lose the tick: publish, and let
            # the worker count the run (it re-queues while Redis is down).
            logger.warning(
                "beat publish of %s: rate limit %r not checked (%s); published unchecked",
                task.name,
                key,
                exc,
            )
        else:
            if not decision.allowed:
                skipped = uuid()
                signals.rate_limited.send(
                    sender=task,
                    task_id=skipped,
                    key=key,
                    retry_after=decision.retry_after,
                    action="skip-publish",
                )
                logger.info("beat publish of %s skipped: rate limit %r reached", task.name, key)
                return EagerResult(skipped, None, states.IGNORED)
            headers[RATE_CHECKED_HEADER] = True
            options = {**options, "headers": headers}
    if policy.singleton is None:
        return Task.apply_async(task, args, kwargs, task_id=task_id, **options)

    task_id = task_id or uuid()
    key = singleton_key(policy.singleton, task.name, args, kwargs)
    redlock = redlock_for(task.app)
    if headers.get("celery_beat_task"):
        tick = redlock.lock(
            f"beat-{key}", ttl=policy.singleton.beat_window, owner=f"{task_id}|beat"
        )
        try:
            fresh_tick = tick.acquire(blocking=False)
        except QuorumUnavailable:
            fresh_tick = True  # the singleton lock below still applies
        if not fresh_tick:
            # Another beat published this tick already; the lock expires by itself.
            holder_id = task_id_of(redlock.holder(f"beat-{key}")) or task_id
            return on_duplicate_publish(task, policy, key, holder_id, from_beat=True)
    lock: Lock | None = redlock.lock(key, ttl=policy.singleton.ttl, owner=f"{task_id}|queued")
    for _ in range(3):
        assert lock is not None
        try:
            if lock.acquire(blocking=False):
                break
        except QuorumUnavailable as exc:
            logger.warning(
                "singleton %r: lock nodes unavailable (%s); publishing %s without the "
                "publish-time check (the worker still runs one copy at a time)",
                key,
                exc,
                task_id,
            )
            lock = None
            break
        holder_id = task_id_of(redlock.holder(key))
        if holder_id == task_id:
            lock = None  # our own copy re-published: self.retry() or a twin
            break
        if holder_id is not None:
            return on_duplicate_publish(
                task, policy, key, holder_id, from_beat=bool(headers.get("celery_beat_task"))
            )
    else:
        raise LockNotAcquired(
            f"singleton {key!r}: the nodes disagree on who holds it; try again",
            key=key,
            timeout=0.0,
        )
    try:
        return Task.apply_async(task, args, kwargs, task_id=task_id, **options)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def on_duplicate_publish(
    task: Any, policy: TaskPolicy, key: str, holder_id: str, *, from_beat: bool = False
) -> Any:
    """A singleton is already queued or running as ``holder_id``.

    Beat gets the queued task's result either way: an exception would only
    become an error line in its log.
    """
    assert policy.singleton is not None
    signals.duplicate_suppressed.send(
        sender=task, task_id=holder_id, key=key, where="beat" if from_beat else "publish"
    )
    if policy.singleton.on_duplicate == "raise" and not from_beat:
        raise DuplicateTask(
            f"task {task.name!r}: a copy with these arguments is already queued or running "
            f"as task {holder_id} (singleton {key!r})",
            task_name=task.name,
            task_id=holder_id,
            key=key,
        )
    return task.AsyncResult(holder_id)


# -- main-process cleanup ---------------------------------------------------------


def connect_cleanup(app: Any) -> None:
    """Free locks of task processes that died, from the worker's main process.

    A hard time limit, ``revoke(terminate=True)`` or a crashed pool process
    ends the task without running its ``finally``; the main process learns
    of it (``task_failure``, ``task_revoked``) and releases the locks by the
    owner's task id instead of leaving them until the ttl runs out. A revoked
    message that never ran frees its queued singleton the same way. Also adds
    the worker start-up check of the ``redlock_*`` settings.
    """
    if getattr(app, "_redlock_cleanup", False):
        return
    app._redlock_cleanup = True
    from celery import signals as celery_signals

    from .hooks import RedlockStartupCheck

    # Bad settings stop the worker at start-up, not at its first task.
    app.steps["worker"].add(RedlockStartupCheck)
    # Receivers are global and connected once (Celery keys them by identity).
    celery_signals.task_failure.connect(_on_task_failure, weak=False)
    celery_signals.task_revoked.connect(_on_task_revoked, weak=False)


def _free_by_owner(task: Any, task_id: str | None, args: Any, kwargs: Any) -> None:
    policy = getattr(task, "_redlock_policy", None)
    if not isinstance(policy, TaskPolicy) or not task_id:
        return
    args, kwargs = args or (), kwargs or {}
    keys = []
    try:
        if policy.lock is not None:
            keys.append(policy.lock.key.render(args, kwargs))
        if policy.singleton is not None:
            keys.append(singleton_key(policy.singleton, task.name, args, kwargs))
        redlock = redlock_for(task.app)
        for key in keys:
            if redlock.release_owner(key, task_id):
                logger.info("freed lock %r of task %s, which ended abruptly", key, task_id)
    except Exception:
        logger.exception("could not free the locks of task %s", task_id)


def _on_task_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    from billiard.exceptions import TimeLimitExceeded, WorkerLostError

    # Only the paths on which the task's own process could not clean up.
    if isinstance(exception, TimeLimitExceeded | WorkerLostError):
        _free_by_owner(sender, task_id, args, kwargs)


def _on_task_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        _free_by_owner(sender, request.id, request.args, request.kwargs)
