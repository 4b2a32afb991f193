"""The Redis protocol (RESP2), as much of it as the fan-out speaks.

Commands are packed here and replies parsed here so that the fan-out can
drive its sockets itself: write every node's command, then wait on all the
sockets at once and parse each reply as its bytes arrive. redis-py's
connections are still used to connect and authenticate; after that, going
through their generic reader would cost several system calls and a layer of
Python per reply.

Replies come back as redis-py returns them with ``decode_responses=False``:
``int`` for integers, ``bytes`` for simple and bulk strings, ``None`` for a
null, ``list`` for arrays. Error replies are returned, not raised, as
:class:`ErrorReply`, for the caller to turn into redis-py's exception classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["INCOMPLETE", "ErrorReply", "ProtocolError", "pack", "parse"]


class ErrorReply(str):
    """The text of an error reply (``-ERR ...``), without the leading ``-``."""

    __slots__ = ()


class ProtocolError(Exception):
    """The server sent bytes that are not RESP2; the connection cannot be trusted."""


class _Incomplete:
    __slots__ = ()

    def __repr__(self) -> str:
        return "INCOMPLETE"


#: Returned by :func:`parse` while a reply has not fully arrived.
INCOMPLETE: Any = _Incomplete()


def pack(args: Sequence[str | bytes | int]) -> bytes:
    """Encode one command, e.g. ``pack(("EVALSHA", sha, 1, key, token))``."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = (
            arg.encode() if isinstance(arg, str) else b"%d" % arg if isinstance(arg, int) else arg
        )
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse(buffer: bytes | bytearray, start: int = 0) -> tuple[Any, int]:
    """Parse the reply that begins at ``buffer[start]``.

    Returns ``(reply, end)`` with ``end`` the position just after it, or
    ``(INCOMPLETE, start)`` when the buffer holds only part of the reply.

    Raises:
        ProtocolError: the bytes are not a RESP2 reply.
    """
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return INCOMPLETE, start
    kind = buffer[start]
    line = bytes(buffer[start + 1 : line_end])
    after = line_end + 2
    try:
        if kind == 0x3A:  # ':' integer
            return int(line), after
        if kind == 0x24:  # '$' bulk string
            length = int(line)
            if length < 0:
                return None, after
            end = after + length
            if len(buffer) < end + 2:
                return INCOMPLETE, start
            return bytes(buffer[after:end]), end + 2
        if kind == 0x2A:  # '*' array
            count = int(line)
            if count < 0:
                return None, after
            items = []
            position = after
            for _ in range(count):
                item, position = parse(buffer, position)
                if item is INCOMPLETE:
                    return INCOMPLETE, start
                items.append(item)
            return items, position
    except ValueError as exc:
        raise ProtocolError(f"bad length or number in reply line {line!r}") from exc
    if kind == 0x2B:  # '+' simple string
        return line, after
    if kind == 0x2D:  # '-' error
        return ErrorReply(line.decode("utf-8", "replace")), after
    raise ProtocolError(f"unexpected reply type byte {bytes([kind])!r}")
