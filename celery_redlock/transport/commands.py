"""What a fan-out sends to a node (:class:`Call`, :class:`Command`) and what it gets back.

A node answers one reply per call, or a :class:`NodeFailure`. :func:`checked` replaces a reply
of the wrong shape (a proxy, a server that is not Redis) with a :class:`WrongReply`: that node's
failure for the call, like an error reply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from .._scripts import LuaScript
from .resp import pack

__all__ = ["Call", "Command", "NodeFailure", "NodeResult", "NotWaitedFor", "WrongReply", "checked"]


class NodeFailure(Exception):
    """A node did not answer (refused, reset, timed out); ``cause`` is also ``__cause__``."""

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(node, cause)
        self.node = node
        self.cause = self.__cause__ = cause

    def __str__(self) -> str:
        return f"{self.node}: {self.cause}"


class NotWaitedFor(NodeFailure):
    """Not waited for: the outcome was decided without it (``enough``), or the node is suspect.

    Suspect: an earlier command went unanswered past the node timeout. The commands were still
    sent, in order, so they may still run there; their late replies are dropped.
    """


@dataclass(frozen=True, slots=True)
class Call:
    """One script call to send to one node."""

    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    #: Worth resending after a ``SCRIPT FLUSH`` though nobody waits any more (a release only
    #: deletes its own value); writes (acquire, extend) must never run late.
    late_ok: bool = False

    def packed(self, *, by_sha: bool = True) -> bytes:
        """The command in Redis protocol: EVALSHA, or EVAL with the source to (re)load it."""
        head: tuple[str | bytes, ...] = (
            ("EVALSHA", self.script.sha) if by_sha else ("EVAL", self.script.source)
        )
        return pack((*head, len(self.keys), *self.keys, *self.args))


@dataclass(frozen=True, slots=True)
class Command:
    """One plain command (``DEL``, ``PING``…) to send to one node."""

    args: tuple[str | int, ...]
    #: The SHA1 of the script a ``SCRIPT LOAD`` loads: the calls of that
    #: script queued after it on the same connection name it by SHA.
    loads: str | None = None

    def packed(self) -> bytes:
        """The command in Redis protocol."""
        return pack(self.args)


#: One node's answer: a reply (or ``ResponseError``) per call, or why it failed.
NodeResult = list[Any] | NodeFailure


class WrongReply(ResponseError):
    """A reply of the wrong shape; a ``ResponseError`` so it counts wherever an error reply does."""

    def __init__(self, what: str, reply: Any) -> None:
        shown = repr(reply)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{what}: a reply of the wrong shape: {shown}; is this a Redis server?")


def _integer(reply: Any, *allowed: int) -> bool:
    return type(reply) is int and (not allowed or reply in allowed)


def _integers(reply: Any, count: int | None = None) -> bool:
    """A list of integers (``count`` of them, if given)."""
    return (
        isinstance(reply, list)
        and (count is None or len(reply) == count)
        and all(type(item) is int for item in reply)
    )


def _codes(reply: Any, count: int) -> bool:
    """``renew.lua``'s answer: one of ``1 2 0 -`` per lock."""
    return isinstance(reply, bytes) and len(reply) == count and not reply.strip(b"120-")


def _acquire(call: Call, reply: Any) -> bool:
    """``{1, fence, now_us}`` or ``{0, fence, now_us, pttl_ms}``."""
    return _integers(reply) and (len(reply), reply[:1]) in ((3, [1]), (4, [0]))


def _semaphore_acquire(call: Call, reply: Any) -> bool:
    """``{slot, retry_ms, ticket, free}``."""
    return (
        isinstance(reply, list)
        and len(reply) == 4
        and _integers(reply[:3], 3)
        and _integers(reply[3])
    )


#: What each script's reply must look like, by script name; scripts not
#: listed are taken as they answer.
_SHAPES: dict[str, Callable[[Call, Any], bool]] = {
    "acquire": _acquire,
    "extend": lambda call, reply: _integer(reply, -1, 0, 1),
    "release": lambda call, reply: _integer(reply, -1, 0, 1),
    "release_owner": lambda call, reply: _integer(reply, 0, 1),
    "inspect": lambda call, reply: (
        isinstance(reply, list)
        and len(reply) == 2
        and isinstance(reply[0], bytes | None)
        and _integer(reply[1])
    ),
    "fence_raise": lambda call, reply: isinstance(reply, bytes) and reply.isdigit(),
    "renew": lambda call, reply: _codes(reply, len(call.keys)),
    "semaphore_acquire": _semaphore_acquire,
    "semaphore_release": lambda call, reply: _integer(reply, -1, 0, 1),
    "semaphore_release_owner": lambda call, reply: _integer(reply) and reply >= 0,
    "semaphore_renew": lambda call, reply: _codes(reply, len(call.keys) // 2),
}


def _fits(call: Call | Command, reply: Any) -> bool:
    if isinstance(call, Call):
        shape = _SHAPES.get(call.script.name)
        return shape is None or shape(call, reply)
    name = str(call.args[0]).upper()
    if name == "MGET":
        return (
            isinstance(reply, list)
            and len(reply) == len(call.args) - 1
            and all(isinstance(value, bytes | None) for value in reply)
        )
    if name == "SCRIPT" and call.loads is not None:
        return isinstance(reply, bytes)
    return True


def checked(calls: Sequence[Call | Command], replies: list[Any]) -> list[Any]:
    """``replies``, each of the wrong shape for its call replaced by a :class:`WrongReply`."""
    pairs = list(zip(calls, replies, strict=True))
    if all(isinstance(reply, ResponseError) or _fits(call, reply) for call, reply in pairs):
        return replies
    return [
        reply
        if isinstance(reply, ResponseError) or _fits(call, reply)
        else WrongReply(call.script.name if isinstance(call, Call) else str(call.args[0]), reply)
        for call, reply in pairs
    ]
