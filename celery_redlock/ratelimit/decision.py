"""What the limiter decided: a :class:`LimitDecision` per limit, summed up in a decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .limit import Resolved

__all__ = ["LimitDecision", "RateLimitDecision", "combine", "from_reply", "unchecked"]


@dataclass(frozen=True, slots=True)
class LimitDecision:
    """What one limit of a decision said.

    Attributes:
        key: the limit's key.
        algorithm: the algorithm that kept it.
        limit: units per period in force (an override's, when ``overridden``).
        period: seconds, in force.
        allowed: this limit alone would admit the hit.
        remaining: units the limit still has room for (after this hit, if counted).
        retry_after: seconds until this limit would admit the hit; ``0.0`` if it does.
        reset_after: seconds until the limit holds no state.
        overridden: an override set at run time replaced the configured rate.
        budget: the separate budget of the limit that was counted, if any.
        adapted: the adaptive law holds the rate in force under the configured one.
        paused: the key is paused (``limiter.refused``, ``limiter.pause``).
        raised: this decision found the adaptive rate one or more steps higher
            (one decision in the fleet sees each step).
    """

    key: str
    algorithm: str
    limit: int | float
    period: float
    allowed: bool
    remaining: int
    retry_after: float
    reset_after: float
    overridden: bool = False
    budget: str | None = None
    adapted: bool = False
    paused: bool = False
    raised: bool = False


@dataclass(frozen=True, slots=True)
class RateLimitDecision:
    """What the limiter decided about one hit (or, for ``peek``, would decide).

    A hit against several limits is admitted only if every limit admits it,
    and then counted in all of them; the first five fields sum the limits up.

    Attributes:
        allowed: the hit was admitted (and counted, unless it was a peek or
            ``checked`` is false).
        limit: units per period of the limit with the least room left.
        remaining: units every limit still has room for (the smallest room).
        retry_after: seconds until a hit of the same cost could be admitted by
            every limit; ``0.0`` when allowed. A good ``countdown`` for a
            retried task.
        reset_after: seconds until no limit holds state and every full limit
            is available again; ``0.0`` when none holds any now.
        limits: each limit's own decision, in the order given.
        checked: false when no Redis answered and the limiter was told to
            admit unchecked hits (``on_unavailable="allow"``): the hit was
            admitted and counted nowhere.
        node: the Redis that decided (the fallback's name after a failover);
            ``None`` when unchecked.
    """

    allowed: bool
    limit: int | float
    remaining: int
    retry_after: float
    reset_after: float
    limits: tuple[LimitDecision, ...] = ()
    checked: bool = True
    node: str | None = None

    @property
    def refused_by(self) -> tuple[LimitDecision, ...]:
        """The limits that did not admit the hit (empty when allowed)."""
        return tuple(limit for limit in self.limits if not limit.allowed)


def from_reply(reply: Any, resolved: Sequence[Resolved], node: str) -> RateLimitDecision:
    """Turn ``ratelimit_hit.lua``'s reply into a decision."""
    parts = tuple(_one(entry, limit) for entry, limit in zip(reply, resolved, strict=True))
    return combine(parts, node=node)


def combine(parts: Sequence[LimitDecision], *, node: str | None) -> RateLimitDecision:
    """One decision from each limit's: admitted only if every limit admits."""
    allowed = all(part.allowed for part in parts)
    tightest = min(parts, key=lambda part: part.remaining)
    return RateLimitDecision(
        allowed=allowed,
        limit=tightest.limit,
        remaining=tightest.remaining,
        retry_after=0.0 if allowed else max(part.retry_after for part in parts),
        reset_after=max(part.reset_after for part in parts),
        limits=tuple(parts),
        checked=True,
        node=node,
    )


def unchecked(resolved: Sequence[Resolved]) -> RateLimitDecision:
    """The decision when no Redis answered and unchecked hits are admitted."""
    parts = tuple(
        LimitDecision(
            key=limit.key,
            algorithm=limit.algorithm,
            limit=limit.rate.limit,
            period=limit.rate.period,
            allowed=True,
            remaining=limit.rate.window_limit,
            retry_after=0.0,
            reset_after=0.0,
            budget=limit.budget,
        )
        for limit in resolved
    )
    decision = combine(parts, node=None)
    return RateLimitDecision(
        allowed=True,
        limit=decision.limit,
        remaining=decision.remaining,
        retry_after=0.0,
        reset_after=0.0,
        limits=parts,
        checked=False,
        node=None,
    )


def _one(entry: Any, limit: Resolved) -> LimitDecision:
    allowed, remaining, retry_after_us, reset_after_us, limit_text, period_us_text, flags = entry
    value: int | float = limit.rate.limit
    period = limit.rate.period
    if flags & 3:
        number = float(limit_text)
        value = int(number) if number.is_integer() else number
        period = float(period_us_text) / 1e6
    return LimitDecision(
        key=limit.key,
        algorithm=limit.algorithm,
        limit=value,
        period=period,
        allowed=allowed == 1,
        remaining=int(remaining),
        retry_after=retry_after_us / 1e6,
        reset_after=reset_after_us / 1e6,
        overridden=bool(flags & 1),
        budget=limit.budget,
        adapted=bool(flags & 2),
        paused=bool(flags & 4),
        raised=bool(flags & 8),
    )
