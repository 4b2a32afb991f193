"""The admin API's only reach into how nodes are connected.

Inspection sends plain commands (``SCAN``, ``INFO``...) through each node's ``redis.Redis``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from ..lock.redlock import Redlock
from ..transport.nodes import make_nodes

__all__ = ["NodeClient", "OpenNode", "lock_nodes", "open_node"]


@dataclass(frozen=True)
class NodeClient:
    """One Redis server: its display name (password removed) and a client for it."""

    name: str
    client: redis.Redis


def lock_nodes(redlock: Redlock) -> list[NodeClient]:
    """The lock nodes of ``redlock``, in its order."""
    return [NodeClient(node.name, node.client) for node in redlock.nodes]


@dataclass(frozen=True)
class OpenNode(NodeClient):
    """A node opened for one command; close it when done."""

    closer: Callable[[], None]

    def close(self) -> None:
        """Close its connections."""
        self.closer()


def open_node(where: str | redis.Redis, timeout: float) -> OpenNode:
    """Connect to one Redis (URL or client) with ``timeout`` per command.

    Raises:
        ConfigurationError: ``where`` is not a usable Redis URL (option ``nodes``).
    """
    node = make_nodes([where], timeout)[0]
    return OpenNode(node.name, node.client, node.close)
