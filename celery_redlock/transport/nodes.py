"""The lock's Redis nodes: what each one is and how it is reached.

A :class:`Node` is one independent Redis master. Nodes given as URLs, and
``redis.Redis`` clients with plain TCP, TLS or unix-socket connections, are
reached through links the fan-out owns end to end (:mod:`.connection`,
:mod:`.fanout`): no private part of redis-py is used. Any other client
object (``fakeredis.FakeRedis``) is reached through its own command methods
(:mod:`.redis_py_client`). A ``sentinel://`` node is one master that Redis Sentinel
manages: before a fan-out uses it, :meth:`Node.locate` asks the Sentinels
where it runs when the node has no working connection or last answered
``READONLY`` (a demoted master), and moves its links there.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import RedisError

from ..errors import ConfigurationError
from . import hub
from .commands import Call, Command, NodeFailure, NodeResult, NotWaitedFor
from .connection import Link
from .endpoint import Endpoint, prepare_tls
from .fanout import fan_out
from .redis_py_client import run_direct
from .sentinel import SENTINEL_SCHEME, MasterFinder, SentinelMaster
from .url_options import bad

__all__ = [
    "Call",
    "Command",
    "Node",
    "NodeFailure",
    "NodeResult",
    "NotWaitedFor",
    "fan_out",
    "make_nodes",
]

_PLAIN = {Connection: "tcp", SSLConnection: "tls", UnixDomainSocketConnection: "unix"}
#: After no Sentinel answered, a Sentinel-managed node asks again this much later (seconds).
RELOCATE_INTERVAL = 1.0

logger = logging.getLogger("celery_redlock.nodes")


class Node:
    """One independent Redis master.

    Attributes:
        name: for messages and logs (a URL without its password).
        client: a redis-py client for the same server, with the lock's
            timeouts (pub/sub, admin commands); the given client itself for a
            node reached through its client.
        suspect: the node left a command unanswered past its deadline and is
            not waited for until it answers again.
        sentinel: for a Sentinel-managed node, the master it stands for;
            :attr:`endpoint` is then where that master was last found.
    """

    def __init__(
        self,
        name: str,
        timeout: float,
        *,
        endpoint: Endpoint | None = None,
        direct: redis.Redis | None = None,
        sentinel: SentinelMaster | None = None,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.direct = direct
        self.sentinel = sentinel
        self.suspect = False
        self._finder = MasterFinder(sentinel, timeout) if sentinel is not None else None
        self._located_at = -math.inf
        self._locate_error: BaseException | None = None
        self._locate_lock = threading.Lock()
        self._demoted = False
        self._timeout = timeout
        self._client: redis.Redis | None = direct
        self._links: dict[str, Link] = {}
        self._generation = hub.generation

    @property
    def identity(self) -> Endpoint | SentinelMaster | None:
        """What tells this node's server apart from the others' (``None``: a client object)."""
        return self.sentinel if self.sentinel is not None else self.endpoint

    @property
    def client(self) -> redis.Redis:
        """A redis-py client for this node (made on first use).

        For a Sentinel-managed node, a client that finds the master through
        the Sentinels each time it connects.
        """
        if self._client is None:
            if self._finder is not None:
                self._client = self._finder.client()
            else:
                assert self.endpoint is not None
                self._client = self.endpoint.client(self._timeout)
        return self._client

    # -- Sentinel-managed nodes ---------------------------------------------------------

    def locate(self) -> BaseException | None:
        """Make sure a Sentinel-managed node's links go to its master now.

        Asks the Sentinels when the node has no open connection yet, its
        connection broke, or its master answered ``READONLY`` (demoted by a
        failover). Callers that need the answer at the same time share one
        question; after no Sentinel answered, they are not asked again for
        :data:`RELOCATE_INTERVAL`, so unreachable Sentinels cost one node
        timeout each once a second, not at every operation. Returns the error that makes
        the node unusable for now, or ``None``. Called by the fan-out before
        it takes its lock: asking the Sentinels blocks.
        """
        if self._finder is None:
            return None
        link = self._links.get("interactive")
        if self.endpoint is not None and not self._demoted and link is not None and link.open:
            return None
        asked = self._located_at
        with self._locate_lock:
            if self._located_at != asked:
                return self._locate_error  # another caller asked while we waited: its answer
            if self._locate_error is not None and time.monotonic() - asked < RELOCATE_INTERVAL:
                return self._locate_error  # no Sentinel answered a moment ago
            try:
                host, port = self._finder.find()
            except (RedisError, OSError) as exc:
                self._locate_error = exc
                return exc
            finally:
                self._located_at = time.monotonic()
            self._locate_error = None
            self._demoted = False
            endpoint = self.endpoint
            if endpoint is None or (endpoint.host, endpoint.port) != (host, port):
                if endpoint is not None:
                    logger.warning(
                        "nodes: %s: master moved from %s:%s to %s:%s",
                        self.name,
                        endpoint.host,
                        endpoint.port,
                        host,
                        port,
                    )
                self._close_links()
                assert self.sentinel is not None
                self.endpoint = self.sentinel.master(host, port)
        return None

    def demoted(self) -> None:
        """The node answered ``READONLY``: a Sentinel-managed node asks where its master went."""
        if self._finder is not None:
            self._demoted = True

    @property
    def pool(self) -> Any:
        """The connection pool of :attr:`client`."""
        return self.client.connection_pool

    def link(self, *, bulk: bool = False) -> Link:
        """The shared link for small commands, or the one for large batches."""
        if self._generation != hub.generation:
            # Forked: the parent's sockets are not ours to use.
            for old in self._links.values():
                old.drop()
            self._links = {}
            self._generation = hub.generation
        role = "bulk" if bulk else "interactive"
        found = self._links.get(role)
        if found is None:
            assert self.endpoint is not None
            found = self._links[role] = Link(self.endpoint, self._answered, role)
        return found

    def _answered(self) -> None:
        self.suspect = False

    def run_direct(self, calls: Sequence[Call | Command]) -> NodeResult:
        """Run ``calls`` through :attr:`direct`'s own command methods."""
        assert self.direct is not None
        return run_direct(self.direct, self.name, calls)

    def close(self) -> None:
        """Close every connection of this node (they reopen when next used)."""
        if self.direct is None:
            self._close_links()
            if self._client is not None:
                self._client.close()
                self._client.connection_pool.disconnect()
                self._client = None
            if self._finder is not None:
                self._finder.close()

    def _close_links(self) -> None:
        if self._generation == hub.generation:
            the_hub = hub.shared()
            with the_hub.lock:
                for link in self._links.values():
                    the_hub.close_link(link, ConnectionError(f"{self.name}: closed"))
                the_hub.wake()
        self._links = {}

    def __repr__(self) -> str:
        return f"Node({self.name})"

    @classmethod
    def from_url(cls, url: str, timeout: float) -> Node:
        """Build a node from a ``redis://``, ``rediss://``, ``unix://`` or ``sentinel://`` URL."""
        if isinstance(url, str) and url.strip().startswith(f"{SENTINEL_SCHEME}://"):
            master = SentinelMaster.from_url(url)
            return cls(master.name, timeout, sentinel=master)
        endpoint = Endpoint.from_url(url)
        return cls(endpoint.name, timeout, endpoint=endpoint)

    @classmethod
    def from_client(cls, client: redis.Redis, timeout: float) -> Node:
        """Build a node that reaches the same server as ``client``.

        The client itself is left alone: the node opens its own connections
        with the same address, credentials and TLS settings. A client whose
        connections are not plain redis-py ones is used as it is.
        """
        pool = getattr(client, "connection_pool", None)
        kind = _PLAIN.get(getattr(pool, "connection_class", None))  # type: ignore[arg-type]
        kwargs = getattr(pool, "connection_kwargs", None)
        if kind is None or not isinstance(kwargs, dict):
            name = f"{type(client).__module__}.{type(client).__qualname__}@{id(client):x}"
            if _fakeredis_without_lua(client):
                raise bad(
                    f"{name} is a fakeredis client without Lua, and every lock operation is a "
                    "Lua script: pip install 'fakeredis[lua]'"
                )
            return cls(name, timeout, direct=client)
        endpoint = Endpoint.from_connection_kwargs(kind, kwargs)
        return cls(endpoint.name, timeout, endpoint=endpoint)


def _fakeredis_without_lua(client: redis.Redis) -> bool:
    """Whether ``client`` is fakeredis's, installed without its ``lua`` extra (lupa).

    Such a client answers every script call with an unknown-command error.
    """
    package = type(client).__module__.partition(".")[0]
    return package == "fakeredis" and importlib.util.find_spec("lupa") is None


def make_nodes(nodes: Sequence[str | redis.Redis], timeout: float) -> list[Node]:
    """Turn URLs and clients into :class:`Node` objects, validating each.

    TLS contexts are built here, one per distinct TLS settings (see
    :func:`~.endpoint.prepare_tls`).

    Raises:
        ConfigurationError: a URL is malformed or has an option the lock
            refuses, two entries are the same server, or TLS settings
            cannot be used.
    """
    if isinstance(nodes, str | redis.Redis):
        nodes = [nodes]
    if not isinstance(nodes, Sequence):
        raise ConfigurationError(
            "nodes", f"expected a list of Redis URLs or redis.Redis clients, got {nodes!r}"
        )
    if not nodes:
        raise ConfigurationError(
            "nodes", "at least one Redis node is needed, e.g. ['redis://localhost:6379/0']"
        )
    made = [
        Node.from_client(node, timeout)
        if isinstance(node, redis.Redis)
        else Node.from_url(node, timeout)
        for node in nodes
    ]
    _refuse_twins([node.identity for node in made if node.identity is not None])
    prepare_tls(node.endpoint for node in made if node.endpoint is not None)
    return made


def _refuse_twins(endpoints: list[Endpoint | SentinelMaster]) -> None:
    """Refuse two endpoints that are one server (databases of one server included).

    Two Sentinel-managed nodes are one server when they name the same master
    and share a Sentinel.
    """
    seen: dict[tuple[str, ...], Endpoint | SentinelMaster] = {}
    masters: list[SentinelMaster] = []
    for endpoint in endpoints:
        twin: Endpoint | SentinelMaster | None
        if isinstance(endpoint, SentinelMaster):
            twin = next((other for other in masters if other.same_master(endpoint)), None)
            masters.append(endpoint)
        else:
            twin = seen.get(endpoint.server())
            seen[endpoint.server()] = endpoint
        if twin is not None:
            raise bad(
                f"{twin.name} and {endpoint.name} are the same Redis server; "
                "Redlock needs independent servers (a majority of copies of one server "
                "is no majority)"
            )
