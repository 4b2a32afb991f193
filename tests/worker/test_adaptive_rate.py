"""A service that refuses above a limit nobody configured: the fleet pauses, and finds its limit.

Two ``celery worker`` processes (threads pool, four threads each) run tasks
that call :class:`.support.FakeApi`, which refuses with a Retry-After above a
hidden limit. Judged from the times the workers record (monotonic clock,
shared by the processes of one host): run starts and API calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_redlock import config
from celery_redlock.testing import ServerGroup

from .support import WorkerProcess, admissions, create_app

pytestmark = [pytest.mark.celery, pytest.mark.slow]

THREADS = 4


@pytest.fixture(scope="module")
def cluster(server_pool: ServerGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server_pool.heal()
    for server in server_pool:
        server.flush()
    servers = list(server_pool)
    nodes, broker, witness = [s.url for s in servers[:3]], servers[3], servers[-1]
    folder = tmp_path_factory.mktemp("adaptive")
    workers = [
        WorkerProcess(broker.url, nodes, witness, folder / f"worker{n}.log", "threads", THREADS)
        for n in range(2)
    ]
    app = create_app(broker.url, nodes, witness.url)
    try:
        yield app
    finally:
        for worker in workers:
            worker.stop()
        config.forget(app)
        app.close()
        server_pool.heal()


def api_calls(app: Any) -> list[tuple[float, str, bool]]:
    """``(time, task id, went through)`` of each call the fake API took, in time order."""
    calls = [(float(e[3]), e[2], e[5] == "1") for e in app.witness.events() if e[0] == "call"]
    return sorted(calls)


def test_after_a_refusal_no_run_of_the_key_starts_anywhere_until_retry_after(cluster) -> None:
    witness = cluster.witness.client
    witness.set("api:retry_after", "2.0")
    witness.set("api:refuse", 1)  # the first call is refused, Retry-After: 2 s
    results = [cluster.tasks["t.api_pause"].delay(n) for n in range(30)]
    # every run ran once, though each has max_retries=0: a pause's re-queue spends none
    assert sorted(result.get(timeout=60) for result in results) == list(range(30))
    calls = api_calls(cluster)
    refused = [at for at, _, ok in calls if not ok]
    assert len(refused) == 1
    went = [task_id for _, task_id, ok in calls if ok]
    assert sorted(went) == sorted(result.id for result in results)
    # A run whose delivery began after the pause was written was admitted after
    # it: it starts once the pause is over, 2 s from the refusal or later. (A run
    # delivered between the refusal and the write may start: nothing told the
    # fleet yet.)
    paused = [float(e[3]) for e in cluster.witness.events() if e[0] == "paused"]
    assert len(paused) == 1
    ends = refused[0] + 2.0
    after = [(prerun, start) for prerun, start in admissions(cluster, "start", "api_pause")]
    late = [start for prerun, start in after if prerun > paused[0]]
    assert late, "no run was delivered after the pause was written"
    early = [start - refused[0] for start in late if start < ends - 0.005]
    assert early == [], f"runs started {early} s after the refusal, inside its 2 s pause"


#: (seconds from the start, hidden limit per second): 8/s, 4/s from 20 s, 8/s again from 34 s;
#: phases long enough that one refusal more or less does not decide a share of 5 %.
SCHEDULE = ((0.0, 8), (20.0, 4), (34.0, 8))
OFFERED = 10.0
END = 46.0


def test_the_fleet_converges_on_the_hidden_limit_and_follows_it(cluster) -> None:
    witness = cluster.witness.client
    # The API starts with none of its window spent: calls the other test made in
    # the last second would have it refuse the first call here, with one unit in
    # the fleet's window, which the law takes as the API's rate (0.75 x 0.95/s).
    witness.delete("api:log")
    task = cluster.tasks["t.api_adaptive"]
    began = time.monotonic()
    changes = []
    pending = list(SCHEDULE)
    sent = 0
    while (now := time.monotonic() - began) < END:
        if pending and now >= pending[0][0]:
            _at, hidden = pending.pop(0)
            witness.set("api:hidden", hidden)
            changes.append(time.monotonic())
        while sent < now * OFFERED:
            task.apply_async((sent,))
            sent += 1
        time.sleep(0.02)
    calls = [call for call in api_calls(cluster) if call[0] >= began]
    # nothing ran twice: one successful call per task id at most
    went = [task_id for _, task_id, ok in calls if ok]
    assert len(went) == len(set(went))

    def measured(start: float, end: float) -> tuple[float, float]:
        inside = [ok for at, _, ok in calls if start <= at < end]
        return sum(inside) / (end - start), 1 - sum(inside) / max(len(inside), 1)

    # Judged from the calls the workers made, not from when the test began: the
    # warm-up starts at the first call, however late the workers took the first run.
    first = calls[0][0]
    steady = measured(max(changes[0], first) + 6.0, changes[1])
    lower = measured(changes[1] + 6.0, changes[2])
    back = measured(changes[2] + 6.0, began + END)
    curve = [round(measured(t, t + 2.0)[0], 1) for t in range(int(began), int(began + END), 2)]
    refused = [round(at - began, 2) for at, _, ok in calls if not ok]
    print(f"8/s: {steady}, 4/s: {lower}, 8/s again: {back}; per 2 s: {curve}; refused {refused}")
    # The targets (docs/rate-limiting.md has the figures measured): 75 % of
    # the hidden limit with at most 5 % refused at 8/s after the warm-up, 75 % with at
    # most 10 % at 4/s once it has followed (6 s), and 75 % of 8/s again from 6 s
    # after it came back.
    assert steady[0] >= 0.75 * 8
    assert steady[1] <= 0.05
    assert lower[0] >= 0.75 * 4
    assert lower[1] <= 0.1
    assert back[0] >= 0.75 * 8
