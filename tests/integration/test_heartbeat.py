"""The renewal thread against real nodes: batching, loss and progress."""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_redlock import redlock as redlock_module
from celery_redlock.errors import LockLost
from celery_redlock.heartbeat import Heartbeat
from tests.utils import evalsha_calls

pytestmark = pytest.mark.integration


def test_500_locks_renew_in_one_round_trip_per_node(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    locks = [redlock.lock(f"many:{n}", ttl=1.5) for n in range(500)]
    for lock in locks:
        assert lock.acquire(blocking=False)

    fan_outs: list[int] = []
    real_fan_out = redlock_module.fan_out

    def counting_fan_out(nodes: Any, calls: Any, timeout: float) -> Any:
        fan_outs.append(sum(len(node_calls) for node_calls in calls))
        return real_fan_out(nodes, calls, timeout)

    monkeypatch.setattr(redlock_module, "fan_out", counting_fan_out)
    before = [evalsha_calls(node) for node in nodes]
    beat = Heartbeat()
    held = [beat.hold(lock) for lock in locks]
    try:
        time.sleep(1.5 * 2.2)  # more than two ttls: every lock renewed at least 4 times
        assert all(lock.locked() for lock in locks)
        assert not any(h.lost for h in held)
    finally:
        beat.stop()
    rounds = len(fan_outs)
    commands = [evalsha_calls(node) - b for node, b in zip(nodes, before, strict=True)]
    # One pipelined send per node per round, however many locks are due.
    assert 4 <= rounds <= 8, fan_outs
    # After the first round every renewal round covers all 500 locks.
    assert all(calls == 500 * 3 for calls in fan_outs[1:]), fan_outs
    # Each node saw one EVALSHA per lock per round, nothing else.
    assert commands == [sum(fan_outs) // 3] * 3
    for lock in locks:
        lock.release()


def test_short_locks_do_not_wake_the_renewal_thread(servers: Any, make_redlock: Any) -> None:
    # In a busy worker a wake-up per task is a thread switch per task. A lock
    # released long before its first renewal is due must not cause one, also
    # when the thread last looked while no lock was held.
    redlock = make_redlock(list(servers)[:1])
    beat = Heartbeat()
    try:
        for n in range(50):
            lock = redlock.lock(f"short:{n}", ttl=30.0)
            assert lock.acquire(blocking=False)
            beat.drop(beat.hold(lock))
            assert lock.release()
            time.sleep(0.002)  # time for the thread to run, were it woken
        # The first lock starts the thread, which looks once.
        assert beat.rounds <= 2
        # A lock that needs renewing sooner than the thread's tick wakes it.
        lock = redlock.lock("shorter", ttl=0.3)
        assert lock.acquire(blocking=False)
        held = beat.hold(lock)
        time.sleep(0.3 * 2)
        assert lock.locked()
        beat.drop(held)
        assert lock.release()
    finally:
        beat.stop()


def test_lock_lost_to_a_majority_is_reported(servers: Any, make_redlock: Any) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("doomed", ttl=1.0)
    assert lock.acquire(blocking=False)
    lost: list[str] = []
    beat = Heartbeat()
    held = beat.hold(lock, task_id="t1", on_lost=lambda held, reason: lost.append(reason))
    try:
        # Someone wipes the key on two nodes: the next renewal must notice.
        nodes[0].flush()
        nodes[1].flush()
        deadline = time.monotonic() + 3
        while not held.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.lost
        assert lost
        assert "majority" in lost[0]
        assert held.lost_code == "renewal_failed"
        with pytest.raises(LockLost, match="doomed"):
            beat.progress(held)
    finally:
        beat.stop()


def test_stalled_task_stops_renewing_and_then_learns_it(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(list(servers)[:3])
    lock = redlock.lock("stalled", ttl=0.6)
    assert lock.acquire(blocking=False)
    beat = Heartbeat()
    held = beat.hold(lock, progress_timeout=0.3)
    try:
        time.sleep(1.2)  # no progress: renewal stopped, the ttl ran out
        other = redlock.lock("stalled", ttl=1.0)
        assert other.acquire(blocking=False)
        other.release()
        assert held.lost
        assert held.lost_code == "stalled"
        with pytest.raises(LockLost):
            beat.progress(held)
    finally:
        beat.stop()


def test_progress_keeps_a_lock_with_a_progress_timeout(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(list(servers)[:3])
    lock = redlock.lock("busy-worker", ttl=0.6)
    assert lock.acquire(blocking=False)
    beat = Heartbeat()
    held = beat.hold(lock, progress_timeout=0.3)
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            beat.progress(held)
            time.sleep(0.05)
        assert lock.locked()
        assert not held.lost
    finally:
        beat.stop()
        lock.release()
