"""The one place celery_redlock reads the time.

``time.monotonic`` only, so no wall-clock step can stretch a lock; tests replace :func:`monotonic`.
"""

from __future__ import annotations

import math
import time as _time

#: Long loops over locks call :func:`pause` every this many: about a millisecond of work.
PAUSE_EVERY = 256


def monotonic() -> float:
    """Seconds from an arbitrary fixed point; never goes backwards."""
    return _time.monotonic()


def drift(ttl: float, factor: float = 0.01) -> float:
    """Clock drift allowance for a lock of ``ttl`` seconds: 1 % of it plus 2 ms."""
    return ttl * factor + 0.002


def validity(ttl: float, started: float, now: float, drift_factor: float = 0.01) -> float:
    """Seconds a lock from an attempt begun at ``started`` stays safe at ``now`` (<= 0: failed)."""
    return ttl - (now - started) - drift(ttl, drift_factor)


def to_ms(seconds: float) -> int:
    """Whole milliseconds for Redis, at least 1, rounded up: a ttl never shrinks on the way."""
    return max(1, math.ceil(round(seconds * 1000, 3)))


def pause() -> None:
    """Let other threads and gevent greenlets run: ``sleep(0)`` yields the GIL and the loop."""
    _time.sleep(0)
