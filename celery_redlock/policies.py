"""Task options, checked once: what a task's lock, singleton and rate limit are.

The same options come from two places, LockedTask class attributes and
``app.conf.redlock_tasks`` entries; both are turned into a
:class:`TaskPolicy` here, and every bad value is a
:class:`~celery_redlock.errors.ConfigurationError` naming the task and the
option, raised when the task is defined (or when the worker starts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._keys import KeySource, KeyTemplate
from ._rates import Rate, parse_rate
from .config import seconds
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .ratelimit import RateLimitDecision, RateLimiter

__all__ = [
    "OPTION_NAMES",
    "LockPolicy",
    "RatePolicy",
    "SingletonPolicy",
    "TaskPolicy",
]

BUSY_ACTIONS = ("retry", "skip", "raise")
DUPLICATE_ACTIONS = ("return", "raise")
RATE_LIMITED_ACTIONS = ("retry", "skip", "raise")
ALGORITHMS = ("fixed", "sliding")
#: How long a published singleton holds its key while queued, by default (seconds).
DEFAULT_SINGLETON_TTL = 3600.0
#: Beat publishes of one singleton this close together count as one tick (seconds).
DEFAULT_BEAT_WINDOW = 0.5

#: Every option a task can set, for checking ``redlock_tasks`` entries.
OPTION_NAMES = (
    "lock_enabled",
    "lock_key",
    "lock_ttl",
    "lock_timeout",
    "on_lock_busy",
    "lock_progress_timeout",
    "singleton",
    "singleton_key",
    "singleton_ttl",
    "on_duplicate",
    "singleton_beat_window",
    "global_rate_limit",
    "rate_limit_key",
    "on_rate_limited",
    "rate_limit_algorithm",
)


class _Options:
    """Reads one task's options, naming the task in every error."""

    def __init__(self, task_name: str, options: Mapping[str, Any]) -> None:
        self.task_name = task_name
        self.options = options

    def error(self, option: str, message: str) -> ConfigurationError:
        return ConfigurationError(f"task {self.task_name!r}: {message}", option=option)

    def seconds(self, option: str, *, allow_zero: bool = False) -> float | None:
        value = self.options.get(option)
        if value is None:
            return None
        try:
            return seconds(value, option, None, allow_zero=allow_zero)
        except ConfigurationError as exc:
            raise self.error(option, str(exc)) from exc

    def choice(self, option: str, choices: tuple[str, ...]) -> str:
        value = self.options.get(option)
        if value is None:
            return choices[0]
        if value not in choices:
            raise self.error(
                option, f"{option} must be one of {', '.join(map(repr, choices))}, got {value!r}"
            )
        return str(value)

    def flag(self, option: str) -> bool | None:
        value = self.options.get(option)
        if value is not None and not isinstance(value, bool):
            raise self.error(option, f"{option} must be True or False, got {value!r}")
        return value

    def key(self, option: str, default: str, signature: Any) -> KeyTemplate:
        source: KeySource = self.options.get(option)
        return KeyTemplate(
            source, default=default, task_name=self.task_name, option=option, signature=signature
        )


@dataclass(frozen=True)
class LockPolicy:
    """The run lock: held while the task body runs."""

    key: KeyTemplate
    ttl: float | None
    timeout: float
    on_busy: str
    progress_timeout: float | None


@dataclass(frozen=True)
class SingletonPolicy:
    """One queued-or-running copy per key (by default: per task and arguments)."""

    key: KeyTemplate
    ttl: float
    on_duplicate: str
    #: Beat publishes within this many seconds of each other are one tick, so
    #: two beat processes on one schedule publish once even when the first
    #: run has already finished; keep it below the schedule's interval.
    beat_window: float = DEFAULT_BEAT_WINDOW


@dataclass(frozen=True)
class RatePolicy:
    """A global rate limit checked in the worker before the task runs."""

    rate: Rate
    key: KeyTemplate
    on_limited: str
    algorithm: str

    def hit(self, limiter: RateLimiter, key: str) -> RateLimitDecision:
        """Count one run against ``key`` (rendered from the run's arguments).

        Raises:
            RateLimiterUnavailable: the counters' Redis made no decision.
        """
        return limiter.hit(
            key,
            self.rate.limit,
            self.rate.period,
            algorithm=self.algorithm,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class TaskPolicy:
    """Everything celery_redlock does around one task."""

    task_name: str
    lock: LockPolicy | None
    singleton: SingletonPolicy | None
    rate: RatePolicy | None
    #: ``lock_ttl`` for the locks held while running (run lock and singleton).
    ttl: float | None = None
    #: ``lock_progress_timeout`` for the locks held while running.
    progress_timeout: float | None = None

    @classmethod
    def from_options(cls, task_name: str, signature: Any, options: Mapping[str, Any]) -> TaskPolicy:
        """Check ``options``; raise ConfigurationError naming the task and option."""
        read = _Options(task_name, options)
        singleton_on = bool(read.flag("singleton"))
        rate_text = options.get("global_rate_limit")
        locking = read.flag("lock_enabled")
        if locking is None:
            # A task that only asks for a singleton or a rate limit does not
            # also serialise all its runs, unless it names a lock key.
            locking = options.get("lock_key") is not None or not (
                singleton_on or rate_text is not None
            )
        lock = LockPolicy(
            key=read.key("lock_key", task_name, signature),
            ttl=read.seconds("lock_ttl"),
            timeout=read.seconds("lock_timeout", allow_zero=True) or 0.0,
            on_busy=read.choice("on_lock_busy", BUSY_ACTIONS),
            progress_timeout=read.seconds("lock_progress_timeout"),
        )
        singleton = SingletonPolicy(
            key=read.key("singleton_key", "", signature),
            ttl=read.seconds("singleton_ttl") or DEFAULT_SINGLETON_TTL,
            on_duplicate=read.choice("on_duplicate", DUPLICATE_ACTIONS),
            beat_window=read.seconds("singleton_beat_window") or DEFAULT_BEAT_WINDOW,
        )
        rate = None
        if rate_text is not None:
            try:
                parsed = parse_rate(rate_text, option="global_rate_limit")
            except ConfigurationError as exc:
                raise read.error("global_rate_limit", str(exc)) from exc
            rate = RatePolicy(
                rate=parsed,
                key=read.key("rate_limit_key", task_name, signature),
                on_limited=read.choice("on_rate_limited", RATE_LIMITED_ACTIONS),
                algorithm=read.choice("rate_limit_algorithm", ALGORITHMS),
            )
        else:
            for option in ("rate_limit_key", "on_rate_limited", "rate_limit_algorithm"):
                if options.get(option) is not None:
                    raise read.error(option, f"{option} needs global_rate_limit to be set")
        return cls(
            task_name=task_name,
            lock=lock if locking else None,
            singleton=singleton if singleton_on else None,
            rate=rate,
            ttl=lock.ttl,
            progress_timeout=lock.progress_timeout,
        )

    @property
    def active(self) -> bool:
        """Whether there is anything to do around this task."""
        return self.lock is not None or self.singleton is not None or self.rate is not None


def check_option_names(task_name: str, options: Mapping[str, Any]) -> None:
    """Reject option names celery_redlock does not know (typos in ``redlock_tasks``)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(
            f"redlock_tasks[{task_name!r}]: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(OPTION_NAMES)}",
            option="redlock_tasks",
        )
