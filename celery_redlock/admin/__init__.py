"""The admin API: held locks, forced release, rate-limit state and node health, as data.

Every call returns dataclasses (``as_dict()`` for JSON); the command line only renders them::

    with Admin(app) as admin:
        for view in admin.locks("sync-user:*").locks:
            print(view.name, view.task_id, view.ttl)
        report = admin.check()
        if not report.ok:
            print(report.errors)
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from types import TracebackType
from typing import Any

from ..errors import ConfigurationError
from ..lock.redlock import Redlock
from ..ratelimit import Algorithm, Backoff, RateLimiter, RateOverride
from ..ratelimit.rates import Rate
from ..tasks.app_state import settings_for
from ..tasks.settings import Settings
from .check import CheckReport, Finding, run_check
from .locks import (
    LockListing,
    LockView,
    OwnerRelease,
    ReleaseOutcome,
    describe,
    force_release,
    list_locks,
    release_owned,
)
from .node_access import NodeClient, OpenNode, lock_nodes, open_node
from .node_health import NodeHealth, ping, probe
from .rate_limits import LimitUse, RateView, rate_overview, rate_view, task_uses
from .task_rate_limits import TaskRateLimit, task_limits

__all__ = [
    "Admin",
    "CheckReport",
    "Finding",
    "LimitUse",
    "LockListing",
    "LockView",
    "NodeHealth",
    "OwnerRelease",
    "RateView",
    "ReleaseOutcome",
    "TaskRateLimit",
]


class Admin:
    """Inspect and repair one app's locks and rate limits.

    Args:
        app: the Celery app whose ``redlock_*`` settings name the nodes.
        timeout: longest wait for one node, seconds; replaces ``redlock_node_timeout`` so a
            merely busy node is not reported down.
    """

    def __init__(self, app: Any, *, timeout: float = 1.0) -> None:
        self.app = app
        self.timeout = timeout
        self._opened: list[Redlock | RateLimiter] = []

    @cached_property
    def settings(self) -> Settings:
        """The app's checked settings (raises ConfigurationError)."""
        return settings_for(self.app)

    @cached_property
    def redlock(self) -> Redlock:
        """A Redlock on the app's nodes and key prefix, with this admin's timeout."""
        made = dataclasses.replace(self.settings, node_timeout=self.timeout).make_redlock()
        self._opened.append(made)
        return made

    def nodes(self) -> list[NodeClient]:
        """The lock nodes."""
        return lock_nodes(self.redlock)

    def limiter(self) -> tuple[RateLimiter, OpenNode]:
        """The app's rate limiter and a plain connection to the same Redis (close it)."""
        settings = self.settings
        # Never an unchecked answer from a limiter told to fail open.
        limiter = settings.make_limiter(node_timeout=self.timeout, on_unavailable="raise")
        self._opened.append(limiter)
        option = "redlock_rate_limit_url" if settings.rate_limit_url else "redlock_nodes"
        try:
            node = open_node(settings.rate_limit_url or settings.nodes[0], self.timeout)
        except ConfigurationError as exc:
            raise exc.with_context(option=option) from exc
        return limiter, node

    def locks(self, pattern: str = "*") -> LockListing:
        """Held locks whose name matches ``pattern`` (a Redis glob)."""
        return list_locks(self.redlock, pattern)

    def describe(self, name: str) -> LockView | None:
        """What the nodes hold for lock ``name``; ``None`` when no node that answered holds it."""
        return describe(self.redlock, name)

    def release(self, name: str) -> ReleaseOutcome:
        """Delete lock ``name`` on every node, whoever holds it, and wake its waiters."""
        return force_release(self.redlock, name)

    def task_limits(self, task: str | None = None) -> list[TaskRateLimit]:
        """Every limit the app's tasks declare (``global_rate_limit``), or task ``task``'s.

        Raises:
            LookupError: the app has no task ``task``, or it has no limit.
        """
        return task_limits(self.app, self.settings, task)

    def held_by(self, task_id: str) -> list[LockView]:
        """The locks task ``task_id`` holds (its run lock, its singleton, queued or running)."""
        return [view for view in self.locks().locks if view.task_id == task_id]

    def release_task(self, task_id: str, views: list[LockView] | None = None) -> list[OwnerRelease]:
        """Free every lock task ``task_id`` still holds (of ``views``) and wake their waiters."""
        if views is None:
            views = self.held_by(task_id)
        return release_owned(self.redlock, task_id, views)

    def task_rates(
        self, name: str, key: str | None = None
    ) -> tuple[list[TaskRateLimit], list[LimitUse]]:
        """Task ``name``'s limits, and their use on ``key`` or on every key they counted.

        Raises:
            LookupError: no such task, no limit, or ``key`` is none of its limits' keys.
            RateLimiterUnavailable: the rate-limit Redis did not answer.
        """
        declared = self.task_limits(name)
        limiter, node = self.limiter()
        try:
            return declared, task_uses(limiter, node, declared, key)
        finally:
            node.close()

    def rate(
        self,
        key: str,
        *,
        rate: Any = None,
        limit: float | None = None,
        period: float | None = None,
        algorithm: Algorithm | None = None,
    ) -> RateView:
        """Rate-limit ``key``: each limit on it with its use now, its override, its state.

        The limit is ``rate`` (or ``limit`` per ``period``), else the tasks' limits on ``key``.
        """
        if rate is None and limit is not None and period is not None:
            rate = Rate(limit, float(period))
        limiter, node = self.limiter()
        try:
            declared = self.task_limits() if rate is None else []
            return rate_view(limiter, node, key, rate=rate, algorithm=algorithm, declared=declared)
        finally:
            node.close()

    def rate_limits(self) -> tuple[list[LimitUse], list[TaskRateLimit], list[RateOverride]]:
        """Every task limit with a fixed key and its use now; those keyed per call; overrides."""
        limiter, node = self.limiter()
        try:
            return rate_overview(limiter, node, self.task_limits())
        finally:
            node.close()

    def set_override(self, key: str, rate: Any, *, ttl: float) -> RateOverride:
        """Make ``rate`` the limit of ``key`` for ``ttl`` seconds in every worker, at once."""
        limiter, node = self.limiter()
        node.close()
        return limiter.set_override(key, rate, ttl=ttl)

    def clear_override(self, key: str) -> bool:
        """Remove the override of ``key`` (its own rate applies again); true if one was set."""
        limiter, node = self.limiter()
        node.close()
        return limiter.clear_override(key)

    def pause(self, key: str, seconds: float) -> Backoff:
        """Refuse every run of rate-limit ``key`` for ``seconds`` (a longer pause stays)."""
        limiter, node = self.limiter()
        node.close()
        return limiter.pause(key, seconds)

    def resume(self, key: str) -> bool:
        """End the pause of ``key`` now; true if it was paused."""
        limiter, node = self.limiter()
        node.close()
        return limiter.resume(key)

    def ping(self) -> list[NodeHealth]:
        """PING every lock node at once: which answer (``ok``, ``error``)."""
        return ping(self.redlock)

    def probe(self) -> list[NodeHealth]:
        """PING, TIME, INFO and persistence of every lock node."""
        return [probe(node) for node in self.nodes()]

    def check(self) -> CheckReport:
        """The settings, the app's tasks and every node, judged (see :mod:`.check`)."""
        return run_check(self)

    def close(self) -> None:
        """Close every connection this admin opened."""
        opened, self._opened = self._opened, []
        for item in opened:
            item.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
