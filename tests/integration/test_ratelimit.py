"""The rate limiter against real redis-server processes, from many processes at once."""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing
import random
import re
import threading
import time

import pytest
import redis

from celery_redlock import RateLimitDecision, RateLimiter, errors
from celery_redlock._layout import RateKeys
from celery_redlock._scripts import load
from celery_redlock.ratelimit import Limit
from celery_redlock.ratelimit.rates import MAX_LIMIT, Rate, parse_rate

pytestmark = pytest.mark.integration

ALGORITHMS = [
    pytest.param("sliding", id="sliding"),
    pytest.param("gcra", id="gcra"),
    pytest.param("fixed", id="fixed"),
]
#: Run a test under each algorithm: ``def test_x(algorithm): ...``
each_algorithm = pytest.mark.parametrize("algorithm", ALGORITHMS)
#: The algorithms that never admit more than the limit in a window of one period.
each_exact_algorithm = pytest.mark.parametrize("algorithm", ALGORITHMS[:2])

PROCESSES = 16
HITS = 200
#: Server-side time no decision may take, microseconds.
BLOCKING_BUDGET_US = 5000


@pytest.fixture
def limiter(servers):
    made = RateLimiter(servers[0].url)
    yield made
    made.close()


@pytest.fixture
def client(servers):
    made = servers[0].client()
    yield made
    made.close()


def most_in_one_window(admitted, period, spare=0.002):
    """The most units provably admitted within one window ``[x, x + period)``.

    ``admitted`` holds ``(sent, received, cost)`` per admitted hit: the server
    admitted it somewhere between its send and its reply, so a window is shown
    to hold a hit only if the hit's whole span lies inside it (``spare`` covers
    the server's clock running at a slightly different rate from ours).
    """
    admitted = sorted(admitted)
    worst = 0
    for x, _, _ in admitted:
        inside = sum(
            cost for sent, received, cost in admitted if sent >= x and received < x + period - spare
        )
        worst = max(worst, inside)
    return worst


def timed(call, *args, **kwargs):
    """``(sent, result, received)``: the server acted somewhere between the two times."""
    sent = time.monotonic()
    result = call(*args, **kwargs)
    return sent, result, time.monotonic()


def assert_waits_for(refused, since, span, grain=0.0):
    """``refused`` (a :func:`timed` hit) was told to wait for the rest of ``span``
    counted from the :func:`timed` call ``since``.

    The server ran each call somewhere between its send and its reply, so the
    time it saw pass between them is bracketed by those four times: the bound
    follows how late a loaded machine made the calls, never a guess of it.
    ``grain`` is how far the limiter may round the end up (a sliding bucket);
    a millisecond more covers rounding to whole microseconds and milliseconds.
    """
    shortest, longest = refused[0] - since[2], refused[2] - since[0]
    retry_after = refused[1].retry_after
    low, high = span - longest - 0.001, span - shortest + grain + 0.001
    assert not refused[1].allowed
    assert low <= retry_after <= high, (retry_after, low, high)


# -- exactness under concurrency -------------------------------------------------------


def _hammer(limiter, key, algorithm, start, admitted):
    start.wait(30)
    count = sum(
        limiter.hit(key, limit=100, period=60.0, algorithm=algorithm).allowed for _ in range(HITS)
    )
    with admitted.get_lock():
        admitted.value += count


@pytest.mark.parametrize("algorithm", ["sliding", "fixed"])
def test_many_processes_admit_exactly_the_limit(servers, limiter, client, algorithm):
    key = limiter.state_key("exact", algorithm)
    limiter.peek("warm-up", limit=1, period=1.0)  # the children inherit a used limiter
    context = multiprocessing.get_context("fork")
    start, admitted = context.Event(), context.Value("i", 0)
    processes = [
        context.Process(target=_hammer, args=(limiter, "exact", algorithm, start, admitted))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()

    ttls: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with servers[0].client() as sampler:
            while not done.is_set():
                ttls.append(sampler.pttl(key))

    sampler = threading.Thread(target=sample)
    sampler.start()
    began = time.monotonic()
    start.set()
    for process in processes:
        process.join(60)
    elapsed = time.monotonic() - began
    done.set()
    sampler.join()

    assert [process.exitcode for process in processes] == [0] * PROCESSES
    assert elapsed < 60, "the hits spread over more than one window"
    assert admitted.value == 100
    assert -1 not in ttls
    assert any(ttl > 0 for ttl in ttls)
    assert 0 < client.pttl(key) <= 60_000
    assert limiter.peek("exact", 100, 60.0, algorithm=algorithm).remaining == 0
    if algorithm == "fixed":
        # refused hits were taken back: the counter shows admissions only
        assert int(client.get(key)) == 100
    else:
        # one member per bucket, holding the running total of admitted units
        assert int(client.zrange(key, -1, -1)[0]) == 100


def _hit_for(limiter, limits, seconds, costs, start, results):
    start.wait(30)
    admitted, refused = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cost = random.choice(costs)
        sent = time.monotonic()
        decision = limiter.hit(limits, cost=cost)
        received = time.monotonic()
        if decision.allowed:
            admitted.append((sent, received, cost))
        else:
            refused.append(decision.retry_after)
            time.sleep(0.001)
    results.put((admitted, refused))


def _run_workers(limiter, limits, seconds, costs, workers=4):
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    processes = [
        context.Process(target=_hit_for, args=(limiter, limits, seconds, costs, start, results))
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    start.set()
    admitted, refused = [], []
    for _ in processes:
        more_admitted, more_refused = results.get(timeout=60)
        admitted += more_admitted
        refused += more_refused
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    return admitted, refused


@each_exact_algorithm
@pytest.mark.parametrize(
    "costs", [pytest.param([1], id="cost-1"), pytest.param([1, 3], id="cost-1-or-3")]
)
def test_no_window_of_one_period_holds_more_than_the_limit(limiter, algorithm, costs):
    limit, period, seconds = 20, 0.5, 2.5
    limits = [Limit("smooth", Rate(limit, period), algorithm)]
    admitted, refused = _run_workers(limiter, limits, seconds, costs)

    assert most_in_one_window(admitted, period) <= limit
    units = sum(cost for _, _, cost in admitted)
    if algorithm == "sliding":
        # ... while still letting the limit through, period after period.
        assert units >= limit * int(seconds / period) * 0.6
    else:
        # one slot every period / limit, claimed by whoever asks first
        assert units >= (seconds / period) * limit * (0.3 if 3 in costs else 0.6)
    assert refused
    assert all(0 < retry_after <= period + 0.01 for retry_after in refused)


def test_several_limits_hold_together_under_concurrency(limiter):
    limits = [
        Limit("tenant", Rate(10, 0.5), "sliding"),
        Limit("global", Rate(15, 0.5), "gcra"),
        Limit("daily", Rate(1000, 60.0), "fixed"),
    ]
    admitted, _ = _run_workers(limiter, limits, 2.0, [1, 2])
    assert most_in_one_window(admitted, 0.5) <= 10
    units = sum(cost for _, _, cost in admitted)
    # the fixed limit counted exactly the units admitted, no refused unit
    assert limiter.peek("daily", Rate(1000, 60.0), algorithm="fixed").remaining == 1000 - units


# -- the algorithms side by side -------------------------------------------------------


def test_fixed_window_can_admit_twice_the_limit_across_a_boundary_the_others_cannot(limiter):
    period = 1.0
    limiter.peek("warm-up", 3, period)  # connections and scripts, before the clock starts
    first = [timed(limiter.hit, name, 3, period, algorithm=name) for name in ("fixed", "sliding")]
    assert all(decision.allowed for _, decision, _ in first)
    began = first[0][2]  # the fixed window opened before this
    time.sleep(0.7)
    second = timed(limiter.hit, "sliding", 3, period, cost=2, algorithm="sliding")
    assert second[1].allowed
    assert limiter.hit("fixed", 3, period, cost=2, algorithm="fixed").allowed
    time.sleep(max(began + 1.15 - time.monotonic(), 0))
    # Less than one period after the two units at 0.7 s:
    fixed = limiter.hit("fixed", 3, period, cost=3, algorithm="fixed")
    sliding = timed(limiter.hit, "sliding", 3, period, cost=3, algorithm="sliding")
    assert fixed.allowed  # a new window: 5 units within ~0.45 s
    # refused until the units of 0.7 s leave, a period after they came
    assert_waits_for(sliding, second, period, grain=period / 1000)
    assert limiter.hit("sliding", 3, period, cost=1, algorithm="sliding").allowed


def test_timeline_of_the_module_documentation(limiter):
    # A limit of 3 per 10 s with hits at 0, 1, 2, 9 and 10.5 s, five times faster.
    scale, period = 0.2, 2.0
    calls: dict[str, list] = {"sliding": [], "gcra": [], "fixed": []}
    limiter.peek("warm-up", 3, period)  # connections and scripts, before the clock starts
    began = time.monotonic()
    for at in (0.0, 1.0, 2.0, 9.0, 10.5):
        time.sleep(max(began + at * scale - time.monotonic(), 0))
        for algorithm, made in calls.items():
            made.append(timed(limiter.hit, algorithm, 3, period, algorithm=algorithm))
    outcomes = {name: [decision.allowed for _, decision, _ in made] for name, made in calls.items()}
    assert outcomes["sliding"] == [True, True, True, False, True]
    assert outcomes["gcra"] == [True, False, False, True, False]
    assert outcomes["fixed"] == [True, True, True, False, True]
    # The waits of the timeline (in its seconds: 1.0 for sliding and fixed;
    # 2.33, 1.33 and 1.83 for gcra), from the times the hits actually ran.
    sliding, fixed, gcra = calls["sliding"], calls["fixed"], calls["gcra"]
    # The hit at 9 waits for the unit of 0 to leave, at 10.
    assert_waits_for(sliding[3], sliding[0], period, grain=period / 1000)
    assert_waits_for(fixed[3], fixed[0], period)
    # gcra spaces units 10/3 apart: the hits at 1 and 2 wait for 3.33, the
    # hit at 10.5 for 12.33.
    slot = period / 3
    assert_waits_for(gcra[1], gcra[0], slot)
    assert_waits_for(gcra[2], gcra[0], slot)
    assert_waits_for(gcra[4], gcra[3], slot)


@each_algorithm
def test_retry_after_is_honest(limiter, algorithm):
    first = limiter.hit("honest", 5, 0.4, algorithm=algorithm)
    assert first.allowed
    while (refused := limiter.hit("honest", 5, 0.4, algorithm=algorithm)).allowed:
        pass
    assert 0 < refused.retry_after <= 0.4 + 0.001
    assert refused.reset_after >= refused.retry_after
    time.sleep(refused.retry_after + 0.005)
    assert limiter.hit("honest", 5, 0.4, algorithm=algorithm).allowed


@each_algorithm
def test_peek_does_not_consume(limiter, client, algorithm):
    fresh = limiter.peek("peek", 3, 10.0, algorithm=algorithm)
    assert (fresh.allowed, fresh.limit, fresh.remaining, fresh.retry_after) == (True, 3, 3, 0.0)
    assert fresh.reset_after == 0.0
    assert client.exists(limiter.state_key("peek", algorithm)) == 0
    for _ in range(3):
        assert limiter.peek("peek", 3, 10.0, algorithm=algorithm).remaining == 3
    assert limiter.hit("peek", 3, 10.0, algorithm=algorithm).remaining == 2
    for _ in range(3):
        assert limiter.peek("peek", 3, 10.0, algorithm=algorithm).remaining == 2
    state = client.dump(limiter.state_key("peek", algorithm))
    limiter.peek("peek", 3, 10.0, cost=3, algorithm=algorithm)
    assert client.dump(limiter.state_key("peek", algorithm)) == state


def test_gcra_spaces_units_evenly(limiter):
    first = timed(limiter.hit, "even", 3, 10.0, algorithm="gcra")
    assert first[1].allowed
    refused = timed(limiter.hit, "even", 3, 10.0, algorithm="gcra")
    assert_waits_for(refused, first, 10 / 3)  # one slot after the first
    assert refused[1].remaining == 2  # the period still has room for two, one slot apart


@each_algorithm
def test_reset_gives_the_full_limit_back(limiter, client, algorithm):
    while limiter.hit("reset", 3, 60.0, algorithm=algorithm).allowed:
        pass
    limiter.reset("reset")
    assert client.exists(limiter.state_key("reset", algorithm)) == 0
    assert limiter.hit("reset", 3, 60.0, algorithm=algorithm).remaining == 2
    limiter.reset("never-used")


@pytest.mark.parametrize("algorithm", ["sliding", "fixed"])
def test_cost_counts_units_and_a_refused_hit_takes_nothing(limiter, client, algorithm):
    assert limiter.hit("cost", 10, 60.0, cost=4, algorithm=algorithm).remaining == 6
    assert limiter.hit("cost", 10, 60.0, cost=4, algorithm=algorithm).remaining == 2
    state = client.dump(limiter.state_key("cost", algorithm))
    refused = limiter.hit("cost", 10, 60.0, cost=4, algorithm=algorithm)
    assert not refused.allowed
    assert refused.remaining == 2
    assert client.dump(limiter.state_key("cost", algorithm)) == state
    assert limiter.peek("cost", 10, 60.0, cost=2, algorithm=algorithm).allowed
    assert not limiter.peek("cost", 10, 60.0, cost=3, algorithm=algorithm).allowed
    assert limiter.hit("cost", 10, 60.0, cost=2, algorithm=algorithm).remaining == 0


def test_gcra_makes_a_costly_hit_wait_for_room_in_the_window(limiter):
    # 10 per second, one unit every 0.1 s: a hit of 5 just after a hit of 1
    # waits until the window behind it has room for 5.
    first = timed(limiter.hit, "heavy", 10, 1.0, algorithm="gcra")
    assert first[1].allowed
    refused = timed(limiter.hit, "heavy", 10, 1.0, cost=5, algorithm="gcra")
    assert_waits_for(refused, first, 0.5)
    time.sleep(refused[1].retry_after + 0.005)
    assert limiter.hit("heavy", 10, 1.0, cost=5, algorithm="gcra").allowed


@each_algorithm
def test_every_key_keeps_a_ttl(limiter, client, algorithm):
    state = limiter.state_key("ttl", algorithm)
    # (a sliding unit counts until its bucket's end, up to 0.1 % of the period
    # later, and a millisecond is added: Redis may count a ttl from the start
    # of the current one)
    longest = 5000 + 5 + 1
    for _ in range(5):
        limiter.hit("ttl", 3, 5.0, algorithm=algorithm)
        assert 0 < client.pttl(state) <= longest
    # Something else removed the ttl: the next call, hit or peek, puts one back.
    for call in (limiter.hit, limiter.peek):
        client.persist(state)
        assert client.pttl(state) == -1
        call("ttl", 3, 5.0, algorithm=algorithm)
        assert 0 < client.pttl(state) <= longest


@pytest.mark.parametrize("algorithm", ["sliding", "fixed"])
def test_the_pace_of_a_fractional_limit_keeps_a_ttl(limiter, client, algorithm):
    limiter.hit("pace", "2.5/s", algorithm=algorithm)
    pace = RateKeys("redlock:rate:").pace("pace", algorithm)
    assert 0 < client.pttl(pace) <= 1200
    client.persist(pace)
    limiter.peek("pace", "2.5/s", algorithm=algorithm)
    assert 0 < client.pttl(pace) <= 1200


def test_algorithms_and_keys_do_not_interfere(limiter, client):
    for _ in range(2):
        assert limiter.hit("a", 2, 60.0, algorithm="fixed").allowed
    assert not limiter.hit("a", 2, 60.0, algorithm="fixed").allowed
    # the same name under the other algorithms, and other names, are other limits
    assert limiter.hit("a", 2, 60.0, algorithm="sliding").remaining == 1
    assert limiter.hit("a", 2, 60.0, algorithm="gcra").remaining == 1
    assert limiter.hit("b", 2, 60.0, algorithm="fixed").remaining == 1
    assert limiter.hit("b", 2, 60.0, algorithm="sliding").remaining == 1
    assert sorted(client.keys()) == sorted(
        [
            *(
                limiter.state_key(key, algorithm).encode()
                for key in ("a", "b")
                for algorithm in ("fixed", "sliding")
            ),
            limiter.state_key("a", "gcra").encode(),
        ]
    )


def test_default_algorithm_and_prefix(servers, client):
    with RateLimiter(servers[0].url, key_prefix="app:") as limiter:
        limiter.hit("k", 5, 60.0)
    assert client.type("app:{k}:sliding") == b"zset"
    with RateLimiter(servers[0].url, algorithm="gcra", key_prefix="app:") as limiter:
        limiter.hit("k", 5, 60.0)
    assert client.type("app:{k}:gcra") == b"string"


def test_a_client_works_whatever_its_settings(servers):
    given = servers[0].client(decode_responses=True, protocol=3)
    with RateLimiter(given) as limiter:
        assert limiter.hit("k", 2, 60.0).remaining == 1
        assert limiter.hit("k", 2, 60.0, algorithm="gcra").remaining == 1
        limiter.set_override("k", "1/m", ttl=60)
        assert limiter.get_override("k").rate == Rate(1, 60.0)
    given.close()


def test_a_script_flush_is_survived(servers, limiter):
    assert limiter.hit("k", 5, 60.0).remaining == 4
    servers[0].client().script_flush()
    assert limiter.hit("k", 5, 60.0).remaining == 3


# -- fractional rates ----------------------------------------------------------------


def test_a_fractional_rate_is_not_turned_into_a_burst(limiter):
    # "3.33333/s" once became 333333 per 100000 s: 1000 of 1000 hits admitted.
    # (Called the way a task reads its global_rate_limit: parse, then limit and period.)
    rate = parse_rate("3.33333/s")
    limiter.peek("warm-up", rate.limit, rate.period)  # connections and scripts
    for algorithm in ("sliding", "fixed"):
        started = time.monotonic()
        admitted = sum(
            limiter.hit(f"frac-{algorithm}", rate.limit, rate.period, algorithm=algorithm).allowed
            for _ in range(1000)
        )
        elapsed = time.monotonic() - started
        # 4 in one period (3.33 rounds up for a burst); hits spread over k
        # periods (a loaded machine) fit in k windows: at most 4 in each.
        periods = max(1, math.ceil(elapsed / rate.period))
        assert 4 <= admitted <= 4 * periods, (algorithm, admitted, elapsed)
    # gcra: one unit every 0.3 s, no burst; hits spread over more than one
    # slot (a loaded machine) may take one more unit per slot they span.
    started = time.monotonic()
    admitted = sum(limiter.hit("frac", "3.33333/s", algorithm="gcra").allowed for _ in range(100))
    elapsed = time.monotonic() - started
    assert 1 <= admitted <= 1 + elapsed / rate.interval, (admitted, elapsed)
    # "33.3/m" once became 333 per 600 s, admitting 333 at once.
    rate = parse_rate("33.3/m")
    assert sum(limiter.hit("minute", rate.limit, rate.period).allowed for _ in range(400)) == 34


def test_a_float_sum_is_a_usable_rate(limiter):
    decision = limiter.hit("sum", 0.1 + 0.2, 1.0)
    assert decision.allowed
    assert decision.limit == 0.30000000000000004
    assert not limiter.hit("sum", 0.1 + 0.2, 1.0).allowed


def test_a_fractional_rate_averages_out_within_one_percent(limiter):
    # 2.5 units per 20 ms (125 per second): at most 3 in any 20 ms window, and
    # 125 per second on average, measured from the first admission to the last.
    rate, interval = Rate(2.5, 0.02), 0.008
    admitted, sends = [], []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        sent = time.monotonic()
        sends.append(sent)
        if limiter.hit("average", rate).allowed:
            admitted.append((sent, time.monotonic(), 1))
    assert most_in_one_window(admitted, 0.02, spare=0.0002) <= 3
    elapsed = admitted[-1][1] - admitted[0][0]
    # Never more than the burst of 3 plus one unit per 8 ms...
    assert len(admitted) <= 3 + elapsed / interval + 1
    # ... and no fewer, within 1 %, while someone asked. The pace holds a few
    # units, so a pause of the asking process loses at most the part of it
    # beyond one interval (counted generously: a busy machine pauses it often).
    paused = sum(max(0.0, b - a - interval) for a, b in itertools.pairwise(sends))
    assert len(admitted) >= 0.99 * (3 + (elapsed - paused) / interval - 1)


def test_gcra_runs_at_the_exact_rate(limiter):
    rate = Rate(9.5, 1.0)  # one unit every 105.263 ms
    first = limiter.hit("on-time", rate, algorithm="gcra")
    # The next unit's slot, exactly: 1/9.5 s, not rounded to a millisecond.
    assert first.reset_after == math.ceil(10 * 1e6 / 9.5) / 1e6
    admitted = [time.monotonic()]
    lateness = 0.0
    while len(admitted) < 20:
        sent = time.monotonic()
        decision = limiter.hit("on-time", rate, algorithm="gcra")
        if decision.allowed:
            admitted.append(time.monotonic())
            last = (sent, decision, admitted[-1])
        else:
            # The caller's own lateness, measured: the refused hit's round trip
            # (its next hit travels as long) and how far the sleep overshoots.
            time.sleep(decision.retry_after)
            lateness += time.monotonic() - sent - decision.retry_after
    # A caller that comes back at retry_after is admitted one interval apart,
    # never sooner, and later only by its own lateness.
    gaps = len(admitted) - 1
    spacing = (admitted[-1] - admitted[0]) / gaps
    assert spacing >= rate.interval * 0.995
    assert spacing - lateness / gaps <= rate.interval * 1.05, (spacing, lateness / gaps)
    # And the next unit is one interval after the last, to the bracket of the
    # two calls: a limiter that spaces units short by more than their round
    # trips and a millisecond fails here, however late this process ran.
    assert_waits_for(timed(limiter.hit, "on-time", rate, algorithm="gcra"), last, rate.interval)


def test_periods_are_not_rounded(limiter):
    # 2.5 ms once became 2 ms.
    sliding = limiter.hit("short", 1, 0.0025, algorithm="sliding")
    assert 0.0025 < sliding.reset_after <= 0.0025 + 0.0000025  # plus at most one bucket
    gcra = limiter.hit("short", 1, 0.0025, algorithm="gcra")
    assert gcra.reset_after == 0.0025
    assert limiter.hit("long", "1/d", algorithm="gcra").reset_after == 86400.0
    with pytest.raises(errors.ConfigurationError) as raised:
        limiter.hit("short", 1, 0.0025, algorithm="fixed")
    assert raised.value.option == "period"


# -- several limits, weighted cost -------------------------------------------------------


def test_several_limits_all_or_nothing(limiter, client):
    tenant, shared = ("api:acme", "10/s"), ("global", "2/s")
    first = timed(limiter.hit, [tenant, shared])
    assert first[1].allowed
    assert limiter.hit([tenant, shared]).allowed
    before = {name: client.dump(name) for name in client.scan_iter()}
    timed_refusal = timed(limiter.hit, [tenant, shared])
    refused = timed_refusal[1]
    assert not refused.allowed
    assert [limit.key for limit in refused.refused_by] == ["global"]
    assert refused.limits[0].allowed
    assert refused.limits[0].remaining == 8
    assert_waits_for(timed_refusal, first, 1.0, grain=0.001)  # the first unit leaves
    # the tenant's limit, which would have admitted the hit, spent nothing
    assert {name: client.dump(name) for name in client.scan_iter()} == before
    assert limiter.peek(*tenant).remaining == 8


def test_several_limits_mix_algorithms_keys_and_a_weighted_cost(limiter, client):
    limits = [
        Limit("api:acme", "10/s"),
        Limit("api:acme:burst", "4/s", "gcra"),
        Limit("global", "50000/d", "fixed"),
    ]
    refused = limiter.hit(limits, cost=3)  # gcra needs room for 3: it has it when idle
    assert refused.allowed
    assert [limit.remaining for limit in refused.limits] == [7, 1, 49997]
    again = limiter.hit(limits, cost=3)
    assert not again.allowed
    assert [limit.allowed for limit in again.limits] == [True, False, True]
    assert limiter.peek("global", "50000/d", algorithm="fixed").remaining == 49997
    assert limiter.peek("api:acme", "10/s").remaining == 7


def test_one_limit_as_a_rate_text(limiter):
    decision = limiter.hit("api:acme", "100/m")
    assert (decision.allowed, decision.limit, decision.remaining) == (True, 100, 99)
    assert decision.limits[0].period == 60.0
    assert decision.node == limiter.status()[0].node


def test_a_callable_rate_is_read_on_every_decision(limiter):
    plans = {"acme": "2/m"}
    limits = [Limit("api:acme", lambda key: plans[key.split(":")[1]])]
    assert limiter.hit(limits).remaining == 1
    assert limiter.hit(limits).remaining == 0
    assert not limiter.hit(limits).allowed
    plans["acme"] = "10/m"
    assert limiter.hit(limits).remaining == 7


# -- bounded work ----------------------------------------------------------------------


def _slowest_script_us(client):
    entries = client.slowlog_get(100000)
    durations = [
        entry["duration"]
        for entry in entries
        if entry["command"].split(b" ", 1)[0].upper() in (b"EVALSHA", b"EVAL")
    ]
    assert durations, "the slow log recorded no script call"
    return max(durations)


def test_a_sliding_log_holds_at_most_one_member_per_bucket(limiter, client):
    # A bucket is 10 ms of a 10 s period. 1,500 hits, within one period
    # however slow this machine is right now, land in far fewer buckets than
    # hits: the log holds a member per bucket they spanned, not per hit.
    period, hits = 10.0, 1500
    bucket = period / 1000
    limiter.peek("warm-up", 1, period)
    started = time.monotonic()
    for _ in range(hits):
        assert limiter.hit("dense", 1_000_000, period).allowed
    spanned = time.monotonic() - started
    buckets = math.ceil(spanned / bucket) + 1
    assert spanned < period, spanned  # 1,500 hits in under 10 s
    assert buckets < hits, spanned
    assert client.zcard(limiter.state_key("dense")) <= buckets


def test_a_large_cost_costs_no_more_than_a_small_one(limiter, client):
    # A sliding hit of cost 1,000,000 once ran a million ZADDs: 2.4 s of a blocked server.
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    assert limiter.hit("large", 1_000_000, 60.0, cost=1_000_000, algorithm="sliding").allowed
    assert not limiter.hit("large", 1_000_000, 60.0, cost=1_000_000, algorithm="sliding").allowed
    slowest = _slowest_script_us(client)
    assert slowest < BLOCKING_BUDGET_US, f"a decision took {slowest} µs on the server"
    assert client.zcard(limiter.state_key("large", "sliding")) == 1


def test_no_accepted_input_blocks_the_server(servers, limiter, client):
    client.config_set("slowlog-max-len", 100000)
    full = [Limit(f"full:{i}", Rate(1_000_000, 4.0)) for i in range(16)]
    # Fill 16 logs with a member in most of their 1,000 buckets (4 ms each):
    # hits as fast as this process can make them, which on a loaded machine
    # is still several per bucket.
    deadline = time.monotonic() + 20.0
    while client.zcard(limiter.state_key("full:0")) <= 500:
        assert time.monotonic() < deadline, "could not fill the logs"
        for _ in range(20):
            assert limiter.hit(full).allowed

    # Server CPU per decision, not wall time: a server process that waits for
    # a core on a busy machine is not a blocked server.
    spent: list[float] = []

    def decide(call, *args, **kwargs):
        before = _server_cpu(client)
        decision = call(*args, **kwargs)
        spent.append(_server_cpu(client) - before)
        return decision

    # Refused, the retry_after of each found by binary search.
    assert not decide(limiter.hit, full, cost=1_000_000).allowed
    assert not decide(limiter.peek, full, cost=1_000_000).allowed
    # The largest limit and cost, under every algorithm.
    biggest = Rate(MAX_LIMIT, 1000.0)
    for algorithm in ("sliding", "fixed"):
        limits = [Limit(f"big:{algorithm}:{i}", biggest, algorithm) for i in range(16)]
        assert decide(limiter.hit, limits, cost=MAX_LIMIT).allowed
        assert not decide(limiter.hit, limits, cost=MAX_LIMIT).allowed
    gcra = [Limit(f"big:gcra:{i}", Rate(10_000, 1.0), "gcra") for i in range(16)]
    assert decide(limiter.hit, gcra, cost=10_000).allowed
    # Half the logs' window passes: each hit trims at most 16 old members per
    # limit. Then all of it: the logs expire, and are freed when next read.
    time.sleep(2.0)
    assert decide(limiter.hit, full).allowed
    time.sleep(2.2)
    assert decide(limiter.hit, full).allowed
    slowest = max(spent) * 1e6
    print(f"most server CPU for one decision: {slowest:.0f} µs")
    assert slowest < BLOCKING_BUDGET_US, f"a decision took {slowest:.0f} µs of server CPU"


def _server_cpu(client) -> float:
    """Seconds of CPU the server has used (INFO cpu), to the microsecond."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def test_scripts_check_every_argument_before_writing(client):
    script = load("ratelimit_hit").source
    keys = ["s1", "p1", "o1", "b1", "s2", "p2", "o2", "b2"]
    good = ["sliding", "10", "1000000"]
    cases = [
        (["0", "1", "0", *good, *good]),  # cost 0
        (["1.5", "1", "0", *good, *good]),  # fractional cost
        (["nan", "1", "0", *good, *good]),
        (["1", "2", "0", *good, *good]),  # consume neither 0 nor 1
        (["1", "1", "-1", *good, *good]),  # negative margin
        (["1", "1", "0", *good, "leaky", "10", "1000000"]),  # unknown algorithm
        (["1", "1", "0", *good, "sliding", "inf", "1000000"]),
        (["1", "1", "0", *good, "sliding", "10", "500"]),  # period below 1 ms
        (["1", "1", "0", *good, "fixed", "10", "2500"]),  # fixed, not whole ms
        (["1", "1", "0", *good, "gcra", "100000", "1000000"]),  # gcra, 10 µs per unit
        (["11", "1", "0", *good, *good]),  # cost over the limit
        (["1", "1", "0", *good]),  # too few arguments for the keys
    ]
    for args in cases:
        with pytest.raises(redis.ResponseError, match="celery_redlock"):
            client.eval(script, len(keys), *keys, *args)
        assert client.dbsize() == 0, args
    with pytest.raises(redis.ResponseError, match="celery_redlock"):
        client.eval(
            script, 8, "s1", "p1", "o1", "b1", "s1", "p2", "o2", "b2", "1", "1", "0", *good, *good
        )
    assert client.dbsize() == 0
    # A bad override stored in Redis stops the decision before any write.
    client.hset("o2", mapping={"limit": "0", "period_us": "1000000"})
    client.pexpire("o2", 60000)
    with pytest.raises(redis.ResponseError, match="override"):
        client.eval(script, len(keys), *keys, "1", "1", "0", *good, *good)
    assert client.keys() == [b"o2"]
    override = load("ratelimit_override").source
    for args in (["0", "1000000", "t", "1000"], ["1", "2500", "t", "1000"], ["1", "1e6", "t", "0"]):
        with pytest.raises(redis.ResponseError, match="celery_redlock"):
            client.eval(override, 1, "o3", *args)
    assert client.keys() == [b"o2"]


# -- budgets ---------------------------------------------------------------------------


@each_algorithm
def test_a_budget_counts_apart_from_the_limit_and_shares_its_override(limiter, client, algorithm):
    own = Limit("api:acme", "3/m", algorithm)
    publish = Limit("api:acme", "3/m", algorithm, budget="publish")
    admitted = [limiter.hit(publish).allowed for _ in range(4)]
    # gcra spaces them 20 s apart; the others take the burst.
    assert admitted == (
        [True, False, False, False] if algorithm == "gcra" else [True] * 3 + [False]
    )
    # The limit's own count is untouched by its publish budget...
    assert limiter.peek(own).remaining == 3
    assert limiter.hit(own).allowed
    assert limiter.peek(publish).remaining == 3 - sum(admitted)
    # ...and both read the limit's one override.
    limiter.set_override("api:acme", "1/m", ttl=60)
    assert limiter.peek(own).limits[0].overridden
    decision = limiter.peek(publish)
    assert decision.limits[0].overridden
    assert decision.limits[0].budget == "publish"
    assert client.exists(limiter.state_key("api:acme", algorithm, budget="publish"))
    # One decision checks each key once, its budgets included.
    with pytest.raises(errors.ConfigurationError, match="named twice"):
        limiter.peek([own, publish])
    limiter.reset("api:acme", budget="publish")
    assert not client.exists(limiter.state_key("api:acme", algorithm, budget="publish"))
    assert client.exists(limiter.state_key("api:acme", algorithm))


def test_a_budget_name_is_checked():
    for bad in ("", "Publish", "sliding", "override", "a:b", "x" * 40, 3):
        with pytest.raises(errors.ConfigurationError, match="budget"):
            Limit("k", "1/s", budget=bad)


# -- overrides -------------------------------------------------------------------------


@each_algorithm
def test_an_override_changes_a_limit_at_once_everywhere(servers, limiter, client, algorithm):
    other_process = RateLimiter(servers[0].url)
    for _ in range(3):
        assert limiter.hit("api:acme", "5/m", algorithm=algorithm).allowed or algorithm == "gcra"
    made = limiter.set_override("api:acme", "1/m", ttl=60)
    assert made.rate == Rate(1, 60.0)
    decision = other_process.hit("api:acme", "5/m", algorithm=algorithm)
    assert not decision.allowed
    assert decision.limits[0].overridden
    assert (decision.limit, decision.limits[0].period) == (1, 60.0)
    assert 59 < client.pttl(RateKeys("redlock:rate:").override("api:acme")) / 1000 <= 60

    assert limiter.clear_override("api:acme")
    assert not limiter.clear_override("api:acme")
    back = other_process.peek("api:acme", "5/m", algorithm=algorithm)
    assert not back.limits[0].overridden
    assert back.limit == 5
    other_process.close()


def test_overrides_are_listed_and_read_back(limiter):
    assert limiter.overrides() == []
    assert limiter.get_override("api:acme") is None
    limiter.set_override("api:acme", "200/m", ttl=3600)
    limiter.set_override("api:tiny", Rate(2.5, 1.0), ttl=60)
    limiter.hit("api:other", "5/m")  # a limit without an override
    listed = limiter.overrides()
    assert [(o.key, o.rate, o.text) for o in listed] == [
        ("api:acme", Rate(200, 60.0), "200/m"),
        ("api:tiny", Rate(2.5, 1.0), "2.5/s"),
    ]
    assert 3599 < listed[0].ttl <= 3600
    read = limiter.get_override("api:tiny")
    assert (read.key, read.rate, read.text) == ("api:tiny", Rate(2.5, 1.0), "2.5/s")
    assert 59 < read.ttl <= 60


def test_an_override_below_the_cost_refuses_until_it_expires(limiter):
    limiter.set_override("api:acme", "2/m", ttl=30)
    decision = limiter.hit("api:acme", "100/m", cost=5)
    assert not decision.allowed
    assert 29 < decision.retry_after <= 30


@each_algorithm
@pytest.mark.parametrize("ends", ["cleared", "lapsed"])
def test_an_override_that_ends_leaves_no_wait_beyond_the_limit_in_force(limiter, algorithm, ends):
    # "1/d" for a moment, one unit under it, then "10/s" again: no client may
    # be told to wait longer than "10/s" allows (one period, with room for the
    # largest cost), and a client that waits as told is admitted.
    limiter.set_override("api:acme", "1/d", ttl=0.3 if ends == "lapsed" else 60)
    assert limiter.hit("api:acme", "10/s", algorithm=algorithm).allowed
    if ends == "cleared":
        assert limiter.clear_override("api:acme")
    else:
        time.sleep(0.4)
    assert limiter.get_override("api:acme") is None
    for _ in range(3):
        for _ in range(11):
            decision = limiter.hit("api:acme", "10/s", algorithm=algorithm)
            assert not decision.limits[0].overridden
            assert decision.retry_after <= 1.0 + 0.001, decision
            assert decision.reset_after <= 2.0 + 0.001, decision
            if not decision.allowed:
                break
        assert not decision.allowed  # eleven hits in well under a second
        time.sleep(decision.retry_after + 0.005)
        assert limiter.hit("api:acme", "10/s", algorithm=algorithm).allowed


def test_a_broken_override_is_an_error_not_a_silent_default(limiter, client):
    name = RateKeys("redlock:rate:").override("api:acme")
    client.hset(name, mapping={"limit": "many", "period_us": "60000000"})
    client.pexpire(name, 60000)
    with pytest.raises(errors.RateLimiterUnavailable, match="override"):
        limiter.hit("api:acme", "5/m")
    assert client.keys() == [name.encode()]


def _pace(limiter, algorithm):
    return limiter.state_key("k", algorithm) + ":pace"


#: State no limit writes, planted without a ttl: ``(algorithm, rate, key of the state, value)``.
UNUSABLE_STATE = [
    pytest.param("gcra", "10/s", None, "99999999999999999999 5", id="gcra-inexact-time"),
    pytest.param("gcra", "10/s", None, "soon", id="gcra-text"),
    pytest.param("gcra", "10/s", None, {"a": "1"}, id="gcra-a-hash"),
    pytest.param("sliding", "10/s", None, [(b"many", 1.0)], id="sliding-text-total"),
    pytest.param("sliding", "10/s", None, [(b"-3", 1.0)], id="sliding-negative-total"),
    pytest.param("sliding", "10/s", None, "not a sorted set", id="sliding-a-string"),
    pytest.param("fixed", "10/s", None, "1e30", id="fixed-inexact-count"),
    pytest.param("fixed", "10/s", None, "2.5", id="fixed-fraction"),
    pytest.param("sliding", "2.5/s", _pace, "5 1e300", id="pace-inexact-time"),
]


@pytest.mark.parametrize(("algorithm", "rate", "where", "value"), UNUSABLE_STATE)
def test_state_no_limit_writes_is_an_error_naming_its_key_until_it_expires(
    limiter, client, algorithm, rate, where, value
):
    name = where(limiter, algorithm) if where else limiter.state_key("k", algorithm)
    if isinstance(value, dict):
        client.hset(name, mapping=value)
    elif isinstance(value, list):
        client.zadd(name, dict(value))
    else:
        client.set(name, value)
    for call in (limiter.hit, limiter.peek):
        with pytest.raises(errors.RateLimiterUnavailable, match=re.escape(name)):
            call("k", rate, algorithm=algorithm)
    # Nothing else was written, and the state now expires within one window
    # of the limit in force (1 s; a pace: 3 units of 0.4 s), plus 1 ms.
    assert client.keys() == [name.encode()]
    assert 0 < client.pttl(name) <= 1201
    time.sleep(client.pttl(name) / 1000 + 0.01)
    assert limiter.hit("k", rate, algorithm=algorithm).allowed


#: State a limit could write but far ahead of the server's clock (planted, or
#: a clock stepped back): ``(algorithm, rate, key of the state, value)``.
FAR_AHEAD = [
    pytest.param("gcra", "10/s", None, "1 5000000000000000", id="gcra"),
    pytest.param("sliding", "10/s", None, [(b"10", 1e20)], id="sliding"),
    pytest.param("fixed", "10/s", None, "10", id="fixed"),
    pytest.param("sliding", "2.5/s", _pace, "1 5000000000000000", id="pace"),
]


@pytest.mark.parametrize(("algorithm", "rate", "where", "value"), FAR_AHEAD)
def test_state_far_ahead_waits_no_longer_than_the_limit_in_force(
    limiter, client, algorithm, rate, where, value
):
    name = where(limiter, algorithm) if where else limiter.state_key("k", algorithm)
    if isinstance(value, list):
        client.zadd(name, dict(value))
    else:
        client.set(name, value)
    client.expire(name, 10**9)  # some 30 years
    for call in (limiter.peek, limiter.hit):
        decision = call("k", rate, algorithm=algorithm)
        assert not decision.allowed
        assert 0 < decision.retry_after <= 1.2 + 0.001, decision
        assert decision.reset_after <= 2.4 + 0.001, decision
        assert 0 < client.pttl(name) <= 2401
    time.sleep(decision.retry_after + 0.005)
    assert limiter.hit("k", rate, algorithm=algorithm).allowed


# -- when Redis is down ----------------------------------------------------------------


def _ratelimit_records(caplog):
    return [r for r in caplog.records if r.name == "celery_redlock.ratelimit"]


def test_killed_redis_is_a_clear_error_at_once(servers, limiter, caplog):
    caplog.set_level(logging.INFO, logger="celery_redlock.ratelimit")
    limiter.hit("k", 5, 60.0)
    servers[0].kill()
    for _ in range(5):
        began = time.monotonic()
        with pytest.raises(errors.RateLimiterUnavailable) as raised:
            limiter.hit("k", 5, 60.0)
        assert time.monotonic() - began < 1.0
    assert raised.value.key == "k"
    assert raised.value.node == servers[0].url
    assert "'k'" in str(raised.value)
    assert "server is up" in str(raised.value)
    assert raised.value.__cause__ is not None
    with pytest.raises(errors.RateLimiterUnavailable):
        limiter.reset("k")
    assert not limiter.status()[0].answering
    servers[0].start()
    assert limiter.hit("k", 5, 60.0).remaining == 4  # restarted empty
    assert limiter.status()[0].answering
    # the outage and the recovery, each told once
    told = [r.getMessage() for r in _ratelimit_records(caplog)]
    assert len(told) == 2
    assert told[0].startswith(f"rate limiter: the primary Redis at {servers[0].url} made no ")
    assert told[1].startswith(f"rate limiter: the primary Redis at {servers[0].url} answers again")


def test_paused_redis_fails_within_the_node_timeout(servers):
    # A node timeout and a retry interval far above any scheduling delay, so
    # "waited out the timeout" and "failed at once" cannot be confused.
    with RateLimiter(servers[0].url, node_timeout=1.0, retry_interval=2.0) as limiter:
        limiter.hit("k", 5, 60.0)
        servers[0].pause()
        waited = []
        for call in (limiter.hit, limiter.peek):
            began = time.monotonic()
            with pytest.raises(errors.RateLimiterUnavailable):
                call("k", 5, 60.0, algorithm="gcra")
            waited.append(time.monotonic() - began)
        # The first call waits out the node timeout; the node is then left
        # alone (suspect, and skipped for retry_interval), so the next fails at once.
        assert 0.95 < waited[0] < 4.0
        assert waited[1] < 0.5
        servers[0].resume()
        # Asked again after the retry interval, it is back.
        deadline = time.monotonic() + 6.0
        while True:
            try:
                assert limiter.peek("k", 5, 60.0).remaining == 4
                break
            except errors.RateLimiterUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.01)


def test_fail_open_admits_uncounted_and_says_so(servers, caplog):
    caplog.set_level(logging.INFO, logger="celery_redlock.ratelimit")
    with RateLimiter(servers[0].url, on_unavailable="allow") as limiter:
        assert limiter.hit("k", 1, 60.0).allowed
        assert limiter.hit("k", 1, 60.0).checked
        servers[0].kill()
        decisions = [limiter.hit("k", 1, 60.0) for _ in range(5)]
        assert all(d.allowed and not d.checked and d.node is None for d in decisions)
        servers[0].start()
        after = limiter.hit("k", 1, 60.0)
        assert (after.allowed, after.checked, after.node) == (True, True, servers[0].url)
    messages = [r.getMessage() for r in _ratelimit_records(caplog)]
    assert len(messages) == 2
    assert "admitted unchecked" in messages[0]
    assert "answers again" in messages[1]


def test_a_fallback_decides_while_the_primary_is_down(servers, caplog):
    caplog.set_level(logging.INFO, logger="celery_redlock.ratelimit")
    primary, fallback = servers[0], servers[1]
    with RateLimiter(primary.url, fallback=fallback.url) as limiter:
        limiter.set_override("capped", "1/m", ttl=60)  # written to both
        assert limiter.hit("k", 2, 60.0).node == primary.url
        primary.kill()
        on_fallback = [limiter.hit("k", 2, 60.0) for _ in range(3)]
        # counts start again on the fallback, and it keeps the limit
        assert [(d.allowed, d.node) for d in on_fallback] == [
            (True, fallback.url),
            (True, fallback.url),
            (False, fallback.url),
        ]
        assert limiter.hit("capped", "5/m").limits[0].overridden
        assert [s.answering for s in limiter.status()] == [False, True]
        with pytest.raises(errors.RateLimiterUnavailable, match="done on the 1 other node"):
            limiter.reset("k")
        primary.start()
        back = limiter.hit("k", 2, 60.0)
        assert (back.allowed, back.node, back.remaining) == (True, primary.url, 1)
    messages = [r.getMessage() for r in _ratelimit_records(caplog)]
    assert len(messages) == 2
    assert f"decisions go to the fallback Redis at {fallback.url}" in messages[0]
    assert "answers again" in messages[1]


def test_a_paused_primary_costs_one_timeout_then_the_fallback_answers_at_once(servers):
    primary, fallback = servers[0], servers[1]
    with RateLimiter(
        primary.url, fallback=fallback.url, node_timeout=1.0, retry_interval=30.0
    ) as limiter:
        limiter.hit("k", 100, 60.0)
        primary.pause()
        began = time.monotonic()
        assert limiter.hit("k", 100, 60.0).node == fallback.url
        assert 0.95 < time.monotonic() - began < 4.0
        for _ in range(10):
            began = time.monotonic()
            assert limiter.hit("k", 100, 60.0).node == fallback.url
            assert time.monotonic() - began < 0.5
        primary.resume()


def test_both_down_fails_closed_by_default(servers):
    with RateLimiter(servers[0].url, fallback=servers[1].url) as limiter:
        servers[0].kill()
        servers[1].kill()
        with pytest.raises(errors.RateLimiterUnavailable) as raised:
            limiter.hit("k", 2, 60.0)
        assert servers[0].url in str(raised.value)
        assert servers[1].url in str(raised.value)


# -- the run-start margin -------------------------------------------------------------


@each_exact_algorithm
def test_a_margin_keeps_the_limit_on_work_that_starts_a_little_after_its_decision(
    servers, algorithm
):
    # Each admitted hit "starts" up to 20 ms after its reply; with a margin
    # of 50 ms the starts still keep the limit in every window of one period.
    limit, period = 5, 0.5
    starts: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    stop = time.monotonic() + 2.5

    def worker() -> None:
        with RateLimiter(servers[0].url, margin=0.05) as own:
            while time.monotonic() < stop:
                decision = own.hit("margin", limit, period, algorithm=algorithm)
                if decision.allowed:
                    time.sleep(random.uniform(0.0, 0.02))
                    began = time.monotonic()
                    with lock:
                        starts.append((began, began, 1))
                else:
                    time.sleep(min(decision.retry_after, 0.005))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most_in_one_window(starts, period, spare=0.0) <= limit
    assert len(starts) >= limit * 3


def test_a_margin_lengthens_the_window(servers):
    with RateLimiter(servers[0].url, margin=0.5) as limiter:
        started = time.monotonic()
        assert limiter.hit("m", 2, 0.2).allowed
        assert limiter.hit("m", 2, 0.2).allowed
        retry_after = limiter.hit("m", 2, 0.2).retry_after
        elapsed = time.monotonic() - started
        # The window is 0.7 s from the first hit (0.2 without the margin),
        # less what passed before the third (a loaded machine: tens of ms).
        assert 0.7 - elapsed - 0.001 < retry_after <= 0.701, (retry_after, elapsed)
    with RateLimiter(servers[0].url, margin=0.05) as limiter:
        # one slot is 0.125 s; a second unit could come at once after it
        assert limiter.hit("g", 2, 0.2, algorithm="gcra").reset_after == 0.25


def test_decisions_round_trip_into_the_documented_type(limiter):
    decision = limiter.hit("k", 5, 60.0)
    assert isinstance(decision, RateLimitDecision)
    assert (decision.allowed, decision.limit, decision.remaining) == (True, 5, 4)
    assert decision.retry_after == 0.0
    assert 59.9 < decision.reset_after <= 60.06


# -- what the service behind a limit said: pauses and adaptive rates -----------------


def _every_key_has_a_ttl(client):
    names = client.keys()
    assert names
    for name in names:
        assert client.pttl(name) > 0, name


def test_a_pause_refuses_every_decision_on_the_key_until_it_ends(limiter, client):
    limit = Limit("api:acme", "100/s")
    backoff = limiter.refused(limit, retry_after=0.6)
    assert 0.5 < backoff.paused_for <= 0.6
    began = time.monotonic()
    refused = limiter.hit([limit])
    assert not refused.allowed
    assert refused.limits[0].paused
    assert 0.4 < refused.retry_after <= 0.6
    # beat's publishes of the key (another budget) and a peek see it too
    assert not limiter.hit([Limit("api:acme", "100/s", budget="publish")]).allowed
    assert not limiter.peek([limit]).allowed
    _every_key_has_a_ttl(client)
    while time.monotonic() - began < refused.retry_after - 0.05:
        assert not limiter.hit([limit]).allowed
        time.sleep(0.02)
    time.sleep(0.1)
    assert limiter.hit([limit]).allowed
    # what the pause left behind holds nothing that outlives it
    assert client.pttl(RateKeys("redlock:rate:").backoff("api:acme")) == -2


def test_a_shorter_pause_never_shortens_a_longer_one(limiter):
    limiter.refused(("api:acme", "10/s"), retry_after=5.0)
    after = limiter.refused(("api:acme", "10/s"), retry_after=0.1)
    assert 4.5 < after.paused_for <= 5.0
    assert limiter.pause("api:acme", 0.2).paused_for > 4.5
    shown = limiter.get_backoff("api:acme")
    assert shown is not None
    assert 4.5 < shown.paused_for <= 5.0
    assert 4.5 < shown.ttl <= 5.01
    longer = limiter.pause("api:acme", 8.0)
    assert 7.9 < longer.paused_for <= 8.0
    assert limiter.resume("api:acme")
    assert limiter.hit("api:acme", "10/s").allowed
    assert not limiter.resume("api:acme")


def test_retry_after_none_pauses_for_one_interval_of_the_rate_in_force(limiter):
    assert limiter.refused(("api:acme", "4/s")).paused_for == pytest.approx(0.25, abs=0.01)
    with pytest.raises(errors.ConfigurationError, match="retry_after"):
        limiter.refused(("api:acme", "4/s"), retry_after=-1.0)


def test_an_adaptive_refusal_lowers_the_rate_in_force_once_per_period(limiter, client):
    ceiling = Limit("api:acme", "40/s")
    for _ in range(10):  # the fleet admitted 10 in the last window
        assert limiter.hit([ceiling]).allowed
    began = time.monotonic()
    first = limiter.refused(ceiling, retry_after=0.001, adapt=True)
    assert first.lowered
    # DECREASE times what the window admitted (10, per period + margin 0), not the 40 in force
    assert first.learned == pytest.approx(7.5)
    second = limiter.refused(ceiling, retry_after=0.001, adapt=True)
    assert not second.lowered  # within one period of the last decrease
    time.sleep(0.01)
    decision = limiter.peek([ceiling])
    assert decision.limits[0].adapted
    assert decision.limit == pytest.approx(7.5)
    _every_key_has_a_ttl(client)
    # The rate climbs back to the ceiling: the backoff lasts as long as that takes,
    # 5 periods back to 9 (one unit under the 10 refused), then 9 * (1 + 0.05 n^3)
    # reaches 40 at n = 5.
    ttl = client.pttl(RateKeys("redlock:rate:").backoff("api:acme")) / 1000
    # 10 s from the decrease, less what has passed since (0.1 s was too little on a busy machine)
    assert 10 - (time.monotonic() - began) - 0.002 <= ttl <= 10


def test_a_decrease_reads_no_window_that_a_pause_took_part_of(limiter):
    ceiling = Limit("api:acme", "40/2s")
    began = time.monotonic()
    assert limiter.refused(ceiling, retry_after=0.001, adapt=True).learned * 2 == 30
    # a call already under way is refused later, with a longer Retry-After: it
    # only extends the pause, which now ends 1.5 s in, after the decrease's calm
    assert not limiter.refused(ceiling, retry_after=1.5, adapt=True).lowered
    time.sleep(max(0.0, began + 1.6 - time.monotonic()))
    assert limiter.hit([ceiling]).allowed  # the one run admitted since the pause
    time.sleep(max(0.0, began + 2.1 - time.monotonic()))
    in_force = limiter.peek([ceiling]).limit
    lowered = limiter.refused(ceiling, retry_after=0.001, adapt=True)
    assert lowered.lowered
    # the window (2 s) holds the pause: what it admitted (1) is not the fleet's
    # rate, the rate in force is
    assert lowered.learned * 2 == pytest.approx(0.75 * in_force)


def test_the_adaptive_rate_climbs_a_step_per_period_reported_once(limiter):
    ceiling = Limit("api:acme", "20/0.2s")
    limiter.refused(ceiling, retry_after=0.001, adapt=True)  # nothing admitted: 0.75 * 20
    time.sleep(0.01)
    assert limiter.peek([ceiling]).limit == pytest.approx(15)
    time.sleep(0.45)  # two whole periods: back toward 19, one unit under the 20 refused
    decisions = [limiter.hit([ceiling]) for _ in range(3)]
    assert decisions[0].limit == pytest.approx(19 - 4 * (1 - 2 / 5) ** 3)
    assert [d.limits[0].raised for d in decisions] == [True, False, False]
    # a later refusal lowers from the rate in force: 0.75 * 3 admitted in the window
    lowered = limiter.refused(ceiling, retry_after=0.001, adapt=True)
    assert lowered.lowered
    assert lowered.learned * 0.2 == pytest.approx(2.25)


def test_an_adaptive_rate_never_goes_below_its_floor_or_a_runs_cost(limiter):
    ceiling = Limit("api:acme", "100/s")
    assert limiter.hit([ceiling]).allowed  # the window admitted one: 0.75 of it is below 1 %
    assert limiter.refused(ceiling, retry_after=0.001, adapt=True).learned == pytest.approx(1.0)
    time.sleep(0.01)
    assert limiter.peek([ceiling], cost=1).limit == pytest.approx(1.0)
    assert limiter.peek([ceiling], cost=3).limit == 3


def test_an_override_is_the_ceiling_of_an_adaptive_rate(limiter):
    limiter.set_override("api:acme", "8/s", ttl=60)
    limiter.refused(("api:acme", "40/s"), retry_after=0.001, adapt=True)
    time.sleep(0.01)
    assert limiter.peek("api:acme", "40/s").limit == pytest.approx(6)


def test_an_adaptive_decision_is_one_script_call(limiter, client):
    limiter.refused(("api:acme", "40/s"), retry_after=0.001, adapt=True)
    limiter.hit("api:acme", "40/s")

    def calls():
        stats = client.info("commandstats")
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))

    before = calls()
    for _ in range(5):
        limiter.hit("api:acme", "40/s")
    # five decisions, five script calls (and the INFO between)
    assert calls() - before == 5


def test_a_backoff_left_without_a_ttl_gets_one_back(limiter, client):
    name = RateKeys("redlock:rate:").backoff("api:acme")
    limiter.refused(("api:acme", "10/s"), retry_after=5.0, adapt=True)
    client.persist(name)
    limiter.peek("api:acme", "10/s")
    assert 0 < client.pttl(name) <= 100_001
