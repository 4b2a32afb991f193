"""Fencing tokens for one name never repeat and never go back.

Each test builds one sequence of node states by hand: nodes that answer
without granting (a stale key of an earlier owner), nodes that restart empty
after the delayed restart docs/reliability.md prescribes, buckets that expire
while a lock is held. The fault runs (test_lock_faults.py) mix them at random.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_redlock import Redlock, _clock
from celery_redlock.lock.fencing import ahead_us
from celery_redlock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.integration]

TTL = 1.0
#: Room for a node just restarted (or writing every command to disk) on a
#: loaded machine: these tests are about which tokens nodes record, not latency.
NODE_TIMEOUT = 0.3
#: Longer than every ttl in use (and than node_timeout plus clock skew).
RESTART_DELAY = TTL + 0.2


def take(redlock: Redlock, name: str = "k") -> int:
    """Acquire and release ``name``; return the token."""
    lock = redlock.lock(name, ttl=TTL)
    assert lock.acquire(blocking=False)
    token = lock.fencing_token
    assert token is not None
    assert lock.release()
    return token


def busy(server: RedisServer, redlock: Redlock, name: str = "k") -> None:
    """Make ``server`` answer "busy" for ``name``: a stale key of an earlier owner."""
    with server.client() as client:
        client.set(redlock.key(name), "stale-owner", px=int(RESTART_DELAY * 4000))


def free(server: RedisServer, redlock: Redlock, name: str = "k") -> None:
    with server.client() as client:
        client.delete(redlock.key(name))


def restart_empty(*servers: RedisServer) -> None:
    """Kill, wait out the delayed restart, start again without data."""
    for server in servers:
        server.kill()
    time.sleep(RESTART_DELAY)
    for server in servers:
        server.start()


def test_a_busy_node_whose_bucket_equals_the_token_is_not_agreement(servers, make_redlock):
    a, b, c = list(servers)[:3]
    redlock = make_redlock([a, b, c], node_timeout=NODE_TIMEOUT)
    tokens = [take(redlock) for _ in range(3)]
    # L1 is granted by a and b; c answers busy and keeps its older value.
    busy(c, redlock)
    tokens.append(take(redlock))
    free(c, redlock)
    # a restarts empty; then L2 is granted by a and c while b, the one node
    # left that recorded L1's token, is busy. c's bucket is older than L1's
    # token and a's is gone: a counter scheme would hand L1's token out again.
    restart_empty(a)
    busy(b, redlock)
    second = redlock.lock("k", ttl=TTL)
    assert second.acquire(blocking=False)
    assert second.fencing_token > max(tokens), (second.fencing_token, tokens)
    second.release()


@pytest.fixture
def persistent() -> Iterator[RedisServer]:
    """A node that keeps its data through a crash (every write on disk)."""
    server = RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always")).start()
    yield server
    server.cleanup()


def test_crashes_alone_never_repeat_a_token(servers, persistent, make_redlock):
    a, b = list(servers)[:2]
    c = persistent
    redlock = make_redlock([a, b, c], node_timeout=NODE_TIMEOUT)
    tokens = [take(redlock) for _ in range(3)]
    # An acquisition returns once a majority granted; c, which writes every
    # command to disk first, may still be working through them.
    bucket = redlock.keys("k").fence
    with c.client() as client:
        deadline = time.monotonic() + 5.0
        while int(client.get(bucket) or 0) < max(tokens):
            assert time.monotonic() < deadline, "c never recorded the tokens"
            time.sleep(0.01)
    c.kill()  # down during L1; it keeps its data
    tokens.append(take(redlock))  # a and b
    c.start()
    with c.client() as client:
        assert client.exists(redlock.keys("k").fence)  # came back with its bucket
    restart_empty(a)
    b.kill()  # down during L2
    second = redlock.lock("k", ttl=TTL)
    assert second.acquire(blocking=False)  # a and c
    assert second.fencing_token > max(tokens), (second.fencing_token, tokens)
    second.release()


def test_a_hold_outliving_its_fencing_buckets_keeps_tokens_increasing(servers, make_redlock):
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes, node_timeout=NODE_TIMEOUT)
    tokens = [take(redlock) for _ in range(3)]
    holder = redlock.lock("k", ttl=TTL)
    assert holder.acquire(blocking=False)
    tokens.append(holder.fencing_token)
    for _ in range(3):
        time.sleep(TTL / 3)
        holder.extend()
    # The buckets expire while the lock is held, as a fence_ttl shorter
    # than the hold would make them. (A node that missed every grant, its
    # answer not waited for once a majority had granted, has none to expire.)
    fence = redlock.keys("k").fence
    for node in nodes:
        with node.client() as client:
            client.pexpire(fence, 1)
    time.sleep(0.01)
    for node in nodes:
        with node.client() as client:
            assert not client.exists(fence)
    holder.extend()
    assert holder.release()
    assert take(redlock) > max(tokens)


def test_two_of_three_nodes_wiped_after_a_delayed_restart(servers, make_redlock):
    # Beyond what a majority remembers: the two wiped nodes' buckets read as
    # their clocks, which a delayed restart has carried past every token
    # issued before (node clocks within the restart delay of each other).
    a, b, c = list(servers)[:3]
    redlock = make_redlock([a, b, c], node_timeout=NODE_TIMEOUT)
    tokens = [take(redlock) for _ in range(3)]
    restart_empty(a, b)
    busy(c, redlock)  # c, which remembers, does not take part
    lock = redlock.lock("k", ttl=TTL)
    assert lock.acquire(blocking=False)  # a and b, both empty
    assert lock.fencing_token > max(tokens), (lock.fencing_token, tokens)
    lock.release()


def test_names_sharing_a_bucket_each_keep_increasing(servers, make_redlock):
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes, node_timeout=NODE_TIMEOUT)
    first = "a"
    # Another name that lands in the same bucket.
    second = next(
        f"b{n}" for n in range(100_000) if redlock.keys(f"b{n}").fence == redlock.keys(first).fence
    )
    last = {first: 0, second: 0}
    for round_ in range(40):
        name = first if round_ % 3 else second
        if round_ == 20:
            restart_empty(nodes[round_ % 3])
        token = take(redlock, name)
        assert token > last[name]
        last[name] = token


def node_time_us(server: RedisServer) -> int:
    with server.client() as client:
        seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def test_a_client_clock_running_fast_never_puts_tokens_ahead_of_the_nodes(
    servers, make_redlock, monkeypatch
):
    # Node clocks agree; one client's monotonic clock jumps 600 s ahead. Its
    # proposal is then 600 s past the nodes' clocks: recorded as it is, a
    # node restarted empty after the delay would read a smaller clock.
    a, b, c = list(servers)[:3]
    fast = make_redlock([a, b, c], node_timeout=NODE_TIMEOUT)
    tokens = [take(fast)]  # it has seen the nodes' clocks
    real = _clock.monotonic
    monkeypatch.setattr(_clock, "monotonic", lambda: real() + 600.0)
    busy(c, fast)  # granted by a and b only: c keeps the older bucket
    tokens.append(take(fast))
    monkeypatch.setattr(_clock, "monotonic", real)
    free(c, fast)
    # The bound docs/reliability.md states: at most ahead_us past the largest
    # node clock when it was issued (read here, after).
    latest = max(node_time_us(node) for node in (a, b, c))
    assert tokens[-1] <= latest + ahead_us(int(NODE_TIMEOUT * 1e6)), (tokens, latest)
    # a restarts empty after the delay, b is down: an honest client's token
    # comes from a's clock and c's bucket alone.
    restart_empty(a)
    b.kill()
    honest = make_redlock([a, b, c], node_timeout=NODE_TIMEOUT)
    assert take(honest) > max(tokens), tokens
