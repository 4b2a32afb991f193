"""Redlock: a lock held by a majority of N independent Redis masters.

:class:`Redlock` knows the nodes and does what concerns many locks or one it does not hold
(batched renewal, inspection, cleanup by owner); :class:`~.lock.Lock` is one named lock. The
algorithm is redis.io's, with the corrections implementations tend to miss (validity from each
attempt's own start, failed attempts undone on every node, compare-and-set scripts, fencing):
docs/reliability.md, "What the lock guarantees".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis
from redis.exceptions import ResponseError

from .._layout import KEY_PREFIX, LockKeys, LockValue, lock_keys, semaphore_keys
from .._scripts import load
from .._validators import (
    MAX_NODE_TIMEOUT,
    MAX_TTL,
    MIN_FENCE_TTL,
    MIN_NODE_TIMEOUT,
    fraction,
    seconds,
    text,
)
from ..errors import ConfigurationError
from ..transport.nodes import Call, Command, Node, NodeFailure, fan_out, make_nodes
from . import renewal_batch
from .fencing import FenceClock
from .held_lease import Renewable
from .lock import Lock
from .quorum import BUSY, LOST, RENEWED, UNREACHABLE, failed, reply
from .semaphore import Semaphore
from .semaphore_slots import RELEASE_OWNER as _SEM_RELEASE_OWNER

__all__ = ["BUSY", "LOST", "RENEWED", "UNREACHABLE", "Lock", "Redlock", "Semaphore"]

logger = logging.getLogger("celery_redlock.lock")

_RELEASE_OWNER = load("release_owner")
_INSPECT = load("inspect")

#: Defaults, seconds, of ``default_ttl`` and ``node_timeout`` and of their ``redlock_*`` settings.
DEFAULT_TTL = 60.0
DEFAULT_NODE_TIMEOUT = 0.05
#: Longest retry_delay, seconds.
_MAX_RETRY_DELAY = 3600.0


class Redlock:
    """A set of independent Redis masters that grant locks by majority.

    Args:
        nodes: Redis URLs (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``) or
            ``redis.Redis`` clients of standalone servers (not Cluster); an odd number is best.
        key_prefix: prepended to every key, to keep apps apart.
        default_ttl: lock ttl when :meth:`lock` is given none, seconds (at most a year).
        node_timeout: longest wait for one node, seconds, 1 ms to 60 s; keep it far below the ttl.
        retry_delay: mean pause between attempts of a blocking acquire with no release notice,
            seconds (jittered ±50 %).
        fence_ttl: how long a fencing bucket outlives its last raise, seconds, an hour to a
            year; expiry is harmless (docs/reliability.md, "Fencing tokens").
        drift_factor: clock drift allowance, a fraction of the ttl in [0, 0.5).

    Example::

        redlock = Redlock(["redis://r1:6379/0", "redis://r2:6379/0", "redis://r3:6379/0"])
        with redlock.lock("invoice:42", ttl=30.0) as lock:
            store.write(invoice, fencing_token=lock.fencing_token)

    Safe to share between threads; after ``fork()`` a child opens its own connections.
    """

    def __init__(
        self,
        nodes: Sequence[str | redis.Redis] | str | redis.Redis,
        *,
        key_prefix: str = KEY_PREFIX,
        default_ttl: float = DEFAULT_TTL,
        node_timeout: float = DEFAULT_NODE_TIMEOUT,
        retry_delay: float = 0.2,
        fence_ttl: float = 30 * 24 * 3600.0,
        drift_factor: float = 0.01,
    ) -> None:
        self.node_timeout = seconds(
            node_timeout, "node_timeout", minimum=MIN_NODE_TIMEOUT, maximum=MAX_NODE_TIMEOUT
        )
        self.default_ttl = seconds(default_ttl, "default_ttl", maximum=MAX_TTL)
        self.retry_delay = seconds(retry_delay, "retry_delay", maximum=_MAX_RETRY_DELAY)
        self.fence_ttl = seconds(fence_ttl, "fence_ttl", minimum=MIN_FENCE_TTL, maximum=MAX_TTL)
        self.key_prefix = text(key_prefix, "key_prefix")
        self.drift_factor = fraction(drift_factor, "drift_factor", below=0.5)
        self.nodes: list[Node] = make_nodes(nodes, self.node_timeout)  # type: ignore[arg-type]
        self.quorum = len(self.nodes) // 2 + 1
        self.fence_clock = FenceClock()

    def __repr__(self) -> str:
        names = ", ".join(node.name for node in self.nodes)
        return f"Redlock([{names}], quorum={self.quorum})"

    def lock(
        self,
        name: str,
        ttl: float | None = None,
        *,
        timeout: float | None = None,
        owner: str | None = None,
        replaces: str | None = None,
        token: str | None = None,
        auto_renew: bool = False,
    ) -> Lock:
        """Return a :class:`Lock` for ``name`` (not yet acquired).

        Args:
            name: the lock's name; any non-empty string.
            ttl: seconds the lock lives unless extended (default ``default_ttl``).
            timeout: how long ``acquire()`` and ``with`` wait by default; ``None``: as long
                as it takes, ``0``: not at all.
            owner: free text stored beside the token (e.g. a task id), shown when listing locks.
            replaces: take over from a holder whose value ends with this text, as if free (a
                worker taking the singleton lock its publisher wrote).
            token: the :attr:`Lock.value` of an acquisition made elsewhere, to extend or
                release it here; its validity is unknown until ``extend()`` confirms it.
            auto_renew: renew from the process heartbeat (about every third of the ttl) until
                ``release()``; held by weak reference, so a dropped lock simply expires.

        Example::

            lock = redlock.lock("report", ttl=30.0, auto_renew=True)
            with lock:
                build_report()   # may run longer than 30 s
        """
        return Lock(
            self,
            name,
            self.default_ttl if ttl is None else ttl,
            timeout,
            owner,
            replaces=replaces,
            token=token,
            auto_renew=auto_renew,
        )

    def semaphore(
        self,
        name: str,
        limit: int,
        ttl: float | None = None,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        owner: str | None = None,
        auto_renew: bool = False,
    ) -> Semaphore:
        """Return a :class:`Semaphore` of ``limit`` slots for ``name`` (none taken yet).

        Args:
            name: the semaphore's name (its keys never collide with a lock's of that name).
            limit: how many holders at once, 1 to 100000.
            ttl: seconds a slot lives unless extended (default ``default_ttl``).
            timeout: as for :meth:`lock`.
            blocking: whether ``acquire()`` and ``with`` wait by default.
            owner: free text beside the token (``task_id|host:pid`` for a task), matched by
                :meth:`release_semaphore_owner`.
            auto_renew: as for :meth:`lock`.

        Example::

            exports = redlock.semaphore("exports:acme", limit=3, ttl=30.0)
            with exports:
                run_export()   # at most 3 of these at once, everywhere
        """
        return Semaphore(
            self,
            name,
            limit,
            self.default_ttl if ttl is None else ttl,
            timeout,
            owner,
            blocking=blocking,
            auto_renew=auto_renew,
        )

    def renew(self, leases: Sequence[Renewable]) -> list[str]:
        """Extend many held locks and slots at once: :func:`.renewal_batch.renew`."""
        return renewal_batch.renew(self, leases)

    def inspect(self, name: str) -> list[tuple[str | None, float] | NodeFailure]:
        """Per node, ``(value or None, seconds_left)`` for lock ``name``, or a ``NodeFailure``."""
        call = Call(_INSPECT, (self.key(name),), ())
        found: list[tuple[str | None, float] | NodeFailure] = []
        for node, result in zip(
            self.nodes,
            fan_out(self.nodes, [[call]] * len(self.nodes), self.node_timeout),
            strict=True,
        ):
            if isinstance(result, NodeFailure):
                found.append(result)
            elif isinstance(result[0], ResponseError):
                found.append(NodeFailure(node.name, result[0]))
            else:
                value, pttl = result[0]
                shown = value.decode("utf-8", "replace") if value else None
                found.append((shown, max(int(pttl), 0) / 1000.0))
        return found

    def holder(self, name: str) -> str | None:
        """The value (``token|owner``) a majority of nodes hold for ``name``, or ``None``."""
        counts: dict[str, int] = {}
        for entry in self.inspect(name):
            if not isinstance(entry, NodeFailure) and entry[0] is not None:
                counts[entry[0]] = counts.get(entry[0], 0) + 1
        for value, count in counts.items():
            if count >= self.quorum:
                return value
        return None

    def release_owner(self, name: str, task_id: str, where: str | None = None) -> int:
        """Force-release ``name`` if one exact run of a task holds it; return nodes freed.

        For a worker cleaning up after a dead task process: it knows the run (task id and
        ``where``, the ``host:pid`` in the value), not the token. A re-delivered copy elsewhere
        has another ``where`` and is never freed. The singleton's argument preview goes too.

        Raises:
            ConfigurationError: ``where`` not given (the task id alone would free a live copy).
        """
        task_id = text(task_id, "task_id", empty=False)
        if where is None:
            raise ConfigurationError(
                "where",
                f"release_owner({name!r}, {task_id!r}) needs the host:pid of the run "
                "to free: the task id alone would also free a re-delivered copy running "
                "elsewhere",
            )
        where = text(where, "where", empty=False)
        keys = self.keys(name)
        owner = LockValue.suffix(task_id, where)
        call = Call(_RELEASE_OWNER, (keys.lock, keys.args), (owner, keys.released))
        freed = 0
        for result in fan_out(self.nodes, [[call]] * len(self.nodes), self.node_timeout):
            answer = reply(result)
            freed += not failed(answer) and int(answer) == 1
        return freed

    def release_semaphore_owner(self, name: str, task_id: str, where: str) -> int:
        """:meth:`release_owner` for semaphore slots; returns slots freed, summed over nodes."""
        task_id = text(task_id, "task_id", empty=False)
        where = text(where, "where", empty=False)
        keys = semaphore_keys(self.key_prefix, text(name, "name", empty=False))
        call = Call(
            _SEM_RELEASE_OWNER,
            (keys.holders, keys.expiry),
            (LockValue.suffix(task_id, where), keys.released),
        )
        freed = 0
        for result in fan_out(self.nodes, [[call]] * len(self.nodes), self.node_timeout):
            answer = reply(result)
            freed += 0 if failed(answer) else int(answer)
        return freed

    def fencing_value(self, name: str) -> int | None:
        """The largest value answering nodes hold in ``name``'s fencing bucket, or ``None``.

        At least ``name``'s last token (the bucket is shared), below its next one.
        """
        return self.fencing_values([name]).get(name)

    def fencing_values(self, names: Sequence[str]) -> dict[str, int]:
        """:meth:`fencing_value` for many names: one round trip per node."""
        buckets = sorted({self.keys(name).fence for name in names})
        if not buckets:
            return {}
        command = Command(("MGET", *buckets))
        best: dict[str, int] = {}
        for result in fan_out(self.nodes, [[command]] * len(self.nodes), self.node_timeout):
            answer = reply(result)
            if failed(answer):
                continue
            for bucket, raw in zip(buckets, answer, strict=True):
                if raw is not None and raw.isdigit():
                    best[bucket] = max(best.get(bucket, 0), int(raw))
        found = {}
        for name in names:
            bucket = self.keys(name).fence
            if bucket in best:
                found[name] = best[bucket]
        return found

    def close(self) -> None:
        """Close every connection this instance opened."""
        for node in self.nodes:
            node.close()

    # -- key layout (see :mod:`.._layout`) -------------------------------------

    def keys(self, name: str) -> LockKeys:
        """The Redis keys of the lock called ``name``."""
        return lock_keys(self.key_prefix, name)

    def key(self, name: str) -> str:
        """The Redis key that holds the lock called ``name``."""
        return self.keys(name).lock
