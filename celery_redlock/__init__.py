"""celery_redlock: Celery jobs that run exactly as often as they should.

A correct multi-node Redlock, locked and singleton tasks kept alive by a
heartbeat, and global per-key rate limits, all on Redis.

Example::

    from celery_redlock import Redlock

    redlock = Redlock(["redis://r1:6379/0", "redis://r2:6379/0", "redis://r3:6379/0"])
    with redlock.lock("invoice:42", ttl=30.0) as lock:
        ...
"""

from __future__ import annotations

from . import errors, signals
from .hooks import setup
from .ratelimit import RateLimitDecision, RateLimiter
from .redlock import Lock, Redlock
from .semaphore import Semaphore
from .task import LockedTask

__version__ = "0.1.0.dev0"

__all__ = [
    "Lock",
    "LockedTask",
    "RateLimitDecision",
    "RateLimiter",
    "Redlock",
    "Semaphore",
    "__version__",
    "errors",
    "setup",
    "signals",
]
