"""The nemesis: a thread of the test process that breaks lock nodes and freezes clients.

Node faults, at most ``max_faulty`` nodes at a time (a minority):

* ``kill-restart`` -- SIGKILL a node; after a delay longer than the ttl it
  starts again *empty*, as a node without persistence comes back. The delay
  is the Redlock paper's "delayed restart": restarting at once is unsafe (see
  docs/reliability.md and test_limits.py).
* ``pause`` -- SIGSTOP a node for up to twice the ttl, then SIGCONT: it keeps
  its connections and its data but answers nothing meanwhile.
* ``script-flush`` -- SCRIPT FLUSH on a node: the next EVALSHA meets NOSCRIPT.
* ``stale-key`` -- a node answers without granting: it holds a key of an
  earlier owner whose release never reached it (``SET NX PX``, 0.5-2 times
  the ttl; never over a holder's key).
* ``fence-expire`` -- while a client holds the lock for longer than its ttl
  (renewing it), the key's fencing bucket expires on every node, as a
  ``fence_ttl`` shorter than the hold would make it. Once per long hold,
  when every node is up.

Client fault:

* ``client-pause`` -- the "GC pause": a client is frozen with SIGSTOP in the
  middle of its critical section, after it took the lock and before it
  writes to the fencing store, for 2-3 times the ttl. Its lock expires, a
  newer holder writes, and its own write, when it wakes, carries a stale
  token. To catch a client at that point, the nemesis hands out a ticket;
  the client that takes it runs a long computation in its next section, and
  the nemesis freezes it there.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from celery_redlock.testing import RedisServer

from .history import PAUSE_TICKET

KILL_RESTART, PAUSE, SCRIPT_FLUSH, STALE_KEY, FENCE_EXPIRE, CLIENT_PAUSE = (
    "kill-restart",
    "pause",
    "script-flush",
    "stale-key",
    "fence-expire",
    "client-pause",
)
NODE_FAULTS = (KILL_RESTART, PAUSE, SCRIPT_FLUSH, STALE_KEY)
#: How often each node fault is chosen, relative to the others.
NODE_FAULT_WEIGHTS = (4, 4, 1, 3)
#: Faults that take a node out for a while (what "node faults" counts).
OUTAGES = (KILL_RESTART, PAUSE)


@dataclass
class Event:
    """One fault: what, on which node or client, and when (monotonic clock)."""

    kind: str
    target: str
    began: float
    ended: float | None = None
    note: str = ""


@dataclass
class _Active:
    event: Event
    server: RedisServer
    until: float


class Nemesis(threading.Thread):
    """Injects faults until :meth:`stop`; then heals everything it broke.

    Args:
        nodes: the lock's nodes (never the witness).
        witness: a client of the witness node, for the pause ticket.
        lock_key: the Redis key of the lock the clients fight for.
        fence_key: its fencing bucket.
        ttl: the clients' lock ttl, seconds; fault durations scale with it.
        max_faulty: most nodes out at once; keep it a minority.
        gap: seconds between one node fault and the next, as a (low, high) range.
        client_pause_every: seconds between client pauses, as a (low, high) range.
        pause_request: shared flag (a ``multiprocessing`` RawValue) raised when
            a ticket is out.
        victim: shared slot where the client that took the ticket writes its pid.
        long_hold: shared counter a client raises when it starts a long hold
            and lowers (to even) when it ends.
        seed: for the random choices, so a run can be repeated.
    """

    def __init__(
        self,
        nodes: Sequence[RedisServer],
        witness: redis.Redis,
        *,
        lock_key: str,
        fence_key: str,
        ttl: float,
        max_faulty: int,
        pause_request: Any,
        victim: Any,
        long_hold: Any,
        gap: tuple[float, float] = (0.1, 0.5),
        client_pause_every: tuple[float, float] = (2.0, 4.0),
        seed: int = 0,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.nodes = list(nodes)
        self.witness = witness
        self.lock_key = lock_key
        self.fence_key = fence_key
        self.ttl = ttl
        self.max_faulty = max_faulty
        self.gap = gap
        self.client_pause_every = client_pause_every
        self.pause_request = pause_request
        self.victim = victim
        self.long_hold = long_hold
        self._expired_in_hold = 0
        self.random = random.Random(seed)
        self.events: list[Event] = []
        self.problems: list[str] = []
        self._halt = threading.Event()
        self._active: list[_Active] = []
        self._frozen: tuple[Event, int, float] | None = None
        self._ticket_out_since: float | None = None

    # -- figures ----------------------------------------------------------------

    def counts(self) -> Counter[str]:
        return Counter(event.kind for event in self.events)

    def node_faults(self) -> int:
        return sum(1 for event in self.events if event.kind in OUTAGES)

    # -- thread -----------------------------------------------------------------

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        now = time.monotonic()
        next_node_fault = now + self.random.uniform(*self.gap)
        next_client_pause = now + self.random.uniform(*self.client_pause_every)
        try:
            while not self._halt.wait(0.001):
                now = time.monotonic()
                self._end_node_faults(now)
                self._expire_fences_in_long_hold(now)
                if now >= next_node_fault and len(self._active) < self.max_faulty:
                    self._node_fault(now)
                    next_node_fault = time.monotonic() + self.random.uniform(*self.gap)
                if self._frozen is None and self._ticket_out_since is None:
                    if now >= next_client_pause:
                        self._hand_out_ticket(now)
                elif self._frozen is None:
                    self._freeze_victim(now)
                elif now >= self._frozen[2]:
                    self._thaw()
                    next_client_pause = time.monotonic() + self.random.uniform(
                        *self.client_pause_every
                    )
        except Exception as exc:  # reported by the driver, which fails the run
            self.problems.append(f"nemesis crashed: {exc!r}")
        finally:
            self._heal()

    # -- node faults --------------------------------------------------------------

    def _node_fault(self, now: float) -> None:
        busy = {active.server for active in self._active}
        healthy = [server for server in self.nodes if server not in busy]
        server = self.random.choice(healthy)
        kind = self.random.choices(NODE_FAULTS, weights=NODE_FAULT_WEIGHTS)[0]
        event = Event(kind, f"node:{server.port}", now)
        if kind == STALE_KEY:
            stale_for = self.ttl * self.random.uniform(0.5, 2.0)
            with contextlib.closing(server.client(socket_timeout=5)) as client:
                # Between two holders the key is absent for a moment: catch it.
                for _ in range(500):
                    if client.set(self.lock_key, "stale-owner", nx=True, px=int(stale_for * 1000)):
                        break
                else:
                    return  # held all along: try again at the next fault
            self.events.append(event)
            self._active.append(_Active(event, server, now + stale_for))
            return
        self.events.append(event)
        if kind == KILL_RESTART:
            server.kill()
            # Back empty only after every lock it may have held has expired:
            # counted from the kill itself, not from ``now``, which a loaded
            # machine (a node restarted just before, in the same round) can
            # leave far behind (the Redlock paper's delayed restart).
            down_for = self.ttl * self.random.uniform(1.2, 2.0)
            self._active.append(_Active(event, server, time.monotonic() + down_for))
        elif kind == PAUSE:
            server.pause()
            self._active.append(
                _Active(event, server, now + self.ttl * self.random.uniform(0.1, 2.0))
            )
        else:
            with contextlib.closing(server.client(socket_timeout=5)) as client:
                client.script_flush()
            event.ended = time.monotonic()

    def _expire_fences_in_long_hold(self, now: float) -> None:
        hold = self.long_hold.value
        if hold % 2 == 0 or hold == self._expired_in_hold:
            return  # no long hold going on, or this one had its expiry
        if any(not node.running or node.paused for node in self.nodes):
            return
        self._expired_in_hold = hold
        for node in self.nodes:
            with contextlib.closing(node.client(socket_timeout=5)) as client:
                client.delete(self.fence_key)  # what its expiry does
        self.events.append(Event(FENCE_EXPIRE, "every node", now, time.monotonic()))

    def _end_node_faults(self, now: float) -> None:
        for active in list(self._active):
            if now < active.until:
                continue
            self._end(active)

    def _end(self, active: _Active) -> None:
        server, event = active.server, active.event
        if event.kind == KILL_RESTART:
            port = server.port
            server.start()
            if server.port != port:
                self.problems.append(f"node {port} came back on port {server.port}")
        elif event.kind == PAUSE:
            server.resume()
        event.ended = time.monotonic()
        self._active.remove(active)

    # -- client pauses ------------------------------------------------------------

    def _hand_out_ticket(self, now: float) -> None:
        self.victim.value = 0
        self.witness.set(PAUSE_TICKET, 1)
        self.pause_request.value = 1
        self._ticket_out_since = now

    def _freeze_victim(self, now: float) -> None:
        pid = self.victim.value
        if pid == 0:
            if self._ticket_out_since is not None and now - self._ticket_out_since > 5.0:
                # Nobody got the lock in time to take it (the nodes are busy failing).
                self.pause_request.value = 0
                self.witness.delete(PAUSE_TICKET)
                self._ticket_out_since = None
            return
        os.kill(pid, signal.SIGSTOP)
        began = time.monotonic()
        time.sleep(0.005)
        # The victim clears the slot when its long computation ends: if it is
        # still set, the process froze inside the section, before its write.
        note = "inside its critical section" if self.victim.value == pid else "after its section"
        event = Event(CLIENT_PAUSE, f"pid:{pid}", began, note=note)
        self.events.append(event)
        self._ticket_out_since = None
        self._frozen = (event, pid, began + self.ttl * self.random.uniform(2.0, 3.0))

    def _thaw(self) -> None:
        assert self._frozen is not None
        event, pid, _ = self._frozen
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        event.ended = time.monotonic()
        self._frozen = None

    def _heal(self) -> None:
        if self._frozen is not None:
            self._thaw()
        self.pause_request.value = 0
        for active in list(self._active):
            try:
                self._end(active)
            except Exception as exc:
                self.problems.append(f"could not heal {active.event.target}: {exc!r}")
