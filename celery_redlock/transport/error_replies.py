"""What an error reply means: the connection is lost, or one command failed."""

from __future__ import annotations

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ExecAbortError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["LinkBroken", "error_reply"]

# The node cannot serve this connection at all: the link closes, its waiters see a node failure.
_NODE_ERRORS: dict[str, type[RedisError]] = {
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
    "LOADING": BusyLoadingError,
    "MASTERDOWN": RedisConnectionError,
    "BUSY": RedisConnectionError,
}
# Error replies about one command: returned in its place, as redis-py's class.
_COMMAND_ERRORS: dict[str, type[ResponseError]] = {
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "OOM": OutOfMemoryError,
    "NOPERM": NoPermissionError,
    "EXECABORT": ExecAbortError,
}


class LinkBroken(Exception):
    """Raised inside a link when the node can no longer be trusted on it."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def error_reply(text: str) -> ResponseError:
    """redis-py's exception for an error reply about one command (``NoScriptError``…).

    Raises:
        LinkBroken: the reply says the node cannot serve the connection.
    """
    prefix = text.split(" ", 1)[0]
    if prefix in _NODE_ERRORS or text.startswith("ERR max number of clients"):
        raise LinkBroken(_NODE_ERRORS.get(prefix, RedisConnectionError)(text))
    return _COMMAND_ERRORS.get(prefix, ResponseError)(text)
