"""Singleton tasks with real workers and real lock nodes."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import threading
import time
from datetime import datetime
from typing import Any

import pytest
from celery import Celery, states
from celery.exceptions import MaxRetriesExceededError, WorkerLostError

from celery_redlock import LockedTask, setup, signals
from celery_redlock.errors import ConfigurationError, DuplicateTask
from celery_redlock.tasks.app_state import policy_for, redlock_for
from celery_redlock.tasks.key_templates import canonical_hash
from celery_redlock.testing import RedisServer

from .support import free_now, in_process_worker, overlaps, wait_for_event, wait_free

pytestmark = pytest.mark.celery


def runs(app: Celery, key: str) -> list[list[str]]:
    return [e for e in app.witness.events() if e[0] == "enter" and e[1] == key]


def test_rapid_duplicates_collapse_into_one_run(app: Celery) -> None:
    single = app.tasks["t.single"]
    with in_process_worker(app, "threads"):
        results = [single.delay(7) for _ in range(10)]
        assert len({result.id for result in results}) == 1
        assert results[0].get(timeout=20) == results[0].id
        assert len(runs(app, "single:7")) == 1
        # Finished: the next publish is a new task that runs again.
        again = single.delay(7)
        assert again.id != results[0].id
        assert again.get(timeout=20) == again.id
    assert len(runs(app, "single:7")) == 2


def test_a_duplicate_whose_holder_cannot_be_told_stores_no_failure_on_its_id(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    # The key is busy with a value naming no run, as when the holder ended
    # between the failed take and the look at the key: this may be a copy of
    # the run's own id, whose result a duplicate's failure must not overwrite.
    task = app.tasks["t.single"]
    result = task.apply_async((8,), countdown=1)
    policy = policy_for(task)
    assert policy is not None
    assert policy.singleton is not None
    key = redlock_for(app).key(policy.singleton.name(task.name, (8,), {}))
    for node in lock_nodes:
        with node.client() as client:
            client.set(key, "stranger", px=10_000)
    suppressed = threading.Event()

    def on_suppressed(sender: Any, **info: Any) -> None:
        if info.get("where") == "worker":
            suppressed.set()

    signals.duplicate_suppressed.connect(on_suppressed, weak=False)
    try:
        with in_process_worker(app, "threads"):
            assert suppressed.wait(30)
    finally:
        signals.duplicate_suppressed.disconnect(on_suppressed)
    assert app.backend.get_task_meta(result.id)["status"] != states.FAILURE
    assert runs(app, "single:8") == []


def test_other_arguments_are_not_duplicates(app: Celery) -> None:
    single = app.tasks["t.single"]
    with in_process_worker(app, "threads"):
        first, second = single.delay(1, 0.3), single.delay(2, 0.3)
        assert first.id != second.id
        first.get(timeout=20)
        second.get(timeout=20)


def test_defaults_and_keyword_order_make_the_same_singleton(app: Celery) -> None:
    single = app.tasks["t.single"]
    first = single.apply_async((5,), {"duration": 0.5})
    assert single.apply_async((), {"duration": 0.5, "n": 5, "flag": False}).id == first.id
    assert single.apply_async((5, 0.5)).id == first.id
    assert single.apply_async((5, 0.5, True)).id != first.id


def test_on_duplicate_raise_names_the_queued_task(app: Celery) -> None:
    task = app.tasks["t.single_raise"]
    first = task.delay(3)
    with pytest.raises(DuplicateTask, match=first.id) as caught:
        task.delay(3)
    assert caught.value.task_id == first.id
    assert caught.value.task_name == "t.single_raise"
    # Queued: what is left of singleton_ttl (3600 s), as celery-once's countdown.
    assert caught.value.ttl is not None
    assert 3500 < caught.value.ttl <= 3600


def test_a_duplicate_of_a_running_copy_carries_its_id_and_how_long_its_key_holds(
    app: Celery,
) -> None:
    single = app.tasks["t.single"]
    with in_process_worker(app, "threads"):
        running = single.delay(9, 3.0)
        wait_for_event(app, "enter")
        with pytest.raises(DuplicateTask) as caught:
            single.apply_async((9, 3.0), redlock={"on_duplicate": "raise"})
        assert caught.value.task_id == running.id
        # Running: the key lives by lock_ttl (60 s), renewed by the heartbeat.
        assert caught.value.ttl is not None
        assert 0 < caught.value.ttl <= 60
        assert running.get(timeout=20) == running.id


def test_retry_republishes_without_being_a_duplicate(app: Celery) -> None:
    task = app.tasks["t.single_retry"]
    with in_process_worker(app, "threads"):
        result = task.delay(1)
        assert result.get(timeout=30) == 2
        # While the retried copies were queued, a publish was a duplicate.
        assert task.delay(1).id != result.id
    retries = [e[5] for e in app.witness.events() if e[0] == "run" and e[2] == result.id]
    assert retries == ["retries=0", "retries=1", "retries=2"]


def test_a_retry_of_a_beat_published_singleton_is_no_second_tick(app: Celery) -> None:
    # The retry keeps beat's header; within the beat window it must still be sent.
    task = app.tasks["t.single_retry"]  # retries twice, 0.1 s apart
    with in_process_worker(app, "threads"):
        result = task.apply_async((6,), headers={"celery_beat_task": True})
        assert result.get(timeout=30) == 2
    runs = [e for e in app.witness.events() if e[:2] == ["run", "single_retry:6"]]
    assert len(runs) == 3


def test_redelivered_message_runs_once(make_app: Any) -> None:
    # The Redis broker re-delivers an unacknowledged message after
    # visibility_timeout, with the same task id, while the first copy runs.
    app = make_app(
        task_acks_late=True,
        redlock_default_ttl=2.0,
        broker_transport_options={"visibility_timeout": 1, "unacked_restore_throttle": 1},
    )
    with in_process_worker(app, "threads"):
        result = app.tasks["t.single"].delay(9, 4.0)
        assert result.get(timeout=30) == result.id
        time.sleep(4.0)  # room for re-delivered copies to come and go
    entered = runs(app, "single:9")
    assert len(entered) == 1, entered
    assert overlaps(app.witness.events()) == 0


def test_killed_worker_frees_the_singleton_within_its_ttl(app: Celery, worker_process: Any) -> None:
    worker = worker_process()
    task = app.tasks["t.single_short"]
    first = task.delay(4)
    wait_for_event(app, "started")
    assert task.delay(4).id == first.id  # running: a duplicate
    worker.kill()
    killed = time.monotonic()  # after the kill: no renewal since
    while True:
        asked = time.monotonic()  # a duplicate: still held at a moment after this
        if task.delay(4).id != first.id:
            break
        # Held at most the ttl (2 s) past the last renewal; 1 s for lateness.
        assert asked - killed < 2.0 + 1.0, "singleton not freed within its ttl"
        time.sleep(0.1)


def test_worker_refuses_a_second_copy_sent_by_name(app: Celery) -> None:
    # send_task bypasses the task class: the worker still runs one at a time.
    # The three copies reach the pool together (a run of 3 s outlasts a loaded
    # machine's spread); any one of them may win.
    with in_process_worker(app, "threads"):
        sent = [app.send_task("t.single", (8, 3.0)) for _ in range(3)]
        results = {result.id: result for result in sent}
        # Judged once all three are decided, not after a fixed time.
        deadline = time.monotonic() + 60
        while not all(result.ready() for result in sent):
            assert time.monotonic() < deadline, [result.state for result in sent]
            time.sleep(0.05)
        entered = runs(app, "single:8")
        assert len(entered) == 1, entered
        winner = entered[0][2]
        assert results[winner].get(timeout=10) == winner
        losers = set(results) - {winner}
        assert len(losers) == 2
        # The others never ran, and their results say why instead of staying
        # PENDING forever: a caller waiting on one learns which copy runs.
        for task_id in losers:
            with pytest.raises(DuplicateTask, match=winner):
                results[task_id].get(timeout=10)
            assert results[task_id].state == "FAILURE"
    assert len(runs(app, "single:8")) == 1


def test_redlock_tasks_config_applies_to_a_plain_task(
    make_app: Any, lock_nodes: list[RedisServer]
) -> None:
    app = make_app(
        redlock_tasks={"t.plain": {"singleton": True, "lock_key": "plain-lock", "lock_ttl": 5}}
    )
    setup(app)
    plain = app.tasks["t.plain"]
    assert isinstance(plain, LockedTask)
    with in_process_worker(app, "threads"):
        # Runs of 1.5 s: the first cannot end before the duplicate is published.
        first = plain.delay(1, 1.5)
        assert plain.delay(1, 1.5).id == first.id  # singleton at publish
        other = plain.delay(2, 1.5)  # not a duplicate, but the same run lock
        first.get(timeout=20)
        other.get(timeout=30)
        assert free_now(lock_nodes, "plain-lock")
    events = app.witness.events()
    enters = sorted(events, key=lambda e: float(e[3]))
    assert [e[0] for e in enters] == ["enter", "exit", "enter", "exit"]


def test_redlock_tasks_unknown_option_fails_at_startup(make_app: Any) -> None:
    # Options are checked whether or not a module registered the task.
    for name in ("t.plain", "t.nope"):
        app = make_app(redlock_tasks={name: {"singelton": True}})
        setup(app)
        with (
            pytest.raises(ConfigurationError, match="did you mean singleton") as caught,
            in_process_worker(app, "solo"),
        ):
            pass
        assert caught.value.option == f"redlock_tasks[{name!r}].singelton"
    app = make_app(redlock_tasks={"t.plain": {"singelton": True}})
    app.finalize()
    with pytest.raises(ConfigurationError, match="singelton"):
        setup(app)


def test_revoking_a_queued_singleton_frees_it(app: Celery, lock_nodes: list[RedisServer]) -> None:
    task = app.tasks["t.single"]
    with in_process_worker(app, "threads"):
        queued = task.apply_async((6,), countdown=1.5)
        assert task.delay(6).id == queued.id
        queued.revoke()
        # Dropped when its eta comes, and its singleton freed with it (the
        # queued singleton's ttl is far longer than this wait).
        wait_free(lock_nodes, task_singleton_key(task, 6), timeout=20.0)
        again = task.delay(6)
        assert again.id != queued.id
        assert again.get(timeout=30) == again.id


def task_singleton_key(task: Any, n: int) -> str:
    name: str = task._redlock_policy.singleton.name(task.name, (n,), {})
    return name


class TestCanonicalHash:
    def test_keyword_order_does_not_matter(self) -> None:
        assert canonical_hash({"a": 1, "b": 2}) == canonical_hash({"b": 2, "a": 1})

    def test_integral_floats_equal_ints_but_bools_do_not(self) -> None:
        assert canonical_hash({"a": 1}) == canonical_hash({"a": 1.0})
        assert canonical_hash({"a": 1}) != canonical_hash({"a": True})
        assert canonical_hash({"a": 1.5}) != canonical_hash({"a": 1})

    def test_nested_values_and_tuples(self) -> None:
        assert canonical_hash({"a": (1, [2, {"x": 3}])}) == canonical_hash(
            {"a": [1, [2, {"x": 3}]]}
        )
        assert canonical_hash({"a": {"x": 1, "y": 2}}) == canonical_hash({"a": {"y": 2, "x": 1}})

    def test_different_values_differ(self) -> None:
        assert canonical_hash({"a": "1"}) != canonical_hash({"a": 1})
        assert canonical_hash({"a": None}) != canonical_hash({"a": "None"})
        assert canonical_hash({"a": [1, 2]}) != canonical_hash({"a": [2, 1]})

    def test_unicode_is_stable(self) -> None:
        assert canonical_hash({"name": "Zoë"}) == canonical_hash({"name": "Zoë"})

    @pytest.mark.parametrize("value", [object(), {1: "int key"}, b"bytes", {1, 2}])
    def test_values_without_a_stable_hash_are_refused(self, value: Any) -> None:
        with pytest.raises(ConfigurationError, match="singleton_key"):
            canonical_hash({"a": value})


def test_two_beats_on_one_schedule_run_each_tick_once(
    app: Celery, beat_process: Any, tmp_path: Any
) -> None:
    # Gated: the ticks stop before the processes do, so no publish goes out
    # unrecorded (a tick cut short between its publish and its record).
    app.witness.client.set("beat-on", 1)
    gated = "tests.worker.support:GatedScheduler"
    with in_process_worker(app, "threads"):
        beats = [beat_process(1.0, scheduler=gated), beat_process(1.0, scheduler=gated)]
        logs = [tmp_path / f"beat{n}.log" for n in range(2)]
        deadline = time.monotonic() + 60
        # Each beat sends 4 ticks or more (a loaded machine starts them slowly).
        while min(log.read_text().count("Sending due task") for log in logs) < 4:
            assert time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
            time.sleep(0.1)
        app.witness.client.delete("beat-on")
        time.sleep(2.0)  # a tick past the gate when the key went is over by now
        for beat in beats:
            beat.terminate()
            beat.wait(10)
        time.sleep(0.5)
    sends = [send_times(log.read_text()) for log in logs]
    ran = len(runs(app, "single:11"))
    # Each publish that went out was checked (its tick's lock taken) after
    # its beat logged the send and before the beat noted the publish: a
    # bracket a loaded machine may widen but never moves. (Wall clock to
    # monotonic: both clocks of this machine, read together.)
    wall = time.time() - time.monotonic()
    checked = []
    for beat, times in zip(beats, sends, strict=True):
        for event in app.witness.events():
            if event[0] == "published" and int(event[4]) == beat.pid:
                published = float(event[3])
                logged = max(t - wall for t in times if t - wall <= published + 0.002)
                checked.append((logged, published))
    # Publishes within singleton_beat_window (0.5 s) of a tick's first are that
    # tick: two that went out were checked 0.5 s apart or more; beats that
    # started further apart send ticks of their own.
    for n, first in enumerate(checked):
        for second in checked[n + 1 :]:
            assert max(first[1], second[1]) - min(first[0], second[0]) >= 0.5, (first, second)
    assert sum(map(len, sends)) >= 8, "both beat processes should have been sending"
    assert 3 <= ran <= len(checked), (sum(map(len, sends)), ran, len(checked))
    assert overlaps(app.witness.events()) == 0


def test_two_beats_started_apart_run_each_interval_tick_once(
    app: Celery, beat_process: Any, tmp_path: Any
) -> None:
    # An interval entry ticks from each beat's own start: beats started 1.5 s
    # apart send each 4 s tick 1.5 s apart, far outside singleton_beat_window.
    every = 4.0
    app.witness.client.set("beat-on", 1)
    gated = "tests.worker.support:GatedScheduler"
    logs = [tmp_path / f"beat{n}.log" for n in range(2)]
    with in_process_worker(app, "threads"):
        beats = [beat_process(every, scheduler=gated)]
        time.sleep(1.5)
        beats.append(beat_process(every, scheduler=gated))
        deadline = time.monotonic() + 120
        while min(log.read_text().count("Sending due task") for log in logs) < 6:
            assert time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
            time.sleep(0.1)
        app.witness.client.delete("beat-on")
        time.sleep(2.0)  # the last publish's run (0.1 s) is over by now
        for beat in beats:
            beat.terminate()
            beat.wait(10)
    sends = [send_times(log.read_text()) for log in logs]
    every_send = sorted(t for times in sends for t in times)
    span = every_send[-1] - every_send[0]
    ran = len(runs(app, "single:11"))
    # One run per interval of the span, plus one for each end; both beats'
    # sends together are twice that. A beat's own sends are an interval apart
    # or more, each a tick no other beat's send may drop but one within the window.
    assert ran <= span / every + 2, (ran, span, sends)
    assert ran >= max(map(len, sends)) - 2, (ran, span, sends)
    assert overlaps(app.witness.events()) == 0


def send_times(log: str) -> list[float]:
    """When a beat log says it sent a task (seconds, from its timestamps)."""
    found = re.findall(
        r"^\[([\d-]+ [\d:]+,\d{3}): INFO/\w+\] Scheduler: Sending due task", log, re.M
    )
    return [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() for stamp in found]


# -- keys rendered from the message's own arguments --------------------------------------


@pytest.mark.parametrize("template", ["batch:{ids}", "batch:{ids!r}"])
def test_a_key_template_over_a_tuple_is_the_key_the_worker_takes_over(
    app: Celery, template: str
) -> None:
    # JSON delivers the tuple as a list: rendered as given at publish, the key
    # would be "batch:(3, 4)" there and "batch:[3, 4]" in the worker.
    @app.task(
        base=LockedTask,
        bind=True,
        name="t.batch",
        shared=False,
        singleton=True,
        singleton_key=template,
    )
    def batch(self: Any, ids: Any) -> str:
        app.witness.event("run", "batch", self.request.id)
        return str(self.request.id)

    with in_process_worker(app, "threads"):
        first = batch.delay((3, 4))
        assert first.get(timeout=30) == first.id
        # Finished: the key went with the run, so the next publish runs.
        second = batch.delay((3, 4))
        assert second.id != first.id
        assert second.get(timeout=30) == second.id
    ran = [e[2] for e in app.witness.events() if e[:2] == ["run", "batch"]]
    assert ran == [first.id, second.id]


def test_a_singleton_published_with_pickle_is_one_copy_per_key(make_app: Any) -> None:
    # The publisher reads the call back through its serializer to render the
    # key the worker renders: pickle, disabled by default for reading, too.
    app = make_app(accept_content=["json", "pickle"])

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.pickled",
        shared=False,
        singleton=True,
        singleton_key="pickled:{ids}",
    )
    def pickled(self: Any, ids: Any) -> str:
        app.witness.event("run", "pickled", self.request.id)
        return str(self.request.id)

    first = pickled.apply_async(((7, 8),), serializer="pickle")
    assert pickled.apply_async(((7, 8),), serializer="pickle").id == first.id
    with in_process_worker(app, "threads"):
        assert first.get(timeout=30) == first.id
        second = pickled.apply_async(((7, 8),), serializer="pickle")
        assert second.id != first.id
        assert second.get(timeout=30) == second.id
    ran = [e[2] for e in app.witness.events() if e[:2] == ["run", "pickled"]]
    assert ran == [first.id, second.id]


# -- retries that run out ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["retry", "autoretry_for"])
def test_a_singleton_whose_retries_run_out_frees_its_key(app: Celery, how: str) -> None:
    @app.task(
        base=LockedTask,
        bind=True,
        name="t.hopeless",
        shared=False,
        singleton=True,
        max_retries=1,
        autoretry_for=(ValueError,) if how == "autoretry_for" else (),
        retry_kwargs={"countdown": 0.1},
    )
    def hopeless(self: Any, n: int) -> None:
        app.witness.event("run", "hopeless", self.request.id, retries=self.request.retries)
        if how == "retry":
            raise self.retry(countdown=0.1)
        raise ValueError("failing on purpose")

    with in_process_worker(app, "threads"):
        first = hopeless.delay(1)
        with pytest.raises(MaxRetriesExceededError if how == "retry" else ValueError):
            first.get(timeout=30)
        # Failed: the key went with it, so the next publish is a new task that runs.
        second = hopeless.delay(1)
        assert second.id != first.id
        with pytest.raises(MaxRetriesExceededError if how == "retry" else ValueError):
            second.get(timeout=30)
    ran = [e[2] for e in app.witness.events() if e[:2] == ["run", "hopeless"]]
    assert ran == [first.id, first.id, second.id, second.id]


@pytest.mark.parametrize("mode", ["one", "queued"])
def test_a_retry_with_new_arguments_keeps_and_frees_its_call_key(app: Celery, mode: str) -> None:
    # The retry's arguments name another key than the call's: it takes over the
    # key its first attempt handed back, and frees it when it ends.
    @app.task(
        base=LockedTask,
        bind=True,
        name="t.reargued",
        shared=False,
        singleton=True,
        singleton_mode=mode,
        max_retries=1,
    )
    def reargued(self: Any, n: int) -> int:
        app.witness.event("run", "reargued", self.request.id, n=n)
        if n < 100:
            app.witness.client.blpop(["release:reargued"], timeout=60)
            raise self.retry(args=(n + 100,), countdown=0.2)
        return n

    with in_process_worker(app, "threads"):
        first = reargued.delay(1)
        wait_for_event(app, "run")
        # Running: a duplicate in "one" mode, the follow-up in "queued" mode.
        again = reargued.delay(1)
        assert (again.id == first.id) is (mode == "one")
        app.witness.client.rpush("release:reargued", *["go"] * 3)
        assert first.get(timeout=30) == 101
        assert again.get(timeout=30) == 101
        # Every copy ended: the call's key went with the last, so this one runs.
        later = reargued.delay(1)
        assert later.id not in (first.id, again.id)
        assert later.get(timeout=30) == 101
        # Nor is a key held for the retries' own arguments.
        other = reargued.delay(101)
        assert other.id not in (first.id, again.id, later.id)
        assert other.get(timeout=30) == 101
    ran = [e[2] for e in app.witness.events() if e[:2] == ["run", "reargued"]]
    expected = [first.id, first.id] + ([again.id, again.id] if mode == "queued" else [])
    assert ran == [*expected, later.id, later.id, other.id]


# -- argument previews ---------------------------------------------------------------------


def preview_keys(lock_nodes: list[RedisServer]) -> list[bytes]:
    found = []
    for node in lock_nodes:
        with node.client() as client:
            found.extend(client.scan_iter("*:args"))
    return found


def test_no_argument_preview_outlives_its_run(make_app: Any, lock_nodes: list[RedisServer]) -> None:
    app = make_app()
    single, queued = app.tasks["t.single"], app.tasks["t.queued"]
    # Published before a worker runs: each shows its call while it waits.
    results = [single.delay(n, 0.05) for n in range(5)]
    results += [queued.delay(n, 0.05) for n in range(3)]
    assert len(preview_keys(lock_nodes)) == 8 * len(lock_nodes)
    with in_process_worker(app, "threads"):
        for result in results:
            result.get(timeout=30)
    assert preview_keys(lock_nodes) == []
    eager = make_app(task_always_eager=True)
    assert eager.tasks["t.single"].delay(40, 0.05).get(timeout=30)
    assert preview_keys(lock_nodes) == []


def round_trips(client: Any) -> int:
    """Requests the node has read from its clients, this look included (``total_reads_processed``).

    A call, a script call or a pipeline sent at once is one read: one round trip.
    """
    return int(client.info("stats")["total_reads_processed"])


def test_a_singleton_run_drops_its_preview_in_its_release(
    make_app: Any, lock_nodes: list[RedisServer]
) -> None:
    eager = make_app(task_always_eager=True)
    single = eager.tasks["t.single"]
    single.delay(41, 0.0).get(timeout=30)  # connections open, scripts loaded
    with contextlib.ExitStack() as stack:
        looks = [stack.enter_context(node.client()) for node in lock_nodes]
        before = [round_trips(client) for client in looks]
        assert single.delay(42, 0.0).get(timeout=30)
        # A call returns once a majority answered: a node's part of the last one (the
        # release) may reach it a moment later. Each look is one read more.
        deadline = time.monotonic() + 10.0
        for looked in itertools.count(1):
            after = [round_trips(client) for client in looks]
            trips = [a - b - looked for a, b in zip(after, before, strict=True)]
            if min(trips) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    # Per node: the publish's lock and its preview, the run's takeover and
    # its release, which deletes the preview too.
    assert trips == [4] * len(lock_nodes)
    assert preview_keys(lock_nodes) == []


def test_a_killed_run_leaves_no_argument_preview(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker_process(concurrency=1)
    result = app.tasks["t.single"].delay(43, 60.0)
    entered = wait_for_event(app, "enter", timeout=60)
    assert entered[2] == result.id
    assert len(preview_keys(lock_nodes)) == len(lock_nodes)  # shown while it runs
    os.kill(int(entered[4]), signal.SIGKILL)
    # Stored by the worker's main process after it freed the run's locks.
    with pytest.raises(WorkerLostError):
        result.get(timeout=60)
    left = []
    for node in lock_nodes:
        with node.client() as client:
            left.extend(client.scan_iter("*{singleton:t.single:*"))
    assert left == []
