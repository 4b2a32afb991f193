"""A singleton's call as short text, stored beside its lock for ``celery redlock locks``.

Written to the lock's ``:args`` key after the lock, best effort, with its ttl; deleted with the
lock by the release scripts, so no key outlives its run at no extra round trip. Celery's
``argsrepr``/``kwargsrepr`` replace the arguments, as in Celery's own logs.
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
    """``(42, 'x', flag=True)``, each value shortened, at most ``PREVIEW_CHARS`` long."""
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
