"""``app.conf.redlock_tasks``: task options given by task name, for tasks you do not own.

::

    app.conf.redlock_tasks = {
        "reports.nightly": {"singleton": True},
        "crm.sync": {"lock_key": "crm", "global_rate_limit": "10/m"},
    }

Each named task gets the options as if it had been declared with
``base=LockedTask``: its class is replaced by a subclass of ``LockedTask``
and the original class; its code is not touched. An entry applies as soon as
both its task is registered and :func:`~celery_redlock.setup` (or a
worker's start-up step) has run on the app, whichever order the process
does them in: :func:`apply_entries` configures the tasks registered so far,
and :func:`watch_registrations` every task registered later -- a module
imported after the app was finalized, a ``shared_task`` of a library.
Publishing goes through the task's class, and a task is registered before it
can be published, so its first publish already takes its singleton lock.

A configured name that no module has registered is not an error: a
publisher may never import the module that defines it (it publishes by
name). A worker warns about such names at start-up. Bad option names and
values are :class:`~celery_redlock.errors.ConfigurationError` for every
entry, registered or not.
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
    "check_entries",
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
    """Check one entry's option names and values, without needing its task.

    Key templates are checked against the task's arguments later, when the
    task is configured.

    Raises:
        ConfigurationError: naming ``redlock_tasks['name'].option``.
    """
    task_options.check_names(entry_name(name), options)
    try:
        task_options.read(name, options)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{entry_name(name)}.{exc.option}", exc.problem) from exc


def check_entries(entries: Mapping[str, Mapping[str, Any]]) -> None:
    """:func:`check_entry` for every entry; raises for the first bad one."""
    for name, options in entries.items():
        check_entry(name, options)


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
    check_entries(entries)
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
            # A task used before the app is finalized (a publisher that only
            # calls .delay() on imported tasks never finalizes it): its entry
            # applies now. The settings are read, not cached, as the app may
            # still be configured further.
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

    A :class:`ConfigurationError`, and a click error for Celery's command
    line, which prints ``Error: celery_redlock: <problem>`` and exits with
    status 2 instead of a traceback.
    """

    def __init__(self, error: ConfigurationError) -> None:
        CeleryCommandException.__init__(self, f"celery_redlock: {error}", exit_code=2)
        self.option, self.problem, self.task = error.option, error.problem, error.task

    __str__ = CeleryCommandException.__str__  # its message, not its parts


_watching: dict[type, type] = {}


def watch_registrations(app: Any) -> None:
    """Configure every task the app registers from now on by its ``redlock_tasks`` entry.

    Celery has no signal for a task being registered; every registration
    (``@app.task``, ``shared_task``, ``register_task``) stores the task in
    the app's registry, so the registry is made to apply the entry. This is
    the one place that reaches into Celery's registry (``app._tasks``).
    """
    registry = app._tasks
    cls = type(registry)
    if not issubclass(cls, _Watching):
        watching = _watching.get(cls)
        if watching is None:
            watching = _watching[cls] = type(f"Watching{cls.__name__}", (_Watching, cls), {})
        registry.__class__ = watching
    registry._redlock_app = weakref.ref(app)
