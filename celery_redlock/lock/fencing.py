"""Fencing tokens: proposed by the client, checked and recorded by a majority.

A token is an integer on the scale of the nodes' clocks, in microseconds.
Each node keeps, per *bucket* (:func:`~.._layout.fence_bucket`: 1,024 per
node, shared by the names that hash to them), the largest token recorded
there; a bucket that does not exist reads as the node's ``TIME``. One
acquisition:

1. The client proposes ``P = max(last token it issued + 1, its estimate of
   the largest node clock + lead)`` (:class:`FenceClock`). ``acquire.lua``
   takes the lock, returns the bucket's value ``F`` and the node's time
   ``T``, and, when it granted the lock and ``F < P <= T + ahead``
   (:func:`ahead_us`), records ``P``.
2. If every node that answered (granting or not) had ``F < P``, and a
   majority granted and recorded ``P``, it is the token. One round trip.
3. Otherwise ``P' = max(min(P, largest T + ahead), largest F + 1)`` is
   written to every node (``fence_raise.lua``) and becomes the token once a
   majority holds a value >= ``P'``. Two round trips.

So a token is never more than ``ahead`` past the largest node clock (plus one
per second round), whatever the client's own clock does: the client's
estimate only saves the second round trip.

Why tokens for one name only increase: docs/reliability.md, *Fencing tokens*.
"""

from __future__ import annotations

from .. import _clock

__all__ = ["MAX_TOKEN", "RATE_MARGIN", "FenceClock", "ahead_us", "token_for"]

#: The client's monotonic clock may run faster than a node's clock by up to
#: this fraction (1000 ppm, more than any crystal or NTP slew); the estimate
#: is lowered by it so that a proposal stays within what the nodes record in
#: one round trip. A clock that runs faster still costs a second round, never
#: a token ahead of the nodes' clocks: they bound it (:func:`ahead_us`).
RATE_MARGIN = 1e-3

#: Largest integer a Lua number (a double) holds exactly.
MAX_TOKEN = 2**53


class FenceClock:
    """What one client knows to propose tokens: the nodes' clocks and its last token.

    The nodes' clocks are learned from the ``TIME`` that every acquire reply
    carries, as an offset from ``time.monotonic``: the client does no
    wall-clock arithmetic. The estimate is a lower bound of the largest clock
    among the nodes that answered last: their ``TIME`` was read before the
    reply arrived.
    """

    def __init__(self) -> None:
        # (largest node clock seen in µs, the monotonic instant it was seen):
        # replaced as a whole, so threads never see half an update.
        self._seen: tuple[float, float] | None = None
        self._last = 0  # the largest token this client issued

    def propose(self, lead_us: int) -> int:
        """The token to propose now: past the last one, and ``lead_us`` ahead of the nodes."""
        proposal = self._last + 1
        seen = self._seen
        if seen is not None:
            node_us, seen_at = seen
            elapsed_us = (_clock.monotonic() - seen_at) * 1e6 * (1 - RATE_MARGIN)
            proposal = max(proposal, int(node_us + elapsed_us) + lead_us)
        return min(proposal, MAX_TOKEN)

    def observe(self, node_time_us: int, received_at: float) -> None:
        """Learn the largest node clock of one round's replies, received by ``received_at``."""
        self._seen = (float(node_time_us), received_at)

    def issued(self, token: int) -> None:
        """Remember a token handed out, so the next proposal exceeds it.

        Not locked: two threads issuing at once may keep the smaller one.
        That costs at most a second round trip, never a token: the buckets,
        not this hint, make tokens increase.
        """
        if token > self._last:
            self._last = token


def ahead_us(lead_us: int) -> int:
    """How far past a node's clock a proposal made with ``lead_us`` may be recorded.

    Twice the lead: an honest client's proposal fits on a node whose clock
    lags the largest by up to the lead (a node timeout, 50 ms by default).
    """
    return 2 * lead_us


def token_for(
    proposal: int, highest_fence: int, recorded: int, quorum: int, ceiling: int
) -> tuple[int, bool]:
    """The token an acquisition may hand out, and whether it needs no second round.

    ``highest_fence`` is the largest bucket value among every node that
    answered, granting or not: a value equal to the proposal means it may
    already have been issued, so only a proposal above it stands as it is,
    and only if ``recorded`` (the granting nodes that recorded it) reaches
    the ``quorum``. Otherwise the token is raised past ``highest_fence``, but
    the proposal counts only up to ``ceiling``: the largest node clock
    reported plus :func:`ahead_us`.
    """
    if highest_fence < proposal and recorded >= quorum:
        return proposal, True
    return max(min(proposal, ceiling), highest_fence + 1), False
