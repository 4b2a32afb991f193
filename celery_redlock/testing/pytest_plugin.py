"""pytest fixtures for an application's own tests of its LockedTasks.

Opt in from the project's root ``conftest.py`` and name the app::

    import pytest

    pytest_plugins = ["celery_redlock.testing.pytest_plugin"]

    @pytest.fixture
    def redlock_app():
        from proj.celery import app
        return app

Then ask for ``redlock_disabled_app`` (no Redis), ``redlock_fake_app`` (a fresh fakeredis
node) or ``redlock_real_app`` (three throw-away servers): each is the app with its
``redlock_*`` settings changed for the test only (docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from . import RedisServer, ServerGroup
from .temporary_settings import redlock_settings

__all__ = [
    "redlock_app",
    "redlock_disabled_app",
    "redlock_fake_app",
    "redlock_fake_nodes",
    "redlock_real_app",
    "redlock_real_nodes",
    "redlock_servers",
]

#: Throw-away redis-server processes behind ``redlock_real_nodes``.
REAL_NODES = 3


@pytest.fixture
def redlock_app() -> Any:
    """The Celery app under test: define a fixture of this name returning yours."""
    pytest.fail(
        "celery_redlock.testing.pytest_plugin: define a fixture named `redlock_app` that returns "
        "your Celery app (in conftest.py: @pytest.fixture def redlock_app(): return app)",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def redlock_servers() -> Iterator[ServerGroup]:
    """Three throw-away ``redis-server`` processes on free ports, for the whole session."""
    with RedisServer.start_many(REAL_NODES) as group:
        yield group


@pytest.fixture
def redlock_real_nodes(redlock_servers: ServerGroup) -> list[str]:
    """The URLs of :func:`redlock_servers`, running and empty."""
    redlock_servers.heal()
    for server in redlock_servers:
        server.flush()
    return redlock_servers.urls


@pytest.fixture
def redlock_fake_nodes() -> list[redis.Redis]:
    """One fresh ``fakeredis.FakeRedis`` lock node (needs ``fakeredis[lua]``)."""
    try:
        import fakeredis
    except ImportError as exc:  # a fixture the test asked for: fail, saying what to install
        raise RuntimeError(
            "redlock_fake_nodes needs fakeredis with Lua: pip install 'fakeredis[lua]'"
        ) from exc
    return [fakeredis.FakeRedis(server=fakeredis.FakeServer())]


@pytest.fixture
def redlock_disabled_app(redlock_app: Any) -> Iterator[Any]:
    """``redlock_app`` with ``redlock_enabled = False`` for this test."""
    with redlock_settings(redlock_app, enabled=False) as app:
        yield app


@pytest.fixture
def redlock_fake_app(redlock_app: Any, redlock_fake_nodes: list[redis.Redis]) -> Iterator[Any]:
    """``redlock_app`` locking on a fresh fakeredis node for this test."""
    with redlock_settings(
        redlock_app, enabled=True, nodes=redlock_fake_nodes, rate_limit_url=None
    ) as app:
        yield app


@pytest.fixture
def redlock_real_app(redlock_app: Any, redlock_real_nodes: list[str]) -> Iterator[Any]:
    """``redlock_app`` locking on three empty throw-away redis-server nodes for this test."""
    with redlock_settings(
        redlock_app, enabled=True, nodes=redlock_real_nodes, rate_limit_url=None
    ) as app:
        yield app
