"""Redlock against real redis-server nodes: quorum, ownership, expiry, hand-off."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis

from celery_redlock import Redlock, errors
from celery_redlock.testing import RedisServer
from celery_redlock.transport.nodes import NodeFailure
from tests.support import (
    acquire_in_a_process_that_dies,
    all_topologies,
    heard_from,
    script_runs,
    wait_for_script_runs,
    with_node_timeout,
)

pytestmark = pytest.mark.integration

#: A first call opens the connections and loads the scripts, and on a loaded
#: machine a node (or this process) may wait its turn for a CPU for hundreds
#: of ms: tests not about node timeouts must not take such a wait for a
#: failed node (the ones about timeouts pass theirs).
NODE_TIMEOUT = 0.5


@pytest.fixture
def make_redlock(make_redlock):
    return with_node_timeout(make_redlock, NODE_TIMEOUT)


def assert_full_validity(lock, ttl, sent):
    """A whole ttl less the drift, counted from no earlier than ``sent`` (before the call)."""
    validity = lock.validity
    assert ttl - (ttl * 0.01 + 0.002) - (time.monotonic() - sent) - 1e-6 <= validity <= ttl


def wait_for_listener(server, redlock, name):
    """Until a waiter for ``name`` listens on ``server`` (its first attempt was refused)."""
    channel = redlock.keys(name).released
    with server.client() as client:
        deadline = time.monotonic() + 10
        while not client.pubsub_numsub(channel)[0][1]:
            assert time.monotonic() < deadline, "the waiter never listened"
            time.sleep(0.01)


def lock_keys(servers: list[RedisServer], pattern: str = "redlock:*") -> list[str]:
    keys = []
    for server in servers:
        if server.running and not server.paused:
            with server.client() as client:
                keys += [k.decode() for k in client.scan_iter(pattern) if b":fence" not in k]
    return keys


@all_topologies
def test_acquire_extend_release(topology, make_redlock):
    redlock = make_redlock(topology)
    lock = redlock.lock("invoice:42", ttl=2.0)
    sent = time.monotonic()
    assert lock.acquire(blocking=False)
    assert lock.locked()
    assert_full_validity(lock, 2.0, sent)
    assert isinstance(lock.fencing_token, int)
    time.sleep(0.3)
    sent = time.monotonic()  # 0.3 s after the acquisition: the bound says extended
    lock.extend()
    assert_full_validity(lock, 2.0, sent)
    assert lock.release() is True
    assert not lock.locked()
    assert lock.fencing_token is None
    assert lock_keys(topology) == []


@all_topologies
def test_second_owner_is_refused_until_release(topology, make_redlock):
    redlock = make_redlock(topology)
    first = redlock.lock("k", ttl=5.0)
    second = redlock.lock("k", ttl=5.0)
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    assert not second.acquire(timeout=0.2)
    first.release()
    assert second.acquire(blocking=False)
    second.release()


def test_second_owner_cannot_release_or_extend_a_held_lock(servers, make_redlock):
    redlock = make_redlock(servers[:3])
    holder = redlock.lock("k", ttl=5.0)
    assert holder.acquire(blocking=False)
    # An impostor with a token of its own (as a stale or foreign client has).
    impostor = redlock.lock("k", ttl=5.0)
    impostor._value = "0" * 32
    impostor._valid_until = time.monotonic() + 5
    assert impostor.release() is False
    assert holder.locked()
    impostor._value = "0" * 32
    impostor._valid_until = time.monotonic() + 5
    with pytest.raises(errors.LockLost):
        impostor.extend()
    # The holder's keys are untouched by both.
    assert len(lock_keys(servers[:3])) == 3
    holder.extend()
    assert holder.release() is True


def test_a_release_deletes_the_lock_s_preview_only_while_it_holds_the_lock(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    preview = redlock.keys("k").args
    first = redlock.lock("k", ttl=5.0)
    assert first.acquire(blocking=False)
    for node in nodes:
        with node.client() as client:
            client.set(preview, "first|(1,)", px=60_000)
    assert first.release() is True
    # Deleted with the lock, in the same script call.
    for node in nodes:
        with node.client() as client:
            assert client.exists(preview) == 0
    # A release that no longer holds the lock leaves the holder's preview.
    stale = redlock.lock("k", ttl=5.0)
    assert stale.acquire(blocking=False)
    token = stale._value
    stale.release()
    holder = redlock.lock("k", ttl=5.0)
    assert holder.acquire(blocking=False)
    for node in nodes:
        with node.client() as client:
            client.set(preview, "holder|(2,)", px=60_000)
    stale._value, stale._valid_until = token, time.monotonic() + 5
    assert stale.release() is False
    for node in nodes:
        with node.client() as client:
            assert client.get(preview) == b"holder|(2,)"
    assert holder.release() is True


def test_expiry_frees_the_lock_and_the_expired_owner_loses_it(servers, make_redlock):
    # A ttl longer than a scheduling delay: the lock is held when acquired.
    redlock = make_redlock(servers[:3], node_timeout=0.3)
    first = redlock.lock("k", ttl=0.8)
    assert first.acquire(blocking=False)
    time.sleep(1.0)
    assert not first.locked()
    second = redlock.lock("k", ttl=5.0)
    assert second.acquire(blocking=False)
    with pytest.raises(errors.LockLost):
        first.extend()
    assert first.release() is False
    assert second.locked()
    assert len(lock_keys(servers[:3])) == 3
    second.release()


def test_extend_never_recreates_an_expired_key(servers, make_redlock):
    redlock = make_redlock(servers[:3], node_timeout=0.3)
    lock = redlock.lock("k", ttl=0.8)
    assert lock.acquire(blocking=False)
    time.sleep(1.0)
    with pytest.raises(errors.LockLost):
        lock.extend()
    assert lock_keys(servers[:3]) == []


def test_one_node_killed_still_works(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=2.0)
    assert lock.acquire(blocking=False)
    nodes[0].kill()
    lock.extend()
    assert lock.locked()
    assert lock.release() is True
    assert lock.acquire(blocking=False)
    lock.release()


def test_two_nodes_killed_raise_quorum_unavailable_quickly(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    nodes[0].kill()
    nodes[1].kill()
    lock = redlock.lock("k", ttl=2.0)
    started = time.monotonic()
    with pytest.raises(errors.QuorumUnavailable) as raised:
        lock.acquire(timeout=5.0)
    # A few quick attempts, then the outage is reported: far below the timeout.
    assert time.monotonic() - started < 1.5
    assert raised.value.answered == 1
    assert raised.value.needed == 2
    assert "k" in str(raised.value)
    assert not isinstance(raised.value, errors.LockNotAcquired)
    assert lock_keys(nodes) == []


def test_a_blocking_acquire_rides_out_a_node_that_stalls_while_another_is_down(
    servers, make_redlock
):
    # One node down leaves no slack: a moment's stall on another means a
    # single attempt without a majority. A waiting caller must not be failed
    # for that; a caller that asked for one attempt is told at once.
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    nodes[0].kill()
    nodes[1].pause()
    with pytest.raises(errors.QuorumUnavailable):
        redlock.lock("k", ttl=2.0).acquire(blocking=False)
    resume = threading.Timer(0.06, nodes[1].resume)
    resume.start()
    lock = redlock.lock("k", ttl=2.0)
    try:
        assert lock.acquire(timeout=5.0)
    finally:
        resume.join()
    assert lock.release()


def test_a_paused_node_costs_at_most_the_node_timeout(servers, make_redlock):
    nodes = servers[:3]
    # A node timeout far above a scheduling delay: "at most the node
    # timeout" cannot be met by luck, nor missed for want of a CPU.
    redlock = make_redlock(nodes, node_timeout=1.0)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)  # connections are open before the pause
    lock.release()
    nodes[1].pause()
    for _ in range(3):
        started = time.monotonic()
        assert lock.acquire(blocking=False)
        acquired_in = time.monotonic() - started
        started = time.monotonic()
        lock.extend()
        extended_in = time.monotonic() - started
        started = time.monotonic()
        assert lock.release()
        released_in = time.monotonic() - started
        # node timeout (1 s) + a margin for a loaded machine, far below two
        assert acquired_in < 1.0 * 1.4, acquired_in
        assert extended_in < 1.0 * 1.4, extended_in
        assert released_in < 1.0 * 1.4, released_in


def test_partial_acquisition_is_undone_everywhere(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    # Another owner holds the key on two nodes: we can only get one.
    for server in nodes[1:]:
        with server.client() as client:
            client.set(redlock.key("k"), "someone-else", px=5000)
    lock = redlock.lock("k", ttl=2.0)
    assert not lock.acquire(blocking=False)
    with nodes[0].client() as client:
        assert client.get(redlock.key("k")) is None
    for server in nodes[1:]:
        with server.client() as client:
            assert client.get(redlock.key("k")) == b"someone-else"


def test_a_failed_attempt_undoes_only_where_its_token_may_be(servers, make_redlock, monkeypatch):
    from celery_redlock.lock import acquire_attempt
    from celery_redlock.lock import lock as lock_module

    nodes = servers[:3]
    redlock = make_redlock(nodes)
    redlock.inspect("warm-up")  # connections open, every node answered
    # A node that answers after the outcome was decided (a redis-server
    # waiting for a CPU) is rightly undone too, as it may hold the token:
    # such a try proves nothing here, and is made again.
    late = []
    real = lock_module.fan_out

    def noting_late(*args, **kwargs):
        results = real(*args, **kwargs)
        late.extend(r for r in results if isinstance(r, NodeFailure))
        return results

    monkeypatch.setattr(lock_module, "fan_out", noting_late)
    monkeypatch.setattr(acquire_attempt, "fan_out", noting_late)
    deadline = time.monotonic() + 30
    for n in itertools.count():
        busy, partial = f"busy:{n}", f"partial:{n}"
        for server in nodes:
            server.client().set(redlock.key(busy), "someone-else", px=30_000)
        for server in nodes[1:]:
            server.client().set(redlock.key(partial), "someone-else", px=30_000)
        late.clear()
        before = [script_runs(node) for node in nodes]
        # Busy everywhere: one round trip, nothing to undo.
        assert not redlock.lock(busy, ttl=2.0).acquire(blocking=False)
        after_busy = [script_runs(node) - b for node, b in zip(nodes, before, strict=True)]
        # Granted on node 0 only: the undo goes there alone.
        assert not redlock.lock(partial, ttl=2.0).acquire(blocking=False)
        after_partial = [script_runs(node) - b for node, b in zip(nodes, before, strict=True)]
        if not late:
            break
        assert time.monotonic() < deadline, f"some node always answered late: {late}"
    assert after_busy == [1, 1, 1]
    assert after_partial == [3, 2, 2]
    assert nodes[0].client().get(redlock.key(partial)) is None


def test_fencing_tokens_increase_through_a_node_restarted_empty(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    tokens = []
    for i in range(50):
        if i == 10:
            nodes[0].kill()
        if i == 25:
            nodes[0].start()  # back, empty: its counter starts again from 0
        if i == 35:
            nodes[1].restart()  # a second node loses its counter too
        lock = redlock.lock("fenced", ttl=2.0)
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
        lock.release()
    assert all(b > a for a, b in itertools.pairwise(tokens)), tokens


def test_fencing_bucket_has_a_ttl(servers, make_redlock):
    redlock = make_redlock(servers[:1], fence_ttl=3600.0)
    lock = redlock.lock("k", ttl=2.0)
    with lock, servers[0].client() as client:
        ttl = client.pttl(redlock.keys("k").fence)
    assert 3_500_000 < ttl <= 3_600_000


def test_an_acquisition_in_the_steady_state_is_one_round_trip(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    for _ in range(3):  # learns the nodes' clocks; the bucket exists
        with redlock.lock("k", ttl=2.0):
            pass
    redlock.inspect("k")  # every node answered: the warm-up's last release ran everywhere
    before = [script_runs(node) for node in nodes]
    tokens = []
    for _ in range(20):
        lock = redlock.lock("k", ttl=2.0)
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
        assert lock.release()
    # A release returns once a majority has it: the third may still be running.
    deadline = time.monotonic() + 5
    while any(script_runs(node) - b < 40 for node, b in zip(nodes, before, strict=True)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    # One acquire and one release script per node per pair: no fencing round.
    assert [script_runs(node) - b for node, b in zip(nodes, before, strict=True)] == [40] * 3
    assert all(b > a for a, b in itertools.pairwise(tokens)), tokens


def test_ten_thousand_names_leave_at_most_1024_fencing_keys_per_node(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    # Held throughout: 10,000 pairs can take a minute on a loaded machine.
    held = redlock.lock("still-held", ttl=600.0)
    assert held.acquire(blocking=False)
    for n in range(10_000):
        lock = redlock.lock(f"sync-user:{n}", ttl=5.0)
        assert lock.acquire(timeout=5.0)  # a node slow for a moment is asked again
        assert lock.release()
    for node in nodes:
        with node.client() as client:
            keys = client.dbsize()
            fences = sum(1 for _ in client.scan_iter(match="redlock:fence:*", count=1000))
        assert fences <= 1024
        assert keys <= 1024 + 1  # the buckets and the one lock still held
    assert held.release()


def test_blocked_waiter_takes_over_at_once_on_release(servers, make_redlock):
    # retry_delay is 30 s: only the release's notification wakes it in time
    # (a bound in ms would measure the machine's load, not the wake-up).
    redlock = make_redlock(servers[:3], retry_delay=30.0)
    holder = redlock.lock("handoff", ttl=10.0)
    assert holder.acquire(blocking=False)
    acquired_at: list[float] = []

    def wait() -> None:
        waiter = redlock.lock("handoff", ttl=10.0)
        assert waiter.acquire(timeout=10.0)
        acquired_at.append(time.monotonic())
        waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_listener(servers[0], redlock, "handoff")  # refused once, now asleep
    released_at = time.monotonic()
    holder.release()
    thread.join(10)
    assert acquired_at, "the waiter never got the lock"
    assert acquired_at[0] - released_at < 1.0


def test_waiter_wakes_even_when_the_holder_lacks_the_node_it_listens_on(servers, make_redlock):
    # A lock needs a majority, not every node: here the holder never got the
    # first node (the one a waiter listens on), yet its release must wake it.
    # retry_delay is 30 s: only the release's notification wakes it in time.
    redlock = make_redlock(servers[:3], retry_delay=30.0)
    servers[0].client().set(redlock.key("partial"), b"someone-else", px=10_000)
    holder = redlock.lock("partial", ttl=10.0)
    assert holder.acquire(blocking=False)
    acquired_at: list[float] = []

    def wait() -> None:
        waiter = redlock.lock("partial", ttl=10.0)
        assert waiter.acquire(timeout=10.0)
        acquired_at.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for_listener(servers[0], redlock, "partial")  # refused once, now asleep
    released_at = time.monotonic()
    holder.release()
    thread.join(10)
    assert acquired_at
    assert acquired_at[0] - released_at < 1.0


def test_waiter_wakes_when_the_holder_lets_the_lock_expire(servers, make_redlock):
    redlock = make_redlock(servers[:3], retry_delay=30.0, node_timeout=0.3)
    holder = redlock.lock("expiring", ttl=1.0)
    assert holder.acquire(blocking=False)
    started = time.monotonic()
    waiter = redlock.lock("expiring", ttl=2.0)
    assert waiter.acquire(timeout=20.0)
    # The retry delay is 30 s, but the waiter knew the key's time to live.
    assert time.monotonic() - started < 1.0 + 2.0
    waiter.release()


def test_blocking_acquire_gives_up_at_its_timeout(servers, make_redlock):
    redlock = make_redlock(servers[:3])
    holder = redlock.lock("busy", ttl=10.0)
    assert holder.acquire(blocking=False)
    started = time.monotonic()
    assert not redlock.lock("busy").acquire(timeout=0.3)
    # Not before its timeout; after it by an attempt and a loaded machine's
    # delays at most, far below the holder's 10 s.
    assert 0.3 <= time.monotonic() - started < 2.0
    with pytest.raises(errors.LockNotAcquired) as raised, redlock.lock("busy", timeout=0.1):
        pass
    assert raised.value.key == "busy"
    holder.release()


def test_context_manager_releases_on_error(servers, make_redlock):
    redlock = make_redlock(servers[:3])
    lock = redlock.lock("ctx", ttl=5.0)

    def fail_inside() -> None:
        with lock:
            assert lock.locked()
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail_inside()
    assert not lock.locked()
    assert lock_keys(servers[:3]) == []


def test_thousand_pairs_leave_no_key_behind(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    for i in range(1000):
        lock = redlock.lock(f"pair:{i % 7}", ttl=5.0)
        assert lock.acquire(timeout=5.0)  # a node slow for a moment is asked again
        lock.release()
    # The last release returned once a majority had it: let the third part land.
    deadline = time.monotonic() + 5.0
    while lock_keys(nodes) and time.monotonic() < deadline:
        redlock.inspect("pair:0")  # the links move only when a call drives them
        time.sleep(0.01)
    assert lock_keys(nodes) == []


def test_script_cache_flushed_is_reloaded(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    with redlock.lock("k", ttl=2.0):
        pass
    for server in nodes:
        with server.client() as client:
            client.script_flush()
    lock = redlock.lock("k", ttl=2.0)
    assert lock.acquire(blocking=False)
    lock.extend()
    assert lock.release()


def test_threads_sharing_one_redlock_exclude_each_other(servers, make_redlock, witness):
    redlock = make_redlock(servers[:3])
    overlaps = []
    done = []

    def work() -> None:
        with witness.client() as w:
            for _ in range(25):
                with redlock.lock("shared", ttl=5.0, timeout=20.0):
                    if w.incr("inside") != 1:
                        overlaps.append(1)
                    w.decr("inside")
                done.append(1)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(done) == 150
    assert overlaps == []


def test_clients_and_unix_sockets_and_passwords_as_nodes(tmp_path):
    socket_path = str(tmp_path / "redis.sock")
    with (
        RedisServer(extra_args=("--unixsocket", socket_path, "--unixsocketperm", "700")),
        RedisServer(extra_args=("--requirepass", "s3cret")) as guarded,
        RedisServer() as plain,
    ):
        redlock = Redlock(
            [
                f"unix://{socket_path}?db=0",
                f"redis://:s3cret@127.0.0.1:{guarded.port}/0",
                redis.Redis(host="127.0.0.1", port=plain.port, decode_responses=True),
            ],
            node_timeout=NODE_TIMEOUT,  # the first call connects, logs in, loads the script
        )
        assert "s3cret" not in repr(redlock)
        lock = redlock.lock("k", ttl=2.0)
        assert lock.acquire(blocking=False)
        with guarded.client(password="s3cret") as client:
            assert client.exists(redlock.key("k"))
        lock.release()
        wrong = Redlock([f"redis://:wrong@127.0.0.1:{guarded.port}/0"], node_timeout=NODE_TIMEOUT)
        with pytest.raises(errors.QuorumUnavailable):
            wrong.lock("k", ttl=2.0).acquire(blocking=False)
        redlock.close()
        wrong.close()


def test_a_lock_writes_its_key_and_one_shared_fencing_bucket(make_redlock, servers):
    redlock = make_redlock(servers[:1], key_prefix="app1:")
    with redlock.lock("user:7", ttl=2.0) as lock, servers[0].client() as client:
        keys = sorted(k.decode() for k in client.keys("app1:*"))
        token = lock.fencing_token
    bucket = redlock.keys("user:7").fence
    assert keys == sorted(["app1:{user:7}", bucket])
    assert bucket.startswith("app1:fence:")
    assert 0 <= int(bucket.rsplit(":", 1)[1]) < 1024
    with servers[0].client() as client:
        assert [k.decode() for k in client.keys("app1:*")] == [bucket]
    # The CLI reads the bucket through the Redlock, not by key.
    assert redlock.fencing_value("user:7") >= token
    assert redlock.fencing_values(["user:7", "never-used"]) == {
        "user:7": redlock.fencing_value("user:7")
    }


def test_connections_are_reused_in_a_process_with_many_open_files(servers, make_redlock):
    # Idle connections are checked without select(), which fails above
    # descriptor 1024; a busy worker process can hold that many.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 and (hard == resource.RLIM_INFINITY or hard >= 1200):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    files = [open("/dev/null") for _ in range(1100)]  # noqa: SIM115
    try:
        redlock = make_redlock(servers[:1])
        before = servers[0].client().info("stats")["total_connections_received"]
        for _ in range(20):
            lock = redlock.lock("many-files", ttl=5.0)
            assert lock.acquire(blocking=False)
            lock.release()
        after = servers[0].client().info("stats")["total_connections_received"]
        assert after - before <= 3  # the first connection, plus the two info() calls
    finally:
        for handle in files:
            handle.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- outages, losses and what the Lock API says about them ---------------------------


def test_extend_during_an_outage_keeps_a_valid_lock_and_says_quorum_unavailable(
    servers, make_redlock
):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    held = lock.value
    nodes[1].pause()
    nodes[2].pause()
    try:
        with pytest.raises(errors.QuorumUnavailable) as raised:
            lock.extend()
        assert not isinstance(raised.value, errors.LockLost)
        assert raised.value.answered == 1
        assert "'k'" in str(raised.value)
        assert lock.locked()
        assert lock.value == held
    finally:
        nodes[1].resume()
        nodes[2].resume()
    lock.extend()  # the nodes are back: the lock was never given up
    assert lock.locked()
    assert lock.release() is True


def test_release_during_an_outage_of_a_still_valid_lock_is_not_a_loss(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=2.0)
    assert lock.acquire(blocking=False)
    nodes[1].pause()
    nodes[2].pause()
    try:
        assert lock.release() is True
        assert lock.lost_reason is None
    finally:
        nodes[1].resume()
        nodes[2].resume()


def test_extend_of_a_lock_deleted_on_a_majority_is_lost_and_says_what_happened(
    servers, make_redlock
):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    with nodes[0].client() as client:
        client.delete(redlock.key("k"))
    with nodes[1].client() as client:
        client.set(redlock.key("k"), "another-owner", px=5000)
    with pytest.raises(errors.LockLost) as raised:
        lock.extend()
    message = str(raised.value)
    assert "1 of 3 nodes held it (2 needed)" in message
    assert "gone from 1 node" in message
    assert "taken over by another owner on 1 node" in message
    assert not lock.locked()
    with nodes[1].client() as client:
        assert client.get(redlock.key("k")) == b"another-owner"
    assert lock_keys(nodes) == ["redlock:{k}"]  # only the other owner's key is left


def test_with_block_raises_lock_lost_when_the_release_finds_the_lock_gone(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)

    def wipe() -> None:
        for node in nodes:
            with node.client() as client:
                client.delete(redlock.key("k"))

    def block(fail: bool) -> None:
        with redlock.lock("k", ttl=5.0):
            wipe()
            if fail:
                raise ZeroDivisionError

    with pytest.raises(errors.LockLost) as raised:
        block(fail=False)
    assert "'k'" in str(raised.value)
    # A block that raises keeps its own exception.
    with pytest.raises(ZeroDivisionError):
        block(fail=True)


def test_extend_with_a_ttl_changes_the_current_hold_only(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=2.0)
    assert lock.acquire(blocking=False)
    lock.extend(10.0)
    assert lock.validity > 9.0
    assert lock.ttl == 2.0
    with nodes[0].client() as client:
        assert client.pttl(redlock.key("k")) > 9000
    lock.extend()
    assert lock.validity <= 2.0
    assert lock.release()
    assert lock.acquire(blocking=False)
    with nodes[0].client() as client:
        assert client.pttl(redlock.key("k")) <= 2000
    assert lock.release()


def test_a_lock_is_extended_and_released_from_another_object_by_its_token(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    elsewhere = make_redlock(nodes)  # another process, in effect
    lock = redlock.lock("k", ttl=2.0, owner="job-7")
    assert lock.acquire(blocking=False)
    adopted = elsewhere.lock("k", ttl=5.0, token=lock.value)
    assert adopted.owner == "job-7"
    assert not adopted.locked()  # validity unknown until confirmed
    adopted.extend()
    assert adopted.locked()
    assert 4.8 < adopted.validity <= 5.0
    with nodes[0].client() as client:
        assert client.pttl(redlock.key("k")) > 4000
    assert adopted.release() is True
    assert lock_keys(nodes) == []
    # A wrong token extends nothing.
    stranger = elsewhere.lock("k", ttl=5.0, token="0" * 32)
    with pytest.raises(errors.LockLost):
        stranger.extend()


def test_hand_over_passes_the_held_key_to_a_new_owner_without_freeing_it(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=2.0, owner="job-7|host:1")
    assert lock.acquire(blocking=False)
    assert lock.hand_over("job-7|queued", ttl=30.0) is True
    assert not lock.locked()
    assert lock.release() is False  # nothing left to release: the key is the new owner's
    value = redlock.holder("k")
    assert value is not None
    assert value.endswith("|job-7|queued")
    with nodes[0].client() as client:
        assert client.pttl(redlock.key("k")) > 20_000
    # Another owner's key is never replaced: the hand-over fails, the lock is kept.
    other = redlock.lock("j", ttl=5.0, owner="job-8|host:1")
    assert other.acquire(blocking=False)
    for node in nodes[:2]:
        with node.client() as client:
            client.set(redlock.key("j"), "another-owner", px=5000)
    assert other.hand_over("job-8|queued", ttl=30.0) is False
    assert other.locked()
    with nodes[0].client() as client:
        assert client.get(redlock.key("j")) == b"another-owner"


def test_extend_places_the_key_on_a_node_that_came_back(servers, make_redlock):
    nodes = servers[:3]
    # Room for heard_from's pause of node 0.
    redlock = make_redlock(nodes, node_timeout=5.0)
    nodes[2].kill()
    lock = redlock.lock("k", ttl=30.0)
    assert lock.acquire(blocking=False)  # on nodes 0 and 1 only
    nodes[2].start()
    # Once nodes 0 and 1 confirmed, the key goes back where node 2 said it lacked it.
    heard_from(nodes[2], nodes[0], lock.extend)
    with nodes[2].client() as client:
        assert client.get(redlock.key("k")) == lock.value.encode()
    nodes[0].kill()
    lock.extend()  # nodes 1 and 2: still a majority
    assert lock.locked()
    assert lock.release() is True


def test_a_late_extend_places_nothing_the_next_renewal_puts_the_key_back(servers, make_redlock):
    from celery_redlock.lock.redlock import RENEWED

    nodes = servers[:3]
    # A node that missed a deadline is then waited for a tenth of this.
    redlock = make_redlock(nodes, node_timeout=2.0)
    nodes[2].kill()
    lock = redlock.lock("k", ttl=30.0)
    assert lock.acquire(blocking=False)  # on nodes 0 and 1 only
    nodes[2].start()  # empty: no key, no script
    nodes[2].pause()
    try:
        lock.extend()  # decided by nodes 0 and 1; node 2's part is not waited for
        assert lock.locked()
    finally:
        nodes[2].resume()
    # No further call: the part already sent (or sent by the flusher) runs
    # once node 2 reads it, its script's source going with it on the new
    # connection. It finds no key and writes none: a copy goes back only
    # where the client heard it missing, after a majority confirmed.
    deadline = time.monotonic() + 5.0
    while script_runs(nodes[2]) == 0:
        assert time.monotonic() < deadline, "the late extend never ran"
        time.sleep(0.01)
    with nodes[2].client() as client:
        assert client.get(redlock.key("k")) is None
    # A renewal waits for every node: it hears node 2 and puts the key back.
    assert redlock.renew([lock]) == [RENEWED]
    with nodes[2].client() as client:
        assert client.get(redlock.key("k")) == lock.value.encode()
    assert lock.release() is True


def test_extend_never_places_the_key_over_another_owner(servers, make_redlock):
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    with nodes[2].client() as client:
        client.set(redlock.key("k"), "another-owner", px=10_000)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    lock.extend()
    with nodes[2].client() as client:
        assert client.get(redlock.key("k")) == b"another-owner"
    assert lock.release()


def test_renewal_that_finds_the_key_overwritten_with_another_type_is_lost(servers, make_redlock):
    from celery_redlock.lock.redlock import LOST

    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    for node in nodes[:2]:
        with node.client() as client:
            client.delete(redlock.key("k"))
            client.rpush(redlock.key("k"), "someone")
    assert redlock.renew([lock]) == [LOST]
    assert "taken over by another owner on 2 nodes" in lock.lost_reason
    assert not lock.locked()
    for node in nodes[:2]:
        with node.client() as client:
            assert client.lrange(redlock.key("k"), 0, -1) == [b"someone"]


@pytest.mark.xfail(
    strict=True,
    reason="documented limitation (reliability.md, Slow and paused nodes): the main "
    "process's release by owner and a dead process's late acquire travel on two processes' "
    "connections, which keep no order",
)
def test_release_owner_frees_a_late_write_of_a_dead_task_process(servers, make_redlock):
    # A prefork worker's main process frees the locks of a task process that
    # died (tasks/app_setup.py, free_by_owner -> release_owner). The task
    # process took the lock on nodes 0 and 1 while node 2 was paused; its
    # acquire is still queued for node 2. The main process's release reaches
    # node 2 on ITS connection, opened before the pause, so node 2 runs it
    # first and the dead process's acquire after it, on a connection it
    # accepts only when it runs again: the key stays for its whole ttl (30 s)
    # after its release.
    nodes = servers[:3]
    redlock = make_redlock(nodes)
    redlock.inspect("anything")  # this process's connections are open
    before = script_runs(nodes[2])
    nodes[2].pause()
    try:
        value, _ = acquire_in_a_process_that_dies("lock", "dead-run", "task-1|host:10", nodes)
        # The worker's cleanup: freed on 2 nodes (node 2 does not answer in time).
        assert redlock.release_owner("dead-run", "task-1", "host:10") == 2
    finally:
        nodes[2].resume()
    # the release by owner and the late acquire
    wait_for_script_runs(nodes[2], before + 2, "the acquire and the release")
    left = redlock.inspect("dead-run")
    assert all(entry[0] != value for entry in left if not isinstance(entry, NodeFailure)), (
        f"the dead run's lock outlived its release by owner: {left}"
    )


def test_a_release_racing_a_new_acquisition_leaves_it_no_lost_reason(servers, make_redlock):
    # Lock.release() forgets the acquisition under the mutex, then writes what
    # its round trip found (lost_reason) after leaving it: an acquire() of the
    # same object in between is a valid acquisition that carries the old one's
    # loss. Held inside _forget() as in test_semaphore.py's
    # test_a_release_sweeps_the_nodes_its_own_acquisition_never_heard.
    from celery_redlock.lock.renewal import heartbeat

    nodes = servers[:3]
    redlock = make_redlock(nodes)
    lock = redlock.lock("reason-race", ttl=30.0, auto_renew=True)
    assert lock.acquire(blocking=False)
    for node in nodes:  # gone from every node (an empty restart of each)
        with node.client() as client:
            client.delete(lock.key)

    beat = heartbeat()
    released: list[bool] = []
    acquired: list[bool] = []
    release = threading.Thread(target=lambda: released.append(lock.release()))
    again = threading.Thread(target=lambda: acquired.append(lock.acquire(blocking=False)))
    deadline = time.monotonic() + 10.0
    beat._mutex.acquire()
    try:
        release.start()
        while lock.value is not None:  # the release is in _forget(), the mutex held
            assert time.monotonic() < deadline, "the release never started"
            time.sleep(0.001)
        again.start()
        while (
            sum(isinstance(e, tuple) and e[0] is not None for e in redlock.inspect(lock.name)) < 2
        ):
            assert time.monotonic() < deadline, "the second attempt never took the lock"
            time.sleep(0.001)
        time.sleep(0.05)  # the second attempt is in, waiting for the mutex in _take()
    finally:
        beat._mutex.release()
    release.join()
    again.join()
    assert released == [False]  # the first acquisition was gone: right
    assert acquired == [True]
    try:
        assert lock.locked()
        assert lock.lost_reason is None, (
            f"a valid acquisition carries the previous one's loss: {lock.lost_reason!r}"
        )
    finally:
        assert lock.release()
