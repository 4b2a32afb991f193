"""Structured log lines for lock events, on the ``celery_redlock.events`` logger.

Each signal becomes one record, readable as text, with ``extra`` fields for a JSON formatter::

    from celery_redlock.contrib.eventlog import install_logging

    install_logging()
    # INFO celery_redlock.events: lock_busy task=crm.sync key='crm' action=retry waited=0.000

Per-run and per-publish events log at DEBUG, refusals at INFO, ``rate_paused`` and
``lock_lost`` at WARNING. Nothing connects at import time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .. import signals

__all__ = ["EVENT_FIELDS", "EventLogger", "install_logging", "task_name_of"]

#: Each event's ``extra`` fields besides ``event``, ``task_name``, ``task_id`` and ``key``.
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "lock_acquired": ("waited", "fencing_token"),
    "lock_released": ("held",),
    "lock_busy": ("waited", "action"),
    "lock_lost": ("held", "reason"),
    "rate_limited": ("retry_after", "action"),
    "rate_paused": ("paused_for",),
    "rate_adapted": ("change", "limit", "period"),
    "duplicate_suppressed": ("where",),
    "slot_acquired": ("waited", "limit", "slot"),
    "slot_released": ("held",),
    "slot_busy": ("waited", "limit", "action"),
    "debounce_published": ("delay", "recorded"),
    "debounce_superseded": ("latest",),
}

_LEVELS = {
    "lock_acquired": logging.DEBUG,
    "lock_released": logging.DEBUG,
    "lock_busy": logging.INFO,
    "lock_lost": logging.WARNING,
    "rate_limited": logging.INFO,
    "rate_paused": logging.WARNING,
    "rate_adapted": logging.INFO,
    "duplicate_suppressed": logging.INFO,
    "slot_acquired": logging.DEBUG,
    "slot_released": logging.DEBUG,
    "slot_busy": logging.INFO,
    "debounce_published": logging.DEBUG,
    "debounce_superseded": logging.DEBUG,
}


def task_name_of(sender: Any) -> str:
    """The name of the task that sent a signal (``"unknown"`` if it has none)."""
    name = getattr(sender, "name", None)
    return name if isinstance(name, str) and name else "unknown"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, str) and (not value or " " in value or "=" in value):
        return repr(value)
    return str(value)


class EventLogger:
    """The receivers :func:`install_logging` connects; :meth:`disconnect` undoes it."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._connected: list[tuple[Any, str]] = []

    def _receiver(self, event: str) -> Callable[..., None]:
        level = _LEVELS[event]
        fields = EVENT_FIELDS[event]

        def receive(sender: Any = None, **kwargs: Any) -> None:
            if not self.logger.isEnabledFor(level):
                return
            extra: dict[str, Any] = {
                "event": event,
                "task_name": task_name_of(sender),
                "task_id": kwargs.get("task_id"),
                "key": kwargs.get("key"),
            }
            extra.update({field: kwargs.get(field) for field in fields})
            text = " ".join(
                f"{name}={_text(extra[name])}" for name in ("task_name", "task_id", "key", *fields)
            )
            self.logger.log(level, "%s %s", event, text, extra=extra)

        return receive

    def connect(self) -> EventLogger:
        """Connect one receiver per signal (a second call does nothing)."""
        if self._connected:
            return self
        for event in EVENT_FIELDS:
            signal = getattr(signals, event)
            uid = f"celery_redlock.eventlog:{id(self)}:{event}"
            signal.connect(self._receiver(event), weak=False, dispatch_uid=uid)
            self._connected.append((signal, uid))
        return self

    def disconnect(self) -> None:
        """Stop logging events."""
        for signal, uid in self._connected:
            signal.disconnect(dispatch_uid=uid)
        self._connected = []


def install_logging(logger: logging.Logger | None = None) -> EventLogger:
    """Log every lock event on ``logger`` (default ``celery_redlock.events``); once per process.

    Returns the :class:`EventLogger`, whose ``disconnect()`` stops it.
    """
    return EventLogger(logger or logging.getLogger("celery_redlock.events")).connect()
