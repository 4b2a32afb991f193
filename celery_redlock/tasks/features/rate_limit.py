"""Where a task's global rate limit is counted: when a run starts, and when beat publishes.

A run is counted when it *starts*, whoever published it: :meth:`RateGate.screen` only looks
before any lock is taken (a limited run touches no lock), :meth:`RateGate.admit` counts once
the locks are held (a run re-queued for a busy lock spends nothing). Beat's publishes are also
counted, in a separate ``"publish"`` budget, so a runaway schedule cannot fill the queue and
piled-up ticks still start at the limit's pace. With the limiter down a beat tick is sent
unchecked: refusing it would lose it. See docs/rate-limiting.md, "Celery tasks".
"""

from __future__ import annotations

import logging
import random
from typing import Any, NoReturn

from celery import states
from celery.exceptions import Ignore
from celery.result import EagerResult
from celery.utils import uuid

from ... import signals
from ...errors import ConfigurationError, RateLimited, RateLimiterUnavailable
from ...ratelimit import Limit, RateLimitDecision
from ...ratelimit.rates import Rate
from ..app_state import limiter_for
from ..feature_policies import RatePolicy
from ..run_context import RunContext
from ..run_endings import requeue_unavailable, requeue_uncounted

__all__ = ["PUBLISH_BUDGET", "RateGate"]

logger = logging.getLogger("celery_redlock.task")

#: The budget beat's publishes of a task are counted in.
PUBLISH_BUDGET = "publish"


class RateGate:
    """The global rate limits of one call of a task, and the units it takes."""

    def __init__(self, task: Any, policy: RatePolicy, args: Any, kwargs: Any) -> None:
        self.task = task
        self.policy = policy
        self.args = tuple(args or ())
        self.kwargs = dict(kwargs or {})
        self.limits: tuple[Limit, ...] = policy.call_limits(self.args, self.kwargs)
        self.cost = policy.call_cost(self.args, self.kwargs)

    @property
    def keys(self) -> str:
        """The limits' keys, for messages: ``'api:acme', 'api'``."""
        return ", ".join(repr(limit.key) for limit in self.limits)

    # -- in the worker -------------------------------------------------------------

    def screen(self, run: RunContext) -> None:
        """Look, counting nothing: re-queue (or skip, or raise) a run the limit refuses now."""
        self._pass(run, count=False)

    def admit(self, run: RunContext) -> None:
        """Count the run that is about to start; re-queue (or skip, or raise) if refused."""
        self._pass(run, count=True)

    def _pass(self, run: RunContext, *, count: bool) -> None:
        try:
            if count:
                decision = run.limiter.hit(list(self.limits), cost=self.cost)
            else:
                decision = run.limiter.peek(list(self.limits), cost=self.cost)
        except RateLimiterUnavailable as exc:
            self._limiter_down(run, exc)
        for limit in decision.limits:
            if limit.raised:
                self._adapted(run.request.id, limit.key, "increase", limit.limit, limit.period)
        if not decision.allowed:
            self._refused(decision, run)

    def _limiter_down(self, run: RunContext, exc: RateLimiterUnavailable) -> NoReturn:
        # The limiter has logged the outage once; one line per run would flood the log.
        requeue_unavailable(run, f"rate limit {self.keys} not checked", exc, quiet=True)

    def _refused(self, decision: RateLimitDecision, run: RunContext) -> NoReturn:
        task, request, action = self.task, run.request, self.policy.on_limited
        refused = decision.refused_by or decision.limits
        tightest = max(refused, key=lambda limit: limit.retry_after)
        signals.rate_limited.send(
            sender=task,
            task_id=request.id,
            key=tightest.key,
            retry_after=decision.retry_after,
            action=action,
        )
        shown = ", ".join(
            f"{limit.limit:g}/{limit.period:g}s on {limit.key!r}" for limit in refused
        )
        error = RateLimited(
            f"task {task.name!r} ({request.id}): rate limit {shown} reached; "
            f"allowed again in {decision.retry_after:.2f} s",
            key=tightest.key,
            retry_after=decision.retry_after,
        )
        if action == "skip":
            logger.info("task %s: rate limit %r reached; skipped", request.id, tightest.key)
            raise Ignore()
        if action == "raise" or request.called_directly:
            raise error
        # Spread the waiting runs over one slot of the limit, not all back at once.
        spread = tightest.period / tightest.limit
        requeue_uncounted(run, decision.retry_after + random.uniform(0.0, spread), error)

    def refused(self, run: RunContext, retry_after: float | None, key: str | None) -> NoReturn:
        """The service behind a limit refused this run's call: pause, adapt, re-queue.

        Pauses ``key`` (default: the limits on ``rate_limit_key``) everywhere for ``retry_after``
        s (``None``: one interval of the rate; a longer pause stays), lowers an adaptive rate,
        and re-queues the run for the pause's end without spending ``max_retries``.
        """
        task, request = self.task, run.request
        limits = [
            limit
            for limit, made in zip(self.limits, self.policy.limits, strict=True)
            if (limit.key == key if key is not None else not made.own_key)
        ]
        if not limits:
            raise ConfigurationError(
                "key",
                f"rate_limited(key={key!r}): task {task.name!r} has no limit on that key; "
                f"its keys are {self.keys}",
                task=task.name,
            )
        paused_for = 0.0
        for limit in limits:
            try:
                backoff = run.limiter.refused(limit, retry_after, adapt=self.policy.adaptive)
            except RateLimiterUnavailable as exc:
                self._limiter_down(run, exc)
            paused_for = max(paused_for, backoff.paused_for)
            signals.rate_paused.send(
                sender=task, task_id=request.id, key=limit.key, paused_for=backoff.paused_for
            )
            if backoff.lowered and backoff.learned is not None:
                rate = limit.rate if isinstance(limit.rate, Rate) else None
                period = rate.period if rate is not None else 1.0
                self._adapted(request.id, limit.key, "decrease", backoff.learned * period, period)
        error = RateLimited(
            f"task {task.name!r} ({request.id}): the service behind rate limit "
            f"{', '.join(repr(limit.key) for limit in limits)} refused; paused for "
            f"{paused_for:.2f} s",
            key=limits[0].key,
            retry_after=paused_for,
        )
        logger.info(
            "task %s: %s paused for %.2f s (refused by its service); re-queued",
            request.id,
            limits[0].key,
            paused_for,
        )
        if request.called_directly:
            raise error
        requeue_uncounted(run, paused_for + random.uniform(0.0, 0.1 * max(paused_for, 0.1)), error)

    def _adapted(self, task_id: Any, key: str, change: str, limit: float, period: float) -> None:
        signals.rate_adapted.send(
            sender=self.task, task_id=task_id, key=key, change=change, limit=limit, period=period
        )

    # -- at beat's publish ---------------------------------------------------------

    def at_publish(self) -> EagerResult | None:
        """Count a beat publish in the publish budget: an ``IGNORED`` result if refused.

        ``None``: publish (admitted, or the limiter is down).
        """
        task = self.task
        limits = self.policy.call_limits(self.args, self.kwargs, budget=PUBLISH_BUDGET)
        try:
            decision = limiter_for(task.app).hit(list(limits), cost=self.cost)
        except RateLimiterUnavailable:
            logger.info(
                "beat publish of %s: rate limit %s not checked (limiter unavailable); "
                "published, its run is counted when it starts",
                task.name,
                self.keys,
            )
            return None
        if decision.allowed:
            return None
        skipped = uuid()
        refused = decision.refused_by or decision.limits
        key = max(refused, key=lambda limit: limit.retry_after).key
        signals.rate_limited.send(
            sender=task,
            task_id=skipped,
            key=key,
            retry_after=decision.retry_after,
            action="skip-publish",
        )
        logger.info("beat publish of %s skipped: rate limit %r reached", task.name, key)
        return EagerResult(skipped, None, states.IGNORED)
