"""Real Celery workers on real Redis nodes.

Lock nodes are pool servers 0-2, the broker (and result backend) is server
3, and the witness is the last one. Workers run in-process in a thread
(``threads`` and ``solo`` pools, via ``celery.contrib.testing``) or as a
``celery worker`` subprocess (``prefork``, and whenever a test kills it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import config
from celery_redlock.testing import RedisServer, ServerGroup

from .taskapp import create_app

ROOT = Path(__file__).resolve().parents[2]


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
    for app in made:
        config.forget(app)
        app.close()


@pytest.fixture
def app(make_app: Callable[..., Celery]) -> Celery:
    return make_app()


@contextlib.contextmanager
def in_process_worker(app: Celery, pool: str, concurrency: int = 4) -> Iterator[Any]:
    """A worker in a thread of the test process (``threads`` or ``solo`` pool)."""
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency if pool != "solo" else 1,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as worker:
        yield worker


class WorkerProcess:
    """``celery worker`` in a subprocess, so a test can kill it."""

    def __init__(
        self,
        broker_url: str,
        nodes: list[str],
        witness: RedisServer,
        log: Path,
        pool: str = "prefork",
        concurrency: int = 2,
    ) -> None:
        self.witness = witness
        self.log_path = log
        env = {
            **os.environ,
            "CR_BROKER": broker_url,
            "CR_NODES": ",".join(nodes),
            "CR_WITNESS": witness.url,
        }
        witness.client().delete("worker-ready")
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery.taskapp",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                str(concurrency),
                "--loglevel",
                "INFO",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
                "--hostname",
                f"w{os.getpid()}-{time.monotonic_ns()}@%h",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(30)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = self.witness.client()
        while time.monotonic() < deadline:
            if client.get("worker-ready"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"worker did not start; its log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool children."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@pytest.fixture
def worker_process(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(pool: str = "prefork", concurrency: int = 2) -> WorkerProcess:
        worker = WorkerProcess(
            broker_url,
            [node.url for node in lock_nodes],
            witness,
            tmp_path / f"worker{len(started)}.log",
            pool=pool,
            concurrency=concurrency,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def beat_process(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer, tmp_path: Path
) -> Iterator[Callable[[float], subprocess.Popen[bytes]]]:
    """Start ``celery beat`` subprocesses sending ``t.single(11)`` every ``every`` s."""
    started: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(every: float) -> subprocess.Popen[bytes]:
        number = len(started)
        env = {
            **os.environ,
            "CR_BROKER": broker_url,
            "CR_NODES": ",".join(node.url for node in lock_nodes),
            "CR_WITNESS": witness.url,
            "CR_BEAT_EVERY": str(every),
        }
        log = (tmp_path / f"beat{number}.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery.taskapp",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(tmp_path / f"beat{number}.schedule"),
                "--max-interval",
                "1",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append((process, log))
        return process

    yield start
    for process, log in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        log.close()
