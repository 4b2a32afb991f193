"""Which Redis the limiter asks, how, and what it tells the log when one stops or starts answering.

Each decision goes to the first answering of a primary and an optional fallback; going down and
coming back are logged once each. A node that *timed out* is skipped for ``retry_interval``,
so a paused server does not cost every decision a timeout; a refusing one costs nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from .. import _clock
from ..errors import RateLimiterUnavailable
from ..transport.failure_text import detail
from ..transport.nodes import Call, Command, Node, NodeFailure, fan_out

__all__ = ["NodeStatus", "Routes", "logger"]

#: Where the limiter logs a Redis going down and coming back.
logger = logging.getLogger("celery_redlock.ratelimit")


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One of the limiter's Redis servers (``role``: primary or fallback), as last found.

    ``down_for`` (seconds) and ``error`` are ``None`` while ``answering``.
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
        node_timeout: the limiter's timeout (a failure taking half of it was a timeout).
        when_down: what decisions do while no node answers, for the log.
    """

    def __init__(
        self, nodes: Sequence[Node], retry_interval: float, node_timeout: float, when_down: str
    ) -> None:
        roles = ("primary", "fallback")
        self._routes = [_Route(node, role) for node, role in zip(nodes, roles, strict=False)]
        self._retry_interval = retry_interval
        self._timeout = node_timeout
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

    def everywhere(self, call: Call | Command, key: str) -> list[Any]:
        """Run ``call`` on every node; raise if any made no answer, after the rest did."""
        nodes = self.nodes
        results = fan_out(nodes, [(call,)] * len(nodes), self._timeout)
        failures: list[tuple[str, BaseException]] = []
        replies = []
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, NodeFailure):
                failures.append((node.name, result))
            elif isinstance(result[0], ResponseError):
                failures.append((node.name, result[0]))
            else:
                replies.append(result[0])
        if failures:
            raise self.unavailable([key], failures, done=len(replies))
        return replies

    def read(self, commands: tuple[Call | Command, ...], key: str) -> list[Any]:
        """Run read-only ``commands`` on the node that decides now (not failing open)."""
        failures: list[tuple[str, BaseException]] = []
        for route in self.candidates():
            began = _clock.monotonic()
            (result,) = fan_out((route.node,), (commands,), self._timeout)
            if isinstance(result, NodeFailure):
                self.failed(route, result, _clock.monotonic() - began)
                failures.append((route.node.name, result))
                continue
            for reply in result:
                if isinstance(reply, ResponseError):
                    raise self.unavailable([key], [(route.node.name, reply)]) from reply
            self.succeeded(route)
            return list(result)
        raise self.unavailable([key], failures)

    def unavailable(
        self, keys: Sequence[str], failures: Sequence[tuple[str, BaseException]], done: int = 0
    ) -> RateLimiterUnavailable:
        """The error for ``keys`` left undecided: each node's failure, or why none was asked."""
        shown = ", ".join(map(repr, keys))
        if failures:
            details = "; ".join(f"Redis at {name}: {detail(error)}" for name, error in failures)
            node = failures[0][0]
        else:
            down = [status for status in self.status() if not status.answering]
            details = "; ".join(
                f"Redis at {status.node} timed out {status.down_for or 0.0:.1f} s ago "
                f"({status.error}) and is asked again within {self._retry_interval:g} s"
                for status in down
            )
            node = down[0].node if down else ""
        also = f" (done on the {done} other node(s))" if done else ""
        error = RateLimiterUnavailable(
            f"rate limiter: no decision for key(s) {shown}{also}: {details}; check that the "
            "server is up and reachable, or raise node_timeout if it is only slow",
            key=keys[0] if keys else "",
            node=node,
        )
        if failures:
            error.__cause__ = failures[-1][1]
        return error

    def _consequence(self, route: _Route) -> str:
        later = self._routes[self._routes.index(route) + 1 :]
        if later:
            return (
                f"decisions go to the {later[0].role} Redis at {later[0].node.name}, whose "
                "counts start from what it holds, until this one answers again"
            )
        return f"{self._when_down} until a Redis answers again"


# A child forked while a thread held a Routes lock would wait forever: fresh locks in the child.
_every_routes: weakref.WeakSet[Routes] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for routes in list(_every_routes):
        routes._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
