"""``RateLimiter``: decisions on one Redis (or its fallback), one script call each."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal

import redis
from redis.exceptions import ResponseError

from .. import _clock
from .._layout import RATE_PREFIX, RateKeys
from .._scripts import load
from .._validators import MAX_NODE_TIMEOUT, MIN_NODE_TIMEOUT, positive_int, seconds
from ..errors import ConfigurationError
from ..transport.nodes import Call, Command, Node, NodeFailure, fan_out
from .algorithms import ALGORITHMS, DEFAULT_ALGORITHM, Algorithm, check_algorithm
from .decision import RateLimitDecision, from_reply, unchecked
from .failover import NodeStatus, Routes
from .limit import LimitLike, Resolved, check_budget, check_key, from_call, number_text, resolve
from .rate_overrides import (  # the operations behind the methods of the same names
    Backoff,
    RateOverride,
    clear_override,
    get_backoff,
    get_override,
    overrides,
    pause,
    refused,
    resume,
    set_override,
)
from .rates import RateSpec, micros

__all__ = ["OnUnavailable", "RateLimiter"]

#: What a decision does when no Redis answers.
OnUnavailable = Literal["raise", "allow"]

_HIT = load("ratelimit_hit")
_MAX_MARGIN = 60.0


class RateLimiter:
    """Rate limits shared by every process that uses the same Redis.

    Args:
        client_or_url: where the counters live: a ``redis://``, ``rediss://`` or ``unix://``
            URL, or a ``redis.Redis`` client (settings copied, its pool left alone).
        key_prefix: prepended to every key the limiter writes.
        algorithm: ``"sliding"`` (default), ``"gcra"`` or ``"fixed"``, for limits naming none.
        node_timeout: longest wait for one Redis per decision, seconds; longer than a lock's,
            as a decision has no validity to protect and a short one turns a busy server
            into errors.
        margin: seconds added to every ``sliding`` and ``gcra`` window, so a caller timing
            when work *starts* still sees the limit kept (docs/rate-limiting.md, "Margin").
        fallback: a second Redis that decides while the first does not answer; its counts
            are its own.
        on_unavailable: with no Redis answering, ``"raise"``
            :class:`~celery_redlock.errors.RateLimiterUnavailable` (default), or ``"allow"``
            the hit uncounted, ``decision.checked`` false.
        retry_interval: seconds a Redis that timed out is left alone.

    A Redis failing and recovering is logged once each (``celery_redlock.ratelimit``).

    Example::

        limiter = RateLimiter("redis://localhost:6379/0")
        decision = limiter.hit("api:acme", "100/m")
        decision = limiter.hit([("api:acme", "10/s"), ("global", "50000/d")], cost=3)
        if not decision.allowed:
            raise errors.RateLimited("api:acme is over its limit", key="api:acme",
                                     retry_after=decision.retry_after)

    Safe to share between threads; after ``fork()`` a child opens its own connections.
    """

    def __init__(
        self,
        client_or_url: str | redis.Redis,
        *,
        key_prefix: str = RATE_PREFIX,
        algorithm: Algorithm = DEFAULT_ALGORITHM,
        node_timeout: float = 0.5,
        margin: float = 0.0,
        fallback: str | redis.Redis | None = None,
        on_unavailable: OnUnavailable = "raise",
        retry_interval: float = 1.0,
    ) -> None:
        self.node_timeout = seconds(
            node_timeout, "node_timeout", minimum=MIN_NODE_TIMEOUT, maximum=MAX_NODE_TIMEOUT
        )
        self.key_prefix = _check_prefix(key_prefix)
        self.algorithm: Algorithm = check_algorithm(algorithm)
        self.margin = seconds(margin, "margin", allow_zero=True, maximum=_MAX_MARGIN)
        if on_unavailable not in ("raise", "allow"):
            raise ConfigurationError(
                "on_unavailable", f"expected 'raise' or 'allow', got {on_unavailable!r}"
            )
        self.on_unavailable: OnUnavailable = on_unavailable
        self.retry_interval = seconds(
            retry_interval, "retry_interval", minimum=0.001, maximum=3600.0
        )
        nodes = [_make_node(client_or_url, self.node_timeout, "client_or_url")]
        if fallback is not None:
            nodes.append(_make_node(fallback, self.node_timeout, "fallback"))
            if nodes[1].name == nodes[0].name:
                raise ConfigurationError(
                    "fallback",
                    f"{nodes[1].name} is the primary Redis itself; name another "
                    "server, or leave fallback unset",
                )
        when_down = (
            "hits are admitted unchecked (on_unavailable='allow')"
            if on_unavailable == "allow"
            else "decisions raise RateLimiterUnavailable"
        )
        self._routes = Routes(nodes, self.retry_interval, self.node_timeout, when_down)
        self._keys = RateKeys(key_prefix)
        self._margin_us = number_text(micros(self.margin))

    def __repr__(self) -> str:
        where = ", ".join(node.name for node in self._routes.nodes)
        return f"RateLimiter({where}, algorithm={self.algorithm!r})"

    # -- decisions ---------------------------------------------------------------

    def hit(
        self,
        key: str | LimitLike | Sequence[LimitLike],
        limit: RateSpec | None = None,
        period: float | None = None,
        cost: int = 1,
        algorithm: Algorithm | None = None,
    ) -> RateLimitDecision:
        """Count a hit of ``cost`` units if every limit named admits it.

        One atomic call: a refused hit changes nothing in any limit.

        Args:
            key: a limit's key (``limit`` and ``period`` then say the rate), a
                :class:`~celery_redlock.ratelimit.Limit`, or a list of limits and
                ``(key, rate[, algorithm])`` tuples (at most 16, each key once).
            limit: with a single key: units per ``period`` (fractions allowed), or without
                ``period`` a rate such as ``"100/m"`` or a callable ``rate(key)``.
            period: the window, seconds (1 ms to 366 days), with a numeric ``limit``.
            cost: units this hit takes, a whole number from 1 to the smallest limit.
            algorithm: for limits that name none (default: the limiter's); each algorithm
                keeps its own state, so use one per key.

        Raises:
            ConfigurationError: a bad argument (also a ``ValueError``).
            RateLimiterUnavailable: no Redis decided (unless ``on_unavailable="allow"``).

        Example::

            limiter.hit("api:acme", limit=100, period=60.0)
            limiter.hit("api:acme", "100/m")
            limiter.hit([("api:acme", "10/s"), ("global", "50000/d")], cost=3)
        """
        return self._decide(key, limit, period, cost, algorithm, consume=True)

    def peek(
        self,
        key: str | LimitLike | Sequence[LimitLike],
        limit: RateSpec | None = None,
        period: float | None = None,
        cost: int = 1,
        algorithm: Algorithm | None = None,
    ) -> RateLimitDecision:
        """The decision :meth:`hit` would make now, without counting anything.

        Example::

            if limiter.peek("api:acme", "100/m").remaining < 10:
                log.warning("acme is close to its API limit")
        """
        return self._decide(key, limit, period, cost, algorithm, consume=False)

    # -- administration ------------------------------------------------------------

    def reset(self, key: str, *, budget: str | None = None) -> None:
        """Forget the state of ``key`` under every algorithm: its full limit is available.

        On every Redis of the limiter; an override stays. ``budget``: reset that budget instead.

        Example::

            limiter.reset("api:acme")
        """
        check_key(key)
        if budget is not None:
            check_budget(budget)
        names = [self._keys.state(key, name, budget) for name in ALGORITHMS]
        names += [self._keys.pace(key, name, budget) for name in ALGORITHMS if name != "gcra"]
        self._routes.everywhere(Command(("UNLINK", *names)), key)

    def set_override(self, key: str, rate: Any, *, ttl: float) -> RateOverride:
        """Make ``rate`` the limit of ``key`` for ``ttl`` seconds, in every process at once.

        Read by each decision's own script call, so workers need no restart. Expires after
        ``ttl`` (at most 366 days). Whole-millisecond periods and at most 10,000 units per
        second, so every algorithm can use it.

        Example::

            limiter.set_override("api:acme", "200/m", ttl=7 * 86400)
        """
        return set_override(self._routes, self._keys, key, rate, ttl)

    def clear_override(self, key: str) -> bool:
        """Remove the override of ``key`` everywhere; true if there was one.

        Example::

            limiter.clear_override("api:acme")
        """
        return clear_override(self._routes, self._keys, key)

    def get_override(self, key: str) -> RateOverride | None:
        """The override in force for ``key`` on the Redis that decides now, or ``None``."""
        return get_override(self._routes, self._keys, key)

    def overrides(self) -> list[RateOverride]:
        """Every override in force on the deciding Redis, sorted by key (read with ``SCAN``)."""
        return overrides(self._routes, self._keys)

    # -- what the service behind a limit said ------------------------------------

    def refused(
        self, limit: LimitLike, retry_after: float | None = None, *, adapt: bool = False
    ) -> Backoff:
        """The service a limit protects refused a call: pause the key, lower an adaptive rate.

        Every decision on the key, everywhere, is refused for ``retry_after`` seconds
        (``None``: one interval of the rate; a longer pause stays). ``adapt`` lowers the rate
        by the adaptive law, at most once per period (docs/rate-limiting.md, "Adaptive rates").

        Example::

            if response.status_code == 429:
                limiter.refused(("shopify:acme", "40/s"), retry_after=2.0, adapt=True)
        """
        return refused(
            self._routes, self._keys, limit, retry_after, adapt, self.algorithm, self._margin_us
        )

    def pause(self, key: str, seconds: float) -> Backoff:
        """Refuse every decision on ``key`` for ``seconds`` (a longer pause stays).

        Example::

            limiter.pause("shopify:acme", 30.0)
        """
        return pause(self._routes, self._keys, key, seconds)

    def resume(self, key: str) -> bool:
        """End the pause of ``key`` now; true if it was paused. An adaptive rate stays."""
        return resume(self._routes, self._keys, key)

    def get_backoff(self, key: str) -> Backoff | None:
        """The pause and the learned rate of ``key`` (:meth:`Backoff.in_force`), or ``None``."""
        return get_backoff(self._routes, self._keys, key)

    def status(self) -> list[NodeStatus]:
        """Each Redis of the limiter and whether it answers, as this process last found it."""
        return self._routes.status()

    def state_key(
        self, key: str, algorithm: Algorithm | None = None, *, budget: str | None = None
    ) -> str:
        """The Redis key holding ``key``'s state, for ``redis-cli``.

        ``limiter.state_key("api:acme")`` is ``"redlock:rate:{api:acme}:sliding"``.
        """
        name = self.algorithm if algorithm is None else check_algorithm(algorithm)
        return self._keys.state(key, name, None if budget is None else check_budget(budget))

    def close(self) -> None:
        """Close the limiter's connections (they reopen if it is used again)."""
        for node in self._routes.nodes:
            node.close()

    def __enter__(self) -> RateLimiter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------

    def _decide(
        self,
        key: Any,
        limit: Any,
        period: Any,
        cost: Any,
        algorithm: Algorithm | None,
        *,
        consume: bool,
    ) -> RateLimitDecision:
        limits = from_call(key, limit, period, algorithm)
        resolved = resolve(limits, positive_int(cost, "cost"), self.algorithm)
        call = self._call(resolved, cost, consume)
        failures: list[tuple[str, BaseException]] = []
        for route in self._routes.candidates():
            began = _clock.monotonic()
            (result,) = fan_out((route.node,), ((call,),), self.node_timeout)
            failure: BaseException
            if isinstance(result, NodeFailure):
                failure = result
            elif isinstance(result[0], ResponseError):
                failure = result[0]
            else:
                self._routes.succeeded(route)
                return from_reply(result[0], resolved, route.node.name)
            self._routes.failed(route, failure, _clock.monotonic() - began)
            failures.append((route.node.name, failure))
        if self.on_unavailable == "allow":
            return unchecked(resolved)
        raise self._routes.unavailable([limit.key for limit in resolved], failures)

    def _call(self, resolved: Sequence[Resolved], cost: int, consume: bool) -> Call:
        keys: list[str] = []
        args: list[str | int] = [cost, 1 if consume else 0, self._margin_us]
        layout = self._keys
        for limit in resolved:
            keys += (
                layout.state(limit.key, limit.algorithm, limit.budget),
                layout.pace(limit.key, limit.algorithm, limit.budget),
                layout.override(limit.key),
                layout.backoff(limit.key),
            )
            args += limit.script_args()
        return Call(_HIT, tuple(keys), tuple(args))


def _make_node(client_or_url: Any, timeout: float, option: str) -> Node:
    if isinstance(client_or_url, redis.Redis):
        return Node.from_client(client_or_url, timeout)
    try:
        return Node.from_url(client_or_url, timeout)
    except ConfigurationError as exc:
        raise exc.with_context(option=option) from None


def _check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str):
        raise ConfigurationError("key_prefix", f"expected a string, got {prefix!r}")
    if prefix:
        check_key(prefix, "key_prefix")
    return prefix
