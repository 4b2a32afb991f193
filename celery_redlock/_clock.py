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


#: How long :func:`pause` sleeps (seconds) where a green library patched ``time.sleep``.
_GREEN_PAUSE = 1e-6


def pause() -> None:
    """Let other threads and greenlets run, timers and I/O included.

    In threads, ``sleep(0)``: the GIL goes to a waiting thread, and the caller is back at once
    (a real sleep, however short, waits for the scheduler on a busy machine). Where gevent or
    eventlet patched ``time.sleep``, a sleep of a microsecond: ``sleep(0)`` only queues the
    caller behind the other ready greenlets, and gevent's loop runs up to 50 such callbacks
    before it looks at the clock again, so a sleeping greenlet's timer waited through many
    pauses (a 10,000-lock renewal held it for 27-48 ms). A timer makes the loop poll and run
    what is due first.
    """
    sleep = _time.sleep
    sleep(0 if getattr(sleep, "__module__", None) == "time" else _GREEN_PAUSE)
