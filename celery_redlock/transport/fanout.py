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

import contextlib
import logging
import math
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .commands import Call, Command, NodeFailure, NodeResult, NotWaitedFor, checked
from .connection import POLLIN, POLLOUT, Link, LinkBroken, Slot

__all__ = ["BULK_CALLS", "PER_CALL_ALLOWANCE", "Enough", "FanOutNode", "fan_out", "hub"]

logger = logging.getLogger("celery_redlock.nodes")

#: Extra seconds a node gets per command beyond the first in one batch.
PER_CALL_ALLOWANCE = 0.0001
#: A node's batch longer than this travels on the node's bulk connection.
BULK_CALLS = 64
#: A suspect node is waited for this share of the node timeout...
SUSPECT_WAIT_SHARE = 0.1
#: ... but at least this long (seconds): long enough for a node back from a
#: pause to answer, short enough that one still paused costs next to nothing.
SUSPECT_WAIT_MIN = 0.002
#: Replies parsed between two yields to other greenlets.
_CHUNK = 256
#: Packing a large batch lets other greenlets run after each this many bytes
#: (a few hundred small commands, or a few renewal calls of 200 locks).
_PAUSE_BYTES = 32_768
#: Bytes queued for a node that cannot be written before its link is closed.
_MAX_BACKLOG = 64 * 1024 * 1024
#: A bulk connection idle this long is closed.
_BULK_IDLE = 30.0
#: Once the outcome is decided, the other nodes are waited for this long more
#: (or as long again as the decision took, if longer).
_GRACE = 0.001
#: How long past its deadline a waiting caller trusts the leader to tell it.
_LEADER_GRACE = 1.0

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


class _Part:
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
        self, op: _Op, index: int, node: FanOutNode, calls: Sequence[Call | Command]
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
            # Nobody waits any more; a release the node could not run (its
            # script cache was flushed on this connection) is still sent
            # again, so the key does not outlive the release until its ttl.
            # An acquire or extend is not: an undo queued after it may
            # already have run. The connection sends the others' source
            # again with their next call.
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
                # SCRIPT FLUSH since this connection sent the source: EVAL
                # with it, on the same link, with the same allowance as the
                # first send.
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


class _Op:
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
        self.parts: list[_Part] = []
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

    def add(self, part: _Part) -> None:
        self.parts.append(part)
        self.results[part.index] = None
        self.waiting += 1

    def settle(self, part: _Part, result: NodeResult) -> None:
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
        """The outcome is known: wait only a moment more for the other nodes.

        A healthy node answers within a few hundred microseconds of the
        others, so it is still waited for (a caller that looks at every node
        right after finds them settled); a node that misses the moment, or is
        already suspect, is not waited for.
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
        self.finished = True
        for part in self.parts:
            if not part.done:
                part.done = True
                self.waiting -= 1
                self.results[part.index] = _not_waited_for(part.node.name)
        if self.event is not None:
            self.event.set()

    def expire(self, drained: float) -> None:
        """Give up on parts whose deadline had passed when the sockets were last read.

        A node that has sent no reply at all since the part was queued
        becomes suspect; one that answers, only slowly (a long queue), not.
        """
        for part in self.parts:
            if not part.done and part.deadline <= drained:
                link = part.link
                if link is None or link.last_reply < part.queued:
                    part.node.suspect = True
                self.settle(
                    part,
                    _not_waited_for(part.node.name)
                    if part.graced
                    else NodeFailure(
                        part.node.name, RedisTimeoutError("no reply within the node timeout")
                    ),
                )

    def next_deadline(self) -> float:
        return min((part.deadline for part in self.parts if not part.done), default=0.0)


class _Flush(_Op):
    """The flusher's turn as leader: until nothing queued is unsent, or ``until``."""

    def __init__(self, the_hub: _Hub, until: float) -> None:
        super().__init__(0, 0.0, None)
        self.hub = the_hub
        self.until = until
        if not the_hub.unsent():
            self.finished = True

    def expire(self, drained: float) -> None:
        if drained >= self.until or not self.hub.unsent():
            self.finish()

    def next_deadline(self) -> float:
        return self.until


def _not_waited_for(name: str) -> NotWaitedFor:
    return NotWaitedFor(
        name, RedisTimeoutError("not waited for: the outcome was decided without it")
    )


class _Hub:
    """The process's links and who is reading them right now."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leading = False
        self.polling = False
        self.followers: list[_Op] = []
        self.links: set[Link] = set()
        # Every reply that had reached a socket by this time has been read:
        # a deadline before it that is still unmet was really missed.
        self.drained = 0.0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_pending = False
        # When the leader's current poll times out at the latest.
        self.poll_until = 0.0
        self._flusher: threading.Thread | None = None
        self._flush_wanted = threading.Event()
        self._flush_until = 0.0

    # -- called with the lock held ----------------------------------------------------

    def wake(self) -> None:
        """Make the leader poll again (a link was opened or has bytes to write)."""
        if self.polling and not self._wake_pending:
            self._wake_pending = True
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")

    def close_link(self, link: Link, cause: BaseException) -> None:
        self.links.discard(link)
        link.close(cause)

    def queue(self, link: Link, payload: bytes, slot: Slot) -> bool:
        """Queue on ``link`` and write what the socket takes; False if the link broke."""
        was_open = link.open
        try:
            link.queue(payload, slot)
            if not was_open:
                self.links.add(link)
            if len(link.out) > _MAX_BACKLOG:
                raise LinkBroken(
                    RedisConnectionError("the node has not read what was sent to it; giving up")
                )
            link.flush()
        except LinkBroken as broken:
            self.close_link(link, broken.cause)
            return False
        if not was_open or link.events() & POLLOUT:
            self.wake()
        return True

    def handle(self, ready: list[tuple[int, int]], links: dict[int, Link]) -> None:
        """React to what ``poll`` reported. May yield, releasing the lock for a moment."""
        for fd, events in ready:
            if fd == self._wake_r:
                self._drain_wake()
                continue
            link = links.get(fd)
            if link is None or link.fd != fd:
                continue  # closed (and its number maybe reused) since the poll
            try:
                if link.connecting:
                    link.on_writable()
                elif events & POLLOUT:
                    link.flush()
                if link.open and not link.connecting and events & ~POLLOUT:
                    link.receive()
                    while link.dispatch(_CHUNK):
                        # A large batch: let other greenlets and threads run.
                        self.lock.release()
                        try:
                            time.sleep(0)
                        finally:
                            self.lock.acquire()
                        if link.fd != fd:
                            break
            except LinkBroken as broken:
                self.close_link(link, broken.cause)
            except BaseException:
                if link.dirty:
                    self.close_link(link, RedisConnectionError("interrupted mid-exchange"))
                raise

    def refresh(self) -> None:
        """Before a new leader queues: read what arrived, close stale and idle links."""
        now = time.monotonic()
        for link in list(self.links):
            if (
                link.role == "bulk"
                and not link.pending
                and not link.out
                and now - link.last_used > _BULK_IDLE
            ):
                self.close_link(link, RedisConnectionError("closed after idling"))
        watched = {link.fd: link for link in self.links if link.open and not link.connecting}
        if not watched:
            return
        poller = _poller()
        for fd in watched:
            poller.register(fd, POLLIN)
        try:
            ready = poller.poll(0)
        except OSError:
            return
        self.handle(ready, watched)

    def unsent(self) -> bool:
        """Whether some link holds commands that have not reached its socket."""
        return any(link.unsent for link in self.links)

    def hand_off(self, flush_for: float = 0.0) -> None:
        """The leader is leaving: make a waiting caller the leader, if any.

        With none, and commands still unsent, the flusher leads for up to
        ``flush_for`` seconds (0: not at all, as when the flusher leaves).
        """
        self.leading = False
        while self.followers:
            follower = self.followers.pop(0)
            if follower.finished:
                continue
            follower.promoted = True
            self.leading = True
            assert follower.event is not None
            follower.event.set()
            return
        if flush_for > 0 and self.unsent():
            self.leading = True
            self._flush_until = time.monotonic() + flush_for
            if self._flusher is None or not self._flusher.is_alive():
                self._flusher = threading.Thread(
                    target=self._flush_forever, name="celery-redlock-flush", daemon=True
                )
                self._flusher.start()
            self._flush_wanted.set()

    def _flush_forever(self) -> None:
        """The flusher thread: lead whenever :meth:`hand_off` passes it the role."""
        while True:
            self._flush_wanted.wait()
            self._flush_wanted.clear()
            with self.lock:
                op = _Flush(self, self._flush_until)
                try:
                    self.lead(op)
                except Exception:
                    # The callers whose commands these were have their
                    # outcomes; the next call meets whatever broke.
                    logger.exception("celery_redlock: sending commands after their call failed")
                finally:
                    self.hand_off()

    def _drain_wake(self) -> None:
        """Empty the wake-up pipe, which ``poll`` found readable.

        One read: :meth:`wake` writes one byte per wake-up it asks for and
        none more until this runs. (Reading until ``EAGAIN`` would block
        under eventlet, whose ``os.read`` waits for more bytes instead.)
        """
        self._wake_pending = False
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)

    def poll_set(self) -> tuple[Any, dict[int, Link]]:
        poller = _poller()
        links: dict[int, Link] = {}
        for link in self.links:
            if link.open:
                poller.register(link.fd, link.events())
                links[link.fd] = link
        poller.register(self._wake_r, POLLIN)
        return poller, links

    # -- the two roles -----------------------------------------------------------------

    def lead(self, op: _Op) -> None:
        """Poll every link until ``op`` is finished (the lock is held on entry and exit)."""
        lock = self.lock
        while True:
            if op.finished:
                return
            if any(follower.finished for follower in self.followers):
                # Told, and gone without the lock (see follow).
                self.followers = [f for f in self.followers if not f.finished]
            poller, links = self.poll_set()
            # Wake for the first deadline of any waiting caller, so as to
            # tell it once the sockets have been read past its deadline.
            first = op.next_deadline()
            for follower in self.followers:
                first = min(first, follower.next_deadline())
            wait = max(0, math.ceil((first - time.monotonic()) * 1000))
            self.poll_until = first
            self.polling = True
            lock.release()
            try:
                ready = poller.poll(wait)
                polled = time.monotonic()
            finally:
                lock.acquire()
                self.polling = False
            self.handle(ready, links)
            self.drained = polled
            op.expire(polled)
            for follower in self.followers:
                follower.expire(polled)

    def follow(self, op: _Op) -> bool | None:
        """Sleep until ``op`` is finished or this caller must lead.

        Called with the lock held. Returns True (lead) or False (finished)
        with the lock held, or None, without it, when the leader finished
        ``op``: the common case, which then costs no second wait for the
        lock the leader is likely still holding (the leader drops finished
        callers from :attr:`followers`).
        """
        event = op.event
        assert event is not None
        lock = self.lock
        while True:
            # The leader expires this op once it has read the sockets past
            # its deadline; the grace is only for a leader that cannot run.
            wait = op.next_deadline() + _LEADER_GRACE - time.monotonic()
            lock.release()
            try:
                told = event.wait(max(wait, 0.0))
            except BaseException:
                lock.acquire()
                raise
            # The event is set last thing in _Op.finish, or by hand_off after
            # setting promoted; a promoted op is never finished before it
            # wakes (only a leader reads replies, and it is the next one).
            if told and not op.promoted:
                return None
            lock.acquire()
            if op.promoted:
                op.promoted = False
                return True
            if op.next_deadline() + _LEADER_GRACE <= time.monotonic():
                op.expire(math.inf)
            if op.finished:
                return False
            event.clear()


class _GreenPoller:
    """``select.poll``'s interface where eventlet's monkey-patching removed ``poll``.

    The descriptors go to an epoll of the unpatched ``select`` module, and
    the green thread waits for that epoll's one descriptor with eventlet's
    cooperative ``select``, then reads what is ready without waiting.
    Never several descriptors to that ``select``: when two are ready at once,
    eventlet's hub calls each one's callback, the later ones after the first
    has returned from ``select``, switching back into the green thread
    wherever it waits by then (a ``GreenThread.wait()`` returned while the
    thread it waited for still ran). One poll per poller, as the hub makes
    them: the epoll is closed after it.
    """

    def __init__(self) -> None:
        from eventlet.patcher import original  # poll is gone only under eventlet

        self.epoll = original("select").epoll()

    def register(self, fd: int, events: int) -> None:
        self.epoll.register(fd, events)

    def poll(self, timeout_ms: int) -> list[tuple[int, int]]:
        with self.epoll:
            if select.select([self.epoll], [], [], timeout_ms / 1000)[0]:
                return list(self.epoll.poll(0))
            return []


def _poller() -> Any:
    """A poller for the hub: ``select.poll``, or :class:`_GreenPoller` where it is gone.

    Chosen at each call: monkey-patching may happen after this module is imported.
    """
    poll = getattr(select, "poll", None)
    return _GreenPoller() if poll is None else poll()


_hub: _Hub | None = None
_hub_lock = threading.Lock()
#: Bumped in a forked child: links made before the fork are not the child's.
generation = 0


def hub() -> _Hub:
    """The process's hub, made on first use (after any gevent monkey-patching)."""
    global _hub
    found = _hub
    if found is None:
        with _hub_lock:
            if _hub is None:
                _hub = _Hub()
            found = _hub
    return found


def _after_fork_in_child() -> None:
    global _hub, _hub_lock, generation
    _hub, _hub_lock = None, threading.Lock()
    generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


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
    :data:`PER_CALL_ALLOWANCE` per extra call). A node that has not answered
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
    op = _Op(len(nodes), timeout, enough)
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
    payloads = _pack(nodes, calls, elsewhere)
    the_hub = hub()
    lock = the_hub.lock
    lock.acquire()
    leading = False
    locked = True
    try:
        if not the_hub.leading:
            the_hub.leading = leading = True
            the_hub.refresh()
        now = time.monotonic()
        parts = [_Part(op, index, nodes[index], calls[index]) for index, _ in payloads]
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


def _leave(the_hub: _Hub, op: _Op, leading: bool) -> None:
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


def _decided(op: _Op) -> bool:
    assert op.enough is not None
    try:
        return op.enough(op.results)
    except Exception as exc:
        op.error = exc
        return True


class _Payload:
    """One node's commands in Redis protocol, shared by every node given the same calls.

    Calls name their scripts by SHA (``EVALSHA``); :meth:`for_link` gives the
    bytes for a connection that has not sent some of those scripts yet.
    """

    __slots__ = ("data", "firsts", "loads", "needs", "scripts")

    def __init__(
        self,
        data: bytes,
        firsts: tuple[tuple[Call, int, int], ...],
        needs: tuple[str, ...],
        scripts: tuple[str, ...],
    ) -> None:
        self.data = data
        #: The first call of each script not loaded ahead of it in the same
        #: payload (``SCRIPT LOAD``), with where its bytes start and end.
        self.firsts = firsts
        #: The SHA1s of those scripts: a link must have sent them all, or it
        #: gets :meth:`for_link`.
        self.needs = needs
        #: Every script the link has sent once these bytes are queued.
        self.scripts = scripts
        #: Whether the payload loads some script itself.
        self.loads = len(scripts) > len(needs)

    def for_link(self, sent: set[str]) -> bytes:
        """The bytes for a link that has sent the scripts in ``sent``.

        The first call of each script it :attr:`needs` that is not in ``sent``
        is an EVAL with the script's source.
        """
        view = memoryview(self.data)
        pieces: list[bytes | memoryview] = []
        done = 0
        for call, start, end in self.firsts:
            if call.script.sha not in sent:
                pieces += (view[done:start], call.packed(by_sha=False))
                done = end
        pieces.append(view[done:])
        return b"".join(pieces)


def _one(call: Call | Command) -> _Payload:
    """The payload of a single call."""
    data = call.packed()
    if isinstance(call, Call):
        needs = (call.script.sha,)
        return _Payload(data, ((call, 0, len(data)),), needs, needs)
    return _Payload(data, (), (), () if call.loads is None else (call.loads,))


def _pack(
    nodes: Sequence[FanOutNode], calls: Sequence[Sequence[Call | Command]], skip: set[int]
) -> list[tuple[int, _Payload]]:
    """Each socket node's payload (but those in ``skip``); each call and each list packed once."""
    singles: dict[int, _Payload] = {}
    lists: dict[int, _Payload] = {}
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


def _many(calls: Sequence[Call | Command]) -> _Payload:
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
                time.sleep(0)  # a large batch: let other greenlets run
        end = offset + len(data)
        if isinstance(call, Call):
            if call.script.sha not in seen:
                seen[call.script.sha] = None
                firsts.append((call, offset, end))
        elif call.loads is not None:
            seen[call.loads] = None
        offset = end
        parts.append(data)
    return _Payload(
        b"".join(parts),
        tuple(firsts),
        tuple(call.script.sha for call, _, _ in firsts),
        tuple(seen),
    )


def _queue(the_hub: _Hub, op: _Op, part: _Part, payload: _Payload, now: float) -> None:
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
        # caller's outcome is decided (see _Op.decide): a node still paused
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


def _read_only(reply: Any) -> bool:
    """Whether a reply says the node is a replica now (it refused a write).

    Redis 7 and Valkey keep the refusal's class inside a script's error;
    Redis 6.2 wraps it in a generic ``ERR Error running script`` whose text
    carries the ``-READONLY`` error code.
    """
    if isinstance(reply, ReadOnlyError):
        return True
    return isinstance(reply, ResponseError) and "-READONLY " in str(reply)


def _last_cause(link: Link) -> BaseException:
    return link.last_error or RedisConnectionError("connection failed")
