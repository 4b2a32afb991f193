"""Where a renewal puts a held lock's key or slot back, and where it never may.

A renewal writes a missing copy (``SET NX``, a free slot taken) only on the
nodes that lacked it, and only once a majority confirmed, in the same round,
that they still hold it. A lock freed on every node (a worker's main process
frees a killed pool process's locks by owner, while the dying process may
still be renewing) must never be written anywhere again, even for the moment
before the renewal finds it lost and deletes what it wrote.

What the nodes did is read from their keyspace notifications: a key written
and deleted again within one renewal leaves no trace in the keys themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from typing import Any

import pytest

from celery_redlock import errors
from celery_redlock.lock.quorum import LOST, RENEWED
from celery_redlock.testing import RedisServer
from tests.support import count_fan_outs, with_node_timeout

pytestmark = pytest.mark.integration

#: Tests about what a renewal writes, not about node timeouts (see test_heartbeat.py).
NODE_TIMEOUT = 0.5
#: Long enough that the process heartbeat renews nothing while a test runs.
TTL = 60.0
OWNER, TASK, WHERE = "task-1|host:10", "task-1", "host:10"
#: Written on each node after the action: its notification ends what the action caused.
MARKER = "renewal-placement:marker"
#: Events that write a lock key or a slot where there was none.
PLACING = {"set", "hset"}


@pytest.fixture
def make_redlock(make_redlock: Any) -> Any:
    return with_node_timeout(make_redlock, NODE_TIMEOUT)


@contextmanager
def key_events(
    nodes: Sequence[RedisServer], keys: Sequence[str]
) -> Iterator[list[tuple[int, str, str]]]:
    """Record each node's keyspace events on ``keys`` while the block runs.

    Yields a list filled on exit with ``(node index, key, event)``, every
    event of the block included: each node's subscription is confirmed before
    the block, and a write of :data:`MARKER` after it is read back last.
    """
    channels = {f"__keyspace@0__:{key}": key for key in keys}
    marker = f"__keyspace@0__:{MARKER}"
    seen: list[tuple[int, str, str]] = []
    with ExitStack() as stack:
        listeners = []
        for node in nodes:
            client = stack.enter_context(closing(node.client()))
            before = client.config_get("notify-keyspace-events")["notify-keyspace-events"]
            stack.callback(client.config_set, "notify-keyspace-events", before)
            client.config_set("notify-keyspace-events", "KA")
            listener = stack.enter_context(closing(client.pubsub()))
            listener.subscribe(*channels, marker)
            confirmed = 0
            while confirmed < len(channels) + 1:
                message = listener.get_message(timeout=5.0)
                assert message is not None, f"{node.url}: subscription not confirmed"
                confirmed += message["type"] == "subscribe"
            listeners.append((client, listener))
        yield seen
        for index, (client, listener) in enumerate(listeners):
            client.set(MARKER, "1")
            while True:
                message = listener.get_message(timeout=5.0)
                assert message is not None, f"node {index}: the marker's event never came"
                if message["type"] != "message":
                    continue
                channel = message["channel"].decode()
                if channel == marker:
                    break
                seen.append((index, channels[channel], message["data"].decode()))
            client.delete(MARKER)


def hold(redlock: Any, name: str) -> tuple[Any, Any, list[str]]:
    """An auto-renewed lock and semaphore slot of one run (:data:`OWNER`), and their keys."""
    lock = redlock.lock(name, ttl=TTL, owner=OWNER, auto_renew=True)
    sem = redlock.semaphore(name, limit=2, ttl=TTL, owner=OWNER, auto_renew=True)
    assert lock.acquire(blocking=False)
    assert sem.acquire(blocking=False)
    return lock, sem, [lock.key, sem.keys.holders, sem.keys.expiry]


def delete_on(nodes: Sequence[RedisServer], lock: Any, sem: Any) -> None:
    for node in nodes:
        with closing(node.client()) as client:
            client.delete(lock.key)
            client.hdel(sem.keys.holders, str(sem.slot))
            client.zrem(sem.keys.expiry, str(sem.slot))


def freed_by_owner(redlock: Any, nodes: Sequence[RedisServer], lock: Any, sem: Any) -> None:
    """As the worker's main process frees a killed pool process's run: on every node."""
    assert redlock.release_owner(lock.name, TASK, WHERE) == len(nodes)
    assert redlock.release_semaphore_owner(sem.name, TASK, WHERE) == len(nodes)


@pytest.mark.parametrize("freed", ["by owner on every node", "on two nodes of three"])
def test_a_renewal_round_never_writes_a_lock_or_slot_a_majority_lacks(
    servers: Any, make_redlock: Any, freed: str
) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock, sem, keys = hold(redlock, "freed")
    if freed == "on two nodes of three":
        delete_on(nodes[:2], lock, sem)
    else:
        freed_by_owner(redlock, nodes, lock, sem)
    with key_events(nodes, keys) as events:
        # The heartbeat's round (Heartbeat._renew calls exactly this).
        assert redlock.renew([lock, sem]) == [LOST, LOST]
    placed = [event for event in events if event[2] in PLACING]
    assert placed == [], f"the renewal wrote what it then found lost: {events}"
    assert lock.value is None
    assert sem.value is None
    for node in nodes:
        with closing(node.client()) as client:
            assert client.exists(*keys) == 0


def test_extend_never_writes_a_lock_or_slot_freed_on_every_node(
    servers: Any, make_redlock: Any
) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock, sem, keys = hold(redlock, "freed-extend")
    freed_by_owner(redlock, nodes, lock, sem)
    with key_events(nodes, keys) as events:
        with pytest.raises(errors.LockLost):
            lock.extend()
        with pytest.raises(errors.LockLost):
            sem.extend()
    placed = [event for event in events if event[2] in PLACING]
    assert placed == [], f"extend() wrote what it then found lost: {events}"


def test_a_renewal_round_places_what_one_node_lost_while_a_majority_holds_it(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock, sem, keys = hold(redlock, "heal")
    other = redlock.lock("heal-adopted", ttl=TTL)
    assert other.acquire(blocking=False)
    # Built from a token: its validity is unknown until a majority confirms
    # it, which this round does before it places anything.
    adopted = redlock.lock("heal-adopted", ttl=TTL, token=other.value)
    nodes[2].flush()  # node 2 came back empty: no keys, no scripts
    fan_outs = count_fan_outs(monkeypatch, this_thread=True)
    caplog.set_level(logging.INFO, logger="celery_redlock.lock")
    sent = time.monotonic()
    with key_events(nodes, [*keys, other.key]) as events:
        assert redlock.renew([lock, sem, adopted]) == [RENEWED] * 3
    # Each node: two SCRIPT LOADs, a renew.lua call for both locks, a
    # semaphore_renew.lua call. Then node 2 alone: the same, placing.
    assert fan_outs == [[4, 4, 4], [0, 0, 4]]
    assert sorted((index, event) for index, _, event in events if event in PLACING) == [
        (2, "hset"),
        (2, "set"),
        (2, "set"),
    ]
    with closing(nodes[2].client()) as client:
        assert client.get(lock.key) == lock.value.encode()
        assert client.get(other.key) == other.value.encode()
        assert client.hget(sem.keys.holders, str(sem.slot)) == sem.value.encode()
        assert client.zscore(sem.keys.expiry, str(sem.slot)) is not None
        assert 0 < client.pttl(lock.key) <= TTL * 1000
    for held in (lock, sem, adopted):
        assert held.validity > TTL - (TTL * 0.01 + 0.002) - (time.monotonic() - sent) - 1e-6
    told = [r.getMessage() for r in caplog.records if r.name == "celery_redlock.lock"]
    assert "renewal placed 3 lock key(s) again on nodes that lacked them" in told
    # With the copy back, node 0 may go: nodes 1 and 2 still hold all three.
    nodes[0].kill()
    assert redlock.renew([lock, sem, adopted]) == [RENEWED] * 3
    assert lock.release()
    assert sem.release()
    assert adopted.release()
