"""The RESP2 packer and reader the fan-out uses instead of redis-py's."""

from __future__ import annotations

from typing import Any

import pytest

from celery_redlock._resp import INCOMPLETE, ErrorReply, ProtocolError, pack, parse


def test_pack_encodes_text_bytes_and_integers() -> None:
    assert pack(("SET", b"k\xff", 12, "é")) == (
        b"*4\r\n$3\r\nSET\r\n$2\r\nk\xff\r\n$2\r\n12\r\n$2\r\n\xc3\xa9\r\n"
    )


@pytest.mark.parametrize(
    ("wire", "reply"),
    [
        pytest.param(b":42\r\n", 42, id="integer"),
        pytest.param(b":-1\r\n", -1, id="negative"),
        pytest.param(b"+OK\r\n", b"OK", id="simple"),
        pytest.param(b"$5\r\nab\r\nc\r\n", b"ab\r\nc", id="bulk-with-crlf-inside"),
        pytest.param(b"$0\r\n\r\n", b"", id="empty-bulk"),
        pytest.param(b"$-1\r\n", None, id="null-bulk"),
        pytest.param(b"*-1\r\n", None, id="null-array"),
        pytest.param(b"*0\r\n", [], id="empty-array"),
        pytest.param(b"*2\r\n:1\r\n:7\r\n", [1, 7], id="array"),
        pytest.param(b"*2\r\n*2\r\n$1\r\na\r\n:5\r\n$-1\r\n", [[b"a", 5], None], id="nested-array"),
    ],
)
def test_parse_every_reply_type(wire: bytes, reply: Any) -> None:
    assert parse(wire) == (reply, len(wire))
    # The same reply, cut anywhere, is incomplete until its last byte arrives.
    for cut in range(len(wire)):
        assert parse(wire[:cut]) == (INCOMPLETE, 0)


def test_parse_from_an_offset_and_several_replies_in_one_buffer() -> None:
    buffer = bytearray(b"junk:1\r\n$2\r\nhi\r\n")
    first, end = parse(buffer, 4)
    assert first == 1
    second, end = parse(buffer, end)
    assert second == b"hi"
    assert end == len(buffer)


def test_error_replies_are_returned_not_raised() -> None:
    reply, end = parse(b"-NOSCRIPT No matching script\r\n")
    assert isinstance(reply, ErrorReply)
    assert reply == "NOSCRIPT No matching script"
    assert end == 30


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(b"?what\r\n", id="unknown-type"),
        pytest.param(b":12x\r\n", id="bad-integer"),
        pytest.param(b"$ab\r\n", id="bad-length"),
        pytest.param(b"*x\r\n", id="bad-count"),
    ],
)
def test_bytes_that_are_not_resp_are_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse(wire)
