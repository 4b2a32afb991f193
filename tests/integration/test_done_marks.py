"""Done marks on real lock nodes, and a finished state in a real Redis result backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from celery import Celery, states

from celery_redlock import Redlock
from celery_redlock.tasks.features.redelivery import finished, mark_done
from celery_redlock.testing import ServerGroup


@pytest.fixture
def app(servers: ServerGroup) -> Iterator[Celery]:
    url = servers[3].url
    app = Celery("marks", broker=url, backend=url, set_as_current=False)

    @app.task(shared=False, name="marks.task")
    def task() -> None:
        return None

    yield app
    app.close()


@pytest.fixture
def nodes(servers: ServerGroup, make_redlock: Callable[..., Redlock]) -> Redlock:
    # Room for a loaded machine's first calls (connections, script loads, a
    # node just restarted): these tests are about marks, not node timeouts.
    return make_redlock(list(servers)[:3], key_prefix="m:", node_timeout=0.5)


def test_a_copy_sees_the_mark_its_twin_left_on_any_node(
    app: Celery, nodes: Redlock, servers: ServerGroup
) -> None:
    task = app.tasks["marks.task"]
    assert finished(task, nodes, "t-1") is None
    mark_done(nodes, "t-1", ttl=5.0)
    assert finished(task, nodes, "t-1", backend=False) is not None
    # Kept on the other nodes when one restarts empty.
    servers[0].restart()
    assert finished(task, nodes, "t-1", backend=False) is not None
    assert finished(task, nodes, "t-2", backend=False) is None
    ttls = [node.pttl("m:done:t-1") for node in (servers[1].client(), servers[2].client())]
    assert all(0 < ttl <= 5000 for ttl in ttls), ttls


def test_a_finished_state_tells_a_copy_and_a_retry_does_not(app: Celery, nodes: Redlock) -> None:
    task = app.tasks["marks.task"]
    backend = app.backend
    backend.store_result("t-3", None, states.RETRY)
    assert finished(task, nodes, "t-3") is None
    for n, state in enumerate((states.SUCCESS, states.FAILURE, states.REVOKED)):
        task_id = f"t-4-{n}"
        result = ValueError("x") if state == states.FAILURE else None
        backend.store_result(task_id, result, state)
        assert finished(task, nodes, task_id) is not None, state
        # A run that is no copy asks the lock nodes only.
        assert finished(task, nodes, task_id, backend=False) is None


def test_no_result_backend_and_no_mark_tell_nothing(servers: ServerGroup, nodes: Redlock) -> None:
    app = Celery("marks", broker=servers[3].url, set_as_current=False)
    task = app.task(shared=False, name="marks.plain")(lambda: None)
    try:
        assert finished(task, nodes, "t-5") is None
    finally:
        app.close()
