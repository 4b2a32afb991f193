"""Helpers shared by the test modules of every tier (the worker tier adds its own support)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_redlock import Redlock
from celery_redlock.testing import RedisServer, free_port

TOPOLOGIES = [
    pytest.param((1, 0), id="1-node"),
    pytest.param((3, 0), id="3-nodes"),
    pytest.param((5, 0), id="5-nodes"),
    pytest.param((3, 1), id="3-nodes-1-down"),
]

#: Run a test on every node topology: ``def test_x(topology): ...``
all_topologies = pytest.mark.parametrize("topology", TOPOLOGIES, indirect=True)


def with_node_timeout(make: Callable[..., Redlock], node_timeout: float) -> Callable[..., Redlock]:
    """``make`` (the ``make_redlock`` fixture) with ``node_timeout`` unless a call gives one.

    For tests about what the lock does with an input, not about timing: on a
    machine running several test processes on two cores, a call can miss the
    50 ms default by scheduling delay alone.
    """

    def made(nodes: list[str] | list[RedisServer], **kwargs: object) -> Redlock:
        kwargs.setdefault("node_timeout", node_timeout)
        return make(nodes, **kwargs)

    return made


def landed_everywhere(redlock: Redlock, *names: str, timeout: float = 5.0) -> None:
    """Wait until every node of ``redlock`` holds the same value for each of ``names``.

    acquire() returns once a majority granted, so the last node's write may
    still be on its way (or not yet sent, its link still connecting). Each
    :meth:`Redlock.inspect` drives the links, so the write lands while we wait.
    """
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            seen = redlock.inspect(name)
            values = [entry[0] if isinstance(entry, tuple) else None for entry in seen]
            if values[0] is not None and values.count(values[0]) == len(values):
                break
            assert time.monotonic() < deadline, f"{name!r} not on every node: {seen}"
            time.sleep(0.01)


def count_fan_outs(
    monkeypatch: pytest.MonkeyPatch, *, this_thread: bool = False
) -> list[list[int]]:
    """Record, for each renewal fan-out from now on, the number of calls sent to each node.

    ``this_thread``: only those the calling thread makes (not the process heartbeat's rounds,
    which renew every auto-renewed lease a test holds whenever a round falls due).
    """
    from celery_redlock.lock import renewal_batch

    fan_outs: list[list[int]] = []
    real_fan_out = renewal_batch.fan_out
    counted = threading.current_thread() if this_thread else None

    def counting_fan_out(nodes: Any, calls: Any, timeout: float, **options: Any) -> Any:
        if counted is None or threading.current_thread() is counted:
            fan_outs.append([len(node_calls) for node_calls in calls])
        return real_fan_out(nodes, calls, timeout, **options)

    monkeypatch.setattr(renewal_batch, "fan_out", counting_fan_out)
    return fan_outs


def script_runs(server: RedisServer) -> int:
    """How many script calls (EVAL or EVALSHA) ``server`` has run (its ``INFO commandstats``).

    A connection sends a script's source (EVAL) the first time it calls it,
    EVALSHA afterwards.
    """
    with server.client() as client:
        stats = client.info("commandstats")
    names = ("cmdstat_eval", "cmdstat_evalsha")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in names)


def wait_for_script_runs(server: RedisServer, count: int, what: str) -> None:
    """Wait (up to 10 s) until ``server`` has run ``count`` script calls (:func:`script_runs`)."""
    deadline = time.monotonic() + 10.0
    while script_runs(server) < count:
        assert time.monotonic() < deadline, f"{server.url} never ran {what}"
        time.sleep(0.01)


def heard_from(lacking: RedisServer, holder: RedisServer, extend: Callable[[], Any]) -> None:
    """Run ``extend`` (a lock's or semaphore's) so that it hears ``lacking``'s answer.

    ``extend()`` returns once a majority confirmed, waiting only a moment more
    for the other nodes, and puts a copy back only on the nodes it heard
    without one. ``holder`` (a node holding the key) is paused until
    ``lacking`` has run its call: the majority waits for ``holder``, and
    ``lacking``'s answer is in by then. The node timeout must outlast the pause.
    """
    before = script_runs(lacking)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            extend()
        except BaseException as exc:  # re-raised below, in the test's thread
            raised.append(exc)

    thread = threading.Thread(target=run)
    holder.pause()
    try:
        thread.start()
        deadline = time.monotonic() + 10.0
        while script_runs(lacking) == before:
            assert time.monotonic() < deadline, "the extend never reached the node lacking the key"
            time.sleep(0.002)
    finally:
        holder.resume()
    thread.join()
    if raised:
        raise raised[0]


def self_signed_certificate(folder: Path) -> tuple[Path, Path] | None:
    """A certificate and key for 127.0.0.1 in ``folder``; ``None`` without openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = folder / "server.pem", folder / "server.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def connections(server: RedisServer) -> int:
    """Client connections ``server`` has open, not counting the one asking."""
    with server.client() as client:
        return len(client.client_list()) - 1


def client_addresses(server: RedisServer) -> set[str]:
    """The addresses of the clients connected to ``server``, not counting the one asking.

    The pool servers live for the whole session: compare against the set taken
    before a test's own connections, so that another test's are not counted.
    """
    with server.client() as client:
        me = client.client_id()
        return {entry["addr"] for entry in client.client_list() if int(entry["id"]) != me}


class SentinelGroup:
    """A Sentinel-managed master: a master, a replica and one Sentinel, all throw-away.

    The Sentinel watches the master as ``master_name`` with a quorum of one
    and declares it down after ``down_after`` seconds without an answer, so
    a killed master is failed over within a few seconds.
    """

    def __init__(self, master_name: str = "locks", down_after: float = 0.5) -> None:
        self.master_name = master_name
        # No 5 s wait before the replica's first sync.
        self.master = RedisServer(extra_args=("--repl-diskless-sync-delay", "0")).start()
        self.replica = RedisServer(
            extra_args=("--replicaof", "127.0.0.1", str(self.master.port))
        ).start()
        self.port = free_port()
        self._dir = tempfile.mkdtemp(prefix=f"sentinel-{self.port}-")
        config = Path(self._dir, "sentinel.conf")
        config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            "daemonize no\n"
            f"dir {self._dir}\n"
            f"logfile {self._dir}/sentinel.log\n"
            f"sentinel monitor {master_name} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {master_name} {int(down_after * 1000)}\n"
            f"sentinel failover-timeout {master_name} 5000\n"
        )
        self.process = subprocess.Popen(
            [self.master.binary, str(config), "--sentinel"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.master_address() == ("127.0.0.1", self.master.port) and all(
                    replica.get("master-link-status") == "ok" for replica in self.replicas() or [{}]
                ):
                    break
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the Sentinel did not come up watching its master and replica")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        """The node URL for this master, in kombu's Sentinel syntax."""
        return f"sentinel://127.0.0.1:{self.port}/0?master_name={self.master_name}"

    def master_address(self) -> tuple[str, int] | None:
        """Where the Sentinel says the master is."""
        found = self.client.sentinel_get_master_addr_by_name(self.master_name)
        if not found:
            return None
        host = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
        return host, int(found[1])

    def replicas(self) -> list[dict[str, object]]:
        """The replicas the Sentinel knows, as ``SENTINEL REPLICAS`` gives them."""
        return list(self.client.sentinel_slaves(self.master_name))

    def stop(self) -> None:
        """Stop the Sentinel and both servers, and remove their files."""
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.replica.cleanup()
        self.master.cleanup()
        shutil.rmtree(self._dir, ignore_errors=True)


#: Run by :func:`acquire_in_a_process_that_dies`: take one lease, wait until its calls are on
#: their way to every node, print its value, and end without releasing it.
_ACQUIRE_AND_DIE = """
import os, sys, time
from celery_redlock import Redlock
kind, name, owner, *urls = sys.argv[1:]
redlock = Redlock(urls, node_timeout=0.5)
if kind == "lock":
    lease = redlock.lock(name, ttl=30.0, owner=owner)
else:
    lease = redlock.semaphore(name, limit=2, ttl=30.0, owner=owner)
assert lease.acquire(blocking=False)
deadline = time.monotonic() + 5.0
while any(node.link().unsent for node in redlock.nodes):
    assert time.monotonic() < deadline, "the calls never left"
    time.sleep(0.01)
print(lease.value, getattr(lease, "slot", ""), flush=True)
os._exit(0)  # a task process killed: no release, no goodbye
"""


def acquire_in_a_process_that_dies(
    kind: str, name: str, owner: str, nodes: list[RedisServer]
) -> tuple[str, str]:
    """A separate process takes a ``kind`` ("lock" or "semaphore") and dies holding it.

    Returns the lease's value and (for a semaphore) its slot, as the process printed them.
    """
    done = subprocess.run(
        [sys.executable, "-c", _ACQUIRE_AND_DIE, kind, name, owner, *(n.url for n in nodes)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"the task process failed: {done.stderr}"
    value, _, slot = done.stdout.strip().partition(" ")
    return value, slot
