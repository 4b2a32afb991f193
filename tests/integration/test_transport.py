"""The links to the nodes, against real redis-server processes.

Slow and paused nodes (connects, logins and TLS handshakes overlap; a node
is not waited for once the outcome is decided, nor again once it has timed
out), large batches, URL options, duplicate nodes and clients without a
real socket.
"""

from __future__ import annotations

import gc
import logging
import select
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from celery_redlock import RateLimiter, Redlock, errors
from celery_redlock.lock.lock import _EXTEND, _RELEASE
from celery_redlock.testing import RedisServer, ServerGroup, free_port
from celery_redlock.transport.commands import Call
from celery_redlock.transport.nodes import Command, NodeFailure, NotWaitedFor, fan_out, make_nodes
from tests.support import connections, script_runs, self_signed_certificate

pytestmark = pytest.mark.integration

PING = Command(("PING",))


@pytest.fixture
def own_servers() -> Iterator[list[RedisServer]]:
    """Servers of a test's own (started by the test with its own arguments)."""
    started: list[RedisServer] = []
    yield started
    for server in started:
        server.cleanup()


def start(own_servers: list[RedisServer], *extra_args: str) -> RedisServer:
    server = RedisServer(extra_args=extra_args).start()
    own_servers.append(server)
    return server


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    made = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    if made is None:
        pytest.skip("openssl is not installed: no certificate for the TLS tests")
    return made


def tls_server(own_servers: list[RedisServer], certificate: tuple[Path, Path]) -> str:
    """Start a server with a TLS port; return a rediss:// URL for it."""
    cert, key = certificate
    tls_port = free_port()
    try:
        start(
            own_servers,
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(cert),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert),
            "--tls-auth-clients", "no",
        )  # fmt: skip
    except RuntimeError as exc:
        if "tls" in str(exc).lower():
            pytest.skip(f"this redis-server was built without TLS support: {exc}")
        raise
    return f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"


# -- connects and logins overlap -----------------------------------------------------------


def timed_attempt(redlock: Redlock, ttl: float = 5.0) -> tuple[float, bool | BaseException]:
    started = time.monotonic()
    try:
        outcome: bool | BaseException = redlock.lock("k", ttl=ttl).acquire(blocking=False)
    except errors.QuorumUnavailable as exc:
        outcome = exc
    return time.monotonic() - started, outcome


def guarded(own_servers: list[RedisServer]) -> RedisServer:
    """A server that wants a password (set once it is up: the harness need not log in)."""
    server = start(own_servers)
    with server.client() as client:
        client.config_set("requirepass", "s3cret")
    return server


def test_logins_to_two_paused_nodes_cost_one_node_timeout(own_servers):
    nodes = [guarded(own_servers) for _ in range(3)]
    # 1 s: one node timeout and two are far apart, whatever the machine's load.
    redlock = Redlock(
        [f"redis://:s3cret@127.0.0.1:{node.port}/0" for node in nodes], node_timeout=1.0
    )
    nodes[0].pause()
    nodes[1].pause()
    # No connection is open yet: each AUTH waits for a paused node.
    took, outcome = timed_attempt(redlock)
    assert isinstance(outcome, errors.QuorumUnavailable)
    assert took < 1.0 * 1.6, took  # one node timeout, not two
    redlock.close()


def test_tls_handshakes_with_two_paused_nodes_cost_one_node_timeout(own_servers, certificate):
    urls = [tls_server(own_servers, certificate) for _ in range(3)]
    redlock = Redlock(urls, node_timeout=1.0)  # one timeout and two far apart
    own_servers[0].pause()
    own_servers[1].pause()
    took, outcome = timed_attempt(redlock)
    assert isinstance(outcome, errors.QuorumUnavailable)
    assert took < 1.0 * 1.6, took
    own_servers[0].resume()
    own_servers[1].resume()
    redlock.close()


def test_a_free_lock_is_acquired_with_one_node_paused_during_its_login(own_servers):
    nodes = [guarded(own_servers) for _ in range(3)]
    # The two logins and grants fit in it on a loaded machine, far below.
    redlock = Redlock(
        [f"redis://:s3cret@127.0.0.1:{node.port}/0" for node in nodes], node_timeout=2.0
    )
    nodes[2].pause()
    took, outcome = timed_attempt(redlock)
    assert outcome is True
    # Decided by the two that answered: no wait for the paused one.
    assert took < redlock.node_timeout, took
    redlock.close()


def test_tls_and_a_paused_node_still_grant_a_free_lock(own_servers, certificate):
    urls = [tls_server(own_servers, certificate) for _ in range(3)]
    # The decision's own time is waited again for the paused node: 5 s
    # leaves room for handshakes slowed to seconds by a loaded machine (seen:
    # over 1 s, against a 2 s node timeout).
    redlock = Redlock(urls, node_timeout=5.0)
    own_servers[1].pause()
    took, outcome = timed_attempt(redlock, ttl=30.0)
    assert outcome is True
    # Not the paused node's whole timeout: the others' handshakes and grants,
    # then as long again at most for the paused one (a first TLS handshake
    # can take a fifth of a second).
    assert took < redlock.node_timeout, took
    own_servers[1].resume()
    redlock.close()


def test_the_first_call_over_tls_fits_the_default_node_timeout(
    own_servers, certificate, monkeypatch
):
    urls = [tls_server(own_servers, certificate) for _ in range(3)]
    built: list[int] = []
    create = ssl.create_default_context

    def counted(*args, **kwargs):
        built.append(1)
        return create(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    # Building a context loads the CA bundle (tens of milliseconds): once per
    # Redlock, when it is made, not per node inside the first call's node
    # timeout. Each Redlock is new, its connections too: every attempt is a
    # process's first call. One success proves the point on a loaded
    # machine; before, each took a context per node in turn, 3 x 30-50 ms.
    outcomes: list[bool | BaseException] = []
    for _ in range(5):
        before = len(built)
        redlock = Redlock(urls)  # the default 50 ms node timeout
        assert len(built) - before == 1  # three nodes, one set of TLS settings
        _, outcome = timed_attempt(redlock)
        assert len(built) - before == 1, "a context was built during the call"
        outcomes.append(outcome)
        redlock.close()
        if outcome is True:
            break
    assert True in outcomes, outcomes


# -- a slow node costs nothing once the outcome is decided ---------------------------------


def test_pairs_do_not_wait_for_a_paused_node_and_leave_it_nothing(servers, make_redlock):
    nodes = list(servers)[:3]
    # 2 s: a pair that waited for the paused node is far from one that did not.
    redlock = make_redlock(nodes, node_timeout=2.0)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)  # links open before the pause
    assert lock.release()
    paused = redlock.nodes[2]
    # A reply on the same link: every command sent before it has run.
    assert fan_out([paused], [[PING]], 1.0) == [[b"PONG"]]
    before = script_runs(nodes[2])
    nodes[2].pause()
    pairs = 20
    slowest = 0.0
    for _ in range(pairs):
        started = time.monotonic()
        assert lock.acquire(blocking=False)
        assert lock.release()
        slowest = max(slowest, time.monotonic() - started)
    # Before: every pair waited two full node timeouts (4 s).
    assert slowest < 1.0, slowest
    nodes[2].resume()
    # Every acquire and release was still sent to it, in order: once it has
    # run them all, it holds no lock key (no release overtook its acquire).
    deadline = time.monotonic() + 5.0
    while fan_out([paused], [[PING]], 1.0) != [[b"PONG"]]:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert script_runs(nodes[2]) - before == 2 * pairs
    with nodes[2].client() as client:
        assert client.exists(redlock.key("k")) == 0


def test_a_node_not_waited_for_is_reported_as_such(servers):
    nodes = make_nodes([server.url for server in list(servers)[:3]], 1.0)
    assert all(isinstance(result, list) for result in fan_out(nodes, [[PING]] * 3, 1.0))
    servers[0].pause()
    results = fan_out(
        nodes,
        [[PING]] * 3,
        1.0,
        enough=lambda results: sum(isinstance(r, list) for r in results) >= 2,
    )
    assert results[1:] == [[b"PONG"], [b"PONG"]]
    assert isinstance(results[0], NotWaitedFor)
    assert nodes[0].suspect  # it missed the moment given after the decision
    for node in nodes:
        node.close()


def test_a_node_that_timed_out_is_not_waited_for_until_it_answers(servers):
    # 1 s: a node waited for in full (1 s) and one waited for a tenth of it
    # (0.1 s) are far apart, whatever the machine's load.
    nodes = make_nodes([server.url for server in list(servers)[:2]], 1.0)
    assert fan_out(nodes, [[PING]] * 2, 1.0) == [[b"PONG"]] * 2  # links open, none suspect
    servers[0].pause()
    started = time.monotonic()
    first = fan_out(nodes, [[PING]] * 2, 1.0)
    assert time.monotonic() - started >= 1.0
    assert isinstance(first[0], NodeFailure)
    assert not isinstance(first[0], NotWaitedFor)
    assert nodes[0].suspect
    for _ in range(5):
        started = time.monotonic()
        later = fan_out(nodes, [[PING]] * 2, 1.0)
        assert time.monotonic() - started < 0.5
        assert isinstance(later[0], NotWaitedFor)
        # Not "decided without it": with both nodes asked for PING, nothing was decided.
        assert "missing a deadline" in str(later[0])
        assert later[1] == [b"PONG"]
    servers[0].resume()
    # Its late replies bring it back; from then on it is waited for again.
    deadline = time.monotonic() + 5.0
    while nodes[0].suspect:
        assert time.monotonic() < deadline
        fan_out(nodes, [[PING]] * 2, 1.0)
        time.sleep(0.005)
    assert fan_out(nodes, [[PING]] * 2, 1.0) == [[b"PONG"], [b"PONG"]]
    for node in nodes:
        node.close()


def test_late_replies_are_never_taken_for_a_later_commands(servers):
    (node,) = make_nodes([servers[0].url], 0.05)
    fan_out([node], [[PING]], 0.05)
    servers[0].pause()
    echoes = [Command(("ECHO", f"late-{n}")) for n in range(5)]
    for echo in echoes:
        assert isinstance(fan_out([node], [[echo]], 0.05)[0], NodeFailure)
    servers[0].resume()
    deadline = time.monotonic() + 5.0
    while True:
        result = fan_out([node], [[Command(("ECHO", "fresh"))]], 0.5)[0]
        if not isinstance(result, NodeFailure):
            break
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert result == [b"fresh"]
    node.close()


# -- batches -------------------------------------------------------------------------------


def test_a_large_batch_is_reloaded_after_script_flush_with_the_same_allowance(
    servers, make_redlock
):
    nodes = list(servers)[:3]
    # Not about the node timeout: room for a loaded machine to run 6,000 renewals.
    redlock = make_redlock(nodes, node_timeout=0.5)
    locks = [redlock.lock(f"many:{n}", ttl=60.0) for n in range(6000)]
    for lock in locks:
        assert lock.acquire(timeout=30.0)  # a node slow for a moment is asked again
    for server in nodes:
        with server.client() as client:
            client.script_flush()
    outcomes = redlock.renew(locks)
    assert set(outcomes) == {"renewed"}, {o: outcomes.count(o) for o in set(outcomes)}
    for lock in locks:
        lock.release()


def test_a_large_batch_does_not_hold_up_acquisitions(servers, make_redlock):
    nodes = list(servers)[:3]
    redlock = make_redlock(nodes)
    keys = [f"{{batch}}:{n}" for n in range(30_000)]
    batch = [Command(("SET", key, "x")) for key in keys]
    results: list[object] = []
    batch_thread = threading.Thread(
        target=lambda: results.extend(fan_out(redlock.nodes, [batch] * 3, 0.05))
    )
    batch_thread.start()
    granted = 0
    try:
        for n in range(20):
            lock = redlock.lock(f"small:{n}", ttl=5.0)
            try:
                acquired = lock.acquire(blocking=False)
            except errors.QuorumUnavailable:
                continue  # the nodes themselves busy with the batch past 50 ms
            assert acquired
            assert lock.release()
            granted += 1
    finally:
        batch_thread.join(60)
    # Held up behind the batch on the client, every acquisition during it would
    # miss its 50 ms; a node busy running its part can make a few miss on a
    # loaded machine.
    assert granted >= 15, granted
    assert all(isinstance(result, list) and len(result) == 30_000 for result in results)


# -- URL options and duplicate nodes -------------------------------------------------------


@pytest.mark.parametrize("option", ["socket_timeout=2", "socket_connect_timeout=2", "timeout=2"])
def test_timeouts_in_the_url_do_not_override_node_timeout(servers, option, caplog):
    nodes = list(servers)[:3]
    with caplog.at_level(logging.WARNING, logger="celery_redlock.nodes"):
        redlock = Redlock([f"{node.url}?{option}" for node in nodes], node_timeout=0.25)
    assert option.split("=")[0] in caplog.text
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    lock.release()
    nodes[0].pause()
    nodes[1].pause()
    took, outcome = timed_attempt(redlock)
    assert isinstance(outcome, errors.QuorumUnavailable)
    assert took < 1.0, took  # the URL's 2 s would have been waited here
    redlock.close()


def test_protocol_3_in_the_url_does_not_change_what_the_lock_reads(servers):
    nodes = list(servers)[:3]
    redlock = Redlock([f"{node.url}?protocol=3" for node in nodes])
    lock = redlock.lock("k", ttl=5.0)
    assert redlock.inspect("k") == [(None, 0.0)] * 3
    assert lock.acquire(blocking=False)
    assert redlock.holder("k") == lock.value
    assert lock.release()
    redlock.close()


def test_max_connections_in_the_url_does_not_cap_concurrent_operations(servers):
    nodes = list(servers)[:3]
    redlock = Redlock([f"{node.url}?max_connections=2" for node in nodes])
    failures: list[BaseException] = []

    def work(number: int) -> None:
        try:
            for round_number in range(20):
                lock = redlock.lock(f"c:{number}:{round_number}", ttl=5.0)
                assert lock.acquire(blocking=False)
                assert lock.release()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    redlock.close()


@pytest.mark.parametrize(
    ("query", "option"),
    [
        pytest.param("?frobnicate=1", "frobnicate", id="unknown"),
        pytest.param("?ssl_ca_certs=/tmp/ca.pem", "ssl_ca_certs", id="tls-option-on-plain-url"),
        pytest.param("?db=x", "db", id="db-not-a-number"),
        pytest.param("?db=1&db=2", "db", id="given-twice"),
    ],
)
def test_refused_url_options_name_the_option(query, option):
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock([f"redis://127.0.0.1:6390/0{query}"])
    assert raised.value.option == option
    assert option in str(raised.value)


def test_tls_settings_that_cannot_load_are_refused_when_the_redlock_is_made(tmp_path):
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock([f"rediss://127.0.0.1:6390/0?ssl_ca_certs={missing}"])
    assert "rediss://127.0.0.1:6390/0" in str(raised.value)
    assert "TLS" in str(raised.value)


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(("redis://127.0.0.1:6390/0", "redis://127.0.0.1:6390/0"), id="same-url"),
        pytest.param(("redis://localhost:6390/0", "redis://127.0.0.1:6390/0"), id="localhost"),
        pytest.param(("redis://[::1]:6390/0", "redis://127.0.0.1:6390"), id="ipv6-loopback"),
        pytest.param(("redis://127.0.0.1:6390/0", "redis://127.0.0.1:6390/1"), id="other-db"),
        pytest.param(("redis://:a@127.0.0.1:6390/0", "redis://u:b@127.0.0.1:6390/0"), id="users"),
        pytest.param(
            ("unix:///tmp/r.sock", "unix:///tmp/../tmp/r.sock?db=1"), id="unix-same-socket"
        ),
    ],
)
def test_the_same_server_twice_is_refused(pair):
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock([*pair, "redis://127.0.0.1:6391/0"])
    assert raised.value.option == "nodes"
    assert "same Redis server" in str(raised.value)
    assert "a@" not in str(raised.value)


def test_a_client_and_a_url_for_the_same_server_are_refused():
    client = redis.Redis(host="localhost", port=6390)
    with pytest.raises(errors.ConfigurationError, match="same Redis server"):
        Redlock([client, "redis://127.0.0.1:6390/0", "redis://127.0.0.1:6391/0"])
    client.close()


# -- clients without a real socket ---------------------------------------------------------


def test_fakeredis_works_as_a_node():
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    redlock = Redlock([client])
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    assert isinstance(lock.fencing_token, int)
    assert not redlock.lock("k", ttl=5.0).acquire(blocking=False)
    lock.extend(10.0)
    assert 9000 < client.pttl(redlock.key("k")) <= 10_000
    assert redlock.holder("k") == lock.value
    client.script_flush()  # NOSCRIPT is handled on this path too
    assert lock.release()
    assert client.exists(redlock.key("k")) == 0
    limiter = RateLimiter(client)
    assert limiter.hit("api", limit=2, period=60.0).allowed
    assert limiter.hit("api", limit=2, period=60.0).allowed
    assert not limiter.hit("api", limit=2, period=60.0).allowed
    redlock.close()


def test_a_broken_fakeredis_node_is_a_node_failure_not_a_redis_error():
    server = fakeredis.FakeServer()
    server.connected = False
    redlock = Redlock([fakeredis.FakeRedis(server=server)])
    with pytest.raises(errors.QuorumUnavailable):
        redlock.lock("k", ttl=5.0).acquire(blocking=False)


def test_connections_per_node_stay_few(servers: ServerGroup, make_redlock):
    nodes = list(servers)[:3]
    # Not about the node timeout: a timed-out call must not fail the count.
    redlock = make_redlock(nodes, node_timeout=0.5)
    lock = redlock.lock("k", ttl=5.0)
    for _ in range(50):
        assert lock.acquire(blocking=False)
        assert lock.release()
    locks = [redlock.lock(f"many:{n}", ttl=5.0) for n in range(200)]
    for held in locks:
        assert held.acquire(blocking=False)
    assert set(redlock.renew(locks)) == {"renewed"}
    # At most one more connection per node: the one a large batch travels on.
    assert all(1 <= connections(node) <= 2 for node in nodes)
    call = Call(_EXTEND, (redlock.key("k"),), ("x", 1000))
    assert fan_out(redlock.nodes, [[call]] * 3, 0.5) == [[0]] * 3


# -- a connection the node closed --------------------------------------------------------


def test_a_link_the_node_closed_is_opened_again_before_the_next_command(servers):
    # Checked before every command, however recently the link answered: a
    # node that restarts between two commands costs neither of them.
    (node,) = make_nodes([servers[0].url], 0.5)
    assert fan_out([node], [[PING]], 0.5) == [[b"PONG"]]
    link_fd = node.link().fd
    with servers[0].client() as client:
        assert client.client_kill_filter(_type="normal", skipme=True) >= 1
    # The close reaches the socket as end of file: readable.
    poller = select.poll()
    poller.register(link_fd, select.POLLIN)
    assert poller.poll(5000), "the node's close did not reach the link"
    assert fan_out([node], [[PING]], 0.5) == [[b"PONG"]]
    node.close()


# -- nothing left for the garbage collector ------------------------------------------------


def test_lock_calls_leave_no_cycle_for_the_garbage_collector(servers, make_redlock):
    # A fan-out's op and its parts referred to each other: every acquire +
    # release left ~44 objects that only the collector frees, and its full
    # passes stalled a busy worker for tens of milliseconds.
    redlock = make_redlock(list(servers)[:3], node_timeout=0.5)  # no timeout among the 200
    lock = redlock.lock("gc", ttl=5.0)
    assert lock.acquire(blocking=False)  # links open
    assert lock.release()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(200):
            assert lock.acquire(blocking=False)
            assert lock.release()
        gc.collect()
        left = [type(thing).__name__ for thing in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not [name for name in left if name in ("_Op", "_Part", "Call")], left[:20]


# -- scripts: the source once per connection ----------------------------------------------


def eval_and_evalsha(server: RedisServer) -> tuple[int, int]:
    """How many EVAL and EVALSHA commands ``server`` has run (``INFO commandstats``)."""
    with server.client() as client:
        stats = client.info("commandstats")
    return (
        int(stats.get("cmdstat_eval", {}).get("calls", 0)),
        int(stats.get("cmdstat_evalsha", {}).get("calls", 0)),
    )


def test_a_connection_sends_each_script_source_once(servers):
    server = servers[0]
    (node,) = make_nodes([server.url], 1.0)
    with server.client() as client:
        client.config_resetstat()
    # Long enough for the bulk connection; each script first used mid-batch.
    batch: list[Call | Command] = []
    expected: list[object] = []
    for n in range(40):
        key = f"once:{n}"
        batch += [
            Command(("ECHO", str(n))),
            Call(_EXTEND, (key,), ("v", 5000)),  # absent (0)
            Call(_RELEASE, (key, f"{key}:args"), ("v", "")),  # absent (0)
        ]
        expected += [str(n).encode(), 0, 0]
    single = [Call(_EXTEND, ("once:single",), ("v", 5000))]
    for _ in range(3):
        assert fan_out([node], [batch], 1.0) == [expected]
        assert fan_out([node], [single], 1.0) == [[0]]
    # The bulk connection sent two sources, the interactive one one; every
    # other call named its script by SHA.
    assert eval_and_evalsha(server) == (3, 3 * 80 + 3 - 3)
    # A new connection sends the source again.
    link_fd = node.link().fd
    with server.client() as client:
        assert client.client_kill_filter(_type="normal", skipme=True) >= 1
    poller = select.poll()
    poller.register(link_fd, select.POLLIN)
    assert poller.poll(5000), "the node's close did not reach the link"
    assert fan_out([node], [single], 1.0) == [[0]]
    assert fan_out([node], [single], 1.0) == [[0]]
    assert eval_and_evalsha(server) == (4, 3 * 80 + 3 - 3 + 1)
    node.close()
