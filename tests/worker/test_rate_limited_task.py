"""Global rate limits on tasks, with real workers sharing one limit.

``test_rate_invariant.py`` checks the limit on run starts end to end (two
worker processes and beat); the tests here check one behaviour each, with
a worker in the test process.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock import LockedTask, RateLimiter, signals
from celery_redlock.errors import RateLimited
from celery_redlock.testing import RedisServer

from .rate_checker import CLOCK_SPARE, surely_within
from .support import admissions, in_process_worker, looker, preruns_noted, run_times

pytestmark = pytest.mark.celery

#: A window of these tasks' per-second limits as the limiter counts it: the
#: period and the default 50 ms margin (redlock_rate_limit_margin).
WINDOW = 1.0 + 0.05 - CLOCK_SPARE


def test_twenty_tasks_at_five_per_second_all_run_within_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited"]
    with preruns_noted(app), in_process_worker(app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    admitted = admissions(app, "run", "limited")
    assert len(admitted) == 20
    # Bursts of 5, one window (1 s and the 50 ms margin) apart. Judged on
    # brackets of the admissions (a start is recorded late on a loaded machine).
    assert max(s for _, s in admitted) - min(p for p, _ in admitted) >= 3 * 1.05
    assert surely_within(admitted, 6, WINDOW) == []


def test_sliding_window_never_exceeds_the_limit_in_any_second(app: Celery) -> None:
    task = app.tasks["t.limited_sliding"]  # names the default algorithm
    with preruns_noted(app), in_process_worker(app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    admitted = admissions(app, "run", "limited")
    assert len(admitted) == 20
    assert max(s for _, s in admitted) - min(p for p, _ in admitted) >= 3 * 1.05
    assert surely_within(admitted, 6, WINDOW) == []


def test_limit_holds_across_two_workers(app: Celery, worker_process: Any) -> None:
    worker_process(concurrency=2)  # notes its deliveries itself
    task = app.tasks["t.limited_sliding"]
    with preruns_noted(app), in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(n) for n in range(20)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(20))
    events = [e for e in app.witness.events() if e[0] == "run"]
    assert len({e[4] for e in events}) >= 2, "both workers should have run some"
    admitted = admissions(app, "run", "limited")
    assert len(admitted) == 20
    assert max(s for _, s in admitted) - min(p for p, _ in admitted) >= 3 * 1.05
    assert surely_within(admitted, 6, WINDOW) == []


def test_skip_drops_the_runs_over_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited_skip"]
    skipped: list[str] = []

    def note(sender: Any = None, task_id: str = "", action: str = "", **_: Any) -> None:
        if action == "skip":
            skipped.append(task_id)

    # Judged once every run was decided (two ran, three were skipped), not
    # after a fixed time a loaded machine may need more than.
    signals.rate_limited.connect(note, weak=False)
    try:
        with in_process_worker(app, "threads"):
            results = [task.delay(n) for n in range(5)]
            deadline = time.monotonic() + 30
            while len(skipped) < 3 or sum(r.state == states.SUCCESS for r in results) < 2:
                assert time.monotonic() < deadline, (skipped, [r.state for r in results])
                time.sleep(0.05)
            time.sleep(0.5)  # a skipped run that ran anyway would show by now
            states_seen = sorted(result.state for result in results)
    finally:
        signals.rate_limited.disconnect(note)
    assert len(skipped) == 3
    assert len(run_times(app, "limited_skip")) == 2
    # Skipped runs end as ignored: no result is written for them.
    assert states_seen == [states.PENDING] * 3 + [states.SUCCESS] * 2


def test_raise_fails_the_runs_over_the_limit(app: Celery) -> None:
    task = app.tasks["t.limited_raise"]
    with in_process_worker(app, "threads", concurrency=1):
        assert task.delay(1).get(timeout=30) == 1
        assert task.delay(2).get(timeout=30) == 2
        with pytest.raises(RateLimited, match="rate limit"):
            task.delay(3).get(timeout=30)


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
        deadline = time.monotonic() + 30
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
        assert sorted(result.get(timeout=30) for result in results) == list(range(4))


def test_a_fallback_redis_decides_while_the_first_is_down(make_app: Any, servers: Any) -> None:
    counters, fallback = servers[4], servers[2]
    app = make_app(redlock_rate_limit_url=counters.url, redlock_rate_limit_fallback=fallback.url)
    counters.kill()
    task = app.tasks["t.limited_skip"]  # 2/m, skip: the fallback counts and skips
    skipped = threading.Semaphore(0)

    def note(sender: Any = None, action: str = "", **_: Any) -> None:
        if action == "skip":
            skipped.release()

    # Judged once the last two were skipped: all four decided.
    signals.rate_limited.connect(note, weak=False)
    try:
        with in_process_worker(app, "threads", concurrency=1):
            results = [task.delay(n) for n in range(4)]
            deadline = time.monotonic() + 30
            while any(r.state == states.PENDING for r in results[:2]):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert skipped.acquire(timeout=30)
            assert skipped.acquire(timeout=30)
    finally:
        signals.rate_limited.disconnect(note)
    assert len(run_times(app, "limited_skip")) == 2
    assert fallback.client().exists("t:rate:{t.limited_skip}:sliding")


def test_a_run_that_finds_its_lock_busy_spends_no_rate_budget(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    busy: list[str] = []

    def note(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        busy.append(str(task_id))

    # The lock held here until each run has found it busy (a run held for a
    # fixed time may end before a loaded machine's runs reach it).
    holder = looker(lock_nodes)
    lock = holder.lock("rated:minute", ttl=30.0)
    assert lock.acquire(blocking=False)
    signals.lock_busy.connect(note, weak=False)
    try:
        with in_process_worker(app, "threads", concurrency=4):
            results = [app.tasks["t.rate_busy_minute"].delay("minute") for _ in range(3)]
            deadline = time.monotonic() + 30
            while not {result.id for result in results} <= set(busy):
                assert time.monotonic() < deadline, "the runs should have found the lock busy"
                time.sleep(0.02)
            lock.release()
            for result in results:
                result.get(timeout=30)
    finally:
        signals.lock_busy.disconnect(note)
        holder.close()
    assert busy, "the runs should have found the lock busy"
    limiter = RateLimiter(app.conf.redlock_nodes[0], key_prefix="t:rate:", margin=0.05)
    try:
        # 100 per minute: exactly the three runs that started were counted.
        assert limiter.peek("t.rate_busy_minute", "100/m").remaining == 97
    finally:
        limiter.close()


def test_a_cost_counts_several_units_per_run(app: Celery) -> None:
    task = app.tasks["t.rate_cost"]  # 6/s, cost = the argument
    with preruns_noted(app), in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(3) for _ in range(6)]
        for result in results:
            result.get(timeout=30)
    admitted = admissions(app, "start", "rate_cost")
    assert len(admitted) == 6
    # Two runs of 3 units per window of 6: three windows apart at least.
    assert surely_within(admitted, 3, WINDOW) == []
    assert max(s for _, s in admitted) - min(p for p, _ in admitted) >= 2 * 1.05


def test_a_callable_rate_gives_each_tenant_its_plan(app: Celery) -> None:
    task = app.tasks["t.rate_plan"]  # small: 2/s, big: 20/s
    with preruns_noted(app), in_process_worker(app, "threads", concurrency=4):
        results = [task.delay(tenant) for tenant in ["small"] * 6 + ["big"] * 6]
        for result in results:
            result.get(timeout=30)
    small = admissions(app, "start", "rate_plan:small")
    big = [s for _, s in admissions(app, "start", "rate_plan:big")]
    assert (len(small), len(big)) == (6, 6)
    assert surely_within(small, 3, WINDOW) == []
    # The small plan's 2/s, not the big one's.
    assert max(s for _, s in small) - min(p for p, _ in small) >= 2 * 1.05
    # All six in one burst of its 20/s: sooner than 2/s could let them in
    # (2 * 1.05 s); a loaded machine only starts them later.
    assert max(big) - min(big) < 2.0


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
    with preruns_noted(app), in_process_worker(app, "threads", concurrency=8):
        assert sorted(result.get(timeout=30) for result in published) == list(range(10))
    admitted = admissions(app, "run", "limited")
    assert len(admitted) == 10
    assert surely_within(admitted, 6, WINDOW) == []


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


def test_beats_publish_budget_and_the_runs_count_on_one_key_for_a_tuple(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    # JSON delivers the tuple as a list: rendered from the arguments as given,
    # beat's publish would count on "api:(3, 4)" and the run on "api:[3, 4]",
    # and an override or a reset of the one would miss the other.
    @app.task(
        base=LockedTask,
        bind=True,
        name="t.api_batch",
        shared=False,
        global_rate_limit="10/m",
        rate_limit_key="api:{ids}",
    )
    def api_batch(self: Any, ids: Any) -> str:
        return str(self.request.id)

    with in_process_worker(app, "threads"):
        result = api_batch.apply_async(((3, 4),), headers={"celery_beat_task": True})
        assert result.get(timeout=30) == result.id
    with lock_nodes[0].client() as client:  # the limiter's node: the first lock node
        found = {key.decode() for key in client.scan_iter("t:rate:*")}
    assert {key.partition("}")[0] for key in found} == {"t:rate:{api:[3, 4]"}, found
    assert any(":publish:" in key for key in found), found
