"""The fan-out: every node asked at once, one deadline, no thread of its own.

:func:`fan_out` queues each node's commands on that node's shared
:class:`~.connection.Link` and waits for the replies. All the links of the
process are read by one caller at a time, the *leader*: whichever caller is
waiting first polls every link with one ``poll`` call (an epoll waited
for cooperatively under eventlet, which removes ``poll``), parses what comes in
and hands each reply to the caller it belongs to; the others sleep on an
event until their replies are in or their deadline passes. When the leader's
own replies are in, it hands the role to a waiting caller and returns. A
lone caller is always its own leader, so a single thread costs one ``send``
per node, one ``poll`` and one ``recv`` per reply, and no thread switch.

A caller may return before a node's commands have even left the process:
the outcome was decided while that node's link was still connecting (a
node restarting, a first call) or its socket buffer was full. Then, with no
other caller waiting, the *flusher* thread (started on first need, one per
process) leads in its place until every link has written what was queued,
or for one node timeout: a lock taken by a majority reaches the other nodes
too, even in a process that makes no further call (but does not exit at
once: the flusher is a daemon thread). It is not done for a node already
suspect when the call was queued, whose connection would hold every
caller's turn. The flusher writes; it does not wait for the replies, which
the next caller reads.

A late command runs on a node that lost its script cache too: each
connection sends a script's source (``EVAL``) with the first call that uses
it, and names it by SHA (``EVALSHA``) after that, the FIFO keeping those
behind the ``EVAL``; a node restarted empty (or new) is always reached over
a new connection. Only a ``SCRIPT FLUSH`` on a connection still open makes
its calls fail with ``NOSCRIPT``: a part still waited for sends them again
with their source; once nobody waits, only releases are sent again (by the
next caller, who reads the error), since an acquisition or extension sent
again could land after the undo queued behind it. The next call to use such
a script sends its source again.

So any number of callers (threads, gevent greenlets) share one connection
per node, plus one more for large batches (a renewal of thousands of locks
never queues an acquisition behind it). Connects, TLS handshakes and logins
are part of the same poll, so they overlap across nodes: one fan-out waits
at most about one node timeout, whatever the number of slow nodes.

Two things keep a slow node from costing every operation:

* ``enough``: the caller's outcome may be decided before every node has
  answered (a majority granted); the fan-out returns at once, and the nodes
  it did not wait for are reported as :class:`NotWaitedFor`;
* *suspect* nodes: a node that left a command unanswered past its deadline
  is waited for only a tenth of the node timeout, and not at all once an
  outcome is decided, until a reply from it arrives. Its commands
  are still queued on its connection, behind the unanswered ones, so they run
  in the order they were sent if it comes back (an undo never overtakes the
  write it undoes).
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
) -> list[NodeResult]:
    """Run ``calls[i]`` on ``nodes[i]``, all nodes concurrently, for at most ``timeout``.

    Every node's commands are written before any reply is read; one node's
    several calls travel as one pipeline (a batch gets ``timeout`` plus
    :data:`~.operation.PER_CALL_ALLOWANCE` per extra call). A node that has not answered
    in time is reported as a :class:`NodeFailure`; its late replies are read
    and dropped, never taken for the answer to a later command. Each
    connection sends a script's source (EVAL) with its first call of it and
    EVALSHA afterwards; a script missing from the node's cache all the same
    (``SCRIPT FLUSH``) is sent again with EVAL, with the same allowance. A
    ``ResponseError`` (``WRONGTYPE``,
    ``OOM``, ``READONLY``…) is returned in place of that call's reply, and
    so is a :class:`~.commands.WrongReply` for a reply of the wrong shape
    (:func:`~.commands.checked`), before ``enough`` or the caller sees it.

    Args:
        nodes: the nodes to ask.
        calls: ``calls[i]`` for ``nodes[i]``; an empty list leaves that node out.
        timeout: the node timeout, seconds.
        enough: called with the results so far (``None`` for a node still
            awaited) each time a node's result comes in; once it returns
            True the fan-out returns, reporting the nodes it did not wait
            for as :class:`NotWaitedFor`.
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
            _queue(the_hub, op, part, payload, now)
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
        # Every part is done: drop them, so that no cycle (op -> part -> op)
        # is left for the garbage collector (its full passes stall a busy
        # process for tens of milliseconds). A late reply still reaches its
        # part through the link, and the part no longer needs the op.
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
            # A node already known to be slow is not flushed for: its
            # connection would hold every caller's turn at each call.
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


def _queue(the_hub: hub.Hub, op: Op, part: Part, payload: Payload, now: float) -> None:
    node, node_calls = part.node, part.calls
    link = node.link(bulk=len(node_calls) > BULK_CALLS)
    data = payload.data
    first_use = payload.loads
    sent = link.scripts
    for sha in payload.needs:
        if sha not in sent:
            # A script this connection has not sent: its source goes with its
            # first call (a node restarted empty is always reached over a new
            # connection, and may answer after the caller stopped waiting).
            data, first_use = payload.for_link(sent), True
            break
    allowance = op.allowance(len(node_calls))
    if node.suspect:
        part.lagging = True
        # Asked, but waited for only a moment, and not at all once the
        # caller's outcome is decided (see Op.decide): a node still paused
        # costs next to nothing, and one just back answers within the moment,
        # so an outcome that needs it (two of three nodes back from a pause)
        # still gets its answer.
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
