"""A node URL's query options, and its passwords hidden.

An option is honoured (``db``, ``client_name``, the URL kind's own), overridden by the lock's
setting with a warning (:data:`_OVERRIDDEN`), or refused with a :class:`ConfigurationError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from urllib.parse import parse_qsl, urlsplit

from ..errors import ConfigurationError

__all__ = ["bad", "boolean", "check_options", "integer", "query_options", "redact"]

logger = logging.getLogger("celery_redlock.nodes")

#: Query options whose values are secrets, hidden by :func:`redact`.
_SECRET_OPTIONS = frozenset({"sentinel_password", "ssl_password"})
#: Query options honoured on any URL.
_HONOURED = frozenset({"db", "client_name"})
#: Query options the lock's own settings override, and what governs instead.
_OVERRIDDEN = {
    "socket_timeout": "node_timeout",
    "socket_connect_timeout": "node_timeout",
    "timeout": "node_timeout",
    "retry_on_timeout": "node_timeout (the lock never retries a node within an attempt)",
    "retry_on_error": "node_timeout (the lock never retries a node within an attempt)",
    "max_connections": "the lock's own connections (a few per node, shared by every caller)",
    "protocol": "the lock's own connections (RESP2)",
    "health_check_interval": "the lock's own check of idle connections",
    "socket_keepalive": "the lock's own connections",
    "socket_read_size": "the lock's own connections",
    "decode_responses": "the lock's own connections (bytes)",
    "legacy_responses": "the lock's own connections",
    "single_connection_client": "the lock's own connections",
}
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}


def redact(url: str) -> str:
    """``url`` without its passwords, for messages and logs (each part of a ``;`` list)."""
    if ";" in url:
        return ";".join(redact(part) for part in url.split(";"))
    parts = urlsplit(url)
    changed = False
    if any(secret in parts.query for secret in _SECRET_OPTIONS):
        changed = True
        hidden = "&".join(
            f"{name}=***" if name in _SECRET_OPTIONS else pair
            for pair in parts.query.split("&")
            for name in [pair.split("=", 1)[0]]
        )
        parts = parts._replace(query=hidden)
    try:
        password = parts.password
    except ValueError:
        password = None
    if password is None or "@" not in parts.netloc:
        return parts.geturl() if changed else url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + netloc).geturl()


def bad(problem: str, option: str = "nodes") -> ConfigurationError:
    """``ConfigurationError("nodes", problem)``, its ``option`` the URL's own (``db``...)."""
    error = ConfigurationError("nodes", problem)
    if option != "nodes":
        error.option, error.problem = option, str(error)
    return error


def query_options(query: str, shown: str) -> dict[str, str]:
    """A URL's query string as options, each given once (``shown``: the URL for messages)."""
    found: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise bad(f"{shown!r} has a malformed query string: {exc}") from exc
    for name, value in pairs:
        if name in found:
            raise bad(f"{shown!r} gives {name!r} twice", option=name)
        found[name] = value
    return found


def check_options(
    query: Mapping[str, str],
    shown: str,
    accepted: frozenset[str],
    refused: Callable[[str], str | None],
    takes: str,
) -> None:
    """Warn of each option the lock's settings override; refuse any it does not take.

    ``refused(option)``: why this URL cannot take it, or ``None``; ``takes``: for the message.
    """
    for option in query:
        if option in _OVERRIDDEN:
            logger.warning(
                "nodes: %s: ?%s=... is ignored; %s governs the lock's connections",
                shown,
                option,
                _OVERRIDDEN[option],
            )
            continue
        problem = refused(option)
        if problem is None and option not in _HONOURED and option not in accepted:
            problem = f"unknown URL option {option!r}; {takes}"
        if problem is not None:
            raise bad(f"{shown!r}: {problem}", option=option)


def integer(value: str, option: str, shown: str) -> int:
    """A query option's whole number (``shown``: the URL, for messages)."""
    if not value.isdigit():
        raise bad(f"{shown!r}: {option}={value!r} is not a whole number", option=option)
    return int(value)


def boolean(value: str, option: str, shown: str) -> bool:
    """A query option's true or false (``shown``: the URL, for messages)."""
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise bad(f"{shown!r}: {option}={value!r} is not true or false", option=option)
