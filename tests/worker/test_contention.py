"""Runs that find their lock busy: re-queued until it is free, never failed by default.

A busy-lock re-queue (``on_lock_busy="retry"``, the default) is not one of
Celery's ``max_retries``: the run's ``retries`` stay as they were, and its
busy re-queues are counted in the ``redlock_busy`` header instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock import Redlock, signals
from celery_redlock.errors import LockNotAcquired
from celery_redlock.testing import RedisServer

from .support import WorkerProcess, in_process_worker, overlaps

pytestmark = pytest.mark.celery


@pytest.fixture
def holder(lock_nodes: list[RedisServer]) -> Iterator[Redlock]:
    """A Redlock of the test's own, on the workers' nodes, to hold a task's lock.

    Its node timeout is above a loaded machine's scheduling delay: a hold or
    release that timed out would change what the workers find.
    """
    redlock = Redlock([node.url for node in lock_nodes], key_prefix="t:", node_timeout=1.0)
    yield redlock
    redlock.close()


@pytest.fixture
def note_busy(app: Celery) -> Iterator[None]:
    """Record ``lock_busy`` of in-process workers on the witness, as the subprocess app does."""

    def note(
        sender: Any = None, task_id: Any = None, key: Any = None, action: Any = None, **_: Any
    ) -> None:
        app.witness.event("busy", str(key), task_id, action=action)

    signals.lock_busy.connect(note, weak=False)
    yield
    signals.lock_busy.disconnect(note)


def busy_counts(app: Celery, key: str) -> dict[str, int]:
    """Busy events per task id on lock ``key``."""
    counts: dict[str, int] = {}
    for event in app.witness.events():
        if event[0] == "busy" and event[1] == key:
            counts[event[2]] = counts.get(event[2], 0) + 1
    return counts


def wait_busy(app: Celery, key: str, ids: list[str], times: int = 1, timeout: float = 60) -> None:
    """Wait until each of ``ids`` found lock ``key`` busy at least ``times`` times."""
    deadline = time.monotonic() + timeout
    while True:
        counts = busy_counts(app, key)
        if all(counts.get(task_id, 0) >= times for task_id in ids):
            return
        assert time.monotonic() < deadline, f"busy events so far: {counts}"
        time.sleep(0.05)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_six_same_user_syncs_with_default_settings_all_succeed_one_at_a_time(
    app: Celery,
    pool: str,
    holder: Redlock,
    note_busy: None,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    # The README's task (lock_key="sync-user:{user_id}", lock_ttl=60, nothing else;
    # Celery's default max_retries=3). A sync of the user already runs elsewhere, so
    # every one of the six finds the lock busy before any of them can run.
    task = app.tasks["t.sync_user"]
    assert task.max_retries == 3
    running = holder.lock("sync-user:7", ttl=60)
    if pool == "prefork":
        worker_process(concurrency=3)
        worker = None
    else:
        worker = in_process_worker(app, "threads", concurrency=6)
        worker.__enter__()
    try:
        # Taken once the worker is up: a slow start spends none of its ttl.
        assert running.acquire(blocking=False)
        results = [task.delay(7) for _ in range(6)]
        wait_busy(app, "sync-user:7", [result.id for result in results])
        running.release()
        outcomes = [result.get(timeout=240) for result in results]
        assert [result.state for result in results] == [states.SUCCESS] * 6
    finally:
        if worker is not None:
            worker.__exit__(None, None, None)
    events = app.witness.events()
    assert len([e for e in events if e[0] == "enter" and e[1] == "sync-user:7"]) == 6
    assert overlaps(events) == 0
    assert len({outcome["token"] for outcome in outcomes}) == 6
    # Busy re-queues were counted apart from Celery's retries.
    assert all(outcome["busy"] >= 1 for outcome in outcomes), outcomes
    assert all(outcome["retries"] == 0 for outcome in outcomes), outcomes


def test_a_task_with_max_retries_0_runs_after_several_busy_requeues(
    app: Celery, holder: Redlock, note_busy: None
) -> None:
    task = app.tasks["t.busy_zero"]
    assert task.max_retries == 0
    running = holder.lock("zero:a", ttl=60)
    assert running.acquire(blocking=False)
    with in_process_worker(app, "threads"):
        result = task.delay("a")
        wait_busy(app, "zero:a", [result.id], times=2)
        running.release()
        outcome = result.get(timeout=60)
    assert result.state == states.SUCCESS
    assert outcome["retries"] == 0
    assert outcome["busy"] >= 2


def test_lock_busy_max_requeues_fails_the_run_after_that_many_busy_requeues(
    app: Celery, holder: Redlock, note_busy: None
) -> None:
    task = app.tasks["t.busy_budget"]  # lock_busy_max_requeues=2
    running = holder.lock("budget:b", ttl=60)
    assert running.acquire(blocking=False)
    try:
        with in_process_worker(app, "threads"):
            result = task.delay("b")
            with pytest.raises(LockNotAcquired, match="lock_busy_max_requeues=2"):
                result.get(timeout=60)
    finally:
        running.release()
    assert result.state == states.FAILURE
    # Found busy three times: re-queued after the first two, failed at the third.
    assert busy_counts(app, "budget:b") == {result.id: 3}
    actions = [e[5] for e in app.witness.events() if e[:2] == ["busy", "budget:b"]]
    assert actions == ["action=retry", "action=retry", "action=raise"]
