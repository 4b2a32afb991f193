"""Test helpers shared across test modules."""

from __future__ import annotations

import pytest

from celery_redlock.testing import RedisServer

TOPOLOGIES = [
    pytest.param((1, 0), id="1-node"),
    pytest.param((3, 0), id="3-nodes"),
    pytest.param((5, 0), id="5-nodes"),
    pytest.param((3, 1), id="3-nodes-1-down"),
]

#: Run a test on every node topology: ``def test_x(topology): ...``
all_topologies = pytest.mark.parametrize("topology", TOPOLOGIES, indirect=True)


def evalsha_calls(server: RedisServer) -> int:
    """How many EVALSHA commands ``server`` has run (its ``INFO commandstats``)."""
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
