"""The task options of other Celery lock libraries, and what to write here instead.

A task moved over from celery-once, celery-singleton or celery-heimdall often keeps their
options, which would mean nothing here: each is refused with our spelling of it::

    >>> hint("unique_on", ["user_id", "day"])
    "is celery-singleton's option; write singleton_key='{user_id}:{day}' (with singleton=True)"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PEER_CALL_OPTIONS", "PEER_OPTIONS", "call_hint", "hint"]

#: ``unlock_before_run``: one more copy may queue once the run starts.
_UNLOCK_BEFORE_RUN = (
    "for celery-once's unlock_before_run (free the key once the run starts, so that one more "
    "copy can be queued) write singleton_mode='queued' (with singleton=True): one running copy "
    "plus at most one queued, and the queued one never runs beside the running one"
)
_CHALLENGE = (
    "nothing replaces it: a singleton's key is freed when its run ends, by the worker's main "
    "process when the run's process dies, and by its ttl when the whole worker dies; "
    "`celery redlock release --task-id ID` (or --pattern 'singleton:*') frees keys by hand"
)
_UNIT_SECONDS = {1: "s", 60: "m", 3600: "h"}


def _template(keys: Any) -> str | None:
    """``'{a}:{b}'`` for a list of argument names, ``None`` for anything else."""
    if isinstance(keys, str):
        keys = [keys]
    if isinstance(keys, list | tuple) and keys and all(isinstance(key, str) for key in keys):
        return repr(":".join(f"{{{key}}}" for key in keys))
    return None


def _seconds(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else "..."


def _once(value: Any) -> str:
    given: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
    writes = ["singleton=True"]
    if "keys" in given:
        writes.append(f"singleton_key={_template(given['keys']) or '...'}")
    if "timeout" in given:
        writes.append(f"singleton_ttl={_seconds(given['timeout'])}")
    if given.get("unlock_before_run"):
        writes.append("singleton_mode='queued'")
    if not given.get("graceful"):
        writes.append("on_duplicate='raise'")
    text = (
        f"is celery-once's option; write {', '.join(writes)} (a duplicate publish "
        f"{'raises DuplicateTask' if not given.get('graceful') else 'returns the queued task'}"
        "), or, to let copies queue and only keep runs apart, lock_key, lock_ttl and "
        "on_lock_busy='skip'"
    )
    if given.get("unlock_before_run"):
        text += f"; {_UNLOCK_BEFORE_RUN}"
    return text


def _unique_on(value: Any) -> str:
    return (
        "is celery-singleton's option; write "
        f"singleton_key={_template(value) or '...'} (with singleton=True)"
    )


def _raise_on_duplicate(value: Any) -> str:
    action = "'raise'" if value else "'return' (the default)"
    return f"is celery-singleton's option; write on_duplicate={action}"


def _lock_expiry(value: Any) -> str:
    return (
        f"is celery-singleton's option; write singleton_ttl={_seconds(value)} (how long a queued "
        "copy holds the key; a running copy's key lives by lock_ttl, renewed by the heartbeat)"
    )


def _challenge(value: Any) -> str:
    return f"is celery-singleton's option; {_CHALLENGE}"


def _heimdall_rate(given: Mapping[str, Any]) -> str:
    times, per = given.get("times"), given.get("per")
    unit = _UNIT_SECONDS.get(per) if isinstance(per, int) else None
    if isinstance(times, int) and unit is not None:
        return f"global_rate_limit='{times}/{unit}'"
    return "global_rate_limit='<times>/<s, m or h>'"


def _heimdall(value: Any) -> str:
    given: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
    writes = []
    if given.get("unique") or not given:
        writes.append("singleton=True")
    if "unique_timeout" in given:
        writes.append(f"singleton_ttl={_seconds(given['unique_timeout'])}")
    if "key" in given:
        writes.append("singleton_key=<the same (args, kwargs) -> str callable>")
    if given.get("unique_raises"):
        writes.append("on_duplicate='raise'")
    if "times" in given or "per" in given:
        writes.append(_heimdall_rate(given))
    text = f"is celery-heimdall's option; write {', '.join(writes)}"
    if given.get("unique_wait_for_expiry"):
        text += (
            "; unique_wait_for_expiry has no equivalent: for at most one run per period, use "
            "global_rate_limit='1/h' (or /m, /s) with on_rate_limited='skip'"
        )
    return text


def _unlock_before_run(value: Any) -> str:
    return f"is celery-once's option (inside once={{...}}); {_UNLOCK_BEFORE_RUN}"


#: Option name -> the hint for a value given under it.
PEER_OPTIONS: Mapping[str, Callable[[Any], str]] = {
    "once": _once,
    "unlock_before_run": _unlock_before_run,
    "unique_on": _unique_on,
    "raise_on_duplicate": _raise_on_duplicate,
    "lock_expiry": _lock_expiry,
    "challenge_lock_on_startup": _challenge,
    "heimdall": _heimdall,
}


def hint(name: str, value: Any) -> str | None:
    """What to write instead of the peer option ``name=value``; ``None`` if it is no peer's."""
    make = PEER_OPTIONS.get(name)
    return make(value) if make is not None else None


def _once_call(value: Any) -> str:
    given: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
    writes = []
    if "graceful" in given:
        writes.append(f"'on_duplicate': {'return' if given['graceful'] else 'raise'!r}")
    if "timeout" in given:
        writes.append(f"'singleton_ttl': {_seconds(given['timeout'])}")
    text = "is celery-once's apply_async option, which Celery would ignore here; "
    if writes:
        text += f"write redlock={{{', '.join(writes)}}} (for a task with singleton=True)"
    else:
        text += "drop it: the task's own options apply"
    if "keys" in given:
        text += "; keys cannot change per call: set singleton_key on the task"
    if given.get("unlock_before_run"):
        text += (
            "; unlock_before_run cannot change per call: set singleton_mode='queued' on the task"
        )
    return text


#: A peer's option at a call site (``apply_async(once={...})``) -> the hint for its value.
PEER_CALL_OPTIONS: Mapping[str, Callable[[Any], str]] = {"once": _once_call}


def call_hint(name: str, value: Any) -> str | None:
    """What a call writes instead of the peer call option ``name=value``; ``None`` if none."""
    make = PEER_CALL_OPTIONS.get(name)
    return make(value) if make is not None else None
