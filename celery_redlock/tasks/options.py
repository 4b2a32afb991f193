"""Every task option celery_redlock reads: its name, feature, default and check.

The one list of option names: LockedTask's attributes and ``redlock_tasks`` entries use them.
A LockedTask attribute that is no option is refused (:func:`unknown_option`) only if it looks
meant for us: another lock library's option, a guess (``lock``, ``unique``), a misspelling, or a
:data:`RESERVED_PREFIXES` start; anything else is the user's own. An option's ``setting`` is its
``app.conf`` fallback, applied once per app by ``TaskPolicy.resolve`` (as ``Task.from_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .._validators import MAX_TTL
from ..errors import ConfigurationError
from ..ratelimit import ALGORITHMS, DEFAULT_ALGORITHM
from . import setting_checks as check
from .misspelling import LONG_NAME, closest, normal, resembles
from .other_library_options import PEER_OPTIONS
from .other_library_options import hint as peer_hint

__all__ = [
    "BUSY_ACTIONS",
    "DUPLICATE_ACTIONS",
    "OPTION_NAMES",
    "RATE_LIMITED_ACTIONS",
    "RESERVED_PREFIXES",
    "SINGLETON_MODES",
    "TASK_OPTIONS",
    "TaskOption",
    "check_attributes",
    "check_names",
    "read",
    "unknown_option",
]

#: ``on_lock_busy`` values; the first is the default.
BUSY_ACTIONS = ("retry", "skip", "raise")
#: ``on_duplicate`` values; the first is the default.
DUPLICATE_ACTIONS = ("return", "raise")
#: ``singleton_mode`` values; the first is the default.
SINGLETON_MODES = ("one", "queued")
#: ``on_rate_limited`` values; the first is the default.
RATE_LIMITED_ACTIONS = ("retry", "skip", "raise")


@dataclass(frozen=True)
class TaskOption:
    """One task option."""

    name: str
    #: The feature it configures: ``"lock"``, ``"singleton"``, ``"debounce"``, ``"rate"`` or
    #: ``"concurrency"``.
    feature: str
    #: Checks a value that is set (not ``None``) and returns it in checked form.
    check: Callable[[Any, str], Any]
    #: The value when unset. ``None`` leaves it to the policy.
    default: Any = None
    #: The ``app.conf`` setting an unset value falls back to (then ``default``).
    setting: str | None = None
    #: Another option that must be set for this one to mean anything.
    needs: str | None = None


def _key_source(value: Any, option: str) -> Any:
    # Checked against the task's signature when its policy is built (key_templates).
    return value


#: A key's time to live, checked at definition as the lock checks it when taken.
_lifetime = partial(check.seconds, maximum=MAX_TTL)

TASK_OPTIONS: tuple[TaskOption, ...] = (
    # the run lock
    TaskOption("lock_enabled", "lock", check.flag),
    TaskOption("lock_key", "lock", _key_source),
    TaskOption("lock_ttl", "lock", _lifetime, setting="redlock_default_ttl"),
    TaskOption("lock_timeout", "lock", partial(check.seconds, allow_zero=True), 0.0),
    TaskOption("on_lock_busy", "lock", partial(check.choice, choices=BUSY_ACTIONS), "retry"),
    TaskOption("lock_busy_max_requeues", "lock", check.positive_int),
    TaskOption("lock_progress_timeout", "lock", check.seconds),
    # singletons
    TaskOption("singleton", "singleton", check.flag, False),
    TaskOption("singleton_key", "singleton", _key_source),
    TaskOption("singleton_ttl", "singleton", _lifetime, 3600.0, setting="redlock_singleton_ttl"),
    TaskOption(
        "on_duplicate",
        "singleton",
        partial(check.choice, choices=DUPLICATE_ACTIONS),
        "return",
        setting="redlock_on_duplicate",
    ),
    TaskOption("singleton_beat_window", "singleton", check.seconds, 0.5),
    TaskOption(
        "singleton_mode",
        "singleton",
        partial(check.choice, choices=SINGLETON_MODES),
        SINGLETON_MODES[0],
        needs="singleton",
    ),
    # debounce
    TaskOption("debounce", "debounce", _lifetime),
    TaskOption("debounce_key", "debounce", _key_source, needs="debounce"),
    TaskOption("debounce_ttl", "debounce", _lifetime, 3600.0, needs="debounce"),
    # the global rate limit
    TaskOption("global_rate_limit", "rate", check.rate_limits),
    TaskOption("rate_limit_key", "rate", _key_source, needs="global_rate_limit"),
    TaskOption(
        "on_rate_limited",
        "rate",
        partial(check.choice, choices=RATE_LIMITED_ACTIONS),
        "retry",
        needs="global_rate_limit",
    ),
    TaskOption(
        "rate_limit_algorithm",
        "rate",
        partial(check.choice, choices=ALGORITHMS),
        DEFAULT_ALGORITHM,
        needs="global_rate_limit",
    ),
    TaskOption("rate_limit_cost", "rate", check.cost, 1, needs="global_rate_limit"),
    TaskOption("rate_limit_adaptive", "rate", check.flag, False, needs="global_rate_limit"),
    # the per-key concurrency limit (a semaphore of slots, waited for like the run lock)
    TaskOption("concurrency_limit", "concurrency", check.slots),
    TaskOption("concurrency_key", "concurrency", _key_source, needs="concurrency_limit"),
)

#: Every option name, in the order of :data:`TASK_OPTIONS`.
OPTION_NAMES: tuple[str, ...] = tuple(option.name for option in TASK_OPTIONS)

_BY_NAME: Mapping[str, TaskOption] = {option.name: option for option in TASK_OPTIONS}


def option(name: str) -> TaskOption:
    """The option called ``name``."""
    return _BY_NAME[name]


def read(task_name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Check a task's option values, one entry per option (unset: its default).

    Raises :class:`ConfigurationError` naming the task and the first bad option.
    """
    values: dict[str, Any] = {}
    for entry in TASK_OPTIONS:
        value = raw.get(entry.name)
        if value is None:
            values[entry.name] = entry.default
            continue
        if entry.needs is not None and raw.get(entry.needs) is None:
            raise ConfigurationError(entry.name, f"needs {entry.needs} to be set", task=task_name)
        try:
            values[entry.name] = entry.check(value, entry.name)
        except ConfigurationError as exc:
            raise exc.with_context(task=task_name) from None
    return values


#: A task attribute starting with one of these (in any case) is taken for an option.
RESERVED_PREFIXES = (
    "lock_",
    "singleton",
    "debounce",
    "on_lock",
    "on_duplicate",
    "on_rate",
    "global_rate",
    "rate_limit_",
    "concurrency_",
    "redlock",
)

#: Attributes that are no option but read as a guess at one: what to write, and why.
_GUESSES: Mapping[str, tuple[str, str]] = {
    "lock": ("lock_key or lock_enabled", "self.lock is the Lock a run holds"),
    "locked": ("lock_enabled", ""),
    "locking": ("lock_enabled", ""),
    "unique": ("singleton=True", ""),
    "unique_key": ("singleton_key", ""),
    "heartbeat": (
        "lock_ttl or lock_progress_timeout",
        "self.heartbeat() is the method a task calls to report progress",
    ),
}


#: Other libraries' option names long enough that a near miss is one of them, not a
#: name of the user's own (``once`` is too short: ``one`` or ``done`` are not typos of it).
_LONG_PEER_NAMES = tuple(name for name in PEER_OPTIONS if len(normal(name)) >= LONG_NAME - 2)


def unknown_option(name: str, value: Any = None, *, strict: bool = False) -> str | None:
    """What is wrong with ``name`` as a task attribute (the module doc's rule), or ``None``.

    ``strict`` (a ``redlock_tasks`` entry) refuses every non-option; ``value`` shapes the hint
    for another library's option.
    """
    if name in _BY_NAME:
        return None
    peer = peer_hint(name, value)
    if peer is not None:
        return peer
    guess = _GUESSES.get(name.lower())
    if guess is not None:
        guessed, why = guess
        return f"not a celery_redlock option; did you mean {guessed}?" + (
            f" ({why})" if why else ""
        )
    meant = closest(name, OPTION_NAMES)
    if meant is not None and resembles(name, meant):
        return f"not a celery_redlock option; did you mean {meant}?"
    peer = closest(name, _LONG_PEER_NAMES)
    if peer is not None and resembles(name, peer):
        return f"looks like {peer}, which {peer_hint(peer, value)}"
    known = ", ".join(OPTION_NAMES)
    if strict:
        suggestion = f"did you mean {meant}? " if meant is not None else ""
        return f"not a celery_redlock option; {suggestion}(options: {known})"
    prefix = next((p for p in RESERVED_PREFIXES if name.lower().startswith(p)), None)
    if prefix is not None:
        return (
            f"not a celery_redlock option, and names starting with {prefix!r} are kept for "
            f"options (options: {known}); rename an attribute of your own"
        )
    return None


def check_names(where: str, names: Mapping[str, Any]) -> None:
    """Refuse every name that is not an option (a ``redlock_tasks`` entry, named ``where``).

    Raises:
        ConfigurationError: with ``option`` set to ``<where>.<name>``.
    """
    for name, value in names.items():
        problem = unknown_option(str(name), value, strict=True)
        if problem is not None:
            raise ConfigurationError(f"{where}.{name}", problem)


def check_attributes(task_name: str, attributes: Mapping[str, Any]) -> None:
    """Refuse a LockedTask's own attributes that look meant for celery_redlock but are no option.

    Raises:
        ConfigurationError: naming the task and the attribute.
    """
    for name, value in attributes.items():
        problem = unknown_option(name, value)
        if problem is not None:
            raise ConfigurationError(name, problem, task=task_name)
