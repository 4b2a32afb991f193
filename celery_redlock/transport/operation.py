"""One fan-out in flight: an :class:`Op`, with a :class:`Part` per node that settles its result."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .commands import Call, Command, NodeFailure, NodeResult, NotWaitedFor, checked
from .connection import Link, Slot

__all__ = ["PER_CALL_ALLOWANCE", "Enough", "FanOutNode", "Op", "Part"]

#: Extra seconds a node gets per command beyond the first in one batch.
PER_CALL_ALLOWANCE = 0.0001
#: Once the outcome is decided, the other nodes are waited for this long more
#: (or as long again as the decision took, if longer).
_GRACE = 0.001

#: ``enough(results)``: given each node's result so far (``None`` while it has
#: not answered), whether the caller's outcome is already decided.
Enough = Callable[[Sequence[NodeResult | None]], bool]


class FanOutNode(Protocol):
    """What the fan-out needs of a node (:class:`~.nodes.Node` is one)."""

    name: str
    #: Left a command unanswered past its deadline: waited for only a moment.
    suspect: bool

    @property
    def direct(self) -> object:
        """A client object reached through its own methods (:meth:`run_direct`), or None."""

    @property
    def sentinel(self) -> object:
        """The Sentinel-managed master it stands for (:meth:`locate` first), or None."""

    def run_direct(self, calls: Sequence[Call | Command]) -> NodeResult:
        """Run ``calls`` through :attr:`direct`."""

    def locate(self) -> BaseException | None:
        """Point a Sentinel-managed node's links at its master; why it is unusable, or None."""

    def link(self, *, bulk: bool = False) -> Link:
        """The node's shared link (``bulk``: the one for large batches)."""

    def demoted(self) -> None:
        """The node answered ``READONLY``."""


class Part:
    """One node's share of a fan-out: its commands and, in time, its replies."""

    __slots__ = (
        "calls",
        "deadline",
        "done",
        "graced",
        "index",
        "lagging",
        "link",
        "node",
        "op",
        "queued",
        "reload",
        "replies",
    )

    def __init__(
        self, op: Op, index: int, node: FanOutNode, calls: Sequence[Call | Command]
    ) -> None:
        self.op = op
        self.index = index
        self.node = node
        self.calls = calls
        self.deadline = math.inf
        self.done = False
        self.replies: list[Any] = []
        self.reload: list[int] | None = None
        self.link: Link | None = None
        self.queued = 0.0
        self.graced = False  # waited for only a moment more, the outcome being decided
        self.lagging = False  # its node was suspect when the part was queued

    def deliver(self, link: Link, replies: list[Any]) -> None:
        """The replies arrived; scripts missing from the node's cache are sent again."""
        if any(_read_only(reply) for reply in replies):
            self.node.demoted()  # a replica now: a Sentinel-managed node looks for its master
        if self.done:
            # Nobody waits: resend a release lost to SCRIPT FLUSH (or the key lives out its ttl),
            # never an acquire or extend (an undo queued after it may have run already).
            late = []
            for call, reply in zip(self.calls, replies, strict=True):
                if isinstance(reply, NoScriptError) and isinstance(call, Call):
                    if call.late_ok:
                        late.append(call.packed(by_sha=False))
                    else:
                        link.scripts.discard(call.script.sha)
            if late:
                link.queue(b"".join(late), Slot(len(late), None))
                link.flush()
            return
        if self.reload is None:
            missing = [
                position
                for position, (call, reply) in enumerate(zip(self.calls, replies, strict=True))
                if isinstance(reply, NoScriptError) and isinstance(call, Call)
            ]
            if missing:
                # SCRIPT FLUSH since the source was sent: EVAL, with the same allowance.
                self.replies, self.reload = replies, missing
                payload = b"".join(
                    self.calls[position].packed(by_sha=False)  # type: ignore[call-arg]
                    for position in missing
                )
                link.queue(payload, Slot(len(missing), self))
                link.flush()
                self.deadline = time.monotonic() + self.op.allowance(len(missing))
                return
            self.op.settle(self, replies)
            return
        for position, reply in zip(self.reload, replies, strict=True):
            self.replies[position] = reply
        self.op.settle(self, self.replies)

    def fail(self, cause: BaseException) -> None:
        """The node's link broke before every reply arrived."""
        self.op.settle(self, NodeFailure(self.node.name, cause))


class Op:
    """One fan-out: its parts, what has come back, and how its owner waits."""

    __slots__ = (
        "decided",
        "enough",
        "error",
        "event",
        "finished",
        "parts",
        "promoted",
        "results",
        "started",
        "timeout",
        "waiting",
    )

    def __init__(self, count: int, timeout: float, enough: Enough | None) -> None:
        self.started = time.monotonic()
        self.decided = False
        self.results: list[NodeResult | None] = [[] for _ in range(count)]
        self.parts: list[Part] = []
        self.waiting = 0
        self.enough = enough
        self.timeout = timeout
        self.finished = False
        self.event: threading.Event | None = None
        self.promoted = False
        self.error: BaseException | None = None

    def allowance(self, calls: int) -> float:
        """How long ``calls`` commands to one node may take."""
        return self.timeout + PER_CALL_ALLOWANCE * (calls - 1)

    def add(self, part: Part) -> None:
        """Count ``part`` as awaited."""
        self.parts.append(part)
        self.results[part.index] = None
        self.waiting += 1

    def settle(self, part: Part, result: NodeResult) -> None:
        """Record one node's result; finish when all are in or ``enough`` says so."""
        if part.done:
            return
        part.done = True
        if not isinstance(result, NodeFailure):
            result = checked(part.calls, result)
        self.results[part.index] = result
        self.waiting -= 1
        if self.finished:
            return
        if self.waiting == 0:
            self.finish()
        elif self.enough is not None and not self.decided:
            try:
                decided = self.enough(self.results)
            except Exception as exc:  # the caller's predicate: re-raised by its owner
                self.error = exc
                self.finish()
                return
            if decided:
                self.decide()

    def decide(self) -> None:
        """The outcome is known: wait a moment more for healthy nodes, none for suspect ones.

        A healthy node answers within microseconds of the others, so a caller that looks at
        every node right after finds them settled.
        """
        self.decided = True
        now = time.monotonic()
        grace = now + max(_GRACE, now - self.started)
        for part in self.parts:
            if part.done:
                continue
            if part.node.suspect:
                self.settle(part, _not_waited_for(part.node.name))
            else:
                part.graced = True
                part.deadline = min(part.deadline, grace)
        if self.waiting == 0 and not self.finished:
            self.finish()

    def finish(self) -> None:
        """Stop waiting: parts not in yet are not waited for; wake the owner."""
        self.finished = True
        for part in self.parts:
            if not part.done:
                part.done = True
                self.waiting -= 1
                self.results[part.index] = _not_waited_for(part.node.name)
        if self.event is not None:
            self.event.set()

    def expire(self, drained: float) -> None:
        """Give up on parts past their deadline when the sockets were last read.

        A node silent since the part was queued becomes suspect; a slow one (a long queue) not.
        """
        for part in self.parts:
            if not part.done and part.deadline <= drained:
                link = part.link
                if link is None or link.last_reply < part.queued:
                    part.node.suspect = True
                self.settle(
                    part,
                    _not_waited_for(part.node.name, decided=self.decided)
                    if part.graced
                    else NodeFailure(
                        part.node.name, RedisTimeoutError("no reply within the node timeout")
                    ),
                )

    def next_deadline(self) -> float:
        """The earliest deadline of a part still awaited."""
        return min((part.deadline for part in self.parts if not part.done), default=0.0)


def _not_waited_for(name: str, decided: bool = True) -> NotWaitedFor:
    if decided:
        return NotWaitedFor(
            name, RedisTimeoutError("not waited for: the outcome was decided without it")
        )
    # A suspect node (its last command went unanswered past its deadline) gets only a moment.
    return NotWaitedFor(
        name,
        RedisTimeoutError(
            "no reply within the moment a node gets after missing a deadline; it is waited "
            "for in full again once it answers"
        ),
    )


def _read_only(reply: Any) -> bool:
    """Whether a reply says the node is a replica now (Redis 6.2 wraps it in a script error)."""
    if isinstance(reply, ReadOnlyError):
        return True
    return isinstance(reply, ResponseError) and "-READONLY " in str(reply)
