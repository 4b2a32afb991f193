"""LockedTask with real workers (threads, solo, prefork, gevent, eventlet) on three lock nodes."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
from celery import Celery, Task, current_task, uuid
from celery.signals import task_postrun

from celery_redlock import LockedTask, signals
from celery_redlock.errors import ConfigurationError
from celery_redlock.tasks.run_endings import BUSY_HEADER
from celery_redlock.testing import RedisServer

from ..support import landed_everywhere
from .support import free_now, in_process_worker, looker, overlaps, wait_for_event, wait_free

pytestmark = pytest.mark.celery


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
        # 2 s each: room for a loaded machine to start the four apart.
        results = [app.tasks["t.serial"].delay(f"key{n}", 2.0) for n in range(4)]
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


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_worker_serialises_one_key(
    app: Celery, worker_process: Any, lock_nodes: list[RedisServer], pool: str
) -> None:
    # eventlet's monkey-patching removes select.poll; gevent's replaces it.
    pytest.importorskip(pool)
    worker = worker_process(pool=pool, concurrency=8)
    results = [app.tasks["t.serial"].delay("shared", 0.02) for _ in range(24)]
    for result in results:
        result.get(timeout=60)
    events = app.witness.events()
    assert len([e for e in events if e[0] == "enter"]) == 24
    assert overlaps(events) == 0
    assert free_now(lock_nodes, "serial:shared")
    assert "ERROR" not in worker.log(), worker.log()[-3000:]


def test_heartbeat_keeps_the_lock_for_three_ttls(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    with in_process_worker(app, "threads"):
        result = app.tasks["t.long"].delay(3.2).get(timeout=30)
        assert free_now(lock_nodes, "long")
    assert result["lost"] is False
    # Renewed with 2/3 of the 1 s ttl left, not at the last moment; room for
    # the heartbeat thread (and the body's look) to come 0.5 s late.
    assert result["lowest_validity"] > 0.15
    assert result["token"] >= 1


def test_hung_task_loses_its_lock(app: Celery, lock_nodes: list[RedisServer]) -> None:
    with in_process_worker(app, "threads"):
        pending = app.tasks["t.hung"].delay(4.0)
        started = float(wait_for_event(app, "hung-started")[3])
        # No progress for 0.5 s, ttl 1 s: another owner gets the lock about
        # 1.5 s after the run's last progress (before its event), while it
        # still sleeps. Judged from the event, not from when this thread got
        # to look; 1 s for a loaded machine's lateness, within the 4 s sleep.
        wait_free(lock_nodes, "hung", timeout=10.0)
        assert time.monotonic() - started < 1.5 + 1.0
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
    # Checked once the worker is done with the run (task_postrun comes after
    # the task's call, and so after the release), never before it started.
    wanted = uuid()
    ended = threading.Event()

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id == wanted:
            ended.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app, "threads"):
            result = app.tasks[task_name].apply_async(("k",), task_id=wanted)
            if state == "FAILURE":
                with pytest.raises(ValueError, match="failing on purpose"):
                    result.get(timeout=20)
            assert ended.wait(20), f"{task_name} did not end"
            assert free_now(lock_nodes, "exit:k")
    finally:
        task_postrun.disconnect(on_postrun)


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
    wait_for_event(app, "started")
    assert not free_now(lock_nodes, "exit:v")
    result.revoke(terminate=True)
    # lock_ttl is 30 s, renewed every 10 s: freed by the worker, not by expiry.
    assert wait_free(lock_nodes, "exit:v", timeout=15.0) < 15.0


def test_hard_time_limit_frees_the_lock_from_the_main_process(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker = worker_process()
    result = app.tasks["t.hard"].delay("h")
    with pytest.raises(Exception, match="TimeLimitExceeded"):
        result.get(timeout=30)
    # The default ttl is 60 s: only the main process's cleanup frees it this fast.
    assert wait_free(lock_nodes, "exit:h", timeout=20.0) < 20.0
    assert "freed lock" in worker.log()


def wait_for_run(app: Celery, task_id: str, timeout: float = 30.0) -> None:
    """Wait until the body of ``task_id`` has started (its ``run`` event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e[0] == "run" and e[2] == task_id for e in app.witness.events()):
            return
        time.sleep(0.02)
    raise AssertionError(f"task {task_id} did not start within {timeout} s")


@pytest.mark.parametrize("name", ["t.limit_lock", "t.limit_slot"])
def test_a_hard_time_limit_is_not_told_as_a_lost_lock(
    app: Celery, worker_process: Any, name: str
) -> None:
    """The worker frees a killed run's lock or slot for the run waiting on it: no loss is told.

    Each hard-limited run has a run of the same key waiting beside it, which
    takes the lock (or slot) as soon as the worker frees it, before the
    killed run's own ``finally`` looks at it. A run whose keys are really
    deleted under it is still told lost, by the same worker.
    """
    worker_process(concurrency=2)
    task = app.tasks[name]
    hung = []
    for _ in range(3):
        hung.append(task.apply_async(("k", "hang"), time_limit=1.0))
        wait_for_run(app, hung[-1].id)  # holding it: the next run waits for it
        assert task.delay("k", "next").get(timeout=60) == "next"
    for result in hung:
        with pytest.raises(Exception, match="TimeLimitExceeded"):
            result.get(timeout=30)
    lost_run = task.delay("k", "lose")
    assert lost_run.get(timeout=30) == "lose"
    lost = [event for event in app.witness.events() if event[0] == "lost"]
    assert [event[2] for event in lost] == [lost_run.id], lost


def test_killed_worker_lock_expires_within_its_ttl(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker = worker_process()
    app.tasks["t.short_ttl"].delay("x")
    wait_for_event(app, "started")
    assert not free_now(lock_nodes, "exit:x")
    worker.kill()
    killed = time.monotonic()  # after the kill: no renewal since
    wait_free(lock_nodes, "exit:x", timeout=10.0)
    # Free within the ttl (2 s) of the last renewal; 1 s for the looks' lateness.
    assert time.monotonic() - killed <= 2.0 + 1.0


def test_apply_inside_a_run_holding_the_same_lock_runs_under_its_hold(
    make_app: Any, lock_nodes: list[RedisServer]
) -> None:
    app = make_app()

    @app.task(base=LockedTask, bind=True, shared=False, name="r.inner", lock_key="acct:{n}")
    def inner(self: Any, n: int) -> int | None:
        return self.lock.fencing_token if self.lock is not None else None

    @app.task(base=LockedTask, bind=True, shared=False, name="r.outer", lock_key="acct:{n}")
    def outer(self: Any, n: int) -> list[Any]:
        nested = inner.apply((n,)).get()
        other = inner.apply((n + 1,)).get()  # another key: a lock of its own
        return [self.lock.fencing_token, nested, other, free_now(lock_nodes, f"acct:{n}")]

    with in_process_worker(app, "threads"):
        token, nested, other, freed = outer.delay(1).get(timeout=30)
    assert nested == token  # the caller's hold, not a lock of its own
    assert other is not None
    assert other != token
    assert freed is False  # the nested run left the caller's lock alone
    assert free_now(lock_nodes, "acct:1")
    assert free_now(lock_nodes, "acct:2")


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
            ({"global_rate_limit": "5/s", "rate_limit_algorithm": "leaky"}, "rate_limit_algorithm"),
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


def test_lock_ttl_too_short_for_the_node_timeout_stops_the_worker_at_startup(
    make_app: Any,
) -> None:
    # t.long and t.hung take a 1 s lock: not more than twice a 0.5 s node timeout.
    app = make_app(redlock_node_timeout=0.5)
    with (
        pytest.raises(ConfigurationError, match="lock_ttl: 1 s is too short") as caught,
        in_process_worker(app, "solo"),
    ):
        pass
    assert caught.value.option == "lock_ttl"
    assert caught.value.task in {"t.long", "t.hung"}


def test_busy_retry_backs_off_at_most_the_lock_ttl(
    make_app: Any, lock_nodes: list[RedisServer]
) -> None:
    app = make_app(redlock_default_ttl=1.0)
    holder = looker(lock_nodes)
    busy: list[dict[str, Any]] = []

    def seen(sender: Any = None, **fields: Any) -> None:
        busy.append(fields)

    signals.lock_busy.connect(seen, weak=False)
    try:
        with in_process_worker(app, "threads"):
            lock = holder.lock("serial:b", ttl=10.0)
            assert lock.acquire(blocking=False)
            # As if re-queued 8 times already for a busy lock: 2 ** 8 s of backoff,
            # were it not capped at the lock's ttl (redlock_default_ttl, 1 s).
            result = app.tasks["t.serial_retry"].apply_async(("b", 0.0), headers={BUSY_HEADER: 8})
            deadline = time.monotonic() + 10
            while not busy:
                assert time.monotonic() < deadline, "the run never found the lock busy"
                time.sleep(0.02)
            lock.release()
            # Capped at 1 s: far sooner than 2 ** 8 s, though a loaded machine is slow.
            assert result.get(timeout=60) == result.id
    finally:
        signals.lock_busy.disconnect(seen)
        holder.close()
    assert busy[0]["action"] == "retry"


class _Wrapping(Task):  # type: ignore[misc]
    """A base class wrapping every call, as app-context or tracing bases do."""

    wrapped: ClassVar[list[str]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _Wrapping.wrapped.append(self.request.id)
        return super().__call__(*args, **kwargs)


class _WrappedLockedTask(LockedTask, _Wrapping):
    pass


@pytest.mark.parametrize("base", [LockedTask, _WrappedLockedTask])
def test_the_body_runs_as_celery_runs_it(app: Celery, base: type) -> None:
    """Inside the body: the run's request, the current task, the lock; a base's __call__ runs."""
    _Wrapping.wrapped.clear()

    @app.task(base=base, bind=True, name=f"t.inside.{base.__name__}", lock_key="inside:{n}")
    def inside(self: Any, n: int) -> dict[str, Any]:
        lock = self.lock
        return {
            "id": self.request.id,
            "args": list(self.request.args),
            "current": current_task._get_current_object() is self,
            "token": None if lock is None else lock.fencing_token,
        }

    task_id = uuid()
    seen = inside.apply(args=(7,), task_id=task_id).get()
    assert seen == {"id": task_id, "args": [7], "current": True, "token": seen["token"]}
    assert isinstance(seen["token"], int)
    assert _Wrapping.wrapped == ([task_id] if base is _WrappedLockedTask else [])


def test_a_release_that_finds_the_lock_gone_sends_lock_lost(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    """The key deleted from every node while the body runs: the release reports the loss."""
    lost: list[dict[str, Any]] = []
    released: list[dict[str, Any]] = []

    def on_lost(sender: Any = None, **fields: Any) -> None:
        lost.append(fields)

    def on_released(sender: Any = None, **fields: Any) -> None:
        released.append(fields)

    # A body that reports no progress is not renewed by the heartbeat: no
    # renewal can find the keys gone before the release does.
    @app.task(
        base=LockedTask,
        bind=True,
        name="t.deleted_under",
        lock_key="deleted:{n}",
        lock_progress_timeout=0.001,
    )
    def deleted_under(self: Any, n: int) -> str:
        landed_everywhere(self.lock.redlock, f"deleted:{n}")
        for node in lock_nodes:
            with node.client() as client:
                assert client.delete(self.lock.redlock.key(f"deleted:{n}")) == 1
        return "done"

    @app.task(base=LockedTask, bind=True, name="t.kept", lock_key="kept:{n}")
    def kept(self: Any, n: int) -> str:
        return "done"

    signals.lock_lost.connect(on_lost, weak=False)
    signals.lock_released.connect(on_released, weak=False)
    try:
        kept_id, deleted_id = uuid(), uuid()
        assert kept.apply(args=(1,), task_id=kept_id).get() == "done"
        assert deleted_under.apply(args=(2,), task_id=deleted_id).get() == "done"
    finally:
        signals.lock_lost.disconnect(on_lost)
        signals.lock_released.disconnect(on_released)
    assert [fields["task_id"] for fields in released] == [kept_id, deleted_id]
    assert len(lost) == 1
    assert lost[0]["task_id"] == deleted_id
    assert lost[0]["key"] == "deleted:2"
    assert lost[0]["code"] == "lost_at_release"
