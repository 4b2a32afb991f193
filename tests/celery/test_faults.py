"""Celery-level faults: a killed worker, a stalled broker, lock nodes down at task start."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock.testing import RedisServer

from .conftest import in_process_worker
from .test_locked_task import overlaps

pytestmark = [pytest.mark.celery, pytest.mark.faults]


def wait_for_event(app: Celery, kind: str, timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in app.witness.events():
            if event[0] == kind:
                return event
        time.sleep(0.02)
    raise AssertionError(f"no {kind!r} event within {timeout} s")


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
        deadline = time.monotonic() + 10
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
