"""Which Redis the limiter asks, and what it tells the log when one stops or starts answering.

A limiter has a primary Redis and, optionally, a fallback. Each decision goes
to the first of them that is answering; a node that fails is marked down and
the change is logged once (and once again when it answers), never per call.
A node that failed by *timing out* is not asked again for ``retry_interval``
seconds, so a paused server does not cost every decision a node timeout; a
node that refuses connections is asked on every call, which costs nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from .. import _clock
from ..transport.failure_text import detail
from ..transport.nodes import Node

__all__ = ["NodeStatus", "Routes", "logger"]

#: Where the limiter logs a Redis going down and coming back.
logger = logging.getLogger("celery_redlock.ratelimit")


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One of the limiter's Redis servers, as this process last found it.

    Attributes:
        node: the server's display name (password removed).
        role: ``"primary"`` or ``"fallback"``.
        answering: whether its last decision succeeded (true until one fails).
        down_for: seconds since it stopped answering; ``None`` while answering.
        error: why its last decision failed; ``None`` while answering.
    """

    node: str
    role: str
    answering: bool
    down_for: float | None
    error: str | None


class _Route:
    __slots__ = ("down_since", "error", "node", "role", "skip_until")

    def __init__(self, node: Node, role: str) -> None:
        self.node = node
        self.role = role
        self.down_since: float | None = None
        self.skip_until = 0.0
        self.error: str | None = None


class Routes:
    """The limiter's nodes in the order to ask them, with their health.

    Args:
        nodes: the primary, then the fallback if any.
        retry_interval: seconds a node that timed out is left alone.
        node_timeout: the limiter's timeout (a failure that took most of it
            was a timeout).
        when_down: what decisions do while no node answers, for the log.
    """

    def __init__(
        self, nodes: Sequence[Node], retry_interval: float, node_timeout: float, when_down: str
    ) -> None:
        roles = ("primary", "fallback")
        self._routes = [_Route(node, role) for node, role in zip(nodes, roles, strict=False)]
        self._retry_interval = retry_interval
        self._slow = node_timeout / 2
        self._when_down = when_down
        self._lock = threading.Lock()
        _every_routes.add(self)

    @property
    def nodes(self) -> list[Node]:
        """Every node, primary first."""
        return [route.node for route in self._routes]

    def candidates(self) -> list[_Route]:
        """The nodes to ask now, in order: timed-out nodes wait out their retry interval."""
        now = _clock.monotonic()
        return [route for route in self._routes if route.skip_until <= now]

    def failed(self, route: _Route, error: BaseException, took: float) -> None:
        """Record that ``route`` made no decision; log it if it was answering."""
        now = _clock.monotonic()
        text = detail(error)
        with self._lock:
            was_up = route.down_since is None
            route.error = text
            if took >= self._slow:
                route.skip_until = now + self._retry_interval
            if was_up:
                route.down_since = now
        if was_up:
            logger.warning(
                "rate limiter: the %s Redis at %s made no decision (%s); %s",
                route.role,
                route.node.name,
                text,
                self._consequence(route),
            )

    def succeeded(self, route: _Route) -> None:
        """Record that ``route`` decided; log it if it had been down."""
        if route.down_since is None:
            return
        with self._lock:
            since, route.down_since = route.down_since, None
            route.error = None
            route.skip_until = 0.0
        if since is not None:
            logger.warning(
                "rate limiter: the %s Redis at %s answers again after %.1f s; decisions are "
                "made there again",
                route.role,
                route.node.name,
                _clock.monotonic() - since,
            )

    def status(self) -> list[NodeStatus]:
        """Each node's health, for ``check`` and dashboards."""
        now = _clock.monotonic()
        with self._lock:
            return [
                NodeStatus(
                    node=route.node.name,
                    role=route.role,
                    answering=route.down_since is None,
                    down_for=None if route.down_since is None else now - route.down_since,
                    error=route.error,
                )
                for route in self._routes
            ]

    def _consequence(self, route: _Route) -> str:
        later = self._routes[self._routes.index(route) + 1 :]
        if later:
            return (
                f"decisions go to the {later[0].role} Redis at {later[0].node.name}, whose "
                "counts start from what it holds, until this one answers again"
            )
        return f"{self._when_down} until a Redis answers again"


# A child forked while another thread held a Routes lock would wait on it
# forever: each child starts with fresh locks.
_every_routes: weakref.WeakSet[Routes] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for routes in list(_every_routes):
        routes._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
