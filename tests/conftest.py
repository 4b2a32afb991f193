"""Shared fixtures: real redis-server processes on free 127.0.0.1 ports.

One set of servers is started per test session; every test gets them healthy
(resumed, restarted if killed) and empty. Tests kill, pause and restart them
freely.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from celery_redlock import Redlock
from celery_redlock.testing import (
    RedisServer,
    RedisServerNotFound,
    ServerGroup,
    find_redis_server,
    server_build,
)

#: Nodes available to a test; the last one is the witness, never a lock node.
POOL_SIZE = 6


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI timeout, `kill`) ends the run like Ctrl-C: pytest then
    # tears the fixtures down and stops the redis-server processes it started
    # instead of leaving them on their ports.
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def pytest_report_header(config: pytest.Config) -> str:
    # Every run's log says which server it tested ($REDIS_SERVER chooses;
    # see celery_redlock.testing.binaries).
    try:
        return f"server: {server_build(find_redis_server())}"
    except RedisServerNotFound as exc:
        return f"server: none found: {exc}"


@pytest.fixture(scope="session")
def server_pool() -> Iterator[ServerGroup]:
    group = RedisServer.start_many(POOL_SIZE)
    yield group
    group.stop()


@pytest.fixture
def servers(server_pool: ServerGroup) -> Iterator[ServerGroup]:
    """All pool servers, running and empty."""
    server_pool.heal()
    for server in server_pool:
        server.flush()
    yield server_pool
    server_pool.heal()


@pytest.fixture
def witness(servers: ServerGroup) -> RedisServer:
    """A node outside every lock's node set, for recording what happened."""
    return servers[POOL_SIZE - 1]


@pytest.fixture
def make_redlock() -> Iterator[Callable[..., Redlock]]:
    """Build Redlocks that are closed after the test."""
    made: list[Redlock] = []

    def make(nodes: list[str] | list[RedisServer], **kwargs: object) -> Redlock:
        urls = [node.url if isinstance(node, RedisServer) else node for node in nodes]
        redlock = Redlock(urls, **kwargs)  # type: ignore[arg-type]
        made.append(redlock)
        return redlock

    yield make
    for redlock in made:
        redlock.close()


@pytest.fixture
def topology(request: pytest.FixtureRequest, servers: ServerGroup) -> list[RedisServer]:
    """The lock nodes of one topology; the first ``down`` of them are killed."""
    count, down = request.param
    nodes = list(servers)[:count]
    for server in nodes[:down]:
        server.kill()
    return nodes
