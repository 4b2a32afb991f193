"""The poll loop every fan-out of the process shares, and who leads it.

The leader polls every :class:`~.connection.Link` and hands replies to their
:class:`~.operation.Part`; when it leaves, a follower leads, or the flusher while commands are
unsent (see :mod:`.fanout`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import threading
import time
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from .. import _clock
from .connection import POLLIN, POLLOUT, Link, Slot
from .error_replies import LinkBroken
from .operation import Op

__all__ = ["Flush", "Hub", "generation", "shared"]

logger = logging.getLogger("celery_redlock.nodes")

#: Replies parsed between two yields to other greenlets.
_CHUNK = 256
#: Bytes queued for a node that cannot be written before its link is closed.
_MAX_BACKLOG = 64 * 1024 * 1024
#: A bulk connection idle this long is closed.
_BULK_IDLE = 30.0
#: How long past its deadline a waiting caller trusts the leader to tell it.
_LEADER_GRACE = 1.0


class Flush(Op):
    """The flusher's turn as leader: until nothing queued is unsent, or ``until``."""

    def __init__(self, the_hub: Hub, until: float) -> None:
        super().__init__(0, 0.0, None)
        self.hub = the_hub
        self.until = until
        if not the_hub.unsent():
            self.finished = True

    def expire(self, drained: float) -> None:
        """Finish once nothing is unsent, or at ``until``."""
        if drained >= self.until or not self.hub.unsent():
            self.finish()

    def next_deadline(self) -> float:
        """When to stop flushing."""
        return self.until


class Hub:
    """The process's links and who is reading them right now."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leading = False
        self.polling = False
        self.followers: list[Op] = []
        self.links: set[Link] = set()
        # Every reply on a socket by then has been read: an unmet deadline before it was missed.
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
        """Close ``link``, failing its waiting parts with ``cause``."""
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
                            _clock.pause()
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
        """Make a waiting caller the leader; else, if commands are unsent, the flusher.

        It leads for up to ``flush_for`` seconds (0: not at all).
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
                op = Flush(self, self._flush_until)
                try:
                    self.lead(op)
                except Exception:
                    # Those callers have their outcomes; the next call meets whatever broke.
                    logger.exception("celery_redlock: sending commands after their call failed")
                finally:
                    self.hand_off()

    def _drain_wake(self) -> None:
        """Empty the wake-up pipe in one read: reading until ``EAGAIN`` blocks under eventlet.

        One read is enough: :meth:`wake` writes no second byte until this runs.
        """
        self._wake_pending = False
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)

    def poll_set(self) -> tuple[Any, dict[int, Link]]:
        """A poller over every open link and the wake-up pipe, and the links by descriptor."""
        poller = _poller()
        links: dict[int, Link] = {}
        for link in self.links:
            if link.open:
                poller.register(link.fd, link.events())
                links[link.fd] = link
        poller.register(self._wake_r, POLLIN)
        return poller, links

    # -- the two roles -----------------------------------------------------------------

    def lead(self, op: Op) -> None:
        """Poll every link until ``op`` is finished (the lock is held on entry and exit)."""
        lock = self.lock
        # Replies a leader read but had not handed out when it was interrupted (a kill in
        # handle's pause between two chunks): no poll reports them again.
        buffered = {
            link.fd: link for link in self.links if link.inbuf and link.open and not link.connecting
        }
        if buffered:
            self.handle([(fd, POLLIN) for fd in buffered], buffered)
        while True:
            if op.finished:
                return
            if any(follower.finished for follower in self.followers):
                # Told, and gone without the lock (see follow).
                self.followers = [f for f in self.followers if not f.finished]
            poller, links = self.poll_set()
            # Wake at the first caller's deadline, to tell it once read past it.
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

    def follow(self, op: Op) -> bool | None:
        """Sleep until ``op`` is finished or this caller must lead (the lock held on entry).

        Returns True (lead) or False (finished) with the lock held, or None without it when the
        leader finished ``op``: the common case skips waiting for the lock the leader still holds.
        """
        event = op.event
        assert event is not None
        lock = self.lock
        while True:
            # The leader expires this op; the grace is for a leader that cannot run.
            wait = op.next_deadline() + _LEADER_GRACE - time.monotonic()
            lock.release()
            try:
                told = event.wait(max(wait, 0.0))
            except BaseException:
                lock.acquire()
                raise
            # Set last in Op.finish, or by hand_off after promoted; a promoted op cannot finish
            # before it wakes (only a leader reads replies, and it is the next one).
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
    """``select.poll``'s interface where eventlet removed ``poll``: an unpatched epoll.

    Green ``select`` waits on the epoll's one descriptor. Never several: with two ready, eventlet
    calls the later callbacks after ``select`` returned, switching back into the green thread
    wherever it waits by then. One poll per poller; the epoll is closed after it.
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
    """``select.poll``, or :class:`_GreenPoller`; chosen per call, as patching may come later."""
    poll = getattr(select, "poll", None)
    return _GreenPoller() if poll is None else poll()


_hub: Hub | None = None
_hub_lock = threading.Lock()
#: Bumped in a forked child: links made before the fork are not the child's.
generation = 0


def shared() -> Hub:
    """The process's hub, made on first use (after any gevent monkey-patching)."""
    global _hub
    found = _hub
    if found is None:
        with _hub_lock:
            if _hub is None:
                _hub = Hub()
            found = _hub
    return found


def _after_fork_in_child() -> None:
    global _hub, _hub_lock, generation
    _hub, _hub_lock = None, threading.Lock()
    generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)
