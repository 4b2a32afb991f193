"""Limits as a hit names them: a key, a rate (or a function giving one) and an algorithm.

Every form ``hit`` accepts becomes :class:`Limit` objects here, checked before anything is sent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias

from ..errors import ConfigurationError
from .algorithms import ALGORITHMS, Algorithm, check_algorithm, check_rate_for, rate_problem_for
from .rates import DynamicRate, Rate, RateSpec, micros, rate_problem, rate_source

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_LIMITS",
    "Limit",
    "LimitLike",
    "Resolved",
    "check_budget",
    "check_key",
    "from_call",
    "number_text",
    "resolve",
]

#: The most limits one decision may check.
MAX_LIMITS = 16
#: The longest key, in UTF-8 bytes.
MAX_KEY_BYTES = 1024
#: What a budget's name may be: short, plain, and no algorithm's name.
_BUDGET = re.compile(r"[a-z][a-z0-9_-]{0,31}")


class Limit:
    """One limit: ``rate`` on ``key``, kept by ``algorithm`` (the limiter's default if None).

    ``rate``: ``"10/s"``, ``"2.5/m"``, a :class:`Rate`, a number per second, or a callable
    ``rate(key)`` evaluated on every decision. ``budget`` counts units apart from the limit's
    own under the same rate and override (tasks count beat's publishes in ``"publish"``).

    Example::

        Limit("api:acme", "10/s")
        Limit("global", "50000/d", algorithm="fixed")
        Limit("api:acme", lambda key: plans[key.split(":")[1]])
        Limit("api:acme", "10/s", budget="publish")
    """

    __slots__ = ("algorithm", "budget", "key", "rate")

    key: str
    rate: Rate | DynamicRate
    algorithm: Algorithm | None
    budget: str | None

    def __init__(
        self,
        key: str,
        rate: RateSpec,
        algorithm: Algorithm | None = None,
        *,
        budget: str | None = None,
    ) -> None:
        check_key(key)
        made = rate_source(rate, option="rate")
        chosen = None if algorithm is None else check_algorithm(algorithm)
        if isinstance(made, Rate) and chosen is not None:
            check_rate_for(made, chosen, option="rate")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "rate", made)
        object.__setattr__(self, "algorithm", chosen)
        object.__setattr__(self, "budget", None if budget is None else check_budget(budget))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Limit is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Limit):
            return NotImplemented
        return (self.key, self.rate, self.algorithm, self.budget) == (
            other.key,
            other.rate,
            other.algorithm,
            other.budget,
        )

    def __hash__(self) -> int:
        return hash((self.key, self.algorithm, self.budget))

    def __repr__(self) -> str:
        algorithm = "" if self.algorithm is None else f", {self.algorithm!r}"
        budget = "" if self.budget is None else f", budget={self.budget!r}"
        rate = str(self.rate) if isinstance(self.rate, Rate) else repr(self.rate)
        return f"Limit({self.key!r}, {rate!r}{algorithm}{budget})"


#: A limit as ``hit`` accepts it in a list.
LimitLike: TypeAlias = Limit | tuple[str, RateSpec] | tuple[str, RateSpec, Algorithm | None]


@dataclass(frozen=True, slots=True)
class Resolved:
    """One limit of one decision: its key, the rate in force for this call, its algorithm."""

    key: str
    rate: Rate
    algorithm: Algorithm
    budget: str | None = None

    def script_args(self) -> tuple[str, str, str]:
        """``algorithm, limit, period_us`` as ``ratelimit_hit.lua`` reads them."""
        return (self.algorithm, number_text(self.rate.limit), number_text(micros(self.rate.period)))


def check_key(key: Any, option: str = "key") -> None:
    """Raise ConfigurationError unless ``key`` is a non-empty, valid UTF-8 string of ≤ 1 KiB."""
    if not isinstance(key, str) or not key:
        raise ConfigurationError(option, f"expected a non-empty string, got {key!r}")
    try:
        size = len(key.encode())
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            option,
            f"{key!r} is not valid UTF-8 text ({exc.reason} at position "
            f"{exc.start}); Redis keys are written as UTF-8",
        ) from None
    if size > MAX_KEY_BYTES:
        raise ConfigurationError(
            option, f"{key[:40]!r}… is {size} bytes of UTF-8; at most {MAX_KEY_BYTES}"
        )


def check_budget(budget: Any, option: str = "budget") -> str:
    """``budget`` if it is a budget's name, else ConfigurationError naming ``option``."""
    if (
        not isinstance(budget, str)
        or not _BUDGET.fullmatch(budget)
        or budget in ALGORITHMS
        or budget == "override"
    ):
        raise ConfigurationError(
            option,
            "expected a short lowercase name (letters, digits, '-', '_'; not an "
            f"algorithm's name), got {budget!r}",
        )
    return budget


def from_call(
    key_or_limits: Any, limit: Any, period: Any, algorithm: Algorithm | None
) -> tuple[Limit, ...]:
    """The limits named by ``hit``'s arguments, in any of its forms."""
    chosen = None if algorithm is None else check_algorithm(algorithm)
    if isinstance(key_or_limits, bytes | bytearray):
        check_key(key_or_limits)
    if isinstance(key_or_limits, str):
        check_key(key_or_limits)
        if period is not None:
            rate = _old_form_rate(limit, period)
            if chosen is not None:
                _check_for(rate, chosen)
            return (_trusted(key_or_limits, rate, chosen),)
        if limit is None:
            raise ConfigurationError(
                "limit", "expected a rate such as '100/m', or a limit with a period in seconds"
            )
        if isinstance(limit, int | float) and not isinstance(limit, bool):
            raise ConfigurationError(
                "period",
                f"a limit of {limit!r} needs a period in seconds (or give a rate "
                f"such as '{limit}/s')",
            )
        return (Limit(key_or_limits, limit, chosen),)
    if limit is not None or period is not None:
        raise ConfigurationError(
            "limit",
            "give limit and period only with a single key; a list of limits carries its own rates",
        )
    if isinstance(key_or_limits, Limit):
        items: Sequence[Any] = (key_or_limits,)
    elif isinstance(key_or_limits, Sequence):
        items = key_or_limits
    else:
        raise ConfigurationError(
            "limits",
            "expected a key, a Limit, or a list of Limit objects and (key, rate) "
            f"pairs, got {key_or_limits!r}",
        )
    if not 1 <= len(items) <= MAX_LIMITS:
        raise ConfigurationError("limits", f"expected 1 to {MAX_LIMITS} limits, got {len(items)}")
    made = []
    for item in items:
        if isinstance(item, Limit):
            one = item
        elif isinstance(item, tuple) and len(item) in (2, 3):
            one = Limit(*item)
        else:
            raise ConfigurationError(
                "limits", f"expected a Limit or a (key, rate[, algorithm]) tuple, got {item!r}"
            )
        if one.algorithm is None and chosen is not None:
            one = _trusted(one.key, one.rate, chosen, one.budget)
        made.append(one)
    return tuple(made)


def resolve(limits: Sequence[Limit], cost: int, default: Algorithm) -> tuple[Resolved, ...]:
    """Each limit's rate for this call (callables evaluated), checked against ``cost``."""
    resolved = []
    keys = set()
    for limit in limits:
        if limit.key in keys:
            raise ConfigurationError(
                "limits",
                f"key {limit.key!r} is named twice; one decision checks each key once "
                "(a limit's budgets included)",
            )
        keys.add(limit.key)
        algorithm = limit.algorithm or default
        if isinstance(limit.rate, Rate):
            rate = limit.rate
            if limit.algorithm is None:
                _check_for(rate, algorithm)
        else:
            rate = limit.rate.resolve(limit.key)
            check_rate_for(rate, algorithm, option=limit.rate.option)
        if cost > rate.window_limit:
            raise ConfigurationError(
                "cost",
                f"{cost} is more than the limit of {rate.window_limit} on {limit.key!r}; "
                "such a hit could never be admitted",
            )
        resolved.append(Resolved(limit.key, rate, algorithm, limit.budget))
    return tuple(resolved)


def _trusted(
    key: str, rate: Rate | DynamicRate, algorithm: Algorithm | None, budget: str | None = None
) -> Limit:
    """A Limit from parts already checked."""
    made = object.__new__(Limit)
    object.__setattr__(made, "key", key)
    object.__setattr__(made, "rate", rate)
    object.__setattr__(made, "algorithm", algorithm)
    object.__setattr__(made, "budget", budget)
    if isinstance(rate, Rate) and algorithm is not None:
        _check_for(rate, algorithm)
    return made


def _old_form_rate(limit: Any, period: Any) -> Rate:
    """``hit(key, limit, period)``: each argument checked and named on its own."""
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not math.isfinite(limit)
        or limit <= 0
    ):
        raise ConfigurationError("limit", f"expected a number of units > 0, got {limit!r}")
    if isinstance(period, bool) or not isinstance(period, int | float):
        raise ConfigurationError("period", f"expected a number of seconds, got {period!r}")
    rate = Rate(limit=int(limit) if float(limit).is_integer() else limit, period=float(period))
    _raise_named(rate_problem(rate))
    return rate


def _raise_named(problem: tuple[str, str] | None) -> None:
    """Raise a problem of the old form, naming the argument at fault."""
    if problem is not None:
        option, text = problem
        raise ConfigurationError(option, text)


@lru_cache(maxsize=1024)
def _check_for(rate: Rate, algorithm: Algorithm) -> None:
    """The algorithm's own bounds, naming ``limit`` or ``period``; cached (rates repeat)."""
    _raise_named(rate_problem_for(rate, algorithm))


@lru_cache(maxsize=4096)
def number_text(value: float) -> str:
    """A number as text Lua's ``tonumber`` reads back exactly."""
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return repr(value)
