"""A global per-key rate limiter: one atomic Lua script, one round trip per decision.

Every worker process asks the same Redis, so a limit holds across all of
them, unlike Celery's own ``rate_limit``, a token bucket per worker. A rate
``"X/period"`` admits at most ⌈X⌉ units in any window of one period (except
``fixed``, below) and X per period over a long run. Three algorithms, chosen
per limiter or per limit:

``"sliding"`` (default) -- a sliding window log. No window of one period
    ever holds more than the limit, whatever the costs of the hits; bursts up
    to the limit are admitted at once. Admitted units are logged per bucket
    of ``period / 1000``, each counted until its bucket's end plus the period
    (so a unit may be held up to 0.1 % of the period longer than needed).
    Memory per key: one sorted-set member per bucket that admitted something,
    at most 1,001 in a window. Work per decision: O(log n) in those members
    (a refused hit's ``retry_after`` takes a binary search, O(log² n)).

``"gcra"`` -- even spacing (the generic cell rate algorithm without burst):
    units are admitted one ``period / limit`` apart, so no window of one
    period holds more than ⌈limit⌉ and the long-run rate is exact, fractions
    included. One timestamp per key, O(1) work. No burst: work queued at once
    is spread out, and a slot nobody claims in time is lost. A hit of cost
    ``c`` waits until ``c - 1`` slots past its turn, which keeps the bound
    for mixed costs but runs back-to-back heavy hits at ``c / (2c - 1)`` of
    the rate; use ``sliding`` for weighted costs.

``"fixed"`` -- a counter per window (``INCRBY``, ``PEXPIRE`` when new): the
    window opens with the key's first hit and lasts one period. The smallest
    and fastest, but a burst at the end of one window and another at the
    start of the next admit up to **twice the limit** within one period.
    Periods are whole milliseconds.

A fractional limit under ``sliding`` or ``fixed`` (``"2.5/s"``) admits ⌈X⌉
per window and, through a second key holding a pace (a token bucket of ⌈X⌉
refilled at X per period), X per period on average.

Timeline of a limit of 3 per 10 s, hits of cost 1 at t = 0, 1, 2, 9 and 10.5::

    sliding:  0 ✓  1 ✓  2 ✓  9 ✗ (retry_after 1.0)  10.5 ✓ (the t=0 unit left)
    gcra:     0 ✓  1 ✗ (retry_after 2.33)  2 ✗  9 ✓  10.5 ✗ (next slot at 12.33)
    fixed:    0 ✓  1 ✓  2 ✓  9 ✗ (retry_after 1.0)  10.5 ✓ (new window)

A hit may name several limits (a per-tenant and a global one): it is
admitted only if all admit it, and counted in all of them in the same script
call, so a refusal never spends a unit anywhere. A limit's rate can be
changed at run time with :meth:`RateLimiter.set_override`, read by that same
call. See ``docs/rate-limiting.md`` for the guarantees side by side with
Celery's ``rate_limit`` and the ``limits`` package, and measured costs.
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
