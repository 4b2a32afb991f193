"""Configuration with real workers: nothing misspelt is silent, redlock_tasks applies everywhere.

Misspelt task options stop the worker; Celery's and the user's own task
attributes run. Unknown ``redlock_*`` settings, a fallback node, a quorum
out of reach and ``redlock_tasks`` names no module registered are told at
worker start-up, once. Django-style settings (``CELERY_REDLOCK_*`` through a
namespace) are read. A publisher that imports a task module after its app is
finalized still applies ``redlock_tasks`` to it. A task re-queued because
Redis is unavailable says so in one line.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockedTask, setup
from celery_redlock.errors import ConfigurationError, DuplicateTask
from celery_redlock.tasks import app_state
from celery_redlock.testing import RedisServer

from .support import ROOT, WorkerProcess, create_app, in_process_worker, looker, overlaps

pytestmark = pytest.mark.celery

STARTUP = "celery_redlock.startup"


def env(broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer) -> dict[str, str]:
    return {
        **os.environ,
        "CR_BROKER": broker_url,
        "CR_NODES": ",".join(node.url for node in lock_nodes),
        "CR_WITNESS": witness.url,
    }


def startup_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == STARTUP]


@pytest.fixture
def capture(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="celery_redlock"):
        yield caplog


# -- task options ------------------------------------------------------------------


def test_a_misspelt_option_stops_the_worker_naming_the_option_meant(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.worker.misspelt", "worker", "-P", "solo"],
        cwd=ROOT,
        env=env(broker_url, lock_nodes, witness),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert (
        "task 't.misspelt': lock_tll: not a celery_redlock option; did you mean lock_ttl?"
        in done.stdout + done.stderr
    )


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_celerys_options_and_the_users_own_attributes_work_in_a_worker(
    make_app: Callable[..., Celery], pool: str
) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.task(
        base=LockedTask,
        bind=True,
        shared=False,
        name="t.own",
        lock_key="own:{n}",
        my_flag="mine",
        autoretry_for=(KeyError,),
        retry_backoff=False,
        retry_kwargs={"countdown": 0.1},
        max_retries=3,
        acks_late=True,
    )
    def own(self: Any, n: int) -> str:
        attempts.append(n)
        if len(attempts) == 1:
            raise KeyError("first attempt fails, autoretry takes over")
        return f"{self.my_flag}:{n}:{self.request.retries}"

    with in_process_worker(app, pool):
        assert own.delay(3).get(timeout=20) == "mine:3:1"


# -- settings ----------------------------------------------------------------------


def test_app_wide_singleton_defaults_apply_where_a_task_sets_none(
    make_app: Callable[..., Celery], lock_nodes: list[RedisServer]
) -> None:
    app = make_app(
        redlock_singleton_ttl=30,
        redlock_on_duplicate="raise",
        redlock_tasks={"t.plain_single": {"singleton": True}},
    )

    @app.task(shared=False, name="t.plain_single")
    def plain_single(n: int) -> int:
        return n

    @app.task(
        base=LockedTask,
        shared=False,
        name="t.own_single",
        singleton=True,
        singleton_ttl=600,
        on_duplicate="return",
    )
    def own_single(n: int) -> int:
        return n

    setup(app)
    look = looker(lock_nodes)

    def seconds_left(task: Any, *args: Any) -> list[float]:
        policy = app_state.policy_for(task)
        assert policy is not None
        assert policy.singleton is not None
        found = look.inspect(policy.singleton.name(task.name, args, {}))
        return [entry[1] for entry in found if isinstance(entry, tuple) and entry[0]]

    try:
        published = []
        for task, args in [(app.tasks["t.single"], (1, 0.1)), (plain_single, (2,))]:
            published.append(task.apply_async(args))
            with pytest.raises(DuplicateTask):
                task.apply_async(args)  # redlock_on_duplicate
            left = seconds_left(task, *args)
            assert len(left) == 3
            assert all(0 < seconds <= 30 for seconds in left)  # redlock_singleton_ttl
        # A task's own values win over the app's.
        first = own_single.delay(3)
        assert own_single.delay(3).id == first.id
        assert all(30 < seconds <= 600 for seconds in seconds_left(own_single, 3))
        with in_process_worker(app, "threads"):
            assert published[0].get(timeout=20) == published[0].id
            assert [published[1].get(timeout=20), first.get(timeout=20)] == [2, 3]
    finally:
        look.close()


def test_worker_start_tells_unknown_settings_and_which_nodes_answer(
    make_app: Callable[..., Celery],
    lock_nodes: list[RedisServer],
    capture: pytest.LogCaptureFixture,
) -> None:
    app = make_app(redlock_default_tll=5, redlock_node=["redis://127.0.0.1:1/0"])
    lock_nodes[2].kill()
    with in_process_worker(app, "threads"):
        lines = startup_lines(capture)
    assert (
        logging.WARNING,
        "celery_redlock: redlock_default_tll is not a celery_redlock setting and is ignored; "
        "did you mean redlock_default_ttl?",
    ) in lines
    assert (
        logging.WARNING,
        "celery_redlock: redlock_node is not a celery_redlock setting and is ignored; "
        "did you mean redlock_nodes?",
    ) in lines
    (nodes,) = [(level, line) for level, line in lines if "lock nodes" in line]
    up, down = lock_nodes[:2], lock_nodes[2]
    assert nodes[0] == logging.WARNING
    assert nodes[1].startswith(
        f"celery_redlock: 3 lock nodes, quorum 2: {up[0].url} ok, {up[1].url} ok, {down.url} DOWN ("
    )
    assert nodes[1].endswith("; quorum reachable (2 answer)")


def test_worker_start_warns_when_no_quorum_answers(
    app: Celery, lock_nodes: list[RedisServer], capture: pytest.LogCaptureFixture
) -> None:
    lock_nodes[0].kill()
    lock_nodes[1].kill()
    with in_process_worker(app, "solo"):
        lines = startup_lines(capture)
    (nodes,) = [(level, line) for level, line in lines if "lock nodes" in line]
    assert nodes[0] == logging.WARNING
    assert nodes[1].endswith(
        "; quorum NOT reachable (1 of 3 answer, 2 needed): LockedTasks are re-queued until "
        "a majority answers"
    )


def test_a_healthy_worker_says_so_once_at_info(
    app: Celery, lock_nodes: list[RedisServer], capture: pytest.LogCaptureFixture
) -> None:
    with in_process_worker(app, "threads"):
        lines = startup_lines(capture)
    urls = ", ".join(f"{node.url} ok" for node in lock_nodes)
    assert lines == [
        (
            logging.INFO,
            f"celery_redlock: 3 lock nodes, quorum 2: {urls}; quorum reachable (3 answer)",
        )
    ]


def test_a_prefork_worker_reports_once_in_its_main_process(
    app: Celery, worker_process: Callable[..., WorkerProcess]
) -> None:
    worker = worker_process(pool="prefork", concurrency=3)
    log = worker.log()
    reports = [line for line in log.splitlines() if "celery_redlock: 3 lock nodes" in line]
    assert len(reports) == 1, log
    assert "INFO/MainProcess" in reports[0]


class DjangoSettings:
    """What ``django.conf:settings`` looks like to Celery: attributes, upper case."""

    DEBUG = True
    INSTALLED_APPS = ("proj",)


def test_django_style_settings_through_a_namespace_are_read_and_typos_told(
    broker_url: str,
    lock_nodes: list[RedisServer],
    witness: RedisServer,
    capture: pytest.LogCaptureFixture,
) -> None:
    settings = type(
        "Settings",
        (DjangoSettings,),
        {
            "CELERY_BROKER_URL": broker_url,
            "CELERY_RESULT_BACKEND": broker_url,
            "CELERY_TASK_DEFAULT_QUEUE": "django",
            "CELERY_WORKER_HIJACK_ROOT_LOGGER": False,
            "CELERY_REDLOCK_NODES": [node.url for node in lock_nodes],
            "CELERY_REDLOCK_KEY_PREFIX": "dj:",
            "CELERY_REDLOCK_DEFAULT_TTL": 7,
            "CELERY_REDLOCK_NODE_TIMOUT": 0.5,  # misspelt
            "REDLOCK_TASKS": {},  # no namespace: not read
        },
    )
    app = Celery("proj", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")

    @app.task(base=LockedTask, bind=True, shared=False, name="proj.sync", lock_key="sync:{n}")
    def sync(self: Any, n: int) -> dict[str, Any]:
        lock = self.lock
        return {
            "nodes": [node.name for node in lock.redlock.nodes],
            "key": lock.redlock.key(lock.name),
            "ttl": lock.ttl,
        }

    try:
        with in_process_worker(app, "threads"):
            ran = sync.delay(4).get(timeout=20)
        lines = [line for _, line in startup_lines(capture)]
    finally:
        app_state.forget(app)
        app.close()
    assert ran == {
        "nodes": [node.url for node in lock_nodes],
        "key": "dj:{sync:4}",
        "ttl": 7.0,
    }
    assert (
        "celery_redlock: CELERY_REDLOCK_NODE_TIMOUT is not a celery_redlock setting and is "
        "ignored; did you mean CELERY_REDLOCK_NODE_TIMEOUT?"
    ) in lines
    assert (
        "celery_redlock: REDLOCK_TASKS is not read: with namespace 'CELERY', Celery reads this "
        "setting as CELERY_REDLOCK_TASKS or redlock_tasks"
    ) in lines


def test_a_re_queue_for_unavailable_nodes_is_one_line_with_a_node_summary(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Callable[..., WorkerProcess]
) -> None:
    worker = worker_process(pool="threads", concurrency=2)
    lock_nodes[0].kill()
    lock_nodes[1].kill()
    app.tasks["t.serial"].delay("down", 0.01)
    deadline = time.monotonic() + 60
    # Our warning comes first, then Celery's own line for the retry it raised.
    while " retry: Retry in " not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = worker.log().splitlines()
    warnings = [line for line in lines if "re-queued to run in" in line]
    assert warnings, worker.log()
    down = "; ".join(f"{node.url}: connection refused" for node in lock_nodes[:2])
    line = warnings[0].split("] ", 1)[1]
    assert line.startswith("task t.serial (")
    assert line.split(": ", 1)[1].startswith(
        f"lock 'serial:down' not taken, Redis unavailable: 1 of 3 lock nodes answered, "
        f"2 needed ({down}); re-queued to run in "
    )
    # Celery's own retry line carries the same one-line summary, not the nodes' full errors.
    retries = [line for line in lines if " retry: Retry in " in line]
    assert retries
    assert retries[0].endswith(
        f"QuorumUnavailable(\"lock 'serial:down' not taken, Redis unavailable: 1 of 3 lock "
        f'nodes answered, 2 needed ({down})")'
    )


def test_a_re_queue_for_the_rate_limiter_down_hands_celery_a_one_line_summary(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Callable[..., WorkerProcess]
) -> None:
    worker = worker_process(pool="threads", concurrency=2)
    counters = lock_nodes[0]  # the rate limiter's Redis: the first lock node
    counters.kill()
    app.tasks["t.limited"].delay(1)
    deadline = time.monotonic() + 60
    while " retry: Retry in " not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    retries = [line for line in worker.log().splitlines() if " retry: Retry in " in line]
    assert retries, worker.log()
    assert retries[0].endswith(
        f"RateLimiterUnavailable(\"rate limit 't.limited' not checked, Redis unavailable: "
        f'rate-limit Redis {counters.url} did not answer (connection refused)")'
    )


# -- redlock_tasks -----------------------------------------------------------------


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_redlock_tasks_apply_in_a_publisher_that_imports_the_task_after_finalizing(
    make_app: Callable[..., Celery],
    broker_url: str,
    lock_nodes: list[RedisServer],
    witness: RedisServer,
    worker_process: Callable[..., WorkerProcess],
    monkeypatch: pytest.MonkeyPatch,
    pool: str,
) -> None:
    importlib.import_module("tests.worker.thirdparty")  # the worker's app registers it
    app = make_app(redlock_tasks={"thirdparty.nightly": {"singleton": True}})
    setup(app)
    with contextlib.ExitStack() as stack:
        if pool == "prefork":
            monkeypatch.setenv("CR_THIRDPARTY", "1")
            worker_process(pool="prefork", concurrency=2)
        else:
            stack.enter_context(in_process_worker(app, pool))
        published = subprocess.run(
            [sys.executable, "-m", "tests.worker.publisher"],
            cwd=ROOT,
            env={**env(broker_url, lock_nodes, witness), "CR_COPIES": "3"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert published.returncode == 0, published.stderr
        ids = json.loads(published.stdout)
        assert len(set(ids)) == 1, "the publisher queued duplicates of a singleton"
        result = app.AsyncResult(ids[0])
        assert result.get(timeout=30) == ids[0]
    assert "ERROR" not in published.stderr, published.stderr
    events = app.witness.events()
    assert [e[0] for e in events if e[1] == "nightly:2026-01-01"] == ["enter", "exit"]
    assert overlaps(events) == 0


def test_a_worker_warns_of_redlock_tasks_names_it_does_not_know_and_starts(
    make_app: Callable[..., Celery], capture: pytest.LogCaptureFixture
) -> None:
    app = make_app(
        redlock_tasks={
            "t.plian": {"singleton": True},
            "t.plain": {"lock_key": "plain-lock", "lock_ttl": 5},
        }
    )
    setup(app)
    with in_process_worker(app, "threads"):
        assert app.tasks["t.plain"].delay(1, 0.05).get(timeout=20)
        lines = startup_lines(capture)
    assert (
        logging.WARNING,
        "celery_redlock: redlock_tasks['t.plian']: this app has no such task; did you mean "
        "'t.plain'? check the name, and that the module defining it is imported (include= or "
        "imports=); the entry applies once it is",
    ) in lines
    assert not [r for r in capture.records if r.levelno >= logging.ERROR]
    assert isinstance(app.tasks["t.plain"], LockedTask)


def test_a_process_that_never_imports_a_configured_task_logs_no_error(
    broker_url: str,
    lock_nodes: list[RedisServer],
    witness: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = create_app(
        broker_url,
        [node.url for node in lock_nodes],
        witness.url,
        redlock_tasks={"elsewhere.task": {"singleton": True}},
    )
    try:
        setup(app)
        with caplog.at_level(logging.DEBUG, logger="celery_redlock"):
            app.finalize()
            app.send_task("elsewhere.task", ("x",))
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        app_state.forget(app)
        app.close()


# -- settings named as the user wrote them -------------------------------------------


NAMESPACED_PROBLEMS = {
    "ttl": "CELERY_REDLOCK_DEFAULT_TTL: expected a number of seconds, got 'a minute'",
    "tasks": (
        "CELERY_REDLOCK_TASKS['namespaced.report'].singelton_ttl: not a celery_redlock option; "
        "did you mean singleton_ttl?"
    ),
}


@pytest.mark.parametrize("bad", sorted(NAMESPACED_PROBLEMS))
def test_a_bad_namespaced_setting_stops_the_worker_in_one_line_naming_it_as_written(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer, bad: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.worker.namespaced", "worker", "-P", "solo"],
        cwd=ROOT,
        env={**env(broker_url, lock_nodes, witness), "CR_BAD": bad},
        capture_output=True,
        text=True,
        timeout=60,
    )
    problem = NAMESPACED_PROBLEMS[bad]
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Error: celery_redlock: {problem}" in done.stderr.splitlines()
    assert "Traceback" not in done.stdout + done.stderr
    assert "redlock_" not in (done.stdout + done.stderr).replace("REDLOCK_", "")


@pytest.mark.parametrize("bad", sorted(NAMESPACED_PROBLEMS))
def test_redlock_check_names_a_bad_namespaced_setting_as_written(
    broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer, bad: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.worker.namespaced", "redlock", "check"],
        cwd=ROOT,
        env={**env(broker_url, lock_nodes, witness), "CR_BAD": bad},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert NAMESPACED_PROBLEMS[bad] in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_bad_namespaced_entry_is_told_when_a_publisher_sets_up_not_at_its_first_publish(
    broker_url: str,
    lock_nodes: list[RedisServer],
    witness: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name, value in env(broker_url, lock_nodes, witness).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CR_BAD", "tasks")
    sys.modules.pop("tests.worker.namespaced", None)
    with caplog.at_level(logging.ERROR, logger="celery_redlock.hooks"):
        module = importlib.import_module("tests.worker.namespaced")
    try:
        told = [r.getMessage() for r in caplog.records if r.name == "celery_redlock.hooks"]
        assert told == [f"celery_redlock configuration error: {NAMESPACED_PROBLEMS['tasks']}"]
        # Publishing still refuses an entry it cannot apply, naming it the same way.
        with pytest.raises(ConfigurationError, match=r"CELERY_REDLOCK_TASKS\['namespaced"):
            module.report.delay("today")
    finally:
        sys.modules.pop("tests.worker.namespaced", None)
        app_state.forget(module.app)
        module.app.close()
