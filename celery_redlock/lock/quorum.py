"""What the nodes said about one held lock, and the words for it.

Scripts answer per node: ours (1), absent (0), another owner's (-1). :class:`Tally` decides
*confirmed* (a quorum held it), *lost* (fewer than a quorum could, counting silent nodes as
holding it), or neither: too few answered to tell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from ..errors import QuorumUnavailable
from ..transport.nodes import Node, NodeFailure, NodeResult

__all__ = [
    "BUSY",
    "LOST",
    "RENEWED",
    "UNREACHABLE",
    "Tally",
    "acquire_decided",
    "failed",
    "majority_at_least",
    "majority_held",
    "reply",
]

#: Outcomes of :meth:`Redlock.renew` for one lock.
RENEWED, LOST, UNREACHABLE, BUSY = "renewed", "lost", "unreachable", "busy"

HELD, ABSENT, FOREIGN = 1, 0, -1
_CODES = {b"1": HELD, b"0": ABSENT, b"-": FOREIGN}


def reply(result: NodeResult, slot: int = 0) -> Any:
    """One call's reply from a node's result, or why there is none (see :func:`failed`)."""
    return result if isinstance(result, NodeFailure) else result[slot]


def failed(answer: Any) -> bool:
    """Whether a reply from :func:`reply` is a failure: no answer, or an error reply."""
    return isinstance(answer, NodeFailure | ResponseError)


@dataclass
class Tally:
    """Per-node answers about one lock value."""

    nodes: int
    quorum: int
    held: int = 0
    absent: int = 0
    foreign: int = 0
    unreachable: int = 0
    #: ``{node: error}`` for the nodes that did not answer, or answered with an error.
    failures: dict[str, BaseException] = field(default_factory=dict)
    #: Indexes of the nodes that answered without the key (counted in ``absent``).
    lacking: list[int] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        nodes: Sequence[Node],
        results: Sequence[NodeResult],
        quorum: int,
        slot: int = 0,
        asked: int | None = None,
    ) -> Tally:
        """Count slot ``slot`` of every node's result; ``asked``: nodes asked (empty: not asked)."""
        tally = cls(nodes=len(nodes) if asked is None else asked, quorum=quorum)
        for index, (node, result) in enumerate(zip(nodes, results, strict=True)):
            if isinstance(result, NodeFailure):
                tally.unreachable += 1
                tally.failures[node.name] = result
            elif result:  # an empty result: not asked
                answer = result[slot]
                if isinstance(answer, ResponseError):
                    tally.unreachable += 1
                    tally.failures[node.name] = answer
                elif answer == HELD:
                    tally.held += 1
                else:
                    tally.count(answer, node=index)
        return tally

    def count(self, answer: int | bytes, node: int | None = None) -> None:
        """Count one answer (an integer, or a ``renew.lua`` character); ``node`` for ``lacking``."""
        code = _CODES.get(answer, ABSENT) if isinstance(answer, bytes) else int(answer)
        if code == HELD:
            self.held += 1
        elif code == FOREIGN:
            self.foreign += 1
        else:
            self.absent += 1
            if node is not None:
                self.lacking.append(node)

    @property
    def confirmed(self) -> bool:
        """A majority held our value."""
        return self.held >= self.quorum

    @property
    def lost(self) -> bool:
        """Fewer than a majority can still hold our value, even among silent nodes."""
        return self.held + self.unreachable < self.quorum

    def unavailable(self, message: str, key: str) -> QuorumUnavailable:
        """:class:`QuorumUnavailable` for ``key``: ``message``, and who answered."""
        answered = self.nodes - self.unreachable
        return QuorumUnavailable(
            message, key=key, answered=answered, needed=self.quorum, failures=self.failures
        )

    def describe(self) -> str:
        """What happened, in words: ``gone from 2 nodes (expired or deleted), ...``."""
        parts = []
        gone = self.absent
        if gone:
            parts.append(f"gone from {_nodes(gone)} (expired, deleted, or the node lost its data)")
        if self.foreign:
            parts.append(f"taken over by another owner on {_nodes(self.foreign)}")
        if self.unreachable:
            parts.append(f"{_nodes(self.unreachable)} unreachable")
        held = f"{self.held} of {self.nodes} nodes held it ({self.quorum} needed)"
        return f"{held}: {', '.join(parts)}" if parts else held


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


# -- when a fan-out may stop waiting (``fan_out(enough=...)``): a paused node then costs nothing

Decided = Callable[[Sequence[NodeResult | None]], bool]


def acquire_decided(quorum: int, nodes: int) -> Decided:
    """A majority granted, or so many answered "busy" that a majority cannot grant."""

    def decided(results: Sequence[NodeResult | None]) -> bool:
        granted = busy = 0
        for result in results:
            if result is None:
                continue
            answer = reply(result)
            if not failed(answer):
                if int(answer[0]):
                    granted += 1
                else:
                    busy += 1
        return granted >= quorum or busy > nodes - quorum

    return decided


def majority_held(quorum: int) -> Decided:
    """A majority answered that they held our value (extend, release)."""

    def decided(results: Sequence[NodeResult | None]) -> bool:
        held = 0
        for result in results:
            if result:  # None: not yet; []: not asked
                answer = reply(result)
                held += not failed(answer) and answer == HELD
        return held >= quorum

    return decided


def majority_at_least(quorum: int, token: int) -> Decided:
    """A majority answered a fencing bucket value of at least ``token``."""

    def decided(results: Sequence[NodeResult | None]) -> bool:
        recorded = 0
        for result in results:
            if result:
                answer = reply(result)
                recorded += not failed(answer) and int(answer) >= token
        return recorded >= quorum

    return decided
