"""Waking a blocked waiter when a lock is released (pub/sub), else sleeping."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .. import _clock
from ..transport.nodes import Node

__all__ = ["ReleaseListener", "sleep"]

logger = logging.getLogger("celery_redlock.lock")

#: Whether this process has said that its waiters fall back to polling.
_polling_reported = False


class ReleaseListener:
    """Subscribes to a lock's release channel so a waiter wakes on release.

    One node is enough (releases publish on every node); with none, the waiter polls.
    """

    def __init__(self, nodes: Sequence[Node], channel: str) -> None:
        self._nodes = nodes
        self._channel = channel
        self._pubsub: Any = None

    def __enter__(self) -> ReleaseListener:
        problem = "no subscription confirmed in time"
        for node in self._nodes:
            pubsub = node.client.pubsub(ignore_subscribe_messages=False)
            try:
                pubsub.subscribe(self._channel)
                # Wait for the confirmation: only then are releases seen.
                confirmed = pubsub.get_message(timeout=self._nodes_timeout(node))
                if confirmed is not None and confirmed["type"] == "subscribe":
                    self._pubsub = pubsub
                    return self
            except (RedisError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            pubsub.close()
        _report_polling(problem)
        return self

    @staticmethod
    def _nodes_timeout(node: Node) -> float:
        timeout = node.pool.connection_kwargs.get("socket_timeout")
        return float(timeout) if timeout else 0.05

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return True if a release woke us."""
        if self._pubsub is None:
            sleep(seconds)
            return False
        deadline = _clock.monotonic() + seconds
        try:
            while True:
                remaining = deadline - _clock.monotonic()
                if remaining <= 0:
                    return False
                message = self._pubsub.get_message(timeout=remaining)
                if message is not None and message["type"] == "message":
                    return True
        except (RedisError, OSError):
            # The node went away: poll from now on.
            self._close()
            sleep(max(0.0, deadline - _clock.monotonic()))
            return False

    def _close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                self._pubsub.close()
            self._pubsub = None

    def __exit__(self, *exc_info: object) -> None:
        self._close()


def _report_polling(problem: str) -> None:
    """Say once per process that waiters poll instead of waking on release."""
    global _polling_reported
    if not _polling_reported:
        _polling_reported = True
        logger.warning(
            "release notifications unavailable on every lock node (%s): blocked waiters "
            "poll at their retry delay instead of waking at each release; said once per process",
            problem,
        )


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` (nothing for 0 or less)."""
    if seconds > 0:
        threading.Event().wait(seconds)
