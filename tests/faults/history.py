"""What a fault run records on the witness node, and the fencing-aware toy store.

Every critical section leaves one :class:`Section` record. Times are
``time.monotonic()`` readings: CLOCK_MONOTONIC, one clock for every process
on a Linux machine, so the records of different client processes can be
compared with each other and with the nemesis' log.

The witness node is a Redis server outside the lock's node set; the nemesis
never touches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

#: Witness keys of one run.
HISTORY = "faults:history"  # list of encoded Section records
ERRORS = "faults:errors"  # list of tracebacks from client processes
COUNTERS = "faults:counters"  # hash: per-client counters (quorum_unavailable, ...)
STORE_MAX = "faults:store:max"  # the highest token the store accepted
STORE_SEQ = "faults:store:seq"  # order of arrival of writes at the store
PAUSE_TICKET = "faults:pause-ticket"  # one client takes it and becomes the pause victim

# A storage layer that honours fencing tokens, reduced to its core: a write is
# accepted only if its token is at least the highest one accepted so far
# (compare-and-set, atomic because it is one script). Every write, accepted or
# not, gets its place in the order of arrival.
_FENCED_WRITE = """
-- KEYS[1]  the highest token accepted so far
-- KEYS[2]  the arrival counter
-- ARGV[1]  token: the writer's fencing token
-- Returns {accepted (1/0), arrival number}.
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '-1')
local accepted = 0
if token >= highest then
    redis.call('SET', KEYS[1], token)
    accepted = 1
end
return {accepted, redis.call('INCR', KEYS[2])}
"""


class FencedStore:
    """The toy store on the witness node."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._write = client.register_script(_FENCED_WRITE)

    def write(self, token: int) -> tuple[bool, int]:
        """Offer a write carrying ``token``; return (accepted, arrival number)."""
        accepted, arrival = self._write(keys=[STORE_MAX, STORE_SEQ], args=[token])
        return bool(accepted), int(arrival)

    def writes(self) -> int:
        """How many writes reached the store."""
        return int(self._client.get(STORE_SEQ) or 0)


@dataclass(frozen=True, slots=True)
class Section:
    """One critical section as its client saw it.

    Attributes:
        owner: ``c<client>-<n>``: which client, and its n-th section.
        token: the lock's fencing token.
        enter: when the section began (right after ``acquire`` returned).
        exit: when it ended (after the store write, before ``release``).
        validity_at_enter: ``lock.validity`` read right after ``enter``.
        validity_at_exit: ``lock.validity`` read right after ``exit``; > 0
            means the lock was still valid when the section ended.
        valid_until: the instant the client's lock stopped being safe to rely on.
        accepted: whether the fencing store took the section's write.
        arrival: the write's place in the store's order of arrival.
        slow: the section ran a long computation during which the nemesis
            was asked to freeze the process (the "GC pause" case).
        renewals: how many times the client extended the lock during the
            section (a long hold, renewed past several ttls).
    """

    owner: str
    token: int
    enter: float
    exit: float
    validity_at_enter: float
    validity_at_exit: float
    valid_until: float
    accepted: bool
    arrival: int
    slow: bool = False
    renewals: int = 0

    @property
    def valid_at_exit(self) -> bool:
        return self.validity_at_exit > 0

    @property
    def acquired_by(self) -> float:
        """An instant by which the lock was acquired, while no one else could hold it.

        The section's start, unless the client was frozen between ``acquire``
        and ``enter`` for longer than its validity: then the end of validity.
        """
        return min(self.enter, self.valid_until)

    def encode(self) -> str:
        return " ".join(
            (
                self.owner,
                str(self.token),
                repr(self.enter),
                repr(self.exit),
                repr(self.validity_at_enter),
                repr(self.validity_at_exit),
                repr(self.valid_until),
                str(int(self.accepted)),
                str(self.arrival),
                str(int(self.slow)),
                str(self.renewals),
            )
        )

    @classmethod
    def decode(cls, raw: bytes | str) -> Section:
        text = raw.decode() if isinstance(raw, bytes) else raw
        (owner, token, enter, exit_, v_enter, v_exit, until, accepted, arrival, slow, renewals) = (
            text.split()
        )
        return cls(
            owner=owner,
            token=int(token),
            enter=float(enter),
            exit=float(exit_),
            validity_at_enter=float(v_enter),
            validity_at_exit=float(v_exit),
            valid_until=float(until),
            accepted=accepted == "1",
            arrival=int(arrival),
            slow=slow == "1",
            renewals=int(renewals),
        )


def read_history(client: redis.Redis) -> list[Section]:
    """Every section recorded on the witness node."""
    return [Section.decode(raw) for raw in client.lrange(HISTORY, 0, -1)]
