"""Redlock.semaphore against real nodes: the limit, expiry, release, renewal, cleanup."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from celery_redlock import Semaphore, errors
from celery_redlock.lock.quorum import LOST
from celery_redlock.lock.renewal import Heartbeat
from celery_redlock.testing import RedisServer
from tests.support import (
    acquire_in_a_process_that_dies,
    all_topologies,
    count_fan_outs,
    heard_from,
    script_runs,
    wait_for_script_runs,
    with_node_timeout,
)

pytestmark = pytest.mark.integration

#: A first call opens the connections and loads the scripts, and on a loaded
#: machine a node (or this process) may wait its turn for a CPU for hundreds
#: of ms: these tests are about slots, not node timeouts, so no such wait
#: may pass for a node that failed.
NODE_TIMEOUT = 0.5


@pytest.fixture
def make_redlock(make_redlock: Any) -> Any:
    return with_node_timeout(make_redlock, NODE_TIMEOUT)


def semaphore_keys(servers: list[RedisServer]) -> dict[str, int]:
    """Every key under redlock: on the running nodes, with its ttl in ms."""
    found: dict[str, int] = {}
    for server in servers:
        if server.running and not server.paused:
            with server.client() as client:
                for key in client.scan_iter("redlock:*"):
                    ttl = client.pttl(key)
                    if b":fence" not in key and ttl != -2:  # -2: gone since the scan
                        found[f"{server.port}:{key.decode()}"] = ttl
    return found


@all_topologies
def test_at_most_limit_holders(topology: Any, make_redlock: Any) -> None:
    redlock = make_redlock(topology)
    holders = [redlock.semaphore("exports", limit=3, ttl=5.0) for _ in range(5)]
    taken = [sem.acquire(blocking=False) for sem in holders]
    assert taken == [True, True, True, False, False]
    assert sorted(sem.slot for sem in holders[:3]) == [0, 1, 2]
    assert all(sem.locked() and sem.value for sem in holders[:3])
    assert holders[3].slot is None
    assert holders[3].value is None
    assert holders[1].release() is True
    assert holders[3].acquire(blocking=False)
    assert holders[3].slot == 1  # the slot just freed: exactly one
    assert not holders[4].acquire(blocking=False)
    for sem in holders[:4]:
        sem.release()
    assert semaphore_keys(topology) == {}


@all_topologies
def test_every_key_has_a_ttl(topology: Any, make_redlock: Any) -> None:
    redlock = make_redlock(topology, retry_delay=0.05)
    # The holder outlives the waiter's whole wait, however late it runs.
    holder = redlock.semaphore("ttl", limit=1, ttl=10.0)
    assert holder.acquire(blocking=False)
    waiter = redlock.semaphore("ttl", limit=1, ttl=10.0)
    seen: dict[str, int] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(semaphore_keys(topology))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # Queued, then gave up: long enough for the watcher to get a turn.
        assert not waiter.acquire(timeout=1.0)
        assert waiter.acquire(blocking=False) is False
        holder.extend()
        holder.release()
    finally:
        stop.set()
        watcher.join()
    assert any(":sem:queue" in key for key in seen), seen  # the waiter was seen queued
    assert all(ttl > 0 for ttl in seen.values()), seen
    assert semaphore_keys(topology) == {}


@all_topologies
def test_expired_slots_are_reclaimed(topology: Any, make_redlock: Any) -> None:
    redlock = make_redlock(topology)
    # A ttl no scheduling delay outlasts: the slots are still held when
    # the late one first tries, however late that is.
    crashed = redlock.semaphore("reclaim", limit=2, ttl=1.5)
    other = redlock.semaphore("reclaim", limit=2, ttl=1.5)
    assert crashed.acquire(blocking=False)
    assert other.acquire(blocking=False)
    late = redlock.semaphore("reclaim", limit=2, ttl=5.0)
    assert not late.acquire(blocking=False)
    # Nobody releases: the slots expire, and a waiter gets one without a release.
    assert late.acquire(timeout=10.0)
    assert late.slot in (0, 1)
    assert not crashed.locked()
    assert crashed.release() is False
    late.release()


def test_waiter_wakes_on_release(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3], retry_delay=30.0)
    holder = redlock.semaphore("wake", limit=1, ttl=30.0)
    assert holder.acquire(blocking=False)
    got = threading.Event()
    waiter = redlock.semaphore("wake", limit=1, ttl=30.0)

    def wait() -> None:
        if waiter.acquire(timeout=20.0):
            got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    queued = servers[0].client()
    deadline = time.monotonic() + 10
    while not queued.exists("redlock:{wake}:sem:queue") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queued.exists("redlock:{wake}:sem:queue")
    holder.release()
    # retry_delay is 30 s: only the release notification can wake it in time.
    assert got.wait(10.0)
    thread.join()
    waiter.release()


def test_three_nodes_one_down_still_grants_and_limits(servers: Any, make_redlock: Any) -> None:
    nodes = servers[:3]
    nodes[2].kill()
    redlock = make_redlock(nodes)
    first = redlock.semaphore("down", limit=1, ttl=5.0)
    second = redlock.semaphore("down", limit=1, ttl=5.0)
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    first.release()
    assert second.acquire(blocking=False)
    second.release()


def test_no_quorum_raises(servers: Any, make_redlock: Any) -> None:
    nodes = servers[:3]
    nodes[1].kill()
    nodes[2].kill()
    redlock = make_redlock(nodes)
    with pytest.raises(errors.QuorumUnavailable):
        redlock.semaphore("none", limit=2, ttl=5.0).acquire(blocking=False)


def test_context_manager(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3])
    with redlock.semaphore("ctx", limit=1, ttl=5.0, timeout=0) as sem:
        assert isinstance(sem, Semaphore)
        assert sem.locked()
        with pytest.raises(errors.LockNotAcquired) as caught:  # noqa: SIM117
            with redlock.semaphore("ctx", limit=1, ttl=5.0, timeout=0.1):
                pass
        assert caught.value.key == "ctx"
    assert not sem.locked()
    with redlock.semaphore("ctx", limit=1, ttl=5.0, blocking=False):
        pass


def test_context_manager_reports_a_lost_slot(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3], node_timeout=0.3)
    with pytest.raises(errors.LockLost), redlock.semaphore("lost", limit=1, ttl=1.0):
        time.sleep(1.5)


def test_heartbeat_keeps_slots(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3], node_timeout=0.4)
    # Renewed every 0.4 s: a renewal late by a few hundred ms still keeps them.
    kept = [redlock.semaphore("beat", limit=2, ttl=1.2) for _ in range(2)]
    lock = redlock.lock("beat-lock", ttl=1.2)
    for sem in kept:
        assert sem.acquire(blocking=False)
    assert lock.acquire(blocking=False)
    beat = Heartbeat()
    held = [beat.hold(sem) for sem in kept] + [beat.hold(lock)]
    try:
        time.sleep(3.6)  # three ttls
        assert all(sem.locked() for sem in kept)
        assert lock.locked()
        assert not any(h.lost for h in held)
        assert not redlock.semaphore("beat", limit=2, ttl=1.2).acquire(blocking=False)
    finally:
        beat.stop()
    for sem in kept:
        assert sem.release() is True


def test_renew_reports_a_lost_slot(servers: Any, make_redlock: Any) -> None:
    from celery_redlock.lock.redlock import LOST, RENEWED

    redlock = make_redlock(servers[:3])
    kept = redlock.semaphore("renew", limit=2, ttl=5.0)
    gone = redlock.semaphore("renew", limit=2, ttl=5.0)
    assert kept.acquire(blocking=False)
    assert gone.acquire(blocking=False)
    for server in servers[:3]:
        server.client().hdel("redlock:{renew}:sem", gone.slot)
        server.client().zrem("redlock:{renew}:sem:expiry", gone.slot)
    # Another holder takes the freed slot: the renewal finds it taken over.
    thief = redlock.semaphore("renew", limit=2, ttl=5.0)
    assert thief.acquire(blocking=False)
    assert redlock.renew([kept, gone]) == [RENEWED, LOST]
    assert not gone.locked()
    assert gone.lost_reason
    assert thief.locked()
    kept.release()
    thief.release()


def test_extend_places_the_slot_again(servers: Any, make_redlock: Any) -> None:
    # Room for heard_from's pause of node 1.
    redlock = make_redlock(servers[:3], node_timeout=2.0)
    sem = redlock.semaphore("place", limit=1, ttl=5.0)
    assert sem.acquire(blocking=False)
    servers[0].client().delete("redlock:{place}:sem", "redlock:{place}:sem:expiry")
    # Once nodes 1 and 2 confirmed, the slot goes back where node 0 had it free.
    heard_from(servers[0], servers[1], sem.extend)
    assert servers[0].client().hget("redlock:{place}:sem", "0") == sem.value.encode()
    sem.release()


def test_release_by_owner_frees_exactly_that_run(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3])
    dead = redlock.semaphore("own", limit=3, ttl=30.0, owner="task-1|host:10")
    copy = redlock.semaphore("own", limit=3, ttl=30.0, owner="task-1|host:11")
    other = redlock.semaphore("own", limit=3, ttl=30.0, owner="task-2|host:10")
    for sem in (dead, copy, other):
        assert sem.acquire(blocking=False)
    assert redlock.release_semaphore_owner("own", "task-1", "host:10") == 3
    assert redlock.release_semaphore_owner("own", "task-1", "host:10") == 0
    newcomer = redlock.semaphore("own", limit=3, ttl=30.0)
    assert newcomer.acquire(blocking=False)
    assert newcomer.slot == dead.slot
    assert copy.release()
    assert other.release()
    assert newcomer.release()
    assert dead.release() is False


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"limit": "3"}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": 100001}, "limit"),
        ({"limit": 2, "ttl": 0}, "ttl"),
        ({"limit": 2, "ttl": -1.0}, "ttl"),
        ({"limit": 2, "ttl": float("nan")}, "ttl"),
        ({"limit": 2, "timeout": -1}, "timeout"),
        ({"limit": 2, "blocking": "yes"}, "blocking"),
        ({"limit": 2, "owner": 5}, "owner"),
    ],
)
def test_bad_input_names_the_option(
    servers: Any, make_redlock: Any, arguments: dict[str, Any], option: str
) -> None:
    redlock = make_redlock(servers[:1])
    with pytest.raises(errors.ConfigurationError) as caught:
        redlock.semaphore("bad", **arguments)
    assert caught.value.option == option
    assert semaphore_keys(servers[:1]) == {}


@pytest.mark.parametrize("count", [1, 3], ids=["1-node", "3-nodes"])
def test_waiters_are_served_in_arrival_order(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """1 slot, 20 contenders each acquiring again and again: nobody is overtaken much.

    The bound is counted in grants, not seconds: between a contender's
    first attempt and its grant, at most ``bound`` grants go to others. A
    first-come-first-served queue gives at most 19 (every other contender
    once); the ticket is settled after the first attempt, so a few more are
    allowed for contenders whose first attempts crossed on the nodes.

    "First attempt" is its reply: a contender descheduled before its first
    attempt reached the nodes (a loaded machine) had not arrived yet.
    """
    from celery_redlock.lock import semaphore_slots as _slots

    contenders, rounds, bound = 20, 8, 25
    redlock = make_redlock(servers[:count], retry_delay=0.2)
    grants = 0
    order = threading.Lock()
    overtaken: list[int] = []
    served = [0] * contenders
    failures: list[BaseException] = []
    start = threading.Barrier(contenders)
    arrived = threading.local()  # grants counted when this acquire's first attempt returned
    real = _slots.fan_out

    def noting_arrival(*args: Any, **kwargs: Any) -> Any:
        results = real(*args, **kwargs)
        if getattr(arrived, "grants", 0) is None:
            with order:
                arrived.grants = grants
        return results

    monkeypatch.setattr(_slots, "fan_out", noting_arrival)

    def contend(index: int) -> None:
        nonlocal grants
        try:
            start.wait()
            for _ in range(rounds):
                sem = redlock.semaphore("fair", limit=1, ttl=10.0)
                arrived.grants = None
                assert sem.acquire(timeout=60.0)
                with order:
                    overtaken.append(grants - arrived.grants)
                    grants += 1
                    served[index] += 1
                time.sleep(0.002)
                assert sem.release()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert served == [rounds] * contenders
    print(f"most grants to others while waiting: {max(overtaken)} (bound {bound})")
    assert max(overtaken) <= bound, sorted(overtaken)[-10:]


def plant(server: RedisServer, name: str, slots: dict[int, str], ttl_ms: int = 10000) -> None:
    """Write holders straight into one node, as other clients would have."""
    with server.client() as client:
        now = client.time()
        now_ms = now[0] * 1000 + now[1] // 1000
        for slot, value in slots.items():
            client.hset(f"redlock:{{{name}}}:sem", str(slot), value)
            client.zadd(f"redlock:{{{name}}}:sem:expiry", {str(slot): now_ms + ttl_ms})
        client.pexpire(f"redlock:{{{name}}}:sem", ttl_ms)
        client.pexpire(f"redlock:{{{name}}}:sem:expiry", ttl_ms)


def holders(servers: list[RedisServer], name: str) -> list[dict[str, str]]:
    return [
        {
            k.decode(): v.decode()
            for k, v in server.client().hgetall(f"redlock:{{{name}}}:sem").items()
        }
        for server in servers
    ]


def test_nodes_that_disagree_settle_on_one_slot(servers: Any, make_redlock: Any) -> None:
    nodes = servers[:3]
    # Node 0 has slots 0 and 1 taken, node 1 slot 0, node 2 none: the lowest
    # free slot is 2, 1 and 0, and no number has a majority at first.
    plant(nodes[0], "split", {0: "a", 1: "b"})
    plant(nodes[1], "split", {0: "c"})
    redlock = make_redlock(nodes)
    sem = redlock.semaphore("split", limit=3, ttl=5.0)
    assert sem.acquire(blocking=False)
    assert sem.slot == 2  # the one slot free everywhere
    assert holders(nodes, "split") == [
        {"0": "a", "1": "b", "2": sem.value},
        {"0": "c", "2": sem.value},
        {"2": sem.value},
    ]
    assert sem.release()


def test_a_late_grant_of_another_slot_is_released_with_the_slot(
    servers: Any, make_redlock: Any
) -> None:
    # The acquire returns once nodes 0 and 1 granted slot 0; node 2, paused,
    # runs the acquire later and, its slot 0 taken by another holder, grants
    # slot 1. Its reply is never read, so the release must find the slot by value.
    nodes = servers[:3]
    plant(nodes[2], "late", {0: "other"})
    redlock = make_redlock(nodes)
    sem = redlock.semaphore("late", limit=3, ttl=10.0)
    before = script_runs(nodes[2])
    nodes[2].pause()
    try:
        assert sem.acquire(blocking=False)
        assert sem.slot == 0
        value = sem.value
        assert sem.release()
    finally:
        nodes[2].resume()
    # the late acquire, then the release
    wait_for_script_runs(nodes[2], before + 2, "the acquire and the release")
    assert value not in holders(nodes, "late")[2].values()
    assert holders(nodes, "late") == [{}, {}, {"0": "other"}]


def test_a_release_does_not_count_a_late_grant_of_another_slot_as_its_slot(
    servers: Any, make_redlock: Any
) -> None:
    # A holds slot 0 on nodes 0 and 1; node 2, paused during the acquire, runs
    # it late and grants slot 1 (its slot 0 taken). Node 1 then restarts empty
    # and B takes slot 0 on nodes 1 and 2: A holds slot 0 on node 0 alone, so
    # its release must report the slot lost. The release's "every slot holding
    # my value" on node 2 deletes the stray slot 1 and answers 1 ("released"),
    # which the tally counts as a node that held A's slot: a majority, True.
    nodes = servers[:3]
    plant(nodes[2], "stray-count", {0: "other"}, ttl_ms=1000)
    redlock = make_redlock(nodes)
    a = redlock.semaphore("stray-count", limit=2, ttl=30.0)
    before = script_runs(nodes[2])
    nodes[2].pause()
    try:
        assert a.acquire(blocking=False)
        assert a.slot == 0
    finally:
        nodes[2].resume()
    # the late acquire
    wait_for_script_runs(nodes[2], before + 1, "the late acquire")
    assert holders(nodes, "stray-count")[2] == {"0": "other", "1": a.value}
    time.sleep(1.1)  # "other" expires on node 2
    nodes[1].restart()  # empty
    b = redlock.semaphore("stray-count", limit=2, ttl=30.0)
    assert b.acquire(blocking=False)
    assert b.slot == 0  # on nodes 1 and 2 (node 0 has it taken by A)
    assert holders(nodes, "stray-count")[1:] == [{"0": b.value}, {"0": b.value, "1": a.value}]
    # The empty restart made two holders of slot 0, each valid by its clock.
    assert a.locked()
    assert b.locked()
    # A's slot 0 is held on node 0 only: its release must say it was lost.
    assert a.release() is False
    assert a.lost_reason
    assert b.release()


def test_a_give_up_in_a_large_batch_sweeps_a_late_grant(servers: Any, make_redlock: Any) -> None:
    # The heartbeat gives up every lease it found lost in one pipeline; past
    # BULK_CALLS (64) calls that pipeline goes on each node's *bulk* connection,
    # while the acquire went on its interactive one. Nothing orders two
    # connections: here node 2 is paused while the acquire opens the interactive
    # connection (accepted only when node 2 runs again) and the give-up's -1
    # sweep reaches the bulk connection, which node 2 already accepted, so node 2
    # runs the sweep first and the acquire after it. The late grant of slot 1
    # (node 2's slot 0 is another holder's) outlives the give-up by its whole ttl.
    # (Over a network, a lost and retransmitted segment on the interactive
    # connection reorders the two the same way.)
    nodes = servers[:3]
    name = "bulk-give-up"
    plant(nodes[2], name, {0: "other"}, ttl_ms=60000)
    # 128 locks whose validity ran out: a renewal gives each up, one call each.
    pads = make_redlock(nodes, node_timeout=0.1)
    expired = [pads.lock(f"pad:{i}", ttl=0.3) for i in range(128)]
    assert all(lock.acquire(blocking=False) for lock in expired)
    time.sleep(0.4)
    redlock = make_redlock(nodes)
    # A first give-up of 64 (65 calls with the SCRIPT LOAD) opens the bulk connections.
    assert redlock.renew(expired[:64]) == [LOST] * 64
    sem = redlock.semaphore(name, limit=2, ttl=30.0)
    before = script_runs(nodes[2])
    nodes[2].pause()
    try:
        assert sem.acquire(blocking=False)
        assert sem.slot == 0  # on nodes 0 and 1; node 2 never answered
        value = sem.value
        interactive = redlock.nodes[2].link()
        deadline = time.monotonic() + 5.0
        while interactive.unsent:  # the acquire is on its way to node 2
            assert time.monotonic() < deadline, "the acquire never left for node 2"
            time.sleep(0.01)
        # Nodes 0 and 1 lose the slot (as an empty restart would): the renewal
        # finds it lost and gives it up with 64 others, every slot holding its
        # value (-1) on every node.
        for node in nodes[:2]:
            with node.client() as client:
                client.delete(sem.keys.holders, sem.keys.expiry)
        outcomes = redlock.renew([sem, *expired[64:]])
        assert outcomes == [LOST] * 65
        assert sem.lost_reason
    finally:
        nodes[2].resume()
    # node 2 runs: the acquire and the renewal (interactive), the sweep and 64 releases (bulk)
    wait_for_script_runs(nodes[2], before + 67, "the acquire and the give-up")
    assert holders(nodes, name) == [{}, {}, {"0": "other"}], (
        f"a slot holding {value!r} outlived its give-up"
    )


def test_a_release_sweeps_the_nodes_its_own_acquisition_never_heard(
    servers: Any, make_redlock: Any
) -> None:
    # Semaphore.release() reads self._unsure after it left the mutex: once
    # _forget() has run, another thread may acquire the same object (it is not
    # locked() any more) and replace _unsure with its own attempt's. The release
    # then sweeps the new attempt's unsure nodes, not its own: node 2, which
    # granted the first acquisition slot 1 late, keeps it. The release is held
    # inside _forget() (its heartbeat().drop() waits for the heartbeat's mutex)
    # for as long as the other thread's attempt takes; without that hold the
    # window is a thread switch between _forget() and the release call.
    from celery_redlock.lock.renewal import heartbeat
    from celery_redlock.transport.nodes import NodeFailure

    nodes = servers[:3]
    name = "unsure-race"
    plant(nodes[2], name, {0: "other"}, ttl_ms=60000)
    redlock = make_redlock(nodes)
    sem = redlock.semaphore(name, limit=3, ttl=30.0, auto_renew=True)
    before = script_runs(nodes[2])
    nodes[2].pause()
    try:
        assert sem.acquire(blocking=False)
        assert sem.slot == 0  # on nodes 0 and 1
    finally:
        nodes[2].resume()
    first = sem.value
    # the late acquire
    wait_for_script_runs(nodes[2], before + 1, "the late acquire")
    assert holders(nodes, name)[2] == {"0": "other", "1": first}
    deadline = time.monotonic() + 10.0
    while isinstance(redlock.inspect("anything")[2], NodeFailure):
        assert time.monotonic() < deadline, "node 2 never answered again"
        time.sleep(0.01)  # node 2 answers again: not suspect, heard by the next attempt

    beat = heartbeat()
    released: list[bool] = []
    acquired: list[bool] = []
    release = threading.Thread(target=lambda: released.append(sem.release()))
    again = threading.Thread(target=lambda: acquired.append(sem.acquire(blocking=False)))
    beat._mutex.acquire()
    try:
        release.start()
        while sem.value is not None:  # the release is in _forget(), the mutex held
            assert time.monotonic() < deadline, "the release never started"
            time.sleep(0.001)
        again.start()
        while sem._unsure:  # the second attempt is in, waiting for the mutex in _take()
            assert time.monotonic() < deadline, "the second attempt never ended"
            time.sleep(0.001)
    finally:
        beat._mutex.release()
    release.join()
    again.join()
    assert released == [True]
    assert acquired == [True]
    second = sem.value
    assert second != first
    try:
        left = holders(nodes, name)
        assert all(first not in slots.values() for slots in left), (
            f"the released acquisition still holds a slot: {left}"
        )
    finally:
        sem.release()


def test_nodes_that_cannot_agree_are_left_as_found(servers: Any, make_redlock: Any) -> None:
    nodes = servers[:3]
    plant(nodes[0], "apart", {0: "a"})
    plant(nodes[1], "apart", {1: "b"})
    plant(nodes[2], "apart", {0: "c", 1: "d"})
    before = holders(nodes, "apart")
    redlock = make_redlock(nodes)
    # Two holders could each be valid on a majority only by sharing a slot number.
    assert not redlock.semaphore("apart", limit=2, ttl=5.0).acquire(blocking=False)
    assert holders(nodes, "apart") == before


def test_a_non_blocking_semaphore_with_a_timeout_is_refused(
    servers: Any, make_redlock: Any
) -> None:
    redlock = make_redlock(servers[:1])
    with pytest.raises(errors.ConfigurationError) as caught:
        redlock.semaphore("nb", limit=1, blocking=False, timeout=5.0)
    assert caught.value.option == "timeout"
    sem = redlock.semaphore("nb", limit=1, blocking=False, timeout=0)
    with pytest.raises(errors.ConfigurationError) as caught:
        sem.acquire(timeout=1.0)
    assert caught.value.option == "timeout"
    assert sem.acquire()
    with pytest.raises(errors.RedlockError):
        sem.acquire()  # held already
    sem.release()


def test_one_node_down_costs_no_extra_round_trip(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_redlock.lock import semaphore_slots as semaphore_module

    nodes = servers[:3]
    nodes[2].kill()
    redlock = make_redlock(nodes)
    sem = redlock.semaphore("trips", limit=2, ttl=5.0)
    assert sem.acquire(blocking=False)
    sem.release()
    fan_outs: list[int] = []
    real = semaphore_module.fan_out

    def counting(*args: Any, **kwargs: Any) -> Any:
        fan_outs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(semaphore_module, "fan_out", counting)
    assert sem.acquire(blocking=False)
    assert len(fan_outs) == 1  # the acquire only: nothing to undo on the node that is down
    sem.extend()
    assert sem.release()
    assert len(fan_outs) == 3


def test_locks_and_slots_renew_in_one_round_trip(
    servers: Any, make_redlock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_redlock.lock import redlock as redlock_module

    redlock = make_redlock(servers[:3])
    lock = redlock.lock("mixed-lock", ttl=5.0)
    sems = [redlock.semaphore(f"mixed:{n % 2}", limit=3, ttl=5.0) for n in range(4)]
    assert lock.acquire(blocking=False)
    for sem in sems:
        assert sem.acquire(blocking=False)
    fan_outs = count_fan_outs(monkeypatch, this_thread=True)
    time.sleep(0.2)
    sent = time.monotonic()
    assert redlock.renew([lock, *sems]) == [redlock_module.RENEWED] * 5
    # One pipeline per node: two SCRIPT LOADs, one renew.lua call, one semaphore_renew.lua call.
    assert fan_outs == [[4, 4, 4]]
    # A whole ttl again, counted from no earlier than the renewal's send (the
    # acquisitions' validity, 0.2 s older, is below this bound however slow
    # the round trip was).
    for sem in sems:
        validity = sem.validity
        assert validity >= 5.0 - (5.0 * 0.01 + 0.002) - (time.monotonic() - sent) - 1e-6


def test_release_by_owner_wakes_waiters(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3], retry_delay=30.0)
    dead = redlock.semaphore("own-wake", limit=1, ttl=30.0, owner="task-9|host:99")
    assert dead.acquire(blocking=False)
    waiter = redlock.semaphore("own-wake", limit=1, ttl=30.0)
    got = threading.Event()
    thread = threading.Thread(target=lambda: waiter.acquire(timeout=20.0) and got.set())
    thread.start()
    client = servers[0].client()
    deadline = time.monotonic() + 10
    while not client.exists("redlock:{own-wake}:sem:queue") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.exists("redlock:{own-wake}:sem:queue")  # queued before the release
    assert redlock.release_semaphore_owner("own-wake", "task-9", "host:99") == 3
    assert got.wait(10.0)  # retry_delay is 30 s: the release woke it
    thread.join()
    waiter.release()


def test_a_waiter_that_died_holds_others_back_only_until_its_entry_lapses(
    servers: Any, make_redlock: Any
) -> None:
    redlock = make_redlock(servers[:3], retry_delay=0.05)  # entries lapse after 1 s
    for server in servers[:3]:
        with server.client() as client:
            now = client.time()
            now_ms = now[0] * 1000 + now[1] // 1000
            # A waiter that arrived first and died: ticket 1, its entry lapsing
            # in 3 s (still there at the first attempt, on a loaded machine too).
            client.zadd("redlock:{ghost}:sem:queue", {"ghost": 1})
            client.zadd("redlock:{ghost}:sem:waiting", {"ghost": now_ms + 3000})
            client.pexpire("redlock:{ghost}:sem:queue", 3000)
            client.pexpire("redlock:{ghost}:sem:waiting", 3000)
    newcomer = redlock.semaphore("ghost", limit=1, ttl=5.0)
    assert not newcomer.acquire(blocking=False)  # the slot is owed to the waiter ahead
    assert newcomer.acquire(timeout=10.0)  # once the ghost's entry lapsed
    newcomer.release()


def test_heartbeat_reports_a_slot_taken_over(servers: Any, make_redlock: Any) -> None:
    redlock = make_redlock(servers[:3])
    sem = redlock.semaphore("beat-lost", limit=1, ttl=1.5)
    assert sem.acquire(blocking=False)
    lost = threading.Event()
    reasons: list[str] = []

    def on_lost(held: Any, reason: str) -> None:
        reasons.append(reason)
        lost.set()

    beat = Heartbeat()
    held = beat.hold(sem, task_id="task-1", on_lost=on_lost)
    try:
        thief = redlock.semaphore("beat-lost", limit=1, ttl=5.0)
        # A renewal that runs between the wipe and the thief's attempt puts
        # the slot back (as it should): wipe and try again until the thief has it.
        deadline = time.monotonic() + 10
        while True:
            for server in servers[:3]:
                server.client().delete("redlock:{beat-lost}:sem", "redlock:{beat-lost}:sem:expiry")
            if thief.acquire(blocking=False):
                break
            assert time.monotonic() < deadline, "the renewals always put the slot back"
        assert lost.wait(10.0)
    finally:
        beat.stop()
    assert held.lost
    assert "taken over" in reasons[0]
    assert not sem.locked()
    assert thief.locked()
    assert thief.release()


def test_an_outage_is_not_a_loss(servers: Any, make_redlock: Any) -> None:
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    sem = redlock.semaphore("outage", limit=2, ttl=5.0)
    assert sem.acquire(blocking=False)
    nodes[1].kill()
    nodes[2].kill()
    with pytest.raises(errors.QuorumUnavailable):
        sem.extend()
    assert sem.locked()  # kept: too few nodes answered to tell
    assert sem.release() is True  # still valid by the clock
    # Gone from the node that answered; the others' copies expire within the ttl.
    assert holders(nodes[:1], "outage") == [{}]


def test_callers_with_different_limits_are_bounded_by_the_largest(
    servers: Any, make_redlock: Any
) -> None:
    """flow-control.md: two limits for one name share its slots, at most the largest at once."""
    redlock = make_redlock(servers[:3])
    wide = [redlock.semaphore("mixed", limit=5, ttl=30.0) for _ in range(5)]
    narrow = [redlock.semaphore("mixed", limit=2, ttl=30.0) for _ in range(3)]
    # The wide ones hold slots 2-4 (0 and 1 taken first, then given back).
    assert all(sem.acquire(blocking=False) for sem in wide)
    wide[0].release()
    wide[1].release()
    # The narrow ones see slots 0 and 1 only: two of them get in, five in all.
    assert [sem.acquire(blocking=False) for sem in narrow] == [True, True, False]
    assert sorted(sem.slot for sem in narrow[:2]) == [0, 1]
    # And a wide one finds nothing either: the narrow holders count for it.
    assert not wide[0].acquire(blocking=False)
    for sem in (*wide[2:], *narrow[:2]):
        assert sem.release()
    assert semaphore_keys(servers[:3]) == {}


@pytest.mark.xfail(
    strict=True,
    reason="documented limitation (reliability.md, Slow and paused nodes): the main "
    "process's release by owner and a dead process's late acquire travel on two processes' "
    "connections, which keep no order",
)
def test_release_by_owner_sweeps_a_late_grant_of_a_dead_task_process(
    servers: Any, make_redlock: Any
) -> None:
    # A prefork worker's main process frees the slots of a task process that
    # died (tasks/app_setup.py, free_by_owner -> release_semaphore_owner). The
    # task process took slot 0 on nodes 0 and 1 while node 2 was paused; node
    # 2 runs that acquire late and grants slot 1 (its slot 0 is another
    # holder's). The main process's release reaches node 2 on ITS connection,
    # opened before the pause, so node 2 runs it first and the dead process's
    # acquire after it, on a connection it accepts only when it runs again:
    # the slot stays for its whole ttl (30 s), after its "release".
    nodes = servers[:3]
    name = "dead-run"
    plant(nodes[2], name, {0: "other"}, ttl_ms=60000)
    redlock = make_redlock(nodes)
    redlock.inspect("anything")  # this process's connections are open
    before = script_runs(nodes[2])
    nodes[2].pause()
    try:
        value, slot = acquire_in_a_process_that_dies("semaphore", name, "task-1|host:10", nodes)
        assert slot == "0"  # on nodes 0 and 1
        # The worker's cleanup: 2 slots freed (node 2 does not answer in time).
        assert redlock.release_semaphore_owner(name, "task-1", "host:10") == 2
    finally:
        nodes[2].resume()
    # the release by owner and the late acquire
    wait_for_script_runs(nodes[2], before + 2, "the acquire and the release")
    left = holders(nodes, name)
    assert all(value not in slots.values() for slots in left), (
        f"a slot of the dead run outlived its release by owner: {left}"
    )


def test_a_release_racing_a_new_acquisition_leaves_it_no_lost_reason(
    servers: Any, make_redlock: Any
) -> None:
    # 65d5322 reads the released acquisition's value, slot and unsure nodes
    # under the mutex, so an acquire() of the same object in between cannot
    # change what the release frees. What it reports is still written after
    # the mutex: a release that finds its slot lost sets self.lost_reason once
    # its round trip is back, by which time the other thread's acquisition
    # holds the object (and _take cleared lost_reason for it). The new,
    # valid acquisition then carries the old one's loss, and keeps it through
    # its own successful release. The release is held inside _forget() (its
    # heartbeat().drop() waits for the heartbeat's mutex) as in
    # test_a_release_sweeps_the_nodes_its_own_acquisition_never_heard.
    from celery_redlock.lock.renewal import heartbeat

    nodes = servers[:3]
    name = "reason-race"
    redlock = make_redlock(nodes)
    sem = redlock.semaphore(name, limit=3, ttl=30.0, auto_renew=True)
    assert sem.acquire(blocking=False)
    for node in nodes:  # the slot is gone (an empty restart of every node)
        with node.client() as client:
            client.delete(sem.keys.holders, sem.keys.expiry)

    beat = heartbeat()
    released: list[bool] = []
    acquired: list[bool] = []
    release = threading.Thread(target=lambda: released.append(sem.release()))
    again = threading.Thread(target=lambda: acquired.append(sem.acquire(blocking=False)))
    deadline = time.monotonic() + 10.0
    beat._mutex.acquire()
    try:
        release.start()
        while sem.value is not None:  # the release is in _forget(), the mutex held
            assert time.monotonic() < deadline, "the release never started"
            time.sleep(0.001)
        again.start()
        while len([slots for slots in holders(nodes, name) if slots]) < 2:
            assert time.monotonic() < deadline, "the second attempt never took a slot"
            time.sleep(0.001)
        time.sleep(0.05)  # the second attempt is in, waiting for the mutex in _take()
    finally:
        beat._mutex.release()
    release.join()
    again.join()
    assert released == [False]  # the first acquisition's slot was gone: right
    assert acquired == [True]
    try:
        assert sem.locked()
        assert sem.lost_reason is None, (
            f"a valid acquisition carries the previous one's loss: {sem.lost_reason!r}"
        )
    finally:
        assert sem.release()
    assert sem.lost_reason is None, (
        f"a release that found its slot held leaves a lost_reason: {sem.lost_reason!r}"
    )
