"""Calls packed into Redis protocol once, for every node given the same calls."""

from __future__ import annotations

from collections.abc import Sequence

from .. import _clock
from .commands import Call, Command

__all__ = ["Payload", "packed"]

#: Packing a large batch lets other greenlets run after each this many bytes
#: (a few hundred small commands, or a few renewal calls of 200 locks).
_PAUSE_BYTES = 32_768


class Payload:
    """One node's commands in Redis protocol (``EVALSHA``), shared by nodes given the same calls."""

    __slots__ = ("data", "firsts", "loads", "needs", "scripts")

    def __init__(
        self,
        data: bytes,
        firsts: tuple[tuple[Call, int, int], ...],
        needs: tuple[str, ...],
        scripts: tuple[str, ...],
    ) -> None:
        self.data = data
        #: The first call of each script not loaded ahead of it (``SCRIPT LOAD``), with its span.
        self.firsts = firsts
        #: Their SHA1s: a link that has not sent them all gets :meth:`for_link`.
        self.needs = needs
        #: Every script the link has sent once these bytes are queued.
        self.scripts = scripts
        #: Whether the payload loads some script itself.
        self.loads = len(scripts) > len(needs)

    def for_link(self, sent: set[str]) -> bytes:
        """The bytes for a link that has sent ``sent``: the first call of each other one an EVAL."""
        view = memoryview(self.data)
        pieces: list[bytes | memoryview] = []
        done = 0
        for call, start, end in self.firsts:
            if call.script.sha not in sent:
                pieces += (view[done:start], call.packed(by_sha=False))
                done = end
        pieces.append(view[done:])
        return b"".join(pieces)


def _one(call: Call | Command) -> Payload:
    """The payload of a single call."""
    data = call.packed()
    if isinstance(call, Call):
        needs = (call.script.sha,)
        return Payload(data, ((call, 0, len(data)),), needs, needs)
    return Payload(data, (), (), () if call.loads is None else (call.loads,))


def packed(calls: Sequence[Sequence[Call | Command]], skip: set[int]) -> list[tuple[int, Payload]]:
    """Each socket node's payload (but those in ``skip``); each call and each list packed once."""
    singles: dict[int, Payload] = {}
    lists: dict[int, Payload] = {}
    payloads = []
    for index, node_calls in enumerate(calls):
        if not node_calls or index in skip:
            continue
        if len(node_calls) == 1:
            call = node_calls[0]
            payload = singles.get(id(call))
            if payload is None:
                payload = singles[id(call)] = _one(call)
        else:
            payload = lists.get(id(node_calls))
            if payload is None:
                payload = lists[id(node_calls)] = _many(node_calls)
        payloads.append((index, payload))
    return payloads


def _many(calls: Sequence[Call | Command]) -> Payload:
    """The payload of a pipeline of calls, the same call packed once."""
    packed: dict[int, bytes] = {}
    parts = []
    firsts: list[tuple[Call, int, int]] = []
    seen: dict[str, None] = {}
    offset = size = 0
    for call in calls:
        data = packed.get(id(call))
        if data is None:
            data = packed[id(call)] = call.packed()
            size += len(data)
            if size >= _PAUSE_BYTES:
                size = 0
                _clock.pause()  # a large batch: let other greenlets run
        end = offset + len(data)
        if isinstance(call, Call):
            if call.script.sha not in seen:
                seen[call.script.sha] = None
                firsts.append((call, offset, end))
        elif call.loads is not None:
            seen[call.loads] = None
        offset = end
        parts.append(data)
    return Payload(
        b"".join(parts),
        tuple(firsts),
        tuple(call.script.sha for call, _, _ in firsts),
        tuple(seen),
    )
