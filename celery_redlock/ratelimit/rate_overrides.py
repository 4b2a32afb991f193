"""Run-time overrides: a rate stored in Redis that replaces a limit's configured one.

``ratelimit_hit.lua`` reads a limit's override in the same call that decides
the hit, so a change reaches every worker at its next decision, with no
restart and no extra round trip. An override always expires (its ``ttl``);
set it again to keep it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._validators import seconds
from ..errors import ConfigurationError
from .rates import Rate, micros, parse_rate

__all__ = ["MAX_OVERRIDE_TTL", "RateOverride", "check_override", "override_from_reply"]

#: The longest an override lasts, seconds (366 days).
MAX_OVERRIDE_TTL = 366 * 86400.0


@dataclass(frozen=True, slots=True)
class RateOverride:
    """A rate set at run time for one limit key.

    Attributes:
        key: the limit's key.
        rate: the rate in force instead of the configured one.
        text: the rate as it was written when set.
        ttl: seconds until the override expires and the configured rate applies again.
    """

    key: str
    rate: Rate
    text: str
    ttl: float


def check_override(rate: Any, ttl: Any) -> tuple[Rate, str, int]:
    """The override's rate, its text and its ttl in ms; ConfigurationError if either is bad.

    An override must suit every algorithm, since any may use the key: its
    period is whole milliseconds (fixed windows) and it allows at most
    10,000 units per second (gcra).
    """
    parsed = parse_rate(rate, option="rate")
    if micros(parsed.period) % 1000:
        raise ConfigurationError(
            f"rate: an override's period must be whole milliseconds, got {parsed.period!r} s",
            option="rate",
        )
    if parsed.interval < 0.0001:
        raise ConfigurationError(
            f"rate: an override may allow at most 10,000 units per second, got {parsed}",
            option="rate",
        )
    try:
        ttl = seconds(ttl, "ttl", minimum=0.001, maximum=MAX_OVERRIDE_TTL)
    except ConfigurationError as exc:
        raise ConfigurationError(
            "ttl",
            f"{exc.problem} (an override lasts from 0.001 s to 366 days; set it again to "
            "keep it longer)",
        ) from None
    text = rate if isinstance(rate, str) else str(parsed)
    return parsed, text.strip()[:256], math.ceil(ttl * 1000)


def override_from_reply(key: str, fields: Any, pttl: Any) -> RateOverride | None:
    """Read ``HMGET limit period_us text`` and ``PTTL`` replies; ``None`` when there is none."""
    limit_text, period_text, text = fields
    if limit_text is None or period_text is None or not isinstance(pttl, int) or pttl < 0:
        return None
    limit = float(limit_text)
    rate = Rate(limit=int(limit) if limit.is_integer() else limit, period=float(period_text) / 1e6)
    shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(rate)
    return RateOverride(key=key, rate=rate, text=shown, ttl=pttl / 1000)
