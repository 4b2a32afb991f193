"""Runs a fault run: client processes on one lock key, a nemesis, then the checker.

Each client process loops: acquire the lock, run a critical section that
writes to the fencing store with the lock's token, release, and record the
section. Every few seconds the first client holds the lock for more than a
ttl instead, extending it every third of a ttl, before it writes. The
nemesis meanwhile kills, pauses and restarts the lock's nodes, plants stale
keys, expires fencing buckets and freezes clients. The run lasts at least
``seconds`` and goes on (up to ``max_seconds``) until it has the sections,
the node faults and each kind of fault it was asked for (the nemesis draws
them at random: a fence expiry, say, needs a long hold while every node is up).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from celery_redlock import Redlock, errors
from celery_redlock.testing import RedisServer

from .checker import Report, check
from .history import COUNTERS, ERRORS, HISTORY, PAUSE_TICKET, FencedStore, Section, read_history
from .nemesis import OUTAGES, Nemesis

#: The one key every client fights for.
KEY = "faults:shared"
#: How long a "slow" section computes; the nemesis freezes it meanwhile.
SLOW_SECTION = 0.1
#: Records a client keeps before pushing them to the witness in one go.
BATCH = 50
#: Seconds between two long holds of client 0, as a (low, high) range.
LONG_HOLD_EVERY = (3.0, 6.0)
#: Renewals (each after a third of the ttl) in a long hold.
LONG_HOLD_RENEWALS = 4


def _soak_seconds() -> float:
    raw = os.environ.get("FAULTS_SOAK", "").strip()
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise ValueError(f"FAULTS_SOAK must be a number of seconds, got {raw!r}") from None


#: Seconds each soak run lasts (``FAULTS_SOAK``); 0 when no soak was asked for.
SOAK = _soak_seconds()


@dataclass
class FaultRun:
    """What to run, and for how long."""

    name: str
    nodes: Sequence[RedisServer]
    witness: RedisServer
    clients: int = 4
    ttl: float = 0.5
    node_timeout: float = 0.05
    seconds: float = 20.0
    max_seconds: float = 60.0
    min_sections: int = 0
    min_node_faults: int = 0
    #: Kinds of fault (nemesis.KILL_RESTART, ...) the run goes on until it has seen.
    required_faults: tuple[str, ...] = ()
    seed: int = 0

    @property
    def max_faulty(self) -> int:
        """The largest minority of the nodes."""
        return (len(self.nodes) - 1) // 2


def run(config: FaultRun) -> Report:
    """Run the clients and the nemesis, then check the history."""
    witness = config.witness.client(socket_timeout=10)
    # Built before the fork: each client must open connections of its own.
    redlock = Redlock(
        [node.url for node in config.nodes], node_timeout=config.node_timeout, retry_delay=0.05
    )
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    pause_request = context.RawValue("i", 0)
    victim = context.RawValue("i", 0)
    long_hold = context.RawValue("i", 0)
    processes = [
        context.Process(
            target=_client,
            args=(
                index,
                redlock,
                config.witness.url,
                config.ttl,
                stop,
                pause_request,
                victim,
                long_hold,
            ),
            name=f"fault-client-{index}",
        )
        for index in range(config.clients)
    ]
    for process in processes:
        process.start()
    nemesis = Nemesis(
        config.nodes,
        witness,
        lock_key=redlock.key(KEY),
        fence_key=redlock.keys(KEY).fence,
        ttl=config.ttl,
        max_faulty=config.max_faulty,
        pause_request=pause_request,
        victim=victim,
        long_hold=long_hold,
        seed=config.seed,
    )
    began = time.monotonic()
    nemesis.start()
    store = FencedStore(witness)
    try:
        while True:
            time.sleep(0.2)
            elapsed = time.monotonic() - began
            done = (
                elapsed >= config.seconds
                and store.writes() >= config.min_sections
                and nemesis.node_faults() >= config.min_node_faults
                and all(nemesis.counts()[kind] for kind in config.required_faults)
            )
            if done or elapsed >= config.max_seconds or not nemesis.is_alive():
                break
            if not all(process.is_alive() for process in processes):
                break
    finally:
        nemesis.stop()
        stop.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
        redlock.close()
    seconds = time.monotonic() - began

    problems = list(nemesis.problems)
    problems += [raw.decode() for raw in witness.lrange(ERRORS, 0, -1)]
    problems += [
        f"{process.name} exited with code {process.exitcode}"
        for process in processes
        if process.exitcode != 0
    ]
    counters = {k.decode(): int(v) for k, v in witness.hgetall(COUNTERS).items()}
    report = check(
        config.name,
        read_history(witness),
        faults=nemesis.counts(),
        node_fault_kinds=OUTAGES,
        nodes=len(config.nodes),
        clients=config.clients,
        ttl=config.ttl,
        seconds=seconds,
        quorum_unavailable=counters.get("quorum_unavailable", 0),
        client_errors=problems,
    )
    witness.close()
    return report


def _client(
    index: int,
    redlock: Redlock,
    witness_url: str,
    ttl: float,
    stop: Any,
    pause_request: Any,
    victim: Any,
    long_hold: Any,
) -> None:
    """One client process: lock, critical section, release, until ``stop``."""
    witness = redis.Redis.from_url(witness_url, socket_timeout=10)
    store = FencedStore(witness)
    chance = random.Random(index)
    next_long_hold = time.monotonic() + chance.uniform(*LONG_HOLD_EVERY)
    pending: list[str] = []
    quorum_unavailable = 0
    count = 0
    try:
        while not stop.is_set():
            lock = redlock.lock(KEY, ttl=ttl)
            try:
                if not lock.acquire(timeout=1.0):
                    continue
            except errors.QuorumUnavailable:
                # Possible while a node is down and another is slow to answer.
                quorum_unavailable += 1
                time.sleep(0.01)
                continue
            enter = time.monotonic()
            validity_at_enter = lock.validity
            token = lock.fencing_token
            assert token is not None
            # The lock's own deadline; only the checker reads it.
            valid_until = lock._valid_until
            slow = False
            renewals = 0
            if index == 0 and time.monotonic() >= next_long_hold:
                # A long hold: renewed past its ttl, then the write.
                next_long_hold = time.monotonic() + chance.uniform(*LONG_HOLD_EVERY)
                long_hold.value += 1  # odd: the nemesis may expire the fencing buckets now
                for _ in range(LONG_HOLD_RENEWALS):
                    time.sleep(ttl / 3)
                    try:
                        lock.extend()
                    except errors.QuorumUnavailable:
                        continue  # still valid: the next renewal may reach the nodes
                    except errors.LockLost:
                        break
                    renewals += 1
                    valid_until = lock._valid_until
                long_hold.value += 1
            elif pause_request.value and witness.delete(PAUSE_TICKET):
                pause_request.value = 0
                victim.value = os.getpid()
                slow = True
                time.sleep(SLOW_SECTION)  # a long computation: the nemesis freezes us here
                victim.value = 0
            accepted, arrival = store.write(token)
            exit_ = time.monotonic()
            validity_at_exit = lock.validity
            lock.release()
            count += 1
            pending.append(
                Section(
                    owner=f"c{index}-{count}",
                    token=token,
                    enter=enter,
                    exit=exit_,
                    validity_at_enter=validity_at_enter,
                    validity_at_exit=validity_at_exit,
                    valid_until=valid_until,
                    accepted=accepted,
                    arrival=arrival,
                    slow=slow,
                    renewals=renewals,
                ).encode()
            )
            if len(pending) >= BATCH:
                witness.rpush(HISTORY, *pending)
                pending.clear()
    except Exception:
        witness.rpush(ERRORS, f"client {index}: {traceback.format_exc()}")
        raise
    finally:
        if pending:
            witness.rpush(HISTORY, *pending)
        witness.hincrby(COUNTERS, "quorum_unavailable", quorum_unavailable)
        witness.close()
        redlock.close()
