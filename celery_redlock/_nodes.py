"""Redis nodes and the concurrent fan-out that talks to all of them at once.

A lock operation sends its command to every node before it reads any reply,
so N nodes cost about one round trip, and it stops waiting for a node when
the node timeout runs out, so a slow or paused node cannot stall the caller.
No thread is started. redis-py opens and authenticates each connection
(TLS, ACL user and password, database); from then on the fan-out drives the
socket itself, non-blocking: one ``send`` per node, one ``poll`` over all the
nodes' sockets, one ``recv`` per reply (see :mod:`._resp`). Going through
redis-py's reader instead costs about ten system calls per node per round
trip, which on a fast network is most of the time a lock operation takes.
"""

from __future__ import annotations

import inspect
import math
import os
import select
import socket
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection, ConnectionInterface, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from . import _clock
from ._resp import INCOMPLETE, ErrorReply, ProtocolError, pack, parse
from ._scripts import LuaScript
from .errors import ConfigurationError

__all__ = ["Call", "Command", "Node", "NodeFailure", "fan_out", "make_nodes"]

_URL_SCHEMES = ("redis", "rediss", "unix")
#: Extra seconds a node gets per command beyond the first in one batch.
PER_CALL_ALLOWANCE = 0.0001
# Per-pool machinery redis-py keeps among connection settings; a new pool
# makes its own.
_POOL_INTERNALS = ("maint_notifications", "orig_", "himport_", "oss_cluster_")
# CLIENT SETINFO would add a round trip to every new connection, and a round
# trip that a paused node never answers; turn it off however this redis-py
# spells it.
_NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


class NodeFailure(Exception):
    """A node did not answer (refused, reset, timed out).

    Attributes:
        node: the node's display name.
    """

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(f"{node}: {cause}")
        self.node = node


class Node:
    """One independent Redis master, reached through its own connection pool.

    The pool's sockets time out after ``timeout`` seconds and never retry on
    their own: waiting is bounded by the fan-out, not by redis-py.
    """

    def __init__(self, pool: ConnectionPool, name: str) -> None:
        self.pool = pool
        self.name = name
        self.client = redis.Redis(connection_pool=pool)
        # The fan-out keeps its own idle links: redis-py's pool does
        # bookkeeping on every checkout that costs more than the round trip.
        self._idle: list[_Link] = []
        self._generation = _fork_generation

    def checkout(self) -> _Link:
        """A link for one exchange (it connects when first opened)."""
        if self._generation != _fork_generation:
            # Forked: the parent's sockets are not ours to use or to close.
            self._idle = []
            self._generation = _fork_generation
        try:
            return self._idle.pop()
        except IndexError:
            return _Link(self.pool.make_connection())

    def checkin(self, link: _Link) -> None:
        """Give back a link whose replies have all been read."""
        if self._generation != _fork_generation:
            return
        if link.buffer:
            link.close()  # bytes nobody asked for: its state is unknown
        self._idle.append(link)

    def close(self) -> None:
        """Close every connection of this node."""
        idle, self._idle = self._idle, []
        for link in idle:
            link.close()
        self.pool.disconnect()

    def __repr__(self) -> str:
        return f"Node({self.name})"

    @classmethod
    def from_url(cls, url: str, timeout: float) -> Node:
        """Build a node from a ``redis://``, ``rediss://`` or ``unix://`` URL."""
        if not isinstance(url, str):
            raise ConfigurationError(
                f"nodes: expected a Redis URL or a redis.Redis client, got {url!r}",
                option="nodes",
            )
        parts = urlsplit(url)
        if parts.scheme not in _URL_SCHEMES:
            raise ConfigurationError(
                f"nodes: {_redact(url)!r} is not a Redis URL; expected "
                "redis://host:port/db, rediss://host:port/db or unix:///path/to/socket",
                option="nodes",
            )
        if parts.scheme != "unix" and not parts.hostname:
            raise ConfigurationError(
                f"nodes: {_redact(url)!r} names no host; expected redis://host:port/db",
                option="nodes",
            )
        if parts.scheme == "unix" and not parts.path:
            raise ConfigurationError(
                f"nodes: {_redact(url)!r} names no socket; expected unix:///path/to/socket",
                option="nodes",
            )
        database = parts.path.strip("/") if parts.scheme != "unix" else ""
        if database and not database.isdigit():
            raise ConfigurationError(
                f"nodes: {_redact(url)!r} names database {database!r}; expected a number "
                "(redis://host:port/0)",
                option="nodes",
            )
        try:
            _ = parts.port
            pool = ConnectionPool.from_url(url, **_pool_options(timeout))
        except ValueError as exc:
            raise ConfigurationError(
                f"nodes: {_redact(url)!r} is not a valid Redis URL: {exc}", option="nodes"
            ) from exc
        return cls(pool, _redact(url))

    @classmethod
    def from_client(cls, client: redis.Redis, timeout: float) -> Node:
        """Build a node that reaches the same server as ``client``.

        The client's own pool is left alone; this node gets a pool with the
        same connection settings but the lock's timeouts and no retries.
        """
        source = client.connection_pool
        kwargs = {
            key: value
            for key, value in source.connection_kwargs.items()
            if not key.startswith(_POOL_INTERNALS)
        }
        kwargs.update(_pool_options(timeout))
        pool = ConnectionPool(connection_class=source.connection_class, **kwargs)
        if "path" in kwargs:
            name = f"unix://{kwargs['path']}"
        else:
            name = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        return cls(pool, f"{name}/{kwargs.get('db', 0)}")


def make_nodes(nodes: Sequence[str | redis.Redis], timeout: float) -> list[Node]:
    """Turn URLs and clients into :class:`Node` objects, validating each."""
    if isinstance(nodes, str | redis.Redis):
        nodes = [nodes]
    if not isinstance(nodes, Sequence):
        raise ConfigurationError(
            f"nodes: expected a list of Redis URLs or redis.Redis clients, got {nodes!r}",
            option="nodes",
        )
    if not nodes:
        raise ConfigurationError(
            "nodes: at least one Redis node is needed, e.g. ['redis://localhost:6379/0']",
            option="nodes",
        )
    made = []
    for node in nodes:
        if isinstance(node, redis.Redis):
            made.append(Node.from_client(node, timeout))
        else:
            made.append(Node.from_url(node, timeout))
    return made


def _pool_options(timeout: float) -> dict[str, Any]:
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
        "health_check_interval": 0,
        # RESP2: no HELLO handshake on connect, so reaching a paused node
        # costs a TCP connect and nothing that waits for its answer.
        "protocol": 2,
        **_NO_SETINFO,
    }


def _redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + netloc).geturl()


@dataclass(frozen=True, slots=True)
class Call:
    """One script call to send to one node."""

    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[str | int, ...]

    def packed(self, *, by_sha: bool = True) -> bytes:
        """The command in Redis protocol: EVALSHA, or EVAL with the source to (re)load it."""
        head: tuple[str | bytes, ...] = (
            ("EVALSHA", self.script.sha) if by_sha else ("EVAL", self.script.source)
        )
        return pack((*head, len(self.keys), *self.keys, *self.args))


@dataclass(frozen=True, slots=True)
class Command:
    """One plain command (``DEL``, ``PING``…) to send to one node."""

    args: tuple[str | int, ...]

    def packed(self) -> bytes:
        """The command in Redis protocol."""
        return pack(self.args)


#: One node's answer: a reply (or ``ResponseError``) per call, or why it failed.
NodeResult = list[Any] | NodeFailure

#: Extra seconds a node gets per command beyond the first in one batch.
PER_CALL_ALLOWANCE = 0.0001

_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_RECV_SIZE = 65536

# Bumped in a forked child, so that a node notices the fork without asking
# for its pid (a system call) on every checkout.
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Link:
    """A connection the fan-out owns.

    redis-py connects it and runs the handshake; the socket is then switched
    to non-blocking mode for good, and the fan-out writes commands to it and
    parses replies from :attr:`buffer` itself.
    """

    __slots__ = ("buffer", "conn", "sock")

    def __init__(self, conn: ConnectionInterface) -> None:
        self.conn = conn
        self.sock: socket.socket | None = None
        self.buffer = bytearray()

    def open(self) -> socket.socket:
        """The connected, non-blocking socket (connecting first if needed)."""
        if self.sock is None:
            self.conn.connect()
            sock = getattr(self.conn, "_sock", None)
            if sock is None:
                raise RedisConnectionError("redis-py opened no socket for this connection")
            sock.settimeout(0)
            self.sock = sock
        return self.sock

    def close(self) -> None:
        """Close the socket; the link connects again when next opened."""
        self.sock = None
        self.buffer.clear()
        self.conn.disconnect()

    def error(self, text: str) -> RedisError:
        """redis-py's exception for an error reply (``NoScriptError`` for NOSCRIPT…)."""
        parser = getattr(self.conn, "_parser", None)
        if parser is None:
            return ResponseError(text)
        error: RedisError = parser.parse_error(text)
        return error


@dataclass(eq=False, slots=True)
class _Exchange:
    """One node's part of a fan-out: what to send, and what came back."""

    index: int
    node: Node
    link: _Link
    payload: bytes
    expected: int
    replies: list[Any] = field(default_factory=list)
    failure: BaseException | None = None

    def receive(self) -> bool:
        """Read what the socket has and parse complete replies; True when all are in."""
        sock = self.link.sock
        assert sock is not None
        buffer = self.link.buffer
        while True:
            try:
                chunk = sock.recv(_RECV_SIZE)
            except _WOULD_BLOCK:
                break
            if not chunk:
                raise RedisConnectionError("the server closed the connection")
            buffer += chunk
            # A TLS socket may hold decrypted bytes that poll cannot see.
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                break
        position = 0
        while len(self.replies) < self.expected:
            reply, end = parse(buffer, position)
            if reply is INCOMPLETE:
                break
            if isinstance(reply, ErrorReply):
                error = self.link.error(reply)
                if not isinstance(error, ResponseError):
                    raise error  # LOADING, NOAUTH…: the node cannot serve us
                reply = error
            self.replies.append(reply)
            position = end
        del buffer[:position]
        return len(self.replies) == self.expected


def fan_out(
    nodes: Sequence[Node], calls: Sequence[Sequence[Call | Command]], timeout: float
) -> list[NodeResult]:
    """Run ``calls[i]`` on ``nodes[i]``, all nodes concurrently, for at most ``timeout``.

    Every node's commands are written before any reply is read; one node's
    several calls travel as one pipeline. A node that has not answered when
    ``timeout`` runs out is reported as a :class:`NodeFailure` and its
    connection is closed, so a late reply can never be read as the answer to
    a later command. A script missing from a node's cache (restart, ``SCRIPT
    FLUSH``) is sent again with EVAL. A ``ResponseError`` (``WRONGTYPE``,
    ``OOM``, ``READONLY``…) is returned in place of that call's reply.
    """
    # Each node usually gets the same calls: pack each call once.
    packed: dict[int, bytes] = {}
    exchanges = []
    for index, (node, node_calls) in enumerate(zip(nodes, calls, strict=True)):
        if not node_calls:
            continue
        parts = []
        for call in node_calls:
            data = packed.get(id(call))
            if data is None:
                data = packed[id(call)] = call.packed()
            parts.append(data)
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        exchanges.append(_Exchange(index, node, node.checkout(), payload, len(node_calls)))
    _close_stale(exchanges)
    # A batch (the heartbeat renewing hundreds of locks) gets time to read its replies.
    batch = max((len(node_calls) for node_calls in calls), default=1)
    _exchange(exchanges, timeout + PER_CALL_ALLOWANCE * (batch - 1))

    reloads = []
    for exchange in exchanges:
        if exchange.failure is not None:
            continue
        scripts = [
            (position, call)
            for position, (call, reply) in enumerate(
                zip(calls[exchange.index], exchange.replies, strict=True)
            )
            if isinstance(reply, NoScriptError) and isinstance(call, Call)
        ]
        if scripts:
            missing = [position for position, _ in scripts]
            payload = b"".join(call.packed(by_sha=False) for _, call in scripts)
            reload = _Exchange(exchange.index, exchange.node, exchange.link, payload, len(missing))
            reloads.append((exchange, missing, reload))
    if reloads:
        _exchange([reload for _, _, reload in reloads], timeout)
        for exchange, missing, reload in reloads:
            exchange.failure = reload.failure
            for position, reply in zip(missing, reload.replies, strict=False):
                exchange.replies[position] = reply

    results: list[NodeResult] = [[] for _ in nodes]
    for exchange in exchanges:
        if exchange.failure is None:
            exchange.node.checkin(exchange.link)
            results[exchange.index] = exchange.replies
        else:
            # A late reply must never be read as the answer to a later command.
            exchange.link.close()
            exchange.node.checkin(exchange.link)
            results[exchange.index] = NodeFailure(exchange.node.name, exchange.failure)
    return results


def _close_stale(exchanges: Sequence[_Exchange]) -> None:
    """Close idle links with something to read: the server closed them or sent unasked data.

    One ``poll`` without waiting covers every node.
    """
    reused = {e.link.sock.fileno(): e.link for e in exchanges if e.link.sock is not None}
    if not reused:
        return
    try:
        stale = _Poller(reused).poll(0)
    except (OSError, ValueError):
        stale = list(reused)
    for fd in stale:
        reused[fd].close()


def _exchange(exchanges: Sequence[_Exchange], timeout: float) -> None:
    """Send every payload, then read every reply, for at most ``timeout`` after the last send."""
    waiting: dict[int, _Exchange] = {}
    for exchange in exchanges:
        try:
            sock = exchange.link.open()
            _send_all(sock, exchange.payload, _clock.monotonic() + timeout)
        except (RedisError, OSError) as exc:
            exchange.failure = exc
            continue
        waiting[sock.fileno()] = exchange
    deadline = _clock.monotonic() + timeout
    # One poll for every node's socket; a node that answers is read while
    # the others' replies are still on the way.
    poller = _Poller(waiting)
    while waiting:
        left = deadline - _clock.monotonic()
        if left <= 0:
            break
        try:
            ready = poller.poll(left)
        except (OSError, ValueError) as exc:
            for exchange in waiting.values():
                exchange.failure = exc
            return
        for fd in ready:
            exchange = waiting[fd]
            try:
                done = exchange.receive()
            except (RedisError, OSError, ProtocolError) as exc:
                exchange.failure = exc
                done = True
            if done:
                poller.forget(fd)
                del waiting[fd]
    for exchange in waiting.values():
        exchange.failure = RedisTimeoutError("no reply within the node timeout")


def _send_all(sock: socket.socket, payload: bytes, deadline: float) -> None:
    view = memoryview(payload)
    while view:
        try:
            sent = sock.send(view)
        except _WOULD_BLOCK:
            sent = 0
        if sent:
            view = view[sent:]
            continue
        left = deadline - _clock.monotonic()
        if left <= 0 or not _Poller([sock.fileno()], writing=True).poll(left):
            raise RedisTimeoutError("could not send within the node timeout")


class _Poller:
    """Waits on many sockets at once, for reading or for writing.

    ``select.poll`` where there is one (it has no FD_SETSIZE limit, which a
    busy worker process can pass), else ``select.select``.
    """

    def __init__(self, fds: Iterable[int], *, writing: bool = False) -> None:
        self._fds = set(fds)
        self._writing = writing
        self._poll = select.poll() if hasattr(select, "poll") else None
        if self._poll is not None:
            events = select.POLLOUT if writing else select.POLLIN | select.POLLPRI
            for fd in self._fds:
                self._poll.register(fd, events)

    def poll(self, seconds: float) -> list[int]:
        """File descriptors ready within ``seconds`` (ready, hung up or in error)."""
        if self._poll is not None:
            return [fd for fd, _ in self._poll.poll(math.ceil(seconds * 1000))]
        watched = list(self._fds)
        readable, writable, errored = select.select(
            [] if self._writing else watched, watched if self._writing else [], watched, seconds
        )
        return list({*readable, *writable, *errored})

    def forget(self, fd: int) -> None:
        """Stop watching ``fd``."""
        self._fds.discard(fd)
        if self._poll is not None:
            self._poll.unregister(fd)
