"""The same guarantees with RabbitMQ as the broker.

Locks, singletons and rate limits live on the Redis lock nodes whatever the
broker is; these tests show it with a real worker consuming from RabbitMQ
(results still go to a Redis backend). They need a RabbitMQ server at
``$CELERY_REDLOCK_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672//``)
and are skipped, saying so, when none answers there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_redlock.tasks import app_state
from celery_redlock.testing import RedisServer

from .rate_checker import CLOCK_SPARE, surely_within
from .support import admissions, create_app, in_process_worker, overlaps, preruns_noted

pytestmark = [pytest.mark.celery, pytest.mark.rabbitmq]

AMQP_URL = os.environ.get("CELERY_REDLOCK_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture(scope="module")
def amqp_url() -> str:
    connection = Connection(AMQP_URL, connect_timeout=3)
    try:
        connection.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.skip(
            f"no RabbitMQ broker answers at {AMQP_URL} ({exc}); start one or set "
            "CELERY_REDLOCK_AMQP_URL to run these tests"
        )
    finally:
        connection.release()
    return AMQP_URL


@pytest.fixture
def rabbit_app(
    amqp_url: str, lock_nodes: list[RedisServer], broker_url: str, witness: RedisServer
) -> Iterator[Celery]:
    # A queue of its own that goes away with its last consumer, so runs leave
    # nothing behind on a shared RabbitMQ.
    queue = f"crtest-{uuid.uuid4().hex[:12]}"
    app = create_app(
        amqp_url,
        [node.url for node in lock_nodes],
        witness.url,
        backend=broker_url,
        task_default_queue=queue,
        task_queues=[Queue(queue, auto_delete=True)],
    )
    yield app
    app_state.forget(app)
    app.close()


def test_one_key_never_runs_twice_at_once(rabbit_app: Celery) -> None:
    task = rabbit_app.tasks["t.serial_retry"]
    with in_process_worker(rabbit_app, "threads"):
        results = [task.delay("shared", 0.02) for _ in range(16)]
        ids = [result.get(timeout=90) for result in results]
    assert sorted(ids) == sorted(result.id for result in results)
    events = rabbit_app.witness.events()
    assert len([e for e in events if e[0] == "enter"]) == 16
    assert overlaps(events) == 0


def test_singleton_publishes_collapse(rabbit_app: Celery) -> None:
    single = rabbit_app.tasks["t.single"]
    with in_process_worker(rabbit_app, "threads"):
        results = [single.delay(21) for _ in range(10)]
        assert len({result.id for result in results}) == 1
        assert results[0].get(timeout=30) == results[0].id
    events = rabbit_app.witness.events()
    assert len([e for e in events if e[0] == "enter" and e[1] == "single:21"]) == 1


def test_rate_limit_holds_and_loses_nothing(rabbit_app: Celery) -> None:
    task = rabbit_app.tasks["t.limited_sliding"]
    with preruns_noted(rabbit_app), in_process_worker(rabbit_app, "threads", concurrency=8):
        results = [task.delay(n) for n in range(12)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(12))
    admitted = admissions(rabbit_app, "run", "limited")
    assert len(admitted) == 12
    # Bursts of 5, a window (1 s and the 50 ms margin) apart; judged on brackets of the
    # admissions, as with a Redis broker (a start is recorded late on a loaded machine).
    assert max(s for _, s in admitted) - min(p for p, _ in admitted) >= 2 * 1.05
    assert surely_within(admitted, 6, 1.0 + 0.05 - CLOCK_SPARE) == []
