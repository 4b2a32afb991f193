"""A singleton's call as short text, stored beside its lock for ``celery redlock locks``.

When a publish takes a singleton lock, the call (``(42, 'full', force=True)``,
shortened to :data:`~celery_redlock._layout.PREVIEW_CHARS`) is written to
the lock's ``:args`` key on every lock node, with the ttl the lock was
written with, so that an operator can see what a queued or running
singleton is about. It is written after the lock and deleted with it, in the
same script call and only where the caller still held the lock: when the
holder frees it (``release.lua``: the run ended, the publish failed), when a
``"queued"``-mode copy frees its ``:queued`` lock as it starts, and when the
worker frees a dead run's locks by their owner (``release_owner.lua``). No
key is left per call once its run is over, at no extra round trip. Writing
is best effort: a node that does not answer only lacks the text; one that
misses the release keeps it until its ttl. Arguments Celery
would hide hide here too: ``apply_async(..., argsrepr=..., kwargsrepr=...)``
are used in place of the arguments, as in Celery's own logs and events.
"""

from __future__ import annotations

import logging
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from ..._clock import to_ms
from ..._layout import PREVIEW_CHARS, ArgsPreview
from ...lock.redlock import Redlock
from ...transport.nodes import Command, fan_out

__all__ = ["call_text", "store"]

logger = logging.getLogger("celery_redlock.task")

_repr = reprlib.Repr()
_repr.maxlevel = 2
_repr.maxstring = 40
_repr.maxother = 40
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6


def call_text(
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
) -> str:
    """``(42, 'x', flag=True)``, each value shortened, at most ``PREVIEW_CHARS`` long.

    ``options`` are the publish options: Celery's ``argsrepr`` and
    ``kwargsrepr``, when given, replace the arguments' own text.
    """
    options = options or {}
    argsrepr, kwargsrepr = options.get("argsrepr"), options.get("kwargsrepr")
    parts = []
    if argsrepr is not None:
        parts.append(_unwrapped(str(argsrepr), "()", "[]"))
    else:
        parts.extend(_repr.repr(value) for value in args)
    if kwargsrepr is not None:
        parts.append(_unwrapped(str(kwargsrepr), "{}"))
    else:
        parts.extend(f"{name}={_repr.repr(value)}" for name, value in kwargs.items())
    text = "(" + ", ".join(part for part in parts if part) + ")"
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _unwrapped(text: str, *brackets: str) -> str:
    """``text`` without one pair of enclosing brackets: Celery's reprs are ``(1, 2)``, ``{...}``."""
    text = text.strip()
    for pair in brackets:
        if len(text) >= 2 and text[0] == pair[0] and text[-1] == pair[1]:
            return text[1:-1].strip().removesuffix(",")  # a one-item tuple: ('x',)
    return text


def store(redlock: Redlock, name: str, task_id: str, text: str, ttl: float) -> None:
    """Store the call text of singleton ``name`` held for ``task_id``, for ``ttl`` seconds."""
    value = str(ArgsPreview(task_id, text))
    command = Command(("SET", redlock.keys(name).args, value, "PX", to_ms(ttl)))
    nodes = redlock.nodes
    failed = [
        result
        for result in fan_out(nodes, [[command]] * len(nodes), redlock.node_timeout)
        if isinstance(result, Exception) or isinstance(result[0], Exception)
    ]
    if failed:
        logger.debug("singleton %r: arguments not stored on %d node(s)", name, len(failed))
