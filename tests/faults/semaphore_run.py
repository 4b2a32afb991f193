"""A fault run for a semaphore: client processes share ``limit`` slots while the nemesis works.

Each client process loops: take a slot, hold it for a moment, release it,
and record the holding (its slot, when it began and ended, until when it was
valid). Client 0 now and then holds its slot past the ttl, extending it. The
nemesis of the lock runs (nodes killed and restarted empty, paused, their
scripts flushed, a holders key replaced by a string of another type for a
while, a client frozen while it holds a slot). The checker then sweeps the
history: at no instant may more than ``limit`` holdings be valid, and no two
valid holdings of the same slot number may overlap.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_redlock import Redlock, errors
from celery_redlock.lock.semaphore_slots import Slots
from celery_redlock.testing import RedisServer

from .checker import EXAMPLES, overlapping_pairs
from .history import COUNTERS, ERRORS, PAUSE_TICKET
from .nemesis import OUTAGES, Nemesis

#: The semaphore every client shares.
KEY = "faults:slots"
#: Witness list of encoded :class:`Holding` records.
HOLDINGS = "faults:holdings"
#: How long a "slow" holding computes; the nemesis freezes it meanwhile.
SLOW_HOLD = 0.1
#: Seconds between two long holds of client 0, as a (low, high) range.
LONG_HOLD_EVERY = (2.0, 4.0)


@dataclass(frozen=True, slots=True)
class Holding:
    """One slot holding as its client saw it."""

    owner: str
    slot: int
    enter: float
    exit: float
    valid_until: float
    validity_at_exit: float

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> Holding:
        return cls(**json.loads(raw))


@dataclass
class SemaphoreRunConfig:
    name: str
    nodes: Sequence[RedisServer]
    witness: RedisServer
    limit: int = 2
    clients: int = 6
    ttl: float = 0.5
    seconds: float = 15.0
    max_seconds: float = 60.0
    min_holdings: int = 0
    min_node_faults: int = 0
    #: Kinds of fault (nemesis.KILL_RESTART, ...) the run goes on until it has seen.
    required_faults: tuple[str, ...] = ()
    seed: int = 0


@dataclass
class SemaphoreReport:
    name: str
    nodes: int
    clients: int
    limit: int
    seconds: float
    holdings: int
    faults: dict[str, int]
    node_faults: int
    #: Most holdings valid at one instant (their [enter, min(exit, valid_until)] windows).
    most_within_validity: int
    #: Most holdings at one instant among those still valid at exit.
    most_valid_at_exit: int
    #: Pairs of overlapping valid holdings of the same slot number.
    same_slot_overlaps: int
    long_holds: int
    quorum_unavailable: int
    #: Attempts whose nodes granted different slot numbers and needed a second round.
    second_rounds: int
    client_errors: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def summary(self) -> str:
        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults.items()))
        return (
            f"{self.name}: {self.holdings} holdings in {self.seconds:.1f} s ({self.clients} "
            f"clients, limit {self.limit}, {self.nodes} nodes); faults: {faults or 'none'}; "
            f"most valid at once {self.most_within_validity} (valid at exit "
            f"{self.most_valid_at_exit}); same-slot overlaps {self.same_slot_overlaps}; "
            f"long holds {self.long_holds}; second rounds {self.second_rounds}; "
            f"attempts without quorum {self.quorum_unavailable}; "
            f"client errors {len(self.client_errors)}"
        )

    def save(self, path: str | Path) -> None:
        target = Path(path)
        reports = json.loads(target.read_text()) if target.exists() else {}
        reports[self.name] = asdict(self)
        target.write_text(json.dumps(reports, indent=2, sort_keys=True) + "\n")


def most_at_once(intervals: Iterable[tuple[float, float]]) -> tuple[int, float]:
    """Most half-open intervals ``[start, end)`` sharing an instant, and one such instant."""
    events = []
    for start, end in intervals:
        if end > start:
            events += [(start, 1), (end, -1)]
    events.sort()  # at one instant, ends (-1) before starts: [a, b) and [b, c) do not meet
    best, when, current = 0, 0.0, 0
    for instant, step in events:
        current += step
        if current > best:
            best, when = current, instant
    return best, when


def check_holdings(
    config: SemaphoreRunConfig,
    history: Sequence[Holding],
    faults: Counter[str],
    seconds: float,
    counters: dict[str, int],
    problems: list[str],
) -> SemaphoreReport:
    windows = [(h.enter, min(h.exit, h.valid_until)) for h in history]
    most_valid, when = most_at_once(windows)
    at_exit = [(h.enter, h.exit) for h in history if h.validity_at_exit > 0]
    most_at_exit, _ = most_at_once(at_exit)
    same_slot = 0
    examples = []
    for slot in {h.slot for h in history}:
        mine = [(h.enter, min(h.exit, h.valid_until), h) for h in history if h.slot == slot]
        pairs = overlapping_pairs([w for w in mine if w[1] > w[0]])  # type: ignore[misc]
        same_slot += len(pairs)
        examples += [f"slot {slot}: {a} / {b}" for a, b in pairs[:EXAMPLES]]
    if most_valid > config.limit:
        examples.append(
            f"{most_valid} valid at {when:.6f}: "
            + "; ".join(str(h) for h in history if h.enter <= when < min(h.exit, h.valid_until))
        )
    return SemaphoreReport(
        name=config.name,
        nodes=len(config.nodes),
        clients=config.clients,
        limit=config.limit,
        seconds=round(seconds, 1),
        holdings=len(history),
        faults=dict(faults),
        node_faults=sum(count for kind, count in faults.items() if kind in OUTAGES),
        most_within_validity=most_valid,
        most_valid_at_exit=most_at_exit,
        same_slot_overlaps=same_slot,
        long_holds=sum(1 for h in history if h.exit - h.enter > config.ttl),
        quorum_unavailable=counters.get("quorum_unavailable", 0),
        second_rounds=counters.get("second_rounds", 0),
        client_errors=problems,
        examples=examples[: 4 * EXAMPLES],
    )


def run_semaphore(config: SemaphoreRunConfig) -> SemaphoreReport:
    """Run the clients and the nemesis, then check the holdings."""
    witness = config.witness.client(socket_timeout=10)
    redlock = Redlock([node.url for node in config.nodes], node_timeout=0.05, retry_delay=0.05)
    keys = redlock.semaphore(KEY, config.limit, config.ttl).keys
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    pause_request = context.RawValue("i", 0)
    victim = context.RawValue("i", 0)
    long_hold = context.RawValue("i", 0)
    processes = [
        context.Process(
            target=_client,
            args=(index, redlock, config, config.witness.url, stop, pause_request, victim),
            name=f"semaphore-client-{index}",
        )
        for index in range(config.clients)
    ]
    for process in processes:
        process.start()
    nemesis = Nemesis(
        config.nodes,
        witness,
        # A stale "lock key" here is a holders key of another type: the node
        # answers the semaphore's scripts with an error until it expires.
        lock_key=keys.holders,
        fence_key=f"{redlock.key_prefix}faults:unused-fence",
        ttl=config.ttl,
        max_faulty=(len(config.nodes) - 1) // 2,
        pause_request=pause_request,
        victim=victim,
        long_hold=long_hold,
        seed=config.seed,
    )
    began = time.monotonic()
    nemesis.start()
    try:
        while True:
            time.sleep(0.2)
            elapsed = time.monotonic() - began
            done = (
                elapsed >= config.seconds
                and witness.llen(HOLDINGS) >= config.min_holdings
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
    history = [Holding.decode(raw) for raw in witness.lrange(HOLDINGS, 0, -1)]
    witness.close()
    return check_holdings(
        config,
        history,
        nemesis.counts(),
        seconds,
        counters,
        problems,
    )


def _client(
    index: int,
    redlock: Redlock,
    config: SemaphoreRunConfig,
    witness_url: str,
    stop: Any,
    pause_request: Any,
    victim: Any,
) -> None:
    witness = redis.Redis.from_url(witness_url, socket_timeout=10)
    chance = random.Random(index)
    next_long_hold = time.monotonic() + chance.uniform(*LONG_HOLD_EVERY)
    pending: list[str] = []
    quorum_unavailable = count = 0
    second_rounds = [0]
    ttl = config.ttl
    settle = Slots.second_round

    def counted(self: Slots, *args: Any) -> int | None:
        second_rounds[0] += 1
        return settle(self, *args)

    Slots.second_round = counted  # type: ignore[method-assign]  # this process only
    try:
        while not stop.is_set():
            sem = redlock.semaphore(KEY, config.limit, ttl)
            try:
                if not sem.acquire(timeout=1.0):
                    continue
            except errors.QuorumUnavailable:
                quorum_unavailable += 1
                time.sleep(0.01)
                continue
            enter = time.monotonic()
            slot = sem.slot
            assert slot is not None
            valid_until = sem.valid_until
            if index == 0 and time.monotonic() >= next_long_hold:
                next_long_hold = time.monotonic() + chance.uniform(*LONG_HOLD_EVERY)
                for _ in range(4):
                    time.sleep(ttl / 3)
                    try:
                        sem.extend()
                    except errors.QuorumUnavailable:
                        continue
                    except errors.LockLost:
                        break
                    valid_until = sem.valid_until
            elif pause_request.value and witness.delete(PAUSE_TICKET):
                pause_request.value = 0
                victim.value = os.getpid()
                time.sleep(SLOW_HOLD)  # the nemesis freezes us here
                victim.value = 0
            else:
                time.sleep(chance.uniform(0.0, 0.01))
            exit_ = time.monotonic()
            validity_at_exit = sem.validity
            sem.release()
            count += 1
            pending.append(
                Holding(
                    f"c{index}-{count}", slot, enter, exit_, valid_until, validity_at_exit
                ).encode()
            )
            if len(pending) >= 50:
                witness.rpush(HOLDINGS, *pending)
                pending.clear()
    except Exception:
        witness.rpush(ERRORS, f"client {index}: {traceback.format_exc()}")
        raise
    finally:
        if pending:
            witness.rpush(HOLDINGS, *pending)
        witness.hincrby(COUNTERS, "quorum_unavailable", quorum_unavailable)
        witness.hincrby(COUNTERS, "second_rounds", second_rounds[0])
        witness.close()
        redlock.close()
