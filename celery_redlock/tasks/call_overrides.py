"""Per-call overrides: options of one call, given at the call and honoured by the worker.

::

    sync_user.apply_async((42,), redlock={"lock_timeout": 5, "on_lock_busy": "raise"})
    report.delay("today")                                     # the task's own options
    report.apply_async(("today",), redlock={"on_duplicate": "raise"})

Checked at the call, the values travel in the message header :data:`HEADER` (so retries and
re-queues keep them) and are checked again in the worker: a message may come from anywhere.
Elsewhere Celery would send ``redlock=`` as an ignored message property, so
:func:`guard_send_task` refuses it at ``app.send_task``.

A call may change how it reacts and how long its locks live (:data:`CALL_OPTIONS`), never
*what* it shares: a per-call key would not exclude runs using the task's key, and the worker
could not free a dead run's locks by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._validators import check_ttl
from ..errors import ConfigurationError
from . import options as task_options
from .misspelling import closest
from .other_library_options import PEER_CALL_OPTIONS, call_hint
from .policies import TaskPolicy

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "CALL_OPTIONS",
    "HEADER",
    "KEYWORD",
    "check",
    "from_request",
    "guard_send_task",
    "label",
    "refuse_peer_keywords",
]

#: The keyword of ``apply_async``/``apply`` that carries a call's overrides.
KEYWORD = "redlock"
#: The message header that carries them to the worker (checked values).
HEADER = "redlock_options"

#: The options a call may override, and what the task must have for each to mean anything.
_NEEDS: Mapping[str, str] = {
    "lock_timeout": "lock",
    "on_lock_busy": "lock",
    "lock_busy_max_requeues": "lock",
    "lock_ttl": "held",
    "lock_progress_timeout": "held",
    "on_duplicate": "singleton",
    "singleton_ttl": "singleton",
    "on_rate_limited": "rate",
}
#: Every option a call may override.
CALL_OPTIONS: tuple[str, ...] = tuple(_NEEDS)

_MISSING = {
    "lock": (
        "the task takes no run lock (it sets no lock_key, or lock_enabled=False) "
        "and has no concurrency_limit"
    ),
    "held": (
        "the task holds no lock while it runs (no run lock, not a singleton, no concurrency_limit)"
    ),
    "singleton": "the task is not a singleton",
    "rate": "the task has no global_rate_limit",
}


def label(name: str) -> str:
    """How errors name an override: ``redlock['lock_timeout']``."""
    return f"{KEYWORD}[{name!r}]"


def check(
    task_name: str, policy: TaskPolicy, raw: Any, settings: Settings | None = None
) -> dict[str, Any]:
    """A call's overrides, checked against the task's policy; ``None`` values dropped.

    With ``settings``, a ttl is also checked against ``redlock_node_timeout``.

    Raises:
        ConfigurationError: naming the task and ``redlock['<name>']``.
    """
    if not isinstance(raw, Mapping):
        raise ConfigurationError(
            KEYWORD, f"expected a dict of options, got {raw!r}", task=task_name
        )
    checked: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in _NEEDS:
            raise ConfigurationError(label(str(name)), _not_per_call(str(name)), task=task_name)
        if value is None:
            continue  # as everywhere: None is "not set", the task's own value applies
        try:
            checked[name] = task_options.option(name).check(value, name)
        except ConfigurationError as exc:
            raise ConfigurationError(label(name), exc.problem, task=task_name) from None
        if not _has(policy, _NEEDS[name]):
            raise ConfigurationError(
                label(name), f"{_MISSING[_NEEDS[name]]}, so it would do nothing", task=task_name
            )
        if settings is not None and name in ("lock_ttl", "singleton_ttl"):
            timeout, setting = settings.node_timeout, "redlock_node_timeout"
            check_ttl(checked[name], timeout, label(name), timeout_option=setting, task=task_name)
    return checked


def refuse_peer_keywords(task_name: str, options: Mapping[str, Any]) -> None:
    """Refuse another lock library's call option among a publish's ``options``.

    Raises:
        ConfigurationError: naming the task and the option, with what to write.
    """
    for name in PEER_CALL_OPTIONS:
        if name in options:
            raise ConfigurationError(name, str(call_hint(name, options[name])), task=task_name)


def guard_send_task(app: Any) -> None:
    """Refuse, at ``app.send_task``, a ``redlock`` (or ``once``) keyword no task class has read.

    One that gets this far came from a plain task or a publish by name: nothing would honour it.
    Installed once per app.
    """
    if getattr(app.send_task, "_redlock_guard", False):
        return
    send_task = app.send_task

    def guarded(name: str, *args: Any, **options: Any) -> Any:
        task = options.get("task_type")
        task_name = getattr(task, "name", None) or name
        refuse_peer_keywords(task_name, options)
        if KEYWORD in options:
            if options[KEYWORD] is not None:  # as everywhere: None is "not set"
                raise ConfigurationError(KEYWORD, _not_read(task is not None), task=task_name)
            del options[KEYWORD]
        return send_task(name, *args, **options)

    guarded._redlock_guard = True  # type: ignore[attr-defined]
    app.send_task = guarded


def _not_read(from_task: bool) -> str:
    if from_task:
        return (
            "this task has no celery_redlock options (it is neither a LockedTask nor named in "
            "redlock_tasks), so Celery would send redlock= as a message property and ignore "
            "it; give the task base=LockedTask or a redlock_tasks entry, or drop redlock="
        )
    return (
        "app.send_task publishes by name, past the task's class, which is what reads redlock=; "
        "publish through the task (task.apply_async(..., redlock=...), or a signature of it, "
        "in a process that imports it)"
    )


def from_request(request: Any) -> Any:
    """The raw overrides a run's message carries (:data:`HEADER`), or ``None``."""
    headers = request.headers
    return headers.get(HEADER) if headers else None


def _has(policy: TaskPolicy, feature: str) -> bool:
    parts = {
        "lock": (policy.lock, policy.concurrency),
        "held": (policy.lock, policy.singleton, policy.concurrency),
        "singleton": (policy.singleton,),
        "rate": (policy.rate,),
    }
    return any(part is not None for part in parts[feature])


def _not_per_call(name: str) -> str:
    per_call = ", ".join(CALL_OPTIONS)
    if name in task_options.OPTION_NAMES:
        return (
            "cannot be set per call: it says what the call shares with other calls, which "
            f"is the task's to say; set it on the task (per call: {per_call})"
        )
    meant = closest(name, CALL_OPTIONS)
    if meant is not None:
        return f"not an option a call can set; did you mean {meant}? (per call: {per_call})"
    return f"not an option a call can set (per call: {per_call})"
