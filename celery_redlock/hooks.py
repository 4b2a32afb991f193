"""``setup(app)``: the LockedTask behaviour for tasks you do not own.

::

    app.conf.redlock_tasks = {
        "reports.nightly": {"singleton": True},
        "crm.sync": {"lock_key": "crm", "global_rate_limit": "10/m"},
    }
    celery_redlock.setup(app)

Each named task -- a third-party task, a plain ``@app.task``, a beat entry's
task -- gets the options given, exactly as if it had been declared with
``base=LockedTask``, in workers and in publishers alike; its code is not
touched. The entries are checked when the app is finalized (at the latest
when a worker or beat starts): an unknown task name or option is a
:class:`~celery_redlock.errors.ConfigurationError`. ``setup`` also connects
the worker's main-process cleanup that frees the locks of task processes
that died.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from ._keys import task_signature
from .config import settings_for
from .errors import ConfigurationError
from .policies import TaskPolicy, check_option_names
from .task import LockedTask, connect_cleanup

__all__ = ["setup"]

logger = logging.getLogger("celery_redlock.hooks")


def setup(app: Any) -> None:
    """Apply ``app.conf.redlock_tasks`` to the app's tasks, now or when it is finalized.

    Safe to call more than once. Raises :class:`ConfigurationError` for bad
    settings as soon as the app is finalized.

    Example::

        app = Celery("proj")
        app.conf.redlock_tasks = {"reports.nightly": {"singleton": True}}
        celery_redlock.setup(app)
    """
    connect_cleanup(app)
    if getattr(app, "_redlock_setup", False):
        return
    app._redlock_setup = True
    if app.finalized:
        apply_redlock_tasks(app)
    else:
        app.on_after_finalize.connect(_on_finalize, weak=False)


def _on_finalize(sender: Any = None, **_: Any) -> None:
    if sender is None:
        return
    try:
        apply_redlock_tasks(sender)
    except ConfigurationError as exc:
        # Celery logs and swallows errors of signal receivers: keep it for the
        # worker's start-up check, which fails the worker with it.
        sender._redlock_setup_error = exc
        logger.error("celery_redlock configuration error: %s", exc)


class RedlockStartupCheck(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep: refuse to start with bad ``redlock_*`` settings."""

    name = "celery_redlock startup check"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        app = parent.app
        error = getattr(app, "_redlock_setup_error", None)
        if error is not None:
            raise error
        settings_for(app).make_redlock().close()  # node URLs and timeouts
        apply_redlock_tasks(app)


def apply_redlock_tasks(app: Any) -> list[str]:
    """Give every task named in ``redlock_tasks`` its options; return the names."""
    settings = settings_for(app)
    applied = []
    for name, options in settings.tasks.items():
        check_option_names(name, options)
        task = app.tasks.get(name)
        if task is None:
            raise ConfigurationError(
                f"redlock_tasks names task {name!r}, which this app does not know; "
                "check the name and that its module is imported (include= or imports=)",
                option="redlock_tasks",
            )
        cls = type(task)
        if issubclass(cls, LockedTask) and cls.__dict__.get("_redlock_configured"):
            applied.append(name)
            continue
        try:
            policy = TaskPolicy.from_options(name, task_signature(cls), options)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"redlock_tasks: {exc}", option=f"redlock_tasks[{name!r}].{exc.option}"
            ) from exc
        attributes = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "_redlock_policy": policy,
            "_redlock_configured": True,
            **options,
        }
        if issubclass(cls, LockedTask):
            configured = type(cls.__name__, (cls,), attributes)
        else:
            configured = type(cls.__name__, (LockedTask, cls), attributes)
        task.__class__ = configured
        # Workers build a tracer per task on first use; drop one built already.
        task.__trace__ = None
        applied.append(name)
        logger.debug("redlock_tasks: %s configured with %s", name, options)
    return applied
