"""One attempt to take a lock on every node, and the fencing token it settles.

:func:`attempt` asks and decides; the :class:`~celery_redlock.Lock` holds, or undoes a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import _clock
from .._clock import to_ms
from .._layout import LockKeys
from .._scripts import load
from ..transport.nodes import Call, fan_out
from .fencing import ahead_us, token_for
from .lease import LockNodes, Outcome
from .quorum import acquire_decided, failed, majority_at_least, reply

__all__ = ["Attempt", "attempt"]

_ACQUIRE = load("acquire")
_FENCE_RAISE = load("fence_raise")


@dataclass
class Attempt(Outcome):
    """What one acquire attempt found, and, when it succeeded, what it holds."""

    token: int = 0
    #: Whether the token was settled in the acquire's own round trip.
    settled: bool = True
    #: Nodes where the value may be set after a failed attempt: to undo there.
    undo: set[int] = field(default_factory=set)


def attempt(redlock: LockNodes, keys: LockKeys, value: str, ttl: float, replaces: str) -> Attempt:
    """One try on every node to set ``value`` for ``ttl`` s; the token may take a second round."""
    nodes = redlock.nodes
    lead = int(redlock.node_timeout * 1e6)
    ahead = ahead_us(lead)
    proposal = redlock.fence_clock.propose(lead)
    fence = f"{proposal} {ahead}"
    args = (value, to_ms(ttl), to_ms(redlock.fence_ttl), replaces, fence)
    call = Call(_ACQUIRE, (keys.lock, keys.fence), args)
    started = _clock.monotonic()
    decided = acquire_decided(redlock.quorum, len(nodes))
    results = fan_out(nodes, [[call]] * len(nodes), redlock.node_timeout, enough=decided)
    received = _clock.monotonic()

    outcome = Attempt(started=started)
    granted: set[int] = set()
    silent: set[int] = set()
    highest_fence = 0  # over every node that answered, granting or not
    latest_time = 0
    recorded = 0  # granting nodes that recorded the proposal
    pttls: list[int] = []
    for index, result in enumerate(results):
        answer = reply(result)
        if failed(answer):
            outcome.failures[nodes[index].name] = answer
            silent.add(index)
            continue
        outcome.answered += 1
        if answer[1] > highest_fence:
            highest_fence = answer[1]
        if answer[2] > latest_time:
            latest_time = answer[2]
        if answer[0]:
            granted.add(index)
            recorded += answer[1] < proposal <= answer[2] + ahead
        elif answer[3] >= 0:
            # 0 means "expires within the millisecond": retry at once.
            pttls.append(max(answer[3], 1))
    if latest_time:
        redlock.fence_clock.observe(latest_time, received)
    outcome.granted = len(granted)

    if len(granted) >= redlock.quorum:
        token, outcome.settled = token_for(
            proposal, highest_fence, recorded, redlock.quorum, latest_time + ahead
        )
        if not outcome.settled and not _record_token(redlock, keys, token, outcome):
            token = 0
        remaining = _clock.validity(ttl, started, _clock.monotonic(), redlock.drift_factor)
        if token and remaining > 0:
            redlock.fence_clock.issued(token)
            outcome.acquired, outcome.token = True, token
            return outcome

    # Undo where it was set and where no answer came (a timed-out node may set it late);
    # a node that answered "busy" cannot hold it.
    outcome.undo = silent.union(granted)
    if pttls:
        outcome.retry_hint = min(pttls) / 1000.0
    return outcome


def _record_token(redlock: LockNodes, keys: LockKeys, token: int, outcome: Attempt) -> bool:
    """Raise every node's bucket to ``token``; True once a majority holds it.

    Too few answers update ``outcome``, so the attempt counts as one without a quorum.
    """
    call = Call(_FENCE_RAISE, (keys.fence,), (str(token), to_ms(redlock.fence_ttl)))
    results = fan_out(
        redlock.nodes,
        [[call]] * len(redlock.nodes),
        redlock.node_timeout,
        enough=majority_at_least(redlock.quorum, token),
    )
    answered = recorded = 0
    for node, result in zip(redlock.nodes, results, strict=True):
        answer = reply(result)
        if failed(answer):
            outcome.failures[node.name] = answer
            continue
        answered += 1
        recorded += int(answer) >= token
    outcome.answered = min(outcome.answered, answered)
    return recorded >= redlock.quorum
