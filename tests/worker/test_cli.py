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
import time
from collections.abc import Callable, Iterator

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry

from celery_redlock import Redlock, signals
from celery_redlock.cli.commands import redlock as redlock_command
from celery_redlock.contrib import prometheus
from celery_redlock.tasks.app_state import limiter_for, redlock_for
from celery_redlock.testing import RedisServer

from ..support import landed_everywhere
from .support import ROOT, in_process_worker, looker, run_times

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
    """Run ``python -m celery -A tests.worker.support redlock ARGS`` in a subprocess."""

    def run(*args: str, nodes: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "CR_BROKER": broker_url,
            "CR_NODES": nodes or ",".join(node.url for node in lock_nodes),
            "CR_WITNESS": witness.url,
        }
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.worker.support", "redlock", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture
def redlock(lock_nodes: list[RedisServer]) -> Iterator[Redlock]:
    """A Redlock on the app's nodes with the app's key prefix (and a node timeout
    no loaded machine reaches: these tests are not about timeouts)."""
    made = looker(lock_nodes)
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
    for _ in range(2):  # the fencing value goes up with each acquisition
        earlier = lock.fencing_token
        lock.release()
        taken = time.monotonic()  # the ttl runs from no sooner than this
        assert lock.acquire(blocking=False)
        assert lock.fencing_token > earlier
    landed_everywhere(redlock, "x")

    done = celery_cli("locks")
    shown_by = time.monotonic() - taken  # the ttl shown had run this long at most

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == [
        "LOCK",
        "TASK",
        "WORKER",
        "TTL",
        "FENCE",
        "NODES",
        "ARGS",
    ]
    name, task_id, worker, ttl, fence, nodes, args = rows(done.stdout)["x"]
    assert args == "-"  # no arguments stored: not a singleton
    assert (name, task_id, worker, nodes) == ("x", "TASKID", "host:1", "3/3")
    # What is left of 30 s, less the time the command took to start (measured).
    assert 30.0 - shown_by - 1.0 < float(ttl.removesuffix("s")) <= 30.0
    # The bucket the name shares holds the last token issued in it: this one.
    assert int(fence) == lock.fencing_token


def test_locks_shows_a_node_that_disagrees(
    app: Celery, redlock: Redlock, lock_nodes: list[RedisServer]
) -> None:
    assert redlock.lock("x", ttl=30.0, owner=OWNER).acquire(blocking=False)
    landed_everywhere(redlock, "x")
    lock_nodes[1].client().delete(redlock.key("x"))

    result = invoke(app, "locks")

    assert result.exit_code == 0, result.output
    assert rows(result.stdout)["x"][5] == f"2/3 ({lock_nodes[1].url} absent)"


def test_locks_json_and_pattern(app: Celery, redlock: Redlock) -> None:
    held = redlock.lock("sync:1", ttl=30.0, owner=OWNER)
    taken = time.monotonic()  # the ttl runs from no sooner than this
    assert held.acquire(blocking=False)
    assert redlock.lock("other", ttl=30.0).acquire(blocking=False)
    landed_everywhere(redlock, "sync:1", "other")
    limiter_for(app).hit("sync:1", limit=5, period=60.0)  # a rate-limit key: not a lock

    result = invoke(app, "locks", "sync:*", "--json")
    shown_by = time.monotonic() - taken

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["complete"] is True
    assert [entry["name"] for entry in data["locks"]] == ["sync:1"]
    (entry,) = data["locks"]
    assert entry["held"] is True
    assert (entry["task_id"], entry["worker"]) == ("TASKID", "host:1")
    assert (entry["agree"], entry["total"]) == (3, 3)
    assert entry["fencing_token"] >= held.fencing_token
    assert 30.0 - shown_by - 1.0 < entry["ttl"] <= 30.0
    assert {node["state"] for node in entry["nodes"]} == {"holds"}

    everything = json.loads(invoke(app, "locks", "--json").stdout)
    assert sorted(entry["name"] for entry in everything["locks"]) == ["other", "sync:1"]


def test_release_yes_frees_the_lock_for_a_new_owner(app: Celery, redlock: Redlock) -> None:
    holder = redlock.lock("x", ttl=30.0, owner=OWNER)
    assert holder.acquire(blocking=False)
    first = holder.fencing_token
    assert first is not None
    landed_everywhere(redlock, "x")

    result = invoke(app, "release", "x", "--yes")

    assert result.exit_code == 0, result.output
    assert "held on 3 of 3 nodes" in result.stdout
    fresh = redlock.lock("x", ttl=30.0, owner="NEW|host:2")
    assert fresh.acquire(blocking=False)
    assert fresh.fencing_token > first  # fencing survives a forced release


def test_release_asks_and_a_no_leaves_the_lock(app: Celery, redlock: Redlock) -> None:
    holder = redlock.lock("x", ttl=30.0, owner=OWNER)
    assert holder.acquire(blocking=False)

    result = invoke(app, "release", "x", input="n\n")

    assert result.exit_code == 1
    assert "TASKID" in result.output  # the prompt names the holder
    assert redlock.holder("x") == holder.value
    assert not redlock.lock("x", ttl=30.0).acquire(blocking=False)


def test_release_wakes_a_blocked_waiter(app: Celery, lock_nodes: list[RedisServer]) -> None:
    # Long retry delay: only the release notification can wake the waiter
    # before its 10 s timeout (its first sleep is 10 s or more).
    waiting = Redlock(
        [node.url for node in lock_nodes], key_prefix="t:", retry_delay=20.0, node_timeout=1.0
    )
    clients = [node.client() for node in lock_nodes]
    try:
        assert waiting.lock("x", ttl=30.0, owner=OWNER).acquire(blocking=False)
        outcome: list[tuple[bool, float]] = []

        def wait_for_it() -> None:
            began = time.monotonic()
            taken = waiting.lock("x", ttl=30.0).acquire(timeout=10.0)
            outcome.append((taken, time.monotonic() - began))

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        # Released once it listens (not after a fixed pause a loaded machine may outlast).
        channel = waiting.keys("x").released
        deadline = time.monotonic() + 10
        while not any(n for c in clients for _, n in c.pubsub_numsub(channel)):
            assert time.monotonic() < deadline, "the waiter never listened"
            time.sleep(0.02)

        assert invoke(app, "release", "x", "--yes").exit_code == 0

        waiter.join(15.0)
        ((taken, took),) = outcome
        assert taken
        # Sooner than its first retry: woken by the release.
        assert took < 10.0
    finally:
        waiting.close()


def test_release_of_a_free_lock_says_so(app: Celery) -> None:
    result = invoke(app, "release", "nothing", "--yes")
    assert result.exit_code == 0
    assert "not held" in result.stdout


def test_limits_shows_what_remains(app: Celery) -> None:
    limiter = limiter_for(app)
    for _ in range(3):
        assert limiter.hit("api:acme", limit=5, period=60.0, algorithm="fixed").allowed

    table = invoke(app, "limits", "api:acme", "--rate", "5/m")
    data = json.loads(
        invoke(app, "limits", "api:acme", "--limit", "5", "--period", "60", "--json").stdout
    )

    assert table.exit_code == 0, table.output
    row = rows(table.stdout)["api:acme"]
    assert row[2:7] == ["5/m", "fixed", "runs", "3", "2"]
    (use,) = data["limits"]
    assert (use["algorithm"], use["used"], use["remaining"]) == ("fixed", 3, 2)
    assert use["retry_after"] == 0.0
    fixed = next(entry for entry in data["state"] if entry["algorithm"] == "fixed")
    assert fixed["exists"] is True
    assert 50.0 < fixed["ttl"] <= 60.0
    # peeking counted nothing
    assert limiter.hit("api:acme", limit=5, period=60.0, algorithm="fixed").remaining == 1


def test_limits_without_a_key_shows_every_task_limit_and_its_use(app: Celery) -> None:
    limiter = limiter_for(app)
    for _ in range(3):
        assert limiter.hit("t.limited", "5/s").allowed
    app.tasks["t.limited_skip"].apply_async((1,), headers={"celery_beat_task": True})

    table = invoke(app, "limits")
    data = json.loads(invoke(app, "limits", "--json").stdout)

    assert table.exit_code == 0, table.output
    by_key = {(use["key"], use["budget"]): use for use in data["limits"]}
    assert (by_key["t.limited", None]["used"], by_key["t.limited", None]["remaining"]) == (3, 2)
    assert by_key["t.limited", None]["task"] == "t.limited"
    assert by_key["t.rate_two/s", None]["rate"] == "5/s"
    assert by_key["t.rate_two/2s", None]["rate"] == "8/2s"
    # beat's publish of t.limited_skip counted in its publish budget, not in its runs'
    assert by_key["t.limited_skip", "publish"]["used"] == 1
    assert by_key["t.limited_skip", None]["used"] == 0
    per_call = {(known["task"], known["key"]) for known in data["per_call"]}
    assert ("t.rate_tenant", "tenant:{tenant}") in per_call
    assert rows(table.stdout)["t.limited"][5:7] == ["3", "2"]


def test_an_override_set_from_the_command_line_reaches_a_running_worker(app: Celery) -> None:
    task = app.tasks["t.limited_skip"]  # 2/m, skip
    with in_process_worker(app, "threads"):
        done = invoke(app, "limits", "t.limited_skip", "--set", "4/m", "--ttl", "1h")
        assert done.exit_code == 0, done.output
        assert "'t.limited_skip' is limited to 4/m for 1h00m" in done.stdout
        results = [task.delay(n) for n in range(4)]
        assert sorted(result.get(timeout=30) for result in results) == list(range(4))

        shown = json.loads(invoke(app, "limits", "t.limited_skip", "--json").stdout)
        check = json.loads(invoke(app, "check", "--json").stdout)
        cleared = invoke(app, "limits", "t.limited_skip", "--clear")

        skipped = threading.Event()

        def note(sender: object = None, task_id: str = "", action: str = "", **_: object) -> None:
            if task_id == "late" and action == "skip":
                skipped.set()

        signals.rate_limited.connect(note, weak=False)
        try:
            task.apply_async((5,), task_id="late")  # 4 used, 2 allowed again: skipped
            assert skipped.wait(30)
        finally:
            signals.rate_limited.disconnect(note)
        del results
    assert shown["override"]["rate"] == "4/m"
    (use,) = shown["limits"]
    assert (use["rate"], use["overridden"], use["used"]) == ("4/m", True, 4)
    assert check["rate_limit"]["overrides"][0]["key"] == "t.limited_skip"
    assert any("'t.limited_skip' is overridden: 4/m" in note for note in check["notes"])
    assert cleared.exit_code == 0
    assert "override on 't.limited_skip' removed" in cleared.stdout
    assert len(run_times(app, "limited_skip")) == 4
    assert json.loads(invoke(app, "check", "--json").stdout)["rate_limit"]["overrides"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["limits", "k", "--set", "5/m"], "--set needs --ttl"),
        (["limits", "k", "--set", "5/x", "--ttl", "1h"], "unknown unit"),
        (["limits", "k", "--set", "5/m", "--ttl", "soon"], "is not a duration"),
        (["limits", "k", "--set", "5/m", "--ttl", "400d"], "366 days"),
        (["limits", "--set", "5/m", "--ttl", "1h"], "need the KEY"),
        (["limits", "k", "--set", "5/m", "--clear"], "not both"),
        (["limits", "k", "--ttl", "1h"], "--ttl goes with --set"),
    ],
)
def test_limits_refuses_a_bad_override(app: Celery, args: list[str], message: str) -> None:
    result = invoke(app, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert limiter_for(app).overrides() == []


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
    assert (
        "error: redlock_default_ttl: 0.08 s is too short for redlock_node_timeout (0.05 s)"
        in result.stdout
    )


def test_check_reports_a_task_lock_ttl_too_short_for_the_node_timeout(
    make_app: Callable[..., Celery],
) -> None:
    # t.long takes a 1 s lock; the worker would refuse to start with it.
    app = make_app(redlock_node_timeout=0.6)
    result = invoke(app, "check")
    assert result.exit_code == 2, result.output
    assert (
        "error: task 't.long': lock_ttl: 1 s is too short for redlock_node_timeout (0.6 s)"
        in result.stdout
    )


# -- singletons' arguments, release by task id or pattern, a task's limits, settings --


def test_locks_shows_the_arguments_a_singleton_was_published_with(
    app: Celery, lock_nodes: list[RedisServer], redlock: Redlock
) -> None:
    single = app.tasks["t.single"]
    queued = single.apply_async((7,), {"flag": True})
    hidden = single.apply_async((8,), argsrepr="(<card number>)")

    listing = rows(invoke(app, "locks", "singleton:*").stdout)
    data = json.loads(invoke(app, "locks", "singleton:*", "--json").stdout)

    by_task = {cells[1]: cells for cells in listing.values()}
    assert by_task[queued.id][2] == "queued"
    assert by_task[queued.id][-1] == "(7, flag=True)"
    assert by_task[hidden.id][-1] == "(<card number>)"
    assert {lock["task_id"]: lock["args"] for lock in data["locks"]} == {
        queued.id: "(7, flag=True)",
        hidden.id: "(<card number>)",
    }
    # The text lives in a key of its own, with the ttl the singleton was written with.
    landed_everywhere(redlock_for(app), *(view["name"] for view in data["locks"]))
    for view in data["locks"]:
        for node in lock_nodes:
            ttl = node.client().pttl(redlock.keys(view["name"]).args)
            assert 0 < ttl <= 3600 * 1000


def test_a_stale_argument_text_is_not_shown_for_a_new_holder(app: Celery, redlock: Redlock) -> None:
    single = app.tasks["t.single"]
    first = single.delay(9)
    (view,) = json.loads(invoke(app, "locks", "singleton:*", "--json").stdout)["locks"]
    assert invoke(app, "release", view["name"], "--yes").exit_code == 0
    # Another owner takes the same name without storing any text.
    assert redlock.lock(view["name"], ttl=30.0, owner="OTHER|host:1").acquire(blocking=False)
    (again,) = json.loads(invoke(app, "locks", "singleton:*", "--json").stdout)["locks"]
    assert (again["task_id"], again["args"]) == ("OTHER", None)
    assert first.id != "OTHER"


def test_release_by_task_id_frees_that_tasks_locks_only(app: Celery, redlock: Redlock) -> None:
    for name in ("run:1", "singleton:t.x:abc"):
        assert redlock.lock(name, ttl=30.0, owner="TASK-A|host:1").acquire(blocking=False)
    assert redlock.lock("run:2", ttl=30.0, owner="TASK-B|host:2").acquire(blocking=False)
    landed_everywhere(redlock, "run:1", "singleton:t.x:abc", "run:2")

    declined = invoke(app, "release", "--task-id", "TASK-A", input="n\n")
    assert declined.exit_code == 1
    assert "run:1" in declined.stderr
    assert len(json.loads(invoke(app, "locks", "--json").stdout)["locks"]) == 3

    result = invoke(app, "release", "--task-id", "TASK-A", input="y\n")

    assert result.exit_code == 0, result.output
    assert "released lock 'run:1' of task TASK-A: freed on 3 of 3 nodes" in result.stdout
    left = json.loads(invoke(app, "locks", "--json").stdout)["locks"]
    assert [(lock["name"], lock["task_id"]) for lock in left] == [("run:2", "TASK-B")]


def test_release_by_task_id_frees_a_queued_singleton_for_a_new_publish(app: Celery) -> None:
    single = app.tasks["t.single"]
    queued = single.delay(21)
    assert single.delay(21).id == queued.id
    (view,) = json.loads(invoke(app, "locks", "singleton:*", "--json").stdout)["locks"]
    landed_everywhere(redlock_for(app), view["name"])

    result = invoke(app, "release", "--task-id", queued.id, "--yes", "--json")

    assert result.exit_code == 0, result.output
    (released,) = json.loads(result.stdout)
    assert released["freed"] == 3
    assert single.delay(21).id != queued.id


def test_release_by_pattern_is_clear_locks(app: Celery, redlock: Redlock) -> None:
    single = app.tasks["t.single"]
    for n in range(3):
        single.delay(n)
    assert redlock.lock("other", ttl=30.0, owner="T|h:1").acquire(blocking=False)

    declined = invoke(app, "release", "--pattern", "singleton:*", input="n\n")
    assert declined.exit_code == 1
    assert "Release these 3 lock(s) matching 'singleton:*'" in declined.stderr

    result = invoke(app, "release", "--pattern", "singleton:*", "--yes")

    assert result.exit_code == 0, result.output
    assert result.stdout.count("released lock 'singleton:t.single:") == 3
    left = json.loads(invoke(app, "locks", "--json").stdout)["locks"]
    assert [lock["name"] for lock in left] == ["other"]
    assert single.delay(0).id  # publishable again


@pytest.mark.parametrize(
    "arguments",
    [[], ["x", "--task-id", "T"], ["--task-id", "T", "--pattern", "*"]],
)
def test_release_takes_exactly_one_target(app: Celery, arguments: list[str]) -> None:
    result = invoke(app, "release", *arguments, "--yes")
    assert result.exit_code == 2
    assert "give one of NAME, --task-id ID or --pattern GLOB" in result.output


def test_limits_of_a_task_reads_its_limit_and_every_key_it_counted(app: Celery) -> None:
    limiter = limiter_for(app)
    # One hit of cost 2: one entry of the sliding log, two units used.
    for key, cost in (("api:acme", 2), ("api:zeta", 1), ("other:x", 1)):
        assert limiter.hit(key, "2/m", cost=cost).allowed

    result = invoke(app, "limits", "--task", "t.limited_key")
    data = json.loads(invoke(app, "limits", "--task", "t.limited_key", "--json").stdout)

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        "task t.limited_key: global_rate_limit 2/m (sliding) on 'api:{customer}'"
    )
    table = rows("\n".join(result.stdout.splitlines()[1:]))
    assert set(table) == {"api:acme", "api:zeta"}
    # KEY, TASK, RATE, ALGORITHM, COUNTS, USED, REMAINING, NEXT
    assert table["api:acme"][1:7] == ["t.limited_key", "2/m", "sliding", "runs", "2", "0"]
    assert table["api:acme"][7] != "now"
    assert table["api:zeta"][5:8] == ["1", "1", "now"]
    (declared,) = data["declared"]
    assert (declared["rate"], declared["key"], declared["glob"]) == (
        "2/m",
        "api:{customer}",
        "api:*",
    )
    assert [(use["key"], use["used"]) for use in data["limits"]] == [
        ("api:acme", 2),
        ("api:zeta", 1),
    ]

    one = invoke(app, "limits", "--task", "t.limited_key", "api:acme")
    assert list(rows("\n".join(one.stdout.splitlines()[1:]))) == ["api:acme"]
    other = invoke(app, "limits", "--task", "t.limited_key", "other:x")
    assert other.exit_code == 2
    assert "'other:x' is not a key of task 't.limited_key''s limits ('api:{customer}')" in (
        other.output
    )


def test_limits_of_a_task_with_one_key(app: Celery) -> None:
    assert limiter_for(app).hit("t.limited", limit=5, period=1.0).allowed
    result = invoke(app, "limits", "--task", "t.limited")
    assert result.exit_code == 0, result.output
    table = rows("\n".join(result.stdout.splitlines()[1:]))
    assert table["t.limited"][5:7] == ["1", "4"]


def test_limits_of_a_task_shows_each_of_its_limits(app: Celery) -> None:
    limiter = limiter_for(app)
    assert limiter.hit([("t.rate_two/s", "5/s"), ("t.rate_two/2s", "8/2s")], cost=3).allowed
    assert limiter.hit([("tenant:acme", "3/s"), ("tenants", "5/s")]).allowed

    two = invoke(app, "limits", "--task", "t.rate_two")
    tenant = invoke(app, "limits", "--task", "t.rate_tenant")

    assert two.exit_code == 0, two.output
    assert two.stdout.splitlines()[0] == (
        "task t.rate_two: global_rate_limit 5/s (sliding) on 't.rate_two/s', "
        "8/2s (sliding) on 't.rate_two/2s'"
    )
    table = rows("\n".join(two.stdout.splitlines()[1:]))
    assert (table["t.rate_two/s"][5:7], table["t.rate_two/2s"][5:7]) == (["3", "2"], ["3", "5"])
    table = rows("\n".join(tenant.stdout.splitlines()[1:]))
    assert (table["tenant:acme"][5:7], table["tenants"][5:7]) == (["1", "2"], ["1", "4"])


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ("t.plain", "task 't.plain' has no global_rate_limit"),
        ("t.limitd", "this app has no task 't.limitd'; did you mean 't.limited'?"),
    ],
)
def test_limits_of_a_task_without_a_limit_says_so(app: Celery, task: str, problem: str) -> None:
    result = invoke(app, "limits", "--task", task)
    assert result.exit_code == 2
    assert problem in result.output


def test_check_fails_on_an_unknown_setting_naming_the_one_meant(
    make_app: Callable[..., Celery],
) -> None:
    result = invoke(make_app(redlock_default_tll=5), "check")
    assert result.exit_code == 2, result.output
    assert (
        "error: redlock_default_tll is not a celery_redlock setting and is ignored; did you "
        "mean redlock_default_ttl?"
    ) in result.stdout


def test_check_fails_on_a_django_style_typo_and_reads_the_rest(
    lock_nodes: list[RedisServer], broker_url: str
) -> None:
    settings = type(
        "Settings",
        (),
        {
            "CELERY_BROKER_URL": broker_url,
            "CELERY_REDLOCK_NODES": [node.url for node in lock_nodes],
            "CELERY_REDLOCK_KEY_PREFX": "dj:",
        },
    )
    app = Celery("proj", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    try:
        result = invoke(app, "check")
    finally:
        app.close()
    assert result.exit_code == 2, result.output
    assert "3 lock nodes, quorum 2" in result.stdout
    assert (
        "error: CELERY_REDLOCK_KEY_PREFX is not a celery_redlock setting and is ignored; did "
        "you mean CELERY_REDLOCK_KEY_PREFIX?"
    ) in result.stdout


def test_locks_shows_semaphore_holders_per_slot(app: Celery, redlock: Redlock) -> None:
    taken = time.monotonic()  # the ttls run from no sooner than this
    first = redlock.semaphore("exports:acme", limit=3, ttl=30.0, owner="TASK-A|host-a:11")
    second = redlock.semaphore("exports:acme", limit=3, ttl=30.0, owner="TASK-B|host-b:22")
    assert first.acquire(blocking=False)
    assert second.acquire(blocking=False)
    lock = redlock.lock("exports:acme", ttl=30.0, owner=OWNER)  # same name: apart
    assert lock.acquire(blocking=False)

    text = invoke(app, "locks")
    assert text.exit_code == 0, text.output
    lines = [line.split() for line in text.stdout.splitlines()]
    header = lines.index(["SEMAPHORE", "SLOT", "TASK", "WORKER", "TTL", "NODES"])
    assert [line[:4] for line in lines[header + 1 :]] == [
        ["exports:acme", "0", "TASK-A", "host-a:11"],
        ["exports:acme", "1", "TASK-B", "host-b:22"],
    ]
    data = json.loads(invoke(app, "locks", "exports:*", "--json").stdout)
    shown_by = time.monotonic() - taken
    assert [entry["name"] for entry in data["locks"]] == ["exports:acme"]
    (view,) = data["semaphores"]
    assert view["name"] == "exports:acme"
    assert view["held"] == 2
    assert [
        (h["slot"], h["task_id"], h["worker"], h["agree"], h["total"]) for h in view["holders"]
    ] == [(0, "TASK-A", "host-a:11", 3, 3), (1, "TASK-B", "host-b:22", 3, 3)]
    assert all(30 - shown_by - 1.0 < h["ttl"] <= 30 for h in view["holders"])

    second.release()
    (view,) = json.loads(invoke(app, "locks", "--json").stdout)["semaphores"]
    assert [h["task_id"] for h in view["holders"]] == ["TASK-A"]
    first.release()
    assert json.loads(invoke(app, "locks", "--json").stdout)["semaphores"] == []


def test_limits_pauses_and_resumes_a_key_for_every_worker(app: Celery) -> None:
    limiter = limiter_for(app)
    paused = invoke(app, "limits", "t.limited", "--pause", "30s")
    assert paused.exit_code == 0, paused.output
    assert "'t.limited' is paused for 30.0s, in every worker and beat" in paused.stdout
    assert not limiter.hit("t.limited", "5/s").allowed
    shown = invoke(app, "limits", "t.limited")
    assert "paused: 30.0s more" in shown.stdout or "paused: 29" in shown.stdout
    assert "--resume ends it" in shown.stdout
    data = json.loads(invoke(app, "limits", "t.limited", "--json").stdout)
    assert 29.0 < data["backoff"]["paused_for"] <= 30.0
    assert 29.0 < data["limits"][0]["paused_for"] <= 30.0
    resumed = invoke(app, "limits", "t.limited", "--resume")
    assert "'t.limited' resumed" in resumed.stdout
    assert limiter.hit("t.limited", "5/s").allowed
    assert "was not paused" in invoke(app, "limits", "t.limited", "--resume").stdout
    both = invoke(app, "limits", "t.limited", "--pause", "1s", "--resume")
    assert both.exit_code == 2
    assert "not both" in both.output


def test_a_refusal_reported_by_a_run_is_signalled_counted_and_shown(app: Celery) -> None:
    registry = CollectorRegistry()
    metrics = prometheus.install(registry)
    seen: list[tuple[str, str]] = []

    def paused(sender: object = None, key: str = "", **_: object) -> None:
        seen.append(("pause", key))

    def adapted(sender: object = None, key: str = "", change: str = "", **_: object) -> None:
        seen.append((change, key))

    signals.rate_paused.connect(paused, weak=False)
    signals.rate_adapted.connect(adapted, weak=False)
    witness = app.witness.client  # type: ignore[attr-defined]
    witness.set("api:retry_after", "0.3")
    witness.set("api:refuse", 1)
    try:
        with in_process_worker(app, "threads"):
            assert app.tasks["t.api_adaptive"].delay(1).get(timeout=30) == 1
            time.sleep(1.1)  # a period without a refusal: the next decision finds a step up
            assert app.tasks["t.api_adaptive"].delay(2).get(timeout=30) == 2
    finally:
        signals.rate_paused.disconnect(paused)
        signals.rate_adapted.disconnect(adapted)
        metrics.disconnect()
    # the run's re-queue, or the second run, is the decision that finds each step up
    assert seen[:2] == [("pause", "adaptive-api"), ("decrease", "adaptive-api")]
    increases = seen[2:]
    assert increases
    assert set(increases) == {("increase", "adaptive-api")}
    name = "celery_redlock_rate_backoff_total"
    counted = {"pause": 1, "decrease": 1, "increase": len(increases)}
    for change, count in counted.items():
        labels = {"task": "t.api_adaptive", "change": change}
        assert registry.get_sample_value(name, labels) == count
    shown = invoke(app, "limits", "--task", "t.api_adaptive")
    assert shown.exit_code == 0, shown.output
    view = invoke(app, "limits", "adaptive-api")
    # one run was admitted in the window when it was refused: 0.75 of one unit is below
    # the floor (1 % of 40/s); then a step of 1 % of 40/s per second
    assert "/s in force, under a ceiling of 40/s" in view.stdout
    assert "adaptive: 0.4/s" not in view.stdout
