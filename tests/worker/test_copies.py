"""Copies of a run: re-delivered messages of a finished run, duplicate singletons in a canvas,
and a revoked singleton's key.

The Redis broker re-delivers an unacknowledged message after its
``visibility_timeout`` with the same task id; with ``task_acks_late`` and a
timeout far shorter than the task, copies keep coming while the task runs,
and some arrive after it ended. Each body must run once and its result stay
the first run's.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group, states
from celery.signals import task_postrun, task_prerun
from celery.worker import state as worker_state

from celery_redlock import LockedTask
from celery_redlock.errors import DuplicateTask

from .support import in_process_worker

pytestmark = pytest.mark.celery

#: Re-deliver an unacknowledged message after one second (looked for every second).
SHORT_VISIBILITY = {
    "visibility_timeout": 1,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}


def add_tasks(app: Celery) -> None:
    """Tasks that count their runs on the witness and return a value unique to each run."""
    client = app.witness.client  # type: ignore[attr-defined]
    task = functools.partial(app.task, shared=False, base=LockedTask, bind=True)

    def body(self: Any, what: str, duration: float) -> str:
        client.incr(f"runs:{what}")
        time.sleep(duration)
        client.set(f"body-end:{what}", repr(time.monotonic()))  # the worker is in this process
        return f"{what}/{uuid.uuid4().hex}"

    @app.task(shared=False, name="c.after")
    def after(value: str) -> str:
        """What follows a singleton step in a chain or a link: records the value it got."""
        client.rpush("after", value)
        return f"after {value}"

    @task(name="c.single", singleton=True)
    def single(self: Any, n: int, duration: float = 3.0) -> str:
        return body(self, f"single:{n}", duration)

    @task(name="c.locked", lock_key="locked:{n}")
    def locked(self: Any, n: int, duration: float = 3.0) -> str:
        return body(self, f"locked:{n}", duration)

    @task(name="c.single_raise", singleton=True, on_duplicate="raise")
    def single_raise(self: Any, n: int, duration: float = 0.5) -> str:
        return body(self, f"single_raise:{n}", duration)

    @task(name="c.retry_once", lock_key="retry:{n}")
    def retry_once(self: Any, n: int) -> str:
        client.rpush(f"attempts:{n}", self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=2)
        return body(self, f"retry_once:{n}", 0.2)

    @task(name="c.limited", concurrency_limit=1, concurrency_key="limited", lock_timeout=20.0)
    def limited(self: Any, n: int, duration: float) -> str:
        return body(self, f"limited:{n}", duration)

    @task(name="c.waiting", lock_key="waiting", lock_timeout=20.0)
    def waiting(self: Any, n: int, duration: float) -> str:
        return body(self, f"waiting:{n}", duration)

    @task(name="c.single_queued", singleton=True, singleton_mode="queued")
    def single_queued(self: Any, n: int) -> str:
        # Runs until the test lets it end: one "go" per run.
        what = f"single_queued:{n}"
        client.incr(f"runs:{what}")
        client.blpop([f"go:{what}"], timeout=60)
        return f"{what}/{uuid.uuid4().hex}"

    @app.task(shared=False, name="c.collect")
    def collect(values: list[str]) -> list[str]:
        client.rpush("collected", *values)
        return values


def runs(app: Celery, what: str) -> int:
    return int(app.witness.client.get(f"runs:{what}") or 0)  # type: ignore[attr-defined]


def body_end(app: Celery, what: str) -> float:
    """When the (first) run's body of ``what`` returned, on this process's monotonic clock."""
    return float(app.witness.client.get(f"body-end:{what}"))  # type: ignore[attr-defined]


class Deliveries:
    """Every delivery of the app's tasks that reached a worker, and how it ended."""

    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []
        self.ended: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    def on_prerun(self, task_id: str = "", **_: Any) -> None:
        with self._lock:
            self.started.append((task_id, time.monotonic()))

    def on_postrun(self, task_id: str = "", state: str | None = None, **_: Any) -> None:
        with self._lock:
            self.ended.append((task_id, state or "", time.monotonic()))

    def first_end(self, task_id: str) -> float | None:
        """When the first run of ``task_id`` that succeeded ended, if one did."""
        ends = [at for tid, state, at in self.ended if tid == task_id and state == "SUCCESS"]
        return min(ends, default=None)

    def after(self, task_id: str, moment: float) -> int:
        """Deliveries of ``task_id`` that ended after ``moment`` without running the body."""
        return sum(
            1
            for tid, state, at in self.ended
            if tid == task_id and at > moment and state != "SUCCESS"
        )


@pytest.fixture
def deliveries() -> Iterator[Deliveries]:
    seen = Deliveries()
    task_prerun.connect(seen.on_prerun, weak=False)
    task_postrun.connect(seen.on_postrun, weak=False)
    yield seen
    task_prerun.disconnect(seen.on_prerun)
    task_postrun.disconnect(seen.on_postrun)


def wait_until_quiet(
    broker_url: str,
    queue: str,
    timeout: float = 60.0,
    reserved: Callable[[], bool] = lambda: bool(worker_state.reserved_requests),
) -> None:
    """Wait until no copy is left: none queued, none unacknowledged, none held by the worker.

    Three looks in a row, 0.3 s apart: a message moving from the queue to
    the unacknowledged set is in neither for an instant. ``reserved``: whether
    the worker holds messages (an in-process worker's state by default; a
    worker in another process holds none that are not unacknowledged).
    """
    client = redis.Redis.from_url(broker_url)
    deadline = time.monotonic() + timeout
    quiet = 0
    try:
        while quiet < 3:
            assert time.monotonic() < deadline, "copies still in flight"
            idle = client.llen(queue) == 0 and client.hlen("unacked") == 0 and not reserved()
            quiet = quiet + 1 if idle else 0
            time.sleep(0.3)
    finally:
        client.close()


@pytest.mark.parametrize("backend", ["redis", "none"], ids=["result-backend", "no-backend"])
def test_a_copy_delivered_after_its_run_ended_is_not_run(
    make_app: Any, broker_url: str, deliveries: Deliveries, backend: str
) -> None:
    # Both tasks run 3 s; the broker re-delivers their messages every second.
    # Copies arriving while a run goes on are re-queued behind it (lock ttl
    # 2 s); those arriving after it ended must be dropped.
    conf: dict[str, Any] = {"result_backend": "disabled"} if backend == "none" else {}
    app = make_app(
        task_acks_late=True,
        redlock_default_ttl=2.0,
        broker_transport_options=SHORT_VISIBILITY,
        **conf,
    )
    add_tasks(app)
    with in_process_worker(app, "threads"):
        single = app.tasks["c.single"].delay(1)
        locked = app.tasks["c.locked"].delay(1)
        if backend == "redis":
            first = {single.id: single.get(timeout=60), locked.id: locked.get(timeout=60)}
        else:
            deadline = time.monotonic() + 60
            while None in (deliveries.first_end(single.id), deliveries.first_end(locked.id)):
                assert time.monotonic() < deadline, "the runs did not end"
                time.sleep(0.05)
        ended = {single.id: body_end(app, "single:1"), locked.id: body_end(app, "locked:1")}
        wait_until_quiet(broker_url, app.conf.task_default_queue)
        # The test saw what it is about: copies handled by the worker after the body ended.
        late = {tid: deliveries.after(tid, at) for tid, at in ended.items()}
        assert all(late.values()), late
    assert runs(app, "single:1") == 1
    assert runs(app, "locked:1") == 1
    if backend == "redis":
        for result in (single, locked):
            meta = app.backend.get_task_meta(result.id)
            assert meta["status"] == states.SUCCESS, meta
            assert meta["result"] == first[result.id]


@pytest.mark.parametrize("backend", ["redis", "none"], ids=["result-backend", "no-backend"])
def test_copies_of_a_message_held_for_its_countdown_run_once(
    make_app: Any, broker_url: str, deliveries: Deliveries, backend: str
) -> None:
    # The worker holds a message with a countdown unacknowledged until it is
    # due; the broker delivers it again every second meanwhile, and all the
    # copies come due together. One pool thread: they run one after another,
    # each copy after the first run ended.
    conf: dict[str, Any] = {"result_backend": "disabled"} if backend == "none" else {}
    app = make_app(task_acks_late=True, broker_transport_options=SHORT_VISIBILITY, **conf)
    add_tasks(app)
    with in_process_worker(app, "threads", concurrency=1):
        single = app.tasks["c.single"].apply_async((6, 0.2), countdown=3)
        locked = app.tasks["c.locked"].apply_async((6, 0.2), countdown=3)
        deadline = time.monotonic() + 60
        while None in (deliveries.first_end(single.id), deliveries.first_end(locked.id)):
            assert time.monotonic() < deadline, "the runs did not end"
            time.sleep(0.05)
        ended = {single.id: body_end(app, "single:6"), locked.id: body_end(app, "locked:6")}
        first = (
            {tid: app.backend.get_task_meta(tid)["result"] for tid in ended} if conf == {} else {}
        )
        wait_until_quiet(broker_url, app.conf.task_default_queue)
        late = {tid: deliveries.after(tid, at) for tid, at in ended.items()}
        assert all(late.values()), late
    assert runs(app, "single:6") == 1
    assert runs(app, "locked:6") == 1
    for task_id, value in first.items():
        meta = app.backend.get_task_meta(task_id)
        assert meta["status"] == states.SUCCESS
        assert meta["result"] == value


@pytest.mark.parametrize("name", ["limited", "waiting"], ids=["slot", "lock"])
@pytest.mark.parametrize("backend", ["redis", "none"], ids=["result-backend", "no-backend"])
def test_a_run_waiting_longer_than_the_visibility_timeout_runs_once(
    make_app: Any, broker_url: str, deliveries: Deliveries, name: str, backend: str
) -> None:
    # The first run holds the only slot (or the lock) for 4 s; the second
    # waits for it (lock_timeout 20 s) while the broker delivers each message
    # again every second. Every copy that comes meanwhile must not run.
    conf: dict[str, Any] = {"result_backend": "disabled"} if backend == "none" else {}
    app = make_app(
        task_acks_late=True,
        redlock_default_ttl=2.0,
        broker_transport_options=SHORT_VISIBILITY,
        **conf,
    )
    add_tasks(app)
    task = app.tasks[f"c.{name}"]
    with in_process_worker(app, "threads", concurrency=4):
        first = task.delay(0, 4.0)
        deadline = time.monotonic() + 30
        while not runs(app, f"{name}:0"):
            assert time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.05)
        second = task.delay(1, 0.2)
        deadline = time.monotonic() + 60
        while None in (deliveries.first_end(first.id), deliveries.first_end(second.id)):
            assert time.monotonic() < deadline, "the runs did not end"
            time.sleep(0.05)
        wait_until_quiet(broker_url, app.conf.task_default_queue)
    # The test saw what it is about: the waiting run's message came again.
    assert sum(tid == second.id for tid, _ in deliveries.started) >= 2, deliveries.started
    assert runs(app, f"{name}:0") == 1
    assert runs(app, f"{name}:1") == 1
    if backend == "redis":
        for result in (first, second):
            assert app.backend.get_task_meta(result.id)["status"] == states.SUCCESS


def test_a_retry_runs_though_its_copies_are_dropped(make_app: Any, broker_url: str) -> None:
    # The retried message waits 2 s in the worker and is delivered again
    # meanwhile: its copies must not run, but the retry itself (the task id
    # is in RETRY, no end) must.
    app = make_app(task_acks_late=True, broker_transport_options=SHORT_VISIBILITY)
    add_tasks(app)
    with in_process_worker(app, "threads", concurrency=1):
        result = app.tasks["c.retry_once"].delay(8)
        value = result.get(timeout=60)
        wait_until_quiet(broker_url, app.conf.task_default_queue)
    client = app.witness.client  # type: ignore[attr-defined]
    assert [int(n) for n in client.lrange("attempts:8", 0, -1)] == [0, 1]
    assert runs(app, "retry_once:8") == 1
    meta = app.backend.get_task_meta(result.id)
    assert meta["status"] == states.SUCCESS
    assert meta["result"] == value


def test_copies_held_for_their_countdown_run_once_in_a_prefork_worker(
    make_app: Any, worker_process: Any, broker_url: str
) -> None:
    # As above, in a prefork worker's pool process (one), with the support tasks.
    conf = {"task_acks_late": True, "broker_transport_options": SHORT_VISIBILITY}
    app = make_app(**conf)
    worker = worker_process(concurrency=1, **conf)
    single = app.tasks["t.single"].apply_async((12, 0.2), countdown=3)
    serial = app.tasks["t.serial"].apply_async(("copies", 0.2), countdown=3)
    assert single.get(timeout=60) == single.id
    assert serial.get(timeout=60) == serial.id
    client = app.witness.client  # type: ignore[attr-defined]
    wait_until_quiet(broker_url, app.conf.task_default_queue, reserved=lambda: False)
    entered = [e for e in app.witness.events() if e[0] == "enter"]  # type: ignore[attr-defined]
    assert sorted(e[1] for e in entered) == ["copies", "single:12"], entered
    assert client.get("overlaps") is None
    assert app.backend.get_task_meta(single.id)["status"] == states.SUCCESS
    # The copies came, and were dropped by the pool process (its INFO line).
    dropped = [line for line in worker.log().splitlines() if "already finished" in line]
    assert {single.id, serial.id} <= {
        tid for line in dropped for tid in (single.id, serial.id) if tid in line
    }


def test_rate_limited_runs_re_queued_with_copies_run_once_in_a_prefork_worker(
    make_app: Any, worker_process: Any, broker_url: str
) -> None:
    # A rate limit only (no lock), acks_late: "1/3s" re-queues two of three runs
    # for later, messages with an eta the broker delivers again every 2 s while
    # the worker holds them. Each body runs once.
    transport = {
        "visibility_timeout": 2,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    conf = {"redlock_default_ttl": 2.0, "broker_transport_options": transport}
    app = make_app(**conf)
    worker_process(concurrency=2, **conf)
    task = app.tasks["t.rate_late"]
    results = [task.delay(n) for n in range(3)]
    assert [result.get(timeout=60) for result in results] == [0, 1, 2]
    wait_until_quiet(broker_url, app.conf.task_default_queue, reserved=lambda: False)
    events = app.witness.events()  # type: ignore[attr-defined]
    started = [e[2] for e in events if e[:2] == ["start", "rate_late"]]
    assert sorted(started) == sorted(result.id for result in results)


def test_a_group_with_two_identical_singletons_ends_with_one_run(
    app: Celery, deliveries: Deliveries
) -> None:
    add_tasks(app)
    single = app.tasks["c.single"]
    with in_process_worker(app, "threads"):
        # Runs of 2 s: the first cannot end before the second is published.
        result = group(single.s(2, 2.0), single.s(2, 2.0)).apply_async()
        values = result.get(timeout=60)
    assert runs(app, "single:2") == 1
    assert len(values) == 2
    assert values[0] == values[1]
    assert values[0].startswith("single:2/")


def test_a_chord_with_two_identical_singletons_calls_its_body(app: Celery) -> None:
    add_tasks(app)
    single = app.tasks["c.single"]
    with in_process_worker(app, "threads"):
        # Runs of 2 s: the first cannot end before the second is published.
        result = chord([single.s(3, 2.0), single.s(3, 2.0)])(app.tasks["c.collect"].s())
        values = result.get(timeout=60)
    assert runs(app, "single:3") == 1
    assert len(values) == 2
    assert values[0] == values[1]
    collected = app.witness.client.lrange("collected", 0, -1)  # type: ignore[attr-defined]
    assert [value.decode() for value in collected] == values


def test_a_group_with_identical_singletons_that_raise_on_duplicate_ends(app: Celery) -> None:
    add_tasks(app)
    task = app.tasks["c.single_raise"]
    with in_process_worker(app, "threads"):
        # Runs of 2 s: the first cannot end before the second is published.
        result = group(task.s(4, 2.0), task.s(4, 2.0)).apply_async()
        with pytest.raises(DuplicateTask):
            result.get(timeout=60)
        result.join(timeout=60, propagate=False)
        states_seen = sorted(child.state for child in result.results)
    assert states_seen == [states.FAILURE, states.SUCCESS]
    assert runs(app, "single_raise:4") == 1


def test_revoking_a_singleton_with_a_countdown_frees_it_for_the_next_publish(
    app: Celery,
) -> None:
    add_tasks(app)
    single = app.tasks["c.single"]
    with in_process_worker(app, "threads"):
        queued = single.apply_async((5, 0.2), countdown=30)
        assert single.delay(5, 0.2).id == queued.id  # queued: a duplicate
        # wait=True: returns once the worker has handled the revoke.
        queued.revoke(wait=True, timeout=10)
        again = single.delay(5, 0.2)
        assert again.id != queued.id
        assert again.get(timeout=20).startswith("single:5/")
    assert runs(app, "single:5") == 1
    assert queued.state == states.REVOKED


@pytest.mark.parametrize("how", ["chain", "link"])
def test_a_duplicate_step_delivered_after_its_twin_ended_ends_with_its_value(
    app: Celery, deliveries: Deliveries, how: str
) -> None:
    """Published while the first copy runs, delivered (countdown) once it has ended: not run."""
    add_tasks(app)
    client = app.witness.client  # type: ignore[attr-defined]
    after = app.tasks["c.after"]

    single = app.tasks["c.single"]
    with in_process_worker(app, "threads"):
        first = single.delay(7, 0.5)
        deadline = time.monotonic() + 60
        while runs(app, "single:7") < 1:
            assert time.monotonic() < deadline, "the first copy never started"
            time.sleep(0.05)
        # The first copy holds the key: this one is a duplicate, sent for its canvas.
        step = single.si(7, 0.5).set(countdown=3)
        if how == "chain":
            tail = chain(step, after.s()).apply_async()
            duplicate = tail.parent
        else:
            duplicate = step.apply_async(link=after.s())
            tail = None
        value = first.get(timeout=60)
        deadline = time.monotonic() + 60
        while not client.llen("after"):
            assert time.monotonic() < deadline, "the step after the duplicate never ran"
            time.sleep(0.05)
        if tail is not None:
            assert tail.get(timeout=60) == f"after {value}"
        assert duplicate.get(timeout=60) == value
    # The test saw what it is about: the duplicate reached the worker after the first ended.
    first_end = deliveries.first_end(first.id)
    assert first_end is not None
    assert min(at for tid, at in deliveries.started if tid == duplicate.id) > first_end
    assert runs(app, "single:7") == 1
    assert [item.decode() for item in client.lrange("after", 0, -1)] == [value]


@pytest.mark.parametrize("how", ["chain", "link"])
@pytest.mark.parametrize("mode", ["one", "queued"])
def test_a_duplicate_singleton_step_runs_what_follows_it(
    app: Celery, deliveries: Deliveries, how: str, mode: str
) -> None:
    add_tasks(app)
    client = app.witness.client  # type: ignore[attr-defined]
    after = app.tasks["c.after"]

    with in_process_worker(app, "threads"):
        if mode == "one":
            single, what, args = app.tasks["c.single"], "single:6", (6, 1.0)
            first = single.delay(*args)
        else:
            single, what, args = app.tasks["c.single_queued"], "single_queued:6", (6,)
            running = single.delay(*args)
            deadline = time.monotonic() + 60
            while runs(app, what) < 1:
                assert time.monotonic() < deadline, "the first copy never started"
                time.sleep(0.05)
            # Published while a copy runs: the follow-up, which holds the key.
            first = single.delay(*args)
            assert first.id != running.id
        # Published while the first is queued (or running, in mode "one"): a
        # duplicate, which ends with the first's value once it has ended, and
        # what follows runs.
        if how == "chain":
            tail = chain(single.si(*args), after.s()).apply_async()
            duplicate = tail.parent
        else:
            duplicate = single.apply_async(args, link=after.s())
            tail = None
        assert duplicate.id != first.id
        if mode == "queued":
            # The duplicate came up while the follow-up still waited.
            deadline = time.monotonic() + 60
            while not any(tid == duplicate.id for tid, _, _ in deliveries.ended):
                assert time.monotonic() < deadline, "the duplicate never came up"
                time.sleep(0.05)
            client.rpush(f"go:{what}", "running", "follow-up")
        value = first.get(timeout=60)
        if tail is not None:
            assert tail.get(timeout=60) == f"after {value}"
        deadline = time.monotonic() + 60
        while not client.llen("after"):
            assert time.monotonic() < deadline, "the step after the duplicate never ran"
            time.sleep(0.05)
    assert [item.decode() for item in client.lrange("after", 0, -1)] == [value]
    assert runs(app, what) == (1 if mode == "one" else 2)
