"""``app.conf.redlock_tasks``: task options given by task name, for tasks you do not own.

::

    app.conf.redlock_tasks = {
        "reports.nightly": {"singleton": True},
        "crm.sync": {"lock_key": "crm", "global_rate_limit": "10/m"},
    }

Each named task's class becomes a subclass of ``LockedTask`` and its own class, whichever comes
first, the registration or :func:`~celery_redlock.setup`: :func:`apply_entries` configures the
tasks registered so far, :func:`watch_registrations` those registered later. An unregistered
name is no error (a publisher may publish by name); a worker warns about it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from celery.exceptions import CeleryCommandException

from ..errors import ConfigurationError
from . import options as task_options
from .app_state import settings_for
from .key_templates import task_arguments
from .locked_task import LockedTask
from .misspelling import closest
from .policies import TaskPolicy
from .settings import in_user_terms

__all__ = [
    "StartupRefused",
    "apply_entries",
    "check_entry",
    "configure",
    "entry_name",
    "entry_policy",
    "unknown_task",
    "watch_registrations",
]


def entry_name(name: str) -> str:
    """How errors name the entry of task ``name``: ``redlock_tasks['name']``."""
    return f"redlock_tasks[{name!r}]"


def check_entry(name: str, options: Mapping[str, Any]) -> None:
    """Check one entry's option names and values; key templates wait for the task.

    Raises:
        ConfigurationError: naming ``redlock_tasks['name'].option``.
    """
    task_options.check_names(entry_name(name), options)
    try:
        task_options.read(name, options)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{entry_name(name)}.{exc.option}", exc.problem) from exc


def entry_policy(name: str, task_class: type, options: Mapping[str, Any]) -> TaskPolicy:
    """The policy of a ``redlock_tasks`` entry; errors name ``redlock_tasks['name'].option``."""
    try:
        return TaskPolicy.from_options(name, task_arguments(task_class), options)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{entry_name(name)}.{exc.option}", exc.problem) from exc


def configure(task: Any, options: Mapping[str, Any]) -> None:
    """Give one task instance the options of its entry (once; again is a no-op)."""
    cls = type(task)
    if issubclass(cls, LockedTask) and cls.__dict__.get("_redlock_configured"):
        return
    name = task.name
    task_options.check_names(entry_name(name), options)
    policy = entry_policy(name, cls, options)
    attributes = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_redlock_policy": policy,
        "_redlock_configured": True,
        **options,
    }
    bases = (cls,) if issubclass(cls, LockedTask) else (LockedTask, cls)
    task.__class__ = type(cls.__name__, bases, attributes)
    # Workers build a tracer per task on first use; drop one built already.
    task.__trace__ = None


def apply_entries(app: Any) -> list[str]:
    """Check every entry and configure the tasks registered so far; return the others' names.

    Raises:
        ConfigurationError: a bad setting or entry.
    """
    entries = settings_for(app).tasks
    for name, options in entries.items():
        check_entry(name, options)
    missing = []
    for name, options in entries.items():
        task = app.tasks.get(name)
        if task is None:
            missing.append(name)
        else:
            configure(task, options)
    return missing


def unknown_task(name: str, registered: Any) -> str:
    """What to say about an entry whose task ``registered`` (task names) does not have."""
    meant = closest(name, [task for task in registered if not task.startswith("celery.")])
    hint = f"did you mean {meant!r}? " if meant is not None else ""
    return (
        f"{entry_name(name)}: this app has no such task; {hint}check the name, and that the "
        "module defining it is imported (include= or imports=); the entry applies once it is"
    )


class _Watching:
    """A task registry that gives each task registered its ``redlock_tasks`` entry."""

    _redlock_app: weakref.ref[Any]

    def __setitem__(self, name: str, task: Any) -> None:
        super().__setitem__(name, task)  # type: ignore[misc]
        app = self._redlock_app()
        if app is None:
            return
        if app.finalized:
            try:
                entries = settings_for(app).tasks
            except ConfigurationError:
                return  # bad settings: reported by the finalize hook and the worker
        elif app.configured:
            # A publisher that only calls .delay() never finalizes the app: apply now, reading
            # the settings uncached, as the app may still be configured further.
            entries = app.conf.get("redlock_tasks") or {}
            if not isinstance(entries, Mapping):
                return  # reported when the settings are read
        else:
            return  # the finalize hook applies the entries
        options = entries.get(name)
        if isinstance(options, Mapping):
            try:
                configure(task, options)
            except ConfigurationError as exc:
                raise StartupRefused(in_user_terms(app.conf, exc)) from None


class StartupRefused(ConfigurationError, CeleryCommandException):  # type: ignore[misc]
    """A bad setting or ``redlock_tasks`` entry, found as a worker starts or a task is evaluated.

    Also a click error, so Celery's command line prints one line and exits 2, not a traceback.
    """

    def __init__(self, error: ConfigurationError) -> None:
        CeleryCommandException.__init__(self, f"celery_redlock: {error}", exit_code=2)
        self.option, self.problem, self.task = error.option, error.problem, error.task

    __str__ = CeleryCommandException.__str__  # its message, not its parts


_watching: dict[type, type] = {}


def watch_registrations(app: Any) -> None:
    """Configure every task the app registers from now on by its ``redlock_tasks`` entry.

    Celery has no registration signal, so the registry (``app._tasks``, touched only here)
    applies the entry as each task is stored.
    """
    registry = app._tasks
    cls = type(registry)
    if not issubclass(cls, _Watching):
        watching = _watching.get(cls)
        if watching is None:
            watching = _watching[cls] = type(f"Watching{cls.__name__}", (_Watching, cls), {})
        registry.__class__ = watching
    registry._redlock_app = weakref.ref(app)
