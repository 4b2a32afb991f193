"""A worker's start-up: the bootstep that checks the settings, and what it says about them.

Once per worker, on ``celery_redlock.startup``: the nodes and whether a quorum answers, unread
``redlock_*`` names, a fallback to the default node, unregistered ``redlock_tasks`` entries.
The report never stops the worker; bad values do, earlier, in the bootstep.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import bootsteps

from ..errors import ConfigurationError, RedlockError
from ..tasks.app_setup import connect_cleanup
from ..tasks.app_setup import logger as setup_logger
from ..tasks.app_state import enabled_for, policy_for, settings_for
from ..tasks.settings import in_user_terms
from ..tasks.task_table import StartupRefused, apply_entries, unknown_task, watch_registrations
from . import Admin
from .check import conf_findings

__all__ = ["PROBE_TIMEOUT", "RedlockStartupCheck", "nodes_line", "notices", "report"]

logger = logging.getLogger("celery_redlock.startup")

#: Longest wait for a node's PING at start-up, seconds: enough for a first TLS connection.
PROBE_TIMEOUT = 1.0


def notices(app: Any, missing_tasks: Sequence[str] = ()) -> list[str]:
    """The warnings about the app's configuration, without contacting any node."""
    found = [finding.message for finding in conf_findings(app.conf)]
    registered = list(app.tasks) if missing_tasks else []
    return found + [unknown_task(name, registered) for name in missing_tasks]


def report(app: Any, missing_tasks: Sequence[str] = ()) -> None:
    """Log the worker's celery_redlock set-up (see the module doc); never raises."""
    try:
        for notice in notices(app, missing_tasks):
            logger.warning("celery_redlock: %s", notice)
        with Admin(app, timeout=PROBE_TIMEOUT) as admin:
            level, line = nodes_line(admin)
        logger.log(level, "celery_redlock: %s", line)
    except (RedlockError, OSError) as exc:  # a report must not stop the worker
        logger.warning("celery_redlock: could not report the lock nodes: %s", exc)


def nodes_line(admin: Admin) -> tuple[int, str]:
    """The log level and line for the lock nodes: which answer, and whether a quorum does."""
    health = admin.ping()
    quorum = admin.redlock.quorum
    answered = sum(1 for node in health if node.ok)
    states = ", ".join(
        f"{node.node} ok" if node.ok else f"{node.node} DOWN ({node.error})" for node in health
    )
    count = f"{len(health)} lock node{'s' if len(health) != 1 else ''}, quorum {quorum}"
    if answered >= quorum:
        level = logging.INFO if answered == len(health) else logging.WARNING
        return level, f"{count}: {states}; quorum reachable ({answered} answer)"
    return logging.WARNING, (
        f"{count}: {states}; quorum NOT reachable ({answered} of {len(health)} answer, "
        f"{quorum} needed): LockedTasks are re-queued until a majority answers"
    )


class RedlockStartupCheck(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep: refuse to start with bad settings; connect the cleanup; report.

    Every task's options are resolved here, so a bad ttl is refused once, not at each run.
    """

    name = "celery_redlock startup check"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        try:
            self._check(parent.app)
        except ConfigurationError as exc:
            raise StartupRefused(in_user_terms(parent.app.conf, exc)) from None

    def _check(self, app: Any) -> None:
        error = getattr(app, "_redlock_setup_error", None)
        if error is not None:
            raise error
        settings_for(app).make_redlock().close()  # node URLs and timeouts; connects nowhere
        watch_registrations(app)
        missing = apply_entries(app)
        for task in app.tasks.values():
            policy_for(task)
        if not enabled_for(app):
            setup_logger.warning(
                "redlock_enabled is False: LockedTasks run as plain tasks, without locks, "
                "singletons or global rate limits, and no lock node is contacted"
            )
            return
        connect_cleanup()
        report(app, missing_tasks=missing)
