"""The rate limiter against real redis-server processes, from many processes at once."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from celery_redlock import RateLimitDecision, RateLimiter, errors

pytestmark = pytest.mark.integration

ALGORITHMS = [pytest.param("fixed", id="fixed"), pytest.param("sliding", id="sliding")]
#: Run a test under each algorithm: ``def test_x(algorithm): ...``
each_algorithm = pytest.mark.parametrize("algorithm", ALGORITHMS)

PROCESSES = 16
HITS = 200


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


def _hammer(limiter, key, algorithm, start, admitted):
    start.wait(30)
    count = sum(
        limiter.hit(key, limit=100, period=60.0, algorithm=algorithm).allowed for _ in range(HITS)
    )
    with admitted.get_lock():
        admitted.value += count


@each_algorithm
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
        assert client.zcard(key) == 100


def _hit_for(limiter, key, limit, period, seconds, start, results):
    start.wait(30)
    admitted, refused = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sent = time.monotonic()
        decision = limiter.hit(key, limit=limit, period=period, algorithm="sliding")
        received = time.monotonic()
        if decision.allowed:
            admitted.append((sent, received))
        else:
            refused.append(decision.retry_after)
            time.sleep(0.001)
    results.put((admitted, refused))


def test_sliding_window_never_admits_more_than_the_limit_in_any_period(limiter):
    limit, period, seconds, workers = 20, 0.5, 2.5, 4
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    processes = [
        context.Process(
            target=_hit_for, args=(limiter, "smooth", limit, period, seconds, start, results)
        )
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

    # The server admitted each hit between its send and its reply. A window
    # [x, x + period) is shown to be overfull only by hits whose whole
    # send-to-reply span lies inside it (2 ms spare for the server's clock
    # running at a slightly different rate from ours).
    admitted.sort()
    worst = 0
    for x, _ in admitted:
        inside = sum(
            1 for sent, received in admitted if sent >= x and received < x + period - 0.002
        )
        worst = max(worst, inside)
    assert worst <= limit
    # ... while still letting the limit through, period after period.
    assert len(admitted) >= limit * int(seconds / period) * 0.6
    assert refused
    assert all(0 < retry_after <= period for retry_after in refused)


def test_fixed_window_can_admit_twice_the_limit_across_a_boundary_sliding_cannot(limiter):
    period = 1.0
    began = time.monotonic()
    for algorithm in ("fixed", "sliding"):
        assert limiter.hit(algorithm, 3, period, algorithm=algorithm).allowed
    time.sleep(0.7)
    for algorithm in ("fixed", "sliding"):
        assert limiter.hit(algorithm, 3, period, cost=2, algorithm=algorithm).allowed
    time.sleep(max(began + 1.15 - time.monotonic(), 0))
    # Less than one period after the two units at 0.7 s:
    fixed = limiter.hit("fixed", 3, period, cost=3, algorithm="fixed")
    sliding = limiter.hit("sliding", 3, period, cost=3, algorithm="sliding")
    assert fixed.allowed  # a new window: 5 units within ~0.45 s
    assert not sliding.allowed
    assert 0.2 < sliding.retry_after <= 0.6  # when the units of 0.7 s leave
    assert limiter.hit("sliding", 3, period, cost=1, algorithm="sliding").allowed


def test_timeline_of_the_module_documentation(limiter):
    # Limit 3 per second, hits at 0, 0.1, 0.2, 0.6 and 1.3 s.
    period = 1.0
    outcomes: dict[str, list[bool]] = {"fixed": [], "sliding": []}
    retry_afters: dict[str, float] = {}
    began = time.monotonic()
    for at in (0.0, 0.1, 0.2, 0.6, 1.3):
        time.sleep(max(began + at - time.monotonic(), 0))
        for algorithm, seen in outcomes.items():
            decision = limiter.hit("doc", 3, period, algorithm=algorithm)
            seen.append(decision.allowed)
            if not decision.allowed:
                retry_afters[algorithm] = decision.retry_after
    assert outcomes["fixed"] == [True, True, True, False, True]
    assert outcomes["sliding"] == [True, True, True, False, True]
    for algorithm in outcomes:
        assert 0.2 < retry_afters[algorithm] <= 0.4 + 0.05


@each_algorithm
def test_retry_after_is_honest(limiter, algorithm):
    for _ in range(5):
        assert limiter.hit("honest", 5, 0.4, algorithm=algorithm).allowed
    refused = limiter.hit("honest", 5, 0.4, algorithm=algorithm)
    assert not refused.allowed
    assert 0 < refused.retry_after <= 0.4
    assert refused.reset_after >= refused.retry_after
    time.sleep(refused.retry_after + 0.01)
    assert limiter.hit("honest", 5, 0.4, algorithm=algorithm).allowed


@each_algorithm
def test_peek_does_not_consume(limiter, client, algorithm):
    fresh = limiter.peek("peek", 3, 10.0, algorithm=algorithm)
    assert fresh == RateLimitDecision(
        allowed=True, limit=3, remaining=3, retry_after=0.0, reset_after=0.0
    )
    assert client.exists(limiter.state_key("peek", algorithm)) == 0
    for expected_remaining in (2, 1, 0):
        for _ in range(3):
            assert limiter.peek("peek", 3, 10.0, algorithm=algorithm).remaining == (
                expected_remaining + 1
            )
        assert limiter.hit("peek", 3, 10.0, algorithm=algorithm).remaining == expected_remaining
    full = limiter.peek("peek", 3, 10.0, algorithm=algorithm)
    assert not full.allowed
    assert 9.0 < full.retry_after <= 10.0
    assert not limiter.hit("peek", 3, 10.0, algorithm=algorithm).allowed


@each_algorithm
def test_reset_gives_the_full_limit_back(limiter, client, algorithm):
    for _ in range(3):
        limiter.hit("reset", 3, 60.0, algorithm=algorithm)
    assert not limiter.hit("reset", 3, 60.0, algorithm=algorithm).allowed
    limiter.reset("reset")
    assert client.exists(limiter.state_key("reset", algorithm)) == 0
    assert limiter.hit("reset", 3, 60.0, algorithm=algorithm).remaining == 2
    limiter.reset("never-used")


@each_algorithm
def test_cost_counts_units_and_a_refused_hit_takes_nothing(limiter, client, algorithm):
    assert limiter.hit("cost", 10, 60.0, cost=4, algorithm=algorithm).remaining == 6
    assert limiter.hit("cost", 10, 60.0, cost=4, algorithm=algorithm).remaining == 2
    refused = limiter.hit("cost", 10, 60.0, cost=4, algorithm=algorithm)
    assert not refused.allowed
    assert refused.remaining == 2
    assert limiter.peek("cost", 10, 60.0, cost=2, algorithm=algorithm).allowed
    assert not limiter.peek("cost", 10, 60.0, cost=3, algorithm=algorithm).allowed
    assert limiter.hit("cost", 10, 60.0, cost=2, algorithm=algorithm).remaining == 0
    state = limiter.state_key("cost", algorithm)
    if algorithm == "fixed":
        assert int(client.get(state)) == 10
    else:
        assert client.zcard(state) == 10


@each_algorithm
def test_every_key_keeps_a_ttl(limiter, client, algorithm):
    state = limiter.state_key("ttl", algorithm)
    for _ in range(5):
        limiter.hit("ttl", 3, 5.0, algorithm=algorithm)
        assert 0 < client.pttl(state) <= 5000
    # Something else removed the ttl: the next call, hit or peek, puts one back.
    for call in (limiter.hit, limiter.peek):
        client.persist(state)
        assert client.pttl(state) == -1
        call("ttl", 3, 5.0, algorithm=algorithm)
        assert 0 < client.pttl(state) <= 5000


def test_algorithms_and_keys_do_not_interfere(limiter, client):
    for _ in range(2):
        assert limiter.hit("a", 2, 60.0, algorithm="fixed").allowed
    assert not limiter.hit("a", 2, 60.0, algorithm="fixed").allowed
    # the same name under the other algorithm, and other names, are other limits
    assert limiter.hit("a", 2, 60.0, algorithm="sliding").remaining == 1
    assert limiter.hit("b", 2, 60.0, algorithm="fixed").remaining == 1
    assert limiter.hit("b", 2, 60.0, algorithm="sliding").remaining == 1
    assert sorted(client.keys()) == sorted(
        limiter.state_key(key, algorithm).encode()
        for key in ("a", "b")
        for algorithm in ("fixed", "sliding")
    )


def test_default_algorithm_and_prefix(servers, client):
    with RateLimiter(servers[0].url, algorithm="sliding", key_prefix="app:") as limiter:
        limiter.hit("k", 5, 60.0)
    assert client.type("app:{k}:sliding") == b"zset"


def test_a_client_works_whatever_its_settings(servers):
    given = servers[0].client(decode_responses=True, protocol=3)
    with RateLimiter(given) as limiter:
        assert limiter.hit("k", 2, 60.0).remaining == 1
        assert limiter.hit("k", 2, 60.0, algorithm="sliding").remaining == 1
    given.close()


def test_a_script_flush_is_survived(servers, limiter):
    assert limiter.hit("k", 5, 60.0).remaining == 4
    servers[0].client().script_flush()
    assert limiter.hit("k", 5, 60.0).remaining == 3


def test_killed_redis_is_a_clear_error_at_once(servers, limiter):
    limiter.hit("k", 5, 60.0)
    servers[0].kill()
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
    servers[0].start()
    assert limiter.hit("k", 5, 60.0).remaining == 4  # restarted empty


def test_paused_redis_fails_within_the_node_timeout(servers):
    with RateLimiter(servers[0].url, node_timeout=0.2) as limiter:
        limiter.hit("k", 5, 60.0)
        servers[0].pause()
        for call in (limiter.hit, limiter.peek):
            began = time.monotonic()
            with pytest.raises(errors.RateLimiterUnavailable):
                call("k", 5, 60.0, algorithm="sliding")
            assert 0.15 < time.monotonic() - began < 1.0
        servers[0].resume()
        assert limiter.peek("k", 5, 60.0).remaining == 4


def test_a_refused_command_is_a_clear_error(limiter, client):
    client.set(limiter.state_key("k", "sliding"), "not a sorted set")
    with pytest.raises(errors.RateLimiterUnavailable, match="WRONGTYPE"):
        limiter.hit("k", 5, 60.0, algorithm="sliding")
