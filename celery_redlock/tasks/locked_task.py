"""LockedTask: locks, singletons, global rate limits and concurrency limits around a task.

::

    @app.task(base=LockedTask, bind=True, lock_key="sync-user:{user_id}", lock_ttl=60)
    def sync_user(self, user_id):
        for page in pages(user_id):
            self.heartbeat()          # progress: keeps the lock; LockLost if it is gone
            store(page, fencing_token=self.lock.fencing_token)

The class holds the options (checked at bind) and hands each run to a
:class:`~celery_redlock.tasks.run.TaskRun`, each publish to a
:class:`~celery_redlock.tasks.publish.Publication`. A direct call (``sync_user(42)``) and
``redlock_enabled = False`` run the body as a plain function, as Celery does; nested eager
runs under the same lock are re-entrant (docs/configuration.md, docs/testing.md).
"""

from __future__ import annotations

import functools
from typing import Any, NoReturn

from celery import Task
from celery._state import _task_stack

from .. import _clock
from ..errors import ConfigurationError
from ..lock.redlock import Lock
from ..lock.renewal import heartbeat
from . import call_overrides as call_overrides
from .app_state import enabled_for, policy_for, settings_for
from .features.rate_limit import RateGate
from .key_templates import KeySource, task_arguments
from .options import OPTION_NAMES, check_attributes
from .policies import TaskPolicy
from .publish import Publication, watch_beat
from .run import TaskRun

__all__ = ["LockedTask"]

#: The worker bootstep that checks settings at start-up and frees dead processes' locks;
#: named by import path so this module does not import admin/, which imports it.
STARTUP_STEP = "celery_redlock.admin.startup_notice:RedlockStartupCheck"

#: Task options Celery reads from the task without declaring them on ``Task``
#: (``celery.app.autoretry``); Celery fills ``Task.from_config`` names in at bind.
_CELERY_UNDECLARED = frozenset(
    (
        "autoretry_for",
        "dont_autoretry_for",
        "retry_kwargs",
        "retry_backoff",
        "retry_backoff_max",
        "retry_jitter",
        *(attribute for attribute, _ in Task.from_config),
    )
)


class LockedTask(Task):  # type: ignore[misc]
    """A Celery task base class with locks, singletons and global rate limits.

    Options are task attributes (``@app.task(base=LockedTask, lock_ttl=30)``); ``None``
    falls back to ``app.conf``. Bad values raise ``ConfigurationError`` when the task is defined.
    """

    #: The worker's request class (main process): frees the locks of a run
    #: whose pool process died (see :class:`celery_redlock.tasks.cleanup_request.CleanupRequest`).
    Request = "celery_redlock.tasks.cleanup_request:CleanupRequest"

    #: ``str.format`` template over the task's arguments (``"sync:{user_id}"``),
    #: or a callable ``(args, kwargs) -> str``; ``None``: one run at a time per task.
    lock_key: KeySource = None
    #: Lock time to live in seconds, renewed by the heartbeat
    #: (default ``app.conf.redlock_default_ttl``, 60).
    lock_ttl: float | None = None
    #: Seconds to wait for a busy lock before ``on_lock_busy`` applies (default 0).
    lock_timeout: float | None = None
    #: What to do when the lock is busy: ``"retry"`` (default: re-queue with a jittered
    #: backoff capped at the lock's ttl and 30 s, not counted against
    #: ``max_retries``), ``"skip"`` (end as ignored) or ``"raise"``.
    on_lock_busy: str | None = None
    #: Busy re-queues after which a run fails with ``LockNotAcquired``
    #: (default ``None``: re-queued until the lock is free).
    lock_busy_max_requeues: int | None = None
    #: Stop renewing when the task reported no progress for this many seconds,
    #: so a hung task loses its lock; ``None``: renew while the task runs.
    lock_progress_timeout: float | None = None
    #: Take a run lock at all (default: yes, unless the task only asks for a
    #: singleton or a rate limit and names no ``lock_key``).
    lock_enabled: bool | None = None
    #: One queued-or-running copy per task and arguments (default ``False``; see
    #: :mod:`.features.singleton`).
    singleton: bool | None = None
    #: Template or callable naming the singleton instead of the argument hash.
    singleton_key: KeySource = None
    #: Seconds a published singleton holds its key while queued
    #: (default ``app.conf.redlock_singleton_ttl``, else 3600).
    singleton_ttl: float | None = None
    #: A duplicate publish (default ``app.conf.redlock_on_duplicate``, else
    #: ``"return"``): ``"return"`` the queued task's result or ``"raise"``.
    on_duplicate: str | None = None
    #: Beat publishes this close together (seconds) are one tick (default 0.5):
    #: two beat processes on one schedule publish once (an interval entry's
    #: ticks are also one per interval: see :mod:`.publish`).
    singleton_beat_window: float | None = None
    #: ``"one"`` (default): one queued-or-running copy; ``"queued"``: one running
    #: copy plus at most one queued follow-up (see :mod:`.features.queued_singleton`).
    singleton_mode: str | None = None
    #: Seconds: a burst of publishes for one key runs once, this long after the
    #: last publish, with its arguments; earlier copies end superseded (see
    #: :mod:`.features.debounce`).
    debounce: float | None = None
    #: Template or callable naming the debounce key (default: the task name).
    debounce_key: KeySource = None
    #: Seconds a debounce key remembers its last publish after it was due (default 3600).
    debounce_ttl: float | None = None
    #: Global rate limit, counted when a run starts, across every worker: a rate
    #: in Celery's syntax (``"10/s"``, ``"100/m"``, ``"1000/h"``, ``"50000/d"``,
    #: ``"2.5/s"``), a callable ``rate(key)`` read on every run, or a list of
    #: limits that must all admit a run: ``["10/s", "50000/d"]``, with keys of
    #: their own as ``[("10/s", "api:{customer}"), ("1000/h", "api")]``.
    global_rate_limit: Any = None
    #: Template or callable naming the limit (default: the task name).
    rate_limit_key: KeySource = None
    #: A limited run: ``"retry"`` (default: when the window allows, not counted
    #: against ``max_retries``), ``"skip"`` or ``"raise"``.
    on_rate_limited: str | None = None
    #: ``"sliding"`` (default: never more than the limit in any window of one
    #: period, bursts allowed), ``"gcra"`` (evenly spaced) or ``"fixed"``
    #: (up to twice the limit across a window's edge); see :mod:`..ratelimit`.
    rate_limit_algorithm: str | None = None
    #: Units one run takes in each limit (default 1), or a callable
    #: ``(args, kwargs) -> int`` (an API call that costs more than one unit).
    rate_limit_cost: Any = None
    #: The configured rate is a ceiling: each refusal reported by
    #: :meth:`rate_limited` lowers the rate in force, which climbs back while
    #: none comes (default ``False``; the law: docs/rate-limiting.md, "Adaptive rates").
    rate_limit_adaptive: bool | None = None
    #: At most this many runs at once per ``concurrency_key``, across every
    #: worker: each run holds a slot while its body runs (renewed like the
    #: lock, freed on every way out). A run finding every slot taken waits up
    #: to ``lock_timeout``, then ``on_lock_busy`` applies (a re-queue does not
    #: spend ``max_retries``).
    concurrency_limit: int | None = None
    #: Template or callable naming the limit's key (default: the task name).
    concurrency_key: KeySource = None

    _redlock_policy: TaskPolicy | None = None
    #: Whether ``super().__call__`` is Celery's own ``Task.__call__`` (no class
    #: between this one and ``Task`` wraps the call): set when the task is bound.
    _redlock_plain_call = False

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Check the options as soon as the task is bound to its app."""
        super().on_bound(app)
        if cls.__dict__.get("name") is None and cls.run is Task.run:
            return  # an abstract base, not a task
        check_attributes(cls.name, _attributes_to_check(cls))
        options = {name: getattr(cls, name, None) for name in OPTION_NAMES}
        cls._redlock_policy = TaskPolicy.from_options(cls.name, task_arguments(cls), options)
        cls._redlock_plain_call = _next_call(cls) is Task.__call__
        # Bad settings stop the worker at start-up, not at its first task.
        app.steps["worker"].add(STARTUP_STEP)
        watch_beat()  # a beat process's publishes find their schedule entry
        call_overrides.guard_send_task(app)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body inside its limits and locks; a direct call runs it plain, as in Celery."""
        if (
            self._redlock_policy is None
            or not self._redlock_policy.active
            or self._called_directly()
            or not enabled_for(self.app)
        ):
            return super().__call__(*args, **kwargs)
        policy = policy_for(self)
        assert policy is not None
        raw = call_overrides.from_request(self.request)
        if raw is not None:  # per-call overrides, checked again: a message may come from anywhere
            checked = call_overrides.check(self.name, policy, raw, settings_for(self.app))
            policy = policy.with_values(checked)
        body = self._traced_body if self._redlock_plain_call else super().__call__
        return TaskRun(self, policy, args, kwargs).run(body)

    def _traced_body(self, *args: Any, **kwargs: Any) -> Any:
        """The body as ``Task.__call__`` calls it, minus the request copy.

        The tracer already pushed this run's request; a copy costs a ``Context`` per run.
        """
        _task_stack.push(self)
        try:
            return self.run(*args, **kwargs)
        finally:
            _task_stack.pop()

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        """Publish: singleton lock first, debounce record, beat rate limits.

        A duplicate singleton with ``on_duplicate="return"`` returns the queued copy's
        ``AsyncResult``. ``redlock={option: value}`` overrides options for this call::

            sync_user.apply_async((42,), redlock={"lock_timeout": 5})

        Raises:
            DuplicateTask: a duplicate singleton with ``on_duplicate="raise"``.
            ConfigurationError: a bad ``redlock`` override, named.
        """
        call_overrides.refuse_peer_keywords(self.name, options)
        run = TaskRun.current(self)
        if run is not None and task_id is not None and task_id == run.task_id:
            # The run's own next copy (self.retry(), a re-queue), sent now: it
            # gets the run's locks as it goes, and only if it is really sent.
            return run.send_again(lambda: self._send(args, kwargs, task_id, options), options)
        return self._send(args, kwargs, task_id, options)

    def _send(self, args: Any, kwargs: Any, task_id: str | None, options: dict[str, Any]) -> Any:
        overrides = self._take_overrides(options) if call_overrides.KEYWORD in options else None
        policy = self._redlock_policy
        if (
            policy is None
            or not (policy.singleton or policy.rate or policy.debounce)
            or not enabled_for(self.app)
        ):
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        resolved = policy_for(self)
        assert resolved is not None
        if overrides:
            resolved = resolved.with_values(overrides)
        return Publication(self, resolved, args, kwargs, task_id, options).send()

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Celery's ``apply`` (run here and now, with the locks); takes ``redlock=`` too."""
        if call_overrides.KEYWORD in options:
            self._take_overrides(options)
        return super().apply(args, kwargs, **options)

    def _take_overrides(self, options: dict[str, Any]) -> dict[str, Any]:
        """Check the call's ``redlock`` overrides and move them into the message headers."""
        raw = options.pop(call_overrides.KEYWORD)
        if raw is None:
            return {}  # as everywhere: None is "not set"
        policy = self._redlock_policy
        if policy is None:
            raise ConfigurationError(
                call_overrides.KEYWORD, "this task has no celery_redlock options", task=self.name
            )
        checked = call_overrides.check(self.name, policy, raw, settings_for(self.app))
        if checked:
            headers = dict(options.get("headers") or {})
            headers[call_overrides.HEADER] = checked
            options["headers"] = headers
        return checked

    def _called_directly(self) -> bool:
        """Whether this is a plain function call, not a traced run.

        A direct call finds no request, or the request of this task's own run in
        progress on this thread (the task calling itself).
        """
        request = self.request
        if request.called_directly:
            return True
        run = TaskRun.current(self)
        return run is not None and run.request.id == request.id

    # -- inside the task ---------------------------------------------------------

    @property
    def lock(self) -> Lock | None:
        """The lock held by the current run (``validity``, ``fencing_token``), if any."""
        run = TaskRun.current(self)
        held = run.exposed if run is not None else None
        lock = held.lock if held is not None else None
        return lock if isinstance(lock, Lock) else None

    @property
    def lock_lost(self) -> bool:
        """True once the current run's lock, or its concurrency slot, expired or failed to renew."""
        run = TaskRun.current(self)
        if run is None:
            return False
        return any(
            held is not None and (held.lost or not held.lock.locked())
            for held in (run.exposed, run.slot)
        )

    def heartbeat(self) -> None:
        """Report progress and renew the run's locks now if they are due.

        Raises:
            LockLost: a lock is gone; work done from here on is unprotected.
        """
        run = TaskRun.current(self)
        for held in run.held if run is not None else ():
            heartbeat().progress(held, renew_now=True)

    def rate_limited(self, retry_after: float | None = None, key: str | None = None) -> NoReturn:
        """The service behind the limit refused: pause the key everywhere and re-queue.

        Raises, as ``self.retry()`` does (see :meth:`.features.rate_limit.RateGate.refused`)::

            if resp.status_code == 429:
                self.rate_limited(retry_after=float(resp.headers.get("Retry-After", 1)))
        """
        run = TaskRun.current(self)
        if run is None or run.policy.rate is None:
            problem = "rate_limited() is for the body of a task with a global rate limit"
            raise ConfigurationError("global_rate_limit", problem, task=self.name)
        gate = RateGate(self, run.policy.rate, run.args, run.kwargs)
        gate.refused(run, retry_after, key)

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        """Store task state (Celery's ``update_state``); counts as progress."""
        super().update_state(*args, **kwargs)
        run = TaskRun.current(self)
        now = _clock.monotonic()
        for held in run.held if run is not None else ():
            held.last_progress = now


def _next_call(cls: type) -> Any:
    """The ``__call__`` that ``super().__call__`` inside ``LockedTask.__call__`` resolves to."""
    mro = cls.__mro__
    for klass in mro[mro.index(LockedTask) + 1 :]:
        if "__call__" in vars(klass):
            return vars(klass)["__call__"]
    return None


def _attributes_to_check(cls: type) -> dict[str, Any]:
    """The attributes a task's own classes set (decorator keywords land there).

    Left out: private names, names of Celery's or other non-LockedTask bases, and methods
    or properties written in a class body (code, not options).
    """
    theirs = set(_CELERY_UNDECLARED)
    for klass in cls.__mro__:
        if not issubclass(klass, LockedTask):
            theirs.update(vars(klass))
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is LockedTask or not issubclass(klass, LockedTask):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in theirs or _written_in_body(klass, name, value):
                continue
            found[name] = value
    return found


def _written_in_body(klass: type, name: str, value: Any) -> bool:
    """Whether ``value`` is a function, property or method defined in ``klass``'s body."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    elif isinstance(value, functools.cached_property):
        value = value.func
    qualname = getattr(value, "__qualname__", None)
    return callable(value) and qualname == f"{klass.__qualname__}.{name}"
