"""Global rate limits on tasks, with real workers sharing one limit.

``test_rate_invariant.py`` checks the limit on run starts end to end (two
worker processes and beat); the tests here check one behaviour each, with
a worker in the test process.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock import RateLimiter, signals
from celery_redlock.errors import RateLimited
from celery_redlock.testing import RedisServer

from .rate_checker import START_JITTER, Model, judge
from .support import in_process_worker, most_in_any_window, run_times

pytestmark = pytest.mark.celery


def test_twenty_tasks_at_five_per_second_all_run_within_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited"]
    with in_process_worker(app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    times = run_times(app, "limited")
    assert len(times) == 20
    # Bursts of 5, one window (1 s and the 50 ms margin) apart.
    assert times[-1] - times[0] >= 3 * 1.05
    assert most_in_any_window(times, 1.0) <= 5


def test_sliding_window_never_exceeds_the_limit_in_any_second(app: Celery) -> None:
    task = app.tasks["t.limited_sliding"]  # names the default algorithm
    with in_process_worker(app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    times = run_times(app, "limited")
    assert times[-1] - times[0] >= 3.0
    # The margin covers the moment between a run's admission and its start.
    assert most_in_any_window(times, 1.0) <= 5


def test_limit_holds_across_two_workers(app: Celery, worker_process: Any) -> None:
    worker_process(concurrency=2)
    task = app.tasks["t.limited_sliding"]
    with in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    events = [e for e in app.witness.events() if e[0] == "run"]
    assert len({e[4] for e in events}) >= 2, "both workers should have run some"
    times = sorted(float(e[3]) for e in events)
    assert times[-1] - times[0] >= 3.0
    assert most_in_any_window(times, 1.0) <= 5


def test_skip_drops_the_runs_over_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited_skip"]
    with in_process_worker(app, "threads"):
        results = [task.delay(n) for n in range(5)]
        time.sleep(1.5)
        states_seen = sorted(result.state for result in results)
    assert len(run_times(app, "limited_skip")) == 2
    # Skipped runs end as ignored: no result is written for them.
    assert states_seen == [states.PENDING] * 3 + [states.SUCCESS] * 2


def test_raise_fails_the_runs_over_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited_raise"]
    with in_process_worker(app, "threads", concurrency=1):
        assert task.delay(1).get(timeout=10) == 1
        assert task.delay(2).get(timeout=10) == 2
        with pytest.raises(RateLimited, match="rate limit"):
            task.delay(3).get(timeout=10)


def test_rate_limit_retries_do_not_use_up_max_retries(app: Celery) -> None:
    task = app.tasks["t.limited_tight"]  # 2/s, max_retries=1
    with in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(n) for n in range(8)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(8))


def test_limiter_down_retries_the_task_and_loses_nothing(
    make_app: Any, servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    counters: RedisServer = servers[4]
    app = make_app(redlock_rate_limit_url=counters.url)
    counters.kill()
    task = app.tasks["t.limited"]
    requeued: list[str] = []
    with in_process_worker(app, "threads"):
        results = [task.delay(n) for n in range(5)]
        deadline = time.monotonic() + 10
        while len({r.task_id for r in results if r.state == states.RETRY}) < 5:
            assert time.monotonic() < deadline, "every run should have been re-queued"
            time.sleep(0.05)
        requeued = [r.task_id for r in results if r.state == states.RETRY]
        counters.restart()
        assert sorted(result.get(timeout=30) for result in results) == list(range(5))
    assert len(requeued) == 5
    # The outage and the recovery are logged once each, not once per re-queued run.
    outage = [r for r in caplog.records if r.name == "celery_redlock.ratelimit"]
    assert [r.levelno for r in outage] == [logging.WARNING, logging.WARNING]
    per_run = [r for r in caplog.records if r.name == "celery_redlock.task"]
    assert all(r.levelno < logging.WARNING for r in per_run)


def test_limiter_down_with_allow_runs_unchecked(make_app: Any, servers: Any) -> None:
    counters: RedisServer = servers[4]
    app = make_app(redlock_rate_limit_url=counters.url, redlock_rate_limit_on_unavailable="allow")
    counters.kill()
    task = app.tasks["t.limited_skip"]  # 2/m: unchecked, all 4 run
    with in_process_worker(app, "threads"):
        results = [task.delay(n) for n in range(4)]
        assert sorted(result.get(timeout=10) for result in results) == list(range(4))


def test_a_fallback_redis_decides_while_the_first_is_down(make_app: Any, servers: Any) -> None:
    counters, fallback = servers[4], servers[2]
    app = make_app(redlock_rate_limit_url=counters.url, redlock_rate_limit_fallback=fallback.url)
    counters.kill()
    task = app.tasks["t.limited_skip"]  # 2/m, skip: the fallback counts and skips
    with in_process_worker(app, "threads", concurrency=1):
        results = [task.delay(n) for n in range(4)]
        deadline = time.monotonic() + 10
        while any(r.state == states.PENDING for r in results[:2]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
    assert len(run_times(app, "limited_skip")) == 2
    assert fallback.client().exists("t:rate:{t.limited_skip}:sliding")


def test_a_run_that_finds_its_lock_busy_spends_no_rate_budget(app: Celery) -> None:
    busy: list[str] = []

    def note(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        busy.append(str(task_id))

    signals.lock_busy.connect(note, weak=False)
    try:
        with in_process_worker(app, "threads", concurrency=4):
            app.tasks["t.hold"].delay("minute", 1.5)
            deadline = time.monotonic() + 10
            while not [e for e in app.witness.events() if e[0] == "hold-start"]:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            results = [app.tasks["t.rate_busy_minute"].delay("minute") for _ in range(3)]
            for result in results:
                result.get(timeout=30)
    finally:
        signals.lock_busy.disconnect(note)
    assert busy, "the runs should have found the lock busy"
    limiter = RateLimiter(app.conf.redlock_nodes[0], key_prefix="t:rate:", margin=0.05)
    try:
        # 100 per minute: exactly the three runs that started were counted.
        assert limiter.peek("t.rate_busy_minute", "100/m").remaining == 97
    finally:
        limiter.close()


def test_a_cost_counts_several_units_per_run(app: Celery) -> None:
    task = app.tasks["t.rate_cost"]  # 6/s, cost = the argument
    with in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(3) for _ in range(6)]
        for result in results:
            result.get(timeout=30)
    starts = [float(e[3]) for e in app.witness.events() if e[:2] == ["start", "rate_cost"]]
    # Two runs of 3 units per window of 6: three windows apart at least.
    span = max(starts) - min(starts)
    assert judge(starts, [Model(2, 1.0, margin=0.05)], expected=span, jitter=START_JITTER) == []
    assert span >= 2 * 1.05


def test_a_callable_rate_gives_each_tenant_its_plan(app: Celery) -> None:
    task = app.tasks["t.rate_plan"]  # small: 2/s, big: 20/s
    with in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(tenant) for tenant in ["small"] * 6 + ["big"] * 6]
        for result in results:
            result.get(timeout=30)
    events = app.witness.events()
    small = [float(e[3]) for e in events if e[:2] == ["start", "rate_plan:small"]]
    big = [float(e[3]) for e in events if e[:2] == ["start", "rate_plan:big"]]
    span = max(small) - min(small)
    assert judge(small, [Model(2, 1.0, margin=0.05)], expected=span, jitter=START_JITTER) == []
    assert span >= 2 * 1.05  # the small plan's 2/s, not the big one's
    assert max(big) - min(big) < 1.0  # all six within one burst of its 20/s


def test_beat_publishes_are_limited_at_the_source(app: Celery) -> None:
    task = app.tasks["t.limited_skip"]  # 2/m
    beat = {"headers": {"celery_beat_task": True}}
    published = [task.apply_async((n,), **beat) for n in range(5)]
    refused = [result for result in published if result.state == states.IGNORED]
    assert len(refused) == 3
    with in_process_worker(app, "threads"):
        for result in published:
            if result not in refused:
                assert result.get(timeout=10) in range(5)
    # Counted at publish in the publish budget, and again in the limit's own
    # when they started: the two published ticks both ran.
    assert len(run_times(app, "limited_skip")) == 2


def test_beat_ticks_admitted_at_publish_start_at_the_limits_pace(app: Celery) -> None:
    task = app.tasks["t.limited"]  # 5/s
    beat = {"headers": {"celery_beat_task": True}}
    published = [task.apply_async((n,), **beat) for n in range(5)]
    time.sleep(1.2)  # a second window of the publish budget
    published += [task.apply_async((n,), **beat) for n in range(5, 10)]
    assert not [result for result in published if result.state == states.IGNORED]
    # Ten ticks queued while no worker ran: they start five per window, not at once.
    with in_process_worker(app, "threads", concurrency=8):
        assert sorted(result.get(timeout=30) for result in published) == list(range(10))
    times = run_times(app, "limited")
    assert len(times) == 10
    assert most_in_any_window(times, 1.0) <= 5


def test_beat_publish_with_the_limiter_down_is_not_lost(
    make_app: Any, servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Beat only logs what apply_async raises: refusing the publish would lose the tick.
    caplog.set_level(logging.INFO, logger="celery_redlock.task")
    counters: RedisServer = servers[4]
    app = make_app(redlock_rate_limit_url=counters.url)
    counters.kill()
    task = app.tasks["t.limited_skip"]
    result = task.apply_async((7,), headers={"celery_beat_task": True})
    assert result.state == states.PENDING  # queued, not refused
    counters.restart()
    with in_process_worker(app, "threads"):
        assert result.get(timeout=30) == 7
    # Not counted at publish, and counted when it started.
    assert counters.client().exists(f"t:rate:{{{task.name}}}:sliding")
    assert not counters.client().exists(f"t:rate:{{{task.name}}}:publish:sliding")
    assert any("not checked" in record.getMessage() for record in caplog.records)
