"""Lock: one named lock on a :class:`~celery_redlock.Redlock`, each acquisition fresh.

Where it differs from other lock libraries: ``acquire(blocking=False, timeout=5)`` is refused
(one attempt cannot wait); ``extend(ttl)`` changes the current hold only, not ``lock.ttl``; an
outage (``QuorumUnavailable``, the lock kept) is told apart from a lost lock (``LockLost``); and
``with lock:`` raises ``LockLost`` on exit when the lock was lost, since the block's work may
have overlapped another holder's.
"""

from __future__ import annotations

import logging
import secrets
import threading

from .. import _clock
from .._clock import to_ms
from .._layout import LockValue
from .._scripts import load
from .._validators import flag, seconds, text
from ..errors import ConfigurationError, LockLost, LockNotAcquired, RedlockError
from ..transport.nodes import Call, fan_out
from .acquire_attempt import Attempt, attempt
from .lease import Lease, LockNodes
from .quorum import Tally, majority_held
from .renewal_batch import place

__all__ = ["Lock"]

logger = logging.getLogger("celery_redlock.lock")

_RENEW = load("renew")
_RELEASE = load("release")
_EXTEND = load("extend")


class Lock(Lease):
    """One named lock on a :class:`Redlock`; reusable, each acquisition fresh.

    Made by :meth:`Redlock.lock`. State lives on the object, not a thread-local, so another
    thread (the heartbeat) may extend or release it.

    Example::

        lock = redlock.lock("invoice:42", ttl=30.0)
        if lock.acquire(timeout=5.0):
            try:
                store.write(invoice, fencing_token=lock.fencing_token)
            finally:
                lock.release()
    """

    def __init__(
        self,
        redlock: LockNodes,
        name: str,
        ttl: float,
        timeout: float | None = None,
        owner: str | None = None,
        *,
        replaces: str | None = None,
        token: str | None = None,
        auto_renew: bool = False,
    ) -> None:
        self.redlock = redlock
        self.name = text(name, "name", empty=False)
        self.ttl = self._checked_ttl(ttl)
        self.timeout = None if timeout is None else seconds(timeout, "timeout", allow_zero=True)
        flag(auto_renew, "auto_renew")
        #: Free text stored beside the token (``task_id|where`` for a task's lock).
        self.owner = None if owner is None else text(owner, "owner")
        #: Take the lock over from a holder whose value ends with this text.
        self.replaces = "" if replaces is None else text(replaces, "replaces")
        self.auto_renew = auto_renew
        self._keys = keys = redlock.keys(self.name)
        self.key = keys.lock
        self._mutex = threading.RLock()
        self._fencing_token: int | None = None
        if token is not None:
            value = text(token, "token", empty=False)
            if owner is not None:
                raise ConfigurationError(
                    "token", "a lock built from a token carries its owner already; drop owner="
                )
            self.owner = LockValue.owner_of(value)
            self._value = value
            self._adopted = True

    kind = "lock"
    renew_script = _RENEW

    def __repr__(self) -> str:
        if self._adopted:
            state = "held elsewhere, validity unknown"
        else:
            state = f"held, {self.validity:.3f}s left" if self.locked() else "not held"
        return f"Lock({self.name!r}, ttl={self.ttl}, {state})"

    # -- state ----------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """Integer larger than every earlier acquisition's; ``None`` when not held or adopted.

        Pass it to the storage you write, and let it refuse a token smaller than one it saw.
        """
        return self._fencing_token if self._value is not None else None

    # -- acquire ----------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; return whether it was taken.

        Args:
            blocking: wait for a busy lock (``False``: one attempt only).
            timeout: longest wait, seconds; ``None``: the lock's default (by default, no
                limit). With ``blocking=False`` only ``None`` or ``0``.

        Raises:
            QuorumUnavailable: no majority answered the only attempt, or 3 in a row (or the
                last before the timeout): an outage is reported, not waited out.
            ConfigurationError: a bad timeout, or a timeout with ``blocking=False``.
            RedlockError: this object already holds the lock.

        A waiter wakes within milliseconds of the holder's release, or as its key expires.
        """
        timeout = self._wait_for(blocking, timeout)
        if self._adopted or self.locked():
            raise RedlockError(
                f"lock {self.name!r} is already held by this Lock object; "
                "use redlock.lock(...) for another one"
            )
        return self._wait(
            self._attempt,
            channel=self._keys.released,
            blocking=blocking,
            timeout=timeout,
            listen_first=False,
        )

    def _attempt(self) -> Attempt:
        """One try on every node; on failure the nodes are left as found."""
        value = LockValue.compose(secrets.token_hex(16), self.owner)
        outcome = attempt(self.redlock, self._keys, value, self.ttl, self.replaces)
        if not outcome.acquired:
            self._release_value(value, notify=False, on=outcome.undo)
            return outcome
        self._fencing_token = outcome.token
        self._take(value, outcome.started)
        logger.debug(
            "acquired %s on %d/%d nodes, token %d (%s)",
            self.name,
            outcome.granted,
            len(self.redlock.nodes),
            outcome.token,
            "one round trip" if outcome.settled else "two round trips",
        )
        return outcome

    # -- extend and release ---------------------------------------------------------

    def extend(self, ttl: float | None = None) -> None:
        """Reset the current hold's time to live to ``ttl`` (default: the lock's ttl).

        A majority must confirm within the current validity; nodes that answered without the
        key then get it back (docs/reliability.md, "Renewal restores missing copies").

        Raises:
            LockLost: expired, or a majority can no longer hold it; given up everywhere.
            QuorumUnavailable: too few nodes answered to tell; kept with its validity, retry.
            ConfigurationError: a ttl a lock could not be acquired with.
        """
        new_ttl = self.ttl if ttl is None else self._checked_ttl(ttl)
        redlock = self.redlock
        with self._mutex:
            value = self._value
            if value is None:
                raise LockLost(
                    f"lock {self.name!r} is not held by this Lock object; acquire it first",
                    key=self.name,
                )
            adopted = self._adopted
            if not adopted and self.validity <= 0:
                self._give_up(value, "its validity ran out before it was extended")
                raise LockLost(
                    f"lock {self.name!r} expired before it was extended; extend more "
                    "often than the ttl, or use a longer ttl",
                    key=self.name,
                )
            call = Call(_EXTEND, (self.key,), (value, to_ms(new_ttl)))
            started = _clock.monotonic()
            results = fan_out(
                redlock.nodes,
                [[call]] * len(redlock.nodes),
                redlock.node_timeout,
                enough=majority_held(redlock.quorum),
            )
            finished = _clock.monotonic()
            tally = Tally.of(redlock.nodes, results, redlock.quorum)
            remaining = _clock.validity(new_ttl, started, finished, redlock.drift_factor)
            if tally.confirmed and remaining > 0:
                self._valid_until = started + new_ttl - _clock.drift(new_ttl, redlock.drift_factor)
                self._adopted = False
                self._unconfirmed = None
                placed = place(redlock, [(self, to_ms(new_ttl), tally.lacking)])
                if placed:
                    logger.info(
                        "lock %s placed again on %d node(s) that lacked it", self.name, placed
                    )
                return
            if tally.lost or (not adopted and self.validity <= 0):
                reason = tally.describe()
                if not tally.lost:
                    reason = f"its validity ran out before a majority confirmed it; {reason}"
                self._give_up(value, reason)
                raise LockLost(f"lock {self.name!r} was lost: {reason}", key=self.name)
            if tally.confirmed:
                problem = (
                    f"a majority confirmed it only after {finished - started:.3f} s, too late "
                    f"for a ttl of {new_ttl} s"
                )
            else:
                problem = tally.describe()
            left = "its validity is unknown" if adopted else f"{self.validity:.3f} s left"
        raise tally.unavailable(
            f"lock {self.name!r} could not be extended: {problem}; it is still held "
            f"({left}); retry, or check the nodes",
            self.name,
        )

    def release(self) -> bool:
        """Give the lock up on every node; wake waiters.

        Returns ``True`` when it was still ours (a majority held it, or still valid and too
        few answered to say otherwise), ``False`` when lost (see :attr:`lost_reason`). Never
        touches another owner's keys; calling it again is harmless.

        Raises:
            QuorumUnavailable: a lock built from a token, when too few nodes answered to tell.
        """
        with self._mutex:
            value, taken = self._value, self._taken
            if value is None:
                return False
            was_valid = self.validity > 0
            adopted = self._adopted
            self._forget()
        tally = self._release_value(value, notify=True)
        if tally.confirmed:
            return True
        if tally.lost:
            reason = tally.describe()
            self._released_lost(taken, reason)
            logger.info("lock %s was lost before its release: %s", self.name, reason)
            return False
        if adopted:
            raise tally.unavailable(
                f"lock {self.name!r}: could not tell whether it was still held: "
                f"{tally.describe()}; its keys expire within its ttl",
                self.name,
            )
        if was_valid:
            logger.warning(
                "lock %s released where the nodes answered (%s); the rest expire within %s s",
                self.name,
                tally.describe(),
                self.ttl,
            )
            return True
        self._released_lost(taken, f"its validity had run out; {tally.describe()}")
        return False

    def hand_over(self, owner: str, ttl: float) -> bool:
        """Pass this held lock to ``owner`` for ``ttl`` seconds, never freeing it in between.

        How a worker hands a singleton's lock back to "queued" for the retry it re-queued. On
        success this object holds nothing; ``False``: no majority took it, the attempt is
        undone and this object keeps its hold (lost on nodes the attempt replaced).

        Raises:
            QuorumUnavailable: too few nodes answered to tell.
        """
        successor = Lock(
            self.redlock, self.name, ttl, owner=owner, replaces=LockValue.ending(self.owner or "")
        )
        if not successor.acquire(blocking=False):
            return False
        with self._mutex:
            self._forget()
        return True

    def _give_up(self, value: str, reason: str) -> None:
        """Forget the acquisition and delete it wherever it is still ours."""
        self.lost_reason = reason
        self._forget()
        self._release_value(value, notify=True)

    def renew_part(self) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        """Its key and value in a batch's ``renew.lua`` call."""
        return (self.key,), (self._value or "",)

    def give_up_call(self) -> Call:
        """Forget the acquisition; return the call that deletes it wherever it is still ours."""
        value = self._value
        assert value is not None
        self._forget()
        return self._release_call(value, notify=True)

    def _release_call(self, value: str, *, notify: bool) -> Call:
        channel = self._keys.released if notify else ""
        return Call(_RELEASE, (self.key, self._keys.args), (value, channel), late_ok=True)

    def _release_value(self, value: str, *, notify: bool, on: set[int] | None = None) -> Tally:
        """Delete ``value`` where it is still the key's value; ``on``: only those nodes."""
        redlock = self.redlock
        nodes = redlock.nodes
        if on is not None and not on:
            return Tally(nodes=0, quorum=redlock.quorum)
        call = self._release_call(value, notify=notify)
        calls = [[call] if on is None or index in on else [] for index in range(len(nodes))]
        results = fan_out(nodes, calls, redlock.node_timeout, enough=majority_held(redlock.quorum))
        tally = Tally.of(nodes, results, redlock.quorum, asked=sum(map(len, calls)))
        if tally.unreachable and notify:
            logger.debug("releasing %s did not reach %s", self.name, "; ".join(tally.failures))
        return tally

    # -- context manager -------------------------------------------------------------

    def _not_acquired(self) -> LockNotAcquired:
        return LockNotAcquired(
            f"lock {self.name!r} is held by another owner and was not released within "
            f"{self.timeout} s; raise the timeout or retry later",
            key=self.name,
            timeout=self.timeout,
        )

    def _lost_in_block(self) -> LockLost:
        return LockLost(
            f"lock {self.name!r} was lost before the end of the with block "
            f"({self.lost_reason or 'it expired'}); the block's work may have overlapped "
            "another holder's",
            key=self.name,
        )
