"""Debounce: a burst of publishes for one key runs the task once, with the last arguments.

::

    @app.task(base=LockedTask, debounce=5.0, debounce_key="reindex:{doc_id}")
    def reindex(doc_id, reason): ...

Each publish records itself as its key's *latest* copy and is sent with the ``debounce``
countdown; a copy that comes up no longer latest ends with a ``Superseded`` failure. The record
lives on one Redis, not a quorum: one server orders racing publishes in one round trip. If it
fails no publish is lost: an unrecorded copy is recorded by the first worker to get it, and
every copy carries a sequence number, so the newest always runs (docs/debounce.md, "Where the
record lives").
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, NoReturn, Protocol

from celery import states
from celery.exceptions import Ignore
from celery.utils import uuid

from ... import signals
from ...errors import DebounceUnavailable, RedlockError, Superseded
from ..app_state import debounce_store_for as store_for
from ..feature_policies import DebouncePolicy
from ..policies import TaskPolicy
from ..run_context import RunContext
from ..run_endings import requeue_unavailable, requeue_uncounted, resend_with

__all__ = ["DEBOUNCE_HEADER", "Publishing", "admit", "publish"]

logger = logging.getLogger("celery_redlock.debounce")

#: Message header carrying a copy's publish sequence number.
DEBOUNCE_HEADER = "redlock_debounce"


# -- publishing ------------------------------------------------------------------------


class Publishing(Protocol):
    """What :func:`publish` reads of one publish (:class:`~..publish.Publication`)."""

    task: Any
    policy: TaskPolicy
    task_id: str | None
    options: dict[str, Any]
    #: A copy sent again by a worker (a retry, a re-queue), not a new publish.
    resent: bool

    @property
    def delivered(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's ``(args, kwargs)`` as the worker will receive them."""

    def send_plain(self) -> Any:
        """Publish as Celery does, with the current options; no check of our own."""


def publish(publication: Publishing) -> Any:
    """Send one debounced publish: record it as its key's latest, then send it delayed.

    A re-send (a retry, a re-queue) is the same publish and keeps its record.
    """
    task = publication.task
    policy = publication.policy.debounce
    assert policy is not None
    options = publication.options
    if publication.resent:
        return publication.send_plain()
    task_id = publication.task_id = publication.task_id or uuid()
    name = policy.name(task.name, *publication.delivered)
    delay = _delay(policy, options)
    headers = dict(options.get("headers") or {})
    seq: int | None = None
    try:
        seq = store_for(task.app).publish(name, task_id, delay=delay, ttl=policy.ttl)
    except DebounceUnavailable as exc:
        logger.warning(
            "debounce %r: %s; task %s sent unrecorded, to be recorded when a worker gets it",
            name,
            exc,
            task_id,
        )
    else:
        headers[DEBOUNCE_HEADER] = seq
    options["headers"] = headers
    options["countdown"] = delay
    try:
        result = publication.send_plain()
    except BaseException:
        if seq is not None:
            _withdraw(task.app, name, task_id)
        raise
    signals.debounce_published.send(
        sender=task, task_id=task_id, key=name, delay=delay, recorded=seq is not None
    )
    return result


def _delay(policy: DebouncePolicy, options: dict[str, Any]) -> float:
    """Seconds until the copy may run: the debounce, or a later countdown/eta the caller gave."""
    delay = policy.delay
    countdown = options.pop("countdown", None)
    if isinstance(countdown, int | float) and not isinstance(countdown, bool):
        delay = max(delay, float(countdown))
    eta = options.pop("eta", None)
    if isinstance(eta, str):
        try:
            eta = datetime.datetime.fromisoformat(eta)
        except ValueError:
            options["eta"] = eta  # not ours to judge: Celery reports it
            return delay
    if isinstance(eta, datetime.datetime):
        now = datetime.datetime.now(datetime.UTC)
        if eta.tzinfo is None:  # Celery reads a naive eta as UTC (enable_utc, the default)
            now = now.replace(tzinfo=None)
        delay = max(delay, (eta - now).total_seconds())
    return delay


def _withdraw(app: Any, name: str, task_id: str) -> None:
    try:
        store_for(app).withdraw(name, task_id)
    except DebounceUnavailable as exc:
        logger.warning(
            "debounce %r: task %s was not sent and is still recorded as the latest (%s); "
            "earlier copies end superseded by it",
            name,
            task_id,
            exc,
        )


# -- in the worker -----------------------------------------------------------------------


def admit(run: RunContext) -> None:
    """Return if the run is its key's latest publish and due; else end or re-queue it."""
    task, request = run.task, run.request
    policy = run.policy.debounce
    assert policy is not None
    if request.is_eager or request.called_directly:
        return
    name = policy.name(task.name, run.args, run.kwargs)
    store = store_for(task.app)
    seq = _sequence(request)
    try:
        if seq is None:
            seq = store.publish(name, run.task_id, delay=policy.delay, ttl=policy.ttl)
            _send_recorded(run, name, seq, policy.delay)
        verdict = store.check(name, run.task_id, seq, ttl=policy.ttl)
    except DebounceUnavailable as exc:
        requeue_unavailable(run, f"debounce {name!r} not checked", exc)
    if verdict.action == "run":
        return
    if verdict.action == "early":
        # Due later on the store's clock than on the publisher's: wait the rest.
        requeue_uncounted(
            run, verdict.wait, RedlockError(f"debounce {name!r}: due in {verdict.wait:.3f} s")
        )
    _end_superseded(run, name, verdict.latest)


def _sequence(request: Any) -> int | None:
    headers = request.headers or {}
    raw = headers.get(DEBOUNCE_HEADER, getattr(request, DEBOUNCE_HEADER, None))
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.isdigit():
        return int(raw)
    return None


def _send_recorded(run: RunContext, name: str, seq: int, delay: float) -> NoReturn:
    """An unrecorded copy, now recorded: send it again, to run ``delay`` s from now."""
    task, request = run.task, run.request
    logger.info(
        "task %s: debounce %r recorded on arrival; runs in %.1f s unless published again",
        request.id,
        name,
        delay,
    )
    signals.debounce_published.send(
        sender=task, task_id=request.id, key=name, delay=delay, recorded=True
    )
    resend_with(run, DEBOUNCE_HEADER, seq, delay)


def _end_superseded(run: RunContext, name: str, latest: str | None) -> NoReturn:
    task, request = run.task, run.request
    signals.debounce_superseded.send(sender=task, task_id=request.id, key=name, latest=latest)
    logger.info("task %s: debounce %r superseded by task %s; not run", request.id, name, latest)
    error = Superseded(
        f"task {task.name!r}: debounce {name!r}: superseded by the later publish {latest}, "
        "which runs instead",
        task_name=task.name,
        task_id=latest,
        key=name,
    )
    if not (task.ignore_result or getattr(request, "ignore_result", False)):
        try:
            task.backend.store_result(request.id, error, states.FAILURE, request=request)
        except Exception as exc:  # no result backend, or it is down: the log line stays
            logger.debug("task %s: superseded not recorded in the backend: %s", request.id, exc)
    raise Ignore()
