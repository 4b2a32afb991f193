"""The rate-limit invariant end to end: two worker processes and beat, run starts checked.

For a task with a global rate limit, whoever published its runs, no window of
one period holds more run *starts* than the limit, no message is lost, and
the runs take the time the limits allow (within 20 %). Each test drives one
case through the same two ``celery worker`` processes (threads pool, four
threads each) and judges when the runs were admitted, with the model of
:mod:`.rate_checker` (the limiter's default margin, 50 ms, is part of what the
limits allow). A run is admitted after its delivery's ``task_prerun`` (which
the workers record) and before its body records its start: each admission is
known as that bracket (:func:`.support.admissions`), so a thread descheduled
in between on a loaded machine widens the bracket without moving it. Too many
admissions in a period is judged on the brackets that surely fell within
one period; the total time, on the bracket ends that bound it either way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery

from celery_redlock.tasks import app_state
from celery_redlock.testing import RedisServer, ServerGroup

from .rate_checker import Bracket, Model, expected_span, judge
from .support import WorkerProcess, admissions, create_app, start_beat, stop_beat

pytestmark = [pytest.mark.celery, pytest.mark.slow]

#: The default margin of task rate limits (``redlock_rate_limit_margin``).
MARGIN = 0.05
WORKERS = 2
THREADS = 4


@dataclass
class Cluster:
    """Two worker processes on shared nodes, an app to publish with, and the witness."""

    app: Celery
    witness: RedisServer
    broker_url: str
    nodes: list[str]
    folder: Any

    def events(self, kind: str, key: str | None = None) -> list[list[str]]:
        return [
            event
            for event in self.app.witness.events()  # type: ignore[attr-defined]
            if event[0] == kind and (key is None or event[1] == key)
        ]

    def wait_for(self, kind: str, count: int, key: str | None = None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events(kind, key)) < count:
            assert time.monotonic() < deadline, f"fewer than {count} {kind!r} events"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(
    server_pool: ServerGroup, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    server_pool.heal()
    for server in server_pool:
        server.flush()
    servers = list(server_pool)
    nodes, broker, witness = [s.url for s in servers[:3]], servers[3], servers[-1]
    folder = tmp_path_factory.mktemp("rate-invariant")
    workers = [
        WorkerProcess(broker.url, nodes, witness, folder / f"worker{n}.log", "threads", THREADS)
        for n in range(WORKERS)
    ]
    app = create_app(broker.url, nodes, witness.url)
    try:
        yield Cluster(app, witness, broker.url, nodes, folder)
    finally:
        for worker in workers:
            worker.stop()
        app_state.forget(app)
        app.close()
        server_pool.heal()


def starts_of(cluster: Cluster, key: str) -> tuple[list[Bracket], list[str]]:
    """The admissions of ``key``'s runs, as brackets (prerun, start), and their task ids."""
    ran = [event[2] for event in cluster.events("start", key)]
    return admissions(cluster.app, "start", key), ran


def span_of(admitted: Sequence[Bracket]) -> float:
    """The time from the first admission to the last, as the starts recorded it."""
    starts = [s for _, s in admitted]
    return max(starts) - min(starts)


def publish_and_wait(task: Any, calls: list[tuple[Any, ...]]) -> list[str]:
    results = [task.apply_async(args) for args in calls]
    for result in results:
        result.get(timeout=60)
    return [result.id for result in results]


def test_default_algorithm_five_per_second_forty_runs(cluster: Cluster) -> None:
    ids = publish_and_wait(cluster.app.tasks["t.rate_default"], [(n,) for n in range(40)])
    starts, ran = starts_of(cluster, "rate_default")
    models = [Model(5, 1.0, margin=MARGIN)]
    assert judge(starts, models, published=ids, ran=ran) == []


def test_beat_over_the_limit_with_busy_workers_does_not_burst_when_they_free_up(
    cluster: Cluster,
) -> None:
    # Every pool slot of both workers busy until released.
    blockers = WORKERS * THREADS
    for _ in range(blockers):
        cluster.app.tasks["t.block"].delay("beat")
    cluster.wait_for("block-start", blockers, "beat")
    client = cluster.witness.client()
    client.set("beat-on", 1)
    beat, log = start_beat(
        cluster.broker_url,
        cluster.nodes,
        cluster.witness,
        cluster.folder / "beat",
        0.1,  # ten ticks a second against five a second
        task="t.rate_beat",
        scheduler="tests.worker.support:GatedScheduler",
    )
    beat_log = cluster.folder / "beat.log"

    def ticks() -> int:
        return beat_log.read_text().count("Sending due task")

    def published_now() -> int:
        return len(cluster.events("published", "t.rate_beat"))

    try:
        # Until beat has been over the limit for a while, however slowly a
        # loaded machine lets it tick: at least 15 published, and ticks
        # refused (each published tick is a tick, so that stays true).
        deadline = time.monotonic() + 60
        while published_now() < 15 or ticks() <= published_now():
            assert time.monotonic() < deadline, (published_now(), ticks())
            time.sleep(0.1)
        client.delete("beat-on")
        time.sleep(0.5)  # a tick past the gate when the key went has logged by now
        # Every tick logged is published (and recorded) or skipped: settled.
        deadline = time.monotonic() + 30
        while ticks() != published_now() + beat_log.read_text().count("t.rate_beat skipped"):
            assert time.monotonic() < deadline, "a tick neither published nor skipped"
            time.sleep(0.1)
    finally:
        stop_beat(beat)
        log.close()
    published = [event[2] for event in cluster.events("published", "t.rate_beat")]
    assert ticks() > len(published), "beat should have ticked faster than the limit admits"
    assert len(published) >= 15
    client.rpush("release:beat", *range(blockers))
    cluster.wait_for("start", len(published), "rate_beat")
    time.sleep(0.5)  # a run started twice would show by now
    starts, ran = starts_of(cluster, "rate_beat")
    models = [Model(5, 1.0, margin=MARGIN)]
    assert judge(starts, models, published=published, ran=ran) == []


def test_lock_busy_requeues_spend_no_rate_budget(cluster: Cluster) -> None:
    app = cluster.app
    app.tasks["t.hold"].delay("busy", 1.5)
    cluster.wait_for("hold-start", 1, "busy")
    ids = publish_and_wait(app.tasks["t.rate_busy"], [("busy",)] * 15)
    starts, ran = starts_of(cluster, "rate_busy:busy")
    (hold_end,) = (float(event[3]) for event in cluster.events("hold-end", "busy"))
    assert cluster.events("busy", "rated:busy"), "runs should have found the lock busy"
    first_start = min(s for _, s in starts)
    assert first_start >= hold_end
    # Had the busy re-queues during the hold spent units (15 runs, each busy
    # at least once), the first window's 10 would be gone and the first run
    # would wait for them to expire, 8 s; it starts within its busy backoff.
    # Judged on the first admission's delivery (its prerun), not its
    # recorded start, which a loaded machine may delay.
    first_admitted = min(p for p, _ in starts)
    assert first_admitted - hold_end < 4.0, (first_admitted - hold_end, starts)
    models = [Model(10, 8.0, margin=MARGIN)]
    # The last 5 runs wait one period for the first units to expire. The runs
    # also take turns on their one lock key, so beyond the limit's 8.05 s a
    # run can lose up to its busy backoff (ttl 1 s x 1.5) and the re-queue
    # spread (0.8 s): 50 % tolerance. Spent units would cost whole periods.
    problems = judge(
        starts,
        models,
        published=ids,
        ran=ran,
        expected=expected_span(models, len(ids)),
        tolerance=0.5,
    )
    assert problems == []


def test_a_fractional_rate_keeps_both_its_ceiling_and_its_average(cluster: Cluster) -> None:
    ids = publish_and_wait(cluster.app.tasks["t.rate_fraction"], [(n,) for n in range(13)])
    starts, ran = starts_of(cluster, "rate_fraction")
    models = [Model(2.5, 1.0, margin=MARGIN)]
    assert judge(starts, models, published=ids, ran=ran) == []


def test_two_limits_on_one_task_each_hold(cluster: Cluster) -> None:
    ids = publish_and_wait(cluster.app.tasks["t.rate_two"], [(n,) for n in range(16)])
    starts, ran = starts_of(cluster, "rate_two")
    models = [Model(5, 1.0, margin=MARGIN), Model(8, 2.0, margin=MARGIN)]
    assert judge(starts, models, published=ids, ran=ran) == []


def test_a_per_tenant_limit_and_a_global_one_hold_together(cluster: Cluster) -> None:
    # Which tenant runs first is up to the workers: the time the limits allow
    # depends on it, so only the windows and the messages are judged here.
    calls = [("a",), ("b",)] * 9
    ids = publish_and_wait(cluster.app.tasks["t.rate_tenant"], calls)
    starts_a, ran_a = starts_of(cluster, "rate_tenant:a")
    starts_b, ran_b = starts_of(cluster, "rate_tenant:b")
    tenant, everyone = Model(3, 1.0, margin=MARGIN), Model(5, 1.0, margin=MARGIN)
    for starts in (starts_a, starts_b):
        assert judge(starts, [tenant], expected=span_of(starts)) == []
    both = starts_a + starts_b
    assert judge(both, [everyone], published=ids, ran=ran_a + ran_b, expected=span_of(both)) == []
    # The widest reading of the brackets: a loaded machine's late starts cannot shorten it.
    assert (
        max(s for _, s in both) - min(p for p, _ in both)
        >= expected_span([everyone], len(ids)) * 0.8
    )
