"""A global per-key rate limiter: one atomic Lua script, one round trip per decision.

Every worker asks the same Redis, so a limit holds across all of them (Celery's ``rate_limit``
is per worker). ``"X/period"`` admits at most ⌈X⌉ units in any one-period window and X per
period in the long run. ``"sliding"`` (default) allows bursts up to the limit; ``"gcra"``
spaces units evenly; ``"fixed"`` is cheapest but admits up to **twice the limit** across a
window's edge. Timeline of a limit of 3 per 10 s, hits of cost 1 at t = 0, 1, 2, 9 and 10.5::

    sliding:  0 ✓  1 ✓  2 ✓  9 ✗ (retry_after 1.0)  10.5 ✓ (the t=0 unit left)
    gcra:     0 ✓  1 ✗ (retry_after 2.33)  2 ✗  9 ✓  10.5 ✗ (next slot at 12.33)
    fixed:    0 ✓  1 ✓  2 ✓  9 ✗ (retry_after 1.0)  10.5 ✓ (new window)

A hit naming several limits is admitted only if all admit it, and counted in all in the same
call. Costs, memory and guarantees of each algorithm: docs/rate-limiting.md, "The algorithms".
"""

from __future__ import annotations

from .algorithms import ALGORITHMS, DEFAULT_ALGORITHM, Algorithm
from .decision import LimitDecision, RateLimitDecision
from .failover import NodeStatus
from .limit import Limit
from .limiter import OnUnavailable, RateLimiter
from .rate_overrides import Backoff, RateOverride

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "Algorithm",
    "Backoff",
    "Limit",
    "LimitDecision",
    "NodeStatus",
    "OnUnavailable",
    "RateLimitDecision",
    "RateLimiter",
    "RateOverride",
]
