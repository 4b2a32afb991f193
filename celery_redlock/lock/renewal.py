"""The per-process renewal thread that keeps held locks alive.

One daemon thread per process renews every held lock at about a third of its ttl, all due
locks in one round trip per node. With ``progress_timeout``, a task that reports no progress
for that long stops being renewed, so a hung task loses its lock instead of holding it forever::

    t=0    task takes the lock (ttl 30 s, progress_timeout 60 s)
    t=10   renewed    t=20 renewed  ...  (task calls self.heartbeat() now and then)
    t=75   last progress was at t=14: renewal stops
    t=~100 the key expires; the task is marked lost, its next heartbeat() raises

A failed renewal marks the lock lost and tells the task (``signals.lock_lost``); too few nodes
answering is retried soon, and is a loss only once the validity runs out.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable

from .. import _clock
from .._clock import PAUSE_EVERY, pause
from ..errors import LockLost
from .held_lease import RENEW_AT, HeldLock, Renewable
from .quorum import LOST, RENEWED, UNREACHABLE

__all__ = ["Heartbeat", "heartbeat"]

logger = logging.getLogger("celery_redlock.heartbeat")

#: Shortest interval between renewal rounds, seconds.
MIN_TICK = 0.005

#: Seconds without any held lock after which the thread stops ticking.
IDLE_DORMANT = 60.0
#: After a round where too few nodes answered, try again this soon (seconds, at most).
RETRY_UNREACHABLE = 1.0


class Heartbeat:
    """Renews registered locks from one background thread."""

    def __init__(self) -> None:
        self._held: dict[int, HeldLock] = {}
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._next_tick = 0.0  # when the thread next looks; 0 while dormant
        self._tick = 0.0  # the last tick period used
        self._idle_since = 0.0  # when the last lock went; 0 while locks are held
        #: Renewal rounds the thread has run (each one a thread wake-up).
        self.rounds = 0

    def hold(
        self,
        lock: Renewable,
        *,
        task_id: str | None = None,
        progress_timeout: float | None = None,
        on_lost: Callable[[HeldLock, str], None] | None = None,
        weak: bool = False,
    ) -> HeldLock:
        """Start renewing ``lock`` (already acquired) until :meth:`drop`; ``weak``: by weak ref."""
        held = HeldLock(
            lock, task_id=task_id, progress_timeout=progress_timeout, on_lost=on_lost, weak=weak
        )
        with self._mutex:
            self._held[id(held)] = held
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(
                    target=self._run, name="celery_redlock-heartbeat", daemon=True
                )
                self._thread.start()
            # Wake only if due before the next tick: a wake-up per task is a thread switch.
            first_due = held.last_renewed + lock.ttl * RENEW_AT
            self._idle_since = 0.0
            wake = self._next_tick == 0.0 or first_due < self._next_tick
            if self._next_tick == 0.0:
                # Dormant: start ticking, even if this lock is gone by then (see _idle_wait).
                self._next_tick = first_due
                self._tick = max(lock.ttl * RENEW_AT, MIN_TICK)
        if wake:
            self._wake.set()
        return held

    def drop(self, held: HeldLock) -> None:
        """Stop renewing ``held`` (the caller releases the lock)."""
        with self._mutex:
            self._held.pop(id(held), None)

    def progress(self, held: HeldLock, *, renew_now: bool = False) -> None:
        """Record progress; with ``renew_now``, renew at once if a tenth of the ttl passed.

        Raises:
            LockLost: the lock is gone.
        """
        now = _clock.monotonic()
        held.last_progress = now
        if held.lost or not held.lock.locked():
            reason = held.lost_reason or f"expired: {held.lock.expired_reason()}"
            self._mark_lost(held, reason, "expired")
            raise _lost_error(held)
        if renew_now and now - held.last_renewed > held.lock.ttl / 10:
            self._renew([held], [held.lock])
            if held.lost:
                raise _lost_error(held)

    @property
    def count(self) -> int:
        """Number of locks being renewed."""
        with self._mutex:
            return len(self._held)

    def stop(self) -> None:
        """Stop the thread (it is a daemon; this is for tidy shutdowns and tests)."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    # -- the thread ------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            try:
                wait = self._round()
                # Event.wait refuses more than TIMEOUT_MAX (a ttl of centuries).
                self._wake.wait(min(wait, threading.TIMEOUT_MAX))
            except Exception:  # never let the renewer die silently
                logger.exception("heartbeat round failed; retrying in 1 s")
                self._wake.wait(1.0)
            self._wake.clear()

    def _round(self) -> float:
        """Renew what is due; return seconds until the thread should look again.

        A common tick (a third of the shortest ttl) renews every lock due before the next one,
        so locks share a round trip. Pausing every :data:`PAUSE_EVERY` locks, outside the
        mutex, keeps thousands of locks from holding a gevent loop.
        """
        self.rounds += 1
        with self._mutex:
            now = _clock.monotonic()
            held_now = list(self._held.values())
        # Strong references for this round. Parallel lists, not pairs: thousands of tuples
        # would feed the garbage collector's full collections, each a stall.
        active: list[HeldLock] = []
        active_locks: list[Renewable] = []
        dropped: list[HeldLock] = []
        shortest = math.inf
        for count, held in enumerate(held_now, start=1):
            lock = held.target()
            if lock is None:
                dropped.append(held)
            elif not (held.lost or held.released):
                active.append(held)
                active_locks.append(lock)
                shortest = min(shortest, lock.ttl)
            if count % PAUSE_EVERY == 0:
                pause()
        del held_now
        with self._mutex:  # hold() decides whether to wake us from _next_tick
            for held in dropped:
                # A weakly held lock nobody references any more: let it expire.
                if self._held.pop(id(held), None) is not None:
                    logger.info("lock %r was dropped without release(); renewal stops", held.name)
            if not active:
                return self._idle_wait(now)
            self._idle_since = 0.0
            tick = max(shortest * RENEW_AT, MIN_TICK)
            self._tick = tick
            if self._next_tick == 0.0 or self._next_tick > now + tick:
                self._next_tick = now + tick  # first lock, or one with a shorter ttl
            on_tick = now >= self._next_tick
            next_wake = tick if on_tick else self._next_tick - now
            soon = now + tick if on_tick else now
            if on_tick:
                self._next_tick = now + tick
        due: list[HeldLock] = []
        due_locks: list[Renewable] = []
        expired: list[HeldLock] = []
        for count, (held, lock) in enumerate(zip(active, active_locks, strict=True), start=1):
            if held.progress_timeout is not None and held.stalled(now):
                # No renewal: the lock runs out. Check back when it has.
                left = lock.validity
                if left <= 0:
                    expired.append(held)
                else:
                    next_wake = min(next_wake, left + 0.001)
            elif held.next_due <= soon:
                due.append(held)
                due_locks.append(lock)
            else:
                # A retry after an unreachable round can be due before the tick.
                next_wake = min(next_wake, held.next_due - now)
            if count % PAUSE_EVERY == 0:
                pause()
        del active, active_locks
        for held in expired:
            self._mark_lost(held, "no progress for progress_timeout; lock expired", "stalled")
        if due:
            self._renew(due, due_locks)
            now = _clock.monotonic()
            for count, held in enumerate(due, start=1):
                if not held.lost:
                    next_wake = min(next_wake, max(held.next_due - now, 0.0))
                if count % PAUSE_EVERY == 0:
                    pause()
        return max(next_wake, 0.001)

    def _idle_wait(self, now: float) -> float:
        """Seconds to sleep while no lock is held (under the mutex).

        Keeping the tick a while lets the next short task's lock fall due after it, so
        :meth:`hold` need not wake the thread; after ``IDLE_DORMANT`` s it sleeps until woken.
        """
        if self._next_tick == 0.0:
            return IDLE_DORMANT
        if self._idle_since == 0.0:
            self._idle_since = now
        if now - self._idle_since >= IDLE_DORMANT:
            self._next_tick = 0.0
            return IDLE_DORMANT
        if self._next_tick <= now:
            self._next_tick = now + self._tick
        return self._next_tick - now

    def _renew(self, helds: list[HeldLock], locks: list[Renewable]) -> None:
        """Renew ``locks`` (``helds[i]`` holds ``locks[i]``); record each outcome."""
        by_redlock: dict[int, tuple[list[HeldLock], list[Renewable]]] = {}
        for held, lock in zip(helds, locks, strict=True):
            group = by_redlock.setdefault(id(lock.redlock), ([], []))
            group[0].append(held)
            group[1].append(lock)
        for group_helds, group_locks in by_redlock.values():
            outcomes = group_locks[0].redlock.renew(group_locks)
            now = _clock.monotonic()
            for count, (held, lock, outcome) in enumerate(
                zip(group_helds, group_locks, outcomes, strict=True), start=1
            ):
                if count % PAUSE_EVERY == 0:
                    pause()
                if outcome == RENEWED:
                    held.last_renewed = now
                    held.next_due = now + lock.ttl * RENEW_AT
                elif outcome == UNREACHABLE:
                    held.next_due = now + min(RETRY_UNREACHABLE, lock.validity / 4)
                elif outcome == LOST:
                    # Without a reason, its owner released it during the round.
                    if not held.released and lock.lost_reason is not None:
                        self._mark_lost(
                            held, f"renewal failed: {lock.lost_reason}", "renewal_failed"
                        )
                else:  # busy: being released or extended by another thread
                    held.next_due = now + 0.01

    def _mark_lost(self, held: HeldLock, reason: str, code: str) -> None:
        if held.lost or held.released:
            return
        held.lost = True
        held.lost_reason = reason
        held.lost_code = code
        logger.warning(
            "lock %r%s lost after %.1f s: %s",
            held.name,
            "" if held.task_id is None else f" of task {held.task_id}",
            held.held_for,
            reason,
        )
        if held.on_lost is not None:
            try:
                held.on_lost(held, reason)
            except Exception:
                logger.exception("lock_lost handler failed")


def _lost_error(held: HeldLock) -> Exception:
    return LockLost(
        f"lock {held.name!r} of task {held.task_id} was lost "
        f"({held.lost_reason or 'expired'}); stop work that needs it",
        key=held.name,
    )


_process_heartbeat: Heartbeat | None = None
_process_pid = 0
_create_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # The parent's thread is gone here, and its mutex may have been held at the fork.
    global _process_heartbeat, _create_lock
    _process_heartbeat = None
    _create_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def heartbeat() -> Heartbeat:
    """Return the heartbeat of the current process (a new one after ``fork()``)."""
    global _process_heartbeat, _process_pid
    with _create_lock:
        if _process_heartbeat is None or _process_pid != os.getpid():
            _process_heartbeat = Heartbeat()
            _process_pid = os.getpid()
        return _process_heartbeat
