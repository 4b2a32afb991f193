"""What celery_redlock does around one task: its lock, singleton, rate and concurrency limits.

Built from the task's options at definition, then checked against the app's settings once per
app (:meth:`TaskPolicy.resolve`); both raise ``ConfigurationError`` naming task and option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .._validators import MAX_TTL, check_ttl
from ..errors import ConfigurationError
from . import options as task_options
from .feature_policies import (
    ConcurrencyPolicy,
    DebouncePolicy,
    LockPolicy,
    RatePolicy,
    SingletonPolicy,
)
from .key_templates import ArgumentPlan, KeyTemplate

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["TaskPolicy"]

_P = TypeVar("_P", LockPolicy, ConcurrencyPolicy, SingletonPolicy, RatePolicy)
#: The options a run lock and a concurrency limit share, and their fields.
_BUSY_FIELDS = {
    "lock_timeout": "timeout",
    "on_lock_busy": "on_busy",
    "lock_busy_max_requeues": "max_requeues",
}


@dataclass(frozen=True)
class TaskPolicy:
    """Everything celery_redlock does around one task."""

    task_name: str
    lock: LockPolicy | None
    singleton: SingletonPolicy | None
    rate: RatePolicy | None
    #: The per-key concurrency limit, if any.
    concurrency: ConcurrencyPolicy | None = None
    #: Time to live of the locks held while running; ``None`` until :meth:`resolve`.
    ttl: float | None = None
    #: ``lock_progress_timeout`` for the locks held while running.
    progress_timeout: float | None = None
    debounce: DebouncePolicy | None = None
    #: Options with an ``app.conf`` setting the task left unset, for :meth:`resolve`.
    inherited: frozenset[str] = frozenset()

    @classmethod
    def from_options(
        cls, task_name: str, plan: ArgumentPlan, options: Mapping[str, Any]
    ) -> TaskPolicy:
        """Check ``options`` (``None``: unset); key templates are checked against ``plan``."""
        values = task_options.read(task_name, options)
        singleton_on = values["singleton"]
        rate_on = values["global_rate_limit"] is not None
        limit = values["concurrency_limit"]
        debounce_on = values["debounce"] is not None
        if singleton_on and debounce_on:
            raise ConfigurationError(
                "debounce",
                "cannot be combined with singleton=True: a singleton returns the queued copy "
                "instead of queueing the newer one, so nothing would be debounced; use one",
                task=task_name,
            )
        locking = values["lock_enabled"]
        if locking is None:
            # Only a singleton or a limit: no run lock unless a lock_key is named.
            locking = (
                values["lock_key"] is not None
                or debounce_on
                or not (singleton_on or rate_on or limit is not None)
            )

        def template(option: str, default: str) -> KeyTemplate:
            return KeyTemplate(
                values[option], default=default, task_name=task_name, option=option, plan=plan
            )

        lock_key = template("lock_key", task_name)
        debounce = None
        if debounce_on:
            debounce = DebouncePolicy(
                key=template("debounce_key", ""),
                delay=values["debounce"],
                ttl=values["debounce_ttl"],
            )
            if debounce.delay + debounce.ttl > MAX_TTL:
                # The record lives debounce + debounce_ttl; past MAX_TTL every publish fails.
                raise ConfigurationError(
                    "debounce" if debounce.delay >= MAX_TTL else "debounce_ttl",
                    f"debounce + debounce_ttl ({debounce.delay:.12g} + {debounce.ttl:.12g} s) "
                    f"must be at most {MAX_TTL:.12g} s (365 days), how long the record of a "
                    "publish can be kept",
                    task=task_name,
                )
            if values["lock_key"] is None:
                # Runs of one debounce key never overlap: the run lock is the debounce key.
                lock_key = _debounce_lock_key(task_name, debounce, plan)
        lock = LockPolicy(
            key=lock_key,
            timeout=values["lock_timeout"],
            on_busy=values["on_lock_busy"],
            max_requeues=values["lock_busy_max_requeues"],
        )
        singleton = SingletonPolicy(
            key=template("singleton_key", ""),
            ttl=values["singleton_ttl"],
            on_duplicate=values["on_duplicate"],
            beat_window=values["singleton_beat_window"],
            mode=values["singleton_mode"],
        )
        rate = None
        if rate_on:
            rate = RatePolicy.build(
                task_name,
                plan,
                values["global_rate_limit"],
                key_source=values["rate_limit_key"],
                algorithm=values["rate_limit_algorithm"],
                cost=values["rate_limit_cost"],
                on_limited=values["on_rate_limited"],
                adaptive=values["rate_limit_adaptive"],
            )
        concurrency = None
        if limit is not None:
            concurrency = ConcurrencyPolicy(
                key=template("concurrency_key", task_name),
                limit=limit,
                timeout=values["lock_timeout"],
                on_busy=values["on_lock_busy"],
                max_requeues=values["lock_busy_max_requeues"],
            )
        return cls(
            task_name=task_name,
            lock=lock if locking else None,
            singleton=singleton if singleton_on else None,
            rate=rate,
            concurrency=concurrency,
            ttl=values["lock_ttl"],
            progress_timeout=values["lock_progress_timeout"],
            debounce=debounce,
            inherited=frozenset(
                entry.name
                for entry in task_options.TASK_OPTIONS
                if entry.setting is not None and options.get(entry.name) is None
            ),
        )

    @property
    def active(self) -> bool:
        """Whether there is anything to do around this task."""
        features = (self.lock, self.singleton, self.rate, self.concurrency, self.debounce)
        return any(feature is not None for feature in features)

    def resolve(self, settings: Settings) -> TaskPolicy:
        """The policy with the app's defaults filled in, checked against its settings.

        Every lock must outlive twice ``redlock_node_timeout``, or no acquisition is trusted.

        Raises:
            ConfigurationError: naming the task and the too-short option (or its setting).
        """
        values: dict[str, Any] = {}
        source = {name: name for name in ("lock_ttl", "singleton_ttl")}
        for name in self.inherited:
            setting = task_options.option(name).setting
            assert setting is not None
            value = settings.value(setting)
            if value is not None:
                values[name], source[name] = value, setting
        resolved = self.with_values(values)
        assert resolved.ttl is not None, "redlock_default_ttl always has a value"
        lifetimes: list[tuple[str, float]] = []
        if self.lock is not None or self.singleton is not None or self.concurrency is not None:
            lifetimes.append((source["lock_ttl"], resolved.ttl))
        if resolved.singleton is not None:
            lifetimes.append((source["singleton_ttl"], resolved.singleton.ttl))
            lifetimes.append(("singleton_beat_window", resolved.singleton.beat_window))
        timeout, setting = settings.node_timeout, "redlock_node_timeout"
        for option, seconds in lifetimes:
            check_ttl(seconds, timeout, option, timeout_option=setting, task=self.task_name)
        return resolved

    def with_values(self, values: Mapping[str, Any]) -> TaskPolicy:
        """The policy with checked values in place (a call's overrides, app defaults).

        A value for a feature the task does not have changes nothing.
        """

        def changed(policy: _P | None, fields: Mapping[str, str]) -> _P | None:
            given = {field: values[name] for name, field in fields.items() if name in values}
            return None if policy is None else dataclasses.replace(policy, **given)

        return dataclasses.replace(
            self,
            lock=changed(self.lock, _BUSY_FIELDS),
            # A full limit is waited for and handled as a busy lock is.
            concurrency=changed(self.concurrency, _BUSY_FIELDS),
            singleton=changed(
                self.singleton, {"on_duplicate": "on_duplicate", "singleton_ttl": "ttl"}
            ),
            rate=changed(self.rate, {"on_rate_limited": "on_limited"}),
            ttl=values.get("lock_ttl", self.ttl),
            progress_timeout=values.get("lock_progress_timeout", self.progress_timeout),
        )

    def lock_names(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
        """The names of the locks a run of one call holds: run lock, then singleton."""
        names = []
        if self.lock is not None:
            names.append(self.lock.key.render(args, kwargs))
        if self.singleton is not None:
            names.extend(self.singleton.names(self.task_name, args, kwargs))
        return names

    def slot_names(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
        """The semaphore names a run of one call holds a slot of (none, or its concurrency key)."""
        if self.concurrency is None:
            return []
        return [self.concurrency.key.render(args, kwargs)]


def _debounce_lock_key(task_name: str, debounce: DebouncePolicy, plan: ArgumentPlan) -> KeyTemplate:
    """A run lock named after the debounce key of each call."""

    def name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return debounce.name(task_name, args, kwargs)

    return KeyTemplate(
        name, default=task_name, task_name=task_name, option="debounce_key", plan=plan
    )
