"""Rates in Celery's syntax (``"10/s"``, ``"100/m"``, ``"1000/h"``), plus ``/d`` and ``"5/2s"``.

``"X/unit"`` means at most ⌈X⌉ in any one-unit window and X per unit on average: ``"2.5/s"``
is not 5 per 2 s (which lets 5 through within one second). Rates outside the bounds below
would overflow or lose their meaning in Redis, so they are refused, not rounded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeAlias

from ..errors import ConfigurationError

__all__ = [
    "MAX_LIMIT",
    "MAX_PERIOD",
    "MAX_RATE",
    "MIN_PERIOD",
    "DynamicRate",
    "Rate",
    "RateLike",
    "RateSpec",
    "check_rate",
    "micros",
    "parse_rate",
    "rate_problem",
    "rate_source",
]

#: Seconds in each unit a rate may name.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

#: The shortest period, seconds.
MIN_PERIOD = 0.001
#: The longest period (and the longest interval between two units), seconds: 366 days.
MAX_PERIOD = 366 * 86400.0
#: The most units one period may admit.
MAX_LIMIT = 1_000_000_000
#: The most units per second any rate may admit.
MAX_RATE = 1_000_000

_SYNTAX = '"10/s", "100/m", "1000/h", "50000/d", "5/2s", or a number of calls per second'
#: A unit, optionally preceded by how many of it make the period ("2s", "10m").
_UNIT = re.compile(r"(?P<span>\d+(?:\.\d+)?)?\s*(?P<unit>[smhd])")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` units (an ``int`` when whole) per ``period`` seconds."""

    limit: int | float
    period: float

    @property
    def window_limit(self) -> int:
        """⌈limit⌉: the most units any window of one period may hold."""
        return math.ceil(self.limit)

    @property
    def whole(self) -> bool:
        """Whether ``limit`` is a whole number."""
        return float(self.limit).is_integer()

    @property
    def interval(self) -> float:
        """Seconds per unit at the long-run rate: ``period / limit``."""
        return self.period / self.limit

    def __str__(self) -> str:
        count = f"{self.limit:.12g}"
        for unit, seconds in UNITS.items():
            if self.period == seconds:
                return f"{count}/{unit}"
        return f"{count}/{self.period:.12g}s"


#: What a rate may be written as.
RateLike: TypeAlias = Rate | str | int | float
#: A rate, or a callable that returns one for a limit's key (or one already wrapped).
RateSpec: TypeAlias = "RateLike | Callable[[str], RateLike] | DynamicRate"


def parse_rate(value: Any, option: str = "global_rate_limit") -> Rate:
    """Read a rate written the way Celery's ``rate_limit`` is, plus ``/d`` and a period count.

    ``"10"``, ``10`` and ``"10/s"`` are 10 per second; ``"5/2s"`` is 5 per 2 s. Bad values
    raise :class:`~celery_redlock.errors.ConfigurationError` naming ``option``.

    Example::

        >>> parse_rate("100/m")
        Rate(limit=100, period=60.0)
    """
    if isinstance(value, Rate):
        check_rate(value, option)
        return value
    if isinstance(value, str):
        count_text, _, unit_text = value.strip().partition("/")
        unit = _UNIT.fullmatch(unit_text.strip() or "s")
        if unit is None:
            raise ConfigurationError(
                option, f"{value!r} has an unknown unit {unit_text.strip()!r}; expected {_SYNTAX}"
            )
        try:
            count = Fraction(count_text.strip())
        except (ValueError, ZeroDivisionError):
            raise ConfigurationError(
                option, f"{value!r} is not a rate; expected {_SYNTAX}"
            ) from None
        span = Fraction(unit["span"] or 1)
        if span <= 0:
            raise ConfigurationError(option, f"{value!r} has a period of zero; expected {_SYNTAX}")
        period = float(span * UNITS[unit["unit"]])
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigurationError(option, f"{value!r} is not a rate; expected {_SYNTAX}")
        count, period = Fraction(value), 1.0
    else:
        raise ConfigurationError(option, f"expected a rate such as {_SYNTAX}, got {value!r}")
    if count <= 0:
        raise ConfigurationError(
            option,
            f"{value!r} allows no calls; a rate must be positive. To remove the "
            "limit, leave the option unset",
        )
    if count > MAX_LIMIT:
        raise ConfigurationError(
            option, f"{value!r} admits more than {MAX_LIMIT:,} units per period"
        )
    limit: int | float = int(count) if count.denominator == 1 else float(count)
    rate = Rate(limit=limit, period=period)
    check_rate(rate, option, text=value)
    return rate


def check_rate(rate: Rate, option: str, *, text: Any = None) -> None:
    """Raise ConfigurationError naming ``option`` unless ``rate`` is within the bounds."""
    problem = rate_problem(rate, text)
    if problem is not None:
        raise ConfigurationError(option, problem[1])


def rate_problem(rate: Rate, text: Any = None) -> tuple[str, str] | None:
    """What is wrong with ``rate`` (written as ``text``): ``("limit" or "period", problem)``."""
    shown = repr(text if text is not None else str(rate))
    limit, period = rate.limit, rate.period
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not math.isfinite(limit)
        or limit <= 0
    ):
        return "limit", f"expected a number of units > 0, got {limit!r}"
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or not math.isfinite(period)
        or not MIN_PERIOD <= period <= MAX_PERIOD
    ):
        return "period", (
            f"expected a period between {MIN_PERIOD} s and {MAX_PERIOD:.0f} s (366 days), "
            f"got {period!r}"
        )
    if math.ceil(limit) > MAX_LIMIT:
        return "limit", f"{shown} admits more than {MAX_LIMIT:,} units per period"
    if limit / period > MAX_RATE:
        return "limit", (
            f"{shown} is more than {MAX_RATE:,} units per second; count in larger units "
            "(a cost per call) instead"
        )
    if period / limit > MAX_PERIOD:
        return "limit", (
            f"{shown} is less than one unit per 366 days, longer than any limit can remember"
        )
    return None


@lru_cache(maxsize=1024)
def micros(seconds: float) -> float:
    """``seconds`` in microseconds from the printed decimal: ``0.0025`` is exactly ``2500.0``."""
    return float(Fraction(repr(float(seconds))) * 1_000_000)


class DynamicRate:
    """A rate computed on every decision by ``function(key)``, checked like a configured one."""

    __slots__ = ("function", "option")

    def __init__(self, function: Callable[[str], RateLike], option: str) -> None:
        self.function = function
        self.option = option

    def resolve(self, key: str) -> Rate:
        """The rate for ``key`` now."""
        name = getattr(self.function, "__qualname__", repr(self.function))
        return parse_rate(self.function(key), option=f"{self.option} (returned by {name})")

    def __repr__(self) -> str:
        return f"DynamicRate({self.function!r})"


def rate_source(value: Any, option: str = "global_rate_limit") -> Rate | DynamicRate:
    """A fixed rate, checked now, or a callable rate, checked each time it is called.

    Example::

        plans = {"acme": "100/s", "small": "5/s"}
        rate_source(lambda key: plans[key.split(":")[1]])
    """
    if isinstance(value, DynamicRate):
        return value
    if callable(value) and not isinstance(value, Rate):
        return DynamicRate(value, option)
    return parse_rate(value, option)
