"""Debounce and the queued singleton mode with real workers and real lock nodes."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, uuid
from celery.exceptions import MaxRetriesExceededError
from celery.result import AsyncResult
from celery.signals import task_postrun

from celery_redlock import LockedTask, Redlock, setup, signals
from celery_redlock.errors import DuplicateTask, Superseded
from celery_redlock.tasks.app_state import debounce_store_for, policy_for
from celery_redlock.tasks.features.debounce import DEBOUNCE_HEADER
from celery_redlock.tasks.features.singleton import task_id_of
from celery_redlock.testing import RedisServer, ServerGroup, free_port

from .support import ROOT, free_now, in_process_worker, overlaps

pytestmark = pytest.mark.celery

#: The node timeout of the test's own looks at the nodes: above a loaded
#: machine's scheduling delay (a look that timed out says nothing of the product).
NODE_TIMEOUT = 1.0


def looker(nodes: list[RedisServer]) -> Redlock:
    return Redlock([node.url for node in nodes], key_prefix="t:", node_timeout=NODE_TIMEOUT)


def events_of(app: Celery, kind: str, key: str) -> list[list[str]]:
    return [e for e in app.witness.events() if e[0] == kind and e[1] == key]


def field(event: list[str], name: str) -> str:
    return next(part.split("=", 1)[1] for part in event[5:] if part.startswith(f"{name}="))


def settle(results: list[AsyncResult], timeout: float = 60) -> None:
    """Wait until every result is ready (a success or a failure)."""
    for result in results:
        result.get(timeout=timeout, propagate=False)


# -- debounce ---------------------------------------------------------------------------


def test_a_burst_from_two_processes_runs_once_after_the_last_publish_with_its_arguments(
    app: Celery, broker_url: str, lock_nodes: list[RedisServer], witness: RedisServer
) -> None:
    # 50 publishes over about 3 s from two processes, taking turns so that
    # "the last publish" is well defined; debounce 5 s.
    env = {
        **os.environ,
        "CR_BROKER": broker_url,
        "CR_NODES": ",".join(node.url for node in lock_nodes),
        "CR_WITNESS": witness.url,
        "CR_DOC": "42",
        "CR_COPIES": "25",
        "CR_PAUSE": "0.12",
    }
    client = witness.client()
    with in_process_worker(app, "threads"):
        publishers = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.worker.debounce_publisher"], cwd=ROOT, env=env
            )
            for _ in range(2)
        ]
        try:
            for _ in publishers:
                assert client.blpop(["debounce:ready"], timeout=60) is not None
            client.rpush("debounce:turn", "token")
            for process in publishers:
                assert process.wait(120) == 0
        finally:
            for process in publishers:
                if process.poll() is None:
                    process.kill()
        published = [entry.decode().split() for entry in client.lrange("debounce:published", 0, -1)]
        assert len(published) == 50
        first_at, last_at = float(published[0][2]), float(published[-1][2])
        # Each process pauses 0.12 s after each of its 25 publishes: the burst
        # lasts at least 24 pauses, about 3 s.
        assert last_at - first_at >= 24 * 0.12
        results = [app.AsyncResult(task_id) for _, task_id, _ in published]
        settle(results)
    last_n, last_id, last_before = published[-1]
    runs = events_of(app, "run", "debounced:42")
    assert len(runs) == 1, runs
    (run,) = runs
    assert run[2] == last_id
    assert field(run, "n") == last_n
    assert float(run[3]) - float(last_before) >= 5.0
    assert results[-1].get(timeout=1) == int(last_n)
    for result in results[:-1]:
        assert result.state == "FAILURE"
        with pytest.raises(Superseded, match=last_id):
            result.get(timeout=1)


def test_keys_debounce_independently(app: Celery) -> None:
    # Published before a worker runs, so that no copy can come up mid-burst
    # however slow the machine is.
    task = app.tasks["t.debounced_fast"]
    sent: dict[str, list[tuple[AsyncResult, float]]] = {"a": [], "b": []}
    for n in range(6):
        for doc in ("a", "b"):
            before = time.monotonic()
            sent[doc].append((task.delay(doc, n if doc == "a" else 100 + n), before))
    with in_process_worker(app, "threads"):
        settle([result for copies in sent.values() for result, _ in copies])
    for doc, last_n in (("a", "5"), ("b", "105")):
        runs = events_of(app, "run", f"debounced_fast:{doc}")
        assert len(runs) == 1, runs
        last, before = sent[doc][-1]
        assert runs[0][2] == last.id
        assert field(runs[0], "n") == last_n
        assert float(runs[0][3]) - before >= 1.0
        for result, _ in sent[doc][:-1]:
            with pytest.raises(Superseded, match=last.id):
                result.get(timeout=1)


def test_the_latest_copy_retries_without_being_debounced_again(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    task = app.tasks["t.debounced_fast"]
    record = "t:debounce:{debounce:t.debounced_fast:doc:r}"
    earlier = task.delay("r", 1, retries=2)
    latest = task.delay("r", 2, retries=2)
    published = lock_nodes[0].client().hgetall(record)
    with in_process_worker(app, "threads"):
        assert latest.get(timeout=30) == 2
        with pytest.raises(Superseded, match=latest.id):
            earlier.get(timeout=10)
    runs = events_of(app, "run", "debounced_fast:r")
    assert [(run[2], field(run, "n")) for run in runs] == [(latest.id, "2")] * 3
    # The retries were not recorded as publishes: the record is the one the
    # latest publish wrote (a new record would have a new sequence and due time).
    assert lock_nodes[0].client().hgetall(record) == published


def test_a_copy_sent_by_name_is_debounced_when_a_worker_gets_it(app: Celery) -> None:
    # The 5 s debounce leaves the worker that long to record the copy sent
    # by name before the published one is due.
    with in_process_worker(app, "threads"):
        published = app.tasks["t.debounced"].delay("s", 1)
        before = time.monotonic()
        by_name = app.send_task("t.debounced", ("s", 2))
        assert by_name.get(timeout=60) == 2
        with pytest.raises(Superseded, match=by_name.id):
            published.get(timeout=30)
    runs = events_of(app, "run", "debounced:s")
    assert [(run[2], field(run, "n")) for run in runs] == [(by_name.id, "2")]
    assert float(runs[0][3]) - before >= 5.0


def test_a_publish_after_the_run_started_runs_again(app: Celery) -> None:
    task = app.tasks["t.debounced_fast"]
    with in_process_worker(app, "threads"):
        first = task.delay("x", 1)
        assert first.get(timeout=30) == 1
        second = task.delay("x", 2)
        assert second.get(timeout=30) == 2
    assert [field(run, "n") for run in events_of(app, "run", "debounced_fast:x")] == ["1", "2"]


# -- singleton_mode="queued" --------------------------------------------------------------


@contextlib.contextmanager
def worker_releasing(app: Celery, witness: RedisServer, key: str) -> Iterator[Any]:
    """A threads worker that, on the way out, releases every run still blocked on ``key``.

    So that a failing test does not leave a run blocked into the next test.
    """
    with in_process_worker(app, "threads") as worker:
        try:
            yield worker
        finally:
            witness.client().rpush(f"release:{key}", *["go"] * 10)


def wait_event(app: Celery, kind: str, key: str, task_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not any(e[2] == task_id for e in events_of(app, kind, key)):
        assert time.monotonic() < deadline, f"no {kind} of {task_id} within {timeout} s"
        time.sleep(0.02)


def test_one_running_plus_one_queued(app: Celery, witness: RedisServer) -> None:
    task = app.tasks["t.queued"]
    release = witness.client()
    with worker_releasing(app, witness, "queued:1"):
        running = task.delay(1)
        wait_event(app, "enter", "queued:1", running.id)
        follow_up = task.delay(1)
        assert follow_up.id != running.id  # a publish while one runs queues a follow-up
        assert {task.delay(1).id for _ in range(5)} == {follow_up.id}
        assert task.delay(2, 0.0).id not in (running.id, follow_up.id)  # other arguments
        release.rpush("release:queued:1", "go")
        assert running.get(timeout=30) == running.id
        wait_event(app, "enter", "queued:1", follow_up.id)
        # The follow-up started: the next publish queues the next follow-up.
        third = task.delay(1)
        assert third.id not in (running.id, follow_up.id)
        assert task.delay(1).id == third.id
        release.rpush("release:queued:1", "go")
        release.rpush("release:queued:1", "go")
        assert follow_up.get(timeout=30) == follow_up.id
        assert third.get(timeout=30) == third.id
    entered = [e[2] for e in events_of(app, "enter", "queued:1")]
    assert entered == [running.id, follow_up.id, third.id]
    assert overlaps(app.witness.events()) == 0
    # Idle again: a publish queues, and a second one returns it (no worker
    # runs meanwhile, so the first is still queued, not started).
    idle = task.delay(1, 0.3)
    assert task.delay(1, 0.3).id == idle.id
    with in_process_worker(app, "threads"):
        assert idle.get(timeout=30) == idle.id


def test_a_retry_stays_the_current_copy_and_the_follow_up_waits(
    app: Celery, witness: RedisServer
) -> None:
    task = app.tasks["t.queued_retry"]
    with worker_releasing(app, witness, "queued_retry:1"):
        first = task.delay(1)
        wait_event(app, "enter", "queued_retry:1", first.id)
        follow_up = task.delay(1)
        assert follow_up.id != first.id
        assert task.delay(1).id == follow_up.id
        witness.client().rpush("release:queued_retry:1", "go", "go")
        assert first.get(timeout=30) == 2
        assert follow_up.get(timeout=30) == 2
    runs = [(e[2], field(e, "retries")) for e in events_of(app, "run", "queued_retry:1")]
    assert runs == [
        (first.id, "0"),
        (first.id, "1"),
        (first.id, "2"),
        (follow_up.id, "0"),
        (follow_up.id, "1"),
        (follow_up.id, "2"),
    ]
    assert overlaps(app.witness.events()) == 0


def test_queued_mode_redelivered_message_runs_once(make_app: Any) -> None:
    # As for the default mode: a copy re-delivered while its twin runs waits behind it.
    app = make_app(
        task_acks_late=True,
        redlock_default_ttl=2.0,
        broker_transport_options={"visibility_timeout": 1, "unacked_restore_throttle": 1},
    )
    with in_process_worker(app, "threads"):
        result = app.tasks["t.queued"].delay(9, 4.0)
        assert result.get(timeout=30) == result.id
        time.sleep(4.0)  # room for re-delivered copies to come and go
    entered = events_of(app, "enter", "queued:9")
    assert len(entered) == 1, entered
    assert overlaps(app.witness.events()) == 0


def test_a_copy_sent_by_name_while_a_follow_up_waits_is_a_duplicate(
    app: Celery, witness: RedisServer
) -> None:
    task = app.tasks["t.queued"]
    with worker_releasing(app, witness, "queued:3"):
        running = task.delay(3)
        wait_event(app, "enter", "queued:3", running.id)
        follow_up = task.delay(3)
        by_name = app.send_task("t.queued", (3,))
        with pytest.raises(DuplicateTask, match=follow_up.id):
            by_name.get(timeout=30)
        witness.client().rpush("release:queued:3", "go", "go")
        assert running.get(timeout=30) == running.id
        assert follow_up.get(timeout=30) == follow_up.id
    assert [e[2] for e in events_of(app, "enter", "queued:3")] == [running.id, follow_up.id]


def test_a_store_down_at_publish_loses_nothing(
    make_app: Any, servers: ServerGroup, witness: RedisServer
) -> None:
    # The debounce store (here redlock_rate_limit_url) does not answer at
    # publish: the copies are sent unrecorded, recorded when a worker gets
    # them, and still run once between them (the 5 s debounce leaves the
    # worker that long to record all three before the first is due).
    store = servers[4]
    app = make_app(redlock_rate_limit_url=store.url)
    task = app.tasks["t.debounced"]
    store.kill()
    sent = [task.delay("down", n) for n in range(3)]
    store.start()
    with in_process_worker(app, "threads"):
        settle(sent)
    runs = events_of(app, "run", "debounced:down")
    assert len(runs) == 1, runs
    ran = runs[0][2]
    assert ran in {result.id for result in sent}
    for result in sent:
        if result.id != ran:
            with pytest.raises(Superseded, match=ran):
                result.get(timeout=1)


def test_a_publish_the_broker_refuses_gives_way_to_the_one_before(
    make_app: Any, lock_nodes: list[RedisServer]
) -> None:
    app = make_app()
    sent = app.tasks["t.debounced_fast"].delay("refused", 1)
    dead = make_app(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(Exception):  # noqa: B017 (kombu's error for a broker that is not there)
        dead.tasks["t.debounced_fast"].apply_async(("refused", 2), retry=False)
    record = lock_nodes[0].client().hget("t:debounce:{debounce:t.debounced_fast:doc:refused}", "id")
    assert record == sent.id.encode()
    with in_process_worker(app, "threads"):
        assert sent.get(timeout=30) == 1


def test_revoking_a_queued_follow_up_frees_its_place(app: Celery, witness: RedisServer) -> None:
    task = app.tasks["t.queued"]
    with worker_releasing(app, witness, "queued:5"):
        running = task.delay(5)
        wait_event(app, "enter", "queued:5", running.id)
        follow_up = task.delay(5)
        follow_up.revoke()
        deadline = time.monotonic() + 30
        while (replacement := task.delay(5)).id == follow_up.id:
            assert time.monotonic() < deadline, "the revoked follow-up kept its place"
            time.sleep(0.1)
        witness.client().rpush("release:queued:5", "go", "go")
        assert running.get(timeout=30) == running.id
        assert replacement.get(timeout=30) == replacement.id
    entered = [e[2] for e in events_of(app, "enter", "queued:5")]
    assert entered == [running.id, replacement.id]


def test_redlock_tasks_debounces_a_plain_task(make_app: Any) -> None:
    app = make_app(redlock_tasks={"t.plain": {"debounce": 1.0}})
    setup(app)
    plain = app.tasks["t.plain"]
    sent = [plain.delay(1, 0.01 * n) for n in range(1, 4)]
    with in_process_worker(app, "threads"):
        settle(sent)
    entered = events_of(app, "enter", "plain:1")
    assert [e[2] for e in entered] == [sent[-1].id]
    for result in sent[:-1]:
        with pytest.raises(Superseded, match=sent[-1].id):
            result.get(timeout=1)


def test_redlock_tasks_gives_a_plain_task_the_queued_mode(
    make_app: Any, witness: RedisServer
) -> None:
    app = make_app(redlock_tasks={"t.plain": {"singleton": True, "singleton_mode": "queued"}})
    setup(app)
    plain = app.tasks["t.plain"]
    with in_process_worker(app, "threads"):
        running = plain.delay(2, 3.0)
        wait_event(app, "enter", "plain:2", running.id)
        follow_up = plain.delay(2, 3.0)
        assert follow_up.id != running.id
        assert plain.delay(2, 3.0).id == follow_up.id
        settle([running, follow_up])
    assert [e[2] for e in events_of(app, "enter", "plain:2")] == [running.id, follow_up.id]
    assert overlaps(app.witness.events()) == 0


def test_a_copy_that_comes_up_before_its_due_time_waits_for_it(app: Celery) -> None:
    # As when the publisher's clock runs ahead of the worker's: the message
    # arrives before the due time the store gave its publish. It is re-queued
    # for the rest of the wait, not run early.
    name = "debounce:t.debounced_fast:doc:early"
    store = debounce_store_for(app)
    with in_process_worker(app, "threads"):
        before = time.monotonic()
        seq = store.publish(name, "early-copy", delay=2.0, ttl=60)
        sent = app.send_task(
            "t.debounced_fast", ("early", 1), task_id="early-copy", headers={DEBOUNCE_HEADER: seq}
        )
        assert sent.get(timeout=30) == 1
    runs = events_of(app, "run", "debounced_fast:early")
    assert [run[2] for run in runs] == ["early-copy"]
    assert float(runs[0][3]) - before >= 2.0


def test_terminating_the_running_copy_lets_the_follow_up_start(
    app: Celery, worker_process: Any, witness: RedisServer
) -> None:
    # Prefork: the worker's main process frees the running copy's key (its
    # lock_ttl is the default 60 s), so the waiting follow-up starts at once.
    worker_process()
    task = app.tasks["t.queued"]
    running = task.delay(7)
    wait_event(app, "enter", "queued:7", running.id)
    follow_up = task.delay(7)
    assert follow_up.id != running.id
    started = time.monotonic()
    running.revoke(terminate=True)
    wait_event(app, "enter", "queued:7", follow_up.id, timeout=30)
    assert time.monotonic() - started < 30  # well before the 60 s ttl
    witness.client().rpush("release:queued:7", "go")
    assert follow_up.get(timeout=30) == follow_up.id


def test_a_store_down_when_the_copy_comes_up_delays_it_and_loses_nothing(
    make_app: Any, servers: ServerGroup
) -> None:
    # The store dies after the publish, taking the record with it: the copy
    # is re-queued (its result shows RETRY) while the store is down, then
    # runs once it answers, although the restarted store remembers nothing.
    store = servers[4]
    app = make_app(redlock_rate_limit_url=store.url)
    sent = app.tasks["t.debounced_fast"].delay("lost", 1)
    store.kill()
    with in_process_worker(app, "threads"):
        deadline = time.monotonic() + 30
        while sent.state != "RETRY":
            assert time.monotonic() < deadline, f"not re-queued: {sent.state}"
            time.sleep(0.05)
        assert events_of(app, "run", "debounced_fast:lost") == []
        store.start()
        assert sent.get(timeout=30) == 1
    assert [run[2] for run in events_of(app, "run", "debounced_fast:lost")] == [sent.id]


def test_redlock_enabled_false_runs_flow_control_tasks_plainly(
    make_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # No Redis answers at these nodes: nothing may try them (a try would log
    # a WARNING: a publish sent unrecorded, or without its singleton check).
    dead = f"redis://127.0.0.1:{free_port()}/0"
    app = make_app(redlock_enabled=False, redlock_nodes=[dead], task_always_eager=True)
    with caplog.at_level(logging.WARNING, logger="celery_redlock"):
        assert app.tasks["t.debounced"].delay("off", 1).get(timeout=5) == 1
        assert app.tasks["t.queued"].delay(8, 0.0).get(timeout=5)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("celery_redlock")] == []


def test_an_eager_run_is_not_debounced(app: Celery, lock_nodes: list[RedisServer]) -> None:
    """debounce.md: eager runs (apply()) are not debounced: they run at once, unrecorded."""
    task = app.tasks["t.debounced_fast"]
    superseded_before = task.delay("eager", 1)  # a queued copy of the same key, no worker
    assert task.apply(("eager", 2)).get(timeout=30) == 2
    runs = events_of(app, "run", "debounced_fast:eager")
    assert [field(run, "n") for run in runs] == ["2"]
    record = lock_nodes[0].client().hget("t:debounce:{debounce:t.debounced_fast:doc:eager}", "id")
    assert record == superseded_before.id.encode()  # the eager run recorded nothing


def test_a_superseded_copy_runs_none_of_its_callbacks(app: Celery) -> None:
    """debounce.md: a superseded copy's own callbacks (link) do not run."""
    task, plain = app.tasks["t.debounced_fast"], app.tasks["t.plain"]
    earlier = task.apply_async(("cb", 1), link=plain.si(901, 0.0))
    latest = task.apply_async(("cb", 2), link=plain.si(902, 0.0))
    with in_process_worker(app, "threads"):
        with pytest.raises(Superseded):
            earlier.get(timeout=30)
        assert latest.get(timeout=30) == 2
        deadline = time.monotonic() + 30
        while not [e for e in app.witness.events() if e[0] == "enter" and e[1] == "plain:902"]:
            assert time.monotonic() < deadline, "the latest copy's callback did not run"
            time.sleep(0.05)
    assert not [e for e in app.witness.events() if e[1] == "plain:901"]


def test_the_next_bursts_run_waits_for_the_one_still_running(
    app: Celery, witness: RedisServer
) -> None:
    """debounce.md: runs of one key never overlap; the next burst's run waits (on_lock_busy)."""
    release = witness.client()

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.debounced_hold",
        shared=False,
        debounce=0.5,
        debounce_key="doc:{doc}",
    )
    def debounced_hold(self: Any, doc: str, n: int) -> int:
        app.witness.enter(f"hold:{doc}", self.request.id)
        release.blpop([f"release:hold:{doc}:{n}"], timeout=60)
        app.witness.leave(f"hold:{doc}", self.request.id)
        return n

    busy = threading.Event()

    def on_busy(sender: Any = None, task_id: str = "", **_: Any) -> None:
        if second_id and task_id == second_id[0]:
            busy.set()

    second_id: list[str] = []
    signals.lock_busy.connect(on_busy, weak=False)
    try:
        run_two_bursts(app, debounced_hold, release, second_id, busy)
    finally:
        signals.lock_busy.disconnect(on_busy)
    events = [e for e in app.witness.events() if e[1] == "hold:o"]
    assert [e[0] for e in events] == ["enter", "exit", "enter", "exit"]
    assert overlaps(events) == 0


def run_two_bursts(
    app: Celery, task: Any, release: Any, second_id: list[str], busy: threading.Event
) -> None:
    """Run a held debounced copy, then publish the next burst and let both go once it waits."""
    with in_process_worker(app, "threads"):
        first = task.delay("o", 1)
        wait_event(app, "enter", "hold:o", first.id)
        second = task.apply_async(("o", 2), task_id="second-burst")  # due while the first runs
        second_id.append(second.id)
        # The second is due after 0.5 s and finds the first's run lock: it waits.
        assert busy.wait(60), "the next burst's copy never found the run lock taken"
        release.rpush("release:hold:o:1", "go")
        release.rpush("release:hold:o:2", "go")
        assert first.get(timeout=60) == 1
        assert second.get(timeout=60) == 2


def test_racing_publishes_queue_one_follow_up(app: Celery) -> None:
    """debounce.md: at most one copy waits as the follow-up; racing publishes all return it."""
    task = app.tasks["t.queued"]
    start = threading.Barrier(16)
    ids: list[str] = []
    errors: list[BaseException] = []

    def publish() -> None:
        start.wait(30)
        try:
            ids.append(task.delay(77, 0.0).id)  # runs at once when a worker gets it
        except BaseException as exc:  # any failure to publish is the finding
            errors.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(set(ids)) == 1, f"{len(set(ids))} copies queued"


@pytest.mark.xfail(
    strict=True,
    reason="documented limitation (debounce.md, Limits): a copy sent by name is recorded when a "
    "worker gets it, as if published then, so it supersedes a publish made after it was sent",
)
def test_a_copy_sent_by_name_before_a_publish_gives_way_to_it(app: Celery) -> None:
    task = app.tasks["t.debounced_fast"]
    by_name = app.send_task("t.debounced_fast", ("late", 1))  # sent first, no record
    published = task.delay("late", 2)  # the burst's last publish
    with in_process_worker(app, "threads"):
        settle([by_name, published])
    runs = events_of(app, "run", "debounced_fast:late")
    assert [field(run, "n") for run in runs] == ["2"]


def test_an_expired_follow_up_frees_its_place(app: Celery, witness: RedisServer) -> None:
    """A follow-up whose message expires (Celery ``expires``) while it waits never runs: a
    publish after that must queue a new follow-up, not return the expired one."""
    task = app.tasks["t.queued"]
    with worker_releasing(app, witness, "queued:6"):
        running = task.delay(6)
        wait_event(app, "enter", "queued:6", running.id)
        follow_up = task.apply_async((6,), expires=1.0)
        deadline = time.monotonic() + 60
        while follow_up.state != "REVOKED":  # the worker dropped it as expired
            assert time.monotonic() < deadline, f"the follow-up did not expire: {follow_up.state}"
            time.sleep(0.1)
        replacement = task.delay(6)
        assert replacement.id != follow_up.id, "a publish returned the expired follow-up"
        witness.client().rpush("release:queued:6", "go", "go")
        assert running.get(timeout=30) == running.id
        assert replacement.get(timeout=30) == replacement.id


def test_a_waiting_follow_up_is_told_and_raise_names_it(app: Celery, witness: RedisServer) -> None:
    """debounce.md: a follow-up that waits sends lock_busy with action "follow-up"; with
    on_duplicate="raise" a publish finding the follow-up queued raises DuplicateTask naming it."""
    release = witness.client()

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.queued_raise",
        shared=False,
        singleton=True,
        singleton_mode="queued",
        on_duplicate="raise",
    )
    def queued_raise(self: Any, n: int) -> str:
        app.witness.enter(f"queued_raise:{n}", self.request.id)
        release.blpop([f"release:queued_raise:{n}"], timeout=60)
        app.witness.leave(f"queued_raise:{n}", self.request.id)
        return str(self.request.id)

    waited: list[str] = []
    told = threading.Event()

    def on_busy(sender: Any = None, task_id: str = "", action: str = "", **_: Any) -> None:
        if action == "follow-up":
            waited.append(task_id)
            told.set()

    signals.lock_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            try:
                running = queued_raise.delay(1)
                wait_event(app, "enter", "queued_raise:1", running.id)
                follow_up = queued_raise.delay(1)
                assert told.wait(60), "the follow-up never waited"
                with pytest.raises(DuplicateTask) as duplicate:
                    queued_raise.delay(1)
                assert duplicate.value.task_id == follow_up.id
            finally:
                release.rpush("release:queued_raise:1", "go", "go")
            assert follow_up.get(timeout=60) == follow_up.id
    finally:
        signals.lock_busy.disconnect(on_busy)
    assert set(waited) == {follow_up.id}


def test_a_retry_is_superseded_by_a_publish_made_meanwhile(app: Celery) -> None:
    """debounce.md: a retried copy is superseded if a newer publish of its key came in meanwhile
    (the newer arguments win)."""

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.debounced_retrying",
        shared=False,
        debounce=0.5,
        debounce_key="doc:{doc}",
        max_retries=3,
    )
    def debounced_retrying(self: Any, doc: str, n: int) -> int:
        app.witness.event("run", f"retrying:{doc}", self.request.id, n=n)
        if n == 1 and self.request.retries == 0:
            newer.append(debounced_retrying.delay(doc, 2))  # a publish while the first runs
            raise self.retry(countdown=0)
        return n

    newer: list[AsyncResult] = []
    with in_process_worker(app, "threads"):
        first = debounced_retrying.delay("m", 1)
        with pytest.raises(Superseded):
            first.get(timeout=60)
        assert newer
        assert newer[0].get(timeout=60) == 2
    runs = [(run[2], field(run, "n")) for run in events_of(app, "run", "retrying:m")]
    assert runs == [(first.id, "1"), (newer[0].id, "2")]


@pytest.mark.xfail(
    strict=True,
    reason="documented limitation (debounce.md, What a failure does): a send that fails only "
    "after the earlier copy is due leaves that copy superseded by a publish never sent",
)
def test_a_publish_the_broker_refuses_slowly_still_lets_the_burst_run(make_app: Any) -> None:
    """The earlier copy comes up while the later publish is still being sent, then the send fails.

    A broker that refuses after a while (kombu retrying a lost connection) leaves that while for
    the earlier copy to come up and be superseded by a publish that is never sent.
    """
    app = make_app()
    dead = make_app(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    with in_process_worker(app, "threads"):
        earlier = app.tasks["t.debounced_fast"].delay("slow", 1)

        def broker_still_retrying(exc: Exception, interval: float) -> None:
            # While kombu retries the unreachable broker, the earlier copy's
            # countdown (1 s) ends and it comes up in the worker.
            earlier.get(timeout=60, propagate=False)

        with pytest.raises(Exception):  # noqa: B017 (kombu's error for a broker that is not there)
            dead.tasks["t.debounced_fast"].apply_async(
                ("slow", 2),
                retry=True,
                retry_policy={
                    "max_retries": 1,
                    "interval_start": 0,
                    "interval_step": 0,
                    "errback": broker_still_retrying,
                },
            )
        assert earlier.ready()
        # Nothing else is published: the burst's earlier copy must still run.
        deadline = time.monotonic() + 10  # the earlier copy was due 1 s after its publish
        while not events_of(app, "run", "debounced_fast:slow"):
            assert time.monotonic() < deadline, (
                f"no copy of the burst ran; the earlier one ended {earlier.state}"
            )
            time.sleep(0.1)


def test_a_superseded_copy_of_a_task_that_ignores_results_stores_none(app: Celery) -> None:
    """debounce.md: a superseded copy's Superseded failure is stored unless the task ignores
    results."""

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.debounced_quiet",
        shared=False,
        ignore_result=True,
        debounce=0.5,
    )
    def debounced_quiet(self: Any, n: int) -> int:
        app.witness.event("run", "debounced_quiet", self.request.id, n=n)
        return n

    earlier = debounced_quiet.delay(1)
    latest = debounced_quiet.delay(2)
    superseded = threading.Event()
    ended = threading.Event()

    def on_superseded(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        if task_id == earlier.id:
            superseded.set()

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id == earlier.id and superseded.is_set():
            ended.set()  # after the worker was done with the superseded copy

    signals.debounce_superseded.connect(on_superseded, weak=False)
    task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app, "threads"):
            assert ended.wait(30), "the earlier copy was not superseded"
            wait_event(app, "run", "debounced_quiet", latest.id)
    finally:
        signals.debounce_superseded.disconnect(on_superseded)
        task_postrun.disconnect(on_postrun)
    assert [field(e, "n") for e in events_of(app, "run", "debounced_quiet")] == ["2"]
    # Nothing stored for the superseded copy: its result stays pending.
    assert app.backend.get_task_meta(earlier.id)["status"] == "PENDING"
    assert app.backend.client.exists(app.backend.get_key_for_task(earlier.id)) == 0


def singleton_name(task: Any, *args: Any) -> str:
    """The singleton key of ``task(*args)`` (``<key>``; its follow-up's is ``<key>:queued``)."""
    policy = policy_for(task)
    assert policy is not None
    assert policy.singleton is not None
    return policy.singleton.name(task.name, args, {})


def test_a_killed_workers_running_copy_frees_its_key_within_lock_ttl(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    """debounce.md: a killed worker's running copy frees ``<key>`` within ``lock_ttl``."""
    task = app.tasks["t.queued"]
    name = singleton_name(task, 12)
    doomed = worker_process(redlock_default_ttl=2.0)
    running = task.delay(12)
    wait_event(app, "enter", "queued:12", running.id)
    entered = float(events_of(app, "enter", "queued:12")[0][3])
    # lock_ttl is 2 s: past it, the heartbeat has kept the key.
    while time.monotonic() - entered < 3.0:
        time.sleep(0.1)
    assert not free_now(lock_nodes, name)
    killed = time.monotonic()  # before the kill: its last renewal came no later
    doomed.kill()
    # Renewed last before the kill: free at most 2 s after it (1 s allowed for
    # a renewal still on its way). Judged on when the looks began: the last
    # look that found it held began while the key was there, however late a
    # loaded machine finished it or began the next.
    held_at = last_seen_held(lock_nodes, name, timeout=10.0)
    assert held_at - killed < 3.0, held_at - killed
    # A publish now queues a copy, which another worker runs.
    worker_process(redlock_default_ttl=2.0)
    again = task.delay(12, 0.0)
    assert again.id != running.id
    assert again.get(timeout=30) == again.id


def last_seen_held(nodes: list[RedisServer], name: str, timeout: float) -> float:
    """Look until lock ``name`` can be taken; when the last look that found it held began.

    ``-inf`` when the first look found it free; fails after ``timeout``.
    """
    redlock = looker(nodes)
    held_at = -math.inf
    try:
        deadline = time.monotonic() + timeout
        while True:
            began = time.monotonic()
            lock = redlock.lock(name, ttl=5)
            if lock.acquire(blocking=False):
                lock.release()
                return held_at
            held_at = began
            assert began < deadline, f"lock {name!r} still held after {timeout} s"
            time.sleep(0.05)
    finally:
        redlock.close()


def test_a_follow_up_left_in_the_queue_past_singleton_ttl_loses_its_place(
    app: Celery, lock_nodes: list[RedisServer], witness: RedisServer
) -> None:
    """debounce.md: a follow-up whose message waits longer than ``singleton_ttl`` (no worker
    takes it up) loses ``<key>:queued``, and a publish after that queues a second follow-up."""

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.queued_brief",
        shared=False,
        singleton=True,
        singleton_mode="queued",
        singleton_ttl=1.0,
    )
    def queued_brief(self: Any, n: int) -> str:
        app.witness.enter(f"queued_brief:{n}", self.request.id)
        if self.request.id == first:
            with witness.client(socket_timeout=90) as waiting:
                waiting.blpop([f"release:queued_brief:{n}"], timeout=60)
        app.witness.leave(f"queued_brief:{n}", self.request.id)
        return str(self.request.id)

    first = uuid()  # the running copy: it waits for the test
    queued = f"{singleton_name(queued_brief, 1)}:queued"
    redlock = looker(lock_nodes)
    # One pool thread: the follow-up is not taken up while the running copy runs.
    with in_process_worker(app, "threads", concurrency=1):
        try:
            running = queued_brief.apply_async((1,), task_id=first)
            wait_event(app, "enter", "queued_brief:1", first)
            follow_up = queued_brief.delay(1)
            assert follow_up.id != running.id
            deadline = time.monotonic() + 10
            while redlock.holder(queued) is not None:
                assert time.monotonic() < deadline, f"{queued!r} outlived its singleton_ttl"
                time.sleep(0.05)
            second = queued_brief.delay(1)
            assert second.id not in (running.id, follow_up.id)
        finally:
            witness.client().rpush("release:queued_brief:1", "go")
            redlock.close()
        for result in (running, follow_up, second):
            assert result.get(timeout=30) == result.id
    entered = [e[2] for e in events_of(app, "enter", "queued_brief:1")]
    assert entered == [running.id, follow_up.id, second.id]
    assert overlaps(app.witness.events()) == 0


def test_a_follow_up_waiting_in_a_worker_takes_its_place_back(
    app: Celery, lock_nodes: list[RedisServer], witness: RedisServer
) -> None:
    """debounce.md: a follow-up a worker already re-queues as the waiting copy takes
    ``<key>:queued`` back at its next look when it lapsed."""

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.queued_brief",
        shared=False,
        singleton=True,
        singleton_mode="queued",
        singleton_ttl=1.0,
    )
    def queued_brief(self: Any, n: int) -> str:
        if self.request.id == first:
            with witness.client(socket_timeout=90) as waiting:
                waiting.blpop([f"release:queued_brief:{n}"], timeout=60)
        return str(self.request.id)

    first, second = uuid(), uuid()
    queued = f"{singleton_name(queued_brief, 2)}:queued"
    redlock = looker(lock_nodes)
    looks: list[tuple[float, str | None]] = []
    lapsed = threading.Event()
    published = time.monotonic() + 3600.0

    def on_busy(sender: Any = None, task_id: str | None = None, action: str = "", **_: Any) -> None:
        if task_id == second and action == "follow-up":
            looks.append((time.monotonic(), task_id_of(redlock.holder(queued))))
            # A look begun well after the publish's singleton_ttl ran out.
            if looks[-1][0] > published + 1.3:
                lapsed.set()

    signals.lock_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads", concurrency=2):
            try:
                queued_brief.apply_async((2,), task_id=first)
                deadline = time.monotonic() + 30
                while redlock.holder(singleton_name(queued_brief, 2)) is None:
                    assert time.monotonic() < deadline, "the first copy never ran"
                    time.sleep(0.05)
                follow_up = queued_brief.apply_async((2,), task_id=second)
                # After the publish returned: the key it wrote lapses by
                # then + singleton_ttl, however slow the publish was.
                published = time.monotonic()
                assert follow_up.id == second
                assert lapsed.wait(30), f"the follow-up stopped looking: {looks}"
                # Taken back: held by the follow-up again right after its look.
                assert looks[-1][1] == second, looks
            finally:
                witness.client().rpush("release:queued_brief:2", "go")
            assert follow_up.get(timeout=30) == second
    finally:
        signals.lock_busy.disconnect(on_busy)
        redlock.close()


def test_a_burst_with_a_tuple_in_its_key_runs_once_with_the_last_arguments(app: Celery) -> None:
    # JSON delivers the tuple as a list: the key each copy checks in the worker
    # must be the one its publish recorded.
    @app.task(
        base=LockedTask,
        bind=True,
        name="t.debounced_batch",
        shared=False,
        debounce=1.0,
        debounce_key="batch:{ids}",
    )
    def debounced_batch(self: Any, ids: Any, n: int) -> int:
        app.witness.event("run", "debounced_batch", self.request.id, n=n)
        return n

    # Published before a worker runs: no copy can come up mid-burst.
    sent = [debounced_batch.delay((3, 4), n) for n in range(5)]
    with in_process_worker(app, "threads"):
        settle(sent)
    runs = events_of(app, "run", "debounced_batch")
    assert [(run[2], field(run, "n")) for run in runs] == [(sent[-1].id, "4")]
    assert sent[-1].get(timeout=1) == 4
    for result in sent[:-1]:
        with pytest.raises(Superseded, match=sent[-1].id):
            result.get(timeout=1)


def test_the_follow_up_starts_once_the_running_copy_runs_out_of_retries(
    app: Celery, witness: RedisServer
) -> None:
    release = witness.client()

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.queued_hopeless",
        shared=False,
        singleton=True,
        singleton_mode="queued",
        max_retries=1,
    )
    def queued_hopeless(self: Any, n: int) -> None:
        app.witness.event("run", "queued_hopeless", self.request.id)
        release.blpop([f"release:queued_hopeless:{self.request.id}"], timeout=60)
        raise self.retry(countdown=0.1)

    with worker_releasing(app, witness, "queued_hopeless"):
        first = queued_hopeless.delay(1)
        wait_event(app, "run", "queued_hopeless", first.id)
        follow_up = queued_hopeless.delay(1)
        assert follow_up.id != first.id
        for task_id in (first.id, follow_up.id):
            release.rpush(f"release:queued_hopeless:{task_id}", "go", "go")
        with pytest.raises(MaxRetriesExceededError):
            first.get(timeout=30)
        # The copy that failed freed the running key: the follow-up runs.
        with pytest.raises(MaxRetriesExceededError):
            follow_up.get(timeout=30)
    runs = [e[2] for e in events_of(app, "run", "queued_hopeless")]
    assert runs == [first.id, first.id, follow_up.id, follow_up.id]
