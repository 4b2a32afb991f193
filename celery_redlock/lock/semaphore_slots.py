"""One semaphore's slots on the nodes: the script calls, one acquisition attempt, and its rules.

:class:`Slots` makes the calls (``scripts/semaphore_*.lua``); the rules that decide an attempt
(:func:`agreed`, :func:`target`, :func:`decided`) are plain functions.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import _clock
from .._clock import to_ms
from .._layout import LockValue, SemaphoreKeys
from .._scripts import load
from ..errors import ConfigurationError
from ..transport.nodes import Call, NodeResult, fan_out
from .lease import LockNodes, Outcome
from .quorum import Decided, Tally, failed, majority_held, reply

__all__ = [
    "ACQUIRE",
    "MAX_LIMIT",
    "RELEASE",
    "RELEASE_OWNER",
    "RENEW",
    "Answers",
    "Attempt",
    "Slots",
    "agreed",
    "check_limit",
    "decided",
    "target",
]

logger = logging.getLogger("celery_redlock.semaphore")

ACQUIRE = load("semaphore_acquire")
RELEASE = load("semaphore_release")
RENEW = load("semaphore_renew")
RELEASE_OWNER = load("semaphore_release_owner")

#: Largest limit (the scripts refuse more).
MAX_LIMIT = 100000
#: A queue entry lapses unless renewed within this many retry delays (at least a second),
#: so a dead waiter stops holding others back.
_WAIT_DELAYS = 5
_MIN_WAIT = 1.0


def check_limit(limit: object, option: str = "limit") -> int:
    """``limit`` as a whole number of slots from 1 to :data:`MAX_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(
            option, f"expected a whole number of slots from 1 to {MAX_LIMIT}, got {limit!r}"
        )
    return limit


@dataclass
class Attempt(Outcome):
    """What one acquire attempt found, and, when it succeeded, what it holds."""

    ticket: int = 0
    value: str = ""
    slot: int = -1
    #: Nodes whose grant is not known (no answer read): they may hold another slot.
    unsure: frozenset[int] = frozenset()


@dataclass
class Answers:
    """Per node index: the slot granted, the free slots it reported, or silence."""

    grants: dict[int, int] = field(default_factory=dict)
    free: dict[int, list[int]] = field(default_factory=dict)
    silent: set[int] = field(default_factory=set)


class Slots:
    """The calls one semaphore makes to its Redlock's nodes."""

    def __init__(
        self, redlock: LockNodes, name: str, keys: SemaphoreKeys, limit: int, ttl: float
    ) -> None:
        self.redlock = redlock
        self.name = name
        self.keys = keys
        self.limit = limit
        self.ttl = ttl
        self.wait_ms = to_ms(max(_MIN_WAIT, _WAIT_DELAYS * redlock.retry_delay))

    def acquire_call(self, value: str, want: int, waiter: str, ticket: int | None) -> Call:
        """``semaphore_acquire.lua``: ``want`` -1 for the lowest free slot."""
        ticket_text = "" if ticket is None else str(ticket)
        args = (value, to_ms(self.ttl), self.limit, want, waiter, ticket_text, self.wait_ms)
        return Call(ACQUIRE, self.keys.all, args)

    def release_call(
        self, slot: int, value: str, *, notify: bool = False, waiter: str = ""
    ) -> Call:
        """``semaphore_release.lua``: slot -1 for whichever slot holds ``value``."""
        channel = self.keys.released if notify else ""
        return Call(RELEASE, self.keys.all, (slot, value, channel, waiter), late_ok=True)

    # -- acquire ---------------------------------------------------------------------

    def attempt(self, owner: str | None, waiter: str, ticket: int | None) -> Attempt:
        """One try on every node (two when they disagree); undone unless it succeeded."""
        redlock = self.redlock
        nodes = redlock.nodes
        value = LockValue.compose(secrets.token_hex(16), owner)
        call = self.acquire_call(value, -1, waiter, ticket)
        started = _clock.monotonic()
        results = fan_out(
            nodes,
            [[call]] * len(nodes),
            redlock.node_timeout,
            enough=decided(redlock.quorum, len(nodes)),
        )
        outcome = Attempt(value=value, started=started)
        answers = Answers()
        pttls: list[int] = []
        tickets: list[int] = []
        for index, result in enumerate(results):
            answer = reply(result)
            if failed(answer):
                outcome.failures[nodes[index].name] = answer
                answers.silent.add(index)
                continue
            outcome.answered += 1
            slot, retry_ms, node_ticket, free = answer
            tickets.append(int(node_ticket))
            if int(slot) >= 0:
                answers.grants[index] = int(slot)
            elif int(retry_ms) >= 0:
                pttls.append(max(int(retry_ms), 1))
            answers.free[index] = [int(number) for number in free]
        outcome.granted = len(answers.grants)
        if tickets:
            outcome.ticket = max(tickets)

        chosen = agreed(answers, redlock.quorum)
        if chosen is None and answers.grants:
            settle_on = target(answers, redlock.quorum)
            if settle_on is not None:
                chosen = self.second_round(
                    value, waiter, ticket or outcome.ticket, answers, settle_on
                )
        if chosen is not None:
            left = _clock.validity(self.ttl, started, _clock.monotonic(), redlock.drift_factor)
            if left > 0:
                outcome.acquired, outcome.slot = True, chosen
                outcome.unsure = frozenset(answers.silent)
                self.tidy(value, chosen, waiter, answers)
                logger.debug(
                    "acquired slot %d of %s on %d/%d nodes",
                    chosen,
                    self.name,
                    sum(slot == chosen for slot in answers.grants.values()),
                    len(nodes),
                )
                return outcome
        self.tidy(value, None, "", answers)
        if pttls:
            outcome.retry_hint = min(pttls) / 1000.0
        return outcome

    def second_round(
        self, value: str, waiter: str, ticket: int, answers: Answers, slot: int
    ) -> int | None:
        """The nodes granted different slots: ask for ``slot`` by number where it is free."""
        redlock = self.redlock
        calls: list[list[Call]] = [[] for _ in redlock.nodes]
        for index, free in answers.free.items():
            held = answers.grants.get(index)
            if held != slot and slot in free:
                moves: list[Call] = []
                if held is not None:
                    moves.append(self.release_call(held, value))
                moves.append(self.acquire_call(value, slot, waiter, ticket or None))
                calls[index] = moves
        results = fan_out(redlock.nodes, calls, redlock.node_timeout)
        for index, result in enumerate(results):
            if not calls[index]:
                continue
            answer = reply(result, len(calls[index]) - 1)
            if failed(answer):
                answers.grants.pop(index, None)
                answers.silent.add(index)
            elif int(answer[0]) == slot:
                answers.grants[index] = slot
            else:
                answers.grants.pop(index, None)
        held_on = sum(granted == slot for granted in answers.grants.values())
        logger.debug(
            "semaphore %s: nodes disagreed; slot %d held on %d after a second round",
            self.name,
            slot,
            held_on,
        )
        return slot if held_on >= redlock.quorum else None

    def tidy(self, value: str, kept: int | None, waiter: str, answers: Answers) -> None:
        """Give up every grant but slot ``kept``; leave the queue where ``waiter`` waits."""
        nodes = self.redlock.nodes
        calls: list[list[Call]] = [[] for _ in nodes]
        for index in range(len(nodes)):
            held = answers.grants.get(index)
            if held is not None and held != kept:
                calls[index] = [self.release_call(held, value, waiter=waiter)]
            elif index in answers.silent and kept is None:
                # It may have granted late. After a success, such a stray grant lies on a
                # minority and expires; undoing it would cost a trip to a node likely down.
                calls[index] = [self.release_call(-1, value)]
            elif held is None and waiter and index not in answers.silent:
                calls[index] = [self.release_call(-1, "", waiter=waiter)]
        if any(calls):
            fan_out(nodes, calls, self.redlock.node_timeout)

    def leave(self, waiter: str) -> None:
        """Leave the queue on every node (a waiter that gave up)."""
        nodes = self.redlock.nodes
        call = self.release_call(-1, "", waiter=waiter)
        fan_out(nodes, [[call]] * len(nodes), self.redlock.node_timeout)

    # -- held slots --------------------------------------------------------------------

    def extend(self, slot: int, value: str, ttl: float) -> Tally:
        """Reset a held slot's ttl where held; count the answers (a free slot: ``lacking``)."""
        redlock = self.redlock
        keys = (self.keys.holders, self.keys.expiry)
        call = Call(RENEW, keys, (to_ms(ttl), "0", slot, value))
        results = fan_out(
            redlock.nodes,
            [[call]] * len(redlock.nodes),
            redlock.node_timeout,
            enough=_renewed_on(redlock.quorum),
        )
        tally = Tally(nodes=len(redlock.nodes), quorum=redlock.quorum)
        for index, (node, result) in enumerate(zip(redlock.nodes, results, strict=True)):
            answer = reply(result)
            if failed(answer):
                tally.unreachable += 1
                tally.failures[node.name] = answer
            else:
                tally.count(answer, node=index)
        return tally

    def release(self, slot: int, value: str, unsure: frozenset[int] = frozenset()) -> Tally:
        """Give a held slot up on every node and wake the waiters.

        On the ``unsure`` nodes (their grant was never read), a second call in the same pipeline
        then frees every slot still holding ``value``: a node that ran the acquire late may have
        granted another number. Only the first call's answer counts toward the outcome.
        """
        redlock = self.redlock
        call = self.release_call(slot, value, notify=True)
        alone, swept = [call], [call, self.release_call(-1, value)]
        results = fan_out(
            redlock.nodes,
            [swept if index in unsure else alone for index in range(len(redlock.nodes))],
            redlock.node_timeout,
            enough=majority_held(redlock.quorum),
        )
        return Tally.of(redlock.nodes, results, redlock.quorum)


# -- the rules -----------------------------------------------------------------------


def decided(quorum: int, nodes: int) -> Decided:
    """A majority granted one slot number, or so many refused that none can be."""

    def decide(results: Sequence[NodeResult | None]) -> bool:
        by_slot: dict[int, int] = {}
        refused = 0
        for result in results:
            if result is None:
                continue
            answer = reply(result)
            if failed(answer):
                continue
            slot = int(answer[0])
            if slot < 0:
                refused += 1
            else:
                by_slot[slot] = by_slot.get(slot, 0) + 1
                if by_slot[slot] >= quorum:
                    return True
        return refused > nodes - quorum

    return decide


def agreed(answers: Answers, quorum: int) -> int | None:
    """The slot number a majority granted, if any."""
    counts: dict[int, int] = {}
    for slot in answers.grants.values():
        counts[slot] = counts.get(slot, 0) + 1
        if counts[slot] >= quorum:
            return slot
    return None


def target(answers: Answers, quorum: int) -> int | None:
    """The slot to settle on when none has a majority: most supported, lowest among equals.

    A node supports the slot it granted us and those it could (its free slots); a majority
    must support the winner.
    """
    support: dict[int, int] = {}
    for index, free in answers.free.items():
        granted = answers.grants.get(index)
        for slot in {*free, *(() if granted is None else (granted,))}:
            support[slot] = support.get(slot, 0) + 1
    candidates = [slot for slot, count in support.items() if count >= quorum]
    if not candidates:
        return None
    return min(candidates, key=lambda slot: (-support[slot], slot))


def _renewed_on(quorum: int) -> Decided:
    """A majority answered that they held the slot (``semaphore_renew.lua``'s "1")."""

    def decide(results: Sequence[NodeResult | None]) -> bool:
        held = 0
        for result in results:
            if result:
                answer = reply(result)
                held += not failed(answer) and answer == b"1"
        return held >= quorum

    return decide
