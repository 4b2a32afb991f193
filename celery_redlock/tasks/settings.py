"""Typed settings read from ``app.conf``, validated once.

Each setting, its meaning and default: docs/configuration.md, "Settings". A setting may also
come through ``config_from_object(obj, namespace="CELERY")`` (Django) as ``CELERY_REDLOCK_NODES``;
:func:`unknown_settings` finds names meant for us that are never read (typo, case, namespace).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any
from urllib.parse import quote

import redis

from .._layout import KEY_PREFIX, rate_prefix
from ..errors import ConfigurationError
from ..lock.redlock import DEFAULT_NODE_TIMEOUT, DEFAULT_TTL, Redlock
from ..ratelimit import RateLimiter
from ..transport.endpoint import SCHEMES
from ..transport.sentinel import SENTINEL_SCHEME
from . import options as task_options
from . import setting_checks as check
from .misspelling import closest, resembles

__all__ = [
    "DEFAULT_NODE",
    "SETTING_NAMES",
    "Settings",
    "in_user_terms",
    "node_fallback",
    "unknown_settings",
    "written_as",
]

#: Where locks go when ``redlock_nodes`` is unset and the broker is not Redis.
DEFAULT_NODE = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Settings:
    """The ``redlock_*`` settings of one Celery app, checked; fields drop the prefix."""

    nodes: tuple[str | redis.Redis, ...]
    key_prefix: str = KEY_PREFIX
    default_ttl: float = DEFAULT_TTL
    node_timeout: float = DEFAULT_NODE_TIMEOUT
    #: ``None``: the option's own default (see :mod:`.options`).
    singleton_ttl: float | None = None
    on_duplicate: str | None = None
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    rate_limit_url: str | redis.Redis | None = None
    rate_limit_fallback: str | redis.Redis | None = None
    rate_limit_on_unavailable: str = "retry"
    rate_limit_margin: float = 0.05
    enabled: bool = True

    @classmethod
    def from_conf(cls, conf: Any) -> Settings:
        """Read and check the settings; raise ConfigurationError naming the bad one."""
        values: dict[str, Any] = {}
        for name, validate in _CHECKS.items():
            setting = f"redlock_{name}"
            value = conf.get(setting)
            if value is not None:
                values[name] = validate(value, written_as(conf, setting))
        if "nodes" not in values:
            broker = _broker_redis_url(conf.get("broker_url"), conf.get("broker_transport_options"))
            values["nodes"] = (broker or DEFAULT_NODE,)
        return cls(**values)

    def value(self, setting: str) -> Any:
        """The value of ``setting`` (``"redlock_default_ttl"``)."""
        return getattr(self, setting.removeprefix("redlock_"))

    def make_redlock(self) -> Redlock:
        """A Redlock over these nodes (URLs checked here)."""
        try:
            return Redlock(
                list(self.nodes), key_prefix=self.key_prefix, node_timeout=self.node_timeout
            )
        except ConfigurationError as exc:
            raise exc.with_context(option=f"redlock_{exc.option or 'nodes'}") from exc

    def make_limiter(self, **kwargs: Any) -> RateLimiter:
        """A RateLimiter on ``redlock_rate_limit_url``, else the first node; ``kwargs`` win."""
        where = self.rate_limit_url or self.nodes[0]
        made: dict[str, Any] = {
            "key_prefix": rate_prefix(self.key_prefix),
            "margin": self.rate_limit_margin,
            "fallback": self.rate_limit_fallback,
            "on_unavailable": "allow" if self.rate_limit_on_unavailable == "allow" else "raise",
            **kwargs,
        }
        try:
            return RateLimiter(where, **made)
        except ConfigurationError as exc:
            if exc.option == "fallback":
                option = "redlock_rate_limit_fallback"
            elif self.rate_limit_url:
                option = "redlock_rate_limit_url"
            else:
                option = "redlock_nodes"
            raise exc.with_context(option=option) from exc


_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "nodes": check.redis_urls,
    "key_prefix": check.string,
    "default_ttl": check.seconds,
    "node_timeout": check.seconds,
    # app-wide defaults of task options: checked as the option is
    "singleton_ttl": task_options.option("singleton_ttl").check,
    "on_duplicate": task_options.option("on_duplicate").check,
    "tasks": check.table,
    "rate_limit_url": check.redis_url,
    "rate_limit_fallback": check.redis_url,
    "rate_limit_on_unavailable": partial(check.choice, choices=("retry", "allow")),
    "rate_limit_margin": partial(check.seconds, allow_zero=True, maximum=60.0),
    "enabled": check.flag,
}

#: Every setting :class:`Settings` reads.
SETTING_NAMES: tuple[str, ...] = tuple(f"redlock_{entry.name}" for entry in fields(Settings))


def written_as(conf: Any, setting: str) -> str:
    """``setting`` as the app's configuration holds it (``CELERY_REDLOCK_TASKS`` under Django)."""
    candidates = getattr(conf, "_to_keys", None)
    for key in candidates(setting) if callable(candidates) else ():
        if any(key in layer for layer in getattr(conf, "maps", ())[:-1]):
            return str(key)
    return setting


def in_user_terms(conf: Any, exc: ConfigurationError) -> ConfigurationError:
    """``exc`` naming its setting as written (``CELERY_REDLOCK_TASKS['x'].lock_key``)."""
    option = exc.option or ""
    setting = option.split("[", 1)[0].split(".", 1)[0]
    written = written_as(conf, setting) if setting.startswith("redlock_") else setting
    if written == setting:
        return exc
    return exc.with_context(option=written + option[len(setting) :])


def node_fallback(conf: Any) -> str | None:
    """:data:`DEFAULT_NODE` when the locks fall back to it (worth a warning: it may be shared)."""
    if conf.get("redlock_nodes") is not None or _broker_redis_url(conf.get("broker_url")):
        return None
    return DEFAULT_NODE


def unknown_settings(conf: Any) -> list[str]:
    """What is wrong with each ``app.conf`` name that looks meant for celery_redlock.

    Reported: no such setting (``redlock_node``), a near miss (``redlok_nodes``), or a spelling
    this app does not read (``REDLOCK_NODES``); ``conf`` is ``app.conf`` or a plain mapping.
    """
    conf.get("redlock_nodes")  # Celery reads its configuration on first use
    prefix = getattr(conf, "prefix", None) if not isinstance(conf, dict) else None
    prefix = prefix if isinstance(prefix, str) else ""

    def spelt(setting: str) -> str:
        if prefix and prefix.isupper():
            return (prefix + setting).upper()
        return prefix + setting

    readable = {setting: {setting, spelt(setting)} for setting in SETTING_NAMES}
    read_names = set().union(*readable.values())
    problems = []
    for key in sorted(name for name in conf if isinstance(name, str)):
        if key in read_names:
            continue
        bare = key.lower()
        for given_prefix in {prefix.lower(), "celery_"}:
            if given_prefix and bare.startswith(given_prefix):
                bare = bare[len(given_prefix) :]
        if bare in SETTING_NAMES:
            how = f"namespace {prefix.rstrip('_')!r}" if prefix else "no namespace"
            problems.append(
                f"{key} is not read: with {how}, Celery reads this setting as "
                f"{' or '.join(sorted(readable[bare], key=len, reverse=True))}"
            )
            continue
        meant = closest(bare, SETTING_NAMES)
        if bare.startswith("redlock") or (meant is not None and resembles(bare, meant)):
            hint = f"; did you mean {spelt(meant)}?" if meant is not None else ""
            problems.append(f"{key} is not a celery_redlock setting and is ignored{hint}")
    return problems


def _broker_redis_url(broker_url: Any, transport_options: Any = None) -> str | None:
    """The broker's Redis as a lock node URL; a Sentinel broker (kombu's form) is its master."""
    if isinstance(broker_url, list | tuple):
        broker_url = broker_url[0] if broker_url else None
    if isinstance(broker_url, str):
        first = broker_url.split(";")[0].strip()
        if first.startswith(tuple(f"{scheme}://" for scheme in SCHEMES)):
            return first
        master = (
            (transport_options or {}).get("master_name")
            if isinstance(transport_options, dict)
            else None
        )
        if first.startswith(f"{SENTINEL_SCHEME}://") and isinstance(master, str) and master:
            url = broker_url.strip().rstrip(";")
            return f"{url}{'&' if '?' in url else '?'}master_name={quote(master)}"
    return None
