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
    # Room for a loaded machine's first call (connections, script load):
    # this test is about the client's clock, not node timeouts.
    redlock = make_redlock(list(servers)[:3], node_timeout=0.5)
    lock = redlock.lock("clock", ttl=2.0)
    assert lock.acquire(blocking=False)
    real_time = time.time
    between = time.monotonic()
    before = lock.validity
    monkeypatch.setattr(time, "time", lambda: real_time() + jump)
    after = lock.validity
    between = time.monotonic() - between
    # Less by the monotonic time between the two reads, not by the jump.
    assert 0 <= before - after <= between + 1e-6
    sent = time.monotonic()
    lock.extend()
    validity = lock.validity
    assert 2.0 - (2.0 * 0.01 + 0.002) - (time.monotonic() - sent) - 1e-6 <= validity <= 2.0
    other = redlock.lock("clock", ttl=2.0)
    assert not other.acquire(blocking=False)
    assert lock.release()
    assert other.acquire(blocking=False)
    other.release()
