"""The lock's Redis nodes: what each one is and how it is reached.

URLs and plain redis-py clients (TCP, TLS, unix) are reached over the fan-out's own links; any
other client object (``fakeredis``) through its command methods (:mod:`.redis_py_client`). A
``sentinel://`` node is found through its Sentinels (:meth:`Node.locate`).
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

    ``name`` is a URL without its password; ``suspect``: a command went unanswered past its
    deadline, so the node is barely waited for until it answers; with ``sentinel`` set,
    ``endpoint`` is where that master was last found.
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
        """A redis-py client for this node, with the lock's timeouts (pub/sub, admin commands)."""
        if self._client is None:
            if self._finder is not None:
                self._client = self._finder.client()
            else:
                assert self.endpoint is not None
                self._client = self.endpoint.client(self._timeout)
        return self._client

    # -- Sentinel-managed nodes ---------------------------------------------------------

    def locate(self) -> BaseException | None:
        """Point a Sentinel-managed node's links at its master; why it is unusable, or ``None``.

        Asks when there is no open connection or the master answered ``READONLY``; concurrent
        callers share one question, and after no Sentinel answered nobody asks again for
        :data:`RELOCATE_INTERVAL`. Blocks: the fan-out calls it before taking its lock.
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
        """A node with its own connections to ``client``'s server (an unusual client: itself)."""
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
    """Whether ``client`` is fakeredis's without its ``lua`` extra: every script call fails."""
    package = type(client).__module__.partition(".")[0]
    return package == "fakeredis" and importlib.util.find_spec("lupa") is None


def make_nodes(nodes: Sequence[str | redis.Redis], timeout: float) -> list[Node]:
    """Turn URLs and clients into :class:`Node` objects, validating each and building TLS now.

    Raises:
        ConfigurationError: a bad URL or option, two entries on one server, unusable TLS.
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
    """Refuse two endpoints on one server (another database, or a master sharing a Sentinel)."""
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
