"""The adaptive rate law (celery_redlock.ratelimit.rate_overrides), on a fake clock."""

from __future__ import annotations

import math
from collections import deque

import pytest

from celery_redlock.ratelimit.rate_overrides import (
    DECREASE,
    FLOOR,
    PLATEAU,
    PROBE,
    RECOVER,
    Backoff,
    lowered,
)
from celery_redlock.ratelimit.rates import Rate

CEILING = Rate(40, 1.0)


def learned_at(low: float, refused: float, since: float) -> Backoff:
    """The backoff of a key lowered to ``low`` from ``refused`` per period ``since`` s ago."""
    return Backoff(key="k", paused_for=0.0, learned=low / CEILING.period, since=since, peak=refused)


def test_a_refusal_lowers_what_was_admitted_not_the_ceiling():
    assert lowered(CEILING, in_force=40, admitted=10) == (10, DECREASE * 10)
    assert lowered(CEILING, in_force=6, admitted=10) == (6, DECREASE * 6)
    assert lowered(CEILING, in_force=40) == (40, DECREASE * 40)  # gcra, fixed, or a pause
    assert lowered(CEILING, in_force=0.1, admitted=0.1) == (0.1, FLOOR * 40)


def test_the_rate_settles_just_under_what_was_refused_then_probes_beyond():
    at = lambda n, low=7.5, refused=10.0: learned_at(low, refused, n).in_force(CEILING)  # noqa: E731
    assert at(0) == at(0.99) == 7.5
    # back to 9 (one unit under the 10 refused, below 95 % of it) in RECOVER periods
    assert at(1) == pytest.approx(9 - 1.5 * (1 - 1 / RECOVER) ** 3)
    assert at(RECOVER - 1) < at(RECOVER) == 9
    # slowly beyond it at first, fast far beyond: 9 * (1 + PROBE * n^3)
    assert at(RECOVER + 1) == pytest.approx(9 * (1 + PROBE))
    assert at(RECOVER + 3) == pytest.approx(9 * (1 + PROBE * 27))
    assert at(1e6) == 40
    # a high rate settles at PLATEAU of what was refused
    high = learned_at(750, refused=1000, since=RECOVER)
    assert high.in_force(Rate(2000, 1.0)) == pytest.approx(PLATEAU * 1000)
    assert learned_at(0.4, 0.5, 0.0).in_force(CEILING, cost=3) == 3
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
    paused_until = -math.inf
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
            rate = Backoff("k", 0.0, backoff.learned, since, peak=backoff.peak).in_force(CEILING)
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
            refused, new = lowered(CEILING, rate, admitted=admitted)
            backoff = Backoff("k", 0.0, new / CEILING.period, 0.0, peak=refused / CEILING.period)
            lowered_at = now
            calm = paused_until + CEILING.period
    return calls


def share(calls, start, end):
    inside = [ok for at, ok in calls if start <= at < end]
    return sum(inside) / (end - start), 1 - sum(inside) / max(len(inside), 1)


def test_the_law_finds_a_hidden_limit_under_a_far_higher_ceiling():
    # the targets: 75 % of the hidden limit with at most 5 % refused at 8/s,
    # at most 10 % at 4/s, and 75 % of 8/s again within 12 s of its return
    calls = simulate(lambda t: 8 if t < 20 or t >= 32 else 4)
    rate, refused = share(calls, 6, 20)
    assert rate >= 0.75 * 8
    assert refused <= 0.05
    rate, refused = share(calls, 24, 32)
    assert rate >= 0.75 * 4
    assert refused <= 0.1
    rate, _ = share(calls, 36, 44)
    assert rate >= 0.75 * 8
