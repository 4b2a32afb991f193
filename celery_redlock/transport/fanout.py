"""The fan-out: every node asked at once, one deadline, no thread of its own.

One caller at a time, the *leader*, polls every link of the process and hands each reply to its
caller (:mod:`.hub`); the others sleep until their replies are in or their deadline passes. A
lone caller leads itself: one ``send`` per node, one ``poll``, no thread switch.

Callers share one connection per node, plus a bulk one (a renewal of thousands of locks never
queues an acquisition behind it); connects and TLS handshakes overlap in the same poll. A slow
node costs little: the call returns once ``enough`` decides, and a *suspect* node (a command
unanswered past its deadline) is waited for a tenth of the timeout. Its commands stay queued in
order, so an undo never overtakes the write it undoes. Commands still unsent when a call
returns are written by the *flusher* thread, and a script's source goes with its first call on
each connection, so a late part also runs on a node restarted empty (docs/reliability.md,
"Slow and paused nodes").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError

from . import hub
from .commands import Call, Command, NodeFailure, NodeResult, checked
from .connection import Link, Slot
from .operation import Enough, FanOutNode, Op, Part
from .payload import Payload, packed

__all__ = ["BULK_CALLS", "fan_out"]

#: A node's batch longer than this travels on the node's bulk connection.
BULK_CALLS = 64
#: A suspect node is waited for this share of the node timeout...
SUSPECT_WAIT_SHARE = 0.1
#: ... but at least this long (seconds): long enough for a node back from a
#: pause to answer, short enough that one still paused costs next to nothing.
SUSPECT_WAIT_MIN = 0.002


def fan_out(
    nodes: Sequence[FanOutNode],
    calls: Sequence[Sequence[Call | Command]],
    timeout: float,
    *,
    enough: Enough | None = None,
    ordered: bool = False,
) -> list[NodeResult]:
    """Run ``calls[i]`` on ``nodes[i]``, all nodes concurrently, for at most ``timeout``.

    A node's calls travel as one pipeline (``timeout`` plus
    :data:`~.operation.PER_CALL_ALLOWANCE` per extra call). A node late to answer is a
    :class:`NodeFailure`. A ``ResponseError`` or :class:`~.commands.WrongReply` replaces that
    call's reply before ``enough`` sees it. A script lost to ``SCRIPT FLUSH`` is resent as EVAL.

    Args:
        nodes: the nodes to ask.
        calls: ``calls[i]`` for ``nodes[i]``; an empty list leaves that node out.
        timeout: the node timeout, seconds.
        enough: called with the results so far (``None``: awaited) as each comes in; once it
            returns True the fan-out returns, the rest reported as :class:`NotWaitedFor`.
        ordered: the calls must run after this process's earlier calls to each node (an undo
            of what an acquisition may have written late). Two connections keep no order
            between them: while a node's interactive connection still owes replies, a batch
            of any size goes behind them there; once it owes none, everything sent on it has
            run, and a large batch takes the bulk connection as usual.
    """
    op = Op(len(nodes), timeout, enough)
    elsewhere: set[int] = set()  # nodes answered without the hub
    for index, node in enumerate(nodes):
        if not calls[index]:
            continue
        if node.direct is not None:
            direct = node.run_direct(calls[index])
            op.results[index] = (
                direct if isinstance(direct, NodeFailure) else checked(calls[index], direct)
            )
            elsewhere.add(index)
        elif node.sentinel is not None:
            # Asking the Sentinels blocks: done before the hub's lock is taken.
            unplaced = node.locate()
            if unplaced is not None:
                op.results[index] = NodeFailure(node.name, unplaced)
                elsewhere.add(index)
    payloads = packed(calls, elsewhere)
    the_hub = hub.shared()
    lock = the_hub.lock
    lock.acquire()
    leading = False
    locked = True
    try:
        if not the_hub.leading:
            the_hub.leading = leading = True
            the_hub.refresh()
        now = time.monotonic()
        parts = [Part(op, index, nodes[index], calls[index]) for index, _ in payloads]
        for part in parts:
            op.add(part)  # all counted before any can settle
        for part, (_, payload) in zip(parts, payloads, strict=True):
            _queue(the_hub, op, part, payload, now, ordered)
        if op.waiting == 0:
            op.finish()
        elif enough is not None and not op.decided and _decided(op):
            op.decide()
        if not op.finished:
            if not leading:
                op.event = threading.Event()
                the_hub.followers.append(op)
                if op.next_deadline() < the_hub.poll_until:
                    the_hub.wake()  # the leader would sleep past this caller's deadline
                told = the_hub.follow(op)
                locked = told is not None
                leading = bool(told)
            if leading:
                the_hub.lead(op)
    finally:
        if locked:
            _leave(the_hub, op, leading)
        # Break the op -> part -> op cycle: the GC's full passes stall a busy process for
        # tens of milliseconds. A late reply still reaches its part through the link.
        op.parts = []
    if op.error is not None:
        raise op.error
    return [result if result is not None else [] for result in op.results]


def _leave(the_hub: hub.Hub, op: Op, leading: bool) -> None:
    """End ``op``'s part in the hub and release the lock (held on entry)."""
    try:
        if op.promoted:  # made leader while leaving: pass the role on
            op.promoted, leading = False, True
        if op.event is not None and op in the_hub.followers:
            the_hub.followers.remove(op)
        if not op.finished:
            op.finish()  # interrupted: whatever comes later is dropped
        if leading:
            # Not for a node known slow: its connection would hold every caller's turn.
            unsent = any(
                not part.lagging and part.link is not None and part.link.unsent for part in op.parts
            )
            the_hub.hand_off(flush_for=op.timeout if unsent else 0.0)
    finally:
        the_hub.lock.release()


def _decided(op: Op) -> bool:
    assert op.enough is not None
    try:
        return op.enough(op.results)
    except Exception as exc:
        op.error = exc
        return True


def _queue(
    the_hub: hub.Hub, op: Op, part: Part, payload: Payload, now: float, ordered: bool
) -> None:
    node, node_calls = part.node, part.calls
    bulk = len(node_calls) > BULK_CALLS
    if bulk and ordered:
        interactive = node.link()
        bulk = not (interactive.pending or interactive.unsent)
    link = node.link(bulk=bulk)
    data = payload.data
    first_use = payload.loads
    sent = link.scripts
    for sha in payload.needs:
        if sha not in sent:
            # Source with the first call on this connection: a node restarted empty is always
            # reached over a new one, and may answer after the caller stopped waiting.
            data, first_use = payload.for_link(sent), True
            break
    allowance = op.allowance(len(node_calls))
    if node.suspect:
        part.lagging = True
        # Waited for a moment only (not at all once decided, see Op.decide): a paused node
        # costs next to nothing, and one just back still answers an outcome that needs it.
        allowance = min(allowance, max(SUSPECT_WAIT_MIN, allowance * SUSPECT_WAIT_SHARE))
        part.graced = True
    part.deadline = now + allowance
    part.link, part.queued = link, now
    if the_hub.queue(link, data, Slot(len(node_calls), part)):
        if first_use:
            link.scripts.update(payload.scripts)
    elif not part.done:
        node.suspect = False  # refused at once: down, not slow
        op.settle(part, NodeFailure(node.name, _last_cause(link)))


def _last_cause(link: Link) -> BaseException:
    return link.last_error or RedisConnectionError("connection failed")
