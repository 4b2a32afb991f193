"""What celery_redlock does around one task: its lock, singleton, rate and concurrency limits.

A :class:`TaskPolicy` is built from the task's options (see :mod:`.options`)
when the task is defined, and checked against the app's settings once per
app by :meth:`TaskPolicy.resolve` (at worker start-up, or on first use in
any other process). Both steps raise
:class:`~celery_redlock.errors.ConfigurationError` naming the task and the
option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._layout import period_key
from .._validators import MAX_TTL
from ..errors import ConfigurationError
from ..ratelimit import Algorithm, Limit
from ..ratelimit.algorithms import check_rate_for
from ..ratelimit.rates import DynamicRate, Rate
from . import options as task_options
from .features.singleton import debounce_name, queued_name, singleton_key
from .key_templates import ArgumentPlan, KeyTemplate
from .setting_checks import Cost, RateEntry

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "ConcurrencyPolicy",
    "DebouncePolicy",
    "LockPolicy",
    "RatePolicy",
    "SingletonPolicy",
    "TaskLimit",
    "TaskPolicy",
]


@dataclass(frozen=True)
class LockPolicy:
    """The run lock: held while the task body runs."""

    key: KeyTemplate
    #: Seconds a run waits for a busy lock before ``on_busy`` applies.
    timeout: float
    on_busy: str
    #: Busy re-queues (``on_busy="retry"``) after which a run fails; ``None``: no end.
    max_requeues: int | None = None


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """At most ``limit`` runs at once per key: a slot of a semaphore, held while the body runs.

    A run that finds every slot taken waits like a run that finds its lock
    busy: up to ``lock_timeout``, then ``on_lock_busy``.
    """

    key: KeyTemplate
    #: Runs at once per key, across every worker.
    limit: int
    #: Seconds a run waits for a free slot before ``on_busy`` applies.
    timeout: float
    on_busy: str
    #: Busy re-queues (``on_busy="retry"``) after which a run fails; ``None``: no end.
    max_requeues: int | None = None


@dataclass(frozen=True)
class SingletonPolicy:
    """One queued-or-running copy per key (by default: per task and arguments)."""

    key: KeyTemplate
    #: Seconds a published copy holds its key while it waits in the queue.
    ttl: float
    on_duplicate: str
    #: Beat publishes within this many seconds of each other are one tick, so
    #: two beat processes on one schedule publish once even when the first
    #: run has already finished; keep it below the schedule's interval.
    beat_window: float
    #: ``"one"`` (one queued-or-running copy) or ``"queued"`` (one running
    #: copy plus at most one queued follow-up: see :mod:`.features.queued_singleton`).
    mode: str = "one"

    def name(self, task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The singleton lock name of one call (in ``"queued"`` mode: of its running copy)."""
        return singleton_key(self, task_name, args, kwargs)

    def names(self, task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
        """Every lock name one call's singleton uses: the running copy's, then the queued one's."""
        name = self.name(task_name, args, kwargs)
        return [name, queued_name(name)] if self.mode == "queued" else [name]


@dataclass(frozen=True)
class DebouncePolicy:
    """A burst of publishes for one key runs once, ``delay`` seconds after the last one."""

    #: Names the key from a call's arguments (default: the task name alone).
    key: KeyTemplate
    #: Seconds after a key's last publish when its one run may start.
    delay: float
    #: Seconds a key remembers its last publish after that publish's due time.
    ttl: float

    def name(self, task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The debounce key of one call: ``debounce:<task>`` or ``debounce:<task>:<key>``."""
        return debounce_name(task_name, self.key.render(args, kwargs))


@dataclass(frozen=True)
class TaskLimit:
    """One of a task's global rate limits: a rate on a key, under an algorithm."""

    #: Names the limit from a call's arguments.
    key: KeyTemplate
    #: The rate, or a callable rate read on every run.
    rate: Rate | DynamicRate
    algorithm: Algorithm
    #: Set when several limits of the task share one key template: each then
    #: counts on ``<key>/<period>`` (``"api/s"``, ``"api/d"``), see
    #: :func:`~celery_redlock._layout.period_key`.
    period: float | None = None
    #: Named by an entry of its own (``("10/s", "api")``), not by ``rate_limit_key``.
    own_key: bool = False

    def render(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The limit's key for one call."""
        key = self.key.render(args, kwargs)
        return key if self.period is None else period_key(key, self.period)

    def describe(self) -> str:
        """``'5/s'`` (a callable rate: its name)."""
        if isinstance(self.rate, Rate):
            return str(self.rate)
        return getattr(self.rate.function, "__qualname__", repr(self.rate.function))


@dataclass(frozen=True)
class RatePolicy:
    """A task's global rate limits: counted when a run starts, and at beat's publish.

    Every limit must admit a run, and the run is counted in all of them in
    one decision; ``cost`` units each.
    """

    task_name: str
    limits: tuple[TaskLimit, ...]
    #: Units one run takes: a whole number, or ``(args, kwargs) -> int``.
    cost: Cost
    on_limited: str
    #: Refusals reported by ``rate_limited()`` lower the rate in force (``rate_limit_adaptive``).
    adaptive: bool = False

    @classmethod
    def build(
        cls,
        task_name: str,
        plan: ArgumentPlan,
        entries: Sequence[RateEntry],
        key_source: Any,
        algorithm: Algorithm,
        cost: Cost,
        on_limited: str,
        adaptive: bool = False,
    ) -> RatePolicy:
        """Check the limits of ``global_rate_limit`` against the task; ConfigurationError if bad."""
        option = "global_rate_limit"
        made: list[TaskLimit] = []
        for index, entry in enumerate(entries):
            where = option if len(entries) == 1 else f"{option}[{index}]"
            source = entry.key if entry.key is not None else key_source
            key_option = where if entry.key is not None else "rate_limit_key"
            chosen = entry.algorithm or algorithm
            if isinstance(entry.rate, Rate):
                try:
                    check_rate_for(entry.rate, chosen, option=where)
                except ConfigurationError as exc:
                    raise exc.with_context(option=where, task=task_name) from None
            template = KeyTemplate(
                source, default=task_name, task_name=task_name, option=key_option, plan=plan
            )
            made.append(TaskLimit(template, entry.rate, chosen, own_key=entry.key is not None))
        limits = _separate_shared_keys(task_name, made)
        if isinstance(cost, int):
            for limit in limits:
                if isinstance(limit.rate, Rate) and cost > limit.rate.window_limit:
                    raise ConfigurationError(
                        "rate_limit_cost",
                        f"{cost} is more than the limit {limit.rate}: such a run could never start",
                        task=task_name,
                    )
        return cls(task_name, limits, cost, on_limited, adaptive)

    def call_limits(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], budget: str | None = None
    ) -> tuple[Limit, ...]:
        """The limits one call is counted against (``budget``: a separate count of them)."""
        return tuple(
            Limit(limit.render(args, kwargs), limit.rate, limit.algorithm, budget=budget)
            for limit in self.limits
        )

    def call_cost(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
        """Units one call takes.

        Raises:
            ConfigurationError: a ``rate_limit_cost`` callable returned no whole number >= 1.
        """
        cost = self.cost
        if isinstance(cost, int):
            return cost
        units = cost(tuple(args), dict(kwargs))
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            name = getattr(cost, "__qualname__", repr(cost))
            raise ConfigurationError(
                "rate_limit_cost",
                f"{name} returned {units!r}; it must return a whole number >= 1",
                task=self.task_name,
            )
        return units

    def describe(self) -> str:
        """The limits as text: ``'5/s, 50000/d'``."""
        return ", ".join(limit.describe() for limit in self.limits)


def _separate_shared_keys(task_name: str, limits: Sequence[TaskLimit]) -> tuple[TaskLimit, ...]:
    """Give limits that share a key template keys of their own, by period."""
    groups: dict[int, list[int]] = {}
    sources: list[Any] = []
    for index, limit in enumerate(limits):
        source = limit.key.source
        position = next((n for n, seen in enumerate(sources) if seen == source), None)
        if position is None:
            sources.append(source)
            position = len(sources) - 1
        groups.setdefault(position, []).append(index)
    result = list(limits)
    for members in groups.values():
        if len(members) < 2:
            continue
        periods: set[float] = set()
        for index in members:
            rate = limits[index].rate
            if not isinstance(rate, Rate):
                raise ConfigurationError(
                    f"global_rate_limit[{index}]",
                    "a callable rate needs a key of its own when several limits share one "
                    "key: give it as (rate, key)",
                    task=task_name,
                )
            if rate.period in periods:
                raise ConfigurationError(
                    f"global_rate_limit[{index}]",
                    f"two limits per {rate.period:g} s on the same key; keep the smaller one, or "
                    "give each a key of its own",
                    task=task_name,
                )
            periods.add(rate.period)
            result[index] = dataclasses.replace(limits[index], period=rate.period)
    return tuple(result)


@dataclass(frozen=True)
class TaskPolicy:
    """Everything celery_redlock does around one task."""

    task_name: str
    lock: LockPolicy | None
    singleton: SingletonPolicy | None
    rate: RatePolicy | None
    #: The per-key concurrency limit, if any.
    concurrency: ConcurrencyPolicy | None = None
    #: Time to live of the locks held while running (run lock, singleton, slot);
    #: ``None`` until :meth:`resolve` fills in ``redlock_default_ttl``.
    ttl: float | None = None
    #: ``lock_progress_timeout`` for the locks held while running.
    progress_timeout: float | None = None
    debounce: DebouncePolicy | None = None
    #: The options with an ``app.conf`` setting (see :mod:`.options`) that the
    #: task left unset: :meth:`resolve` gives them the setting's value.
    inherited: frozenset[str] = frozenset()

    @classmethod
    def from_options(
        cls, task_name: str, plan: ArgumentPlan, options: Mapping[str, Any]
    ) -> TaskPolicy:
        """Check ``options`` (a task's option values, ``None`` for unset).

        ``plan`` is the task's argument plan: key templates are checked
        against it. Raises :class:`ConfigurationError` naming the task and
        the option.
        """
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
            # A task that only asks for a singleton, a rate limit or a
            # concurrency limit does not also serialise all its runs, unless
            # it names a lock key; a debounced one is serialised per debounce
            # key (see below).
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
                # The record lives debounce + debounce_ttl: longer than a
                # key may live, the store's scripts refuse every publish.
                raise ConfigurationError(
                    "debounce" if debounce.delay >= MAX_TTL else "debounce_ttl",
                    f"debounce + debounce_ttl ({debounce.delay:.12g} + {debounce.ttl:.12g} s) "
                    f"must be at most {MAX_TTL:.12g} s (365 days), how long the record of a "
                    "publish can be kept",
                    task=task_name,
                )
            if values["lock_key"] is None:
                # Runs of one debounce key never overlap (a run still going
                # when the next burst's run is due, a re-delivered copy):
                # the run lock defaults to the debounce key's name.
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
        return (
            self.lock is not None
            or self.singleton is not None
            or self.rate is not None
            or self.concurrency is not None
            or self.debounce is not None
        )

    def resolve(self, settings: Settings) -> TaskPolicy:
        """The policy with the app's defaults filled in, checked against its settings.

        Each option in :attr:`inherited` takes its setting's value, where
        that setting is set. Every lock the task takes must live more than
        twice ``redlock_node_timeout``, or no acquisition could ever be trusted.

        Raises:
            ConfigurationError: naming the task and the option (or the
                setting whose default it uses) that is too short.
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
        shortest = 2 * settings.node_timeout
        for option, seconds in lifetimes:
            if seconds <= shortest:
                raise ConfigurationError(
                    option,
                    f"{seconds:g} s is too short for redlock_node_timeout "
                    f"({settings.node_timeout:g} s); use more than {shortest:g} s",
                    task=self.task_name,
                )
        return resolved

    def with_values(self, values: Mapping[str, Any]) -> TaskPolicy:
        """The policy with checked option values in place (a call's overrides, app defaults).

        Takes the options a call may override (see :mod:`.call_overrides`); a value
        for a feature the task does not have changes nothing.
        """
        lock, singleton, rate = self.lock, self.singleton, self.rate
        concurrency = self.concurrency
        if lock is not None:
            lock = dataclasses.replace(
                lock,
                timeout=values.get("lock_timeout", lock.timeout),
                on_busy=values.get("on_lock_busy", lock.on_busy),
                max_requeues=values.get("lock_busy_max_requeues", lock.max_requeues),
            )
        if concurrency is not None:
            # A full limit is waited for and handled as a busy lock is.
            concurrency = dataclasses.replace(
                concurrency,
                timeout=values.get("lock_timeout", concurrency.timeout),
                on_busy=values.get("on_lock_busy", concurrency.on_busy),
                max_requeues=values.get("lock_busy_max_requeues", concurrency.max_requeues),
            )
        if singleton is not None:
            singleton = dataclasses.replace(
                singleton,
                on_duplicate=values.get("on_duplicate", singleton.on_duplicate),
                ttl=values.get("singleton_ttl", singleton.ttl),
            )
        if rate is not None:
            rate = dataclasses.replace(
                rate, on_limited=values.get("on_rate_limited", rate.on_limited)
            )
        return dataclasses.replace(
            self,
            lock=lock,
            singleton=singleton,
            rate=rate,
            concurrency=concurrency,
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
