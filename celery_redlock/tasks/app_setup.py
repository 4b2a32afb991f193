"""How celery_redlock plugs into a Celery app: ``setup(app)``, start-up and cleanup.

:func:`setup` applies ``redlock_tasks`` (:mod:`.task_table`) and adds the worker bootstep that
refuses bad settings. The cleanup frees, by exact owner, the locks and slots of a run whose
process died (hard time limit, terminate, crashed pool process) or that was revoked while
queued, instead of leaving them to their ttl; :mod:`.cleanup_request` calls it in workers.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals as celery_signals

from .._layout import QUEUED
from ..errors import ConfigurationError
from .app_state import enabled_for, policy_for, redlock_for
from .call_overrides import guard_send_task
from .features.redelivery import delivery_name, mark_ended
from .locked_task import STARTUP_STEP
from .policies import TaskPolicy
from .publish import watch_beat
from .settings import Settings, in_user_terms
from .task_table import apply_entries, check_entry, watch_registrations

__all__ = [
    "connect_cleanup",
    "free_by_owner",
    "request_owner",
    "setup",
]

logger = logging.getLogger("celery_redlock.hooks")
cleanup_logger = logging.getLogger("celery_redlock.task")


def setup(app: Any) -> None:
    """Apply ``app.conf.redlock_tasks`` to the app's tasks, now and as they are registered.

    Safe to call more than once; bad settings raise ``ConfigurationError`` once the app is
    finalized::

        app = Celery("proj")
        app.conf.redlock_tasks = {"reports.nightly": {"singleton": True}}
        celery_redlock.setup(app)
    """
    app.steps["worker"].add(STARTUP_STEP)
    connect_cleanup()
    watch_beat()
    guard_send_task(app)
    if getattr(app, "_redlock_setup", False):
        return
    if app.configured or getattr(app, "_config_source", None) is not None:
        # Checked where the process starts, not at its first .delay(). Logged, not raised: a
        # raise from an import is a long traceback; the worker refuses with one line.
        try:
            for name, options in Settings.from_conf(app.conf).tasks.items():
                check_entry(name, options)
        except ConfigurationError as exc:
            _keep_error(app, exc)
    app._redlock_setup = True
    watch_registrations(app)
    if app.finalized:
        apply_entries(app)
    else:
        app.on_after_finalize.connect(_on_finalize, weak=False)


def _on_finalize(sender: Any = None, **_: Any) -> None:
    if sender is None:
        return
    try:
        apply_entries(sender)
    except ConfigurationError as exc:
        # Celery swallows receivers' errors: keep it for the worker's start-up check.
        _keep_error(sender, exc)


def _keep_error(app: Any, exc: ConfigurationError) -> None:
    """Log a bad setting or entry once, named as written; the worker refuses to start with it."""
    if getattr(app, "_redlock_setup_error", None) is None:
        app._redlock_setup_error = in_user_terms(app.conf, exc)
        logger.error("celery_redlock configuration error: %s", app._redlock_setup_error)


# -- main-process cleanup ------------------------------------------------------------


def connect_cleanup() -> None:
    """Connect the receivers that free the locks of task processes that died (once, globally)."""
    celery_signals.task_revoked.connect(_on_task_revoked, weak=False)


def free_by_owner(task: Any, task_id: str | None, args: Any, kwargs: Any, where: str) -> None:
    """Free the locks and slots a run of ``task`` held as ``task_id`` at ``where``, and only those.

    ``where`` (``host:pid``, or ``queued``) spares a re-delivered copy with the same task id.
    """
    policy = getattr(task, "_redlock_policy", None)
    if not isinstance(policy, TaskPolicy) or not task_id or not enabled_for(task.app):
        return
    try:
        names = [*policy.lock_names(args or (), kwargs or {}), delivery_name(task_id)]
        redlock = redlock_for(task.app)
        if where != QUEUED:
            # First: the run, if still alive, finds its locks freed on purpose.
            resolved = policy_for(task)
            ttl = resolved.ttl if resolved is not None and resolved.ttl else None
            mark_ended(redlock, task_id, where, ttl or redlock.default_ttl)
        for name in names:
            if redlock.release_owner(name, task_id, where):
                cleanup_logger.info("freed lock %r of task %s, which ended abruptly", name, task_id)
        for name in policy.slot_names(args or (), kwargs or {}):
            if redlock.release_semaphore_owner(name, task_id, where):
                cleanup_logger.info(
                    "freed concurrency slot %r of task %s, which ended abruptly", name, task_id
                )
    except Exception:
        cleanup_logger.exception("could not free the locks of task %s", task_id)


def request_owner(request: Any) -> str:
    """``where`` of the locks a worker request's run holds: its pool process, or ``queued``."""
    pid = getattr(request, "worker_pid", None)
    if not pid:
        return QUEUED
    return f"{request.hostname}:{pid}"


def _on_task_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        free_by_owner(sender, request.id, request.args, request.kwargs, request_owner(request))
