"""A task's lock taken while a node was down heals when the node is back, and losses say why.

Three lock nodes, a LockedTask (``t.watch``, ttl 1 s; ``t.watch_3s``, ttl 3 s) that holds its lock
until the test tells it to stop: renewal places the key on a node that came
back empty, so losing another node afterwards costs nothing. A lock that is
lost says whether nodes stopped answering or another owner took it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery, states

from celery_redlock.testing import RedisServer

from .support import in_process_worker, wait_for_event

pytestmark = [pytest.mark.celery, pytest.mark.faults]

KEY = "t:{watch}"
TTL = 1.0


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def value_on(node: RedisServer) -> bytes | None:
    with node.client() as client:
        found: bytes | None = client.get(KEY)
        return found


def test_a_task_lock_taken_with_a_node_down_heals_and_survives_losing_another(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    a, b, c = lock_nodes
    c.kill()
    with in_process_worker(app, "threads"):
        result = app.tasks["t.watch"].delay()
        wait_for_event(app, "enter")
        value = value_on(a)
        assert value is not None
        assert value_on(b) == value
        c.start()  # back, and empty
        # Renewal puts the task's key on c, with the holder's value.
        # Within a renewal or two (a third of the ttl); more allowed for a loaded machine.
        wait_until(lambda: value_on(c) == value, 15.0, "the key placed on the restarted node")
        b.kill()
        time.sleep(3 * TTL)  # three ttls held on a and c alone
        assert result.state == states.STARTED or not result.ready()
        app.witness.client.set("stop:watch", 1)
        outcome = result.get(timeout=30)
    assert outcome == {"lost": False, "reason": None}
    assert result.state == states.SUCCESS
    assert value_on(a) is None  # released
    assert value_on(c) is None


def take_over(nodes: list[RedisServer]) -> None:
    for node in nodes:
        with node.client() as client:
            client.set(KEY, "someone-else", px=30_000)


@pytest.mark.parametrize(
    ("fault", "said", "not_said"),
    [
        pytest.param(
            lambda a, b, c: (b.kill(), c.kill()), "2 nodes unreachable", "taken over", id="down"
        ),
        pytest.param(
            lambda a, b, c: take_over([b, c]),
            "taken over by another owner on 2 nodes",
            "unreachable",
            id="taken-over",
        ),
    ],
)
def test_a_lost_task_lock_says_what_happened(
    app: Celery, lock_nodes: list[RedisServer], fault: Any, said: str, not_said: str
) -> None:
    with in_process_worker(app, "threads"):
        result = app.tasks["t.watch_3s"].delay()
        wait_for_event(app, "enter")
        fault(*lock_nodes)
        outcome = result.get(timeout=30)
    assert outcome["lost"] is True
    assert said in outcome["reason"], outcome
    assert not_said not in outcome["reason"], outcome
