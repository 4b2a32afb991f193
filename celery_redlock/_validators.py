"""One check per kind of value, each raising a ``ConfigurationError`` naming the option.

The bounds are those the Lua scripts accept, so a value Redis would refuse is refused when the
lock is built, never later as a node failure. The limiter and the Celery options use them too.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "MAX_NODE_TIMEOUT",
    "MAX_TTL",
    "MIN_FENCE_TTL",
    "MIN_NODE_TIMEOUT",
    "check_ttl",
    "flag",
    "fraction",
    "positive_int",
    "seconds",
    "text",
]

#: Longest lock ttl (and fence_ttl), seconds: one year.
MAX_TTL = 365 * 24 * 3600.0
#: Shortest fence_ttl, seconds: an expired bucket reads as the node's clock, past every value
#: it held while node clocks differ by less (docs/reliability.md, "Fencing tokens").
MIN_FENCE_TTL = 3600.0
#: Shortest node_timeout, seconds: a round trip to Redis takes longer.
MIN_NODE_TIMEOUT = 0.001
#: Longest node_timeout, seconds.
MAX_NODE_TIMEOUT = 60.0


def seconds(
    value: Any,
    option: str,
    *,
    allow_zero: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """``value`` as a finite number of seconds > 0 (>= 0 with ``allow_zero``), within bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(option, f"expected a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(option, f"must be {bound} seconds, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigurationError(option, f"must be at least {minimum:.12g} seconds, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigurationError(option, f"must be at most {maximum:.12g} seconds, got {value!r}")
    return float(value)


def check_ttl(
    ttl: float,
    node_timeout: float,
    option: str,
    *,
    timeout_option: str = "node_timeout",
    task: str | None = None,
) -> float:
    """``ttl`` (seconds) if above twice ``node_timeout``: no shorter lock could be trusted."""
    if ttl <= 2 * node_timeout:
        problem = f"{ttl:g} s is too short for {timeout_option} ({node_timeout:g} s)"
        raise ConfigurationError(
            option, f"{problem}; use more than {2 * node_timeout:g} s", task=task
        )
    return ttl


def flag(value: Any, option: str) -> bool:
    """``True`` or ``False``, nothing that merely converts to one."""
    if not isinstance(value, bool):
        raise ConfigurationError(option, f"must be True or False, got {value!r}")
    return value


def positive_int(value: Any, option: str) -> int:
    """A whole number ``>= 1`` (``True`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(option, f"expected a whole number >= 1, got {value!r}")
    return value


def fraction(value: Any, option: str, *, below: float) -> float:
    """``value`` as a real number in ``[0, below)`` (a bool is not a number)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < below
        or not math.isfinite(value)
    ):
        raise ConfigurationError(option, f"expected a fraction in [0, {below:g}), got {value!r}")
    return float(value)


def text(value: Any, option: str, *, empty: bool = True) -> str:
    """``value`` as a string that has a UTF-8 form (Redis keys and values are bytes)."""
    if not isinstance(value, str) or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise ConfigurationError(option, f"expected {kind}, got {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            option, f"{value[:80]!r} has no UTF-8 form ({exc.reason}); Redis stores bytes"
        ) from exc
    return value
