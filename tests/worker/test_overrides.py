"""Per-call overrides, ``apply_async(..., redlock={...})``, with real workers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, group, states
from celery.signals import before_task_publish

from celery_redlock import Redlock, setup, signals
from celery_redlock.errors import ConfigurationError, DuplicateTask, LockNotAcquired
from celery_redlock.testing import RedisServer

from .support import WorkerProcess, in_process_worker

pytestmark = pytest.mark.celery


@pytest.fixture
def holder(lock_nodes: list[RedisServer]) -> Iterator[Redlock]:
    # A node timeout above a loaded machine's scheduling delay: the tests are not about it.
    redlock = Redlock([node.url for node in lock_nodes], key_prefix="t:", node_timeout=1.0)
    yield redlock
    redlock.close()


@pytest.fixture
def note_busy(app: Celery) -> Iterator[None]:
    def note(sender: Any = None, task_id: Any = None, key: Any = None, **_: Any) -> None:
        app.witness.event("busy", str(key), task_id)

    signals.lock_busy.connect(note, weak=False)
    yield
    signals.lock_busy.disconnect(note)


def busy_count(app: Celery, key: str, task_id: str) -> int:
    return sum(1 for e in app.witness.events() if e[:3] == ["busy", key, task_id])


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_on_lock_busy_and_a_requeue_budget_given_per_call_hold_in_the_worker(
    app: Celery,
    pool: str,
    holder: Redlock,
    note_busy: None,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    # Both leave on_lock_busy at "retry"; t.serial_retry never runs out of max_retries.
    task, retrying = app.tasks["t.busy_zero"], app.tasks["t.serial_retry"]
    held = [holder.lock(name, ttl=60) for name in ("serial:r", "zero:b")]
    if pool == "prefork":
        worker_process(concurrency=2)
        worker = None
    else:
        worker = in_process_worker(app, "threads")
        worker.__enter__()
    try:
        # Taken once the worker is up: a slow start spends none of their ttl.
        assert all(lock.acquire(blocking=False) for lock in held)
        raising = retrying.apply_async(("r", 0.0), redlock={"on_lock_busy": "raise"})
        # Re-queued once (the budget travels with the re-queued message), failed the 2nd time.
        budget = task.apply_async(("b",), redlock={"lock_busy_max_requeues": 1})
        with pytest.raises(LockNotAcquired):
            raising.get(timeout=60)
        with pytest.raises(LockNotAcquired, match="lock_busy_max_requeues=1"):
            budget.get(timeout=60)
    finally:
        if worker is not None:
            worker.__exit__(None, None, None)
        for lock in held:
            lock.release()
    assert raising.state == budget.state == states.FAILURE
    assert busy_count(app, "serial:r", raising.id) == 1
    assert busy_count(app, "zero:b", budget.id) == 2


def test_lock_timeout_given_per_call_waits_in_the_worker_instead_of_requeueing(
    app: Celery, holder: Redlock, lock_nodes: list[RedisServer], note_busy: None
) -> None:
    task = app.tasks["t.busy_zero"]  # lock_timeout left at 0: the default re-queues
    running = holder.lock("zero:w", ttl=60)
    assert running.acquire(blocking=False)
    watcher = lock_nodes[0].client()
    with in_process_worker(app, "threads"):
        result = task.apply_async(("w",), redlock={"lock_timeout": 60})
        # A waiting run listens for the lock's release on a lock node.
        deadline = time.monotonic() + 30
        while not watcher.pubsub_channels("*zero:w*"):
            assert time.monotonic() < deadline, "the run never waited for the lock"
            time.sleep(0.02)
        running.release()
        outcome = result.get(timeout=30)
    assert outcome == {"retries": 0, "busy": 0}
    assert busy_count(app, "zero:w", result.id) == 0


def test_on_duplicate_given_per_call_raises_for_that_call_only(app: Celery) -> None:
    task = app.tasks["t.single"]  # on_duplicate left at "return"; no worker: it stays queued
    first = task.delay(41, 0.1)
    assert task.delay(41, 0.1).id == first.id
    with pytest.raises(DuplicateTask) as caught:
        task.apply_async((41, 0.1), redlock={"on_duplicate": "raise"})
    assert caught.value.task_id == first.id


def test_singleton_ttl_given_per_call_is_the_queued_keys_ttl(app: Celery, holder: Redlock) -> None:
    task = app.tasks["t.single"]  # singleton_ttl left at 3600 s
    task.apply_async((43, 0.1), redlock={"singleton_ttl": 20})
    task.apply_async((44, 0.1), redlock=None)  # None: no overrides
    policy = task._redlock_policy
    shorter, default = (
        [left for _, left in holder.inspect(policy.singleton.name(task.name, (n, 0.1), {}))]
        for n in (43, 44)
    )
    assert all(0 < left <= 20 for left in shorter), shorter
    assert all(left > 3000 for left in default), default


def test_a_bad_override_is_refused_at_the_call_and_nothing_is_published(app: Celery) -> None:
    task = app.tasks["t.busy_zero"]
    published: list[Any] = []

    def note(sender: Any = None, **_: Any) -> None:
        published.append(sender)

    before_task_publish.connect(note, weak=False)
    try:
        with pytest.raises(ConfigurationError, match="did you mean lock_timeout") as misspelt:
            task.apply_async(("x",), redlock={"lock_timout": 5})
        with pytest.raises(ConfigurationError, match="cannot be set per call") as shared:
            task.apply_async(("x",), redlock={"lock_key": "other"})
        with pytest.raises(ConfigurationError, match="not a singleton") as useless:
            task.s("x").apply_async(redlock={"on_duplicate": "raise"})
    finally:
        before_task_publish.disconnect(note)
    assert misspelt.value.option == "redlock['lock_timout']"
    assert shared.value.option == "redlock['lock_key']"
    assert useless.value.option == "redlock['on_duplicate']"
    assert published == []


def test_the_worker_checks_overrides_a_message_carries(app: Celery) -> None:
    # A message built by hand, bypassing the check at the call.
    with in_process_worker(app, "threads"):
        result = app.send_task(
            "t.busy_zero", ("h",), headers={"redlock_options": {"lock_timeout": -1}}
        )
        with pytest.raises(ConfigurationError) as caught:
            result.get(timeout=30)
    # Rebuilt from the result backend: the message names the override.
    assert "redlock['lock_timeout']: must be >= 0 seconds" in str(caught.value)


def test_a_task_configured_by_redlock_tasks_takes_overrides_too(
    make_app: Callable[..., Celery], holder: Redlock
) -> None:
    app = make_app(redlock_tasks={"t.plain": {"lock_key": "plainlock:{n}"}})
    setup(app)
    task = app.tasks["t.plain"]  # a plain @app.task
    with pytest.raises(ConfigurationError, match="did you mean on_lock_busy"):
        task.apply_async((1,), redlock={"on_lock_bussy": "raise"})
    running = holder.lock("plainlock:1", ttl=60)
    assert running.acquire(blocking=False)
    try:
        with in_process_worker(app, "threads"):
            result = task.apply_async((1, 0.0), redlock={"on_lock_busy": "raise"})
            with pytest.raises(LockNotAcquired):
                result.get(timeout=30)
    finally:
        running.release()


@contextlib.contextmanager
def publishes() -> Iterator[list[Any]]:
    published: list[Any] = []

    def note(sender: Any = None, **_: Any) -> None:
        published.append(sender)

    before_task_publish.connect(note, weak=False)
    try:
        yield published
    finally:
        before_task_publish.disconnect(note)


def test_redlock_where_no_task_class_reads_it_is_refused_and_nothing_is_published(
    app: Celery, broker_url: str
) -> None:
    plain = app.tasks["t.plain"]  # neither a LockedTask nor named in redlock_tasks
    with publishes() as published:
        with pytest.raises(ConfigurationError) as caught:
            plain.apply_async((1,), redlock={"on_lock_busy": "raise"})
        with pytest.raises(ConfigurationError) as signature:
            plain.s(1).apply_async(redlock={"lock_timeout": 5})
        with pytest.raises(ConfigurationError) as by_name:
            app.send_task("t.single", (1,), redlock={"on_duplicate": "raise"})
    assert published == []
    assert (caught.value.option, caught.value.task) == ("redlock", "t.plain")
    assert "neither a LockedTask nor named in redlock_tasks" in caught.value.problem
    assert (signature.value.option, signature.value.task) == ("redlock", "t.plain")
    assert (by_name.value.option, by_name.value.task) == ("redlock", "t.single")
    assert "publishes by name, past the task's class" in by_name.value.problem
    # As everywhere, None is "not set": the task is published and runs.
    with in_process_worker(app, "threads"):
        assert plain.apply_async((2, 0.0), redlock=None).get(timeout=20)

    # An app with no LockedTask at all, where setup(app) ran.
    bare = Celery("bare", broker=broker_url, set_as_current=False)

    @bare.task(shared=False, name="b.plain")
    def bare_plain() -> None:
        pass

    setup(bare)
    try:
        with publishes() as published, pytest.raises(ConfigurationError) as bare_caught:
            bare_plain.apply_async(redlock={"lock_timeout": 5})
        assert published == []
        assert (bare_caught.value.option, bare_caught.value.task) == ("redlock", "b.plain")
    finally:
        bare.close()


def test_a_leftover_once_at_a_call_is_refused_with_what_to_write(app: Celery) -> None:
    with publishes() as published:
        with pytest.raises(ConfigurationError) as caught:
            app.tasks["t.single"].apply_async((1,), once={"graceful": True, "timeout": 60})
        with pytest.raises(ConfigurationError) as strict:
            app.tasks["t.single"].apply_async((1,), once={"graceful": False})
        with pytest.raises(ConfigurationError) as plain:
            app.tasks["t.plain"].apply_async((1,), once={"keys": ["n"]})
    assert published == []
    assert (caught.value.option, caught.value.task) == ("once", "t.single")
    assert "write redlock={'on_duplicate': 'return', 'singleton_ttl': 60}" in caught.value.problem
    assert "write redlock={'on_duplicate': 'raise'}" in strict.value.problem
    assert (plain.value.option, plain.value.task) == ("once", "t.plain")
    assert "set singleton_key on the task" in plain.value.problem


def test_apply_takes_overrides_too(app: Celery, holder: Redlock, note_busy: None) -> None:
    # Eagerly, the default would retry at once, 3 times (max_retries), then fail.
    running = holder.lock("sync-user:5", ttl=60)
    assert running.acquire(blocking=False)
    try:
        result = app.tasks["t.sync_user"].apply(
            (5,), redlock={"on_lock_busy": "raise"}, throw=False
        )
    finally:
        running.release()
    assert result.state == states.FAILURE
    assert isinstance(result.result, LockNotAcquired)
    assert busy_count(app, "sync-user:5", result.id) == 1


def test_a_canvas_carries_overrides_set_on_its_signatures(app: Celery, holder: Redlock) -> None:
    task = app.tasks["t.serial_retry"]  # on_lock_busy left at "retry", max_retries=None
    running = holder.lock("serial:g", ttl=60)
    assert running.acquire(blocking=False)
    try:
        with in_process_worker(app, "threads"):
            signatures = [task.s("g", 0.0).set(redlock={"on_lock_busy": "raise"}) for _ in range(2)]
            result = group(signatures).apply_async()
            outcomes = result.get(timeout=30, propagate=False)
    finally:
        running.release()
    assert [type(outcome) for outcome in outcomes] == [LockNotAcquired, LockNotAcquired]
