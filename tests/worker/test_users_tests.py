"""What an application's own tests get: ``redlock_enabled``, fakeredis nodes, direct calls.

Users test their tasks in eager mode, without Redis or with fakeredis, and
call task functions directly; each way is checked here against real
redis-server nodes that must (or must not) see the traffic.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from celery import Celery, states

from celery_redlock import LockedTask, Redlock
from celery_redlock.errors import (
    ConfigurationError,
    QuorumUnavailable,
    RateLimited,
    RateLimiterUnavailable,
)
from celery_redlock.tasks import app_state
from celery_redlock.testing import RedisServer, ServerGroup, free_port
from celery_redlock.testing.temporary_settings import redlock_settings

from .support import in_process_worker

pytestmark = pytest.mark.celery

#: The node timeout of the Redlocks built here, on real nodes.
NODE_TIMEOUT = 1.0
#: The apps': as high as a singleton's 0.5 s beat window allows (under half of it).
APP_NODE_TIMEOUT = 0.2


def build_app(broker: str = "memory://", **conf: Any) -> Celery:
    """An app with a locked task, a singleton and a rate-limited task that report what they saw."""
    app = Celery("users", broker=broker, backend="cache+memory://", set_as_current=False)
    app.conf.update(
        redlock_key_prefix="u:",
        # Above a loaded machine's scheduling delay (the 50 ms default is not):
        # a first call opens its connections within it. No test here is about it.
        redlock_node_timeout=APP_NODE_TIMEOUT,
        worker_hijack_root_logger=False,
        task_default_queue="users",
        broker_connection_retry_on_startup=True,
        **conf,
    )
    app.seen: list[Any] = []  # type: ignore[attr-defined]

    @app.task(base=LockedTask, bind=True, name="u.sync", shared=False, lock_key="sync:{user_id}")
    def sync(self: Any, user_id: int) -> Any:
        lock = self.lock
        app.seen.append(("sync", user_id, lock))  # type: ignore[attr-defined]
        self.heartbeat()
        return None if lock is None else lock.fencing_token

    @app.task(
        base=LockedTask,
        bind=True,
        name="u.report",
        shared=False,
        singleton=True,
        singleton_key="{day}",
    )
    def report(self: Any, day: str, publish_again: bool = True) -> str:
        app.seen.append(("report", day, self.lock))  # type: ignore[attr-defined]
        if not publish_again:
            return "published again"
        # Published again while this copy runs: a duplicate, unless locks are
        # off (then, eager, the copy runs at once, and publishes nothing more).
        again = report.delay(day, publish_again=False)
        return str(again.id)

    @app.task(
        base=LockedTask,
        name="u.call_api",
        shared=False,
        global_rate_limit="2/h",
        on_rate_limited="raise",
    )
    def call_api(n: int) -> int:
        app.seen.append(("call_api", n, None))  # type: ignore[attr-defined]
        return n

    return app


@contextlib.contextmanager
def connections_counted(nodes: list[RedisServer]) -> Iterator[list[int]]:
    """Connections the nodes accepted inside the block (the counting connection aside)."""
    clients = [node.client() for node in nodes]
    before = [client.info("stats")["total_connections_received"] for client in clients]
    counted: list[int] = []
    try:
        yield counted
        counted.extend(
            client.info("stats")["total_connections_received"] - start
            for client, start in zip(clients, before, strict=True)
        )
    finally:
        for client in clients:
            client.close()


@pytest.fixture
def lock_nodes(servers: ServerGroup) -> list[RedisServer]:
    return list(servers)[:3]


# -- redlock_enabled = False ------------------------------------------------------------


def test_disabled_runs_locked_tasks_as_plain_tasks_without_contacting_redis(
    lock_nodes: list[RedisServer],
) -> None:
    app = build_app(
        task_always_eager=True,
        redlock_enabled=False,
        redlock_nodes=[node.url for node in lock_nodes],
    )
    try:
        with connections_counted(lock_nodes) as counted:
            assert app.tasks["u.sync"].delay(1).get() is None
            assert app.tasks["u.sync"].apply(args=(1,)).get() is None
            first = app.tasks["u.report"].delay("monday")
            second = app.tasks["u.report"].delay("monday")
            assert first.id != second.id
            assert first.get() != first.id  # the publish inside the run was not suppressed
            assert [app.tasks["u.call_api"].delay(n).get() for n in range(5)] == list(range(5))
        assert counted == [0, 0, 0]
        assert [entry[0] for entry in app.seen].count("call_api") == 5
        assert all(lock is None for _, _, lock in app.seen)
    finally:
        app_state.forget(app)


def test_disabled_worker_starts_and_runs_without_contacting_the_lock_nodes(
    servers: ServerGroup, lock_nodes: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    app = build_app(
        broker=servers[3].url,
        redlock_enabled=False,
        redlock_nodes=[node.url for node in lock_nodes],
        result_backend=servers[3].url,
    )
    try:
        with (
            caplog.at_level(logging.WARNING, logger="celery_redlock.hooks"),
            connections_counted(lock_nodes) as counted,
            in_process_worker(app, "threads"),
        ):
            results = [app.tasks["u.call_api"].delay(n) for n in range(4)]
            assert [result.get(timeout=20) for result in results] == list(range(4))
            assert app.tasks["u.sync"].delay(7).get(timeout=20) is None
            del results
        assert counted == [0, 0, 0]
        assert any(
            "redlock_enabled is False" in record.getMessage() for record in caplog.records
        ), caplog.text
    finally:
        app_state.forget(app)
        app.close()


def test_enabled_is_read_at_each_call(lock_nodes: list[RedisServer]) -> None:
    app = build_app(task_always_eager=True, redlock_nodes=[node.url for node in lock_nodes])
    try:
        assert isinstance(app.tasks["u.sync"].delay(1).get(), int)  # locked: a fencing token
        app.conf.redlock_enabled = False
        assert app.tasks["u.sync"].delay(1).get() is None
        app.conf.redlock_enabled = True
        assert isinstance(app.tasks["u.sync"].delay(1).get(), int)
    finally:
        app_state.forget(app)


def test_a_bad_enabled_value_names_the_setting() -> None:
    app = build_app(task_always_eager=True, redlock_enabled="no")
    with pytest.raises(ConfigurationError) as caught:
        app.tasks["u.sync"].delay(1).get()
    assert caught.value.option == "redlock_enabled"
    assert str(caught.value) == "redlock_enabled: must be True or False, got 'no'"


# -- eager mode, with locks -----------------------------------------------------------


def test_eager_mode_with_enabled_unset_keeps_locking(lock_nodes: list[RedisServer]) -> None:
    urls = [node.url for node in lock_nodes]
    app = build_app(task_always_eager=True, redlock_nodes=urls)
    holder = Redlock(urls, key_prefix="u:", node_timeout=NODE_TIMEOUT)
    try:
        with holder.lock("sync:5", ttl=10):
            result = app.tasks["u.sync"].apply(args=(5,), throw=False)
        # The default on_lock_busy re-queues; eagerly that is a retry, run at once, that
        # finds the lock still held until its retries run out.
        assert result.state == states.FAILURE
        assert "held by another run" in str(result.result)
        assert app.seen == []
    finally:
        holder.close()
        app_state.forget(app)


def test_an_eager_run_without_redis_raises_what_did_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing listens on the port: no lock node, no rate-limit Redis. An eager
    # run cannot be re-queued, so it fails at once with what did not answer.
    down = [f"redis://127.0.0.1:{free_port()}/0"]
    app = build_app(task_always_eager=True, task_eager_propagates=True, redlock_nodes=down)
    try:
        with caplog.at_level(logging.INFO, logger="celery_redlock"):
            with pytest.raises(QuorumUnavailable):
                app.tasks["u.sync"].delay(1)
            with pytest.raises(QuorumUnavailable):
                app.tasks["u.report"].delay("monday")
            with pytest.raises(RateLimiterUnavailable):
                app.tasks["u.call_api"].delay(1)
            # Without propagation: one attempt, its result the failure.
            result = app.tasks["u.sync"].apply(args=(1,), throw=False)
        assert result.state == states.FAILURE
        assert isinstance(result.result, QuorumUnavailable)
        assert app.seen == []
        assert not [r for r in caplog.records if "re-queued" in r.getMessage()], caplog.text
    finally:
        app_state.forget(app)


def test_lock_singleton_and_rate_limit_work_eagerly_on_fakeredis() -> None:
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    app = build_app(task_always_eager=True, redlock_nodes=[fake])
    observer = Redlock([fake], key_prefix="u:")
    try:
        # The lock: held while the body runs, gone after; fencing tokens increase.
        sync = app.tasks["u.sync"]
        held_inside: list[bool] = []
        original_heartbeat = LockedTask.heartbeat

        def heartbeat(task: Any) -> None:
            held_inside.append(not observer.lock("sync:3", ttl=1).acquire(blocking=False))
            original_heartbeat(task)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(LockedTask, "heartbeat", heartbeat)
            tokens = [sync.delay(3).get() for _ in range(3)]
        assert held_inside == [True, True, True]
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == 3
        assert observer.holder("sync:3") is None

        # The singleton: a publish while the copy runs returns the running copy.
        first = app.tasks["u.report"].delay("monday")
        assert first.get() == first.id
        assert first.state == states.SUCCESS
        # The rate limit: 2 per hour, the third refused.
        call_api = app.tasks["u.call_api"]
        assert [call_api.delay(n).get() for n in range(2)] == [0, 1]
        with pytest.raises(RateLimited):
            call_api.delay(2).get()
        assert [entry[1] for entry in app.seen if entry[0] == "call_api"] == [0, 1]
        assert all(fake.pttl(key) > 0 for key in fake.keys("*"))
    finally:
        observer.close()
        app_state.forget(app)


# -- direct calls -------------------------------------------------------------------------


def test_a_direct_call_is_a_plain_call(lock_nodes: list[RedisServer]) -> None:
    urls = [node.url for node in lock_nodes]
    app = build_app(redlock_nodes=urls)
    try:
        with connections_counted(lock_nodes) as counted:
            assert app.tasks["u.sync"](9) is None  # self.lock is None: no lock
            assert app.tasks["u.call_api"](1) == 1
            assert app.tasks["u.call_api"](2) == 2
            assert app.tasks["u.call_api"](3) == 3  # over 2/h: not counted
            report_result = app.tasks["u.report"]("monday")
        assert counted[0] >= 1  # the publish inside report() took its singleton lock
        assert report_result  # a task id
        assert [entry[0] for entry in app.seen] == [
            "sync",
            "call_api",
            "call_api",
            "call_api",
            "report",
        ]
    finally:
        app_state.forget(app)


def test_a_direct_call_runs_while_another_owner_holds_the_lock(
    lock_nodes: list[RedisServer],
) -> None:
    urls = [node.url for node in lock_nodes]
    app = build_app(redlock_nodes=urls)
    holder = Redlock(urls, key_prefix="u:", node_timeout=NODE_TIMEOUT)
    try:
        with holder.lock("sync:9", ttl=10) as held:
            assert app.tasks["u.sync"](9) is None
            assert held.locked()
    finally:
        holder.close()
        app_state.forget(app)


def test_apply_runs_here_with_the_lock(lock_nodes: list[RedisServer]) -> None:
    urls = [node.url for node in lock_nodes]
    app = build_app(redlock_nodes=urls)
    holder = Redlock(urls, key_prefix="u:", node_timeout=NODE_TIMEOUT)
    try:
        token = app.tasks["u.sync"].apply(args=(4,)).get()
        assert isinstance(token, int)
        with holder.lock("sync:4", ttl=10):
            busy = app.tasks["u.sync"].apply(args=(4,), throw=False)
        assert busy.state == states.FAILURE
        assert "held by another run" in str(busy.result)
    finally:
        holder.close()
        app_state.forget(app)


def test_a_task_calling_itself_directly_does_not_wait_for_its_own_lock(
    lock_nodes: list[RedisServer],
) -> None:
    app = Celery("recursive", set_as_current=False)
    app.conf.update(
        redlock_nodes=[node.url for node in lock_nodes],
        redlock_key_prefix="u:",
        redlock_node_timeout=APP_NODE_TIMEOUT,
    )
    depth: list[int] = []

    @app.task(base=LockedTask, bind=True, name="u.walk", shared=False, lock_key="walk")
    def walk(self: Any, n: int) -> int:
        depth.append(n)
        return n if n == 0 else walk(n - 1)

    try:
        done = threading.Event()
        outcome: list[Any] = []

        def run() -> None:
            outcome.append(walk.apply(args=(3,)).get())
            done.set()

        threading.Thread(target=run, daemon=True).start()
        assert done.wait(10)
        assert outcome == [0]
        assert depth == [3, 2, 1, 0]
    finally:
        app_state.forget(app)


# -- redlock_settings ----------------------------------------------------------------------


def test_redlock_settings_apply_inside_the_block_and_restore_after() -> None:
    app = build_app(task_always_eager=True, redlock_nodes=["redis://127.0.0.1:1/0"])
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    try:
        with redlock_settings(app, nodes=[fake]) as same:
            assert same is app
            assert isinstance(app.tasks["u.sync"].delay(2).get(), int)
            assert fake.keys("u:*")
        assert app.conf.redlock_nodes == ["redis://127.0.0.1:1/0"]
        assert app_state.settings_for(app).nodes == ("redis://127.0.0.1:1/0",)
        with pytest.raises(ConfigurationError) as caught, redlock_settings(app, node=[fake]):
            pass
        assert caught.value.option == "redlock_settings"
        assert "unknown setting(s) node" in str(caught.value)
    finally:
        app_state.forget(app)


# -- fakeredis without Lua ----------------------------------------------------------------


#: A process where fakeredis is installed without its ``lua`` extra (lupa cannot
#: be imported): a fakeredis node, alone and as an app's node in eager mode.
_WITHOUT_LUA = """
import json, sys
sys.modules["lupa"] = None  # as if `pip install fakeredis`, without [lua]
import fakeredis
from celery import Celery
from celery_redlock import LockedTask, Redlock
from celery_redlock.errors import ConfigurationError

seen = {}
try:
    Redlock([fakeredis.FakeRedis()]).lock("k", ttl=5).acquire(blocking=False)
except Exception as exc:
    seen["lock"] = [type(exc).__name__, getattr(exc, "option", None), str(exc)]
app = Celery("u", broker="memory://")
app.conf.update(task_always_eager=True, redlock_nodes=[fakeredis.FakeRedis()])

@app.task(base=LockedTask, lock_key="k")
def locked():
    return 1

try:
    locked.delay().get()
except Exception as exc:
    seen["task"] = [type(exc).__name__, getattr(exc, "option", None), str(exc)]
print(json.dumps(seen))
"""


def test_fakeredis_without_lua_as_a_node_is_refused_saying_what_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_LUA], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["lock"][:2] == ["ConfigurationError", "nodes"]
    assert seen["task"][:2] == ["ConfigurationError", "redlock_nodes"]
    for _kind, _option, message in seen.values():
        assert "pip install 'fakeredis[lua]'" in message
