"""Real Celery workers on real Redis nodes.

Lock nodes are pool servers 0-2, the broker (and result backend) is server
3, and the witness is the last one. Workers run in-process in a thread
(``threads`` and ``solo`` pools, via ``celery.contrib.testing``) or as a
``celery worker`` subprocess (``prefork``, and whenever a test kills it).
"""

from __future__ import annotations

import gc
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_redlock.tasks import app_state
from celery_redlock.testing import RedisServer, ServerGroup

from .support import WorkerProcess, create_app, start_beat, stop_beat


@pytest.fixture
def lock_nodes(servers: ServerGroup) -> list[RedisServer]:
    return list(servers)[:3]


@pytest.fixture
def broker_url(servers: ServerGroup) -> str:
    return servers[3].url


@pytest.fixture
def make_app(
    lock_nodes: list[RedisServer], broker_url: str, witness: RedisServer
) -> Iterator[Callable[..., Celery]]:
    made: list[Celery] = []

    def make(**conf: Any) -> Celery:
        app = create_app(broker_url, [node.url for node in lock_nodes], witness.url, **conf)
        made.append(app)
        return app

    yield make
    # Results left in reference cycles unsubscribe from the backend when they are
    # collected: now, while it still answers, not at exit after it stopped.
    gc.collect()
    for app in made:
        app_state.forget(app)
        app.close()


@pytest.fixture
def app(make_app: Callable[..., Celery]) -> Celery:
    return make_app()


@pytest.fixture
def worker_process(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(
        pool: str = "prefork",
        concurrency: int = 2,
        conf: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> WorkerProcess:
        worker = WorkerProcess(
            broker_url,
            [node.url for node in lock_nodes],
            witness,
            tmp_path / f"worker{len(started)}.log",
            pool=pool,
            concurrency=concurrency,
            conf={**(conf or {}), **settings},
            env=env,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def beat_process(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``celery beat`` subprocesses (see :func:`start_beat`)."""
    started: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(every: float, **options: Any) -> subprocess.Popen[bytes]:
        process, log = start_beat(
            broker_url,
            [node.url for node in lock_nodes],
            witness,
            tmp_path / f"beat{len(started)}",
            every,
            **options,
        )
        started.append((process, log))
        return process

    yield start
    for process, log in started:
        stop_beat(process)
        log.close()
