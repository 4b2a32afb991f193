"""Fencing tokens: proposed by the client, checked and recorded by a majority.

Tokens are microseconds on the nodes' clocks, kept in 1,024 buckets per node; a missing bucket
reads as the node's ``TIME``. The nodes' clocks bound every token, so the client's own estimate
(:class:`FenceClock`) only saves a second round trip. The protocol and why tokens only increase:
docs/reliability.md, "Fencing tokens".
"""

from __future__ import annotations

from .. import _clock

__all__ = ["MAX_TOKEN", "RATE_MARGIN", "FenceClock", "ahead_us", "token_for"]

#: How much faster than a node's clock the client's may run (1000 ppm, past any NTP slew): the
#: estimate is lowered by it. A faster clock costs a second round, never a token ahead.
RATE_MARGIN = 1e-3

#: Largest integer a Lua number (a double) holds exactly.
MAX_TOKEN = 2**53


class FenceClock:
    """What one client knows to propose tokens: the nodes' clocks and its last token.

    The ``TIME`` in each acquire reply is kept as an offset from ``time.monotonic``: a lower
    bound of the largest node clock, with no wall-clock arithmetic.
    """

    def __init__(self) -> None:
        # (largest node clock in µs, monotonic instant seen), replaced whole for threads.
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

        Not locked: a race may keep the smaller one, costing a round trip; the buckets, not
        this hint, make tokens increase.
        """
        if token > self._last:
            self._last = token


def ahead_us(lead_us: int) -> int:
    """How far past a node's clock a proposal may be recorded: twice the lead.

    An honest proposal then fits a node lagging the largest clock by up to the lead.
    """
    return 2 * lead_us


def token_for(
    proposal: int, highest_fence: int, recorded: int, quorum: int, ceiling: int
) -> tuple[int, bool]:
    """The token an acquisition may hand out, and whether it needs no second round.

    The proposal stands only above every answering bucket (``highest_fence``; equal may be
    issued already) and ``recorded`` on a quorum; else it is capped at ``ceiling`` (largest node
    clock plus :func:`ahead_us`) and raised past ``highest_fence``.
    """
    if highest_fence < proposal and recorded >= quorum:
        return proposal, True
    return max(min(proposal, ceiling), highest_fence + 1), False
