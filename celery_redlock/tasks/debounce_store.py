"""Debounce records on one Redis: the store behind :mod:`celery_redlock.tasks.features.debounce`.

One script call per publish, run or withdrawal (``debounce_*.lua``); layout in ``_layout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import ResponseError

from .._layout import debounce_record
from .._scripts import load
from ..errors import DebounceUnavailable
from ..transport.nodes import Call, Node, NodeFailure, fan_out

__all__ = ["STORE_TIMEOUT", "DebounceStore", "Verdict"]

#: Longest wait for the debounce store, seconds (a record is no lock: waiting only delays).
STORE_TIMEOUT = 0.5
_PUBLISH = load("debounce_publish")
_CHECK = load("debounce_check")
_WITHDRAW = load("debounce_withdraw")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a copy that comes up to run is to do."""

    #: ``"run"``, ``"early"`` (latest, but not due for ``wait`` s) or ``"superseded"``.
    action: str
    wait: float = 0.0
    #: The later copy that replaced this one (``"superseded"``).
    latest: str | None = None


class DebounceStore:
    """Debounce records on one Redis: one script call per publish and per run.

    Example::

        store = DebounceStore("redis://localhost:6379/0", key_prefix="redlock:")
        seq = store.publish("debounce:proj.reindex:42", task_id, delay=5.0, ttl=3605.0)
        store.check("debounce:proj.reindex:42", task_id, seq, ttl=3605.0)   # Verdict
    """

    def __init__(self, where: str | redis.Redis, *, key_prefix: str) -> None:
        if isinstance(where, redis.Redis):
            self.node = Node.from_client(where, STORE_TIMEOUT)
        else:
            self.node = Node.from_url(where, STORE_TIMEOUT)
        self.key_prefix = key_prefix

    def key(self, name: str) -> str:
        """The Redis key of ``name``'s record."""
        return debounce_record(self.key_prefix, name)

    def publish(self, name: str, task_id: str, *, delay: float, ttl: float) -> int:
        """Record ``task_id`` as ``name``'s latest, due in ``delay`` s; return its sequence."""
        reply = self._call(_PUBLISH, name, (task_id, _ms(delay), _ms(delay + ttl)))
        return int(reply[0])

    def withdraw(self, name: str, task_id: str) -> bool:
        """Make the publish before ``task_id`` the latest again, if ``task_id`` still is."""
        return int(self._call(_WITHDRAW, name, (task_id,))) == 1

    def check(self, name: str, task_id: str, seq: int, *, ttl: float) -> Verdict:
        """Whether the copy ``task_id`` (published with ``seq``) runs now (see the script)."""
        reply = self._call(_CHECK, name, (task_id, str(seq), _ms(ttl)))
        code = int(reply[0])
        if code == 1:
            return Verdict("run")
        if code == 2:
            return Verdict("early", wait=int(reply[1]) / 1000)
        latest = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return Verdict("superseded", latest=latest)

    def close(self) -> None:
        """Close the store's connections (they reopen when next used)."""
        self.node.close()

    def _call(self, script: Any, name: str, args: tuple[str | int, ...]) -> Any:
        call = Call(script, (self.key(name),), args)
        (result,) = fan_out((self.node,), ((call,),), STORE_TIMEOUT)
        if isinstance(result, NodeFailure):
            raise DebounceUnavailable(
                f"debounce store {self.node.name}: {result}", node=self.node.name
            ) from result
        reply = result[0]
        if isinstance(reply, ResponseError):
            raise DebounceUnavailable(
                f"debounce store {self.node.name}: {reply}", node=self.node.name
            ) from reply
        return reply


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000 + 0.999), 1)
