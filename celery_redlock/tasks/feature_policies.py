"""The frozen per-feature policies of a task: run lock, concurrency, singleton, debounce, rates.

Built from the task's options by :class:`~.policies.TaskPolicy`, which holds one of each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._layout import period_key
from ..errors import ConfigurationError
from ..ratelimit import Algorithm, Limit
from ..ratelimit.algorithms import check_rate_for
from ..ratelimit.rates import DynamicRate, Rate
from .key_templates import (
    ArgumentPlan,
    KeyTemplate,
    canonical_hash,
    debounce_name,
    queued_name,
    singleton_name,
)
from .setting_checks import Cost, RateEntry

__all__ = [
    "ConcurrencyPolicy",
    "DebouncePolicy",
    "LockPolicy",
    "RatePolicy",
    "SingletonPolicy",
    "TaskLimit",
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
    """At most ``limit`` runs at once per key: a semaphore slot, waited for like the run lock."""

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
    #: Beat publishes this close together (seconds) are one tick, even after the run ended.
    beat_window: float
    #: ``"one"`` or ``"queued"`` (:mod:`.features.queued_singleton`).
    mode: str = "one"

    def name(self, task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The singleton lock name of one call (``"queued"`` mode: its running copy's)."""
        kwargs = kwargs or {}
        if self.key.source is not None:
            return singleton_name(task_name, self.key.render(args, kwargs))
        try:
            return singleton_name(task_name, canonical_hash(self.key.arguments(args, kwargs)))
        except ConfigurationError as exc:
            raise exc.with_context(task=task_name) from None

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
    #: Set when several limits share one key template: each counts on ``<key>/<period>``.
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
    """A task's global rate limits: all must admit a run, counted in one decision."""

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
