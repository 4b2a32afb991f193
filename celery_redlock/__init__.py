"""celery_redlock: Celery jobs that run exactly as often as they should.

A correct multi-node Redlock, locked and singleton tasks kept alive by a
heartbeat, and global per-key rate limits, all on Redis.

Example::

    from celery_redlock import Redlock

    redlock = Redlock(["redis://r1:6379/0", "redis://r2:6379/0", "redis://r3:6379/0"])
    with redlock.lock("invoice:42", ttl=30.0) as lock:
        ...

Public names are imported on first use: ``from celery_redlock import Redlock`` loads no Celery.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors, signals
    from .lock.redlock import Lock, Redlock
    from .lock.semaphore import Semaphore
    from .ratelimit import RateLimitDecision, RateLimiter
    from .tasks.app_setup import setup
    from .tasks.locked_task import LockedTask

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

#: The module each public name comes from (a module name alone: the module itself).
_HOMES = {
    "Lock": ".lock.redlock",
    "LockedTask": ".tasks.locked_task",
    "RateLimitDecision": ".ratelimit",
    "RateLimiter": ".ratelimit",
    "Redlock": ".lock.redlock",
    "Semaphore": ".lock.semaphore",
    "errors": ".errors",
    "setup": ".tasks.app_setup",
    "signals": ".signals",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = import_module(home, __name__)
    value = module if home == f".{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
