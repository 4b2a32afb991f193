"""The heartbeat's schedule, driven round by round on a frozen clock.

No thread and no Redis: the renewal thread is parked and each test calls
the round itself; the locks are stand-ins that record renewals and expire
on the frozen clock.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory

from celery_redlock._clock import monotonic
from celery_redlock.lock import renewal as heartbeat_module
from celery_redlock.lock.held_lease import HeldLock
from celery_redlock.lock.redlock import LOST, RENEWED, UNREACHABLE
from celery_redlock.lock.renewal import Heartbeat
from celery_redlock.tasks.run_endings import BUSY_BACKOFF_MAX, busy_countdown


class Nodes:
    """A Redlock stand-in: records each renew call and answers as told."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.answer = RENEWED

    def renew(self, locks: list[FakeLock]) -> list[str]:
        self.calls.append([lock.name for lock in locks])
        if self.answer == RENEWED:
            for lock in locks:
                lock.expires = monotonic() + lock.ttl
        return [self.answer] * len(locks)


class FakeLock:
    def __init__(self, name: str, ttl: float, nodes: Nodes) -> None:
        self.name = name
        self.ttl = ttl
        self.redlock = nodes
        self.expires = monotonic() + ttl
        self.lost_reason = ""

    @property
    def validity(self) -> float:
        return self.expires - monotonic()

    def locked(self) -> bool:
        return self.validity > 0


class ParkedThread:
    """Stands in for the renewal thread: the test runs the rounds."""

    def __init__(self, **_: Any) -> None: ...

    def start(self) -> None: ...

    def is_alive(self) -> bool:
        return True


@pytest.fixture
def clock() -> Iterator[FrozenDateTimeFactory]:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        yield frozen


@pytest.fixture
def beat(monkeypatch: pytest.MonkeyPatch, clock: FrozenDateTimeFactory) -> Heartbeat:
    parked = types.SimpleNamespace(
        Thread=ParkedThread,
        Lock=threading.Lock,
        Event=threading.Event,
        current_thread=threading.current_thread,
    )
    monkeypatch.setattr(heartbeat_module, "threading", parked)
    return Heartbeat()


def hold(beat: Heartbeat, name: str, ttl: float, nodes: Nodes, **kwargs: Any) -> HeldLock:
    return beat.hold(FakeLock(name, ttl, nodes), task_id=name, **kwargs)  # type: ignore[arg-type]


def test_a_lock_is_renewed_at_a_third_of_its_ttl(
    beat: Heartbeat, clock: FrozenDateTimeFactory
) -> None:
    nodes = Nodes()
    hold(beat, "a", 3.0, nodes)
    clock.tick(0.5)
    assert beat._round() == pytest.approx(0.5)  # the tick is at 1 s
    assert nodes.calls == []
    clock.tick(0.5)
    beat._round()
    assert nodes.calls == [["a"]]


def test_locks_due_before_the_next_tick_share_one_round_trip(
    beat: Heartbeat, clock: FrozenDateTimeFactory
) -> None:
    nodes = Nodes()
    hold(beat, "a", 3.0, nodes)
    clock.tick(0.6)
    hold(beat, "b", 3.0, nodes)  # due at 1.6 s, before the tick after 1 s
    clock.tick(0.4)
    beat._round()
    assert nodes.calls == [["a", "b"]]


def test_a_stalled_lock_is_not_renewed_and_is_lost_when_it_runs_out(
    beat: Heartbeat, clock: FrozenDateTimeFactory
) -> None:
    nodes = Nodes()
    lost: list[str] = []
    held = hold(
        beat, "hung", 3.0, nodes, progress_timeout=0.5, on_lost=lambda held, why: lost.append(why)
    )
    for _ in range(2):
        clock.tick(1.0)
        beat._round()
        assert nodes.calls == []
        assert not held.lost  # still valid until 3 s from the start
    clock.tick(1.1)
    beat._round()
    assert held.lost
    assert lost == ["no progress for progress_timeout; lock expired"]


def test_progress_keeps_a_lock_renewed(beat: Heartbeat, clock: FrozenDateTimeFactory) -> None:
    nodes = Nodes()
    held = hold(beat, "busy", 3.0, nodes, progress_timeout=0.5)
    for _ in range(4):
        clock.tick(0.8)
        held.last_progress = monotonic()  # what self.heartbeat() records
        clock.tick(0.2)
        beat._round()
    assert nodes.calls == [["busy"]] * 4
    assert not held.lost


def test_unreachable_nodes_are_asked_again_within_a_quarter_of_the_validity(
    beat: Heartbeat, clock: FrozenDateTimeFactory
) -> None:
    nodes = Nodes()
    held = hold(beat, "a", 3.0, nodes)
    nodes.answer = UNREACHABLE
    clock.tick(1.0)
    beat._round()
    assert held.next_due == pytest.approx(monotonic() + 0.5)  # 2 s valid / 4
    assert not held.lost


def test_a_renewal_the_nodes_refuse_marks_the_lock_lost(
    beat: Heartbeat, clock: FrozenDateTimeFactory
) -> None:
    nodes = Nodes()
    held = hold(beat, "a", 3.0, nodes)
    nodes.answer = LOST
    clock.tick(1.0)
    beat._round()
    assert held.lost
    assert held.lost_code == "renewal_failed"


@pytest.mark.parametrize(
    ("requeues", "ttl", "jitter", "countdown"),
    [
        (0, 60.0, 1.0, 1.0),
        (1, 60.0, 1.0, 2.0),
        (3, 60.0, 0.5, 4.0),
        (4, 60.0, 1.5, 24.0),
        (8, 1.0, 1.5, 1.5),  # capped at the lock's ttl
        (8, 60.0, 1.0, BUSY_BACKOFF_MAX),  # and at 30 s whatever the ttl
        (8, 3600.0, 1.5, 1.5 * BUSY_BACKOFF_MAX),
        (10_000, 60.0, 1.0, BUSY_BACKOFF_MAX),  # no overflow however many re-queues
        (-1, 60.0, 1.0, 1.0),  # a forged header cannot shorten the first wait
    ],
)
def test_busy_lock_backoff_doubles_per_requeue_up_to_the_ttl_and_a_maximum(
    requeues: int, ttl: float, jitter: float, countdown: float
) -> None:
    assert busy_countdown(requeues, ttl, jitter) == countdown


def test_busy_lock_backoff_grows_with_each_requeue_until_the_cap() -> None:
    waits = [busy_countdown(n, 60.0, 1.0) for n in range(8)]
    assert waits == sorted(waits)
    assert waits[0] < waits[4] < waits[5] == waits[7] == BUSY_BACKOFF_MAX


@pytest.mark.parametrize(
    ("reason", "lost"),
    [
        pytest.param("gone from 2 nodes", True, id="lost-on-the-nodes"),
        pytest.param(None, False, id="released-during-the-round"),
    ],
)
def test_a_lock_its_owner_released_during_a_round_is_not_reported_lost(
    beat: Heartbeat, clock: FrozenDateTimeFactory, reason: str | None, lost: bool
) -> None:
    # Redlock.renew answers LOST for a lock no longer held; only a lock that
    # was lost has a reason: one released by its owner meanwhile has none.
    nodes = Nodes()
    nodes.answer = LOST
    held = hold(beat, "a", 3.0, nodes)
    held.lock.lost_reason = reason
    clock.tick(1.0)
    beat._round()
    assert nodes.calls == [["a"]]
    assert held.lost is lost
