"""Celery-level faults: a killed worker, a stalled broker, lock nodes down at task start."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock.testing import RedisServer

from .support import free_now, in_process_worker, overlaps, wait_for_event

pytestmark = [pytest.mark.celery, pytest.mark.faults]


def test_killed_worker_task_is_redelivered_and_runs_once_after_the_lock_expires(
    make_app: Any, worker_process: Any
) -> None:
    transport = {"visibility_timeout": 3, "unacked_restore_throttle": 1}
    app = make_app(broker_transport_options=transport)
    worker = worker_process(concurrency=1)
    result = app.tasks["t.crashy"].delay("k", 1.0)
    first = wait_for_event(app, "enter")
    worker.kill()
    killed = time.monotonic()
    # A fresh worker gets the message back once the visibility timeout passes.
    with in_process_worker(app, "threads"):
        assert result.get(timeout=40) == "done"
    events = app.witness.events()
    enters = [e for e in events if e[0] == "enter"]
    exits = [e for e in events if e[0] == "exit"]
    assert len(enters) == 2, events  # the killed run, then the re-delivered one
    assert len(exits) == 1
    # The second run started only after the dead run's lock (ttl 2 s) ran out.
    assert float(enters[1][3]) - float(first[3]) >= 2.0
    assert time.monotonic() - killed < 40
    assert result.state == states.SUCCESS


def test_stalled_broker_loses_no_task_and_breaks_no_lock(
    app: Celery, servers: Any, worker_process: Any
) -> None:
    broker: RedisServer = servers[3]
    worker_process(concurrency=2)
    results = [app.tasks["t.serial"].delay("b", 0.2) for _ in range(6)]
    wait_for_event(app, "exit")
    broker.pause()
    time.sleep(3.0)
    broker.resume()
    for result in results:
        result.get(timeout=60)
    events = app.witness.events()
    assert len([e for e in events if e[0] == "exit"]) == 6
    assert overlaps(events) == 0


def test_lock_nodes_down_at_task_start_retry_the_task_with_a_clear_log(
    app: Celery, lock_nodes: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    lock_nodes[0].kill()
    lock_nodes[1].kill()
    with in_process_worker(app, "threads"):
        result = app.tasks["t.serial"].delay("down", 0.0)
        deadline = time.monotonic() + 30  # a loaded machine's worker may be slow to get it
        while not any("Redis unavailable" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no log line about the unavailable nodes"
            time.sleep(0.05)
        assert result.state != states.SUCCESS
        lock_nodes[0].restart()
        lock_nodes[1].restart()
        assert result.get(timeout=30) == result.id
    line = next(r.getMessage() for r in caplog.records if "Redis unavailable" in r.getMessage())
    assert "t.serial" in line
    assert "re-queued" in line


def test_killed_pool_child_requeued_task_runs_again_within_seconds(
    make_app: Any, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    # The documented way to never lose a task: a killed pool child's task is
    # re-queued, not failed. Its lock (ttl 30 s) is freed by the worker's
    # main process at once, so the re-delivered copy need not wait it out.
    conf = {"task_acks_late": True, "task_reject_on_worker_lost": True}
    app = make_app(**conf)
    worker = worker_process(concurrency=3, conf=conf)
    killable = app.tasks["t.killable"]
    first = killable.delay("k")
    entered = wait_for_event(app, "enter")
    assert entered[2] == first.id
    assert not free_now(lock_nodes, "kill:k")
    # Another run of the key, waiting for the lock (lock_timeout 20 s).
    other = killable.delay("k", 0.5)
    # Taken before the kill: a test descheduled after it must not see a run
    # that started meanwhile as started before the kill.
    killed = time.monotonic()
    os.kill(int(entered[4]), signal.SIGKILL)
    assert first.get(timeout=30) == first.id
    assert other.get(timeout=30) == other.id
    events = app.witness.events()
    enters = [e for e in events if e[0] == "enter"]
    exits = {e[2]: float(e[3]) for e in events if e[0] == "exit"}
    assert len(enters) == 3, events  # the killed run, the re-delivered copy, the other run
    runs = sorted((float(e[3]), exits[e[2]], e[2]) for e in enters[1:])
    # Both later runs came after the kill, one after the other.
    assert runs[0][0] > killed
    assert runs[0][1] <= runs[1][0], runs
    again = next(start for start, _, task_id in runs if task_id == first.id)
    # Celery's pool notices a killed child when the child's sentinel fires,
    # or else at its next pool check (every 5 s); the lock is freed then, so
    # the re-run waits at most about that, never the lock's 30 s ttl (half
    # of it allowed: a loaded machine re-delivers and re-runs late).
    log = worker.log()
    assert again - killed < 15.0, f"re-run {again - killed:.1f} s after the kill\n{log}"
    assert "WorkerLostError" in log
    assert f"freed lock 'kill:k' of task {first.id}" in log
    assert "re-queued, will run again" in log
    print(f"re-run after {again - killed:.2f} s; other run after {runs[0][0] - killed:.2f} s")


def test_killed_pool_child_requeued_task_runs_at_once_on_another_worker(
    make_app: Any, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    # A second, idle worker takes the re-queued message the moment it is
    # back in the queue: the dead run's lock must be free by then, or the
    # copy, finding its own task id holding the lock, waits out the ttl.
    conf = {"task_acks_late": True, "task_reject_on_worker_lost": True}
    app = make_app(**conf)
    worker_process(concurrency=1, conf=conf)
    first = app.tasks["t.killable"].delay("k")
    entered = wait_for_event(app, "enter")
    worker_process(pool="threads", concurrency=4, conf=conf)
    killed = time.monotonic()  # before the kill (see the test above)
    os.kill(int(entered[4]), signal.SIGKILL)
    assert first.get(timeout=40) == first.id
    enters = [e for e in app.witness.events() if e[0] == "enter"]
    assert len(enters) == 2, enters
    again = float(enters[1][3])
    # Far from the 30 s ttl a copy finding its own dead run's lock would wait.
    assert again - killed < 15.0, f"re-run {again - killed:.1f} s after the kill"
    print(f"re-run after {again - killed:.2f} s, in process {enters[1][4]}")
