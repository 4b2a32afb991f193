"""One publish of a LockedTask: the beat rate limit and the singleton lock.

A beat publish over the rate limit is not sent (beat would only log an error); it counts in a
budget apart from the run's. A singleton publish takes the singleton lock for the new task id
first; a duplicate gets the queued copy's ``AsyncResult`` (or ``DuplicateTask``).

Two beats on one schedule publish each tick once: a tick lock for ``singleton_beat_window``,
and for an interval entry (whose ticks fall wherever each beat started) an interval lock held
for the interval less a margin, so only the holder's own next tick passes. Redis's ttl measures
the hold, not the beats' clocks (docs/configuration.md, ``singleton_beat_window``).
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

from celery import Task, states
from celery import signals as celery_signals
from celery.schedules import schedule as interval_schedule
from celery.utils import uuid

from .. import signals
from .._layout import BEAT, QUEUED, LockValue
from ..errors import DuplicateTask, LockNotAcquired, QuorumUnavailable
from ..lock.redlock import Lock
from .app_state import redlock_for
from .feature_policies import SingletonPolicy
from .features import debounce
from .features.rate_limit import RateGate
from .features.redelivery import WINNER_HEADER
from .features.singleton import KEY_HEADER, seconds_held, task_id_of
from .features.singleton_call_text import call_text
from .features.singleton_call_text import store as store_preview
from .key_templates import as_delivered, beat_interval_name, beat_tick_name
from .policies import TaskPolicy

__all__ = ["Publication", "watch_beat"]

logger = logging.getLogger("celery_redlock.task")

#: Header Celery's beat sets on the messages it publishes.
_BEAT_HEADER = "celery_beat_task"
#: Publish options of a copy that is part of a canvas: something waits for it or follows it.
_CANVAS_OPTIONS = ("group_id", "chord", "chain", "link", "link_error")
#: Attempts at the singleton lock while its holder changes under us.
_SINGLETON_ATTEMPTS = 3
#: The beat service running in this process, once started (:func:`watch_beat`).
_beat_service: weakref.ref[Any] | None = None


def _interval_margin(interval: float) -> float:
    """How much early a beat's next interval tick may run and still be its own."""
    return min(interval / 4, 1.0)


def watch_beat() -> None:
    """Note the beat service this process starts, so that its publishes know their schedule."""
    celery_signals.beat_init.connect(_on_beat_init, weak=False)


def _on_beat_init(sender: Any = None, **_: Any) -> None:
    global _beat_service
    _beat_service = weakref.ref(sender) if sender is not None else None


class Publication:
    """``task.apply_async(...)`` guarded by ``policy``: ``Publication(...).send()``."""

    def __init__(
        self,
        task: Any,
        policy: TaskPolicy,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        options: dict[str, Any],
    ) -> None:
        self.task = task
        self.policy = policy
        self.args = tuple(args or ())
        self.kwargs = dict(kwargs or {})
        self.task_id = task_id
        self.options = options
        self.headers = dict(options.get("headers") or {})
        # A retry or re-queue keeps beat's header but has ``retries``: no new tick, never drop it.
        self.from_beat = bool(self.headers.get(_BEAT_HEADER)) and options.get("retries") is None
        #: A copy sent again by a worker (a retry, a re-queue), not a new publish.
        self.resent = options.get("retries") is not None

    @functools.cached_property
    def delivered(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's ``(args, kwargs)`` as the worker receives them (a tuple arrives as a list).

        Keys render from these, so the publisher's key matches the worker's.
        """
        task, args, kwargs = self.task, self.args, self.kwargs
        serializer = self.options.get("serializer") or task.serializer
        dump = getattr(task, "_dump_pydantic_arguments", None)
        if dump is not None and serializer != "pickle":
            args, kwargs = dump(args, kwargs)  # as Celery's apply_async does
        return as_delivered(args, kwargs, serializer or task.app.conf.task_serializer)

    def send(self) -> Any:
        """Publish unless refused; return the ``AsyncResult`` to give the caller.

        Raises:
            DuplicateTask: a duplicate singleton with ``on_duplicate="raise"``.
        """
        if self.policy.rate is not None and self.from_beat:
            gate = RateGate(self.task, self.policy.rate, *self.delivered)
            refused = gate.at_publish()
            if refused is not None:
                return refused
        if self.policy.debounce is not None:
            return debounce.publish(self)
        singleton = self.policy.singleton
        if singleton is None:
            return self._publish()
        if singleton.mode == "queued" and self.resent:
            # The copy keeps its place: a retry's handed-back key, or the waiting follow-up.
            return self._publish()
        self.task_id = self.task_id or uuid()
        return self._send_singleton(singleton)

    def send_plain(self) -> Any:
        """Publish as Celery does, with the current options; no check of our own."""
        return self._publish()

    def _publish(self) -> Any:
        # Celery's own apply_async: LockedTask.apply_async is what led here.
        return Task.apply_async(
            self.task, self.args, self.kwargs, task_id=self.task_id, **self.options
        )

    def _send_singleton(self, singleton: SingletonPolicy) -> Any:
        task, task_id = self.task, self.task_id
        assert task_id is not None
        # "queued" mode takes the follow-up's key; a run's next copy keeps its handed-back key.
        handed = self.headers.get(KEY_HEADER) if self.resent else None
        key = handed or singleton.names(task.name, *self.delivered)[-1]
        redlock = redlock_for(task.app)
        if self.from_beat:
            ticks = [(beat_tick_name(key), singleton.beat_window)]
            interval = self._beat_interval(singleton, key)
            if interval is not None:
                hold = interval - _interval_margin(interval)
                ticks.append((beat_interval_name(key), hold))
            for name, ttl in ticks:
                tick = redlock.lock(name, ttl=ttl, owner=LockValue.owner_text(task_id, BEAT))
                try:
                    fresh_tick = tick.acquire(blocking=False)
                except QuorumUnavailable:
                    fresh_tick = True  # the singleton lock below still applies
                if not fresh_tick:
                    # Another beat published this tick already; the lock expires by itself.
                    return self._duplicate(key, task_id_of(redlock.holder(name)) or task_id)
        lock: Lock | None = redlock.lock(
            key, ttl=singleton.ttl, owner=LockValue.owner_text(task_id, QUEUED)
        )
        for _ in range(_SINGLETON_ATTEMPTS):
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
            value = redlock.holder(key)
            holder = task_id_of(value)
            if holder == task_id:
                lock = None  # our own copy re-published: self.retry() or a twin
                break
            if holder is not None and not self._revoked_in_queue(key, value):
                return self._duplicate(key, holder)
        else:
            raise LockNotAcquired(
                f"singleton {key!r}: the nodes disagree on who holds it; try again",
                key=key,
                timeout=0.0,
            )
        try:
            if lock is not None:
                text = call_text(self.args, self.kwargs, self.options)
                store_preview(redlock, key, task_id, text, singleton.ttl)
            return self._publish()
        except BaseException:
            if lock is not None:
                lock.release()  # and the preview with it
            raise

    def _beat_interval(self, singleton: SingletonPolicy, key: str) -> float | None:
        """Seconds between ticks of this process's interval beat entry for ``key``, or ``None``."""
        service = _beat_service() if _beat_service is not None else None
        try:
            entries = list(service.scheduler.schedule.values()) if service is not None else []
        except Exception:  # a scheduler that cannot list its entries: the window alone applies
            return None
        for entry in entries:
            every = entry.schedule
            if (
                getattr(entry, "task", None) != self.task.name
                or type(every) is not interval_schedule
                or every.seconds <= singleton.beat_window
            ):
                continue
            try:
                names = singleton.names(self.task.name, entry.args or (), entry.kwargs or {})
            except Exception:  # arguments this singleton cannot key: not this publish
                continue
            if names[-1] == key:
                return float(every.seconds)
        return None

    def _revoked_in_queue(self, key: str, value: str | None) -> bool:
        """Free singleton ``key`` if its still-queued holder was revoked (the backend says so).

        A revoked countdown task sits in a worker until its eta, holding the key meanwhile.
        """
        parsed = LockValue.parse(value)
        if parsed is None or parsed.task_id is None or parsed.where != QUEUED:
            return False
        try:
            state = self.task.backend.get_state(parsed.task_id)
        except Exception:  # no result backend, or it is down: the revoke cannot be seen
            return False
        if state != states.REVOKED:
            return False
        redlock_for(self.task.app).release_owner(key, parsed.task_id, QUEUED)
        logger.info("singleton %r: freed from task %s, revoked while queued", key, parsed.task_id)
        return True

    def _duplicate(self, key: str, holder_id: str) -> Any:
        """A singleton is already queued or running as ``holder_id``.

        Beat always gets the ``AsyncResult`` (an exception would only be a log line). A canvas
        copy is sent anyway, naming the holder, whose value it ends with in the worker
        (:mod:`.features.redelivery`).
        """
        task = self.task
        singleton = self.policy.singleton
        assert singleton is not None
        options = self.options
        if self.task_id != holder_id and any(options.get(name) for name in _CANVAS_OPTIONS):
            options["headers"] = {**(options.get("headers") or {}), WINNER_HEADER: holder_id}
            return self._publish()
        signals.duplicate_suppressed.send(
            sender=task, task_id=holder_id, key=key, where="beat" if self.from_beat else "publish"
        )
        if singleton.on_duplicate == "raise" and not self.from_beat:
            ttl = seconds_held(redlock_for(task.app), key, holder_id)
            raise DuplicateTask(
                f"task {task.name!r}: a copy with these arguments is already queued or running "
                f"as task {holder_id} (singleton {key!r}, held {ttl:.1f} s more unless renewed)",
                task_name=task.name,
                task_id=holder_id,
                key=key,
                ttl=ttl,
            )
        return task.AsyncResult(holder_id)
