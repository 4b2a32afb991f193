"""The one place celery_redlock reads the time.

Only ``time.monotonic`` is used: lock validity never depends on the wall
clock, so NTP steps and manual clock changes cannot stretch a lock. Tests
replace :func:`monotonic` (or freeze ``time.monotonic`` around pure logic).
"""

from __future__ import annotations

import time as _time


def monotonic() -> float:
    """Seconds from an arbitrary fixed point; never goes backwards."""
    return _time.monotonic()


def drift(ttl: float, factor: float = 0.01) -> float:
    """Clock drift allowance for a lock of ``ttl`` seconds: 1 % of it plus 2 ms."""
    return ttl * factor + 0.002


def validity(ttl: float, started: float, now: float, drift_factor: float = 0.01) -> float:
    """Seconds a lock taken by an attempt that began at ``started`` stays safe at ``now``.

    ``ttl - (now - started) - drift``. A result <= 0 means the attempt took
    too long to be trusted: the lock must be treated as not acquired.
    """
    return ttl - (now - started) - drift(ttl, drift_factor)
