"""``celery -A proj redlock ...`` against real lock nodes.

Most commands run in-process through click's CliRunner; a few go through a
real ``python -m celery`` subprocess, which also proves the
``celery.commands`` entry point is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_redlock import Redlock
from celery_redlock.cli import redlock as redlock_command
from celery_redlock.config import limiter_for
from celery_redlock.testing import RedisServer

from .conftest import ROOT

pytestmark = pytest.mark.celery

OWNER = "TASKID|host:1"


def invoke(app: Celery, *args: str, input: str | None = None) -> Result:
    """Run ``celery redlock ARGS`` in this process."""
    return CliRunner().invoke(
        redlock_command,
        list(args),
        obj=CLIContext(app=app, no_color=True, workdir=None),
        input=input,
    )


@pytest.fixture
def celery_cli(
    lock_nodes: list[RedisServer], broker_url: str, witness: RedisServer
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m celery -A tests.celery.taskapp redlock ARGS`` in a subprocess."""

    def run(*args: str, nodes: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "CR_BROKER": broker_url,
            "CR_NODES": nodes or ",".join(node.url for node in lock_nodes),
            "CR_WITNESS": witness.url,
        }
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.celery.taskapp", "redlock", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture
def redlock(lock_nodes: list[RedisServer]) -> Iterator[Redlock]:
    """A Redlock on the app's nodes with the app's key prefix."""
    made = Redlock([node.url for node in lock_nodes], key_prefix="t:")
    yield made
    made.close()


def rows(output: str) -> dict[str, list[str]]:
    """The table's rows by first column (cells split on runs of two spaces)."""
    found = {}
    for line in output.splitlines()[1:]:
        cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
        if cells:
            found[cells[0]] = cells
    return found


def test_locks_lists_a_held_lock_with_owner_ttl_token_and_agreement(
    redlock: Redlock, celery_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    lock = redlock.lock("x", ttl=30.0, owner=OWNER)
    assert lock.acquire(blocking=False)
    for _ in range(2):  # the fencing counter goes up with each acquisition
        lock.release()
        assert lock.acquire(blocking=False)

    done = celery_cli("locks")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == [
        "LOCK",
        "TASK",
        "WORKER",
        "TTL",
        "FENCE",
        "NODES",
    ]
    name, task_id, worker, ttl, fence, nodes = rows(done.stdout)["x"]
    assert (name, task_id, worker, nodes) == ("x", "TASKID", "host:1", "3/3")
    assert 20.0 < float(ttl.removesuffix("s")) <= 30.0
    assert int(fence) == lock.fencing_token == 3


def test_locks_shows_a_node_that_disagrees(
    app: Celery, redlock: Redlock, lock_nodes: list[RedisServer]
) -> None:
    assert redlock.lock("x", ttl=30.0, owner=OWNER).acquire(blocking=False)
    lock_nodes[1].client().delete(redlock.key("x"))

    result = invoke(app, "locks")

    assert result.exit_code == 0, result.output
    assert rows(result.stdout)["x"][-1] == f"2/3 ({lock_nodes[1].url} absent)"


def test_locks_json_and_pattern(app: Celery, redlock: Redlock) -> None:
    assert redlock.lock("sync:1", ttl=30.0, owner=OWNER).acquire(blocking=False)
    assert redlock.lock("other", ttl=30.0).acquire(blocking=False)
    limiter_for(app).hit("sync:1", limit=5, period=60.0)  # a rate-limit key: not a lock

    result = invoke(app, "locks", "sync:*", "--json")

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["complete"] is True
    assert [entry["name"] for entry in data["locks"]] == ["sync:1"]
    (entry,) = data["locks"]
    assert entry["held"] is True
    assert (entry["task_id"], entry["worker"]) == ("TASKID", "host:1")
    assert (entry["agree"], entry["total"], entry["fencing_token"]) == (3, 3, 1)
    assert 20.0 < entry["ttl"] <= 30.0
    assert {node["state"] for node in entry["nodes"]} == {"holds"}

    everything = json.loads(invoke(app, "locks", "--json").stdout)
    assert sorted(entry["name"] for entry in everything["locks"]) == ["other", "sync:1"]


def test_release_yes_frees_the_lock_for_a_new_owner(app: Celery, redlock: Redlock) -> None:
    holder = redlock.lock("x", ttl=30.0, owner=OWNER)
    assert holder.acquire(blocking=False)

    result = invoke(app, "release", "x", "--yes")

    assert result.exit_code == 0, result.output
    assert "held on 3 of 3 nodes" in result.stdout
    fresh = redlock.lock("x", ttl=30.0, owner="NEW|host:2")
    assert fresh.acquire(blocking=False)
    assert fresh.fencing_token == 2  # the fencing counter survives a forced release


def test_release_asks_and_a_no_leaves_the_lock(app: Celery, redlock: Redlock) -> None:
    holder = redlock.lock("x", ttl=30.0, owner=OWNER)
    assert holder.acquire(blocking=False)

    result = invoke(app, "release", "x", input="n\n")

    assert result.exit_code == 1
    assert "TASKID" in result.output  # the prompt names the holder
    assert redlock.holder("x") == holder.value
    assert not redlock.lock("x", ttl=30.0).acquire(blocking=False)


def test_release_wakes_a_blocked_waiter(app: Celery, lock_nodes: list[RedisServer]) -> None:
    # Long retry delay: only the release notification can wake the waiter soon.
    waiting = Redlock([node.url for node in lock_nodes], key_prefix="t:", retry_delay=20.0)
    try:
        assert waiting.lock("x", ttl=30.0, owner=OWNER).acquire(blocking=False)
        outcome: list[bool] = []
        waiter = threading.Thread(
            target=lambda: outcome.append(waiting.lock("x", ttl=30.0).acquire(timeout=10.0))
        )
        waiter.start()
        threading.Event().wait(0.3)  # let it subscribe and go to sleep

        assert invoke(app, "release", "x", "--yes").exit_code == 0

        waiter.join(5.0)
        assert outcome == [True]
    finally:
        waiting.close()


def test_release_of_a_free_lock_says_so(app: Celery) -> None:
    result = invoke(app, "release", "nothing", "--yes")
    assert result.exit_code == 0
    assert "not held" in result.stdout


def test_limits_shows_what_remains(app: Celery) -> None:
    limiter = limiter_for(app)
    for _ in range(3):
        assert limiter.hit("api:acme", limit=5, period=60.0).allowed

    table = invoke(app, "limits", "api:acme", "--rate", "5/m")
    data = json.loads(
        invoke(app, "limits", "api:acme", "--limit", "5", "--period", "60", "--json").stdout
    )

    assert table.exit_code == 0, table.output
    assert rows(table.stdout)["fixed"][1] == "3"
    assert "5 per 60s (fixed): 2 remaining, a hit now is allowed" in table.stdout
    fixed = next(entry for entry in data["state"] if entry["algorithm"] == "fixed")
    assert fixed["used"] == 3
    assert 50.0 < fixed["ttl"] <= 60.0
    assert data["decision"]["remaining"] == 2
    assert data["decision"]["allowed"] is True
    # peeking counted nothing
    assert limiter.hit("api:acme", limit=5, period=60.0).remaining == 1


def test_check_passes_on_healthy_nodes(app: Celery) -> None:
    result = invoke(app, "check")
    data = json.loads(invoke(app, "check", "--json").stdout)

    assert result.exit_code == 0, result.output
    assert "reachable (3 of 3 nodes answer, 2 needed)" in result.stdout
    assert data["ok"] is True
    assert data["quorum"] == {"reachable": 3, "needed": 2, "total": 3, "ok": True}
    assert all(node["ok"] and node["ping_ms"] >= 0 for node in data["nodes"])
    assert data["clock_spread_ms"] < 500
    assert data["errors"] == []


def test_check_fails_with_two_of_three_nodes_killed(
    lock_nodes: list[RedisServer], celery_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    lock_nodes[0].kill()
    lock_nodes[1].kill()

    done = celery_cli("check")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "UNREACHABLE (1 of 3 nodes answer, 2 needed)" in done.stdout
    table = rows(done.stdout)
    assert table[lock_nodes[0].url][1] == table[lock_nodes[1].url][1] == "DOWN"
    assert table[lock_nodes[2].url][1] == "ok"


def test_check_warns_about_an_evicting_node(app: Celery, lock_nodes: list[RedisServer]) -> None:
    client = lock_nodes[0].client()
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        result = invoke(app, "check")
    finally:
        client.config_set("maxmemory-policy", "noeviction")
    assert result.exit_code == 0, result.output
    assert f"warning: {lock_nodes[0].url} has maxmemory-policy allkeys-lru" in result.stdout


def test_bad_nodes_setting_exits_2_naming_it(
    celery_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = celery_cli("check", nodes="http://x")

    assert done.returncode == 2
    assert "redlock_nodes" in done.stderr
    assert "'http://x' is not a Redis URL" in done.stderr


@pytest.mark.parametrize("command", [["locks"], ["release", "x", "--yes"], ["limits", "k"]])
def test_every_command_refuses_bad_settings(
    make_app: Callable[..., Celery], command: list[str]
) -> None:
    result = invoke(make_app(redlock_nodes=["http://x"]), *command)
    assert result.exit_code == 2
    assert "redlock_nodes" in result.stderr


def test_check_rejects_a_ttl_too_short_for_the_node_timeout(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(redlock_default_ttl=0.08, redlock_node_timeout=0.05)
    result = invoke(app, "check")
    assert result.exit_code == 2
    assert "error: redlock_default_ttl (0.08 s) must be more than twice" in result.stdout
