"""The renewal thread against real nodes: batching, loss and progress."""

from __future__ import annotations

import gc
import re
import threading
import time
import uuid
from typing import Any

import pytest

from celery_redlock.errors import LockLost
from celery_redlock.lock import redlock as redlock_module
from celery_redlock.lock import renewal_batch
from celery_redlock.lock.renewal import RENEW_AT, Heartbeat
from tests.support import count_fan_outs, script_runs, with_node_timeout

pytestmark = pytest.mark.integration

#: A first call opens the connections and loads the scripts, and on a loaded
#: machine a node (or the renewal thread) may wait its turn for a CPU for
#: hundreds of ms: these tests are about renewal, not node timeouts, so no
#: such wait may pass for a node that failed. Their ttls leave as much room.
NODE_TIMEOUT = 0.5


@pytest.fixture
def make_redlock(make_redlock: Any) -> Any:
    return with_node_timeout(make_redlock, NODE_TIMEOUT)


def test_500_locks_renew_in_one_round_trip_per_node(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    # A ttl the 500 acquisitions fit in well: measured, and doubled where
    # the machine was too slow for it.
    ttl = 3.0
    while True:
        started = time.monotonic()
        locks = [redlock.lock(f"many:{n}", ttl=ttl) for n in range(500)]
        for lock in locks:
            assert lock.acquire(timeout=ttl)  # a node slow for a moment is asked again
        if time.monotonic() - started < ttl * RENEW_AT:
            break
        for lock in locks:
            lock.release()  # the first ones may have expired already: that is why we retry
        ttl *= 2
        assert ttl <= 24.0, "500 acquisitions never fit in a third of the ttl"

    fan_outs = count_fan_outs(monkeypatch)
    before = [script_runs(node) for node in nodes]
    beat = Heartbeat()
    held = [beat.hold(lock) for lock in locks]
    try:
        time.sleep(ttl * 2.2)  # more than two ttls: every lock renewed at least 4 times
        assert all(lock.locked() for lock in locks)
        assert not any(h.lost for h in held)
    finally:
        beat.stop()
    rounds = len(fan_outs)
    commands = [script_runs(node) - b for node, b in zip(nodes, before, strict=True)]
    # One pipelined send per node per round, however many locks are due.
    assert 4 <= rounds <= 8, fan_outs
    # After the first round every round covers all 500 locks: a SCRIPT LOAD
    # and three script calls of up to 200 locks, on every node.
    assert all(sends == [4, 4, 4] for sends in fan_outs[1:]), fan_outs
    # Each node ran one script per 200 locks per round, nothing else.
    assert commands == [sum(sends[0] - 1 for sends in fan_outs)] * 3


def test_renewal_right_after_a_script_flush_is_still_one_round_trip(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    locks = [redlock.lock(f"flushed:{n}", ttl=60.0) for n in range(2000)]
    for lock in locks:
        assert lock.acquire(timeout=30.0)  # a node slow for a moment is asked again
    for node in nodes:
        with node.client() as client:
            client.script_flush()
            client.config_resetstat()
    fan_outs: list[int] = []
    real_fan_out = renewal_batch.fan_out

    def counting_fan_out(nodes: Any, calls: Any, timeout: float) -> Any:
        fan_outs.append(1)
        return real_fan_out(nodes, calls, timeout)

    monkeypatch.setattr(renewal_batch, "fan_out", counting_fan_out)
    assert redlock.renew(locks) == [redlock_module.RENEWED] * 2000
    assert len(fan_outs) == 1
    for node in nodes:
        with node.client() as client:
            stats = client.info("commandstats")
        assert "cmdstat_eval" not in stats  # nothing was sent again with its source
        assert stats["cmdstat_evalsha"]["calls"] == 2000 // 200


def test_short_locks_do_not_wake_the_renewal_thread(servers: Any, make_redlock: Any) -> None:
    # In a busy worker a wake-up per task is a thread switch per task. A lock
    # released long before its first renewal is due must not cause one, also
    # when the thread last looked while no lock was held.
    redlock = make_redlock(list(servers)[:1])
    beat = Heartbeat()
    try:
        for n in range(50):
            lock = redlock.lock(f"short:{n}", ttl=30.0)
            assert lock.acquire(blocking=False)
            beat.drop(beat.hold(lock))
            assert lock.release()
            time.sleep(0.002)  # time for the thread to run, were it woken
        # The first lock starts the thread, which looks once.
        assert beat.rounds <= 2
        # A lock that needs renewing sooner than the thread's tick wakes it
        # (a ttl that a renewal late by a few hundred ms still keeps).
        lock = redlock.lock("shorter", ttl=1.2)
        assert lock.acquire(blocking=False)
        held = beat.hold(lock)
        time.sleep(1.2 * 2)
        assert lock.locked()
        beat.drop(held)
        assert lock.release()
    finally:
        beat.stop()


def test_lock_lost_to_a_majority_is_reported(servers: Any, make_redlock: Any) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("doomed", ttl=2.0)
    assert lock.acquire(blocking=False)
    lost: list[str] = []
    beat = Heartbeat()
    held = beat.hold(lock, task_id="t1", on_lost=lambda held, reason: lost.append(reason))
    try:
        # Someone wipes the key on two nodes: the next renewal must notice.
        # A renewal between the two wipes puts it back on the first (as it
        # should): wiped again until a renewal finds it gone from both.
        # on_lost is called last, after the flag is set and the warning logged.
        deadline = time.monotonic() + 10
        while not lost and time.monotonic() < deadline:
            nodes[0].flush()
            nodes[1].flush()
            wait_for(lambda: bool(lost), 2.0 * RENEW_AT * 1.5)
        assert lost
        assert held.lost
        # What happened, not a guess: the key is gone from two of the three nodes.
        assert "1 of 3 nodes held it (2 needed)" in lost[0]
        assert "gone from 2 nodes" in lost[0]
        assert held.lost_code == "renewal_failed"
        with pytest.raises(LockLost, match="doomed"):
            beat.progress(held)
    finally:
        beat.stop()


def test_stalled_task_stops_renewing_and_then_learns_it(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(list(servers)[:3])
    lock = redlock.lock("stalled", ttl=1.5)
    assert lock.acquire(blocking=False)
    beat = Heartbeat()
    held = beat.hold(lock, progress_timeout=0.75)
    try:
        time.sleep(3.0)  # no progress: renewal stopped, the ttl ran out
        other = redlock.lock("stalled", ttl=1.5)
        assert other.acquire(blocking=False)
        other.release()
        assert wait_for(lambda: held.lost, 5.0)  # at the thread's next tick
        assert held.lost_code == "stalled"
        with pytest.raises(LockLost):
            beat.progress(held)
    finally:
        beat.stop()


def test_progress_keeps_a_lock_with_a_progress_timeout(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(list(servers)[:3])
    # Room for this thread or the renewal thread to be late by a few hundred ms.
    lock = redlock.lock("busy-worker", ttl=1.5)
    assert lock.acquire(blocking=False)
    beat = Heartbeat()
    held = beat.hold(lock, progress_timeout=0.75)
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            beat.progress(held)
            time.sleep(0.05)
        assert lock.locked()
        assert not held.lost
    finally:
        beat.stop()
        lock.release()


def wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


def test_a_lock_taken_with_a_node_down_heals_and_survives_losing_another(
    servers: Any, make_redlock: Any
) -> None:
    a, b, c = list(servers)[:3]
    redlock = make_redlock([a, b, c])
    c.kill()
    lock = redlock.lock("heal", ttl=1.5)
    assert lock.acquire(blocking=False)  # on a and b only
    c.start()
    beat = Heartbeat()
    held = beat.hold(lock)
    try:
        # Renewal puts the key back on c, with the holder's value.
        key = redlock.key("heal")
        with c.client() as client:
            assert wait_for(lambda: client.get(key) == lock.value.encode(), 5.0)
        b.kill()
        time.sleep(1.5 * 2)  # two ttls: renewed on a and c alone
        assert lock.locked()
        assert not held.lost
    finally:
        beat.stop()
    assert lock.release()


def test_the_thread_survives_a_lock_whose_ttl_is_beyond_what_it_can_wait(
    servers: Any, make_redlock: Any
) -> None:
    redlock = make_redlock(list(servers)[:1])
    lock = redlock.lock("centuries", ttl=5.0)
    assert lock.acquire(blocking=False)
    # A held lock's ttl that no Lock accepts any more (set on the object):
    # a third of it is more than threading's longest wait.
    lock.ttl = 4 * threading.TIMEOUT_MAX
    beat = Heartbeat()
    beat.hold(lock)
    try:
        assert wait_for(lambda: beat.rounds >= 1, 2.0)
        time.sleep(0.05)  # the thread now waits (or died trying)
        assert beat._thread is not None
        assert beat._thread.is_alive()
    finally:
        beat.stop()
    lock.ttl = 5.0
    assert lock.release()


def test_auto_renew_keeps_a_plain_lock_until_release(servers: Any, make_redlock: Any) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("auto", ttl=1.2, auto_renew=True)
    with lock:
        time.sleep(1.2 * 3)
        assert lock.locked()
    with nodes[0].client() as client:
        assert not client.exists(redlock.key("auto"))


def test_an_auto_renewed_lock_dropped_without_release_expires(
    servers: Any, make_redlock: Any
) -> None:
    nodes = list(servers)[:3]
    # The first calls open the connections: room for a loaded machine (seen:
    # no node answering within the 50 ms default). This test is about expiry.
    redlock = make_redlock(nodes, node_timeout=0.2)
    lock = redlock.lock("dropped", ttl=0.6, auto_renew=True)
    assert lock.acquire(blocking=False)
    key = redlock.key("dropped")
    del lock
    gc.collect()
    with nodes[0].client() as client:
        assert wait_for(lambda: not client.exists(key), 3.0)
    assert redlock.lock("dropped", ttl=0.6).acquire(blocking=False)


def test_an_auto_renewed_lock_lost_to_the_nodes_says_so(servers: Any, make_redlock: Any) -> None:
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("taken", ttl=1.2, auto_renew=True)
    assert lock.acquire(blocking=False)
    for node in nodes:
        with node.client() as client:
            client.set(redlock.key("taken"), "another-owner", px=10_000)
    assert wait_for(lambda: lock.value is None, 5.0)
    # The round that finds it lost says what the nodes answered then: all
    # three taken over, or two (a renewal ran between the overwrites).
    assert re.search(r"taken over by another owner on [23] nodes", lock.lost_reason or "")
    assert lock.release() is False


def test_a_large_give_up_takes_the_bulk_connection_when_nothing_is_owed(
    servers: Any, make_redlock: Any
) -> None:
    # The heartbeat gives up every lease it found lost in one pipeline, one call
    # per lease. Ordered behind the leases' own calls, it would take the
    # interactive connection, which every acquire, extend and release of the
    # process takes too: a give-up of thousands of leases would then stand
    # between the process's next acquire and its answer on every node. It does
    # only while that connection owes replies (an acquire queued for a paused
    # node); here it owes none, so the give-up goes on the bulk connection and
    # a free lock is taken meanwhile. Judged by where the give-up's slot is
    # queued, not by a time: this machine's load decides how long either takes.
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes, node_timeout=2.0)
    count = 30000
    chunk = renewal_batch._GIVE_UP_CHUNK  # leases given up per round trip
    # Leases held elsewhere (built from their tokens), gone from every node:
    # the renewal finds each one lost and gives it up.
    gone = [redlock.lock(f"gone:{n}", ttl=30.0, token=f"{n:032x}|t|w") for n in range(count)]
    fresh = redlock.lock("fresh", ttl=30.0)
    assert fresh.acquire(blocking=False)  # connections open, scripts loaded
    assert fresh.release()

    outcomes: list[str] = []
    renewal = threading.Thread(target=lambda: outcomes.extend(redlock.renew(gone)))
    renewal.start()
    try:
        interactive = [node.link() for node in redlock.nodes]
        bulk = [node.link(bulk=True) for node in redlock.nodes]
        deadline = time.monotonic() + 30.0
        # A chunk of the give-up is queued on node 0 (one slot for its replies).
        while not any(
            slot.count >= chunk for link in (interactive[0], bulk[0]) for slot in list(link.pending)
        ):
            assert renewal.is_alive() or outcomes, "the renewal ended early"
            assert time.monotonic() < deadline, "the give-up was never queued"
            time.sleep(0.0005)
        assert not any(slot.count >= chunk for slot in list(interactive[0].pending))
        # At most one chunk per round trip (and its SCRIPT LOAD), never the whole give-up.
        queued = [slot.count for link in (interactive[0], bulk[0]) for slot in list(link.pending)]
        assert max(queued, default=0) <= chunk + 1, queued
        assert fresh.acquire(blocking=False), "a free lock was refused"
        fresh.release()
    finally:
        renewal.join()
    assert outcomes == [redlock_module.LOST] * count


def test_a_large_give_up_refuses_no_free_lock_while_other_threads_take_locks(
    servers: Any, make_redlock: Any
) -> None:
    # The heartbeat's give-up of lost leases is ordered behind the process's earlier calls:
    # while a node's interactive connection owes replies it goes there. In a process where
    # other threads take and free locks that connection nearly always owes one, so a give-up of
    # 30,000 leases in one batch stood between every acquire on that node and its answer (the
    # default 50 ms node timeout): free locks were refused with QuorumUnavailable. It now goes
    # 1,000 leases per round trip, and an acquire waits for one chunk at most.
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    count = 30000
    # Leases held elsewhere (built from their tokens), gone from every node: each renewal
    # finds them all lost and gives them up. Two rounds of them.
    rounds = [
        [redlock.lock(f"gone:{r}:{n}", ttl=30.0, token=f"{n:032x}|t|w") for n in range(count)]
        for r in range(2)
    ]
    fresh = redlock.lock("fresh", ttl=30.0)
    assert fresh.acquire(blocking=False)  # connections open, scripts loaded
    assert fresh.release()

    stop = threading.Event()
    refused: list[str] = []
    taken = [0]

    def take_and_free(worker: int) -> None:
        while not stop.is_set():
            lock = redlock.lock(f"free:{worker}:{uuid.uuid4().hex}", ttl=10.0)
            try:
                got = lock.acquire(blocking=False)
            except Exception as exc:  # QuorumUnavailable
                refused.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                continue
            if not got:
                refused.append("acquire returned False")
                continue
            taken[0] += 1
            lock.release()

    workers = [threading.Thread(target=take_and_free, args=(n,)) for n in range(4)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.1)
        outcomes = [redlock.renew(gone) for gone in rounds]
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert outcomes == [[redlock_module.LOST] * count] * 2
    assert taken[0] > 0
    assert refused == [], f"{len(refused)} free locks refused ({taken[0]} taken): {refused[0]}"
