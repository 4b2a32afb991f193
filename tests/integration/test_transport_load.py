"""Hundreds of lock operations in flight in one process, with default settings.

Threads, gevent greenlets and eventlet green threads share the lock's few connections per node: no
operation fails for want of a connection, none is leaked (also when a
greenlet is killed in the middle of one), and afterwards each node has only
a couple of connections from the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from celery_redlock.transport import hub as shared_hub
from celery_redlock.transport.nodes import Command, fan_out, make_nodes
from tests.support import client_addresses

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GEVENT_LOAD = Path(__file__).with_name("_gevent_load.py")
EVENTLET_LOCK = Path(__file__).with_name("_eventlet_lock.py")


def test_500_greenlets_in_one_process(servers):
    pytest.importorskip("gevent")
    nodes = list(servers)[:3]
    before = [client_addresses(node) for node in nodes]
    done = subprocess.run(
        [sys.executable, str(GEVENT_LOAD), *(node.url for node in nodes), "500", "10"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["failures"] == []
    assert found["done"] == 500 * 10 + 50 * 10
    # Killed mid-exchange: nothing left behind, the next ones all worked.
    assert found["failures_after_kill"] == 0
    assert found["leading"] is False
    assert found["followers"] == 0
    assert found["links"] == 3  # one per node, shared by all 500
    # The process has exited: the servers drop its connections as they notice.
    deadline = time.monotonic() + 5.0
    while any(client_addresses(node) - old for node, old in zip(nodes, before, strict=True)):
        assert time.monotonic() < deadline, "connections left open after the process exited"
        time.sleep(0.01)


def test_200_threads_in_one_process(servers, make_redlock):
    nodes = list(servers)[:3]
    # 200 threads on two shared cores: a node timeout that no scheduling
    # delay reaches, so that only a failure of the links shows.
    redlock = make_redlock(nodes, node_timeout=1.0)
    before = [client_addresses(node) for node in nodes]
    failures: list[BaseException] = []
    start = threading.Barrier(200)

    def work(number: int) -> None:
        try:
            start.wait(30)
            for round_number in range(10):
                lock = redlock.lock(f"t:{number}:{round_number % 3}", ttl=10.0)
                assert lock.acquire(blocking=False)
                assert lock.release()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    hub = shared_hub.shared()
    assert not hub.leading
    assert hub.followers == []
    opened = [client_addresses(node) - old for node, old in zip(nodes, before, strict=True)]
    assert [len(new) for new in opened] == [1, 1, 1]  # one link per node for all 200


def test_each_thread_gets_its_own_replies_from_whoever_reads_them(servers):
    # Eight threads share each node's one connection: most calls are told
    # their replies by another thread (the one reading the sockets) and
    # return without it; every reply must still be the caller's own.
    nodes = make_nodes([server.url for server in list(servers)[:3]], 1.0)
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def work(number: int) -> None:
        try:
            start.wait(30)
            for round_number in range(200):
                text = f"{number}:{round_number}"
                results = fan_out(nodes, [[Command(("ECHO", text))]] * 3, 1.0)
                assert results == [[text.encode()]] * 3, (text, results)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    hub = shared_hub.shared()
    assert not hub.leading
    assert hub.followers == []
    for node in nodes:
        node.close()


def test_the_lock_under_eventlet(servers):
    # eventlet's monkey-patching removes select.poll: the fan-out waits
    # cooperatively on one epoll descriptor instead, and a released lock
    # still reaches its waiter at once.
    nodes = list(servers)[:3]
    done = subprocess.run(
        [sys.executable, str(EVENTLET_LOCK), *(node.url for node in nodes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["patched"] is True
    assert found["failures"] == []
    assert found["done"] == 50 * 5
    # The poll never switches back into a green thread once it has
    # returned: that woke the main green thread's waiter.wait() while the
    # waiter was still inside acquire().
    assert found["stray_wakeups"] == 0
    assert found["waiter"] == ["returned"], found["waiter"]
    # Woken by the release: a waiter that polled would sleep 15 s or more.
    assert found["handoff"] is not None, done.stderr[-3000:]
    assert found["handoff"] < 10.0, (found["handoff"], done.stderr[-3000:])
