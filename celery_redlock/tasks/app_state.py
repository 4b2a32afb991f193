"""What each Celery app has built once: its settings, policies, Redlock, limiter, debounce store.

Cached per app (weakly, so a dropped app takes its state with it) and
dropped together by :func:`forget`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ..lock.redlock import Redlock
from ..ratelimit import RateLimiter
from . import setting_checks as check
from .debounce_store import DebounceStore
from .policies import TaskPolicy
from .settings import Settings

__all__ = [
    "debounce_store_for",
    "enabled_for",
    "forget",
    "limiter_for",
    "policy_for",
    "redlock_for",
    "settings_for",
]


def enabled_for(app: Any) -> bool:
    """Whether ``redlock_enabled`` is on for ``app`` (the default).

    Read afresh each call, so a test fixture can switch it without :func:`forget`.
    """
    value = app.conf.get("redlock_enabled")
    return True if value is None else check.flag(value, "redlock_enabled")


_T = TypeVar("_T")
_cache_lock = threading.Lock()
_settings: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_redlocks: weakref.WeakKeyDictionary[Any, Redlock] = weakref.WeakKeyDictionary()
_limiters: weakref.WeakKeyDictionary[Any, RateLimiter] = weakref.WeakKeyDictionary()
_debounce_stores: weakref.WeakKeyDictionary[Any, DebounceStore] = weakref.WeakKeyDictionary()
_policies: weakref.WeakKeyDictionary[Any, dict[int, tuple[TaskPolicy, TaskPolicy]]] = (
    weakref.WeakKeyDictionary()
)


def settings_for(app: Any) -> Settings:
    """The app's checked settings (read once per app)."""
    with _cache_lock:
        found = _settings.get(app)
        if found is None:
            found = _settings[app] = Settings.from_conf(app.conf)
        return found


def _built(cache: weakref.WeakKeyDictionary[Any, _T], app: Any, make: Callable[[], _T]) -> _T:
    """``cache[app]``, made on first use (outside the lock: making one may connect)."""
    with _cache_lock:
        found = cache.get(app)
    if found is not None:
        return found
    made = make()
    with _cache_lock:
        return cache.setdefault(app, made)


def redlock_for(app: Any) -> Redlock:
    """The app's Redlock, built on first use and shared by its tasks (fork-safe)."""
    return _built(_redlocks, app, lambda: settings_for(app).make_redlock())


def limiter_for(app: Any) -> RateLimiter:
    """The app's RateLimiter: on ``redlock_rate_limit_url``, else the first lock node."""
    return _built(_limiters, app, lambda: settings_for(app).make_limiter())


def debounce_store_for(app: Any) -> DebounceStore:
    """The app's debounce store: on ``redlock_rate_limit_url``, else the first lock node."""

    def make() -> DebounceStore:
        settings = settings_for(app)
        where = settings.rate_limit_url or settings.nodes[0]
        return DebounceStore(where, key_prefix=settings.key_prefix)

    return _built(_debounce_stores, app, make)


def policy_for(task: Any) -> TaskPolicy | None:
    """The task's policy resolved against its app's settings, or ``None`` for a plain task.

    Cached per app and policy, so a bad ttl is reported once at start-up, not at every run.
    """
    policy = getattr(task, "_redlock_policy", None)
    if not isinstance(policy, TaskPolicy):
        return None
    app = task.app
    with _cache_lock:
        found = _policies.get(app, {}).get(id(policy))
    if found is not None and found[0] is policy:
        return found[1]
    resolved = policy.resolve(settings_for(app))
    with _cache_lock:
        _policies.setdefault(app, {})[id(policy)] = (policy, resolved)
    return resolved


def forget(app: Any) -> None:
    """Drop what is cached for ``app``: settings, policies, Redlock, limiter, debounce store."""
    with _cache_lock:
        _settings.pop(app, None)
        _policies.pop(app, None)
        made = (_redlocks.pop(app, None), _limiters.pop(app, None), _debounce_stores.pop(app, None))
    for each in made:
        if each is not None:
            each.close()
