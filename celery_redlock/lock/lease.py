"""What a lock and a semaphore slot share: a hold with a validity, waited for and given back.

:class:`Lease` holds the validity, the ``with`` protocol and the blocking wait; each subclass
drives the wait with its own attempt.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self, TypeVar

from .. import _clock
from .._layout import LockKeys
from .._scripts import LuaScript
from .._validators import MAX_TTL, check_ttl, seconds
from ..errors import ConfigurationError, LockLost, LockNotAcquired, QuorumUnavailable, RedlockError
from ..transport.commands import Call
from ..transport.failure_text import detail
from ..transport.nodes import Node
from .fencing import FenceClock
from .held_lease import HeldLock, Renewable
from .quorum import BUSY, LOST, RENEWED, UNREACHABLE, Tally
from .release_wakeup import ReleaseListener, sleep
from .renewal import heartbeat

__all__ = ["Lease", "LockNodes", "expiry_reason"]

#: Quick retries after a release notice, seconds: other nodes' releases may lag the one heard.
_AFTER_WAKE_DELAYS = (0.0005, 0.001, 0.002, 0.004)

#: Attempts in a row without a majority answering before a blocking acquire gives up: one miss
#: can be a node stalled a moment beside one that is down; a few are an outage.
QUORUM_ATTEMPTS = 3


class LockNodes(Protocol):
    """What a lock or a semaphore reads of its :class:`~celery_redlock.Redlock`."""

    nodes: list[Node]
    quorum: int
    node_timeout: float
    drift_factor: float
    retry_delay: float
    fence_ttl: float
    key_prefix: str
    #: The nodes' clocks as this process knows them, to propose fencing tokens.
    fence_clock: FenceClock

    def keys(self, name: str) -> LockKeys:
        """The Redis keys of the lock called ``name``."""
        ...

    def renew(self, leases: Sequence[Renewable]) -> list[str]:
        """Renew held locks and slots of these nodes: one round trip per node."""
        ...


@dataclass
class Outcome:
    """What one acquire attempt found: what the wait reads (each lease's attempt adds its own)."""

    acquired: bool = False
    answered: int = 0
    granted: int = 0
    #: Seconds until the holder's hold runs out, when the nodes said.
    retry_hint: float | None = None
    #: Why each node that did not answer did not, by node name.
    failures: dict[str, BaseException] = field(default_factory=dict)
    #: When the attempt began (monotonic): its validity counts from here.
    started: float = 0.0


OutcomeT = TypeVar("OutcomeT", bound=Outcome)


def expiry_reason(unconfirmed: str | None) -> str:
    """Why a hold ran out, from what the last renewal without a majority heard (or ``None``)."""
    if unconfirmed is None:
        return (
            "its validity ran out before it was renewed (the nodes did not answer in "
            "time, or the process stalled)"
        )
    return f"its validity ran out before a majority confirmed a renewal; {unconfirmed}"


class Lease:
    """A hold on a majority of nodes, valid until a monotonic deadline."""

    #: ``"lock"`` or ``"semaphore"``: how errors name the kind.
    kind: str
    name: str
    redlock: LockNodes
    ttl: float
    timeout: float | None
    #: Free text stored beside the token (``task_id|where`` for a task's).
    owner: str | None
    #: Renew from the process heartbeat while held, by weak reference.
    auto_renew: bool
    #: The script that renews a batch of these (see :meth:`renew_part`).
    renew_script: LuaScript
    #: Why the last acquisition ended without this object releasing it, else ``None``.
    lost_reason: str | None = None
    _value: str | None = None
    _valid_until = 0.0
    _mutex: threading.RLock
    _held: HeldLock | None = None
    # Built from a token (``token=``): validity unknown until an extend() confirms it.
    _adopted = False
    # The last renewal that found no majority: why it was lost, if it runs out.
    _unconfirmed: str | None = None
    #: Acquisitions taken so far: a release tells a loss only to the one it released.
    _taken = 0

    @property
    def value(self) -> str | None:
        """The token (and owner) written to Redis, or ``None``; see ``Redlock.lock(token=)``."""
        return self._value

    @property
    def validity(self) -> float:
        """Seconds this acquisition is still safe to rely on (0.0 when not held)."""
        if self._value is None:
            return 0.0
        return max(0.0, self._valid_until - _clock.monotonic())

    def locked(self) -> bool:
        """True while this object holds it and its validity has not run out."""
        return self.validity > 0.0

    def expired_reason(self) -> str:
        """Why a held acquisition's validity ran out: what the last unconfirmed renewal heard."""
        return expiry_reason(self._unconfirmed)

    def _take(self, value: str, started: float) -> None:
        """Hold ``value``, set by an attempt begun at ``started``; renew it if ``auto_renew``."""
        drift = _clock.drift(self.ttl, self.redlock.drift_factor)
        with self._mutex:
            self._value, self._valid_until = value, started + self.ttl - drift
            self.lost_reason = self._unconfirmed = None
            self._taken += 1
        if self.auto_renew:
            beat = heartbeat()
            if self._held is not None:  # an earlier acquisition that expired
                beat.drop(self._held)
            self._held = beat.hold(self, weak=True)

    def _released_lost(self, taken: int, reason: str) -> None:
        """Record why the release of acquisition ``taken`` found it lost, unless a newer one began.

        A release reads the nodes without the mutex: the object may be acquired again meanwhile.
        """
        with self._mutex:
            if self._taken == taken:
                self.lost_reason = reason

    def _forget(self) -> None:
        """Drop this object's acquisition without telling the nodes."""
        self._value, self._valid_until, self._adopted, self._unconfirmed = None, 0.0, False, None
        held, self._held = self._held, None
        if held is not None:
            heartbeat().drop(held)

    def _wait_for(self, blocking: bool, timeout: float | None) -> float | None:
        """An acquire's ``timeout`` checked (``None``: the default of this object)."""
        if timeout is None:
            return self.timeout
        timeout = seconds(timeout, "timeout", allow_zero=True)
        if not blocking and timeout > 0:
            raise ConfigurationError(
                "timeout",
                f"{self.kind} {self.name!r}: a non-blocking acquire makes one attempt and "
                f"cannot wait {timeout} s; pass blocking=True, or no timeout",
            )
        return timeout

    # -- renewal (see :mod:`.renewal_batch`) ---------------------------------------

    def start_renewal(self, now: float) -> str | None:
        """Hold the mutex for a renewal (until :meth:`end_renewal`): ``None``, or the outcome now.

        ``BUSY``: another thread is extending or releasing it.
        """
        if not self._mutex.acquire(blocking=False):
            return BUSY
        if self._value is None:
            return LOST
        if not self._adopted and self._valid_until <= now:
            self.lost_reason = self.expired_reason()
            return LOST
        return None

    def end_renewal(self) -> None:
        """Let other threads extend or release it again."""
        self._mutex.release()

    def apply_renewal(self, tally: Tally, remaining: float, valid_until: float, now: float) -> str:
        """Take a renewal's answers as :meth:`Lock.extend` does; too few: ``UNREACHABLE``."""
        if tally.confirmed and remaining > 0:
            self._valid_until, self._adopted, self._unconfirmed = valid_until, False, None
            return RENEWED
        if tally.lost:
            self.lost_reason = tally.describe()
            return LOST
        if self._adopted or self._valid_until > now:
            self._unconfirmed = tally.describe()
            return UNREACHABLE
        self.lost_reason = (
            f"its validity ran out before a majority confirmed it; {tally.describe()}"
        )
        return LOST

    def _checked_ttl(self, ttl: object) -> float:
        """``ttl`` as seconds this lock or slot may live: above 2 node timeouts, at most a year."""
        return check_ttl(seconds(ttl, "ttl", maximum=MAX_TTL), self.redlock.node_timeout, "ttl")

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take it; return whether it was taken (see the subclass)."""
        raise NotImplementedError

    def release(self) -> bool:
        """Give it back; return whether it was still held (see the subclass)."""
        raise NotImplementedError

    def renew_part(self) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        """Its keys and arguments in a batch's :attr:`renew_script` call."""
        raise NotImplementedError

    def give_up_call(self) -> Call:
        """Forget the acquisition; return the call that deletes it wherever it is still ours."""
        raise NotImplementedError

    def _not_acquired(self) -> LockNotAcquired:
        """The error of a ``with`` block that could not take it."""
        raise NotImplementedError

    def _lost_in_block(self) -> LockLost:
        """The error of a ``with`` block whose hold was lost before its end."""
        raise NotImplementedError

    def _quorum_unavailable(self, outcome: Outcome) -> QuorumUnavailable:
        """The error for an attempt that fewer than a majority of nodes answered."""
        redlock = self.redlock
        said = "; ".join(f"{node}: {detail(error)}" for node, error in outcome.failures.items())
        return QuorumUnavailable(
            f"{self.kind} {self.name!r}: only {outcome.answered} of {len(redlock.nodes)} Redis "
            f"nodes answered, {redlock.quorum} needed; check the nodes ({said})",
            key=self.name,
            answered=outcome.answered,
            needed=redlock.quorum,
            failures=outcome.failures,
        )

    def _wait(
        self,
        attempt_once: Callable[[], OutcomeT],
        *,
        channel: str,
        blocking: bool,
        timeout: float | None,
        listen_first: bool,
    ) -> bool:
        """Attempt until taken, out of time, or the nodes are out of reach.

        Listening on ``channel`` starts before an attempt, so no release is missed; the first
        attempt goes before subscribing (the cheap uncontended path) unless ``listen_first``
        (an attempt that queues the caller must be followed by listening).

        Raises:
            QuorumUnavailable: no majority answered the only attempt, :data:`QUORUM_ATTEMPTS` in
                a row, or the last before the deadline.
        """
        deadline = None if timeout is None else _clock.monotonic() + timeout
        misses = 0  # attempts in a row without a majority answering
        retry_delay = self.redlock.retry_delay

        def attempt() -> OutcomeT:
            nonlocal misses
            outcome = attempt_once()
            if outcome.answered >= self.redlock.quorum:
                misses = 0
                return outcome
            misses += 1
            out_of_time = deadline is not None and _clock.monotonic() >= deadline
            if not blocking or out_of_time or misses >= QUORUM_ATTEMPTS:
                raise self._quorum_unavailable(outcome)
            return outcome

        def left() -> float:
            return math.inf if deadline is None else deadline - _clock.monotonic()

        if not listen_first:
            if attempt().acquired:
                return True
            if not blocking or left() <= 0:
                return False
        with ReleaseListener(self.redlock.nodes, channel) as listener:
            woken = False
            while True:
                outcome = attempt()
                if outcome.acquired:
                    return True
                remaining = left()
                if remaining <= 0:
                    return False
                if woken and outcome.granted > 0:
                    # The release is still reaching the other nodes: retry almost at once.
                    for delay in _AFTER_WAKE_DELAYS:
                        sleep(min(delay, remaining))
                        outcome = attempt()
                        if outcome.acquired:
                            return True
                        if outcome.granted == 0:
                            break
                    remaining = left()
                    if remaining <= 0:
                        return False
                if misses:
                    # The nodes, not a holder, are the obstacle: look again soon.
                    wait = retry_delay * random.uniform(0.25, 0.75)
                else:
                    wait = retry_delay * random.uniform(0.5, 1.5)
                    if outcome.retry_hint is not None:
                        wait = min(wait, outcome.retry_hint)
                woken = listener.wait(min(wait, remaining))

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Self:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            released = self.release()
        except RedlockError:
            if exc_type is None:
                raise
            return  # the block's own exception says more
        if not released and exc_type is None:
            raise self._lost_in_block()
