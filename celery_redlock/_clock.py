"""The one place celery_redlock reads the time.

Only ``time.monotonic`` is used: lock validity never depends on the wall
clock, so NTP steps and manual clock changes cannot stretch a lock. Tests
replace :func:`monotonic` (or freeze ``time.monotonic`` around pure logic).
:func:`pause` is the breather long loops take, so that they hold no gevent
event loop (or the GIL) for long.
"""

from __future__ import annotations

import math
import time as _time

#: Long loops over locks (a renewal round of thousands) call :func:`pause`
#: every this many locks: about a millisecond of work at a time.
PAUSE_EVERY = 256


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


def to_ms(seconds: float) -> int:
    """Whole milliseconds for Redis, at least 1, rounded up: a ttl never shrinks on the way."""
    return max(1, math.ceil(round(seconds * 1000, 3)))


def pause() -> None:
    """Let other threads, and gevent greenlets, run for a moment.

    ``time.sleep(0)`` releases the GIL; under gevent's monkey-patching it
    yields to the event loop. A long loop calls it every
    :data:`PAUSE_EVERY` items so that it never holds the loop for long.
    """
    _time.sleep(0)
