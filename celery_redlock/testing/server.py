"""Throw-away server processes that a test controls: kill, pause, resume, restart empty.

Each :class:`RedisServer` is a real server on a free 127.0.0.1 port, without persistence, so a
restart comes back empty as a crashed node would::

    with RedisServer.start_many(3) as servers:
        redlock = Redlock([server.url for server in servers])
        servers[0].pause()
        ...
"""

from __future__ import annotations

import contextlib
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
from redis.backoff import NoBackoff
from redis.retry import Retry

from .binaries import ServerBuild, find_redis_server, server_build

__all__ = ["RedisServer", "ServerGroup", "ServerStartError", "free_port"]


class ServerStartError(RuntimeError):
    """A server process exited, or did not answer, during start-up.

    Attributes:
        output: what it printed and logged (its start-up errors included).
    """

    def __init__(self, message: str, *, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 that the caller controls."""

    def __init__(
        self,
        port: int | None = None,
        *,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        #: The executable: ``binary``, else ``$REDIS_SERVER``'s choice (:func:`find_redis_server`).
        self.binary = find_redis_server(binary)
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
    def build(self) -> ServerBuild:
        """What the binary is: product, version, TLS support."""
        return server_build(self.binary)

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
            # Errors in the arguments are printed before the log file opens.
            with open(self._output_path, "wb") as output:
                self._process = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._wait_ready(timeout):
                self.paused = False
                return self
            exit_status = self._process.poll()
            tail = self.log_tail()
            self._terminate()
            if attempt < 2:
                # Someone else took the port between free_port() and bind().
                self.port = free_port()
                self.url = f"redis://127.0.0.1:{self.port}/0"
                args[2] = str(self.port)
        state = "did not answer" if exit_status is None else f"exited with status {exit_status}"
        raise ServerStartError(
            f"{self.binary} {state} on start-up (port {self.port}):\n{tail}", output=tail
        )

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        # No redis-py retries: its backoff sleeps seconds where this loop polls every 10 ms.
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
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

    @property
    def _output_path(self) -> Path:
        return Path(self._dir, "output.log")

    def log_tail(self, lines: int = 20) -> str:
        """What the process printed (start-up errors), then the end of its log file."""
        parts = []
        for path in (self._output_path, Path(self._dir, "redis.log")):
            if path.exists():
                text = path.read_text(errors="replace").strip()
                if text:
                    parts.append("\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(it printed and logged nothing)"

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
