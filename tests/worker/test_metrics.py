"""Prometheus metrics of a real prefork worker, scraped from the endpoint it serves."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_redlock.testing import free_port

from .support import WorkerProcess

RUNS = 6

#: A histogram of the same name and task, counted by an earlier run of the
#: worker into the directory it is given.
EARLIER_RUN = """
from prometheus_client import Histogram
wait = Histogram("celery_redlock_lock_wait_seconds", "earlier run", ["task"])
for _ in range(100):
    wait.labels("t.serial").observe(0.001)
"""


def scrape(port: int) -> dict[str, float]:
    """``name{task="t.serial"}`` -> value, for the worker's celery_redlock samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("celery_redlock_")
        and sample.labels.get("task") == "t.serial"
        and "le" not in sample.labels
    }


@pytest.mark.parametrize("given_directory", [False, True], ids=["own-directory", "env-directory"])
def test_a_prefork_worker_serves_what_its_children_counted(
    app: Celery,
    worker_process: Callable[..., WorkerProcess],
    tmp_path: Path,
    given_directory: bool,
) -> None:
    port = free_port()
    env = {"CR_METRICS_PORT": str(port)}
    if given_directory:
        # The documented setup, with files an earlier run left behind.
        directory = tmp_path / "metrics"
        directory.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
        subprocess.run(
            [sys.executable, "-c", EARLIER_RUN], env={**env, "PATH": ""}, check=True, cwd=tmp_path
        )
        assert list(directory.glob("*.db"))
    worker = worker_process(pool="prefork", concurrency=2, env=env)
    results = [app.tasks["t.serial"].delay(f"metrics-{n}", 0.2) for n in range(RUNS)]
    for result in results:
        result.get(timeout=60)

    # Each release is counted after its run's result is stored: wait for all.
    deadline = time.monotonic() + 30
    samples = scrape(port)
    while samples.get("celery_redlock_lock_held_seconds_count") != RUNS:
        assert time.monotonic() < deadline, samples
        time.sleep(0.2)
        samples = scrape(port)
    assert samples["celery_redlock_lock_wait_seconds_count"] == RUNS

    # Every run was a pool child's, none the main process's (which serves).
    runners = {int(event[4]) for event in app.witness.events() if event[0] == "enter"}  # type: ignore[attr-defined]
    assert len(runners) >= 1
    assert worker.process.pid not in runners
