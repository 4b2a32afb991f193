"""What a worker says about celery_redlock when it starts, on the ``celery_redlock.startup`` logger.

Once per worker, from the start-up bootstep, in the worker's main process:

- INFO ``celery_redlock: 3 lock nodes, quorum 2: redis://r1:6379/0 ok, ...``,
  or the same at WARNING when a node does not answer, with ``quorum NOT
  reachable`` and what that means for tasks when fewer than a majority do;
- WARNING for each ``app.conf`` name that looks meant for celery_redlock but
  is never read (:func:`celery_redlock.tasks.settings.unknown_settings`);
- WARNING when the locks fall back to ``redis://localhost:6379/0`` because
  ``redlock_nodes`` is unset and the broker is not Redis;
- WARNING for each ``redlock_tasks`` entry whose task no module registered.

Nothing here stops the worker: bad values do, earlier, in the bootstep.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..errors import RedlockError
from ..tasks.task_table import unknown_task
from . import Admin
from .check import conf_findings

__all__ = ["PROBE_TIMEOUT", "nodes_line", "notices", "report"]

logger = logging.getLogger("celery_redlock.startup")

#: Longest wait for a node's PING at start-up, seconds: long enough for a first
#: connection (TLS included), short enough not to hold the worker up.
PROBE_TIMEOUT = 1.0


def notices(app: Any, missing_tasks: Sequence[str] = ()) -> list[str]:
    """The warnings about the app's configuration, without contacting any node.

    Those of ``celery redlock check`` (:func:`.check.conf_findings`), and each
    ``redlock_tasks`` entry in ``missing_tasks`` whose task no module registered.
    """
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
