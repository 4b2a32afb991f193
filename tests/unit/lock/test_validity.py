"""Validity and drift arithmetic on the monotonic clock (no Redis)."""

from __future__ import annotations

import time

import pytest
from freezegun import freeze_time

from celery_redlock import _clock


def test_drift_is_one_percent_plus_two_ms():
    assert _clock.drift(10.0) == pytest.approx(0.102)
    assert _clock.drift(1.0) == pytest.approx(0.012)


def test_validity_counts_from_the_start_of_this_attempt():
    with freeze_time("2026-01-01 00:00:00") as frozen:
        started = _clock.monotonic()
        frozen.tick(0.25)
        assert _clock.validity(10.0, started, _clock.monotonic()) == pytest.approx(
            10.0 - 0.25 - 0.102
        )


def test_an_attempt_that_took_longer_than_the_ttl_has_no_validity():
    with freeze_time("2026-01-01 00:00:00") as frozen:
        started = _clock.monotonic()
        frozen.tick(0.995)
        assert _clock.validity(1.0, started, _clock.monotonic()) <= 0


def test_clock_seam_follows_time_monotonic():
    with freeze_time("2026-01-01 00:00:00") as frozen:
        first = _clock.monotonic()
        assert first == time.monotonic()
        frozen.tick(3)
        assert _clock.monotonic() - first == pytest.approx(3)


def test_lock_validity_uses_the_monotonic_seam(monkeypatch):
    from celery_redlock import Redlock

    now = [100.0]
    monkeypatch.setattr(_clock, "monotonic", lambda: now[0])
    redlock = Redlock(["redis://127.0.0.1:1/0"])
    lock = redlock.lock("k", ttl=10.0)
    # State as a successful attempt at t=100 would leave it.
    lock._value = "token"
    lock._valid_until = 100.0 + 10.0 - _clock.drift(10.0)
    assert lock.validity == pytest.approx(9.898)
    now[0] = 105.0
    assert lock.validity == pytest.approx(4.898)
    assert lock.locked()
    now[0] = 110.0
    assert lock.validity == 0.0
    assert not lock.locked()


def test_seconds_become_milliseconds_rounded_up_never_below_one():
    assert _clock.to_ms(30.0) == 30000
    assert _clock.to_ms(0.0305) == 31  # a ttl never shrinks on its way to Redis
    assert _clock.to_ms(1.1) == 1100  # float noise (1100.0000000000002) adds nothing
    assert _clock.to_ms(0.0001) == 1


def test_a_redlock_and_the_settings_share_one_default_ttl_and_node_timeout():
    from celery_redlock import Redlock
    from celery_redlock.tasks.settings import Settings

    redlock = Redlock(["redis://127.0.0.1:1/0"])
    settings = Settings(nodes=("redis://127.0.0.1:1/0",))
    assert (redlock.default_ttl, redlock.node_timeout) == (60.0, 0.05)
    assert (settings.default_ttl, settings.node_timeout) == (60.0, 0.05)
    assert redlock.lock("k").ttl == 60.0
