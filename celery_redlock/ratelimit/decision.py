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
        limit: units per period in force, and ``period`` (seconds): an override's if
            ``overridden``.
        remaining: room left (after this hit, if counted).
        retry_after: seconds until this limit would admit the hit; ``0.0`` if it does.
        reset_after: seconds until the limit holds no state.
        budget: the separate budget that was counted, if any.
        adapted: the adaptive law holds the rate under the configured one.
        paused: the key is paused (``limiter.refused``, ``limiter.pause``).
        raised: this decision found the adaptive rate raised (one decision sees each step).
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

    Admitted only if every limit admits; the first five fields sum the limits up.

    Attributes:
        allowed: admitted (and counted, unless a peek or not ``checked``).
        limit: units per period of the limit with the least room left.
        remaining: the smallest room left among the limits.
        retry_after: seconds until every limit could admit a hit of this cost; ``0.0`` when
            allowed. A good ``countdown`` for a retried task.
        reset_after: seconds until no limit holds state; ``0.0`` when none does.
        limits: each limit's own decision, in the order given.
        checked: false when no Redis answered and ``on_unavailable="allow"`` admitted the hit
            uncounted.
        node: the Redis that decided (the fallback after a failover); ``None`` if unchecked.
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
