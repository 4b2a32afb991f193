"""Several client processes on one key: mutual exclusion while a node dies."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from celery_redlock import Redlock
from celery_redlock.testing import RedisServer

pytestmark = pytest.mark.integration

WORKERS = 4
SECTIONS = 200


def critical_sections(redlock: Redlock, witness_url: str, count: int) -> None:
    import redis

    witness = redis.Redis.from_url(witness_url)
    for _ in range(count):
        with redlock.lock("shared", ttl=5.0, timeout=60.0) as lock:
            token = lock.fencing_token
            if witness.incr("inside") != 1:
                witness.incr("overlaps")
            # A fencing-aware store: reject a token not above the last one seen.
            last = int(witness.getset("last_token", token) or 0)
            if token <= last:
                witness.incr("stale_tokens")
            witness.incr("sections")
            witness.decr("inside")


def test_processes_never_overlap_while_a_node_is_killed(servers, witness):
    nodes = servers[:3]
    # Built before the fork: every child must open connections of its own.
    # Five processes on a loaded machine: a node timeout no scheduling delay
    # reaches (three misses in a row end a blocking acquire); this test is
    # about mutual exclusion.
    redlock = Redlock([node.url for node in nodes], node_timeout=0.5)
    with redlock.lock("warm-up", ttl=2.0):
        pass
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=critical_sections, args=(redlock, witness.url, SECTIONS))
        for _ in range(WORKERS)
    ]
    for process in processes:
        process.start()
    client = witness.client()
    deadline = time.monotonic() + 60
    while int(client.get("sections") or 0) < WORKERS * SECTIONS // 3:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.01)
    nodes[2].kill()
    for process in processes:
        process.join(90)
        assert process.exitcode == 0
    assert int(client.get("sections") or 0) == WORKERS * SECTIONS
    assert client.get("overlaps") is None
    assert client.get("stale_tokens") is None
    client.close()
    redlock.close()


def test_forked_child_uses_its_own_connections(servers):
    # A node timeout that a loaded machine cannot exceed while the child opens
    # its connections: this test is about whose sockets are used, not latency.
    redlock = Redlock([server.url for server in servers[:3]], node_timeout=2.0)
    lock = redlock.lock("parent", ttl=5.0)
    assert lock.acquire(blocking=False)
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_child_takes_another_lock, args=(redlock,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    # The parent's connections still work after the child used and closed its own.
    lock.extend()
    assert lock.release()
    redlock.close()


def _child_takes_another_lock(redlock: Redlock) -> None:
    lock = redlock.lock("child", ttl=5.0)
    assert lock.acquire(blocking=False)
    assert not redlock.lock("parent").acquire(blocking=False)
    assert lock.release()
    redlock.close()


def test_server_harness_can_pause_and_restart(servers):
    server: RedisServer = servers[0]
    with server.client() as client:
        client.set("x", 1)
    server.restart()
    with server.client() as client:
        assert client.get("x") is None
