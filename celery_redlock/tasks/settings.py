"""Typed settings read from ``app.conf``, validated once.

=====================================  ======================================  ===================
setting                                meaning                                 default
=====================================  ======================================  ===================
``redlock_nodes``                      lock node URLs (or ``redis.Redis``      the broker URL if
                                       clients)                                it is Redis, else
                                                                               ``redis://localhost
                                                                               :6379/0``
``redlock_key_prefix``                 prefix of every key written             ``"redlock:"``
``redlock_default_ttl``                task lock time to live, seconds         ``60.0``
``redlock_node_timeout``               longest wait for one node, seconds      ``0.05``
``redlock_singleton_ttl``              ``singleton_ttl`` of singletons that    ``3600.0``
                                       set none, seconds
``redlock_on_duplicate``               ``on_duplicate`` of singletons that     ``"return"``
                                       set none
``redlock_tasks``                      ``{task name: {option: value}}`` for    ``{}``
                                       tasks that do not subclass
                                       ``LockedTask``
``redlock_rate_limit_url``             where rate-limit counters live          the first lock node
``redlock_rate_limit_fallback``        a second Redis that decides while the   none
                                       first does not answer (counts of its
                                       own)
``redlock_rate_limit_on_unavailable``  with no rate-limit Redis answering, a   ``"retry"``
                                       run is re-queued (``"retry"``, fail
                                       closed) or runs unchecked
                                       (``"allow"``, fail open)
``redlock_rate_limit_margin``          seconds added to every ``sliding`` and  ``0.05``
                                       ``gcra`` window, so that run *starts*
                                       keep the limit
``redlock_enabled``                    ``False``: every LockedTask runs as a   ``True``
                                       plain task and no Redis is contacted
                                       (tests)
=====================================  ======================================  ===================

A setting can also come through ``app.config_from_object(obj,
namespace="CELERY")`` (Django's ``settings``), spelt ``CELERY_REDLOCK_NODES``.
:func:`unknown_settings` finds names that look meant for celery_redlock but
are never read (a typo, or the wrong case or namespace for how the app reads
its configuration); the worker logs them and ``celery redlock check`` fails
on them.
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
    "KNOWN_SETTINGS",
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
    """The ``redlock_*`` settings of one Celery app, checked.

    Each field is the setting without its ``redlock_`` prefix; its default
    here is the setting's default (``nodes`` has none: it follows the broker).
    """

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
        """A RateLimiter on ``redlock_rate_limit_url``, else the first lock node.

        With its fallback, margin and what it does while no Redis answers
        taken from the settings (``kwargs`` override them).
        """
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

#: Every ``redlock_*`` setting celery_redlock reads: :data:`SETTING_NAMES`, and
#: ``redlock_enabled`` (false runs LockedTasks as plain tasks).
KNOWN_SETTINGS: frozenset[str] = frozenset((*SETTING_NAMES, "redlock_enabled"))


def written_as(conf: Any, setting: str) -> str:
    """``setting`` as the app's configuration holds it.

    ``CELERY_REDLOCK_TASKS`` when the app reads ``namespace="CELERY"``
    settings (Django's) and that is how it was given; ``setting`` otherwise.
    """
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
    """:data:`DEFAULT_NODE` when the locks fall back to it, else ``None``.

    That is when ``redlock_nodes`` is unset and the broker is not Redis: the
    locks then go to a Redis on this host that may not exist, or be shared.
    """
    if conf.get("redlock_nodes") is not None or _broker_redis_url(conf.get("broker_url")):
        return None
    return DEFAULT_NODE


def unknown_settings(conf: Any) -> list[str]:
    """What is wrong with each ``app.conf`` name that looks meant for celery_redlock.

    A name is reported when it is not read: a ``redlock_*`` name that is no
    setting (``redlock_node``), a near miss of one (``redlok_nodes``), or a
    setting in a spelling the app's configuration does not read
    (``REDLOCK_NODES``, or ``CELERY_REDLOCK_NODES`` without the ``CELERY``
    namespace). Each message names the setting meant, spelt as the app
    reads it. ``conf`` is ``app.conf`` or a plain mapping.
    """
    conf.get("redlock_nodes")  # Celery reads its configuration on first use
    prefix = getattr(conf, "prefix", None) if not isinstance(conf, dict) else None
    prefix = prefix if isinstance(prefix, str) else ""

    def spelt(setting: str) -> str:
        if prefix and prefix.isupper():
            return (prefix + setting).upper()
        return prefix + setting

    readable = {setting: {setting, spelt(setting)} for setting in KNOWN_SETTINGS}
    read_names = set().union(*readable.values())
    problems = []
    for key in sorted(name for name in conf if isinstance(name, str)):
        if key in read_names:
            continue
        bare = key.lower()
        for given_prefix in {prefix.lower(), "celery_"}:
            if given_prefix and bare.startswith(given_prefix):
                bare = bare[len(given_prefix) :]
        if bare in KNOWN_SETTINGS:
            how = f"namespace {prefix.rstrip('_')!r}" if prefix else "no namespace"
            problems.append(
                f"{key} is not read: with {how}, Celery reads this setting as "
                f"{' or '.join(sorted(readable[bare], key=len, reverse=True))}"
            )
            continue
        meant = closest(bare, KNOWN_SETTINGS)
        if bare.startswith("redlock") or (meant is not None and resembles(bare, meant)):
            hint = f"; did you mean {spelt(meant)}?" if meant is not None else ""
            problems.append(f"{key} is not a celery_redlock setting and is ignored{hint}")
    return problems


def _broker_redis_url(broker_url: Any, transport_options: Any = None) -> str | None:
    """The broker's Redis as a lock node URL, if the broker is Redis.

    A Sentinel-managed broker (``sentinel://...;sentinel://...`` with the
    ``master_name`` transport option, kombu's form) is one node: its master.
    """
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
