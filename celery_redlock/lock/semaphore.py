"""Semaphore: at most ``limit`` holders of one name across a Redlock's nodes.

``L`` numbered slots, each a Redlock lock: a holder holds one slot number on a majority, so
two holders of one number would share a node (counting members per node is not enough).
Waiters queue in ticket order on every node. This module decides what a holder does; the
node calls are :mod:`.semaphore_slots`'. Rules and proof: docs/flow-control.md, "Semaphore".
"""

from __future__ import annotations

import logging
import secrets
import threading

from .. import _clock
from .._layout import semaphore_keys
from .._validators import flag, seconds, text
from ..errors import ConfigurationError, LockLost, LockNotAcquired, RedlockError
from ..transport.commands import Call
from .lease import Lease, LockNodes
from .renewal_batch import place
from .semaphore_slots import MAX_LIMIT, RENEW, Attempt, Slots, check_limit

__all__ = ["MAX_LIMIT", "Semaphore", "check_limit"]

logger = logging.getLogger("celery_redlock.semaphore")


class Semaphore(Lease):
    """At most ``limit`` holders of one name at once; reusable, each acquisition fresh.

    Used exactly like a :class:`~celery_redlock.Lock`; made by :meth:`Redlock.semaphore`.

    Example::

        exports = redlock.semaphore("exports:acme", limit=3, ttl=30.0)
        with exports:            # waits for one of the 3 slots
            run_export()
    """

    kind = "semaphore"
    renew_script = RENEW

    def __init__(
        self,
        redlock: LockNodes,
        name: str,
        limit: int,
        ttl: float,
        timeout: float | None = None,
        owner: str | None = None,
        *,
        blocking: bool = True,
        auto_renew: bool = False,
    ) -> None:
        self.redlock = redlock
        self.name = text(name, "name", empty=False)
        self.limit = check_limit(limit)
        self.ttl = self._checked_ttl(ttl)
        self.timeout = None if timeout is None else seconds(timeout, "timeout", allow_zero=True)
        flag(blocking, "blocking")
        flag(auto_renew, "auto_renew")
        if not blocking and self.timeout:
            raise ConfigurationError(
                "timeout",
                f"semaphore {self.name!r}: a non-blocking semaphore makes one attempt "
                f"and cannot wait {self.timeout} s; pass blocking=True, or no timeout",
            )
        #: Free text stored beside the token (``task_id|where`` for a task's slot).
        self.owner = None if owner is None else text(owner, "owner")
        #: Whether ``acquire()`` and ``with`` wait for a slot by default.
        self.blocking = blocking
        self.auto_renew = auto_renew
        self.keys = semaphore_keys(redlock.key_prefix, self.name)
        self._slots = Slots(redlock, self.name, self.keys, self.limit, self.ttl)
        self._mutex = threading.RLock()
        self._slot: int | None = None
        self._unsure: frozenset[int] = frozenset()

    def __repr__(self) -> str:
        state = f"slot {self._slot}, {self.validity:.3f}s left" if self.locked() else "not held"
        return f"Semaphore({self.name!r}, limit={self.limit}, ttl={self.ttl}, {state})"

    # -- state ----------------------------------------------------------------

    @property
    def valid_until(self) -> float:
        """When the acquisition stops being safe (:func:`time.monotonic` clock; 0.0 if not held)."""
        return self._valid_until if self._value is not None else 0.0

    @property
    def slot(self) -> int | None:
        """The slot number held (0 to ``limit - 1``), or ``None`` when not held."""
        return self._slot if self._value is not None else None

    # -- acquire ----------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take a slot; return whether one was taken.

        Args:
            blocking: wait for a slot (default: the semaphore's ``blocking``).
            timeout: longest wait, seconds (default: the semaphore's ``timeout``).

        Raises:
            QuorumUnavailable: no majority answered (the only attempt, or 3 in a row).
            ConfigurationError: a bad timeout, or a timeout with ``blocking=False``.
            RedlockError: this object already holds a slot.

        A waiter queues on every node; a newcomer never takes a slot owed to a waiter.
        """
        if blocking is None:
            blocking = self.blocking
        timeout = self._wait_for(blocking, timeout)
        if self.locked():
            raise RedlockError(
                f"semaphore {self.name!r}: this Semaphore object holds a slot already; "
                "use redlock.semaphore(...) for another one"
            )
        waits = bool(blocking) and timeout != 0
        waiter = secrets.token_hex(8) if waits else ""
        ticket: int | None = None

        def attempt() -> Attempt:
            nonlocal ticket
            outcome = self._attempt(waiter, ticket)
            if waiter and outcome.ticket and ticket is None:
                ticket = outcome.ticket  # the same place in every node's queue from now on
            return outcome

        if not waits:
            return self._wait(
                attempt, channel=self.keys.released, blocking=False, timeout=0, listen_first=False
            )
        acquired = False
        try:
            # The first attempt queues this waiter: it is made while listening.
            acquired = self._wait(
                attempt,
                channel=self.keys.released,
                blocking=True,
                timeout=timeout,
                listen_first=True,
            )
            return acquired
        finally:
            if not acquired:
                self._slots.leave(waiter)

    def _attempt(self, waiter: str, ticket: int | None) -> Attempt:
        """One try on every node; on success, this object holds the slot."""
        outcome = self._slots.attempt(self.owner, waiter, ticket)
        if outcome.acquired:
            self._slot, self._unsure = outcome.slot, outcome.unsure
            self._take(outcome.value, outcome.started)
        return outcome

    # -- extend and release ---------------------------------------------------------

    def extend(self, ttl: float | None = None) -> None:
        """Reset the held slot's ttl (default: the semaphore's), as :meth:`Lock.extend` does.

        Raises:
            LockLost: expired, or a majority no longer holds it; given up everywhere.
            QuorumUnavailable: too few nodes answered to tell; the slot is kept.
        """
        new_ttl = self.ttl if ttl is None else self._checked_ttl(ttl)
        redlock = self.redlock
        with self._mutex:
            value, slot = self._value, self._slot
            if value is None or slot is None:
                raise LockLost(
                    f"semaphore {self.name!r}: no slot is held by this object; acquire it first",
                    key=self.name,
                )
            if self.validity <= 0:
                self._give_up("its validity ran out before it was extended")
                raise LockLost(
                    f"semaphore {self.name!r}: slot {slot} expired before it was extended; "
                    "extend more often than the ttl, or use a longer ttl",
                    key=self.name,
                )
            started = _clock.monotonic()
            tally = self._slots.extend(slot, value, new_ttl)
            finished = _clock.monotonic()
            remaining = _clock.validity(new_ttl, started, finished, redlock.drift_factor)
            if tally.confirmed and remaining > 0:
                self._valid_until = started + new_ttl - _clock.drift(new_ttl, redlock.drift_factor)
                self._unconfirmed = None
                placed = place(redlock, [(self, _clock.to_ms(new_ttl), tally.lacking)])
                if placed:
                    logger.info(
                        "semaphore %s: slot %d placed again on %d node(s) that lacked it",
                        self.name,
                        slot,
                        placed,
                    )
                return
            if tally.lost or self.validity <= 0:
                reason = tally.describe()
                self._give_up(reason)
                raise LockLost(
                    f"semaphore {self.name!r}: slot {slot} was lost: {reason}", key=self.name
                )
            left = self.validity
        raise tally.unavailable(
            f"semaphore {self.name!r}: slot {slot} could not be extended: {tally.describe()}; "
            f"it is still held ({left:.3f} s left); retry, or check the nodes",
            self.name,
        )

    def release(self) -> bool:
        """Give the slot up on every node and wake waiters; as :meth:`Lock.release`."""
        with self._mutex:
            value, slot, unsure, taken = self._value, self._slot, self._unsure, self._taken
            if value is None or slot is None:
                return False
            was_valid = self.validity > 0
            self._forget()
        tally = self._slots.release(slot, value, unsure)
        if tally.confirmed:
            return True
        if tally.lost:
            self._released_lost(taken, tally.describe())
            logger.info("semaphore %s: slot %d was lost before its release", self.name, slot)
            return False
        if was_valid:
            logger.warning(
                "semaphore %s: slot %d released where the nodes answered (%s); the rest "
                "expire within %s s",
                self.name,
                slot,
                tally.describe(),
                self.ttl,
            )
            return True
        self._released_lost(taken, f"its validity had run out; {tally.describe()}")
        return False

    def renew_part(self) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        """Its keys, slot and value in a batch's ``semaphore_renew.lua`` call."""
        return (self.keys.holders, self.keys.expiry), (self._slot or 0, self._value or "")

    def give_up_call(self) -> Call:
        """Forget the acquisition; return the call that gives up every slot it holds anywhere."""
        value = self._value
        assert value is not None
        self._forget()
        return self._slots.release_call(-1, value, notify=True)

    def _give_up(self, reason: str) -> None:
        value, slot, unsure = self._value, self._slot, self._unsure
        self.lost_reason = reason
        self._forget()
        if value is not None and slot is not None:
            self._slots.release(slot, value, unsure)

    # -- context manager -------------------------------------------------------------

    def _not_acquired(self) -> LockNotAcquired:
        waited = f"stayed taken for {self.timeout} s" if self.blocking else "were taken"
        return LockNotAcquired(
            f"semaphore {self.name!r}: all {self.limit} slots {waited}; raise the "
            "timeout or the limit, or retry later",
            key=self.name,
            timeout=self.timeout,
        )

    def _lost_in_block(self) -> LockLost:
        return LockLost(
            f"semaphore {self.name!r}: the slot was lost before the end of the with "
            f"block ({self.lost_reason or 'it expired'}); the block's work may have "
            f"run beside {self.limit} others",
            key=self.name,
        )
