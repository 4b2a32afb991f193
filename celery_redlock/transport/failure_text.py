"""Why a node failed, in words: the one place a :class:`~.commands.NodeFailure` is read as text.

A worker logs at every re-queue while nodes are down, so :func:`summary` says it in one line::

    1 of 3 lock nodes answered, 2 needed (redis://r2:6379/0: connection refused; ...)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import QuorumUnavailable, RateLimiterUnavailable
from .commands import NodeFailure

__all__ = ["detail", "reason", "short_error", "summary"]

#: Longest reason kept for one node.
_REASON_CHARS = 60
#: redis-py's ``Error 111 connecting to host:6379. Connection refused.``
_REDIS_PY_CONNECT = re.compile(r"^Error \d+ connecting to \S+?\. (?P<why>.+?)\.?$")


def detail(error: BaseException) -> str:
    """A failure's cause as it reads, without the node's name."""
    return str(error.cause if isinstance(error, NodeFailure) else error)


def reason(error: BaseException) -> str:
    """Why a node failed, in a few words: ``connection refused``, ``no reply within ...``."""
    text = detail(error).strip()
    matched = _REDIS_PY_CONNECT.match(text)
    if matched:
        text = matched.group("why")
    elif text.startswith("cannot connect to ") and ": " in text:
        text = text.rsplit(": ", 1)[1]
    text = text[0].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _nodes(failures: Mapping[str, BaseException]) -> str:
    return "; ".join(f"{node}: {reason(error)}" for node, error in failures.items())


def summary(error: QuorumUnavailable | RateLimiterUnavailable) -> str:
    """One line: how many lock nodes answered and why the others did not, or the limiter's node."""
    if isinstance(error, RateLimiterUnavailable):
        cause = error.__cause__ if error.__cause__ is not None else error
        return f"rate-limit Redis {error.node} did not answer ({reason(cause)})"
    total = error.answered + len(error.failures)
    text = f"{error.answered} of {total} lock nodes answered, {error.needed} needed"
    return f"{text} ({_nodes(error.failures)})" if error.failures else text


def short_error(
    error: QuorumUnavailable | RateLimiterUnavailable, what: str
) -> QuorumUnavailable | RateLimiterUnavailable:
    """The same error in one line, ``<what>, Redis unavailable: <summary>``, caused by it."""
    message = f"{what}, Redis unavailable: {summary(error)}"
    short: QuorumUnavailable | RateLimiterUnavailable
    if isinstance(error, RateLimiterUnavailable):
        short = RateLimiterUnavailable(message, key=error.key, node=error.node)
    else:
        short = QuorumUnavailable(
            message,
            key=error.key,
            answered=error.answered,
            needed=error.needed,
            failures=error.failures,
        )
    short.__cause__ = error
    return short
