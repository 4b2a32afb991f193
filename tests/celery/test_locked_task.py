"""LockedTask with real workers (threads, solo, prefork) on three real lock nodes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockedTask, Redlock
from celery_redlock.errors import ConfigurationError
from celery_redlock.testing import RedisServer

from .conftest import in_process_worker

pytestmark = pytest.mark.celery


def overlaps(events: list[list[str]]) -> int:
    """Count enter events that came while another run of the same key was inside."""
    inside: dict[str, int] = {}
    found = 0
    for kind, key, *_ in events:
        if kind == "enter":
            inside[key] = inside.get(key, 0) + 1
            found += inside[key] > 1
        elif kind == "exit":
            inside[key] -= 1
    return found


def free_now(nodes: list[RedisServer], key: str, prefix: str = "t:") -> bool:
    """Whether a fresh owner can take lock ``key`` right now."""
    redlock = Redlock([node.url for node in nodes], key_prefix=prefix)
    try:
        lock = redlock.lock(key, ttl=5)
        taken = lock.acquire(blocking=False)
        if taken:
            lock.release()
        return taken
    finally:
        redlock.close()


def wait_free(nodes: list[RedisServer], key: str, timeout: float) -> float:
    """Seconds until lock ``key`` could be taken; fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if free_now(nodes, key):
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"lock {key!r} still held after {timeout} s")


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_one_key_never_runs_twice_at_once(app: Celery, pool: str) -> None:
    with in_process_worker(app, pool):
        results = [app.tasks["t.serial"].delay("shared", 0.02) for _ in range(24)]
        ids = [result.get(timeout=60) for result in results]
    assert sorted(ids) == sorted(result.id for result in results)
    events = app.witness.events()
    assert len([e for e in events if e[0] == "enter"]) == 24
    assert overlaps(events) == 0
    assert app.witness.client.get("overlaps") is None


def test_one_key_busy_path_retries_and_loses_nothing(app: Celery) -> None:
    with in_process_worker(app, "threads"):
        results = [app.tasks["t.serial_retry"].delay("shared", 0.05) for _ in range(12)]
        ids = [result.get(timeout=90) for result in results]
    assert len(set(ids)) == 12
    events = app.witness.events()
    assert overlaps(events) == 0
    assert len([e for e in events if e[0] == "enter"]) == 12


def test_distinct_keys_run_in_parallel(app: Celery) -> None:
    with in_process_worker(app, "threads"):
        results = [app.tasks["t.serial"].delay(f"key{n}", 0.5) for n in range(4)]
        for result in results:
            result.get(timeout=30)
    events = app.witness.events()
    enters = [float(e[3]) for e in events if e[0] == "enter"]
    exits = [float(e[3]) for e in events if e[0] == "exit"]
    # All four were inside at the same moment.
    assert max(enters) < min(exits)


def test_prefork_worker_serialises_one_key(app: Celery, worker_process: Any) -> None:
    worker_process(concurrency=4)
    results = [app.tasks["t.serial"].delay("shared", 0.02) for _ in range(24)]
    for result in results:
        result.get(timeout=60)
    events = app.witness.events()
    assert len([e for e in events if e[0] == "enter"]) == 24
    assert overlaps(events) == 0
    assert len({e[4] for e in events}) > 1, "expected several pool processes to take part"


def test_heartbeat_keeps_the_lock_for_three_ttls(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    with in_process_worker(app, "threads"):
        result = app.tasks["t.long"].delay(3.2).get(timeout=30)
        assert free_now(lock_nodes, "long")
    assert result["lost"] is False
    assert result["lowest_validity"] > 0.3
    assert result["token"] >= 1


def test_hung_task_loses_its_lock(app: Celery, lock_nodes: list[RedisServer]) -> None:
    with in_process_worker(app, "threads"):
        pending = app.tasks["t.hung"].delay(2.5)
        client = app.witness.client
        deadline = time.monotonic() + 10
        while not client.lrange("events", 0, -1) and time.monotonic() < deadline:
            time.sleep(0.02)
        # No progress for 0.5 s, ttl 1 s: another owner gets the lock while
        # the task still sleeps.
        waited = wait_free(lock_nodes, "hung", timeout=2.0)
        assert waited < 2.0
        result = pending.get(timeout=30)
    assert result["lost_flag"] is True
    assert "hung" in result["raised"]


@pytest.mark.parametrize(
    ("task_name", "state"),
    [
        ("t.fail", "FAILURE"),
        ("t.ignore", "PENDING"),
        ("t.reject", "PENDING"),
    ],
)
def test_lock_released_on_every_exit(
    app: Celery, lock_nodes: list[RedisServer], task_name: str, state: str
) -> None:
    with in_process_worker(app, "threads"):
        result = app.tasks[task_name].delay("k")
        if state == "FAILURE":
            with pytest.raises(ValueError, match="failing on purpose"):
                result.get(timeout=20)
        else:
            deadline = time.monotonic() + 10
            while free_now(lock_nodes, "exit:k") is False and time.monotonic() < deadline:
                time.sleep(0.05)
        assert free_now(lock_nodes, "exit:k")


def test_retry_releases_so_the_retried_run_succeeds(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    with in_process_worker(app, "threads"):
        assert app.tasks["t.retry_once"].delay("r").get(timeout=30) == "second run"
        assert free_now(lock_nodes, "exit:r")
    runs = [e for e in app.witness.events() if e[0] == "run"]
    assert [e[5] for e in runs] == ["retries=0", "retries=1"]


def test_soft_time_limit_releases(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker_process()
    result = app.tasks["t.soft"].delay("s")
    with pytest.raises(Exception, match="SoftTimeLimit"):
        result.get(timeout=30)
    assert free_now(lock_nodes, "exit:s")


def test_revoke_terminate_frees_the_lock_at_once(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker_process()
    result = app.tasks["t.sleepy"].delay("v")
    client = app.witness.client
    deadline = time.monotonic() + 20
    while not client.lrange("events", 0, -1) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not free_now(lock_nodes, "exit:v")
    result.revoke(terminate=True)
    # lock_ttl is 30 s: freed by the worker, not by expiry.
    assert wait_free(lock_nodes, "exit:v", timeout=5.0) < 5.0


def test_hard_time_limit_frees_the_lock_from_the_main_process(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker = worker_process()
    result = app.tasks["t.hard"].delay("h")
    with pytest.raises(Exception, match="TimeLimitExceeded"):
        result.get(timeout=30)
    # The default ttl is 60 s: only the main process's cleanup frees it this fast.
    assert wait_free(lock_nodes, "exit:h", timeout=5.0) < 5.0
    assert "freed lock" in worker.log()


def test_killed_worker_lock_expires_within_its_ttl(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker = worker_process()
    app.tasks["t.short_ttl"].delay("x")
    client = app.witness.client
    deadline = time.monotonic() + 20
    while not client.lrange("events", 0, -1) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not free_now(lock_nodes, "exit:x")
    worker.kill()
    killed = time.monotonic()
    wait_free(lock_nodes, "exit:x", timeout=2.0 + 1.0)
    assert time.monotonic() - killed <= 3.0


def test_direct_call_takes_the_lock(app: Celery, lock_nodes: list[RedisServer]) -> None:
    assert app.tasks["t.serial"]("direct", 0.0)
    assert free_now(lock_nodes, "serial:direct")
    holder = Redlock([node.url for node in lock_nodes], key_prefix="t:")
    try:
        with holder.lock("exit:d", ttl=5), pytest.raises(Exception, match="held by another run"):
            app.tasks["t.fail"]("d")
    finally:
        holder.close()


def test_eager_mode_follows_the_same_rules(make_app: Any, lock_nodes: list[RedisServer]) -> None:
    app = make_app(task_always_eager=True)
    result = app.tasks["t.long"].delay(1.2)
    assert result.get()["lost"] is False
    assert free_now(lock_nodes, "long")


class TestBadOptionsFailAtDefinition:
    def make(self, **options: Any) -> None:
        app = Celery("bad", set_as_current=False)

        @app.task(base=LockedTask, bind=True, name="bad.task", shared=False, **options)
        def task(self: Any, user_id: int, page: int = 1) -> None: ...

        app.tasks["bad.task"]

    @pytest.mark.parametrize(
        ("options", "option"),
        [
            ({"lock_key": "user:{missing}"}, "lock_key"),
            ({"lock_key": "user:{user_id"}, "lock_key"),
            ({"lock_key": 42}, "lock_key"),
            ({"lock_ttl": 0}, "lock_ttl"),
            ({"lock_ttl": -1}, "lock_ttl"),
            ({"lock_ttl": "60"}, "lock_ttl"),
            ({"lock_timeout": -1}, "lock_timeout"),
            ({"on_lock_busy": "wait"}, "on_lock_busy"),
            ({"lock_progress_timeout": float("nan")}, "lock_progress_timeout"),
            ({"lock_enabled": "yes"}, "lock_enabled"),
            ({"singleton": 1}, "singleton"),
            ({"singleton": True, "singleton_ttl": 0}, "singleton_ttl"),
            ({"singleton": True, "singleton_key": "s:{nope}"}, "singleton_key"),
            ({"singleton": True, "on_duplicate": "ignore"}, "on_duplicate"),
            ({"global_rate_limit": "5/x"}, "global_rate_limit"),
            ({"global_rate_limit": "0/s"}, "global_rate_limit"),
            ({"global_rate_limit": "5/s", "on_rate_limited": "later"}, "on_rate_limited"),
            ({"global_rate_limit": "5/s", "rate_limit_algorithm": "gcra"}, "rate_limit_algorithm"),
            ({"global_rate_limit": "5/s", "rate_limit_key": "r:{missing}"}, "rate_limit_key"),
            ({"rate_limit_key": "r:{user_id}"}, "rate_limit_key"),
        ],
    )
    def test_bad_option(self, options: dict[str, Any], option: str) -> None:
        with pytest.raises(ConfigurationError, match=f"bad.task.*{option}") as caught:
            self.make(**options)
        assert caught.value.option == option

    def test_good_options_pass(self) -> None:
        self.make(lock_key="user:{user_id}:{page}", lock_ttl=5, on_lock_busy="skip")


@pytest.mark.parametrize(
    ("conf", "option"),
    [
        ({"redlock_nodes": ["http://127.0.0.1:1/0"]}, "redlock_nodes"),
        ({"redlock_nodes": []}, "redlock_nodes"),
        ({"redlock_default_ttl": -5}, "redlock_default_ttl"),
        ({"redlock_node_timeout": "fast"}, "redlock_node_timeout"),
        ({"redlock_key_prefix": 7}, "redlock_key_prefix"),
        ({"redlock_tasks": ["t.plain"]}, "redlock_tasks"),
    ],
)
def test_bad_settings_stop_the_worker_at_startup(make_app: Any, conf: dict, option: str) -> None:
    app = make_app(**conf)
    with (
        pytest.raises(ConfigurationError, match=option) as caught,
        in_process_worker(app, "solo"),
    ):
        pass
    assert caught.value.option == option
