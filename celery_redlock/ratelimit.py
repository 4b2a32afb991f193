"""A global per-key rate limiter: one atomic Lua script, one round trip per decision.

Every worker process asks the same Redis, so a limit holds across all of
them, unlike Celery's own ``rate_limit``, which is a token bucket per process.
Two algorithms, chosen per limiter or per call:

``"fixed"`` (default) -- a counter per window: ``INCRBY``, and ``PEXPIRE``
    when the counter is new, so the window opens with the key's first hit and
    lasts ``period``. One small string per key and the fastest script, but a
    burst at the end of one window and another at the start of the next can
    admit up to ``2 * limit`` within one period.

``"sliding"`` -- a sliding window log: a sorted set with one entry per admitted
    unit, scored with the server's ``TIME``. A hit is admitted only if the last
    ``period`` holds room for it, so *no* window of one period ever holds more
    than ``limit`` (with bursts of up to ``limit`` still allowed). It costs
    memory in proportion to ``limit`` per key and a little more time per call.

GCRA (a leaky bucket in one timestamp) was the other candidate. With a burst
of ``limit`` it lets ``limit`` through at once and then one every
``period / limit``, so a window of one period can hold close to ``2 * limit``;
to rule that out the burst ``b`` must shrink the sustained rate to
``(limit - b + 1) / period``. The log keeps both the full burst and the exact
bound, which is what a "never more than N per period" contract asks for.

Timeline of a limit of 3 per 10 s, hits at t = 0, 1, 2, 9 and 10.5::

    fixed:    0 ✓  1 ✓  2 ✓  9 ✗ (retry_after 1.0)  10.5 ✓ (new window)
    sliding:  0 ✓  1 ✓  2 ✓  9 ✗ (retry_after 1.0)  10.5 ✓ (the t=0 unit left)

Both scripts take refused hits back, so a refusal consumes nothing, and both
leave every key with a ttl. State keys are ``<key_prefix>{<key>}:<algorithm>``:
the hash tag keeps one limit's keys in one Redis Cluster slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import redis
from redis.exceptions import ResponseError

from ._nodes import Call, Command, Node, NodeFailure, fan_out
from ._scripts import LuaScript, load
from .errors import ConfigurationError, RateLimiterUnavailable

__all__ = ["Algorithm", "RateLimitDecision", "RateLimiter"]

#: The algorithms a limiter can use; see the module documentation.
Algorithm = Literal["fixed", "sliding"]

_SCRIPTS: dict[Algorithm, LuaScript] = {
    "fixed": load("ratelimit_fixed"),
    "sliding": load("ratelimit_sliding"),
}


@dataclass(frozen=True, slots=True)
class RateLimitDecision:
    """What the limiter decided about one hit (or, for ``peek``, would decide).

    Attributes:
        allowed: the hit was admitted (and counted, unless it was a peek).
        limit: units the limit admits per period.
        remaining: units that could still be admitted right now.
        retry_after: seconds until a hit of the same cost could be admitted;
            ``0.0`` when allowed. A good ``countdown`` for a retried task.
        reset_after: seconds until the key holds no state and the full limit
            is available again; ``0.0`` when it holds none now.
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after: float
    reset_after: float


class RateLimiter:
    """Rate limits shared by every process that uses the same Redis.

    Args:
        client_or_url: where the counters live: a ``redis://``,
            ``rediss://`` or ``unix://`` URL, or a ``redis.Redis`` client
            (its settings are copied; its own pool is left alone).
        key_prefix: prepended to every state key.
        algorithm: ``"fixed"`` or ``"sliding"``, the default for calls that
            name none (see the module documentation for the trade-off).
        node_timeout: longest wait for Redis per decision, seconds; past it
            :class:`~celery_redlock.errors.RateLimiterUnavailable` is raised.
            Longer than a lock's by default: a decision has no validity
            window to protect, so waiting only delays, while a short timeout
            would turn a merely busy server into errors.

    Example::

        limiter = RateLimiter("redis://localhost:6379/0")
        decision = limiter.hit("api:acme", limit=100, period=60.0)
        if not decision.allowed:
            raise errors.RateLimited("api:acme is over 100/min", key="api:acme",
                                     retry_after=decision.retry_after)

    Safe to share between threads, and across ``fork()``: a child process
    opens connections of its own.
    """

    def __init__(
        self,
        client_or_url: str | redis.Redis,
        *,
        key_prefix: str = "redlock:rate:",
        algorithm: Algorithm = "fixed",
        node_timeout: float = 0.5,
    ) -> None:
        if (
            isinstance(node_timeout, bool)
            or not isinstance(node_timeout, int | float)
            or not math.isfinite(node_timeout)
            or node_timeout <= 0
        ):
            raise ConfigurationError(
                f"node_timeout: expected a finite number of seconds > 0, got {node_timeout!r}",
                option="node_timeout",
            )
        if not isinstance(key_prefix, str):
            raise ConfigurationError(
                f"key_prefix: expected a string, got {key_prefix!r}", option="key_prefix"
            )
        self.key_prefix = key_prefix
        self.algorithm: Algorithm = _check_algorithm(algorithm)
        self.node_timeout = float(node_timeout)
        self._node = _make_node(client_or_url, self.node_timeout)

    def __repr__(self) -> str:
        return f"RateLimiter({self._node.name}, algorithm={self.algorithm!r})"

    def hit(
        self,
        key: str,
        limit: int,
        period: float,
        cost: int = 1,
        algorithm: Algorithm | None = None,
    ) -> RateLimitDecision:
        """Count a hit of ``cost`` units against ``limit`` per ``period`` seconds.

        The hit is counted only if it is admitted; a refused hit leaves the
        state as it was. One atomic script, one round trip.

        Args:
            key: names the limit, e.g. ``"api:acme"``; callers sharing a key
                share the limit.
            limit: units admitted per period (an int >= 1).
            period: the window, seconds (>= 0.001).
            cost: units this hit takes, ``1 <= cost <= limit``.
            algorithm: overrides the limiter's default for this call. Each
                algorithm keeps its own state, so use one per key.

        Raises:
            ConfigurationError: a bad argument (also a ``ValueError``).
            RateLimiterUnavailable: Redis did not answer within
                ``node_timeout`` or refused the command.

        Example::

            decision = limiter.hit("api:acme", limit=100, period=60.0)
        """
        return self._run(key, limit, period, cost, algorithm, consume=True)

    def peek(
        self,
        key: str,
        limit: int,
        period: float,
        cost: int = 1,
        algorithm: Algorithm | None = None,
    ) -> RateLimitDecision:
        """The decision :meth:`hit` would make now, without counting anything.

        Example::

            if limiter.peek("api:acme", limit=100, period=60.0).remaining < 10:
                log.warning("acme is close to its API limit")
        """
        return self._run(key, limit, period, cost, algorithm, consume=False)

    def reset(self, key: str) -> None:
        """Forget the state of ``key`` under every algorithm: its full limit is available.

        Example::

            limiter.reset("api:acme")
        """
        _check_key(key)
        command = Command(("DEL", *(self.state_key(key, name) for name in _SCRIPTS)))
        self._one((command,), key)

    def state_key(self, key: str, algorithm: Algorithm | None = None) -> str:
        """The Redis key holding the state of ``key`` under ``algorithm``.

        ``<key_prefix>{<key>}:<algorithm>``, for inspecting a limit with
        ``redis-cli``. Example: ``limiter.state_key("api:acme")`` is
        ``"redlock:rate:{api:acme}:fixed"``.
        """
        name = self.algorithm if algorithm is None else algorithm
        return f"{self.key_prefix}{{{key}}}:{name}"

    def close(self) -> None:
        """Close the limiter's connections (they reopen if it is used again)."""
        self._node.close()

    def __enter__(self) -> RateLimiter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(
        self,
        key: str,
        limit: int,
        period: float,
        cost: int,
        algorithm: Algorithm | None,
        *,
        consume: bool,
    ) -> RateLimitDecision:
        _check_key(key)
        _check_int(limit, "limit")
        period_ms = _period_ms(period)
        _check_int(cost, "cost")
        if cost > limit:
            raise ConfigurationError(
                f"cost: {cost} is more than the limit of {limit}; such a hit could never be "
                "admitted",
                option="cost",
            )
        name = self.algorithm if algorithm is None else _check_algorithm(algorithm)
        call = Call(
            _SCRIPTS[name],
            (self.state_key(key, name),),
            (limit, period_ms, cost, 1 if consume else 0),
        )
        return _decision(self._one((call,), key), limit)

    def _one(self, calls: tuple[Call | Command, ...], key: str) -> Any:
        """Send one command and return its reply, or raise ``RateLimiterUnavailable``."""
        (result,) = fan_out((self._node,), (calls,), self.node_timeout)
        if isinstance(result, NodeFailure):
            raise self._unavailable(key, result) from result
        reply = result[0]
        if isinstance(reply, ResponseError):
            raise self._unavailable(key, reply) from reply
        return reply

    def _unavailable(self, key: str, cause: BaseException) -> RateLimiterUnavailable:
        name = self._node.name
        detail = str(cause).removeprefix(f"{name}: ")
        return RateLimiterUnavailable(
            f"rate limiter: Redis at {name} made no decision for key {key!r} ({detail}); "
            "check that the server is up and reachable, or raise node_timeout if it is "
            "only slow",
            key=key,
            node=name,
        )


def _decision(reply: Any, limit: int) -> RateLimitDecision:
    """Turn a script's ``{allowed, count, retry_after_ms, reset_after_ms}`` into a decision."""
    allowed, count, retry_after_ms, reset_after_ms = reply
    return RateLimitDecision(
        allowed=allowed == 1,
        limit=limit,
        remaining=max(limit - int(count), 0),
        retry_after=retry_after_ms / 1000,
        reset_after=reset_after_ms / 1000,
    )


def _make_node(client_or_url: Any, timeout: float) -> Node:
    if isinstance(client_or_url, redis.Redis):
        return Node.from_client(client_or_url, timeout)
    try:
        return Node.from_url(client_or_url, timeout)
    except ConfigurationError as exc:
        message = str(exc).removeprefix("nodes: ")
        raise ConfigurationError(f"client_or_url: {message}", option="client_or_url") from None


def _check_algorithm(algorithm: Any) -> Algorithm:
    if algorithm not in _SCRIPTS:
        raise ConfigurationError(
            f"algorithm: expected one of {', '.join(map(repr, _SCRIPTS))}, got {algorithm!r}",
            option="algorithm",
        )
    return algorithm  # type: ignore[no-any-return]


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"key: expected a non-empty string, got {key!r}", option="key")


def _check_int(value: Any, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{option}: expected a whole number >= 1, got {value!r}", option=option
        )


def _period_ms(period: Any) -> int:
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or not math.isfinite(period)
        or period < 0.001
    ):
        raise ConfigurationError(
            f"period: expected a finite number of seconds >= 0.001, got {period!r}",
            option="period",
        )
    return round(period * 1000)
