"""Redlock: a lock held by a majority of N independent Redis masters.

:class:`Redlock` knows the nodes; :class:`Lock` is one named lock that can be
acquired, extended and released. The algorithm is the one described at
https://redis.io/docs/latest/develop/use/patterns/distributed-locks/ with the
corrections that implementations of it tend to miss:

* every attempt gets a fresh random token and measures its validity from its
  own start on the monotonic clock: ``validity = ttl - elapsed - drift``,
  ``drift = 1 % of ttl + 2 ms``; an attempt left with no validity failed;
* all nodes are asked at once, each for at most ``node_timeout``;
* a failed attempt is undone on *every* node (a node that timed out may still
  have set the key) before the next try;
* extend and release are compare-and-set Lua scripts: they never touch a key
  that another owner holds, and extend never re-creates an expired key;
* waiters are woken by the release (pub/sub), not only by polling;
* each acquisition carries a fencing token, larger than every earlier one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import redis
from redis.exceptions import RedisError, ResponseError

from . import _clock
from ._nodes import Call, Node, NodeFailure, NodeResult, fan_out, make_nodes
from ._scripts import load
from .errors import (
    ConfigurationError,
    LockLost,
    LockNotAcquired,
    QuorumUnavailable,
    RedlockError,
)

__all__ = ["Lock", "Redlock"]

logger = logging.getLogger("celery_redlock.lock")

_ACQUIRE = load("acquire")
_RELEASE = load("release")
_EXTEND = load("extend")
_FENCE_RAISE = load("fence_raise")
_RELEASE_OWNER = load("release_owner")
_INSPECT = load("inspect")

#: Outcomes of :meth:`Redlock.renew` for one lock.
RENEWED, LOST, UNREACHABLE, BUSY = "renewed", "lost", "unreachable", "busy"

#: Quick retries right after a release notification, in seconds: the other
#: nodes' releases may still be a moment behind the one that woke us.
_AFTER_WAKE_DELAYS = (0.0005, 0.001, 0.002, 0.004)

#: A blocking acquire gives up with QuorumUnavailable after this many attempts
#: in a row without a majority answering. One miss can be a node stalled for
#: a moment next to one that is down; a few in a row are an outage.
_QUORUM_ATTEMPTS = 3


def _positive_seconds(value: Any, option: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{option}: expected a number of seconds, got {value!r}", option=option
        )
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(
            f"{option}: must be a finite number of seconds {bound}, got {value!r}", option=option
        )
    return seconds


class Redlock:
    """A set of independent Redis masters that grant locks by majority.

    Args:
        nodes: Redis URLs (``redis://``, ``rediss://``, ``unix://``, with
            credentials if needed) or ``redis.Redis`` clients. One node gives a
            plain single-instance lock; an odd number (3, 5) is recommended.
        key_prefix: prepended to every lock name, to keep apps apart.
        default_ttl: lock time to live when :meth:`lock` is given none, seconds.
        node_timeout: longest wait for any one node, seconds. Keep it far below
            the ttl; a paused node costs an attempt at most this much.
        retry_delay: mean pause between attempts of a blocking acquire when no
            release notification arrives, seconds (jittered ±50 %).
        fence_ttl: how long a key's fencing counter survives without use, seconds.
            Tokens only increase while the key is used at least this often.

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
        key_prefix: str = "redlock:",
        default_ttl: float = 30.0,
        node_timeout: float = 0.05,
        retry_delay: float = 0.2,
        fence_ttl: float = 30 * 24 * 3600.0,
        drift_factor: float = 0.01,
    ) -> None:
        self.node_timeout = _positive_seconds(node_timeout, "node_timeout")
        self.default_ttl = _positive_seconds(default_ttl, "default_ttl")
        self.retry_delay = _positive_seconds(retry_delay, "retry_delay")
        self.fence_ttl = _positive_seconds(fence_ttl, "fence_ttl")
        if not isinstance(key_prefix, str):
            raise ConfigurationError(
                f"key_prefix: expected a string, got {key_prefix!r}", option="key_prefix"
            )
        if not isinstance(drift_factor, float | int) or not 0 <= drift_factor < 0.5:
            raise ConfigurationError(
                f"drift_factor: expected a fraction in [0, 0.5), got {drift_factor!r}",
                option="drift_factor",
            )
        self.key_prefix = key_prefix
        self.drift_factor = float(drift_factor)
        self.nodes: list[Node] = make_nodes(nodes, self.node_timeout)  # type: ignore[arg-type]
        self.quorum = len(self.nodes) // 2 + 1

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
        """
        lock = Lock(self, name, self.default_ttl if ttl is None else ttl, timeout, owner)
        lock.replaces = replaces or ""
        return lock

    def renew(self, locks: Sequence[Lock]) -> list[str]:
        """Extend many held locks at once: one pipelined round trip per node.

        Each lock is renewed to its own ttl, with the rules of
        :meth:`Lock.extend`, except that a lock is not given up while its
        validity lasts merely because too few nodes *answered*. Returns, per
        lock, ``RENEWED``; ``LOST`` (expired, or a majority no longer holds
        it: it has been given up); ``UNREACHABLE`` (too few nodes answered,
        still valid: try again soon); or ``BUSY`` (another thread is
        extending or releasing it right now).
        """
        outcomes = [BUSY] * len(locks)
        taken: list[int] = []
        calls: list[list[Call]] = [[] for _ in self.nodes]
        try:
            for position, lock in enumerate(locks):
                if not lock._mutex.acquire(blocking=False):
                    continue
                taken.append(position)
                value = lock._value
                if value is None or lock.validity <= 0:
                    outcomes[position] = LOST
                    continue
                call = Call(_EXTEND, (lock.key,), (value, _ms(lock.ttl)))
                for node_calls in calls:
                    node_calls.append(call)
                outcomes[position] = ""
            pending = [position for position in taken if outcomes[position] == ""]
            started = _clock.monotonic()
            results = fan_out(self.nodes, calls, self.node_timeout) if pending else []
            finished = _clock.monotonic()
            for slot, position in enumerate(pending):
                lock = locks[position]
                answered = confirmed = 0
                for result in results:
                    reply = _reply(result, slot)
                    if not _failed(reply):
                        answered += 1
                        confirmed += int(reply) == 1
                remaining = _clock.validity(lock.ttl, started, finished, self.drift_factor)
                if confirmed >= self.quorum and remaining > 0:
                    lock._valid_until = (
                        started + lock.ttl - _clock.drift(lock.ttl, self.drift_factor)
                    )
                    outcomes[position] = RENEWED
                elif answered < self.quorum and lock.validity > 0:
                    outcomes[position] = UNREACHABLE
                else:
                    outcomes[position] = LOST
            for position in taken:
                lock = locks[position]
                if outcomes[position] == LOST and lock._value is not None:
                    value = lock._value
                    lock._forget()
                    lock._release_value(value, notify=True)
        finally:
            for position in taken:
                locks[position]._mutex.release()
        return outcomes

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
                found.append((value.decode() if value else None, max(int(pttl), 0) / 1000.0))
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

    def release_owner(self, name: str, task_id: str) -> int:
        """Force-release ``name`` if the task ``task_id`` owns it; return nodes freed.

        For a worker's main process cleaning up after a task process that
        died or was killed: it knows the task id, not the lock's token.
        """
        call = Call(_RELEASE_OWNER, (self.key(name),), (task_id, self._channel(name)))
        return _confirmed(fan_out(self.nodes, [[call]] * len(self.nodes), self.node_timeout))

    def close(self) -> None:
        """Close every connection this instance opened."""
        for node in self.nodes:
            node.close()

    # -- key layout ---------------------------------------------------------
    # A lock and its helper keys share one hash tag, so Redis Cluster puts
    # them in one slot and the scripts may touch them together.

    def key(self, name: str) -> str:
        """The Redis key that holds the lock called ``name``."""
        return f"{self.key_prefix}{{{name}}}"

    def _fence_key(self, name: str) -> str:
        return f"{self.key(name)}:fence"

    def _channel(self, name: str) -> str:
        return f"{self.key(name)}:released"


@dataclass
class _Outcome:
    """What one acquire attempt found."""

    acquired: bool
    answered: int = 0
    granted: int = 0
    retry_hint: float | None = None
    failures: dict[str, BaseException] = field(default_factory=dict)


class Lock:
    """One named lock on a :class:`Redlock`; reusable, each acquisition fresh.

    All state lives on this object (never in a thread-local), so another
    thread may extend or release it, as a heartbeat thread does. Create it
    with :meth:`Redlock.lock`.
    """

    def __init__(
        self,
        redlock: Redlock,
        name: str,
        ttl: float,
        timeout: float | None = None,
        owner: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"name: a lock name must be a non-empty string, got {name!r}", option="name"
            )
        try:
            name.encode()
        except UnicodeEncodeError as exc:
            raise ConfigurationError(
                f"name: {name!r} has no UTF-8 form ({exc.reason}); Redis keys are bytes",
                option="name",
            ) from exc
        self.ttl = _positive_seconds(ttl, "ttl")
        if self.ttl <= 2 * redlock.node_timeout:
            raise ConfigurationError(
                f"ttl: {ttl!r} s is too short for a node_timeout of "
                f"{redlock.node_timeout} s; use a ttl above {2 * redlock.node_timeout} s",
                option="ttl",
            )
        self.timeout = (
            None if timeout is None else _positive_seconds(timeout, "timeout", allow_zero=True)
        )
        if owner is not None and not isinstance(owner, str):
            raise ConfigurationError(f"owner: expected a string, got {owner!r}", option="owner")
        self.redlock = redlock
        self.name = name
        self.owner = owner
        self.key = redlock.key(name)
        self._fence_key = redlock._fence_key(name)
        self._channel = redlock._channel(name)
        self._mutex = threading.RLock()
        self._value: str | None = None
        self._valid_until = 0.0
        self._fencing_token: int | None = None
        self.replaces = ""

    def __repr__(self) -> str:
        state = f"held, {self.validity:.3f}s left" if self.locked() else "not held"
        return f"Lock({self.name!r}, ttl={self.ttl}, {state})"

    # -- state ----------------------------------------------------------------

    @property
    def validity(self) -> float:
        """Seconds this acquisition is still safe to rely on (0.0 when not held)."""
        if self._value is None:
            return 0.0
        return max(0.0, self._valid_until - _clock.monotonic())

    @property
    def fencing_token(self) -> int | None:
        """Integer larger than every earlier acquisition's, or ``None`` when not held.

        Hand it to the storage you write under the lock, and let the storage
        refuse writes that carry a smaller token than it has already seen.
        """
        return self._fencing_token if self._value is not None else None

    @property
    def value(self) -> str | None:
        """The random token (and owner) written to Redis, or ``None`` when not held."""
        return self._value

    def locked(self) -> bool:
        """True while this object holds the lock and its validity has not run out."""
        return self.validity > 0.0

    # -- acquire ----------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; return whether it was taken.

        Args:
            blocking: wait for a busy lock (``False``: one attempt only).
            timeout: longest wait, seconds; ``None`` uses the lock's default
                (which itself defaults to waiting as long as it takes).

        Raises:
            QuorumUnavailable: fewer than a majority of the nodes answered the
                only attempt of a non-blocking acquire, or 3 attempts in a
                row (or the last one before the timeout) of a blocking one.
            RedlockError: this object already holds the lock.

        A waiter is woken by the holder's release within milliseconds; when
        the holder dies instead, it wakes as the key expires. A blocking
        acquire retries a missing quorum after a short pause (a node can be
        slow to answer for a moment while another is down) but gives up
        within a few tenths of a second, so an outage is reported, not waited
        out.
        """
        if timeout is not None:
            timeout = _positive_seconds(timeout, "timeout", allow_zero=True)
        else:
            timeout = self.timeout
        if self.locked():
            raise RedlockError(
                f"lock {self.name!r} is already held by this Lock object; "
                "use redlock.lock(...) for another one"
            )
        deadline = None if timeout is None else _clock.monotonic() + timeout
        misses = 0  # attempts in a row without a majority answering

        def attempt() -> _Outcome:
            nonlocal misses
            outcome = self._attempt()
            if outcome.answered >= self.redlock.quorum:
                misses = 0
                return outcome
            misses += 1
            out_of_time = deadline is not None and _clock.monotonic() >= deadline
            if not blocking or out_of_time or misses >= _QUORUM_ATTEMPTS:
                raise self._quorum_unavailable(outcome)
            return outcome

        def left() -> float:
            return math.inf if deadline is None else deadline - _clock.monotonic()

        outcome = attempt()
        if outcome.acquired:
            return True
        if not blocking or left() <= 0:
            return False
        with _ReleaseListener(self.redlock.nodes, self._channel) as listener:
            woken = False
            while True:
                # Listening started before this attempt, so a release that
                # happens after it is never missed.
                outcome = attempt()
                if outcome.acquired:
                    return True
                remaining = left()
                if remaining <= 0:
                    return False
                if woken and outcome.granted > 0:
                    # Some nodes are free already: the release is still reaching
                    # the others. Retry almost at once instead of sleeping.
                    for delay in _AFTER_WAKE_DELAYS:
                        _sleep(min(delay, remaining))
                        outcome = attempt()
                        if outcome.acquired:
                            return True
                        if outcome.granted == 0:
                            break
                    remaining = left()
                    if remaining <= 0:
                        return False
                if misses:
                    # No majority answered: the nodes, not a holder, are the
                    # obstacle. Look again soon; a few misses end the wait.
                    wait = self.redlock.retry_delay * random.uniform(0.25, 0.75)
                else:
                    wait = self.redlock.retry_delay * random.uniform(0.5, 1.5)
                    if outcome.retry_hint is not None:
                        wait = min(wait, outcome.retry_hint)
                woken = listener.wait(min(wait, remaining))

    def _attempt(self) -> _Outcome:
        """One try on every node; on failure the nodes are left as found."""
        redlock = self.redlock
        nodes = redlock.nodes
        token = secrets.token_hex(16)
        value = token if self.owner is None else f"{token}|{self.owner}"
        ttl_ms = _ms(self.ttl)
        call = Call(
            _ACQUIRE,
            (self.key, self._fence_key),
            (value, ttl_ms, _ms(redlock.fence_ttl), self.replaces),
        )
        started = _clock.monotonic()
        results = fan_out(nodes, [[call]] * len(nodes), redlock.node_timeout)

        outcome = _Outcome(acquired=False)
        counters: dict[int, int] = {}
        silent: set[int] = set()
        pttls: list[int] = []
        for index, (node, result) in enumerate(zip(nodes, results, strict=True)):
            reply = _reply(result)
            if _failed(reply):
                outcome.failures[node.name] = reply
                silent.add(index)
                continue
            outcome.answered += 1
            granted, number = int(reply[0]), int(reply[1])
            if granted:
                counters[index] = number
            elif number >= 0:
                # 0 means "expires within the millisecond": retry at once.
                pttls.append(max(number, 1))
        outcome.granted = len(counters)

        if len(counters) >= redlock.quorum:
            token_number = self._agree_on_fencing_token(counters)
            remaining = _clock.validity(self.ttl, started, _clock.monotonic(), redlock.drift_factor)
            if token_number is not None and remaining > 0:
                with self._mutex:
                    self._value = value
                    self._valid_until = (
                        started + self.ttl - _clock.drift(self.ttl, redlock.drift_factor)
                    )
                    self._fencing_token = token_number
                outcome.acquired = True
                logger.debug(
                    "acquired %s on %d/%d nodes, token %d",
                    self.name,
                    len(counters),
                    len(nodes),
                    token_number,
                )
                return outcome

        # Undo wherever our fresh token may be: where it was set, and where
        # no answer came (a node that timed out may have set it after we
        # stopped listening). A node that answered "busy" cannot hold it.
        self._release_value(value, notify=False, on=silent.union(counters))
        if pttls:
            outcome.retry_hint = min(pttls) / 1000.0
        return outcome

    def _quorum_unavailable(self, outcome: _Outcome) -> QuorumUnavailable:
        """The error for an attempt that fewer than a majority of nodes answered."""
        redlock = self.redlock
        return QuorumUnavailable(
            f"lock {self.name!r}: only {outcome.answered} of {len(redlock.nodes)} Redis nodes "
            f"answered, {redlock.quorum} needed; check the nodes "
            f"({'; '.join(map(str, outcome.failures.values()))})",
            key=self.name,
            answered=outcome.answered,
            needed=redlock.quorum,
            failures=outcome.failures,
        )

    def _agree_on_fencing_token(self, counters: dict[int, int]) -> int | None:
        """Pick the token for this acquisition, making sure later ones exceed it.

        Each granting node incremented its own counter; the token is the
        largest. Every node that lags (a node came back empty) is raised to
        it, and a node that answers with a *larger* counter proves a later
        token may already have been issued: the token moves past it and is
        raised again. ``None`` if no majority confirms.
        """
        redlock = self.redlock
        token_number = max(counters.values())
        carriers = {index for index, counter in counters.items() if counter == token_number}
        if len(carriers) == len(counters) >= redlock.quorum:
            return token_number  # the usual case: every granting node agrees
        for _ in range(3):
            call = Call(_FENCE_RAISE, (self._fence_key,), (token_number, _ms(redlock.fence_ttl)))
            calls = [[] if index in carriers else [call] for index in range(len(redlock.nodes))]
            results = fan_out(redlock.nodes, calls, redlock.node_timeout)
            highest = token_number
            for index, result in enumerate(results):
                if index in carriers:
                    continue  # not asked
                reply = _reply(result)
                if _failed(reply):
                    continue
                if int(reply) == token_number:
                    carriers.add(index)
                highest = max(highest, int(reply))
            if highest == token_number:
                return token_number if len(carriers) >= redlock.quorum else None
            token_number, carriers = highest + 1, set()
        return None

    # -- extend and release ---------------------------------------------------------

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lock's time to live to ``ttl`` (default: the lock's ttl).

        Works like a fresh acquisition: a majority of nodes must confirm
        within the current validity, else the lock is given up everywhere.

        Raises:
            LockLost: the lock had expired, was taken over, or could not be
                confirmed by a majority in time.
        """
        new_ttl = self.ttl if ttl is None else _positive_seconds(ttl, "ttl")
        redlock = self.redlock
        with self._mutex:
            value = self._value
            if value is None:
                raise LockLost(
                    f"lock {self.name!r} is not held by this Lock object; acquire it first",
                    key=self.name,
                )
            if self.validity <= 0:
                self._forget()
                self._release_value(value, notify=True)
                raise LockLost(
                    f"lock {self.name!r} expired before it was extended; extend more "
                    "often than the ttl, or use a longer ttl",
                    key=self.name,
                )
            call = Call(_EXTEND, (self.key,), (value, _ms(new_ttl)))
            started = _clock.monotonic()
            confirmed = _confirmed(
                fan_out(redlock.nodes, [[call]] * len(redlock.nodes), redlock.node_timeout)
            )
            remaining = _clock.validity(new_ttl, started, _clock.monotonic(), redlock.drift_factor)
            if confirmed >= redlock.quorum and remaining > 0:
                self.ttl = new_ttl
                self._valid_until = started + new_ttl - _clock.drift(new_ttl, redlock.drift_factor)
                return
            self._forget()
            self._release_value(value, notify=True)
        raise LockLost(
            f"lock {self.name!r} was lost: only {confirmed} of {len(redlock.nodes)} nodes "
            f"still held it ({redlock.quorum} needed); it expired or another owner took it",
            key=self.name,
        )

    def release(self) -> bool:
        """Give the lock up on every node; wake waiters.

        Returns whether a majority of nodes still held it (``False`` when it
        had already expired or was never held). Keys held by any other owner
        are never touched. Calling it again is harmless.
        """
        with self._mutex:
            value = self._value
            if value is None:
                return False
            self._forget()
        return self._release_value(value, notify=True)

    def _forget(self) -> None:
        self._value = None
        self._fencing_token = None
        self._valid_until = 0.0

    def _release_value(self, value: str, *, notify: bool, on: set[int] | None = None) -> bool:
        """Delete ``value`` where it is still the key's value; ``on``: only those nodes."""
        nodes = self.redlock.nodes
        if on is not None and not on:
            return False
        call = Call(_RELEASE, (self.key,), (value, self._channel if notify else ""))
        calls = [[call] if on is None or index in on else [] for index in range(len(nodes))]
        results = fan_out(nodes, calls, self.redlock.node_timeout)
        released = 0
        unreachable = []
        for node, node_calls, result in zip(nodes, calls, results, strict=True):
            if not node_calls:
                continue
            reply = _reply(result)
            if _failed(reply):
                # The key there expires on its own within the ttl.
                unreachable.append(f"{node.name}: {reply}")
            elif int(reply) == 1:
                released += 1
        if unreachable and notify:
            logger.debug("releasing %s did not reach %s", self.name, "; ".join(unreachable))
        return released >= self.redlock.quorum

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockNotAcquired(
                f"lock {self.name!r} is held by another owner and was not released within "
                f"{self.timeout} s; raise the timeout or retry later",
                key=self.name,
                timeout=self.timeout,
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class _ReleaseListener:
    """Subscribes to a lock's release channel so a waiter wakes on release.

    Listens on the first node that accepts the subscription. Every release
    publishes on every node, so one is enough; if none can be reached the
    waiter falls back to timed polling.
    """

    def __init__(self, nodes: Sequence[Node], channel: str) -> None:
        self._nodes = nodes
        self._channel = channel
        self._pubsub: Any = None

    def __enter__(self) -> _ReleaseListener:
        for node in self._nodes:
            pubsub = node.client.pubsub(ignore_subscribe_messages=False)
            try:
                pubsub.subscribe(self._channel)
                # Wait for the confirmation: only then are releases seen.
                confirmed = pubsub.get_message(timeout=self._nodes_timeout(node))
                if confirmed is not None and confirmed["type"] == "subscribe":
                    self._pubsub = pubsub
                    return self
            except (RedisError, OSError):
                pass
            pubsub.close()
        return self

    @staticmethod
    def _nodes_timeout(node: Node) -> float:
        timeout = node.pool.connection_kwargs.get("socket_timeout")
        return float(timeout) if timeout else 0.05

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return True if a release woke us."""
        if self._pubsub is None:
            _sleep(seconds)
            return False
        deadline = _clock.monotonic() + seconds
        try:
            while True:
                remaining = deadline - _clock.monotonic()
                if remaining <= 0:
                    return False
                message = self._pubsub.get_message(timeout=remaining)
                if message is not None and message["type"] == "message":
                    return True
        except (RedisError, OSError):
            # The node went away: poll from now on.
            self._close()
            _sleep(max(0.0, deadline - _clock.monotonic()))
            return False

    def _close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                self._pubsub.close()
            self._pubsub = None

    def __exit__(self, *exc_info: object) -> None:
        self._close()


def _sleep(seconds: float) -> None:
    if seconds > 0:
        threading.Event().wait(seconds)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _reply(result: NodeResult, slot: int = 0) -> Any:
    """One call's reply from a node's result, or why there is none (see :func:`_failed`)."""
    return result if isinstance(result, NodeFailure) else result[slot]


def _failed(reply: Any) -> bool:
    """Whether a reply from :func:`_reply` is a failure: no answer, or an error reply."""
    return isinstance(reply, NodeFailure | ResponseError)


def _confirmed(results: Sequence[NodeResult]) -> int:
    """How many nodes answered their one call with 1 (extended, released)."""
    confirmed = 0
    for result in results:
        reply = _reply(result)
        confirmed += not _failed(reply) and int(reply) == 1
    return confirmed
