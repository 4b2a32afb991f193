"""Typed settings read from ``app.conf``, validated once.

=========================  ==============================================  =========================
setting                    meaning                                          default
=========================  ==============================================  =========================
``redlock_nodes``          lock node URLs (or ``redis.Redis`` clients)      the broker URL if it is
                                                                            Redis, else
                                                                            ``redis://localhost:6379/0``
``redlock_key_prefix``     prefix of every key written                      ``"redlock:"``
``redlock_default_ttl``    task lock time to live, seconds                  ``60.0``
``redlock_node_timeout``   longest wait for one node, seconds               ``0.05``
``redlock_tasks``          ``{task name: {option: value}}`` for tasks       ``{}``
                           that do not subclass ``LockedTask``
``redlock_rate_limit_url`` where rate-limit counters live                   the first lock node
=========================  ==============================================  =========================
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from .errors import ConfigurationError
from .ratelimit import RateLimiter
from .redlock import Redlock

__all__ = ["Settings", "forget", "limiter_for", "redlock_for", "settings_for"]

_DEFAULT_NODE = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Settings:
    """The ``redlock_*`` settings of one Celery app, checked."""

    nodes: tuple[str | redis.Redis, ...]
    key_prefix: str = "redlock:"
    default_ttl: float = 60.0
    node_timeout: float = 0.05
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    rate_limit_url: str | redis.Redis | None = None

    @classmethod
    def from_conf(cls, conf: Any) -> Settings:
        """Read and check the settings; raise ConfigurationError naming the bad one."""
        nodes = conf.get("redlock_nodes")
        if nodes is None:
            nodes = [_broker_redis_url(conf.get("broker_url")) or _DEFAULT_NODE]
        elif isinstance(nodes, str | redis.Redis):
            nodes = [nodes]
        if not isinstance(nodes, list | tuple) or not nodes:
            raise ConfigurationError(
                f"redlock_nodes: expected a list of Redis URLs, got {nodes!r}",
                option="redlock_nodes",
            )
        key_prefix = conf.get("redlock_key_prefix", "redlock:")
        if key_prefix is None:
            key_prefix = "redlock:"
        if not isinstance(key_prefix, str):
            raise ConfigurationError(
                f"redlock_key_prefix: expected a string, got {key_prefix!r}",
                option="redlock_key_prefix",
            )
        tasks = conf.get("redlock_tasks") or {}
        if not isinstance(tasks, Mapping) or not all(
            isinstance(name, str) and isinstance(options, Mapping)
            for name, options in tasks.items()
        ):
            raise ConfigurationError(
                "redlock_tasks: expected {task name: {option: value}}, got " + repr(tasks),
                option="redlock_tasks",
            )
        rate_limit_url = conf.get("redlock_rate_limit_url")
        if rate_limit_url is not None and not isinstance(rate_limit_url, str | redis.Redis):
            raise ConfigurationError(
                f"redlock_rate_limit_url: expected a Redis URL, got {rate_limit_url!r}",
                option="redlock_rate_limit_url",
            )
        return cls(
            nodes=tuple(nodes),
            key_prefix=key_prefix,
            default_ttl=seconds(conf.get("redlock_default_ttl"), "redlock_default_ttl", 60.0),
            node_timeout=seconds(conf.get("redlock_node_timeout"), "redlock_node_timeout", 0.05),
            tasks=tasks,
            rate_limit_url=rate_limit_url,
        )

    def make_redlock(self) -> Redlock:
        """A Redlock over these nodes (URLs checked here)."""
        try:
            return Redlock(
                list(self.nodes), key_prefix=self.key_prefix, node_timeout=self.node_timeout
            )
        except ConfigurationError as exc:
            option = {"nodes": "redlock_nodes", "node_timeout": "redlock_node_timeout"}.get(
                exc.option or "", exc.option
            )
            raise ConfigurationError(f"redlock_{exc}", option=option) from exc


def seconds(value: Any, option: str, default: float | None, *, allow_zero: bool = False) -> float:
    """Check a duration option: a finite number of seconds (> 0 unless allow_zero)."""
    if value is None:
        if default is None:
            raise ConfigurationError(f"{option}: a number of seconds is required", option=option)
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(
            f"{option}: expected a number of seconds, got {value!r}", option=option
        )
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{option}: must be {bound} seconds, got {value!r}", option=option)
    return float(value)


def _broker_redis_url(broker_url: Any) -> str | None:
    if isinstance(broker_url, list | tuple):
        broker_url = broker_url[0] if broker_url else None
    if isinstance(broker_url, str):
        first = broker_url.split(";")[0].strip()
        if first.startswith(("redis://", "rediss://", "unix://")):
            return first
    return None


_cache_lock = threading.Lock()
_settings: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_redlocks: weakref.WeakKeyDictionary[Any, Redlock] = weakref.WeakKeyDictionary()
_limiters: weakref.WeakKeyDictionary[Any, RateLimiter] = weakref.WeakKeyDictionary()


def settings_for(app: Any) -> Settings:
    """The app's checked settings (read once per app)."""
    with _cache_lock:
        found = _settings.get(app)
        if found is None:
            found = _settings[app] = Settings.from_conf(app.conf)
        return found


def redlock_for(app: Any) -> Redlock:
    """The app's Redlock, built on first use and shared by its tasks.

    Safe across ``fork()``: a child process opens connections of its own.
    """
    with _cache_lock:
        found = _redlocks.get(app)
    if found is not None:
        return found
    made = settings_for(app).make_redlock()
    with _cache_lock:
        return _redlocks.setdefault(app, made)


def limiter_for(app: Any) -> RateLimiter:
    """The app's RateLimiter: on ``redlock_rate_limit_url``, else the first lock node."""
    with _cache_lock:
        found = _limiters.get(app)
    if found is not None:
        return found
    settings = settings_for(app)
    where = settings.rate_limit_url or settings.nodes[0]
    try:
        made = RateLimiter(where, key_prefix=f"{settings.key_prefix}rate:")
    except ConfigurationError as exc:
        option = "redlock_rate_limit_url" if settings.rate_limit_url else "redlock_nodes"
        raise ConfigurationError(f"{option}: {exc}", option=option) from exc
    with _cache_lock:
        return _limiters.setdefault(app, made)


def forget(app: Any) -> None:
    """Drop the cached settings and Redlock of ``app`` (after changing its conf)."""
    with _cache_lock:
        _settings.pop(app, None)
        redlock = _redlocks.pop(app, None)
        limiter = _limiters.pop(app, None)
    if redlock is not None:
        redlock.close()
    if limiter is not None:
        limiter.close()
