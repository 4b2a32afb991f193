"""Real, throw-away Redis servers for tests, demos and benchmarks.

Public API: real lock nodes your tests can kill, pause (SIGSTOP), resume and restart empty::

    from celery_redlock.testing import RedisServer

    with RedisServer.start_many(3) as servers:
        app.conf.redlock_nodes = servers.urls
        servers[0].kill()          # a node down: the other two are a majority
        ...

Imports no pytest; needs only a server binary (:mod:`celery_redlock.testing.binaries`).
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
