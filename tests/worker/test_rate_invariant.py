"""The rate-limit invariant end to end: two worker processes and beat, run starts checked.

For a task with a global rate limit, whoever published its runs, no window of
one period holds more run *starts* than the limit, no message is lost, and
the runs take the time the limits allow (within 20 %). Each test drives one
case through the same two ``celery worker`` processes (threads pool, four
threads each) and judges the starts the task bodies recorded on the witness
node with :mod:`.rate_checker`. The limiter's default margin (50 ms) is part
of the model of what the limits allow; a body records its start after the
limiter admitted it, up to ``START_JITTER`` later on a loaded machine, so the
windows judged are that much shorter than the period.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery

from celery_redlock import config
from celery_redlock.testing import RedisServer, ServerGroup

from .rate_checker import START_JITTER, Model, expected_span, judge
from .support import WorkerProcess, create_app, start_beat, stop_beat

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
        config.forget(app)
        app.close()
        server_pool.heal()


def starts_of(cluster: Cluster, key: str) -> tuple[list[float], list[str]]:
    events = cluster.events("start", key)
    return [float(event[3]) for event in events], [event[2] for event in events]


def publish_and_wait(task: Any, calls: list[tuple[Any, ...]]) -> list[str]:
    results = [task.apply_async(args) for args in calls]
    for result in results:
        result.get(timeout=60)
    return [result.id for result in results]


def test_default_algorithm_five_per_second_forty_runs(cluster: Cluster) -> None:
    ids = publish_and_wait(cluster.app.tasks["t.rate_default"], [(n,) for n in range(40)])
    starts, ran = starts_of(cluster, "rate_default")
    models = [Model(5, 1.0, margin=MARGIN)]
    assert judge(starts, models, published=ids, ran=ran, jitter=START_JITTER) == []


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
    try:
        cluster.wait_for("published", 1, "t.rate_beat", timeout=30)
        time.sleep(3.5)
        client.delete("beat-on")
        time.sleep(0.5)  # a tick being sent when the key went is recorded by now
    finally:
        stop_beat(beat)
        log.close()
    published = [event[2] for event in cluster.events("published", "t.rate_beat")]
    beat_log = (cluster.folder / "beat.log").read_text()
    ticks = beat_log.count("Sending due task")
    assert ticks > len(published), "beat should have ticked faster than the limit admits"
    assert len(published) >= 15
    client.rpush("release:beat", *range(blockers))
    cluster.wait_for("start", len(published), "rate_beat")
    time.sleep(0.5)  # a run started twice would show by now
    starts, ran = starts_of(cluster, "rate_beat")
    models = [Model(5, 1.0, margin=MARGIN)]
    assert judge(starts, models, published=published, ran=ran, jitter=START_JITTER) == []


def test_lock_busy_requeues_spend_no_rate_budget(cluster: Cluster) -> None:
    app = cluster.app
    app.tasks["t.hold"].delay("busy", 1.5)
    cluster.wait_for("hold-start", 1, "busy")
    ids = publish_and_wait(app.tasks["t.rate_busy"], [("busy",)] * 15)
    starts, ran = starts_of(cluster, "rate_busy:busy")
    (hold_end,) = (float(event[3]) for event in cluster.events("hold-end", "busy"))
    assert cluster.events("busy", "rated:busy"), "runs should have found the lock busy"
    assert min(starts) >= hold_end
    # Had the busy re-queues during the hold spent units (15 runs, each busy
    # at least once), the first window's 10 would be gone and the first run
    # would wait for them to expire, 8 s; it starts within its busy backoff.
    assert min(starts) - hold_end < 4.0, (min(starts) - hold_end, starts)
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
        jitter=START_JITTER,
    )
    assert problems == []


def test_a_fractional_rate_keeps_both_its_ceiling_and_its_average(cluster: Cluster) -> None:
    ids = publish_and_wait(cluster.app.tasks["t.rate_fraction"], [(n,) for n in range(13)])
    starts, ran = starts_of(cluster, "rate_fraction")
    models = [Model(2.5, 1.0, margin=MARGIN)]
    assert judge(starts, models, published=ids, ran=ran, jitter=START_JITTER) == []


def test_two_limits_on_one_task_each_hold(cluster: Cluster) -> None:
    ids = publish_and_wait(cluster.app.tasks["t.rate_two"], [(n,) for n in range(16)])
    starts, ran = starts_of(cluster, "rate_two")
    models = [Model(5, 1.0, margin=MARGIN), Model(8, 2.0, margin=MARGIN)]
    assert judge(starts, models, published=ids, ran=ran, jitter=START_JITTER) == []


def test_a_per_tenant_limit_and_a_global_one_hold_together(cluster: Cluster) -> None:
    # Which tenant runs first is up to the workers: the time the limits allow
    # depends on it, so only the windows and the messages are judged here.
    calls = [("a",), ("b",)] * 9
    ids = publish_and_wait(cluster.app.tasks["t.rate_tenant"], calls)
    starts_a, ran_a = starts_of(cluster, "rate_tenant:a")
    starts_b, ran_b = starts_of(cluster, "rate_tenant:b")
    tenant, everyone = Model(3, 1.0, margin=MARGIN), Model(5, 1.0, margin=MARGIN)
    for starts in (starts_a, starts_b):
        assert (
            judge(starts, [tenant], expected=max(starts) - min(starts), jitter=START_JITTER) == []
        )
    both = starts_a + starts_b
    assert (
        judge(
            both,
            [everyone],
            published=ids,
            ran=ran_a + ran_b,
            expected=max(both) - min(both),
            jitter=START_JITTER,
        )
        == []
    )
    assert max(both) - min(both) >= expected_span([everyone], len(ids)) * 0.8
