"""What a fan-out sends to a node and what it gets back.

:class:`Call` (a Lua script: by SHA, or with its source the first time a
connection runs it) and :class:`Command` (a plain command)
are what the lock and the rate limiter ask a node to run; a node's answer is
a list of replies, one per call, or a :class:`NodeFailure` saying why there
is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._resp import pack
from ._scripts import LuaScript

__all__ = ["Call", "Command", "NodeFailure", "NodeResult", "NotWaitedFor"]


class NodeFailure(Exception):
    """A node did not answer (refused, reset, timed out, unusable).

    Attributes:
        node: the node's display name.
    """

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(f"{node}: {cause}")
        self.node = node


class NotWaitedFor(NodeFailure):
    """The fan-out did not wait for this node's answer.

    Either the caller's outcome was decided without it (``enough``), or the
    node is *suspect*: it left an earlier command unanswered past the node
    timeout, and is not waited for again until it answers. Its commands were
    still sent (or queued behind the unanswered ones on the same
    connection), in order, so they may still run there; their replies are
    read and dropped when they come.
    """


@dataclass(frozen=True, slots=True)
class Call:
    """One script call to send to one node."""

    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    #: Still worth running if its first send finds the script missing (a
    #: ``SCRIPT FLUSH``) after the caller stopped waiting (a release: it only
    #: deletes its own value).
    #: Calls that write (acquire, extend) must not run late, so they are not
    #: sent again once nobody waits for them.
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
