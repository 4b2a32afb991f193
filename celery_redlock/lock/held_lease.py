"""A lock or slot held by the renewal thread: what it needs of one, what it knows of it."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

from .. import _clock
from .._scripts import LuaScript
from ..transport.commands import Call
from .quorum import Tally

__all__ = ["RENEW_AT", "HeldLock", "Renewable", "Renewer"]

#: Renew when this fraction of the ttl has passed since the last renewal.
RENEW_AT = 1 / 3


class Renewer(Protocol):
    """The nodes a :class:`Renewable` is held on: they renew many at once."""

    def renew(self, leases: Sequence[Renewable]) -> list[str]:
        """``RENEWED``, ``LOST``, ``UNREACHABLE`` or ``BUSY`` per lease."""
        ...


class Renewable(Protocol):
    """A lock or a semaphore slot: it supplies its part of a renewal call, applies the outcome."""

    name: str
    ttl: float
    owner: str | None
    lost_reason: str | None
    #: The script that renews a batch of these.
    renew_script: LuaScript

    @property
    def redlock(self) -> Renewer:
        """The nodes it is held on."""

    @property
    def value(self) -> str | None:
        """The value held, ``None`` when not held."""

    @property
    def validity(self) -> float:
        """Seconds it is still safe to rely on."""

    def locked(self) -> bool:
        """Held and still valid."""

    def expired_reason(self) -> str:
        """Why its validity ran out."""

    def release(self) -> bool:
        """Give it back; whether it was still held."""

    def _forget(self) -> None:
        """Drop the hold without telling the nodes (a singleton's hand-back replaced it)."""

    def start_renewal(self, now: float) -> str | None:
        """Hold it for a renewal: ``None``, or the outcome if there is nothing to renew."""

    def renew_part(self) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        """Its keys and arguments in a batch's script call."""

    def apply_renewal(self, tally: Tally, remaining: float, valid_until: float, now: float) -> str:
        """Take the nodes' answers (``tally``) to its renewal; return the outcome."""

    def end_renewal(self) -> None:
        """Let other threads extend or release it again (after :meth:`start_renewal`)."""

    def give_up_call(self) -> Call:
        """Forget the hold; return the call that deletes it wherever it is still its own."""


class HeldLock:
    """A lock registered with the heartbeat, and what is known about it.

    ``weak=True`` (``auto_renew``): held by weak reference, so a lock nobody references expires.
    """

    def __init__(
        self,
        lock: Renewable,
        *,
        task_id: str | None = None,
        progress_timeout: float | None = None,
        on_lost: Callable[[HeldLock, str], None] | None = None,
        weak: bool = False,
    ) -> None:
        now = _clock.monotonic()
        self._strong: Renewable | None = None if weak else lock
        self._weak: weakref.ref[Renewable] | None = weakref.ref(lock) if weak else None
        #: The lock's name (kept for messages once a weakly held lock is gone).
        self.name = lock.name
        self.task_id = task_id
        self.progress_timeout = progress_timeout
        self.on_lost = on_lost
        self.acquired_at = now
        self.last_progress = now
        self.last_renewed = now
        self.next_due = now + lock.ttl * RENEW_AT
        self.lost = False
        self.lost_reason = ""
        #: Why it was lost, for metrics: ``stalled``, ``renewal_failed`` or ``expired``.
        self.lost_code = ""
        self.released = False
        #: Set for a singleton lock: its ttl while queued, for handing it back on retry.
        self.singleton_ttl: float | None = None

    @property
    def lock(self) -> Renewable:
        """The lock (raises ``ReferenceError`` for a weakly held lock already collected)."""
        lock = self.target()
        if lock is None:
            raise ReferenceError("the lock object was garbage-collected")
        return lock

    def target(self) -> Renewable | None:
        """The lock, or ``None`` once a weakly held lock has been collected."""
        return self._strong if self._weak is None else self._weak()

    @property
    def held_for(self) -> float:
        """Seconds since the lock was taken."""
        return _clock.monotonic() - self.acquired_at

    def stalled(self, now: float) -> bool:
        """True when the task has made no progress for ``progress_timeout``."""
        return (
            self.progress_timeout is not None and now - self.last_progress > self.progress_timeout
        )
