"""The two transports raced against the lock's own links (see transport_bench.py).

Both are built on redis-py's public connection API and given what the own
links do for a Redlock fan-out, so that the race compares designs, not
features:

* return as soon as the caller's outcome is decided (``enough``: a majority
  granted), leaving the slower nodes' replies owed;
* skip a *suspect* node: one that left a reply unanswered past the node
  timeout is waited for a tenth of it (at least 2 ms), and not at all once
  the outcome is decided, until it answers again;
* connects and logins overlap across nodes (one fan-out waits about one node
  timeout however many nodes are slow);
* a script missing from a node's cache is sent again with its source.

(b) :class:`PerCaller`: each call takes a redis-py connection per node from
that node's pool, sends to all, reads the replies as their sockets become
readable (``select``), and returns the connections. A connection handed back
with a reply still owed is drained by its next user, or closed if the reply
is not there yet.

(c) :class:`ThreadPerNode`: one thread per node owns a redis-py connection;
callers queue their command and wait on an event; the thread sends all that
is queued in one write, reads the replies in order and hands each to its
caller. An unanswered command holds the queue behind it (in order), so the
thread's socket timeout is long, and callers time out on their own.

Neither is fork-safe as written (a pool or thread made before ``fork`` is
not reset), nor speaks to Sentinel or keeps pub/sub: the lock's transport
does both; these measure the hot path only.
"""

from __future__ import annotations

import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.connection import Connection
from redis.exceptions import NoScriptError, RedisError, ResponseError

from celery_redlock.transport.commands import Call, NodeFailure

#: ``enough(replies)``: each node's reply so far (None while it has not answered).
Enough = Callable[[Sequence[Any]], bool]

SUSPECT_SHARE, SUSPECT_MIN = 0.1, 0.002


def _connection_kwargs(url: str, timeout: float) -> dict[str, Any]:
    given = redis.ConnectionPool.from_url(url).connection_kwargs
    kwargs = {key: given.get(key) for key in ("host", "port", "db", "username", "password")}
    # No CLIENT SETINFO on connect: the own links send none either.
    kwargs.update(
        socket_timeout=timeout, socket_connect_timeout=timeout, protocol=2, driver_info=None
    )
    return kwargs


class _Node:
    def __init__(self, url: str, timeout: float) -> None:
        self.kwargs = _connection_kwargs(url, timeout)
        self.pool: list[Connection] = []
        self.lock = threading.Lock()
        self.suspect = False

    def take(self) -> Connection:
        with self.lock:
            if self.pool:
                return self.pool.pop()
        conn = Connection(**self.kwargs)
        conn.owed = 0  # type: ignore[attr-defined]
        return conn

    def give_back(self, conn: Connection) -> None:
        with self.lock:
            self.pool.append(conn)


def _ready(conn: Connection) -> bool:
    """Drain what ``conn`` still owes; False (closed) if a reply is not there yet."""
    try:
        while conn.owed:  # type: ignore[attr-defined]
            if not conn.can_read(timeout=0):
                conn.disconnect()
                conn.owed = 0  # type: ignore[attr-defined]
                return False
            conn.read_response()
            conn.owed -= 1  # type: ignore[attr-defined]
        if conn._sock is not None and conn.can_read(timeout=0):
            conn.disconnect()  # closed by the server, or bytes nobody asked for
    except (RedisError, OSError):
        conn.disconnect()
        conn.owed = 0  # type: ignore[attr-defined]
    return True


class PerCaller:
    """(b) A redis-py connection per node per call, from a per-node pool."""

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.nodes = [_Node(url, timeout) for url in urls]
        self.timeout = timeout

    def _connect(self, conns: list[Connection]) -> list[BaseException | None]:
        """Connect (and log in) those not connected, at the same time, within the node timeout.

        A suspect node is given a tenth of it; a connect still under way then
        is left to finish in its thread and its connection dropped.
        """
        todo = [i for i, conn in enumerate(conns) if conn._sock is None]
        errors: list[BaseException | None] = [None] * len(conns)
        if not todo:
            return errors
        done = [threading.Event() for _ in conns]

        def connect(index: int) -> None:
            try:
                conns[index].connect()
            except (RedisError, OSError) as exc:
                errors[index] = exc
            done[index].set()

        if len(todo) == 1 and not self.nodes[todo[0]].suspect:
            connect(todo[0])
        else:
            for index in todo:
                threading.Thread(target=connect, args=(index,), daemon=True).start()
        start = time.monotonic()
        for index in todo:
            node = self.nodes[index]
            wait = max(SUSPECT_MIN, self.timeout * SUSPECT_SHARE) if node.suspect else self.timeout
            if not done[index].wait(max(0.0, start + wait - time.monotonic())):
                errors[index] = TimeoutError("connect not done in time")
                conns[index] = node.take()  # the one connecting is left to its thread
            if errors[index] is not None:
                node.suspect = True
        return errors

    def fan_out(self, calls: Sequence[Call], enough: Enough) -> list[Any]:
        conns = [node.take() for node in self.nodes]
        for conn in conns:
            _ready(conn)
        results: list[Any] = [None] * len(calls)
        for index, error in enumerate(self._connect(conns)):
            if error is not None:
                results[index] = NodeFailure(str(index), error)
        waiting: dict[int, int] = {}  # fd -> node index
        for index, (conn, call) in enumerate(zip(conns, calls, strict=True)):
            if results[index] is not None:
                continue
            try:
                conn.send_packed_command([call.packed()])
                waiting[conn._sock.fileno()] = index  # type: ignore[union-attr]
            except (RedisError, OSError) as exc:
                results[index] = NodeFailure(str(index), exc)
                conn.disconnect()
        start = time.monotonic()
        deadline = start + self.timeout
        suspect_by = start + max(SUSPECT_MIN, self.timeout * SUSPECT_SHARE)
        while waiting:
            decided = enough(results)
            now = time.monotonic()
            if decided or now >= deadline:
                break
            if all(self.nodes[i].suspect for i in waiting.values()) and now >= suspect_by:
                break
            suspects_only = all(self.nodes[i].suspect for i in waiting.values())
            until = min(deadline, suspect_by) if suspects_only else deadline
            poller = select.poll()
            for fd in waiting:
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(max(0.0, until - now) * 1000):
                index = waiting.pop(fd)
                conn = conns[index]
                try:
                    reply = conn.read_response()
                except NoScriptError:
                    try:
                        conn.send_packed_command([calls[index].packed(by_sha=False)])
                        waiting[fd] = index
                        continue
                    except (RedisError, OSError) as exc:
                        reply = NodeFailure(str(index), exc)
                except ResponseError as exc:
                    reply = exc
                except (RedisError, OSError) as exc:
                    reply = NodeFailure(str(index), exc)
                    conn.disconnect()
                results[index] = reply
                self.nodes[index].suspect = False
        for index in waiting.values():
            conns[index].owed += 1  # type: ignore[attr-defined]
            if time.monotonic() >= deadline:
                self.nodes[index].suspect = True
            results[index] = NodeFailure(str(index), TimeoutError("not waited for"))
        for node, conn in zip(self.nodes, conns, strict=True):
            node.give_back(conn)
        return results

    def close(self) -> None:
        for node in self.nodes:
            for conn in node.pool:
                conn.disconnect()


class _Ask:
    """One caller's fan-out: the replies so far and the event that wakes it."""

    __slots__ = ("done", "enough", "lock", "results")

    def __init__(self, count: int, enough: Enough) -> None:
        self.results: list[Any] = [None] * count
        self.enough = enough
        self.done = threading.Event()
        self.lock = threading.Lock()

    def settle(self, index: int, reply: Any) -> None:
        with self.lock:
            self.results[index] = reply
            if all(r is not None for r in self.results) or self.enough(self.results):
                self.done.set()


class _NodeThread:
    def __init__(self, index: int, url: str, timeout: float) -> None:
        self.index = index
        # The thread waits on a reply as long as it takes: the queue stays in order.
        self.conn = Connection(**{**_connection_kwargs(url, timeout), "socket_timeout": 30})
        self.queue: deque[tuple[Call, _Ask]] = deque()
        self.wake = threading.Condition()
        self.busy_since: float | None = None
        self.timeout = timeout
        self.running = True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    @property
    def suspect(self) -> bool:
        busy = self.busy_since
        return busy is not None and time.monotonic() - busy > self.timeout

    def put(self, call: Call, ask: _Ask) -> None:
        with self.wake:
            self.queue.append((call, ask))
            self.wake.notify()

    def loop(self) -> None:
        while self.running:
            with self.wake:
                while not self.queue and self.running:
                    self.wake.wait()
                batch = list(self.queue)
                self.queue.clear()
            if not batch:
                continue
            self.busy_since = time.monotonic()
            try:
                self.conn.send_packed_command([call.packed() for call, _ in batch])
                for call, ask in batch:
                    try:
                        reply = self.conn.read_response()
                    except NoScriptError:
                        self.conn.send_packed_command([call.packed(by_sha=False)])
                        reply = self.conn.read_response()
                    except ResponseError as exc:
                        reply = exc
                    ask.settle(self.index, reply)
            except (RedisError, OSError) as exc:
                self.conn.disconnect()
                for _, ask in batch:
                    if ask.results[self.index] is None:
                        ask.settle(self.index, NodeFailure(str(self.index), exc))
            self.busy_since = None

    def stop(self) -> None:
        with self.wake:
            self.running = False
            self.wake.notify()
        self.thread.join(timeout=1)
        self.conn.disconnect()


class ThreadPerNode:
    """(c) One thread per node owning a redis-py connection, pipelining what callers queue."""

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.nodes = [_NodeThread(i, url, timeout) for i, url in enumerate(urls)]
        self.timeout = timeout

    def fan_out(self, calls: Sequence[Call], enough: Enough) -> list[Any]:
        ask = _Ask(len(calls), enough)
        for node, call in zip(self.nodes, calls, strict=True):
            node.put(call, ask)
        now = start = time.monotonic()
        deadline = start + self.timeout
        suspect_by = start + max(SUSPECT_MIN, self.timeout * SUSPECT_SHARE)
        while not ask.done.wait(max(0.0, (suspect_by if now < suspect_by else deadline) - now)):
            now = time.monotonic()
            if now >= deadline:
                break
            unanswered = [
                node for node, r in zip(self.nodes, ask.results, strict=True) if r is None
            ]
            if now >= suspect_by and all(node.suspect for node in unanswered):
                break
        with ask.lock:
            results = list(ask.results)
            ask.enough = lambda _: False
            ask.results = [True] * len(calls)  # late replies no longer settle anything
        return [
            NodeFailure(str(i), TimeoutError("not waited for")) if r is None else r
            for i, r in enumerate(results)
        ]

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
