"""Global rate limits on tasks, with real workers sharing one limit."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock.errors import RateLimited
from celery_redlock.testing import RedisServer

from .conftest import in_process_worker

pytestmark = pytest.mark.celery


def run_times(app: Celery, key: str) -> list[float]:
    return sorted(float(e[3]) for e in app.witness.events() if e[0] == "run" and e[1] == key)


def most_in_any_window(times: list[float], window: float) -> int:
    return max(
        (sum(1 for t in times[i:] if t < start + window) for i, start in enumerate(times)),
        default=0,
    )


def test_twenty_tasks_at_five_per_second_all_run_within_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited"]
    with in_process_worker(app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    times = run_times(app, "limited")
    assert len(times) == 20
    # Fixed windows of 1 s: 5 per window, so 4 windows at least.
    assert times[-1] - times[0] > 2.0


def test_sliding_window_never_exceeds_the_limit_in_any_second(app: Celery) -> None:
    task = app.tasks["t.limited_sliding"]
    with in_process_worker(app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    times = run_times(app, "limited")
    assert times[-1] - times[0] >= 3.0
    # Runs start a moment after their admission; allow that moment.
    assert most_in_any_window(times, 0.95) <= 5


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
    assert most_in_any_window(times, 0.95) <= 5


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
    counters: RedisServer = servers[4]
    app = make_app(redlock_rate_limit_url=counters.url)
    counters.kill()
    task = app.tasks["t.limited"]
    with in_process_worker(app, "threads"):
        result = task.delay(42)
        time.sleep(1.0)
        assert result.state != states.SUCCESS
        counters.restart()
        assert result.get(timeout=30) == 42
    assert any("Redis unavailable" in record.getMessage() for record in caplog.records)


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
    # Counted once, at publish: the worker did not count (and skip) them again.
    assert len(run_times(app, "limited_skip")) == 2


def test_beat_publish_with_the_limiter_down_is_not_lost(
    make_app: Any, servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Beat only logs what apply_async raises: refusing the publish would lose the tick.
    counters: RedisServer = servers[4]
    app = make_app(redlock_rate_limit_url=counters.url)
    counters.kill()
    task = app.tasks["t.limited_skip"]
    result = task.apply_async((7,), headers={"celery_beat_task": True})
    assert result.state == states.PENDING  # queued, not refused
    counters.restart()
    with in_process_worker(app, "threads"):
        assert result.get(timeout=30) == 7
    # Not counted at publish, so the worker counted it.
    assert counters.client().exists(f"t:rate:{{{task.name}}}:fixed")
    assert any("published unchecked" in record.getMessage() for record in caplog.records)
