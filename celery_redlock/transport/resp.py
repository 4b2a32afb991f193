"""The Redis protocol (RESP2, as the links never send ``HELLO``), as much as the fan-out speaks.

Replies come back as redis-py's with ``decode_responses=False``; error replies are returned as
:class:`ErrorReply`, not raised. The parser is strict (CRLF, plain decimals, bounded lengths and
depth): anything else is a :class:`ProtocolError`, and the connection is closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["INCOMPLETE", "MAX_BULK", "MAX_DEPTH", "ErrorReply", "ProtocolError", "pack", "parse"]

#: Longest bulk string a server may send (Redis' own ``proto-max-bulk-len``).
MAX_BULK = 512 * 1024 * 1024
#: Deepest nesting of arrays accepted; our scripts return at most two levels.
MAX_DEPTH = 16
#: Longest header line (type byte, number, CRLF) before the CRLF must appear.
_MAX_LINE = 64 * 1024


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


def _number(line: bytes) -> int:
    """A RESP integer: optional ``-``, then decimal digits only."""
    digits = line[1:] if line[:1] == b"-" else line
    if not digits.isdigit() or len(digits) > 20:
        raise ProtocolError(f"bad number in reply line {line[:40]!r}")
    return int(line)


def parse(buffer: bytes | bytearray, start: int = 0) -> tuple[Any, int]:
    """``(reply, end)`` for the reply at ``buffer[start]``, or ``(INCOMPLETE, start)``.

    Raises:
        ProtocolError: the bytes are not a RESP2 reply.
    """
    return _parse(buffer, start, 0)


def _parse(buffer: bytes | bytearray, start: int, depth: int) -> tuple[Any, int]:
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        if len(buffer) - start > _MAX_LINE:
            raise ProtocolError("reply line too long")
        return INCOMPLETE, start
    kind = buffer[start]
    line = bytes(buffer[start + 1 : line_end])
    after = line_end + 2
    if kind == 0x3A:  # ':' integer
        return _number(line), after
    if kind == 0x24:  # '$' bulk string
        length = _number(line)
        if length == -1:
            return None, after
        if not 0 <= length <= MAX_BULK:
            raise ProtocolError(f"bad bulk string length {length}")
        end = after + length
        if len(buffer) < end + 2:
            return INCOMPLETE, start
        if buffer[end : end + 2] != b"\r\n":
            raise ProtocolError("bulk string not followed by CRLF")
        return bytes(buffer[after:end]), end + 2
    if kind == 0x2A:  # '*' array
        count = _number(line)
        if count == -1:
            return None, after
        if count < 0:
            raise ProtocolError(f"bad array length {count}")
        if depth >= MAX_DEPTH:
            raise ProtocolError("arrays nested too deep")
        items = []
        position = after
        for _ in range(count):
            item, position = _parse(buffer, position, depth + 1)
            if item is INCOMPLETE:
                return INCOMPLETE, start
            items.append(item)
        return items, position
    if b"\r" in line or b"\n" in line:
        raise ProtocolError("stray CR or LF in a reply line")
    if kind == 0x2B:  # '+' simple string
        return line, after
    if kind == 0x2D:  # '-' error
        return ErrorReply(line.decode("utf-8", "replace")), after
    raise ProtocolError(f"unexpected reply type byte {bytes([kind])!r}")
