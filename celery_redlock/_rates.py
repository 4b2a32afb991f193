"""Rates in Celery's syntax: ``"10/s"``, ``"100/m"``, ``"1000/h"``, or a number per second."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .errors import ConfigurationError

__all__ = ["Rate", "parse_rate"]

#: Seconds in each unit Celery's ``rate_limit`` accepts.
_UNITS = {"s": 1, "m": 60, "h": 3600}

_SYNTAX = '"10/s", "100/m", "1000/h", or a number of calls per second'


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` calls per ``period`` seconds."""

    limit: int
    period: float

    def __str__(self) -> str:
        return f"{self.limit}/{self.period:g}s"


def parse_rate(value: Any, option: str = "global_rate_limit") -> Rate:
    """Read a rate written the way Celery's ``rate_limit`` is.

    ``"100/m"`` is 100 calls per 60 s, ``"10"``, ``10`` and ``"10/s"`` are 10
    per second. A fractional count becomes a whole number of calls over a
    longer period, exactly: ``"0.5/m"`` is 1 call per 120 s, ``"2.5/s"`` is 5
    per 2 s. Bad values raise :class:`~celery_redlock.errors.ConfigurationError`
    naming ``option``.

    Example::

        >>> parse_rate("100/m")
        Rate(limit=100, period=60.0)
    """
    if isinstance(value, Rate):
        return value
    if isinstance(value, str):
        count_text, _, unit = value.strip().partition("/")
        unit = unit.strip() or "s"
        if unit not in _UNITS:
            raise ConfigurationError(
                f"{option}: {value!r} has an unknown unit {unit!r}; expected {_SYNTAX}",
                option=option,
            )
        try:
            count = Fraction(count_text.strip())
        except ValueError:
            raise ConfigurationError(
                f"{option}: {value!r} is not a rate; expected {_SYNTAX}", option=option
            ) from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigurationError(
                f"{option}: {value!r} is not a rate; expected {_SYNTAX}", option=option
            )
        # repr() keeps 0.1 as 1/10, not the binary fraction Fraction(0.1) would give.
        count, unit = Fraction(repr(value)), "s"
    else:
        raise ConfigurationError(
            f"{option}: expected a rate such as {_SYNTAX}, got {value!r}", option=option
        )
    if count <= 0:
        raise ConfigurationError(
            f"{option}: {value!r} allows no calls; a rate must be positive. To remove the "
            "limit, leave the option unset",
            option=option,
        )
    return Rate(limit=count.numerator, period=float(_UNITS[unit] * count.denominator))
