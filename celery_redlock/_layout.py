"""Where celery_redlock keeps things in Redis, and how a lock's value is written.

The one place that knows the key layout and the lock value format; the Lua scripts cite it.
Keys, for a ``key_prefix`` of ``"redlock:"``::

    redlock:{<name>}            a held lock; its value is a LockValue
    redlock:{<name>}:released   pub/sub channel told when the lock is released
    redlock:{<name>}:args       a singleton's call, shown by tools (ArgsPreview)
    redlock:{<name>}:sem        a semaphore's holders: hash, slot number -> LockValue
    redlock:{<name>}:sem:expiry its slots' expiries: sorted set, slot -> node time in ms
    redlock:{<name>}:sem:queue  its waiters: sorted set, waiter id -> ticket
    redlock:{<name>}:sem:waiting  when each waiter's entry lapses: waiter id -> ms
    redlock:{<name>}:sem:released  pub/sub channel told when a slot is given up
    redlock:fence:<n>           fencing bucket n (0 to 1023), shared by every
                                name whose CRC-32 is n modulo 1024
    redlock:done:<task id>      a run of that task id ended (short-lived; see
                                celery_redlock/tasks/features/redelivery.py)
    redlock:{delivery:<task id>}  a lock: a run of that task id waits or runs
                                (redelivery.delivery_name)
    redlock:rate:{<key>}:<alg>       a rate limit's state under one algorithm
    redlock:rate:{<key>}:<alg>:pace  the long-run pace of a fractional fixed/sliding limit
    redlock:rate:{<key>}:<budget>:<alg>[:pace]  the same for a separate budget of the limit
                                     (``publish``: beat's publishes of a task)
    redlock:rate:{<key>}:override    a limit set at run time, replacing the configured one
    redlock:rate:{<key>}:backoff     a pause, and the adaptive rate in force, after the
                                     service behind the limit refused a call
    redlock:debounce:{<name>}        a debounced task key's last publish (a hash, on
                                     the rate limiter's Redis; see debounce_record)

A lock key and its fencing bucket are in different Cluster slots: lock nodes are standalone.
A lock value is ``token``, or ``token|task_id|where`` for a task's (:class:`LockValue`). A
singleton's arguments are a separate key with the lock's ttl, as scripts match on how a value
ends.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = [
    "BEAT",
    "FENCE_BUCKETS",
    "KEY_PREFIX",
    "PREVIEW_CHARS",
    "QUEUED",
    "RATE_PREFIX",
    "ArgsPreview",
    "LockKeys",
    "LockValue",
    "RateKeys",
    "SemaphoreKeys",
    "debounce_record",
    "done_key",
    "ended_key",
    "fence_bucket",
    "glob_escape",
    "lock_keys",
    "lock_name",
    "lock_pattern",
    "period_key",
    "rate_prefix",
    "semaphore_keys",
    "semaphore_name",
    "semaphore_pattern",
]

#: ``where`` of a singleton lock written by its publisher, before a worker starts it.
QUEUED = "queued"
#: ``where`` of a beat tick lock.
BEAT = "beat"

#: The key prefix of locks when none is given (``redlock_key_prefix``).
KEY_PREFIX = "redlock:"

#: Fencing buckets per node and key prefix.
FENCE_BUCKETS = 1024

_SEPARATOR = "|"


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The Redis keys of one lock name."""

    #: The key holding the lock's value.
    lock: str
    #: The fencing bucket the lock's tokens are recorded in (shared with other names).
    fence: str
    #: Channel a release is announced on.
    released: str
    #: A singleton's call, as text (:class:`ArgsPreview`).
    args: str


def lock_keys(prefix: str, name: str) -> LockKeys:
    """The keys of the lock ``name`` under ``prefix``."""
    key = f"{prefix}{{{name}}}"
    return LockKeys(
        lock=key, fence=fence_bucket(prefix, name), released=f"{key}:released", args=f"{key}:args"
    )


@dataclass(frozen=True, slots=True)
class SemaphoreKeys:
    """The Redis keys of one semaphore name (every one with a time to live)."""

    #: Hash: slot number -> the holder's :class:`LockValue`.
    holders: str
    #: Sorted set: slot number -> its expiry, in the node's time (ms).
    expiry: str
    #: Sorted set: waiter id -> ticket; waiters are served in ticket order.
    queue: str
    #: Sorted set: waiter id -> when its queue entry lapses (ms).
    waiting: str
    #: Channel a slot's release is announced on.
    released: str

    @property
    def all(self) -> tuple[str, str, str, str]:
        """The four keys, in the order the ``semaphore_*.lua`` scripts take them."""
        return (self.holders, self.expiry, self.queue, self.waiting)


_SEMAPHORE = ":sem"


def semaphore_keys(prefix: str, name: str) -> SemaphoreKeys:
    """The keys of the semaphore ``name`` under ``prefix``."""
    base = f"{prefix}{{{name}}}{_SEMAPHORE}"
    return SemaphoreKeys(
        holders=base,
        expiry=f"{base}:expiry",
        queue=f"{base}:queue",
        waiting=f"{base}:waiting",
        released=f"{base}:released",
    )


def semaphore_pattern(prefix: str, name_glob: str) -> str:
    """``SCAN MATCH`` pattern for semaphores matching ``name_glob`` (see :func:`semaphore_name`)."""
    return f"{glob_escape(prefix)}{{{name_glob}}}{_SEMAPHORE}"


def semaphore_name(prefix: str, key: str) -> str | None:
    """The semaphore name whose holders ``key`` is, or ``None`` when it is none."""
    return _between(key, f"{prefix}{{", f"}}{_SEMAPHORE}") or None


def fence_bucket(prefix: str, name: str) -> str:
    """The fencing bucket of the lock ``name``: a stable hash of the name, modulo 1024."""
    return f"{prefix}fence:{zlib.crc32(name.encode()) % FENCE_BUCKETS}"


def done_key(prefix: str, task_id: str) -> str:
    """The key telling that a run of ``task_id`` ended (a re-delivered copy is not run)."""
    return f"{prefix}done:{task_id}"


def ended_key(prefix: str, task_id: str, where: str) -> str:
    """The key telling that the worker ended the run of ``task_id`` at ``where``."""
    return f"{prefix}ended:{task_id}{_SEPARATOR}{where}"


def lock_pattern(prefix: str, name_glob: str) -> str:
    """``SCAN MATCH`` pattern for locks matching ``name_glob`` (and more: see :func:`lock_name`)."""
    return f"{glob_escape(prefix)}{{{name_glob}}}"


def lock_name(prefix: str, key: str) -> str | None:
    """The lock name held in ``key``, or ``None`` when ``key`` is not a lock's key."""
    return _between(key, f"{prefix}{{", "}")


def _between(key: str, head: str, tail: str) -> str | None:
    """What ``key`` holds between ``head`` and ``tail``; ``None`` if it is not framed by them."""
    framed = key.startswith(head) and key.endswith(tail) and len(key) >= len(head) + len(tail)
    return key[len(head) : len(key) - len(tail)] if framed else None


def glob_escape(text: str) -> str:
    """``text`` with Redis glob characters escaped, to match it literally."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


_OVERRIDE = ":override"
_BACKOFF = ":backoff"


@dataclass(frozen=True, slots=True)
class RateKeys:
    """Where rate-limit state lives: ``<prefix>{<key>}:<suffix>``, one Cluster slot per limit."""

    prefix: str

    def state(self, key: str, algorithm: str, budget: str | None = None) -> str:
        """The key holding the state of limit ``key`` (or of its ``budget``) under ``algorithm``."""
        where = algorithm if budget is None else f"{budget}:{algorithm}"
        return f"{self.prefix}{{{key}}}:{where}"

    def pace(self, key: str, algorithm: str, budget: str | None = None) -> str:
        """The pace of limit ``key`` under ``algorithm`` (fractional fixed/sliding rates)."""
        return f"{self.state(key, algorithm, budget)}:pace"

    def override(self, key: str) -> str:
        """The hash holding the run-time override of limit ``key``, if any."""
        return f"{self.prefix}{{{key}}}{_OVERRIDE}"

    def backoff(self, key: str) -> str:
        """The hash holding the pause and the adaptive rate of limit ``key``, if any."""
        return f"{self.prefix}{{{key}}}{_BACKOFF}"

    def override_pattern(self) -> str:
        """``SCAN MATCH`` pattern for overrides (and more: filter by :meth:`override_key_name`)."""
        return f"{glob_escape(self.prefix)}{{*}}{_OVERRIDE}"

    def override_key_name(self, redis_key: str) -> str | None:
        """The limit key whose override ``redis_key`` is, or ``None`` if it is none."""
        return _between(redis_key, f"{self.prefix}{{", f"}}{_OVERRIDE}") or None

    def pattern(self, key_glob: str, algorithm: str) -> str:
        """A ``SCAN MATCH`` pattern for the state keys of limits matching ``key_glob``."""
        return f"{glob_escape(self.prefix)}{{{key_glob}}}:{glob_escape(algorithm)}"

    def limit_key(self, state_key: str, algorithm: str) -> str | None:
        """The limit's key in a state key of ``algorithm``; ``None`` if it is not one."""
        return _between(state_key, f"{self.prefix}{{", f"}}:{algorithm}")


def debounce_record(prefix: str, name: str) -> str:
    """The hash holding the last publish of the debounced key ``name``.

    Fields (``debounce_publish.lua`` writes, ``debounce_check.lua`` reads): ``id``, ``seq`` (node
    µs, strictly increasing per key), ``due`` (node µs), and ``prev_*``, restored if the last
    publish's message could not be sent.
    """
    return f"{prefix}debounce:{{{name}}}"


def period_key(key: str, period: float) -> str:
    """The limit key of one of several rates a task counts on one key: ``"api/s"``, ``"api/2s"``."""
    for unit, seconds in (("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0)):
        if period == seconds:
            return f"{key}/{unit}"
    return f"{key}/{period:.12g}s"


def rate_prefix(lock_prefix: str) -> str:
    """The rate limiter's key prefix for an app whose locks use ``lock_prefix``."""
    return f"{lock_prefix}rate:"


#: The rate limiter's key prefix when none is given.
RATE_PREFIX = rate_prefix(KEY_PREFIX)


@dataclass(frozen=True, slots=True)
class LockValue:
    """A lock's value: a random token, and for a task's lock, who holds it; ``str()`` to write."""

    token: str
    task_id: str | None = None
    #: ``host:pid`` of the running process, :data:`QUEUED` or :data:`BEAT`.
    where: str | None = None

    def __str__(self) -> str:
        return LockValue.compose(self.token, self.owner)

    @property
    def owner(self) -> str | None:
        """``task_id|where``, the part after the token; ``None`` for a bare token."""
        if self.task_id is None:
            return None
        return LockValue.owner_text(self.task_id, self.where or "")

    @classmethod
    def parse(cls, text: str | bytes | None) -> LockValue | None:
        """Read a value written by :meth:`__str__`; ``None`` for ``None`` or empty."""
        if not text:
            return None
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        parts = text.split(_SEPARATOR, 2)
        if len(parts) < 3:  # a bare token, or a free-text owner without a place
            return cls(*parts)
        return cls(parts[0], parts[1], parts[2] or None)

    @staticmethod
    def compose(token: str, owner: str | None) -> str:
        """The value for ``token`` and a free-text ``owner`` (``task_id|where``, or none)."""
        return token if owner is None else f"{token}{_SEPARATOR}{owner}"

    @staticmethod
    def owner_of(value: str) -> str | None:
        """The ``owner`` a value was composed with (:meth:`compose`'s inverse)."""
        _, bar, owner = value.partition(_SEPARATOR)
        return owner if bar else None

    @staticmethod
    def ending(owner: str) -> str:
        """The end of every value written with ``owner`` (``|owner``)."""
        return f"{_SEPARATOR}{owner}"

    @staticmethod
    def owner_text(task_id: str, where: str) -> str:
        """The owner part of the value of a lock held for ``task_id`` at ``where``."""
        return f"{task_id}{_SEPARATOR}{where}"

    @staticmethod
    def suffix(task_id: str, where: str) -> str:
        """``|id|where``: ``acquire.lua`` takes over a value ending so (a publisher's singleton)."""
        return LockValue.ending(LockValue.owner_text(task_id, where))


#: Longest text of a singleton's arguments kept beside its lock.
PREVIEW_CHARS = 120


@dataclass(frozen=True, slots=True)
class ArgsPreview:
    """A singleton's call as text, and its task id.

    The key may outlive its run: the id tells the current holder's preview from an earlier one's.
    """

    task_id: str
    text: str

    def __str__(self) -> str:
        return f"{self.task_id}{_SEPARATOR}{self.text[:PREVIEW_CHARS]}"

    @classmethod
    def parse(cls, raw: str | bytes | None) -> ArgsPreview | None:
        """Read a value written by :meth:`__str__`; ``None`` for anything else."""
        if not raw:
            return None
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        task_id, separator, text = raw.partition(_SEPARATOR)
        return cls(task_id, text) if separator and task_id else None
