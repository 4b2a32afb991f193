"""One connection to one node: a non-blocking FIFO pipeline shared by every caller.

Connect and TLS (over memory BIOs) never block; login commands are queued ahead of the first
command without waiting. Each reply goes to the oldest waiting :class:`Slot`; a caller that
stops waiting leaves its slot in place, so a late reply is dropped, never read as the answer to
a later command. Every method runs under the fan-out's lock (:mod:`.fanout`).
"""

from __future__ import annotations

import collections
import errno
import os
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .endpoint import Endpoint
from .error_replies import LinkBroken, error_reply
from .resp import INCOMPLETE, ErrorReply, ProtocolError, pack, parse

__all__ = ["POLLIN", "POLLOUT", "Link", "Slot"]

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
_WOULD_BLOCK = (BlockingIOError, InterruptedError)
_RECV_SIZE = 256 * 1024
_SEND_SIZE = 256 * 1024


class Target(Protocol):
    """Who gets the replies of a slot."""

    def deliver(self, link: Link, replies: list[Any]) -> None:
        """All ``count`` replies (error replies as exceptions)."""

    def fail(self, cause: BaseException) -> None:
        """The link broke before they did."""


class Slot:
    """A place in a link's FIFO for ``count`` replies, with who wants them."""

    __slots__ = ("count", "replies", "sent", "target")

    def __init__(self, count: int, target: Target | None) -> None:
        self.count = count
        self.target = target  # None: nobody waits (the replies are dropped)
        self.replies: list[Any] = []
        self.sent = time.monotonic()


class _Login:
    """The replies to the login commands: any error closes the link with it."""

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands

    def deliver(self, link: Link, replies: list[Any]) -> None:
        for command, reply in zip(self.commands, replies, strict=True):
            if isinstance(reply, Exception):
                cause = reply if command == "AUTH" else ResponseError(f"{command}: {reply}")
                raise LinkBroken(cause)

    def fail(self, cause: BaseException) -> None:
        pass


class Link:
    """One connection to a node.

    ``scripts`` holds the SHA1s whose ``EVAL`` was queued here: later calls may use ``EVALSHA``,
    since the FIFO keeps them behind it. Emptied on close.
    """

    def __init__(
        self, endpoint: Endpoint, on_reply: Callable[[], None], role: str = "interactive"
    ) -> None:
        self.endpoint = endpoint
        self.role = role
        self.last_error: BaseException | None = None
        self._on_reply = on_reply
        self.sock: socket.socket | None = None
        self.fd = -1
        self.connecting = False
        self.out = bytearray()
        self.inbuf = bytearray()
        self.pending: collections.deque[Slot] = collections.deque()
        self.scripts: set[str] = set()
        self.last_used = time.monotonic()
        self.last_reply = 0.0
        # TLS over memory BIOs: the socket carries ciphertext only.
        self._tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None
        self._tls_out: ssl.MemoryBIO | None = None
        self._handshaking = False
        self._raw_out = bytearray()
        self._addresses: list[Any] = []
        # Set while bytes move between buffer and socket: an exception escaping then
        # (KeyboardInterrupt, GreenletExit) may tear the stream, so the link must close.
        self.dirty = False

    @property
    def open(self) -> bool:
        """True once the socket exists (connecting or connected)."""
        return self.sock is not None

    @property
    def unsent(self) -> bool:
        """True while queued bytes have not all reached the socket (connecting, buffer full)."""
        return self.sock is not None and bool(
            self.connecting or self._handshaking or self.out or self._raw_out
        )

    # -- queueing -------------------------------------------------------------------

    def queue(self, payload: bytes, slot: Slot) -> None:
        """Append commands and their slot; opens the connection first if needed."""
        if self.sock is None:
            self._connect()
        self.out += payload
        self.pending.append(slot)
        self.last_used = time.monotonic()

    def events(self) -> int:
        """What to poll this link's socket for."""
        if self.connecting:
            return POLLOUT
        wanted = POLLIN
        if self._raw_out or (self.out and not self._handshaking):
            wanted |= POLLOUT
        return wanted

    # -- connecting -------------------------------------------------------------------

    def _connect(self) -> None:
        endpoint = self.endpoint
        if endpoint.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = endpoint.path
        else:
            if not self._addresses:
                assert endpoint.host is not None
                try:
                    found = socket.getaddrinfo(
                        endpoint.host, endpoint.port, type=socket.SOCK_STREAM
                    )
                except OSError as exc:
                    raise LinkBroken(
                        RedisConnectionError(f"cannot resolve {endpoint.host}: {exc}")
                    ) from exc
                self._addresses = [(family, sockaddr) for family, _, _, _, sockaddr in found]
            family, address = self._addresses[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.sock, self.fd, self.connecting = sock, sock.fileno(), True
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            self._addresses = self._addresses[1:]
            raise LinkBroken(RedisConnectionError(_connect_error(endpoint, code)))
        self._queue_login()
        if code == 0:
            self._connected()

    def _queue_login(self) -> None:
        endpoint = self.endpoint
        commands: list[tuple[str | int, ...]] = []
        username, password = endpoint.credentials()
        if password is not None:
            commands.append(("AUTH", username, password) if username else ("AUTH", password))
        if endpoint.db:
            commands.append(("SELECT", endpoint.db))
        if endpoint.client_name:
            commands.append(("CLIENT", "SETNAME", endpoint.client_name))
        if commands:
            self.out += b"".join(pack(command) for command in commands)
            names = [str(command[0]) for command in commands]
            self.pending.append(Slot(len(commands), _Login(names)))

    def _connected(self) -> None:
        self.connecting = False
        if self.endpoint.tls is not None:
            try:
                context = self.endpoint.ssl_context()
                self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
                self._tls = context.wrap_bio(
                    self._tls_in, self._tls_out, server_hostname=self.endpoint.host
                )
            except (OSError, ValueError) as exc:  # never a plain connection in its place
                raise LinkBroken(RedisConnectionError(f"TLS setup failed: {exc}")) from exc
            self._handshaking = True
            self._handshake()

    def _handshake(self) -> None:
        assert self._tls is not None
        assert self._tls_out is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            self._handshaking = False
        self._raw_out += self._tls_out.read()

    # -- I/O, called when the socket is ready ------------------------------------------

    def on_writable(self) -> None:
        """Finish connecting, or write what is queued."""
        sock = self.sock
        assert sock is not None
        if self.connecting:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self._addresses = self._addresses[1:]
                raise LinkBroken(RedisConnectionError(_connect_error(self.endpoint, code)))
            self._connected()
        self.flush()

    def flush(self) -> None:
        """Write as much of :attr:`out` as the socket takes now."""
        sock = self.sock
        if sock is None or self.connecting:
            return
        if self._tls is not None:
            if self._handshaking:
                self._send(sock, self._raw_out)
                return
            if self.out:
                assert self._tls_out is not None
                self.dirty = True
                written = self._tls.write(self.out)
                del self.out[:written]
                self._raw_out += self._tls_out.read()
                self.dirty = False
            self._send(sock, self._raw_out)
            return
        self._send(sock, self.out)

    def _send(self, sock: socket.socket, raw: bytearray) -> None:
        """Send from ``raw`` (the plain queue, or TLS records) until the socket is full."""
        while raw:
            self.dirty = True
            try:
                sent = sock.send(raw[:_SEND_SIZE] if len(raw) > _SEND_SIZE else raw)
            except _WOULD_BLOCK:
                self.dirty = False
                return
            except OSError as exc:
                raise LinkBroken(RedisConnectionError(f"write failed: {exc}")) from exc
            del raw[:sent]
            self.dirty = False

    def receive(self) -> None:
        """Read what the socket has into :attr:`inbuf` (decrypting TLS)."""
        sock = self.sock
        assert sock is not None
        self.dirty = True
        try:
            chunk = sock.recv(_RECV_SIZE)
        except _WOULD_BLOCK:
            self.dirty = False
            return
        except OSError as exc:
            raise LinkBroken(RedisConnectionError(f"read failed: {exc}")) from exc
        if not chunk:
            raise LinkBroken(RedisConnectionError("the server closed the connection"))
        if self._tls is None:
            self.inbuf += chunk
            self.dirty = False
            return
        assert self._tls_in is not None
        assert self._tls_out is not None
        self._tls_in.write(chunk)
        if self._handshaking:
            try:
                self._handshake()
            except ssl.SSLError as exc:
                raise LinkBroken(RedisConnectionError(f"TLS handshake failed: {exc}")) from exc
        while not self._handshaking:
            try:
                data = self._tls.read(_RECV_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError as exc:
                raise LinkBroken(RedisConnectionError("the server closed the connection")) from exc
            except ssl.SSLError as exc:
                raise LinkBroken(RedisConnectionError(f"TLS error: {exc}")) from exc
            if not data:
                raise LinkBroken(RedisConnectionError("the server closed the connection"))
            self.inbuf += data
        self._raw_out += self._tls_out.read()
        self.dirty = False
        if not self._handshaking and (self.out or self._raw_out):
            self.flush()

    def dispatch(self, budget: int) -> bool:
        """Hand up to ``budget`` complete replies to their slots; True if more are ready."""
        buffer = self.inbuf
        position = 0
        pending = self.pending
        parsed = 0
        self.dirty = True
        try:
            while parsed < budget:
                try:
                    reply, end = parse(buffer, position)
                except ProtocolError as exc:
                    raise LinkBroken(RedisConnectionError(f"protocol error: {exc}")) from exc
                if reply is INCOMPLETE:
                    break
                if not pending:
                    raise LinkBroken(
                        RedisConnectionError("the server sent a reply nobody asked for")
                    )
                position = end
                parsed += 1
                if isinstance(reply, ErrorReply):
                    reply = error_reply(reply)
                slot = pending[0]
                slot.replies.append(reply)
                if len(slot.replies) == slot.count:
                    pending.popleft()
                    self.last_reply = time.monotonic()
                    self._on_reply()
                    if slot.target is not None:
                        slot.target.deliver(self, slot.replies)
        finally:
            del buffer[:position]
            self.dirty = False
        return parsed == budget and bool(buffer)

    # -- closing -------------------------------------------------------------------------

    def close(self, cause: BaseException) -> None:
        """Close the socket and tell every waiting slot the link broke with ``cause``."""
        self.last_error = cause
        sock, self.sock, self.fd = self.sock, None, -1
        self.connecting = self._handshaking = self.dirty = False
        self._tls = self._tls_in = self._tls_out = None
        self.out.clear()
        self.inbuf.clear()
        self._raw_out.clear()
        self.scripts.clear()
        pending, self.pending = self.pending, collections.deque()
        if sock is not None:
            sock.close()
        for slot in pending:
            if slot.target is not None:
                slot.target.fail(cause)

    def drop(self) -> None:
        """Forget the socket without telling anyone (a forked child's copy)."""
        sock, self.sock, self.fd = self.sock, None, -1
        self.pending = collections.deque()
        self.out.clear()
        self.inbuf.clear()
        self._raw_out.clear()
        self.scripts.clear()
        self._tls = self._tls_in = self._tls_out = None
        self.connecting = self._handshaking = False
        if sock is not None:
            sock.close()


def _connect_error(endpoint: Endpoint, code: int) -> str:
    where = endpoint.path or f"{endpoint.host}:{endpoint.port}"
    return f"cannot connect to {where}: {os.strerror(code)}"
