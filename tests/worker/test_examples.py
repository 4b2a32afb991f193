"""Every example runs to the last line its README shows; the docker stack's files parse and
its app works."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from celery_redlock.testing import RedisServer, ServerGroup, free_port

from .support import ROOT, listening

pytestmark = pytest.mark.celery

EXAMPLES = ROOT / "examples"
DOCKER = ROOT / "docker"


def last_line_shown(script: str) -> str:
    """The last line README.md shows for ``script``: the last cell of its table row."""
    for row in (EXAMPLES / "README.md").read_text().splitlines():
        if f"`.venv/bin/python examples/{script}`" in row:
            return row.rstrip(" |").rsplit(" | ", 1)[1].strip("`")
    raise AssertionError(f"examples/README.md has no row for {script}")


#: Every example script (``_support.py`` is not one).
SCRIPTS = sorted(path.name for path in EXAMPLES.glob("*.py") if not path.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_and_stops_its_servers(script):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # What examples/README.md says it prints last.
    assert done.stdout.splitlines()[-1] == last_line_shown(script), output
    assert "Traceback" not in output, output
    first = done.stdout.splitlines()[0]
    ports = [int(port) for port in re.findall(r"\d{4,5}", first.split("ports", 1)[1])]
    assert len(ports) in (3, 4), first
    assert not any(listening(port) for port in ports), "the example left redis-server running"
    assert took < 30, f"{script} took {took:.1f} s"


# -- docker/ ------------------------------------------------------------------------


def compose_file() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_file_has_three_independent_lock_nodes_a_broker_a_worker_and_beat():
    services = compose_file()["services"]
    assert set(services) == {"redis1", "redis2", "redis3", "broker", "worker", "beat"}
    nodes = [services[name] for name in ("redis1", "redis2", "redis3")]
    for node in nodes:
        command = node["command"]
        assert command[0] == "redis-server"
        assert command[command.index("--save") + 1] == ""
        assert command[command.index("--appendonly") + 1] == "no"
        assert not {"--replicaof", "--slaveof"} & set(command)
        assert "ports" not in node  # nothing on the host's 6379
    for name in ("worker", "beat"):
        service = services[name]
        assert service["command"][:4] == ["celery", "-A", "app", name]
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        environment = service["environment"]
        assert environment["REDLOCK_NODES"].split(",") == [
            f"redis://redis{n}:6379/0" for n in (1, 2, 3)
        ]
        assert environment["BROKER_URL"] == "redis://broker:6379/0"
        assert set(service["depends_on"]) == {"broker", "redis1", "redis2", "redis3"}
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in dockerfile
    assert 'pip install ".[prometheus]"' in dockerfile
    assert "COPY docs/examples/quickstart/tasks.py docker/app.py ./" in dockerfile


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        plugin = subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if plugin.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def test_docker_compose_config_parses_the_compose_file():
    command = compose_command()
    if command is None:
        pytest.skip("no Docker Compose here: neither `docker compose` nor `docker-compose` runs")
    done = subprocess.run(
        [*command, "-f", str(DOCKER / "compose.yaml"), "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert set(resolved["services"]) == {"redis1", "redis2", "redis3", "broker", "worker", "beat"}
    assert Path(resolved["services"]["worker"]["build"]["context"]) == ROOT


def start(role: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    extra = (
        ["--pool", "threads", "--without-heartbeat", "--without-mingle", "--without-gossip"]
        if role == "worker"
        else ["--schedule", str(log.with_suffix(".schedule")), "--max-interval", "1"]
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "app", role, "--loglevel", "INFO", *extra],
            cwd=DOCKER,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def requeued(metrics: str) -> bool:
    """Whether some sync found user 1's lock busy and was re-queued."""
    found = re.search(
        r'celery_redlock_lock_busy_total\{action="retry",task="tasks\.sync_user"\} ([0-9.]+)',
        metrics,
    )
    return found is not None and float(found.group(1)) > 0


def test_docker_app_runs_with_a_worker_and_beat(servers: ServerGroup, tmp_path: Path):
    """What compose runs, on local nodes: beat drives the quickstart's tasks, the worker
    serves metrics."""
    nodes: list[RedisServer] = list(servers)[:3]
    port = free_port()
    env = {
        **os.environ,
        "BROKER_URL": servers[3].url,
        "REDLOCK_NODES": ",".join(node.url for node in nodes),
        "METRICS_PORT": str(port),
        # The image copies the quickstart's tasks.py beside app.py.
        "PYTHONPATH": str(ROOT / "docs" / "examples" / "quickstart"),
    }
    worker = start("worker", env, tmp_path / "worker.log")
    beat = start("beat", env, tmp_path / "beat.log")
    metrics = ""
    try:
        # Room for a loaded machine to start the worker and beat first.
        deadline = time.monotonic() + 90
        # A sync re-queued for user 1's busy lock (beat asks every 1 s, a sync takes 1.5 s).
        while time.monotonic() < deadline and not requeued(metrics):
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
                    metrics = page.read().decode()
            except OSError:
                continue
    finally:
        stop(beat)
        stop(worker)
    worker_log = (tmp_path / "worker.log").read_text(errors="replace")
    beat_log = (tmp_path / "beat.log").read_text(errors="replace")
    assert requeued(metrics), f"{metrics[-2000:]}\n{worker_log[-3000:]}"
    assert re.search(r"Task tasks\.fetch_price\[[^]]+\] succeeded", worker_log), worker_log
    assert "skipped: rate limit 'prices-api' reached" in beat_log, beat_log[-3000:]
    assert "Traceback" not in worker_log + beat_log, worker_log + beat_log
