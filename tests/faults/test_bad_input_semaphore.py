"""Bad input at the semaphore's scripts: an error reply, and nothing written.

The client refuses bad arguments before they reach Redis; these tests call
the scripts directly, as another client or a future bug might, and check on
the server that an error reply left no key behind and another holder's
slot untouched.
"""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from celery_redlock._layout import semaphore_keys
from celery_redlock._scripts import load

pytestmark = [pytest.mark.faults, pytest.mark.integration]

KEYS = semaphore_keys("redlock:", "bad")
GOOD_ACQUIRE = ["tok|t|h:1", "5000", "3", "-1", "", "", "1000"]


@pytest.fixture
def client(servers):
    with servers[0].client() as made:
        yield made


def run(client, script: str, keys, args):
    return client.eval(load(script).source, len(keys), *keys, *args)


def test_a_good_acquire_for_reference(client):
    assert run(client, "semaphore_acquire", KEYS.all, GOOD_ACQUIRE)[0] == 0
    assert client.pttl(KEYS.holders) > 0
    assert client.pttl(KEYS.expiry) > 0


@pytest.mark.parametrize(
    ("position", "value"),
    [
        (0, ""),  # empty holder value
        (1, "0"),
        (1, "-5"),
        (1, "1.5"),
        (1, "nan"),
        (1, "inf"),
        (1, "31536000001"),  # ttl over a year
        (2, "0"),  # limit
        (2, "100001"),
        (2, "2.5"),
        (3, "3"),  # want: not below the limit
        (3, "-2"),
        (5, "-1"),  # ticket
        (5, "1e400"),
        (5, "abc"),
        (6, "0"),  # wait_ms
    ],
)
def test_a_bad_acquire_argument_writes_nothing(client, position, value):
    client.hset(KEYS.holders, "0", "someone")  # another holder's slot, with its ttl
    client.zadd(KEYS.expiry, {"0": 10**15})
    client.pexpire(KEYS.holders, 60000)
    client.pexpire(KEYS.expiry, 60000)
    before = {key: client.dump(key) for key in KEYS.all}
    args = list(GOOD_ACQUIRE)
    args[position] = value
    with pytest.raises(ResponseError):
        run(client, "semaphore_acquire", KEYS.all, args)
    assert {key: client.dump(key) for key in KEYS.all} == before


def test_a_wrong_number_of_keys_or_arguments_is_refused(client):
    with pytest.raises(ResponseError):
        run(client, "semaphore_acquire", KEYS.all[:3], GOOD_ACQUIRE)
    with pytest.raises(ResponseError):
        run(client, "semaphore_acquire", KEYS.all, GOOD_ACQUIRE[:6])
    with pytest.raises(ResponseError):
        run(client, "semaphore_release", KEYS.all, ["0", "v", ""])
    with pytest.raises(ResponseError):
        run(client, "semaphore_release", KEYS.all, ["-2", "v", "", ""])
    with pytest.raises(ResponseError):
        run(client, "semaphore_release_owner", KEYS.all[:2], ["task|where", "chan"])
    assert client.keys("*") == []


@pytest.mark.parametrize(
    "args",
    [
        ["0", "1"],  # ttl
        ["5000", "1", "-1", "v"],  # slot
        ["5000", "1", "0", ""],  # empty value
        ["5000", "1", "0"],  # a slot without its value
    ],
)
def test_a_bad_renewal_writes_nothing(client, args):
    with pytest.raises(ResponseError):
        run(client, "semaphore_renew", KEYS.all[:2], args)
    assert client.keys("*") == []


def test_keys_of_another_type_are_reported_not_overwritten(client):
    client.set(KEYS.holders, "not a hash", px=60000)
    with pytest.raises(ResponseError):
        run(client, "semaphore_acquire", KEYS.all, GOOD_ACQUIRE)
    assert run(client, "semaphore_renew", KEYS.all[:2], ["5000", "1", "0", "v"]) == b"-"
    assert run(client, "semaphore_release_owner", KEYS.all[:2], ["|t|h:1", "chan"]) == 0
    assert client.get(KEYS.holders) == b"not a hash"
    assert client.pttl(KEYS.holders) > 0
