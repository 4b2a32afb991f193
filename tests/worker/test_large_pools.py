"""Large pools with default settings: a gevent worker at ``-c 500``, a threads worker at ``-c 200``.

Each runs 1,000 LockedTasks (``t.serial``: a body under a lock; first a full
pool of 2-3 s runs, all inside their locks at once, then 0.05-0.2 s runs, most
keys distinct, some shared by five runs that wait for each other) in a real
``celery worker`` subprocess on three lock nodes. Every run must end
SUCCESS, no two runs of a key overlap, no lock is left on any node, and the
worker holds a handful of connections per node, not one per pool slot,
giving every one back when it stops.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock._layout import lock_name
from celery_redlock.testing import RedisServer

from ..support import client_addresses
from .support import overlaps

pytestmark = [pytest.mark.celery, pytest.mark.slow, pytest.mark.timeout(300)]

TASKS = 1000
#: Keys shared by several runs, which then queue for the lock (``lock_timeout``).
SHARED_KEYS, RUNS_PER_SHARED_KEY = 20, 5
#: The most connections the worker may hold per node: one link for small
#: batches and one for large ones per process, and the release listeners of
#: runs waiting for a lock right now (none once every run has ended).
CONNECTIONS_PER_NODE = 4


def lock_keys_left(nodes: list[RedisServer]) -> dict[int, list[str]]:
    """The lock keys (prefix ``t:``) still on each node."""
    left: dict[int, list[str]] = {}
    for node in nodes:
        with node.client() as client:
            keys = [key.decode() for key in client.scan_iter(match="t:*", count=1000)]
        found = [key for key in keys if lock_name("t:", key) is not None]
        if found:
            left[node.port] = found
    return left


def new_clients(node: RedisServer, baseline: set[str]) -> set[str]:
    """Clients of ``node`` that were not connected when ``baseline`` was taken."""
    return client_addresses(node) - baseline


def most_inside(events: list[list[str]]) -> int:
    """The most runs that were inside their bodies at one moment."""
    steps = sorted((float(e[3]), 1 if e[0] == "enter" else -1) for e in events)
    inside = peak = 0
    for _, step in steps:
        inside += step
        peak = max(peak, inside)
    return peak


def wait_all_ready(results: list[Any], timeout: float) -> None:
    """Wait until every result is in (SUCCESS or otherwise); fail after ``timeout``."""
    pending = list(results)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [result for result in pending if result.state not in states.READY_STATES]
        if not pending:
            return
        assert time.monotonic() < deadline, f"{len(pending)} of {len(results)} runs not done"
        time.sleep(0.25)


@pytest.mark.parametrize(
    ("pool", "concurrency"),
    [pytest.param("gevent", 500, id="gevent-500"), pytest.param("threads", 200, id="threads-200")],
)
def test_a_large_pool_runs_a_thousand_locked_tasks_with_default_settings(
    app: Celery,
    lock_nodes: list[RedisServer],
    worker_process: Any,
    pool: str,
    concurrency: int,
) -> None:
    rng = random.Random(18)
    # First a full pool of runs long enough to be inside their locks all at
    # once (their releases then come together), then short runs, some
    # sharing keys.
    # Long enough for a loaded 2-core machine to start more than 100 of them
    # before the first ends (seen: 91 inside at once with 2-3 s runs).
    first = [(f"wave{n}", rng.uniform(5.0, 6.0)) for n in range(concurrency)]
    shared = [f"shared{n % SHARED_KEYS}" for n in range(SHARED_KEYS * RUNS_PER_SHARED_KEY)]
    rest = shared + [f"own{n}" for n in range(TASKS - concurrency - len(shared))]
    rng.shuffle(rest)
    serial = app.tasks["t.serial"]
    # All queued before the worker starts: it takes a full pool's worth at once.
    runs = first + [(key, rng.uniform(0.05, 0.2)) for key in rest]
    results = [serial.delay(key, duration) for key, duration in runs]
    baseline = [client_addresses(node) for node in lock_nodes]
    began = time.monotonic()
    worker = worker_process(pool=pool, concurrency=concurrency)
    wait_all_ready(results, timeout=240)
    took = time.monotonic() - began
    worst = [result for result in results if result.state != states.SUCCESS]
    assert not worst, (
        f"{len(worst)} runs did not succeed, the first: {worst[0].state} {worst[0].result!r}\n"
        f"{worst[0].traceback}\n{worker.log()[-5000:]}"
    )
    events = app.witness.events()
    assert len([e for e in events if e[0] == "exit"]) == TASKS
    assert overlaps(events) == 0
    # Far more runs at once than redis-py's default pool of 100 connections.
    peak = most_inside(events)
    assert peak > 100, peak
    # SUCCESS is stored after the run released its lock.
    assert lock_keys_left(lock_nodes) == {}
    # A few links per node, however many runs were in flight at once.
    held = [new_clients(node, before) for node, before in zip(lock_nodes, baseline, strict=True)]
    assert all(len(extra) <= CONNECTIONS_PER_NODE for extra in held), (held, worker.log()[-3000:])
    assert "ERROR" not in worker.log(), worker.log()[-5000:]
    worker.stop()
    # Every connection the worker opened is closed once it is gone.
    deadline = time.monotonic() + 10
    while any(new_clients(node, before) for node, before in zip(lock_nodes, baseline, strict=True)):
        assert time.monotonic() < deadline, "connections still open after the worker stopped"
        time.sleep(0.1)
    print(
        f"{pool} -c {concurrency}: {TASKS} runs in {took:.1f} s, at most {peak} at once, "
        f"worker connections per lock node: {[len(extra) for extra in held]}"
    )
