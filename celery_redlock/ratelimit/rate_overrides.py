"""Run-time overrides: rates stored in Redis that replace a limit's configured one.

An operator's :class:`RateOverride` and a :class:`Backoff` (a pause, and an adaptive limit's
lowered rate) are read by ``ratelimit_hit.lua`` in the deciding call: every worker follows at
its next decision, with no extra round trip. The adaptive law, ceiling ``C`` per period ``P``
(the Lua scripts apply it; :func:`lowered` and :meth:`Backoff.in_force` mirror it)::

    on a refusal at t, unless t is less than P after the end of the pause
    that the last decrease set (or, without a pause, the decrease itself):
        M = min(rate in force at t, units admitted in the last window:
                sliding limits only, and only if no pause took part of it)
        low = max(FLOOR * C, DECREASE * M)
        top = max(low, min(PLATEAU * M, ceil(M) - 1))
    rate in force n whole periods after t:
        n < RECOVER:   top - (top - low) * (1 - n / RECOVER) ** 3
        n >= RECOVER:  top * (1 + PROBE * (n - RECOVER) ** 3)
    at most C, never below the hit's cost

TCP CUBIC's shape: docs/rate-limiting.md, "Adaptive rates".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._clock import to_ms
from .._layout import RateKeys
from .._scripts import load
from .._validators import seconds
from ..errors import ConfigurationError
from ..transport.nodes import Call, Command
from .algorithms import Algorithm
from .failover import Routes
from .limit import LimitLike, check_key, from_call, number_text, resolve
from .rates import Rate, micros, parse_rate

__all__ = [
    "DECREASE",
    "FLOOR",
    "MAX_OVERRIDE_TTL",
    "MAX_PAUSE",
    "PLATEAU",
    "PROBE",
    "RECOVER",
    "Backoff",
    "RateOverride",
    "clear_override",
    "get_backoff",
    "get_override",
    "lowered",
    "overrides",
    "pause",
    "refused",
    "resume",
    "set_override",
]

_SET_OVERRIDE = load("ratelimit_override")
_REFUSED = load("ratelimit_refused")
_SCAN_COUNT = 1000

#: The longest an override lasts, seconds (366 days).
MAX_OVERRIDE_TTL = 366 * 86400.0
#: The longest one pause, seconds (a day); a pause always ends.
MAX_PAUSE = 86400.0
#: A refusal sets the rate in force to this share of the rate the service refused.
DECREASE = 0.75
#: The rate in force settles at most at this share of the rate the service refused.
PLATEAU = 0.95
#: Whole periods the rate in force takes to settle there.
RECOVER = 5
#: Then each period n beyond RECOVER multiplies it by 1 + PROBE * n ** 3.
PROBE = 0.05
#: The rate in force never falls below this share of the ceiling.
FLOOR = 0.01


@dataclass(frozen=True, slots=True)
class RateOverride:
    """A rate set at run time for one limit key; ``text`` as written, ``ttl`` seconds left."""

    key: str
    rate: Rate
    text: str
    ttl: float


@dataclass(frozen=True, slots=True)
class Backoff:
    """What the service behind one limit key told the fleet: a pause and a lowered rate.

    Attributes:
        key: the limit's key.
        paused_for: seconds until hits are admitted again (``0.0``: not paused).
        learned: units per second the last decrease set; ``None`` if never lowered (or back).
        peak: units per second the service refused at that decrease.
        since: seconds since that decrease (``None`` with ``learned``).
        ttl: seconds until the backoff expires.
        lowered: the call that returned it lowered the rate in force.
    """

    key: str
    paused_for: float
    learned: float | None = None
    since: float | None = None
    ttl: float = 0.0
    lowered: bool = False
    peak: float | None = None

    def in_force(self, ceiling: Rate, cost: int = 1) -> float:
        """Units per ``ceiling.period`` in force now, under ``ceiling``."""
        if self.learned is None or self.since is None:
            return ceiling.limit
        low = self.learned * ceiling.period
        refused = low / DECREASE if self.peak is None else self.peak * ceiling.period
        top = max(low, min(PLATEAU * refused, math.ceil(refused) - 1))
        steps = math.floor(max(self.since, 0.0) / ceiling.period)
        if steps < RECOVER:
            grown = top - (top - low) * (1 - steps / RECOVER) ** 3
        else:
            grown = top * (1 + PROBE * (steps - RECOVER) ** 3)
        return min(ceiling.limit, max(cost, grown))


def lowered(ceiling: Rate, in_force: float, admitted: float | None = None) -> tuple[float, float]:
    """The rate the service refused and the rate in force after it (units per period).

    ``admitted``: what a ``sliding`` window admitted (``None`` if a pause took part of it).
    """
    refused = in_force if admitted is None or admitted <= 0 else min(in_force, admitted)
    return refused, max(FLOOR * ceiling.limit, DECREASE * refused)


# -- the operations of RateLimiter's methods of the same names, on its Redis and key layout


def set_override(routes: Routes, keys: RateKeys, key: str, rate: Any, ttl: Any) -> RateOverride:
    """Write the override on every node; ConfigurationError if ``rate`` or ``ttl`` is bad.

    Any algorithm may use the key: whole milliseconds (fixed), at most 10,000/s (gcra).
    """
    check_key(key)
    parsed = parse_rate(rate, option="rate")
    if micros(parsed.period) % 1000:
        raise ConfigurationError(
            "rate", f"an override's period must be whole milliseconds, got {parsed.period!r} s"
        )
    if parsed.interval < 0.0001:
        raise ConfigurationError(
            "rate", f"an override may allow at most 10,000 units per second, got {parsed}"
        )
    try:
        ttl = seconds(ttl, "ttl", minimum=0.001, maximum=MAX_OVERRIDE_TTL)
    except ConfigurationError as exc:
        raise ConfigurationError(
            "ttl",
            f"{exc.problem} (an override lasts from 0.001 s to 366 days; set it again to "
            "keep it longer)",
        ) from None
    text = (rate if isinstance(rate, str) else str(parsed)).strip()[:256]
    ttl_ms = to_ms(ttl)
    call = Call(
        _SET_OVERRIDE,
        (keys.override(key),),
        (number_text(parsed.limit), number_text(micros(parsed.period)), text, ttl_ms),
    )
    routes.everywhere(call, key)
    return RateOverride(key=key, rate=parsed, text=text, ttl=ttl_ms / 1000)


def clear_override(routes: Routes, keys: RateKeys, key: str) -> bool:
    """Delete the override on every node; true if one had it."""
    check_key(key)
    replies = routes.everywhere(Command(("DEL", keys.override(key))), key)
    return any(reply == 1 for reply in replies)


def get_override(routes: Routes, keys: RateKeys, key: str) -> RateOverride | None:
    """The override on the node that decides now; ``None`` when there is none."""
    check_key(key)
    name = keys.override(key)
    fields, pttl = routes.read(
        (Command(("HMGET", name, "limit", "period_us", "text")), Command(("PTTL", name))), key
    )
    limit_text, period_text, text = fields
    if limit_text is None or period_text is None or not isinstance(pttl, int) or pttl < 0:
        return None
    limit = float(limit_text)
    rate = Rate(limit=int(limit) if limit.is_integer() else limit, period=float(period_text) / 1e6)
    shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(rate)
    return RateOverride(key=key, rate=rate, text=shown, ttl=pttl / 1000)


def overrides(routes: Routes, keys: RateKeys) -> list[RateOverride]:
    """Every override on the node that decides now, found with ``SCAN``, sorted by key."""
    found: list[str] = []
    cursor = 0
    pattern = keys.override_pattern()
    while True:
        (reply,) = routes.read(
            (Command(("SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT)),), "*"
        )
        cursor, names = int(reply[0]), reply[1]
        for raw in names:
            key = keys.override_key_name(raw.decode("utf-8", "replace"))
            if key is not None:
                found.append(key)
        if cursor == 0:
            break
    result = []
    for key in sorted(set(found)):
        override = get_override(routes, keys, key)
        if override is not None:
            result.append(override)
    return result


def refused(
    routes: Routes,
    keys: RateKeys,
    limit: LimitLike,
    retry_after: float | None,
    adapt: bool,
    algorithm: Algorithm,
    margin_us: str,
) -> Backoff:
    """Pause ``limit``'s key and, with ``adapt``, lower its rate, on the node that decides now."""
    (resolved,) = resolve(from_call([limit], None, None, None), 1, algorithm)
    pause_us = -1 if retry_after is None else _pause_us(retry_after)
    call = Call(
        _REFUSED,
        (
            keys.backoff(resolved.key),
            keys.state(resolved.key, resolved.algorithm),
            keys.override(resolved.key),
        ),
        (pause_us, 1 if adapt else 0, *resolved.script_args(), margin_us),
    )
    (reply,) = routes.read((call,), resolved.key)
    paused_us, was_lowered, in_force, refused_rate = reply
    period = resolved.rate.period
    return Backoff(
        key=resolved.key,
        paused_for=paused_us / 1e6,
        learned=float(in_force) / period if was_lowered else None,
        since=0.0 if was_lowered else None,
        lowered=was_lowered == 1,
        peak=float(refused_rate) / period if was_lowered else None,
    )


def pause(routes: Routes, keys: RateKeys, key: str, duration: Any) -> Backoff:
    """Pause ``key`` for ``duration`` seconds on the node that decides now."""
    check_key(key)
    call = Call(
        _REFUSED,
        (keys.backoff(key), keys.state(key, "fixed"), keys.override(key)),
        (_pause_us(duration), 0, "fixed", 1, 1_000_000, 0),
    )
    (reply,) = routes.read((call,), key)
    return Backoff(key=key, paused_for=reply[0] / 1e6)


def resume(routes: Routes, keys: RateKeys, key: str) -> bool:
    """End the pause of ``key`` on the node that decides now; true if it was paused."""
    check_key(key)
    (removed,) = routes.read((Command(("HDEL", keys.backoff(key), "paused_until_us")),), key)
    return bool(removed)


def get_backoff(routes: Routes, keys: RateKeys, key: str) -> Backoff | None:
    """The backoff of ``key`` on the node that decides now."""
    check_key(key)
    name = keys.backoff(key)
    fields, pttl, now = routes.read(
        (
            Command(("HMGET", name, "paused_until_us", "learned", "since_us", "peak")),
            Command(("PTTL", name)),
            Command(("TIME",)),
        ),
        key,
    )
    until_text, learned_text, since_text, peak_text = fields
    if not isinstance(pttl, int) or pttl < 0 or (until_text is None and learned_text is None):
        return None
    now_us = int(now[0]) * 1e6 + int(now[1])
    paused = max(0.0, (float(until_text) - now_us) / 1e6) if until_text is not None else 0.0
    learned = float(learned_text) if learned_text is not None else None
    since = (now_us - float(since_text)) / 1e6 if since_text is not None else None
    peak = float(peak_text) if peak_text is not None else None
    return Backoff(
        key=key, paused_for=paused, learned=learned, since=since, ttl=pttl / 1000, peak=peak
    )


def _pause_us(duration: Any) -> int:
    return round(micros(seconds(duration, "retry_after", allow_zero=True, maximum=MAX_PAUSE)))
