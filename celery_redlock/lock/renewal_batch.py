"""Renewal of many held locks and slots at once: one pipelined round trip per node.

Missing copies are written by a second call (:func:`place`), only after a majority confirmed:
a lock freed everywhere while a killed process still renews is never written back
(docs/reliability.md, "Renewal restores missing copies").
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from .. import _clock
from .._scripts import LuaScript
from ..transport.nodes import Call, Command, fan_out
from .held_lease import Renewable
from .lease import LockNodes
from .quorum import BUSY, LOST, RENEWED, Tally, failed, reply

__all__ = ["place", "renew"]

logger = logging.getLogger("celery_redlock.lock")

#: Locks per renew.lua call: each call stays well under a millisecond on a node.
_RENEW_CHUNK = 200
#: Seconds per lock of a batch beyond the node timeout (ten times a node's 2 µs per lock).
_RENEW_ALLOWANCE = 20e-6
#: Leases given up per round trip: a few milliseconds of a node's time.
_GIVE_UP_CHUNK = 1000


def _load(scripts: Sequence[Call]) -> list[Call | Command]:
    """``SCRIPT LOAD`` of each script of ``scripts``: put at the head of their pipeline."""
    loaded = {call.script.sha: call.script for call in scripts}
    return [Command(("SCRIPT", "LOAD", s.source.decode()), loads=s.sha) for s in loaded.values()]


def renew(redlock: LockNodes, leases: Sequence[Renewable]) -> list[str]:
    """Extend many held locks and slots of ``redlock`` at once: one pipelined round trip per node.

    The rules of :meth:`Lock.extend`, except that too few answers keep a valid lease. Returns
    per lease ``RENEWED``, ``LOST`` (given up; see its ``lost_reason``), ``UNREACHABLE`` (retry
    soon) or ``BUSY`` (another thread is extending or releasing it). The pipeline starts with
    ``SCRIPT LOAD``, so a node that lost its scripts needs no second round trip.
    """
    outcomes = [BUSY] * len(leases)
    taken: list[int] = []
    groups: dict[tuple[LuaScript, int], list[int]] = {}
    try:
        now = _clock.monotonic()
        for position, lease in enumerate(leases):
            if position % _clock.PAUSE_EVERY == _clock.PAUSE_EVERY - 1:
                _clock.pause()  # thousands of locks: let the others run
            outcome = lease.start_renewal(now)
            if outcome != BUSY:
                taken.append(position)
            if outcome is None:
                key = (lease.renew_script, _clock.to_ms(lease.ttl))
                groups.setdefault(key, []).append(position)
            else:
                outcomes[position] = outcome
        calls, chunks = _calls(leases, groups, "0")
        if chunks:
            pipeline = _load(calls)
            # Thousands of locks take the nodes a while to run: allow for it.
            timeout = redlock.node_timeout + _RENEW_ALLOWANCE * (len(leases) - 1)
            started = _clock.monotonic()
            results = fan_out(redlock.nodes, [[*pipeline, *calls]] * len(redlock.nodes), timeout)
            finished = _clock.monotonic()
            lacking: dict[int, tuple[int, list[int]]] = {}
            for slot, (chunk, ttl_ms) in enumerate(chunks, start=len(pipeline)):
                _clock.pause()
                answers = [reply(result, slot) for result in results]
                _settle(
                    redlock, leases, chunk, answers, ttl_ms, started, finished, outcomes, lacking
                )
            # Placed while each lease is still held: a release waits for it.
            renewed = [
                (leases[p], ttl_ms, on)
                for p, (ttl_ms, on) in lacking.items()
                if outcomes[p] == RENEWED
            ]
            placed = place(redlock, renewed)
            if placed:
                logger.info("renewal placed %d lock key(s) again on nodes that lacked them", placed)
        lost = [leases[p] for p in taken if outcomes[p] == LOST and leases[p].value is not None]
        _give_up(redlock, lost)
    finally:
        _end_renewals(leases, taken)
    return outcomes


def _end_renewals(leases: Sequence[Renewable], taken: Sequence[int]) -> None:
    """End the renewal of each lease of ``taken``, pausing between chunks.

    A kill in a pause (``GreenletExit``, ``gevent.Timeout``) still ends the rest first: a lease
    left taken would answer BUSY to every later renewal, extend and release.
    """
    every = _clock.PAUSE_EVERY
    for start in range(0, len(taken), every):
        if start:
            try:
                _clock.pause()
            except BaseException:
                for position in taken[start:]:
                    leases[position].end_renewal()
                raise
        for position in taken[start : start + every]:
            leases[position].end_renewal()


def place(redlock: LockNodes, renewed: Sequence[tuple[Renewable, int, Collection[int]]]) -> int:
    """Write renewed leases where they were missing: one round trip; return the copies placed.

    ``renewed``: leases a majority just confirmed, their ttl (ms), and the nodes lacking them.
    ``SET NX`` never overwrites another owner's value.
    """
    pipelines: list[list[Call | Command]] = []
    most = 0
    for index in range(len(redlock.nodes)):
        groups: dict[tuple[LuaScript, int], list[int]] = {}
        for position, (lease, ttl_ms, on) in enumerate(renewed):
            if index in on:
                groups.setdefault((lease.renew_script, ttl_ms), []).append(position)
        calls, _ = _calls([lease for lease, _, _ in renewed], groups, "1")
        pipelines.append([*_load(calls), *calls] if calls else [])
        most = max(most, sum(map(len, groups.values())))
    if not most:
        return 0
    timeout = redlock.node_timeout + _RENEW_ALLOWANCE * (most - 1)
    placed = 0
    # On the connection the leases' release will take: a later release never overtakes it.
    results = fan_out(redlock.nodes, pipelines, timeout, ordered=True)
    for pipeline, result in zip(pipelines, results, strict=True):
        for slot, call in enumerate(pipeline):
            answer = reply(result, slot)
            if isinstance(call, Call) and not failed(answer):
                placed += answer.count(b"2")
    return placed


def _calls(
    leases: Sequence[Renewable], groups: dict[tuple[LuaScript, int], list[int]], placing: str
) -> tuple[list[Call], list[tuple[list[int], int]]]:
    """The script calls for ``groups``, and for each its positions in ``leases`` and ttl (ms)."""
    calls: list[Call] = []
    chunks: list[tuple[list[int], int]] = []
    for (script, ttl_ms), positions in groups.items():
        for first in range(0, len(positions), _RENEW_CHUNK):
            _clock.pause()
            chunk = positions[first : first + _RENEW_CHUNK]
            keys: list[str] = []
            args: list[str | int] = [ttl_ms, placing]
            for position in chunk:
                lease_keys, lease_args = leases[position].renew_part()
                keys += lease_keys
                args += lease_args
            calls.append(Call(script, tuple(keys), tuple(args)))
            chunks.append((chunk, ttl_ms))
    return calls, chunks


def _settle(
    redlock: LockNodes,
    leases: Sequence[Renewable],
    positions: Sequence[int],
    answers: Sequence[Any],
    ttl_ms: int,
    started: float,
    finished: float,
    outcomes: list[str],
    lacking: dict[int, tuple[int, list[int]]],
) -> None:
    """Decide each lease of one script call; add to ``lacking`` those some node lacks."""
    ttl = ttl_ms / 1000.0
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
    for offset, position in enumerate(positions):
        if same:
            tally = shared  # the usual case: every node that answered holds every lock
        else:
            tally = Tally(nodes, quorum, unreachable=len(failures), failures=failures)
            for index, answer in enumerate(answers):
                if not failed(answer):
                    tally.count(answer[offset : offset + 1], node=index)
            if tally.lacking:
                lacking[position] = (ttl_ms, tally.lacking)
        outcomes[position] = leases[position].apply_renewal(tally, remaining, valid_until, now)


def _give_up(redlock: LockNodes, leases: Sequence[Renewable]) -> None:
    """Forget ``leases`` and delete them wherever they are still theirs.

    One round trip per :data:`_GIVE_UP_CHUNK` leases: a give-up goes behind the process's
    earlier calls on a node's interactive connection while that connection owes replies, and
    an acquire queued behind it waits for one chunk, not for thousands of deletions.
    """
    calls = [lease.give_up_call() for lease in leases]
    nodes = redlock.nodes
    for first in range(0, len(calls), _GIVE_UP_CHUNK):
        chunk = calls[first : first + _GIVE_UP_CHUNK]
        pipeline = [*_load(chunk), *chunk]
        # Behind each lease's own acquisition on the node, which may have run late there.
        fan_out(nodes, [pipeline] * len(nodes), redlock.node_timeout, ordered=True)
