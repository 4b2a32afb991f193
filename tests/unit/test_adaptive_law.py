"""The adaptive rate law (celery_redlock.ratelimit.rate_overrides), on a fake clock."""

from __future__ import annotations

import math
from collections import deque

import pytest

from celery_redlock.ratelimit.rate_overrides import DECREASE, FLOOR, INCREASE, Backoff, lowered
from celery_redlock.ratelimit.rates import Rate

CEILING = Rate(40, 1.0)


def learned_at(rate: float, since: float) -> Backoff:
    """The backoff of a key lowered to ``rate`` per period ``since`` seconds ago."""
    return Backoff(key="k", paused_for=0.0, learned=rate / CEILING.period, since=since)


def test_a_refusal_lowers_what_was_admitted_not_the_ceiling():
    assert lowered(CEILING, in_force=40, admitted=10) == DECREASE * 10
    assert lowered(CEILING, in_force=6, admitted=10) == DECREASE * 6
    assert lowered(CEILING, in_force=40) == DECREASE * 40  # gcra, fixed: admitted unknown
    assert lowered(CEILING, in_force=0.1, admitted=0.1) == FLOOR * 40


def test_the_rate_climbs_one_step_per_whole_period_up_to_the_ceiling():
    assert learned_at(7.5, since=0.0).in_force(CEILING) == 7.5
    assert learned_at(7.5, since=0.99).in_force(CEILING) == 7.5
    assert learned_at(7.5, since=1.0).in_force(CEILING) == pytest.approx(7.5 + INCREASE * 40)
    assert learned_at(7.5, since=10.5).in_force(CEILING) == pytest.approx(7.5 + 10 * 0.4)
    assert learned_at(7.5, since=1e6).in_force(CEILING) == 40
    assert learned_at(0.4, since=0.0).in_force(CEILING, cost=3) == 3
    assert Backoff(key="k", paused_for=2.0).in_force(CEILING) == 40


def simulate(hidden, seconds=44.0, offered=10.0, margin=0.05):
    """Calls offered at ``offered``/s against an API allowing ``hidden(t)`` per second.

    A fake clock: calls start when the sliding window in force has room,
    as ratelimit_hit.lua admits them; a refusal pauses until the API's
    window has room (its Retry-After) and lowers the rate by the law.
    Returns ``(time, admitted by the API)`` per call.
    """
    backoff: Backoff | None = None
    lowered_at = calm = -math.inf
    paused_until = 0.0
    ours: deque[float] = deque()
    api: deque[float] = deque()
    calls = []
    waiting = deque(i / offered for i in range(int(seconds * offered)))
    now = 0.0
    while waiting and now < seconds:
        now = max(now, waiting[0], paused_until)
        since = now - lowered_at
        rate = CEILING.limit
        if backoff is not None:
            rate = Backoff("k", 0.0, backoff.learned, since).in_force(CEILING)
        window = CEILING.period + margin
        while ours and ours[0] <= now - window:
            ours.popleft()
        if len(ours) + 1 > rate:
            now = ours[0] + window + 1e-6
            continue
        waiting.popleft()
        ours.append(now)
        while api and api[0] <= now - 1.0:
            api.popleft()
        if len(api) < hidden(now):
            api.append(now)
            calls.append((now, True))
            continue
        calls.append((now, False))
        clean = paused_until <= now - window  # no pause took part of the window
        paused_until = max(paused_until, api[0] + 1.0)
        waiting.appendleft(paused_until)
        if now >= calm:  # one period after the pause of the last decrease
            admitted = len(ours) * CEILING.period / window if clean else None
            new = lowered(CEILING, rate, admitted=admitted)
            backoff, lowered_at = Backoff("k", 0.0, new / CEILING.period, 0.0), now
            calm = paused_until + CEILING.period
    return calls


def share(calls, start, end):
    inside = [ok for at, ok in calls if start <= at < end]
    return sum(inside) / (end - start), 1 - sum(inside) / max(len(inside), 1)


def test_the_law_finds_a_hidden_limit_under_a_far_higher_ceiling():
    calls = simulate(lambda t: 8 if t < 20 or t >= 32 else 4)
    rate, refused = share(calls, 6, 20)
    assert rate >= 0.75 * 8
    assert refused <= 0.05
    rate, refused = share(calls, 24, 32)
    assert rate >= 0.7 * 4
    assert refused <= 0.15
    rate, _ = share(calls, 36, 44)  # back at 8/s: within about 4 s of the change
    assert rate >= 0.75 * 8
