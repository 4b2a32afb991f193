"""concurrency_limit with real workers: at most N runs per key at once, slots freed on any exit.

Each run counts itself in and out on the witness inside its slot (see
``inside`` in :mod:`tests.worker.support`), so the largest count is the most
runs that were ever inside at once, and records start and end times, so the
overlap can be read again from the times.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from celery import Celery, uuid
from celery.signals import after_task_publish, task_postrun

from celery_redlock import LockedTask, Redlock, setup, signals
from celery_redlock.admin import Admin
from celery_redlock.errors import ConfigurationError, LockNotAcquired
from celery_redlock.tasks.app_state import limiter_for, policy_for
from celery_redlock.testing import RedisServer

from .support import (
    free_slots,
    in_process_worker,
    looker,
    most_at_once,
    peak,
    wait_for_event,
    wait_slots_free,
)

pytestmark = pytest.mark.celery


def starts(app: Celery, key: str) -> list[list[str]]:
    return [e for e in app.witness.events() if e[0] == "start" and e[1] == key]


def wait_for_starts(app: Celery, key: str, count: int, timeout: float = 30) -> list[list[str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = starts(app, key)
        if len(found) >= count:
            return found
        time.sleep(0.02)
    raise AssertionError(f"fewer than {count} runs of {key!r} started within {timeout} s")


def test_thirty_runs_on_two_prefork_workers_never_exceed_the_limit(
    app: Celery, worker_process: Any
) -> None:
    workers = [worker_process(concurrency=3), worker_process(concurrency=3)]
    results = [app.tasks["t.export"].delay("acme", 0.4) for _ in range(30)]
    ids = [result.get(timeout=180) for result in results]
    assert sorted(ids) == sorted(result.id for result in results)
    events = app.witness.events()
    assert len(starts(app, "export:acme")) == 30
    # Six pool processes could have run six at once: the limit held them to 3.
    assert peak(app, "export:acme") == 3
    assert most_at_once(events, "export:acme") <= 3
    parents = {e[5] for e in events if e[0] == "start"}
    assert parents == {f"parent={worker.process.pid}" for worker in workers}


def test_keys_are_limited_apart(app: Celery) -> None:
    with in_process_worker(app, "threads", concurrency=8):
        # 1.5 s each: room for a loaded machine to start three of a tenant apart.
        results = [app.tasks["t.export"].delay(tenant, 1.5) for tenant in ("a", "b") * 4]
        for result in results:
            result.get(timeout=60)
    # Three of each tenant can run beside three of the other.
    assert peak(app, "export:a") == 3
    assert peak(app, "export:b") == 3


def test_a_killed_worker_frees_its_slots_within_the_ttl(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    doomed = worker_process(concurrency=3)
    for _ in range(3):
        app.tasks["t.export_short_ttl"].delay("dead", 30)
    first = wait_for_starts(app, "export:dead", 3)
    survivor = worker_process(concurrency=3)
    # lock_ttl is 2 s: past it, the heartbeat has kept all three slots.
    while time.monotonic() - max(float(e[3]) for e in first) < 3.0:
        time.sleep(0.1)
    assert free_slots(lock_nodes, "export:dead", 3) == 0
    doomed.kill()
    # Renewed last before the kill: free at most 2 s after it.
    assert wait_slots_free(lock_nodes, "export:dead", 3, timeout=10.0) <= 3.0
    # The killed runs never counted themselves out: count afresh.
    app.witness.client.delete("running:export:dead", "peaks:export:dead")
    # The other worker's runs of the key take the slots and all succeed.
    results = [app.tasks["t.export"].delay("dead", 0.2) for _ in range(6)]
    for result in results:
        result.get(timeout=60)
    later = starts(app, "export:dead")[3:]
    assert len(later) == 6
    assert {e[5] for e in later} == {f"parent={survivor.process.pid}"}
    assert peak(app, "export:dead") <= 3


def test_a_killed_pool_process_frees_its_slot_from_the_main_process_at_once(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker = worker_process(concurrency=2)
    result = app.tasks["t.export"].delay("child", 30)
    started = wait_for_starts(app, "export:child", 1)[0]
    assert free_slots(lock_nodes, "export:child", 3) == 2
    # What `celery redlock locks` shows: the slot's task and pool process.
    with Admin(app) as admin:
        (view,) = admin.locks("export:child").semaphores
    (holder,) = view.holders
    assert holder.task_id == result.id
    assert holder.worker is not None
    assert holder.worker.endswith(f":{started[4]}")
    assert (holder.agree, holder.held) == (3, True)
    os.kill(int(started[4]), signal.SIGKILL)
    # The slot's ttl is 60 s, renewed every 20 s: only the main process's
    # cleanup frees it this fast.
    assert wait_slots_free(lock_nodes, "export:child", 3, timeout=20.0) < 20.0
    assert "freed concurrency slot 'export:child'" in worker.log()


@pytest.mark.parametrize(
    ("how", "outcome"),
    [("fail", "FAILURE"), ("retry", "SUCCESS"), ("ignore", None), ("reject", None)],
)
def test_the_slot_is_released_on_every_exit(
    app: Celery, lock_nodes: list[RedisServer], how: str, outcome: str | None
) -> None:
    # Checked once the worker is done with the run (task_postrun comes after
    # the task's call, and so after the release), never before it started.
    wanted = uuid()
    ended = threading.Event()
    runs = 2 if how == "retry" else 1

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id == wanted and len(app.witness.events()) >= runs:
            ended.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app, "threads"):
            result = app.tasks["t.slot_exit"].apply_async((how, how), task_id=wanted)
            assert ended.wait(30), f"{how}: the run did not end"
            assert free_slots(lock_nodes, f"slot-exit:{how}", 1) == 1
            if outcome is not None:
                result.get(timeout=10, propagate=False)
                assert result.state == outcome
    finally:
        task_postrun.disconnect(on_postrun)


def test_soft_time_limit_releases_the_slot(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker_process()
    result = app.tasks["t.slot_exit"].apply_async(("soft", "sleep"), soft_time_limit=0.5)
    with pytest.raises(Exception, match="SoftTimeLimit"):
        result.get(timeout=30)
    assert free_slots(lock_nodes, "slot-exit:soft", 1) == 1


def test_hard_time_limit_frees_the_slot_from_the_main_process(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker = worker_process()
    result = app.tasks["t.slot_exit"].apply_async(("hard", "sleep"), time_limit=1.0)
    with pytest.raises(Exception, match="TimeLimitExceeded"):
        result.get(timeout=30)
    # The default ttl is 60 s: only the main process's cleanup frees it this fast.
    assert wait_slots_free(lock_nodes, "slot-exit:hard", 1, timeout=20.0) < 20.0
    assert "freed concurrency slot" in worker.log()


def test_revoke_terminate_frees_the_slot_at_once(
    app: Celery, lock_nodes: list[RedisServer], worker_process: Any
) -> None:
    worker_process()
    result = app.tasks["t.slot_exit"].delay("revoked", "sleep")
    wait_for_event(app, "run")
    assert free_slots(lock_nodes, "slot-exit:revoked", 1) == 0
    result.revoke(terminate=True)
    # The default ttl is 60 s: freed by the worker, not by expiry.
    assert wait_slots_free(lock_nodes, "slot-exit:revoked", 1, timeout=20.0) < 20.0


def test_an_eager_run_holds_a_slot_and_gives_it_back(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    taken: list[Any] = []

    def on_acquired(sender: Any = None, **kwargs: Any) -> None:
        taken.append((kwargs, free_slots(lock_nodes, kwargs["key"], kwargs["limit"])))

    signals.slot_acquired.connect(on_acquired, weak=False)
    try:
        result = app.tasks["t.export"].apply(args=("eager", 0.0))
    finally:
        signals.slot_acquired.disconnect(on_acquired)
    assert result.successful()
    [(sent, free_while_held)] = taken
    assert (sent["key"], sent["limit"], sent["slot"]) == ("export:eager", 3, 0)
    assert free_while_held == 2
    assert free_slots(lock_nodes, "export:eager", 3) == 3


def test_lock_nodes_down_at_the_start_re_queue_the_run(
    app: Celery, lock_nodes: list[RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    lock_nodes[0].kill()
    lock_nodes[1].kill()
    with in_process_worker(app, "threads"):
        result = app.tasks["t.export"].delay("down", 0.0)
        deadline = time.monotonic() + 30
        while not any("concurrency slot" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no log line about the unavailable nodes"
            time.sleep(0.05)
        assert not starts(app, "export:down")
        lock_nodes[0].restart()
        lock_nodes[1].restart()
        assert result.get(timeout=60) == result.id
    line = next(r.getMessage() for r in caplog.records if "concurrency slot" in r.getMessage())
    assert "t.export" in line
    assert "re-queued" in line


def test_a_copy_of_a_finished_run_is_not_run_again(app: Celery) -> None:
    # A message with an eta leaves a done mark when its run ends; a copy of it
    # (same task id, as the broker re-delivers it) finds the mark and is dropped.
    wanted = uuid()
    ended = threading.Semaphore(0)

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id == wanted:
            ended.release()

    task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app, "threads"):
            first = app.tasks["t.export"].apply_async(("twice", 0.0), countdown=0.2, task_id=wanted)
            assert first.get(timeout=30) == wanted
            assert ended.acquire(timeout=30)
            app.tasks["t.export"].apply_async(("twice", 0.0), countdown=0.2, task_id=wanted)
            assert ended.acquire(timeout=30), "the copy was not handled"
    finally:
        task_postrun.disconnect(on_postrun)
    assert len(starts(app, "export:twice")) == 1


# -- every slot taken ----------------------------------------------------------------


def held_elsewhere(lock_nodes: list[RedisServer], key: str) -> tuple[Redlock, Any]:
    """Take the one slot of ``key`` as another owner would."""
    redlock = looker(lock_nodes)
    slot = redlock.semaphore(key, 1, ttl=30)
    assert slot.acquire(blocking=False)
    return redlock, slot


def test_a_full_limit_re_queues_without_spending_max_retries(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:q")
    busy = threading.Event()
    seen: list[dict[str, Any]] = []

    def on_busy(sender: Any = None, **kwargs: Any) -> None:
        seen.append(kwargs)
        busy.set()

    signals.slot_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            result = app.tasks["t.slot_busy"].delay("q")  # max_retries=0
            deadline = time.monotonic() + 60
            while len(seen) < 2:  # re-queued twice, backing off
                assert time.monotonic() < deadline, "the run was not re-queued twice"
                time.sleep(0.02)
            assert not [e for e in app.witness.events() if e[0] == "run"]
            slot.release()
            # Re-queued and run, though max_retries is 0: retries is still 0.
            assert result.get(timeout=60) == 0
    finally:
        signals.slot_busy.disconnect(on_busy)
        redlock.close()
    assert seen[0]["key"] == "slot-busy:q"
    assert (seen[0]["limit"], seen[0]["action"]) == (1, "retry")
    runs = [e for e in app.witness.events() if e[0] == "run"]
    assert len(runs) == 1
    # The re-queues are counted in a header of their own (the backoff grows with it).
    assert runs[0][5] == f"busy={len(seen)}"


def test_a_run_re_queued_for_a_full_limit_spends_no_rate_limit_unit(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    task = app.tasks["t.slot_rated"]
    policy = policy_for(task)
    assert policy is not None
    assert policy.rate is not None
    limits = list(policy.rate.call_limits(("r",), {}))
    before = limiter_for(app).peek(limits).remaining
    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:r")
    busy = threading.Event()

    def on_busy(sender: Any = None, **_: Any) -> None:
        busy.set()

    signals.slot_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            result = task.delay("r")
            assert busy.wait(30), "the run never found the limit full"
            slot.release()
            result.get(timeout=60)
    finally:
        signals.slot_busy.disconnect(on_busy)
        redlock.close()
    assert len([e for e in app.witness.events() if e[0] == "run"]) == 1
    # Two starts, one run: one unit spent.
    assert before - limiter_for(app).peek(limits).remaining == 1


def test_a_hung_run_loses_its_slot_and_is_told(app: Celery, lock_nodes: list[RedisServer]) -> None:
    with in_process_worker(app, "threads"):
        pending = app.tasks["t.slot_hung"].delay(4.0)
        started = float(wait_for_event(app, "hung-started")[3])
        # No progress for 0.5 s, ttl 1 s: another run gets the slot about 1.5 s
        # after the run's last progress (before its event), while it still
        # sleeps. Judged from the event, not from when this thread got to
        # look; 1 s for a loaded machine's lateness, within the 4 s sleep.
        wait_slots_free(lock_nodes, "slot-hung", 1, timeout=10.0)
        assert time.monotonic() - started < 1.5 + 1.0
        result = pending.get(timeout=30)
    assert result["lost_flag"] is True
    assert "slot-hung" in result["raised"]
    assert result["lock"] is True  # the slot is not self.lock


def test_a_full_limit_with_skip_ends_the_run_unrun(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:s")
    skipped = threading.Event()

    def on_busy(sender: Any = None, action: str = "", **_: Any) -> None:
        if action == "skip":
            skipped.set()

    signals.slot_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            app.tasks["t.slot_skip"].delay("s")
            assert skipped.wait(30)
    finally:
        signals.slot_busy.disconnect(on_busy)
        slot.release()
        redlock.close()
    assert not [e for e in app.witness.events() if e[0] == "run"]


def test_a_full_limit_with_raise_fails_the_run_naming_the_key(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    @app.task(
        base=LockedTask,
        name="t.slot_raise",
        shared=False,
        concurrency_limit=1,
        concurrency_key="slot-busy:{key}",
        on_lock_busy="raise",
    )
    def slot_raise(key: str) -> str:
        app.witness.event("run", key, None)
        return key

    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:x")
    try:
        with in_process_worker(app, "threads"):
            result = slot_raise.delay("x")
            with pytest.raises(LockNotAcquired) as caught:
                result.get(timeout=30)
    finally:
        slot.release()
        redlock.close()
    # Through the result backend the error keeps its type and message.
    assert "all 1 slots of concurrency key 'slot-busy:x' are taken" in str(caught.value)
    assert not [e for e in app.witness.events() if e[0] == "run"]


def test_a_run_waiting_for_its_lock_holds_no_slot(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    @app.task(
        base=LockedTask,
        name="t.slot_locked",
        shared=False,
        lock_key="lk:{key}",
        lock_timeout=60,
        concurrency_limit=1,
        concurrency_key="slot-busy:{key}",
    )
    def slot_locked(key: str) -> str:
        app.witness.event("run", key, None)
        return key

    redlock = looker(lock_nodes)
    lock = redlock.lock("lk:k", ttl=30)
    assert lock.acquire(blocking=False)
    clients = [node.client() for node in lock_nodes]
    try:
        with in_process_worker(app, "threads"):
            result = slot_locked.delay("k")
            deadline = time.monotonic() + 60
            # The run waits for its lock, listening for its release.
            channel = "t:{lk:k}:released"
            while not any(n for c in clients for _, n in c.pubsub_numsub(channel)):
                assert time.monotonic() < deadline, "the run never waited for its lock"
                time.sleep(0.02)
            assert free_slots(lock_nodes, "slot-busy:k", 1) == 1
            lock.release()
            assert result.get(timeout=30) == "k"
    finally:
        redlock.close()


def test_busy_requeues_of_a_full_limit_end_at_lock_busy_max_requeues(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:m")
    try:
        with in_process_worker(app, "threads"):
            # Per call: fail after one busy re-queue instead of waiting for the slot.
            result = app.tasks["t.slot_busy"].apply_async(
                ("m",), redlock={"lock_busy_max_requeues": 1}
            )
            with pytest.raises(LockNotAcquired) as caught:
                result.get(timeout=60)
    finally:
        slot.release()
        redlock.close()
    assert "after 1 busy re-queues (lock_busy_max_requeues=1)" in str(caught.value)
    assert not [e for e in app.witness.events() if e[0] == "run"]


def test_a_call_can_wait_for_a_slot_instead_of_re_queueing(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:o")
    client = lock_nodes[0].client()
    busy: list[Any] = []

    def on_busy(sender: Any = None, **kwargs: Any) -> None:
        busy.append(kwargs)

    signals.slot_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            # t.slot_busy does not wait (lock_timeout 0); this call waits 60 s.
            result = app.tasks["t.slot_busy"].apply_async(("o",), redlock={"lock_timeout": 60})
            deadline = time.monotonic() + 60
            while not client.zcard("t:{slot-busy:o}:sem:queue"):
                assert time.monotonic() < deadline, f"the call never waited: {busy}"
                time.sleep(0.02)
            slot.release()
            assert result.get(timeout=30) == 0
    finally:
        signals.slot_busy.disconnect(on_busy)
        redlock.close()
    assert busy == []


def test_a_waiting_run_takes_the_slot_when_it_is_released(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    redlock, slot = held_elsewhere(lock_nodes, "slot-busy:w")
    client = lock_nodes[0].client()
    busy: list[Any] = []

    def on_busy(sender: Any = None, **kwargs: Any) -> None:
        busy.append(kwargs)

    signals.slot_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            result = app.tasks["t.slot_wait"].delay("w")  # lock_timeout=60
            deadline = time.monotonic() + 60
            # The run waits in the semaphore's queue (it is not re-queued).
            while not client.zcard("t:{slot-busy:w}:sem:queue"):
                assert time.monotonic() < deadline, (
                    f"the run never waited for the slot: {result.state}, busy {busy}, "
                    f"events {app.witness.events()}"
                )
                time.sleep(0.02)
            assert not [e for e in app.witness.events() if e[0] == "run"]
            slot.release()
            assert result.get(timeout=30) == 0
    finally:
        signals.slot_busy.disconnect(on_busy)
        redlock.close()
    assert busy == []
    assert len([e for e in app.witness.events() if e[0] == "run"]) == 1


# -- configuration -----------------------------------------------------------------


def test_redlock_tasks_limit_a_task_you_do_not_own(make_app: Any) -> None:
    app = make_app(redlock_tasks={"t.plain": {"concurrency_limit": 2, "lock_timeout": 60}})
    setup(app)
    assert isinstance(app.tasks["t.plain"], LockedTask)
    with in_process_worker(app, "threads", concurrency=6):
        # 1 s each: two overlap though a loaded machine starts them apart.
        results = [app.tasks["t.plain"].delay(n, 1.0) for n in range(6)]
        for result in results:
            result.get(timeout=60)
    # t.plain records enter/exit per argument: read them as one key.
    events = [
        ["start" if kind == "enter" else "end", "plain", *rest]
        for kind, key, *rest in app.witness.events()
        if kind in ("enter", "exit") and key.startswith("plain:")
    ]
    assert len([e for e in events if e[0] == "start"]) == 6
    assert most_at_once(events, "plain") == 2


def test_a_bad_concurrency_option_in_redlock_tasks_is_refused(make_app: Any) -> None:
    for options, option in [
        ({"concurency_limit": 2}, "concurency_limit"),
        ({"concurrency_limit": 0}, "concurrency_limit"),
    ]:
        app = make_app(redlock_tasks={"t.plain": options})
        app.finalize()
        with pytest.raises(ConfigurationError) as caught:
            setup(app)
        assert caught.value.option == f"redlock_tasks['t.plain'].{option}"


def test_retries_and_waiting_calls_never_exceed_the_limit(app: Celery) -> None:
    """Runs that retry (giving the slot back, then taking one again), beside calls that wait
    for a slot and calls that are re-queued for one, are never more than the limit inside."""
    client = app.witness.client

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.slot_retrying",
        shared=False,
        concurrency_limit=2,
        concurrency_key="retrying",
        max_retries=2,
    )
    def slot_retrying(self: Any, n: int) -> int:
        client.rpush("peaks:retrying", client.incr("running:retrying"))
        time.sleep(0.05)
        client.decr("running:retrying")
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return n

    with in_process_worker(app, "threads", concurrency=8):
        results = [
            slot_retrying.apply_async((n,), redlock={"lock_timeout": 30} if n % 2 else None)
            for n in range(12)
        ]
        assert sorted(result.get(timeout=180) for result in results) == list(range(12))
    assert client.llen("peaks:retrying") == 36  # every run, three attempts each
    assert peak(app, "retrying") == 2


# -- order of the slot among the run's steps -------------------------------------------


def test_a_run_the_rate_limit_refuses_never_takes_a_slot(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    """flow-control.md: the slot is taken after the rate limit's first look."""
    task = app.tasks["t.slot_rated"]  # 100/m, limit 1
    policy = policy_for(task)
    assert policy is not None
    assert policy.rate is not None
    limits = list(policy.rate.call_limits(("spent",), {}))
    assert limiter_for(app).hit(limits, cost=100).allowed  # the minute's units, all spent
    wanted = uuid()
    refused = threading.Event()
    acquired: list[str] = []

    def on_limited(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        if task_id == wanted:
            refused.set()

    def on_acquired(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        acquired.append(str(task_id))

    signals.rate_limited.connect(on_limited, weak=False)
    signals.slot_acquired.connect(on_acquired, weak=False)
    try:
        with in_process_worker(app, "threads"):
            task.apply_async(("spent",), task_id=wanted)
            assert refused.wait(30), "the rate limit never refused the run"
    finally:
        signals.rate_limited.disconnect(on_limited)
        signals.slot_acquired.disconnect(on_acquired)
    assert acquired == []
    assert not [e for e in app.witness.events() if e[0] == "run"]


def test_the_slot_is_free_before_the_retry_is_published(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    """flow-control.md: self.retry() gives the slot up before the retry is published, so the
    retried copy can take the one slot at once, wherever it comes up."""
    wanted = uuid()
    holders = "t:{slot-exit:order}:sem"
    clients = [node.client() for node in lock_nodes]
    held_at_publish: list[int] = []

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        headers = headers or {}
        if headers.get("id") == wanted and headers.get("retries") == 1:
            held_at_publish.append(sum(bool(client.hlen(holders)) for client in clients))

    after_task_publish.connect(on_publish, weak=False)
    busy: list[Any] = []

    def on_busy(sender: Any = None, **kwargs: Any) -> None:
        busy.append(kwargs)

    signals.slot_busy.connect(on_busy, weak=False)
    try:
        with in_process_worker(app, "threads"):
            result = app.tasks["t.slot_exit"].apply_async(("order", "retry"), task_id=wanted)
            assert result.get(timeout=30) == "retry"
    finally:
        after_task_publish.disconnect(on_publish)
        signals.slot_busy.disconnect(on_busy)
    # Given back on a majority (the last node's part may still be on its way).
    assert len(held_at_publish) == 1
    assert held_at_publish[0] < 2, held_at_publish
    assert busy == []
    runs = [e for e in app.witness.events() if e[0] == "run" and e[1] == "order"]
    assert [e[5] for e in runs] == ["how=retry", "how=retry"]


def test_a_copy_delivered_while_its_run_goes_on_takes_a_slot_of_its_own(
    app: Celery, lock_nodes: list[RedisServer]
) -> None:
    """flow-control.md: a slot is no lock: a copy delivered while its run still goes on takes
    a slot of its own and runs beside it, within the limit; a copy the full limit sent back
    comes again after its twins ended and is dropped, as every copy of a finished run is."""
    client = app.witness.client

    @app.task(
        base=LockedTask,
        bind=True,
        name="t.slot_twins",
        shared=False,
        concurrency_limit=2,
        concurrency_key="twins",
    )
    def slot_twins(self: Any) -> str:
        app.witness.event("start", "twins", self.request.id)
        client.blpop(["release:twins"], timeout=60)
        app.witness.event("end", "twins", self.request.id)
        return str(self.request.id)

    wanted = uuid()
    full = threading.Event()

    def on_busy(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        if task_id == wanted:
            full.set()

    ended: list[str] = []

    def on_postrun(task_id: str | None = None, state: Any = None, **_: Any) -> None:
        if task_id == wanted:
            ended.append(str(state))

    signals.slot_busy.connect(on_busy, weak=False)
    task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app, "threads"):
            try:
                slot_twins.apply_async(task_id=wanted)
                wait_for_starts(app, "twins", 1)
                # The broker delivers the same message again (same task id).
                slot_twins.apply_async(task_id=wanted)
                both = wait_for_starts(app, "twins", 2)
                assert {e[2] for e in both} == {wanted}
                # Each copy holds a slot of its own: none is left.
                assert free_slots(lock_nodes, "twins", 2) == 0
                # A third copy finds the limit full and does not run beside them.
                slot_twins.apply_async(task_id=wanted)
                assert full.wait(30), "a third copy was not held back by the limit"
                assert len(starts(app, "twins")) == 2
            finally:
                client.rpush("release:twins", *["go"] * 5)
            deadline = time.monotonic() + 60
            # The third copy's busy re-queues end as RETRY; its last delivery ends it.
            while len([state for state in ended if state != "RETRY"]) < 3:
                assert time.monotonic() < deadline, f"the copies did not all end: {ended}"
                time.sleep(0.05)
    finally:
        signals.slot_busy.disconnect(on_busy)
        task_postrun.disconnect(on_postrun)
    # The two that ran succeeded; the third came back after they ended and was dropped.
    assert sorted(state for state in ended if state != "RETRY") == [
        "IGNORED",
        "SUCCESS",
        "SUCCESS",
    ], ended
    assert len([e for e in app.witness.events() if e[0] == "end"]) == 2
    assert most_at_once(app.witness.events(), "twins") == 2
