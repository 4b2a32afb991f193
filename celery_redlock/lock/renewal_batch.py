"""Renewal of many held locks and slots at once: one pipelined round trip per node.

Each lease supplies its part of a script call and applies its own outcome
(:class:`~.renewal.Renewable`); this module only batches the calls and
counts the nodes' answers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .. import _clock
from .._scripts import LuaScript
from ..transport.nodes import Call, Command, fan_out
from .held_lease import Renewable
from .lease import LockNodes
from .quorum import BUSY, LOST, Tally, failed, reply

__all__ = ["renew"]

logger = logging.getLogger("celery_redlock.lock")

#: Locks per renew.lua call: each call stays well under a millisecond on a node.
_RENEW_CHUNK = 200
#: Seconds a node gets to renew each lock of a batch, beyond the node timeout
#: (a node renews about a lock per 2 µs; ten times that leaves room for load).
_RENEW_ALLOWANCE = 20e-6


def _load(scripts: Sequence[Call]) -> list[Call | Command]:
    """``SCRIPT LOAD`` of each script of ``scripts``: put at the head of their pipeline."""
    loaded = {call.script.sha: call.script for call in scripts}
    return [Command(("SCRIPT", "LOAD", s.source.decode()), loads=s.sha) for s in loaded.values()]


def renew(redlock: LockNodes, leases: Sequence[Renewable]) -> list[str]:
    """Extend many held locks and slots of ``redlock`` at once: one pipelined round trip per node.

    Each is renewed to its own ttl, with the rules of :meth:`Lock.extend` (a
    node that answers and lacks a valid lock's key gets it back), except that
    a lock is not given up while its validity lasts merely because too few
    nodes *answered*. Returns, per lease, ``RENEWED``; ``LOST`` (expired, or
    fewer than a majority can still hold it: it has been given up, and its
    ``lost_reason`` says why); ``UNREACHABLE`` (too few nodes answered, still
    valid: try again soon); or ``BUSY`` (another thread is extending or
    releasing it right now).

    Leases go to the nodes a few hundred per script call (``renew.lua``;
    semaphore slots, ``semaphore_renew.lua``), all calls in one pipeline per
    node, led by a ``SCRIPT LOAD`` so that a node that lost its script cache
    (a restart, ``SCRIPT FLUSH``) needs no second round trip.
    """
    outcomes = [BUSY] * len(leases)
    taken: list[int] = []
    groups: dict[tuple[LuaScript, int, str], list[int]] = {}
    try:
        now = _clock.monotonic()
        for position, lease in enumerate(leases):
            if position % _clock.PAUSE_EVERY == _clock.PAUSE_EVERY - 1:
                _clock.pause()  # thousands of locks: let the others run
            outcome = lease.start_renewal(now)
            if outcome != BUSY:
                taken.append(position)
            if outcome is None:
                key = (lease.renew_script, _clock.to_ms(lease.ttl), lease.renew_place)
                groups.setdefault(key, []).append(position)
            else:
                outcomes[position] = outcome
        calls: list[Call] = []
        chunks: list[tuple[list[int], float]] = []
        for (script, ttl_ms, place), positions in groups.items():
            for first in range(0, len(positions), _RENEW_CHUNK):
                _clock.pause()
                chunk = positions[first : first + _RENEW_CHUNK]
                keys: list[str] = []
                args: list[str | int] = [ttl_ms, place]
                for position in chunk:
                    lease_keys, lease_args = leases[position].renew_part()
                    keys += lease_keys
                    args += lease_args
                calls.append(Call(script, tuple(keys), tuple(args)))
                chunks.append((chunk, ttl_ms / 1000.0))
        if chunks:
            pipeline = _load(calls)
            # Thousands of locks take the nodes a while to run: allow for it.
            timeout = redlock.node_timeout + _RENEW_ALLOWANCE * (len(leases) - 1)
            started = _clock.monotonic()
            results = fan_out(redlock.nodes, [[*pipeline, *calls]] * len(redlock.nodes), timeout)
            finished = _clock.monotonic()
            placed = 0
            for slot, (chunk, ttl) in enumerate(chunks, start=len(pipeline)):
                _clock.pause()
                answers = [reply(result, slot) for result in results]
                placed += _settle(redlock, leases, chunk, answers, ttl, started, finished, outcomes)
            if placed:
                logger.info("renewal placed %d lock key(s) again on nodes that lacked them", placed)
        lost = [leases[p] for p in taken if outcomes[p] == LOST and leases[p].value is not None]
        _give_up(redlock, lost)
    finally:
        for position in taken:
            leases[position].end_renewal()
    return outcomes


def _settle(
    redlock: LockNodes,
    leases: Sequence[Renewable],
    positions: Sequence[int],
    answers: Sequence[Any],
    ttl: float,
    started: float,
    finished: float,
    outcomes: list[str],
) -> int:
    """Decide the outcome of each lease of one script call; return keys placed."""
    failures = {
        node.name: answer
        for node, answer in zip(redlock.nodes, answers, strict=True)
        if failed(answer)
    }
    answered = [answer for answer in answers if not failed(answer)]
    remaining = _clock.validity(ttl, started, finished, redlock.drift_factor)
    valid_until = started + ttl - _clock.drift(ttl, redlock.drift_factor)
    now = _clock.monotonic()
    everywhere = b"1" * len(positions)
    same = all(answer == everywhere for answer in answered)
    nodes, quorum = len(redlock.nodes), redlock.quorum
    shared = Tally(nodes, quorum, held=len(answered), unreachable=len(failures), failures=failures)
    placed = 0
    for offset, position in enumerate(positions):
        if same:
            tally = shared  # the usual case: every node that answered holds every lock
        else:
            tally = Tally(nodes, quorum, unreachable=len(failures), failures=failures)
            for answer in answered:
                tally.count(answer[offset : offset + 1])
            placed += tally.placed
        outcomes[position] = leases[position].apply_renewal(tally, remaining, valid_until, now)
    return placed


def _give_up(redlock: LockNodes, leases: Sequence[Renewable]) -> None:
    """Forget ``leases`` and delete them wherever they are still theirs: one round trip."""
    calls = [lease.give_up_call() for lease in leases]
    if calls:
        pipeline = [*_load(calls), *calls]
        fan_out(redlock.nodes, [pipeline] * len(redlock.nodes), redlock.node_timeout)
