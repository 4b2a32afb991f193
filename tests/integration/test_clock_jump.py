"""A client wall clock that jumps does not touch lock arithmetic (monotonic time only)."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("jump", [3600.0, -3600.0], ids=["forward", "backward"])
def test_wall_clock_jump_changes_no_validity(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch, jump: float
) -> None:
    redlock = make_redlock(list(servers)[:3])
    lock = redlock.lock("clock", ttl=2.0)
    assert lock.acquire(blocking=False)
    before = lock.validity
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + jump)
    after = lock.validity
    assert 0 <= before - after < 0.2
    lock.extend()
    assert 1.9 < lock.validity <= 2.0
    other = redlock.lock("clock", ttl=2.0)
    assert not other.acquire(blocking=False)
    assert lock.release()
    assert other.acquire(blocking=False)
    other.release()
