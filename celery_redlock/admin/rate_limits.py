"""Rate limits as data: each limit's rate in force and its use now, its state, overrides.

Use is read with the limiter's own ``peek`` (nothing counted), so it is what the next run would
see. The rate comes from the caller, else the app's tasks limiting that key, else an override.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from redis.exceptions import RedisError

from .._layout import RateKeys
from ..errors import RateLimiterUnavailable
from ..ratelimit import ALGORITHMS, Algorithm, Backoff, Limit, RateLimiter, RateOverride
from ..ratelimit.rates import Rate
from ..tasks.features.rate_limit import PUBLISH_BUDGET
from .node_access import NodeClient
from .task_rate_limits import TaskRateLimit

__all__ = [
    "LimitUse",
    "RateView",
    "limit_use",
    "matching_keys",
    "rate_overview",
    "rate_state",
    "rate_view",
    "task_uses",
]


@dataclasses.dataclass(frozen=True)
class LimitUse:
    """One limit on one key, as a run starting now would find it (nothing counted)."""

    key: str
    #: The rate in force as text: the override's when ``overridden``.
    rate: str
    algorithm: str
    limit: float
    period: float
    #: Units taken in the current window (``⌈limit⌉ - remaining``).
    used: int
    remaining: int
    #: Seconds until one more unit is admitted; ``0.0`` if one is now.
    retry_after: float
    #: Seconds until the limit holds no state.
    reset_after: float
    overridden: bool
    #: ``"publish"`` for beat's publishes of a task, ``None`` for runs.
    budget: str | None = None
    #: The task that declares the limit, if one does.
    task: str | None = None
    #: The configured (or overridden) rate, when the adaptive law holds ``rate`` under it.
    ceiling: str | None = None
    #: Seconds the key stays paused (the service behind it refused), ``0.0`` if not.
    paused_for: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RateView:
    """One rate-limit key: the limits on it and their use, its override, its raw state."""

    key: str
    node: str
    #: Each limit known on the key, with its use now.
    limits: list[LimitUse]
    #: The override in force on the key, if any.
    override: RateOverride | None
    #: Per algorithm: ``{"algorithm", "state_key", "exists", "ttl", "error"}``.
    state: list[dict[str, Any]]
    #: The key's pause and adaptive rate, if the service behind it refused lately.
    backoff: Backoff | None = None

    @property
    def decision(self) -> LimitUse | None:
        """The first limit's use (for callers that gave one rate)."""
        return self.limits[0] if self.limits else None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "key": self.key,
            "node": self.node,
            "limits": [use.as_dict() for use in self.limits],
            "override": None if self.override is None else _override_dict(self.override),
            "state": self.state,
            "backoff": None if self.backoff is None else dataclasses.asdict(self.backoff),
        }


def matching_keys(
    limiter: RateLimiter, node: NodeClient, glob: str, algorithm: Algorithm
) -> list[str]:
    """The rate-limit keys matching ``glob`` that have state under ``algorithm``.

    Raises:
        RateLimiterUnavailable: the Redis did not answer.
    """
    keys = RateKeys(limiter.key_prefix)
    found = set()
    try:
        for raw in node.client.scan_iter(match=keys.pattern(glob, algorithm), count=1000):
            state_key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            key = keys.limit_key(state_key, algorithm)
            if key is not None:
                found.add(key)
    except (RedisError, OSError) as exc:
        raise RateLimiterUnavailable(
            f"rate limits: Redis at {node.name} did not answer ({exc})", key=glob, node=node.name
        ) from exc
    return sorted(found)


def task_uses(
    limiter: RateLimiter,
    node: NodeClient,
    declared: Sequence[TaskRateLimit],
    key: str | None = None,
) -> list[LimitUse]:
    """One task's limits (``declared``) on each key they counted (or ``key``), and their use.

    A limit keyed by a function has no known keys: it shows only for a given ``key``.

    Raises:
        LookupError: ``key`` is no key of any of the limits.
        RateLimiterUnavailable: the Redis did not answer.
    """
    uses: list[LimitUse] = []
    for known in declared:
        assert known.source is not None, "a task's limit knows its rate"
        if key is not None:
            keys = [key] if known.counts_on(key) else []
        elif known.fixed_key:
            keys = [known.key]
        elif known.glob is not None:
            keys = matching_keys(limiter, node, known.glob, known.algorithm)
        else:
            keys = []
        for each in keys:
            state = rate_state(limiter, node, each)
            uses += _with_publish(limiter, known, state, key=each)
    if key is not None and not uses:
        shown = ", ".join(repr(known.key) for known in declared)
        raise LookupError(f"{key!r} is not a key of task {declared[0].task!r}'s limits ({shown})")
    return uses


def limit_use(
    limiter: RateLimiter,
    key: str,
    rate: Any,
    algorithm: Algorithm,
    *,
    budget: str | None = None,
    task: str | None = None,
) -> LimitUse:
    """Peek at one limit: its rate in force and its use now.

    Raises:
        RateLimiterUnavailable: no Redis of the limiter answered.
        ConfigurationError: a bad rate or algorithm.
    """
    limit = Limit(key, rate, algorithm, budget=budget)
    (one,) = limiter.peek(limit).limits
    most = math.ceil(one.limit)
    ceiling = str(Rate(one.limit, one.period) if not one.adapted else limit.rate)
    if one.overridden:
        override = limiter.get_override(key)
        ceiling = override.text if override is not None else ceiling
    text = str(Rate(round(one.limit, 2), one.period)) if one.adapted else ceiling
    return LimitUse(
        key=key,
        rate=text,
        algorithm=one.algorithm,
        limit=one.limit,
        period=one.period,
        used=max(most - one.remaining, 0),
        remaining=one.remaining,
        retry_after=one.retry_after,
        reset_after=one.reset_after,
        overridden=one.overridden,
        budget=budget,
        task=task,
        ceiling=ceiling if one.adapted else None,
        paused_for=one.retry_after if one.paused else 0.0,
    )


def rate_state(limiter: RateLimiter, node: NodeClient, key: str) -> list[dict[str, Any]]:
    """Which algorithms hold state for ``key`` (runs and beat's publishes), and its ttl.

    Raises:
        RateLimiterUnavailable: the Redis did not answer.
    """
    names = [
        (algorithm, budget, limiter.state_key(key, algorithm, budget=budget))
        for budget in (None, PUBLISH_BUDGET)
        for algorithm in ALGORITHMS
    ]
    pipe = node.client.pipeline(transaction=False)
    for _, _, name in names:
        pipe.pttl(name)
    try:
        replies = pipe.execute(raise_on_error=False)
    except (RedisError, OSError) as exc:
        raise RateLimiterUnavailable(
            f"rate limits: Redis at {node.name} did not answer ({exc})", key=key, node=node.name
        ) from exc
    found = []
    for (algorithm, budget, name), pttl in zip(names, replies, strict=True):
        error = str(pttl) if isinstance(pttl, Exception) else None
        exists = error is None and int(pttl) != -2
        if budget is not None and not exists:
            continue  # a publish budget is shown only where beat has used one
        found.append(
            {
                "algorithm": algorithm,
                "budget": budget,
                "state_key": name,
                "exists": exists,
                "ttl": max(int(pttl), 0) / 1000 if exists and int(pttl) >= 0 else None,
                "error": error,
            }
        )
    return found


def rate_view(
    limiter: RateLimiter,
    node: NodeClient,
    key: str,
    *,
    rate: Any = None,
    algorithm: Algorithm | None = None,
    declared: Sequence[TaskRateLimit] = (),
) -> RateView:
    """Everything known about rate-limit ``key``; counts nothing.

    Raises:
        RateLimiterUnavailable: the Redis did not answer.
        ConfigurationError: a bad rate or algorithm.
    """
    state = rate_state(limiter, node, key)
    override = limiter.get_override(key)
    with_state = [entry for entry in state if entry["exists"]]
    guessed: Algorithm = with_state[0]["algorithm"] if len(with_state) >= 1 else ALGORITHMS[0]
    uses: list[LimitUse] = []
    if rate is not None:
        uses.append(limit_use(limiter, key, rate, algorithm or guessed))
    else:
        for known in declared:
            if known.fixed_key and known.key == key and known.parsed is not None:
                uses += _with_publish(limiter, known, state)
        if not uses and override is not None:
            uses.append(limit_use(limiter, key, override.rate, algorithm or guessed))
    backoff = limiter.get_backoff(key)
    return RateView(
        key=key,
        node=_deciding(limiter),
        limits=uses,
        override=override,
        state=state,
        backoff=backoff,
    )


def rate_overview(
    limiter: RateLimiter, node: NodeClient, declared: Iterable[TaskRateLimit]
) -> tuple[list[LimitUse], list[TaskRateLimit], list[RateOverride]]:
    """Every task limit with a fixed key and its use; the templated ones; every override.

    Raises:
        RateLimiterUnavailable: the Redis did not answer.
    """
    uses: list[LimitUse] = []
    per_call: list[TaskRateLimit] = []
    for known in declared:
        if known.fixed_key and known.parsed is not None:
            uses += _with_publish(limiter, known, rate_state(limiter, node, known.key))
        else:
            per_call.append(known)
    return uses, per_call, limiter.overrides()


def _with_publish(
    limiter: RateLimiter,
    known: TaskRateLimit,
    state: Sequence[dict[str, Any]],
    *,
    key: str | None = None,
) -> list[LimitUse]:
    """The use of ``known`` on ``key`` (default: its fixed key), and of beat's budget if used."""
    key = known.key if key is None else key
    rate = known.source if known.source is not None else known.parsed
    uses = [limit_use(limiter, key, rate, known.algorithm, task=known.task)]
    if any(entry["budget"] == PUBLISH_BUDGET for entry in state):
        uses.append(
            limit_use(limiter, key, rate, known.algorithm, budget=PUBLISH_BUDGET, task=known.task)
        )
    return uses


def _deciding(limiter: RateLimiter) -> str:
    for status in limiter.status():
        if status.answering:
            return status.node
    return limiter.status()[0].node


def _override_dict(override: RateOverride) -> dict[str, Any]:
    return {"key": override.key, "rate": override.text, "ttl": override.ttl}
