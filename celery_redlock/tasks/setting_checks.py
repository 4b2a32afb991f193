"""One check per kind of value the Celery integration reads.

Each takes ``(value, option)``, returns the checked value or raises ``ConfigurationError``;
callers add context with ``with_context``, never their own message. ``None`` ("not set") is the
caller's to handle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import redis

from .._validators import flag, positive_int, seconds
from ..errors import ConfigurationError
from ..lock.semaphore import MAX_LIMIT as MAX_SLOTS
from ..ratelimit.algorithms import Algorithm, check_algorithm
from ..ratelimit.limit import MAX_LIMITS
from ..ratelimit.rates import DynamicRate, Rate, rate_source

__all__ = [
    "Cost",
    "RateEntry",
    "choice",
    "cost",
    "flag",
    "positive_int",
    "rate_limits",
    "redis_url",
    "redis_urls",
    "seconds",
    "slots",
    "string",
    "table",
]

_C = TypeVar("_C", bound=str)


def slots(value: Any, option: str) -> int:
    """A number of slots: a whole number from 1 to ``Redlock.semaphore``'s largest limit."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise ConfigurationError(
            option, f"expected a whole number of slots from 1 to {MAX_SLOTS}, got {value!r}"
        )
    return value


def choice(value: Any, option: str, choices: Sequence[_C]) -> _C:
    """One of ``choices``."""
    for allowed in choices:
        if value == allowed and isinstance(value, str):
            return allowed
    raise ConfigurationError(
        option, f"must be one of {', '.join(map(repr, choices))}, got {value!r}"
    )


def string(value: Any, option: str) -> str:
    """A ``str`` (empty allowed)."""
    if not isinstance(value, str):
        raise ConfigurationError(option, f"expected a string, got {value!r}")
    return value


def redis_url(value: Any, option: str) -> str | redis.Redis:
    """One Redis: a URL or a ``redis.Redis`` client (the URL is read where it connects)."""
    if not isinstance(value, str | redis.Redis):
        raise ConfigurationError(option, f"expected a Redis URL, got {value!r}")
    return value


def redis_urls(value: Any, option: str) -> tuple[str | redis.Redis, ...]:
    """A non-empty list of Redis URLs or clients; a single one is accepted too."""
    if isinstance(value, str | redis.Redis):
        return (value,)
    if not isinstance(value, list | tuple) or not value:
        raise ConfigurationError(option, f"expected a list of Redis URLs, got {value!r}")
    return tuple(value)


def table(value: Any, option: str) -> Mapping[str, Mapping[str, Any]]:
    """``{name: {option: value}}``, as ``redlock_tasks``."""
    if not isinstance(value, Mapping) or not all(
        isinstance(name, str) and isinstance(entry, Mapping) for name, entry in value.items()
    ):
        raise ConfigurationError(
            option, f"expected {{task name: {{option: value}}}}, got {value!r}"
        )
    return value


#: ``rate_limit_cost``: units per run, or a callable ``(args, kwargs) -> int``.
Cost: TypeAlias = int | Callable[[tuple[Any, ...], dict[str, Any]], int]


@dataclass(frozen=True)
class RateEntry:
    """One limit of a ``global_rate_limit``, as written; ``None`` key or algorithm: the task's."""

    rate: Rate | DynamicRate
    key: str | Callable[..., str] | None = None
    algorithm: Algorithm | None = None


_ENTRY_FIELDS = ("rate", "key", "algorithm")


def rate_limits(value: Any, option: str) -> tuple[RateEntry, ...]:
    """``global_rate_limit``: one rate, or a list of limits, each with its own key if need be.

    Accepted forms::

        "10/s"                                   # one rate (also 10, Rate(...), a callable)
        ["10/s", "50000/d"]                      # several rates, on rate_limit_key
        [("10/s", "api:{customer}"), ("1000/h", "api")]        # (rate, key)
        [("10/s", "api:{customer}", "gcra")]                   # (rate, key, algorithm)
        [{"rate": "10/s", "key": "api:{customer}"}]            # the same as mappings

    A callable rate is called with the limit's key on every run. At most 16 limits.
    """
    if isinstance(value, list | tuple):
        items = list(value)
        if not 1 <= len(items) <= MAX_LIMITS:
            raise ConfigurationError(option, f"expected 1 to {MAX_LIMITS} limits, got {len(items)}")
        return tuple(_rate_entry(item, f"{option}[{index}]") for index, item in enumerate(items))
    if isinstance(value, Mapping):
        return (_rate_entry(value, option),)
    return (RateEntry(_rate_of(value, option)),)


def _rate_entry(item: Any, where: str) -> RateEntry:
    if isinstance(item, Mapping):
        unknown = sorted(set(map(str, item)) - set(_ENTRY_FIELDS))
        if unknown or "rate" not in item:
            raise ConfigurationError(
                where,
                f"a limit is {{'rate': ..., 'key': ..., 'algorithm': ...}} ('rate' required), "
                f"got {dict(item)!r}",
            )
        parts = [item.get(name) for name in _ENTRY_FIELDS]
    elif isinstance(item, tuple | list):
        if not 1 <= len(item) <= 3:
            raise ConfigurationError(
                where, f"a limit is (rate, key) or (rate, key, algorithm), got {item!r}"
            )
        parts = [*item, None, None][:3]
    else:
        parts = [item, None, None]
    made_rate, key, algorithm = parts
    if key is not None and not callable(key) and (not isinstance(key, str) or not key):
        raise ConfigurationError(
            where,
            f"a limit's key is a non-empty template or a callable (args, kwargs) -> str, "
            f"got {key!r}",
        )
    chosen = None
    if algorithm is not None:
        try:
            chosen = check_algorithm(algorithm, where)
        except ConfigurationError as exc:
            raise ConfigurationError(where, exc.problem or str(exc)) from None
    return RateEntry(_rate_of(made_rate, where), key, chosen)


def _rate_of(value: Any, where: str) -> Rate | DynamicRate:
    if isinstance(value, tuple | list | Mapping):
        raise ConfigurationError(
            where,
            f"expected a rate such as '10/s', got {value!r}; a limit with its own key "
            "goes in a list: [('10/s', 'api:{customer}'), ('1000/h', 'api')]",
        )
    try:
        return rate_source(value, option=where)
    except ConfigurationError as exc:
        raise exc.with_context(option=where) from None


def cost(value: Any, option: str) -> Cost:
    """``rate_limit_cost``: a whole number >= 1, or a callable ``(args, kwargs) -> int``."""
    if callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            option,
            f"expected a whole number >= 1 or a callable (args, kwargs) -> int, got {value!r}",
        )
    return value
