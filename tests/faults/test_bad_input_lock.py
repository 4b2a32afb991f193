"""Bad input and odd servers at the lock level: a clear error, never corruption.

Each test is one row of the bad-input table in docs/reliability.md. "Nothing
corrupted" is checked on the servers themselves: no stray lock key, keys
written by others untouched, and the lock still usable afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from celery_redlock import Redlock, errors
from celery_redlock.lock.redlock import RENEWED
from celery_redlock.testing import RedisServer
from celery_redlock.transport.commands import NodeFailure, WrongReply
from celery_redlock.transport.resp import INCOMPLETE, parse

from ..support import with_node_timeout

pytestmark = [pytest.mark.faults, pytest.mark.integration]

MEGABYTE = 1024 * 1024


def lock_keys(nodes, redlock: Redlock, name: str) -> list[bytes]:
    """The lock key of ``name`` on every node that has it."""
    found = []
    for node in nodes:
        with node.client() as client:
            if client.exists(redlock.key(name)):
                found.append(client.get(redlock.key(name)))
    return found


def settled_keys(nodes, redlock: Redlock, name: str, expected: list[bytes]) -> list[bytes]:
    """:func:`lock_keys` once it equals ``expected``, or after 5 s.

    acquire() and release() return once a majority answered: the last
    node's part may still be on its way.
    """
    deadline = time.monotonic() + 5.0
    found = lock_keys(nodes, redlock, name)
    while found != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        redlock.inspect(name)  # the links move only when a call drives them
        found = lock_keys(nodes, redlock, name)
    return found


def all_keys(nodes) -> list[bytes]:
    keys = []
    for node in nodes:
        with node.client() as client:
            keys += client.keys("*")
    return keys


@pytest.fixture
def nodes(servers) -> list[RedisServer]:
    return list(servers)[:3]


@pytest.fixture
def make_redlock(make_redlock):
    # These tests are about input, not timing: a node timeout no scheduling
    # delay of a loaded machine reaches, unless a test sets its own.
    return with_node_timeout(make_redlock, 0.3)


@pytest.fixture
def spare_servers() -> Iterator[list[RedisServer]]:
    """Servers of a test's own, for settings that must not outlive it."""
    started: list[RedisServer] = []
    yield started
    for server in started:
        server.cleanup()


def start(spare_servers: list[RedisServer], *extra_args: str) -> RedisServer:
    server = RedisServer(extra_args=extra_args).start()
    spare_servers.append(server)
    return server


# -- names ---------------------------------------------------------------------------


def test_a_one_megabyte_name_works_and_leaves_nothing_behind(nodes, make_redlock):
    # 1 MB to each of 3 nodes per call: a loaded machine can take longer than
    # the default 50 ms node timeout, and this test is about the name.
    redlock = make_redlock(nodes, node_timeout=2.0)
    name = "n" * MEGABYTE
    lock = redlock.lock(name, ttl=5.0)
    assert lock.acquire(blocking=False)
    assert isinstance(lock.fencing_token, int)
    assert not redlock.lock(name, ttl=5.0).acquire(blocking=False)
    lock.extend()
    assert lock.release()
    assert lock_keys(nodes, redlock, name) == []


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("счёт:42", id="cyrillic"),
        pytest.param("🔒:訂單:42", id="emoji-cjk"),
        pytest.param("a b\tc\nd", id="whitespace"),
        pytest.param("nul\x00inside", id="nul"),
        pytest.param("e\u0301", id="combining"),
        pytest.param("{tag}:x", id="braces"),
    ],
)
def test_unicode_and_binary_safe_names_work(nodes, make_redlock, name):
    redlock = make_redlock(nodes)
    lock = redlock.lock(name, ttl=5.0)
    assert lock.acquire(blocking=False)
    # Stored under the name's UTF-8 bytes, on every node, with our token.
    held = [lock.value.encode()] * 3
    assert settled_keys(nodes, redlock, name, held) == held
    assert redlock.holder(name) == lock.value
    assert not redlock.lock(name, ttl=5.0).acquire(blocking=False)
    assert lock.release()
    assert lock_keys(nodes, redlock, name) == []


@pytest.mark.parametrize("name", [b"invoice:42", bytearray(b"x"), 42, None, ""])
def test_names_that_are_not_text_are_refused_before_any_round_trip(nodes, make_redlock, name):
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock(name, ttl=5.0)
    assert raised.value.option == "name"
    assert "non-empty string" in str(raised.value)
    assert all_keys(nodes) == []


def test_a_name_that_cannot_be_encoded_fails_without_touching_redis(nodes, make_redlock):
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError, match="UTF-8"):
        redlock.lock("broken-\udcff", ttl=5.0)  # a lone surrogate has no UTF-8 form
    assert all_keys(nodes) == []
    assert redlock.lock("fine", ttl=5.0).acquire(blocking=False)


def test_a_name_that_cannot_be_encoded_is_a_configuration_error(nodes, make_redlock):
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock("broken-\udcff", ttl=5.0).acquire(blocking=False)
    assert raised.value.option == "name"


# -- ttl and timeouts -------------------------------------------------------------------


BAD_SECONDS = [
    pytest.param(0, id="zero"),
    pytest.param(-1, id="negative"),
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param("5", id="str"),
    pytest.param(True, id="bool"),
]


@pytest.mark.parametrize("ttl", BAD_SECONDS)
def test_bad_ttl_is_refused_and_a_held_lock_is_unchanged(nodes, make_redlock, ttl):
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock("k", ttl=ttl)
    assert raised.value.option == "ttl"
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    held = lock.value
    with pytest.raises(errors.ConfigurationError) as raised:
        lock.extend(ttl)
    assert raised.value.option == "ttl"
    assert lock.locked()
    assert lock.value == held
    assert lock.ttl == 5.0
    assert settled_keys(nodes, redlock, "k", [held.encode()] * 3) == [held.encode()] * 3
    assert lock.release()


@pytest.mark.parametrize("timeout", [p for p in BAD_SECONDS if p.id != "zero"])
def test_bad_acquire_timeout_is_refused_before_any_round_trip(nodes, make_redlock, timeout):
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock("k", ttl=5.0).acquire(timeout=timeout)
    assert raised.value.option == "timeout"
    with pytest.raises(errors.ConfigurationError):
        redlock.lock("k", ttl=5.0, timeout=timeout)
    assert all_keys(nodes) == []


def test_zero_timeout_makes_one_attempt_and_leaves_the_holder_alone(nodes, make_redlock):
    redlock = make_redlock(nodes)
    holder = redlock.lock("k", ttl=5.0)
    assert holder.acquire(blocking=False)
    # acquire() returns once a majority granted: let the third node's write land.
    deadline = time.monotonic() + 5.0
    while len(lock_keys(nodes, redlock, "k")) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
        redlock.inspect("k")  # the links move only when a call drives them
    started = time.monotonic()
    assert not redlock.lock("k", ttl=5.0).acquire(timeout=0)
    with pytest.raises(errors.LockNotAcquired), redlock.lock("k", ttl=5.0, timeout=0):
        pass
    assert time.monotonic() - started < 1.0
    assert lock_keys(nodes, redlock, "k") == [holder.value.encode()] * 3
    assert holder.release()


@pytest.mark.parametrize("ttl", [1e20, 365 * 24 * 3600.0 + 1])
def test_a_ttl_beyond_a_year_is_refused_when_the_lock_is_built(nodes, make_redlock, ttl):
    # 1e20 s is 1e23 ms: more than Redis can store. Refused before any round
    # trip, so a Celery task is not re-queued forever on "nodes unavailable".
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock("k", ttl=ttl)
    assert raised.value.option == "ttl"
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    held = lock.value
    with pytest.raises(errors.ConfigurationError):
        lock.extend(ttl)
    assert settled_keys(nodes, redlock, "k", [held.encode()] * 3) == [held.encode()] * 3
    assert lock.release()
    with pytest.raises(errors.ConfigurationError) as raised:
        make_redlock(nodes, default_ttl=ttl)
    assert raised.value.option == "default_ttl"


def test_an_extend_to_a_ttl_acquire_would_refuse_leaves_the_lock_untouched(nodes, make_redlock):
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    held = lock.value
    validity = lock.validity
    with pytest.raises(errors.ConfigurationError) as raised:
        lock.extend(0.001)  # below twice the node timeout
    assert raised.value.option == "ttl"
    assert lock.locked()
    assert lock.value == held
    assert lock.validity <= validity
    for node in nodes:
        with node.client() as client:
            assert client.get(redlock.key("k")) == held.encode()
            assert client.pttl(redlock.key("k")) > 4000
    lock.extend()
    assert lock.release()


def test_a_non_blocking_acquire_with_a_timeout_is_refused(nodes, make_redlock):
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0)
    with pytest.raises(errors.ConfigurationError) as raised:
        lock.acquire(blocking=False, timeout=5)
    assert raised.value.option == "timeout"
    assert all_keys(nodes) == []
    # Zero is no wait: the same as blocking=False.
    assert lock.acquire(blocking=False, timeout=0)
    assert lock.release()


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        pytest.param({"fence_ttl": 1e20}, "fence_ttl", id="fence-ttl-beyond-redis"),
        pytest.param({"fence_ttl": 366 * 24 * 3600.0}, "fence_ttl", id="fence-ttl-over-a-year"),
        pytest.param({"fence_ttl": 60.0}, "fence_ttl", id="fence-ttl-under-an-hour"),
        pytest.param({"node_timeout": 1e-9}, "node_timeout", id="node-timeout-nanosecond"),
        pytest.param({"node_timeout": 1e12}, "node_timeout", id="node-timeout-huge"),
        pytest.param({"retry_delay": 1e12}, "retry_delay", id="retry-delay-huge"),
        pytest.param({"drift_factor": False}, "drift_factor", id="drift-bool"),
        pytest.param({"drift_factor": float("nan")}, "drift_factor", id="drift-nan"),
        pytest.param({"key_prefix": "app-\udcff:"}, "key_prefix", id="prefix-not-utf8"),
    ],
)
def test_redlock_options_out_of_range_are_refused(kwargs, option):
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock(["redis://127.0.0.1:6390/0"], **kwargs)
    assert raised.value.option == option
    assert option in str(raised.value)


@pytest.mark.parametrize("option", ["owner", "replaces", "token"])
def test_owner_replaces_and_token_without_a_utf8_form_are_refused(nodes, make_redlock, option):
    redlock = make_redlock(nodes)
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock("k", ttl=5.0, **{option: "task|\udcff"})
    assert raised.value.option == option
    assert all_keys(nodes) == []


# -- URLs and types ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis://127.0.0.1:99999/0", id="port-out-of-range"),
        pytest.param("redis://127.0.0.1:-1/0", id="negative-port"),
        pytest.param("127.0.0.1:6390", id="no-scheme"),
        pytest.param("https://127.0.0.1/", id="other-scheme"),
        pytest.param("", id="empty"),
        pytest.param("rediss://", id="tls-no-host"),
        pytest.param("redis://:hunter2@:6390/0", id="password-no-host"),
    ],
)
def test_malformed_urls_fail_at_construction(url):
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock([url])
    assert raised.value.option == "nodes"
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis://127.0.0.1:6390/notadb", id="db-not-a-number"),
        pytest.param("unix://", id="unix-no-path"),
    ],
)
def test_urls_redis_py_accepts_loosely_fail_at_construction(url):
    with pytest.raises(errors.ConfigurationError):
        Redlock([url])


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis://127.0.0.1:1/0", id="refused"),
        pytest.param("unix:///nonexistent/redis.sock", id="no-socket"),
    ],
)
def test_well_formed_but_unreachable_nodes_fail_fast_at_acquire(url):
    redlock = Redlock([url, "redis://:hunter2@127.0.0.1:3/0", "redis://127.0.0.1:2/0"])
    started = time.monotonic()
    with pytest.raises(errors.QuorumUnavailable) as raised:
        redlock.lock("k", ttl=5.0).acquire(timeout=5.0)
    assert time.monotonic() - started < 3.0
    message = str(raised.value)
    assert "only 0 of 3" in message
    assert "hunter2" not in message
    assert raised.value.needed == 2
    redlock.close()


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        pytest.param({"nodes": None}, "nodes", id="nodes-none"),
        pytest.param({"nodes": [None]}, "nodes", id="node-none"),
        pytest.param({"nodes": [b"redis://127.0.0.1:6390/0"]}, "nodes", id="node-bytes"),
        pytest.param({"node_timeout": True}, "node_timeout", id="node-timeout-bool"),
        pytest.param({"node_timeout": -0.1}, "node_timeout", id="node-timeout-negative"),
        pytest.param({"default_ttl": "30"}, "default_ttl", id="default-ttl-str"),
        pytest.param({"default_ttl": float("inf")}, "default_ttl", id="default-ttl-inf"),
        pytest.param({"retry_delay": 0}, "retry_delay", id="retry-delay-zero"),
        pytest.param({"fence_ttl": "x"}, "fence_ttl", id="fence-ttl-str"),
        pytest.param({"fence_ttl": 0}, "fence_ttl", id="fence-ttl-zero"),
        pytest.param({"drift_factor": 0.7}, "drift_factor", id="drift-too-large"),
        pytest.param({"drift_factor": "x"}, "drift_factor", id="drift-str"),
        pytest.param({"key_prefix": b"app:"}, "key_prefix", id="prefix-bytes"),
    ],
)
def test_wrong_types_for_redlock_options(kwargs, option):
    arguments = {"nodes": ["redis://127.0.0.1:6390/0"], **kwargs}
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock(**arguments)
    assert raised.value.option == option
    assert option in str(raised.value)


@pytest.mark.parametrize("nodes", [6390, 3.5])
def test_nodes_that_is_not_a_sequence_is_a_configuration_error(nodes):
    with pytest.raises(errors.ConfigurationError):
        Redlock(nodes)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        pytest.param({"owner": 5}, "owner", id="owner-int"),
        pytest.param({"timeout": "1"}, "timeout", id="timeout-str"),
        pytest.param({"ttl": [5]}, "ttl", id="ttl-list"),
    ],
)
def test_wrong_types_for_lock_options(kwargs, option):
    redlock = Redlock(["redis://127.0.0.1:6390/0"])
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock("k", **kwargs)
    assert raised.value.option == option


# -- a node that answers with an error ----------------------------------------------------------


def test_wrongtype_lock_key_on_one_node_leaves_it_alone_and_locks_on_the_others(
    nodes, make_redlock
):
    redlock = make_redlock(nodes)
    with nodes[0].client() as client:
        client.rpush(redlock.key("k"), "someone", "else")
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    assert not redlock.lock("k", ttl=5.0).acquire(blocking=False)
    report = redlock.inspect("k")
    assert "WRONGTYPE" in str(report[0])
    lock.extend()
    assert lock.release()
    with nodes[0].client() as client:
        assert client.lrange(redlock.key("k"), 0, -1) == [b"someone", b"else"]
    assert lock_keys(nodes[1:], redlock, "k") == []


def test_wrongtype_lock_key_on_a_majority_reads_as_busy(nodes, make_redlock):
    redlock = make_redlock(nodes)
    for node in nodes[:2]:
        with node.client() as client:
            client.rpush(redlock.key("k"), "someone")
    assert not redlock.lock("k", ttl=5.0).acquire(timeout=0.2)
    with pytest.raises(errors.LockNotAcquired) as raised, redlock.lock("k", ttl=5.0, timeout=0):
        pass
    assert raised.value.key == "k"
    for node in nodes[:2]:
        with node.client() as client:
            assert client.lrange(redlock.key("k"), 0, -1) == [b"someone"]
    assert lock_keys(nodes[2:], redlock, "k") == []


def test_a_foreign_value_without_ttl_reads_as_busy_and_is_never_touched(nodes, make_redlock):
    redlock = make_redlock(nodes)
    for node in nodes:
        with node.client() as client:
            client.set(redlock.key("k"), "written by hand")
    lock = redlock.lock("k", ttl=5.0)
    assert not lock.acquire(timeout=0.2)
    assert lock.release() is False
    assert lock_keys(nodes, redlock, "k") == [b"written by hand"] * 3


def test_wrongtype_fencing_counter_everywhere_is_a_clear_error_and_leaves_no_lock(
    nodes, make_redlock
):
    # The acquire script reads the bucket before it writes anything: a
    # bucket of another type is an error reply and leaves no lock key.
    redlock = make_redlock(nodes)
    fence = redlock.keys("k").fence
    for node in nodes:
        with node.client() as client:
            client.hset(fence, "someone", "else")
    with pytest.raises(errors.QuorumUnavailable) as raised:
        redlock.lock("k", ttl=5.0).acquire(blocking=False)
    assert raised.value.answered == 0
    assert all(isinstance(error, redis.ResponseError) for error in raised.value.failures.values())
    assert lock_keys(nodes, redlock, "k") == []
    for node in nodes:
        with node.client() as client:
            assert client.hgetall(fence) == {b"someone": b"else"}


@pytest.mark.parametrize("planted", [str(2**53), str(2**53 + 1), "99999999999999999999"])
def test_a_fencing_bucket_at_2_53_is_a_clear_error_not_busy(nodes, make_redlock, planted):
    # No token can be larger: planted, or a node clock past the year 2255.
    redlock = make_redlock(nodes)
    fence = redlock.keys("k").fence
    for node in nodes:
        with node.client() as client:
            client.set(fence, planted)
    lock = redlock.lock("k", ttl=5.0)
    for blocking in (False, True):
        with pytest.raises(errors.QuorumUnavailable) as raised:
            lock.acquire(blocking=blocking, timeout=None if not blocking else 2.0)
        assert set(raised.value.failures) == {node.name for node in redlock.nodes}
        assert all(isinstance(error, ResponseError) for error in raised.value.failures.values())
        message = str(raised.value)
        assert all(node.name in message for node in redlock.nodes), message
        assert fence in message, message
        assert "2^53" in message, message
    assert lock_keys(nodes, redlock, "k") == []
    # On one node only: the other two issue tokens, below 2^53.
    with nodes[1].client() as client:
        client.delete(fence)
    with nodes[2].client() as client:
        client.delete(fence)
    assert lock.acquire(blocking=False)
    assert lock.fencing_token < 2**53
    assert lock.release()


def test_noscript_after_script_flush_mid_hold_and_mid_run(nodes, make_redlock):
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    for node in nodes:
        with node.client() as client:
            client.script_flush()
    lock.extend()
    assert not redlock.lock("k", ttl=5.0).acquire(blocking=False)
    assert lock.release()

    # Flushes racing a busy loop of acquire / extend / release.
    done = threading.Event()
    failures: list[BaseException] = []

    def flush_repeatedly() -> None:
        clients = [node.client() for node in nodes]
        while not done.is_set():
            for client in clients:
                client.script_flush()
            time.sleep(0.002)
        for client in clients:
            client.close()

    flusher = threading.Thread(target=flush_repeatedly)
    flusher.start()
    try:
        for _ in range(200):
            lock = redlock.lock("k", ttl=5.0)
            try:
                assert lock.acquire(timeout=2.0)
                lock.extend()
                assert lock.release()
            except Exception as exc:  # collected: the flusher must be stopped first
                failures.append(exc)
    finally:
        done.set()
        flusher.join(10)
    assert failures == []
    # A release returns once a majority confirmed; the last node's part,
    # sent again if the flush beat it, lands a moment later (the ttl is 5 s):
    # sent again by the next call that reads that node's error reply.
    deadline = time.monotonic() + 2.0
    while lock_keys(nodes, redlock, "k"):
        assert time.monotonic() < deadline, lock_keys(nodes, redlock, "k")
        time.sleep(0.01)
        redlock.inspect("k")  # the links move only when a call drives them


def assert_refused_by(
    error: errors.QuorumUnavailable, servers: list[RedisServer], refusal: type[ResponseError]
) -> None:
    """``error`` names exactly ``servers``, each of which answered with a refusal.

    The refusal's class is checked on a plain write: a script's error reply
    carries it as its own code on Redis 7 and Valkey, inside a generic ``ERR``
    on Redis 6.2. Its words, whatever they are, reach the caller.
    """
    assert set(error.failures) == {server.url for server in servers}
    for server in servers:
        answered = error.failures[server.url]
        assert isinstance(answered, ResponseError)  # an answer, not a node that is down
        assert str(answered) in str(error)
        with server.client() as client, pytest.raises(refusal):
            client.set("probe", "x")


@contextlib.contextmanager
def out_of_memory(server: RedisServer) -> Iterator[None]:
    with server.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        try:
            yield
        finally:
            client.config_set("maxmemory", 0)


def test_a_node_out_of_memory_counts_as_failed_and_the_majority_holds(spare_servers):
    nodes = [start(spare_servers) for _ in range(3)]
    redlock = Redlock([node.url for node in nodes])
    with out_of_memory(nodes[0]):
        lock = redlock.lock("k", ttl=5.0)
        assert lock.acquire(blocking=False)
        assert isinstance(lock.fencing_token, int)
        assert not redlock.lock("k", ttl=5.0).acquire(blocking=False)
        lock.extend()
        assert lock.release()
        assert settled_keys(nodes, redlock, "k", []) == []
        with out_of_memory(nodes[1]):
            with pytest.raises(errors.QuorumUnavailable) as raised:
                redlock.lock("k", ttl=5.0).acquire(blocking=False)
            assert_refused_by(raised.value, nodes[:2], OutOfMemoryError)
        assert lock_keys(nodes, redlock, "k") == []
    # Memory back: the lock works on all three again.
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    held = [lock.value.encode()] * 3
    assert settled_keys(nodes, redlock, "k", held) == held
    assert lock.release()
    redlock.close()


def test_a_read_only_replica_counts_as_failed_with_a_clear_message(spare_servers):
    masters = [start(spare_servers) for _ in range(2)]
    primary = start(spare_servers)
    replicas = [
        start(spare_servers, "--replicaof", "127.0.0.1", str(primary.port)) for _ in range(2)
    ]
    # One replica among three nodes: the two masters are a majority.
    redlock = Redlock([masters[0].url, masters[1].url, replicas[0].url])
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    assert lock_keys(masters, redlock, "k") == [lock.value.encode()] * 2
    assert lock.release()
    redlock.close()
    # Two replicas: no majority, and the error says why, naming the nodes.
    redlock = Redlock([masters[0].url, replicas[0].url, replicas[1].url])
    with pytest.raises(errors.QuorumUnavailable) as raised:
        redlock.lock("k", ttl=5.0).acquire(blocking=False)
    assert_refused_by(raised.value, replicas, ReadOnlyError)
    assert lock_keys(masters, redlock, "k") == []
    redlock.close()


# -- a node that answers nonsense ----------------------------------------------------------


class NonsenseServer:
    """A server that speaks RESP and answers every command with one canned reply.

    What a proxy or a server that is not Redis may do: the lock must take
    each such reply as that node's failure, like an error reply.
    """

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.commands = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buffer = bytearray()
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                buffer += chunk
                answers = b""
                while True:
                    command, end = parse(buffer, 0)  # a command is a RESP array too
                    if command is INCOMPLETE:
                        break
                    del buffer[:end]
                    self.commands += 1
                    answers += self.reply
                sock.sendall(answers)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


#: Replies of a shape no lock script or command may answer (but a count of
#: slots freed, which any whole number may be).
NONSENSE = [
    pytest.param(b":7\r\n", id="integer"),
    pytest.param(b":-7\r\n", id="negative"),
    pytest.param(b"+OK\r\n", id="status"),
    pytest.param(b"$5\r\nhello\r\n", id="text"),
    pytest.param(b"$-1\r\n", id="null"),
    pytest.param(b"*-1\r\n", id="null-array"),
    pytest.param(b"*0\r\n", id="empty-array"),
    pytest.param(b"*2\r\n:1\r\n:1\r\n", id="short-array"),
    pytest.param(b"*3\r\n+a\r\n+b\r\n+c\r\n", id="wrong-elements"),
    pytest.param(b"*4\r\n:1\r\n:1\r\n:1\r\n:1\r\n", id="grant-too-long"),
    pytest.param(b"*1\r\n*1\r\n:1\r\n", id="nested"),
]


@pytest.fixture
def nonsense() -> Iterator[Callable[[bytes], NonsenseServer]]:
    made: list[NonsenseServer] = []

    def make(reply: bytes) -> NonsenseServer:
        server = NonsenseServer(reply)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def no_keys_left(nodes) -> None:
    """Nothing but fencing buckets on ``nodes``, once the last parts have landed."""
    deadline = time.monotonic() + 5.0
    while True:
        left = [key for key in all_keys(nodes) if b"fence:" not in key]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert left == []


def lock_ops(redlock: Redlock) -> None:
    """acquire, extend, renew, inspect, fencing_value and release, on two good nodes of three."""
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    lock.extend()
    assert redlock.renew([lock]) == [RENEWED]
    assert redlock.holder("k") == lock.value
    assert isinstance(redlock.inspect("k")[2], NodeFailure)
    assert redlock.fencing_value("k") >= lock.fencing_token
    assert lock.release()


def raised_token(redlock: Redlock, good) -> None:
    """The second round (fence_raise.lua): the good nodes' bucket is ahead of any proposal."""
    planted = (int(time.time()) + 3600) * 1_000_000
    for node in good:
        with node.client() as client:
            client.set(redlock.keys("k").fence, str(planted))
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    assert lock.fencing_token > planted
    assert lock.release()


def semaphore_ops(redlock: Redlock) -> None:
    """A semaphore's acquire, extend, renew and release on two good nodes of three."""
    sem = redlock.semaphore("s", limit=2, ttl=5.0)
    assert sem.acquire(blocking=False)
    sem.extend()
    assert redlock.renew([sem]) == [RENEWED]
    assert sem.release()


def owner_ops(redlock: Redlock) -> None:
    """release_owner and release_semaphore_owner on two good nodes of three."""
    lock = redlock.lock("k", ttl=5.0, owner="task-1|host:1")
    sem = redlock.semaphore("s", limit=2, ttl=5.0, owner="task-1|host:1")
    assert lock.acquire(blocking=False)
    assert sem.acquire(blocking=False)
    assert redlock.release_owner("k", "task-1", "host:1") == 2
    # A count of slots: any whole number from the odd node has the right shape.
    assert redlock.release_semaphore_owner("s", "task-1", "host:1") >= 2


@pytest.mark.parametrize("reply", NONSENSE)
@pytest.mark.parametrize("ops", ["lock", "fence-raise", "semaphore", "owners"])
def test_one_node_answering_nonsense_is_one_failed_node(nodes, make_redlock, nonsense, reply, ops):
    good = nodes[:2]
    odd = nonsense(reply)
    redlock = make_redlock([*good, odd.url])
    if ops == "fence-raise":
        raised_token(redlock, good)
    else:
        {"lock": lock_ops, "semaphore": semaphore_ops, "owners": owner_ops}[ops](redlock)
    no_keys_left(good)
    # It was asked (its part may have been sent after the majority decided).
    deadline = time.monotonic() + 5.0
    while odd.commands == 0:
        assert time.monotonic() < deadline, "the odd node was never asked"
        time.sleep(0.01)


@pytest.mark.parametrize("reply", NONSENSE)
@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_two_nodes_answering_nonsense_leave_no_quorum_and_nothing_behind(
    nodes, make_redlock, nonsense, reply, kind
):
    good = nodes[0]
    odd = [nonsense(reply), nonsense(reply)]
    redlock = make_redlock([good, *(server.url for server in odd)])
    held = (
        redlock.lock("k", ttl=5.0) if kind == "lock" else redlock.semaphore("s", limit=2, ttl=5.0)
    )
    with pytest.raises(errors.QuorumUnavailable) as raised:
        held.acquire(blocking=False)
    assert raised.value.answered == 1
    failures = list(raised.value.failures.values())
    assert len(failures) == 2
    assert all(isinstance(failure, WrongReply) for failure in failures), failures
    # The good node granted; the failed attempt was undone there.
    no_keys_left([good])
