"""Sentinel-managed masters as lock nodes, against a real ``redis-server --sentinel``.

Each group is a master, its replica and one Sentinel watching them (quorum
one), all throw-away processes; failovers are real (``SENTINEL FAILOVER``, or
the master killed and declared down by the Sentinel).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from celery_redlock import RateLimiter, Redlock, errors
from celery_redlock.testing import ServerGroup
from tests.support import SentinelGroup

pytestmark = pytest.mark.integration

#: A first call asks the Sentinel, then connects and loads the scripts; on a
#: loaded machine a server may wait its turn for a CPU for hundreds of ms.
#: Tests not about node timeouts must not take that for a node that failed.
NODE_TIMEOUT = 0.5


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    made = SentinelGroup()
    yield made
    made.stop()


def wait_for_new_master(group: SentinelGroup, old: tuple[str, int], timeout: float) -> None:
    """Until the Sentinel names a master other than ``old`` (the failover happened)."""
    deadline = time.monotonic() + timeout
    while group.master_address() == old:
        assert time.monotonic() < deadline, "the Sentinel did not fail over"
        time.sleep(0.05)


def keys_on(port: int) -> set[bytes]:
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as client:
        return set(client.keys("*"))


def wait_until_replica(port: int, timeout: float) -> None:
    """Until the server on ``port`` is a replica: the Sentinel has demoted the old master."""
    deadline = time.monotonic() + timeout
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as client:
        while client.info("replication")["role"] != "slave":
            assert time.monotonic() < deadline, "the old master was never demoted"
            time.sleep(0.05)


def test_a_sentinel_url_is_one_node_the_master_it_names(
    group: SentinelGroup, servers: ServerGroup
) -> None:
    redlock = Redlock(
        [group.url, servers[0].url, servers[1].url], key_prefix="s:", node_timeout=NODE_TIMEOUT
    )
    try:
        lock = redlock.lock("invoice:1", ttl=10)
        assert lock.acquire(blocking=False)
        assert b"s:{invoice:1}" in keys_on(group.master.port)
        assert b"s:{invoice:1}" in keys_on(servers[0].port)
        assert not redlock.lock("invoice:1", ttl=10).acquire(blocking=False)
        lock.release()
        assert b"s:{invoice:1}" not in keys_on(group.master.port)
    finally:
        redlock.close()


def test_locks_follow_the_master_after_a_failover(
    group: SentinelGroup, caplog: pytest.LogCaptureFixture
) -> None:
    redlock = Redlock([group.url], key_prefix="s:", node_timeout=NODE_TIMEOUT)
    try:
        with redlock.lock("before", ttl=5):
            pass
        old = group.master_address()
        assert old == ("127.0.0.1", group.master.port)
        group.client.execute_command("SENTINEL", "FAILOVER", group.master_name)
        wait_for_new_master(group, old, timeout=20)
        assert group.master_address() == ("127.0.0.1", group.replica.port)
        # Until the Sentinel demotes it, the old master still takes writes (the
        # failover caveat of docs/operations.md); once it is a replica, its
        # READONLY sends the node back to the Sentinel.
        wait_until_replica(group.master.port, timeout=20)
        with caplog.at_level(logging.WARNING, logger="celery_redlock.nodes"):
            lock = redlock.lock("after", ttl=5)
            assert lock.acquire(blocking=True, timeout=10)
        assert b"s:{after}" in keys_on(group.replica.port)  # the new master
        assert "master moved from" in caplog.text
        lock.release()
        assert b"s:{after}" not in keys_on(group.replica.port)
    finally:
        redlock.close()


def test_a_killed_master_is_replaced_by_its_replica(group: SentinelGroup) -> None:
    redlock = Redlock([group.url], key_prefix="s:", node_timeout=NODE_TIMEOUT)
    try:
        with redlock.lock("before", ttl=5):
            pass
        old = group.master_address()
        assert old is not None
        group.master.kill()
        with pytest.raises(errors.QuorumUnavailable):
            redlock.lock("while-down", ttl=5).acquire(blocking=False)
        wait_for_new_master(group, old, timeout=30)
        # The Sentinel may name the new master a moment before it reports it
        # up (redis-py's discovery skips a master flagged down): until then the
        # node is unavailable, as it is during any failover.
        lock = redlock.lock("after", ttl=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert lock.acquire(blocking=True, timeout=10)
                break
            except errors.QuorumUnavailable:
                assert time.monotonic() < deadline, "the new master never took the lock"
                time.sleep(0.2)
        assert b"s:{after}" in keys_on(group.replica.port)
        lock.release()
    finally:
        redlock.close()


def test_unreachable_sentinels_make_the_node_unavailable_within_the_node_timeout(
    group: SentinelGroup, servers: ServerGroup
) -> None:
    # A node timeout far above a scheduling delay: one timeout and two are
    # far apart, and the plain nodes' first answers come in well within it.
    redlock = Redlock(
        [group.url, servers[0].url, servers[1].url], key_prefix="s:", node_timeout=1.0
    )
    try:
        os.kill(group.process.pid, signal.SIGSTOP)
        group.master.pause()
        try:
            started = time.monotonic()
            lock = redlock.lock("paused", ttl=5)
            assert lock.acquire(blocking=False)  # the two plain nodes are a majority
            took = time.monotonic() - started
            lock.release()
        finally:
            group.master.resume()
            os.kill(group.process.pid, signal.SIGCONT)
        # One Sentinel asked (connect, then a read that times out) and nothing else waited on.
        assert took < 1.0 * 1.6, f"acquire took {took:.3f} s"
        alone = Redlock([group.url], key_prefix="s:", node_timeout=NODE_TIMEOUT)
        try:
            assert alone.lock("back", ttl=5).acquire(blocking=True, timeout=5)
        finally:
            alone.close()
    finally:
        redlock.close()


def test_the_rate_limiter_counts_on_a_sentinel_managed_master(group: SentinelGroup) -> None:
    limiter = RateLimiter(group.url)
    try:
        decisions = [limiter.hit("api", limit=2, period=60).allowed for _ in range(3)]
        assert decisions == [True, True, False]
        assert any(b"api" in key for key in keys_on(group.master.port))
    finally:
        limiter.close()


def test_the_same_master_twice_is_refused(group: SentinelGroup) -> None:
    other = f"sentinel://localhost:{group.port}/0?master_name={group.master_name}"
    with pytest.raises(errors.ConfigurationError, match="are the same Redis server"):
        Redlock([group.url, other])
