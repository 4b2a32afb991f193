"""The RESP2 packer and reader the fan-out uses instead of redis-py's."""

from __future__ import annotations

import random
from typing import Any

import pytest

from celery_redlock.transport.resp import INCOMPLETE, ErrorReply, ProtocolError, pack, parse


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


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(b"$2\r\nabXY", id="bulk-without-crlf"),
        pytest.param(b"$2\r\nab\rX", id="bulk-with-half-crlf"),
        pytest.param(b"$2\r\nabc\r\n", id="bulk-longer-than-said"),
        pytest.param(b":1_000\r\n", id="underscore-in-integer"),
        pytest.param(b": 12\r\n", id="space-in-integer"),
        pytest.param(b":+12\r\n", id="plus-sign"),
        pytest.param(b":\r\n", id="empty-integer"),
        pytest.param(b"$-2\r\n", id="negative-bulk-length"),
        pytest.param(b"*-5\r\n", id="negative-array-length"),
        pytest.param(b"$99999999999\r\n", id="bulk-too-long"),
        pytest.param(b"*1\r\n" * 40 + b":1\r\n", id="nested-too-deep"),
        pytest.param(b"+O\nK\r\n", id="lf-inside-simple-string"),
        pytest.param(b"%1\r\n", id="resp3-map"),
    ],
)
def test_malformed_replies_are_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse(wire)


def test_a_line_that_never_ends_is_a_protocol_error_not_a_wait_forever() -> None:
    assert parse(b"+" + b"x" * 1000) == (INCOMPLETE, 0)
    with pytest.raises(ProtocolError):
        parse(b"+" + b"x" * 100_000)


def _encode(value: Any) -> bytes:
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    return b"*%d\r\n" % len(value) + b"".join(_encode(item) for item in value)


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(5 if depth < 3 else 3)
    if kind == 0:
        return None
    if kind == 1:
        return rng.randrange(-(2**63), 2**63)
    if kind == 2:
        return rng.randbytes(rng.randrange(0, 40))
    return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]


def test_fuzz_every_encoded_value_round_trips_and_every_cut_is_incomplete() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        value = _value(rng)
        wire = _encode(value)
        assert parse(wire) == (value, len(wire))
        cut = rng.randrange(len(wire))
        assert parse(wire[:cut]) == (INCOMPLETE, 0)


def test_fuzz_mutated_replies_never_raise_anything_but_protocol_error() -> None:
    rng = random.Random(4)
    alphabet = b"$*:+-\r\n0123456789-ab"
    for _ in range(20_000):
        wire = bytearray(_encode(_value(rng)))
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(wire) + 1)
            action = rng.randrange(3)
            if action == 0 and wire:
                wire[min(position, len(wire) - 1)] = rng.choice(alphabet)
            elif action == 1:
                wire.insert(position, rng.choice(alphabet))
            elif wire:
                del wire[min(position, len(wire) - 1)]
        try:
            reply, end = parse(bytes(wire))
        except ProtocolError:
            continue
        assert 0 <= end <= len(wire)
        if reply is not INCOMPLETE:
            # One reply, ending where it says, made only of RESP2 types.
            assert parse(bytes(wire[:end])) == (reply, end)
            assert _resp2_value(reply)


def _resp2_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(_resp2_value(item) for item in value)
    return value is None or isinstance(value, int | bytes | ErrorReply)
