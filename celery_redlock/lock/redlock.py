"""Redlock: a lock held by a majority of N independent Redis masters.

:class:`Redlock` knows the nodes, and does what concerns many locks or a
lock it does not hold (batched renewal, inspection, cleanup by owner);
:class:`~celery_redlock.lock.lock.Lock` is one named lock that can be acquired,
extended and released. The algorithm is the one described at
https://redis.io/docs/latest/develop/use/patterns/distributed-locks/ with the
corrections that implementations of it tend to miss:

* every attempt gets a fresh random token and measures its validity from its
  own start on the monotonic clock: ``validity = ttl - elapsed - drift``,
  ``drift = 1 % of ttl + 2 ms``; an attempt left with no validity failed;
* all nodes are asked at once, each for at most ``node_timeout``;
* a failed attempt is undone on *every* node (a node that timed out may still
  have set the key) before the next try;
* extend and release are compare-and-set Lua scripts: they never touch a key
  that another owner holds, and put a missing key back only while the lock
  is valid (so that it regains nodes that were down when it was taken);
* waiters are woken by the release (pub/sub), not only by polling;
* each acquisition carries a fencing token, larger than every earlier one
  for the same name, kept in a bounded set of keys per node (:mod:`.fencing`).
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

#: ``default_ttl`` and ``node_timeout`` when none is given, seconds: the
#: ``redlock_default_ttl`` and ``redlock_node_timeout`` settings' defaults too.
DEFAULT_TTL = 60.0
DEFAULT_NODE_TIMEOUT = 0.05
#: Longest retry_delay, seconds.
_MAX_RETRY_DELAY = 3600.0


class Redlock:
    """A set of independent Redis masters that grant locks by majority.

    Args:
        nodes: Redis URLs (``redis://``, ``rediss://``, ``unix://``, with
            credentials if needed) or ``redis.Redis`` clients. One node gives a
            plain single-instance lock; an odd number (3, 5) is recommended.
            Each must be a standalone Redis server (not a Redis Cluster).
        key_prefix: prepended to every key, to keep apps apart.
        default_ttl: lock time to live when :meth:`lock` is given none, seconds
            (at most a year).
        node_timeout: longest wait for any one node, seconds, from 1 ms to
            60 s. Keep it far below the ttl; a paused node costs an attempt at
            most this much.
        retry_delay: mean pause between attempts of a blocking acquire when no
            release notification arrives, seconds (jittered ±50 %).
        fence_ttl: how long a fencing bucket is kept after it was last raised,
            seconds, from an hour to a year. Its expiry is harmless: a missing
            bucket reads as the node's clock (see docs/reliability.md).
        drift_factor: clock drift allowance, a fraction of the ttl in [0, 0.5).

    Example::

        redlock = Redlock(["redis://r1:6379/0", "redis://r2:6379/0", "redis://r3:6379/0"])
        with redlock.lock("invoice:42", ttl=30.0) as lock:
            store.write(invoice, fencing_token=lock.fencing_token)

    One instance is safe to share between threads, and survives ``fork()``:
    a child process opens its own connections.
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
            timeout: how long ``acquire()`` and ``with`` wait by default;
                ``None`` waits as long as it takes, ``0`` does not wait.
            owner: free text stored beside the token (e.g. a task id), shown
                by tools that list held locks.
            replaces: take the lock over from a holder whose value ends with
                this text, as if it were free (how a worker takes over the
                singleton lock its publisher wrote).
            token: the :attr:`Lock.value` of an acquisition made elsewhere
                (another object or process), to extend or release it from
                here. Its validity is unknown until ``extend()`` confirms it.
            auto_renew: renew the lock from the process heartbeat while it is
                held (about every third of its ttl), until ``release()``. The
                heartbeat holds it by weak reference: a lock object dropped
                without ``release()`` stops being renewed and expires.

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
            name: the semaphore's name; any non-empty string (its keys do not
                collide with a lock of the same name).
            limit: how many holders at once, 1 to 100000.
            ttl: seconds a slot lives unless extended (default ``default_ttl``).
            timeout: how long ``acquire()`` and ``with`` wait by default;
                ``None`` waits as long as it takes, ``0`` does not wait.
            blocking: whether ``acquire()`` and ``with`` wait by default.
            owner: free text stored beside the token (``task_id|host:pid`` for
                a task), shown by ``celery redlock locks`` and matched by
                :meth:`release_semaphore_owner`.
            auto_renew: renew the slot from the process heartbeat while it is
                held, until ``release()`` (by weak reference, as for locks).

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
        """What each node holds for lock ``name``: ``(value, seconds_left)``.

        ``value`` is ``None`` where the key is absent. Nodes that did not
        answer are reported as :class:`NodeFailure`.
        """
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
        """The value a majority of nodes hold for ``name``, or ``None``.

        The value is ``token|owner`` as written by :meth:`Lock.acquire`.
        """
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

        For a worker's main process cleaning up after a task process that
        died or was killed: it knows the run (its task id and ``where``, the
        ``host:pid`` the value was written with), not the lock's token. A
        later run of the same task id elsewhere (a re-delivered copy) has
        another ``where`` and is never freed. The lock's argument preview
        (a singleton's) is deleted with it.

        Raises:
            ConfigurationError: ``where`` not given. The task id alone cannot
                tell the dead run from a live copy of it.
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
        """Give up every slot of semaphore ``name`` one exact run of a task holds.

        :meth:`release_owner` for semaphores: ``where`` is the ``host:pid``
        the slot's owner was written with (``owner=f"{task_id}|{where}"``), so
        a later run of the same task id elsewhere keeps its slot. Returns the
        slots freed, summed over the nodes (a slot held on 3 nodes counts 3);
        waiters are woken.
        """
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
        """The largest fencing value the answering nodes hold for ``name``'s bucket.

        At least the last token issued for ``name``; the next one will be
        larger. The bucket is shared with other names, so this is not the
        name's last token itself. ``None`` when no answering node has one.
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
