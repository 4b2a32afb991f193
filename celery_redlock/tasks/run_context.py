"""What a feature sees of one run: :class:`RunContext`, built once by the run.

The run (:class:`~celery_redlock.tasks.run.TaskRun`) implements it; features
and :mod:`.run_endings` take it, and never call back into the run otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from ..lock.held_lease import HeldLock
from ..lock.lock import Lock
from ..lock.redlock import Redlock
from ..lock.semaphore import Semaphore
from ..ratelimit import RateLimiter
from .policies import TaskPolicy

__all__ = ["RunContext"]


class RunContext(Protocol):
    """One run of a task: what it runs, under which policy, on which Redis."""

    task: Any
    request: Any
    policy: TaskPolicy
    task_id: str
    args: Any
    kwargs: Any

    @property
    def redlock(self) -> Redlock:
        """The app's Redlock, looked up once for the run."""

    @property
    def limiter(self) -> RateLimiter:
        """The app's rate limiter, looked up once for the run."""

    @property
    def ttl(self) -> float:
        """The time to live of the locks held while running."""

    def worker(self) -> str:
        """``hostname:pid`` of the process running the task."""

    def hold(
        self, lease: Lock | Semaphore, busy: Callable[[float], NoReturn], *, timeout: float = 0.0
    ) -> HeldLock:
        """Acquire ``lease`` (waiting up to ``timeout``) and keep it renewed; else ``busy``."""
