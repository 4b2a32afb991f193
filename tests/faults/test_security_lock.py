"""Security at the lock level: unguessable tokens, ownership, isolation, TLS and ACLs."""

from __future__ import annotations

import ast
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import celery_redlock
from celery_redlock import Redlock, errors
from celery_redlock.testing import RedisServer, free_port

pytestmark = [pytest.mark.faults, pytest.mark.integration]

PACKAGE = Path(celery_redlock.__file__).parent


@pytest.fixture
def nodes(servers) -> list[RedisServer]:
    return list(servers)[:3]


def stored(nodes, redlock: Redlock, name: str) -> list[bytes | None]:
    values = []
    for node in nodes:
        with node.client() as client:
            values.append(client.get(redlock.key(name)))
    return values


# -- tokens ------------------------------------------------------------------------------


def test_tokens_are_128_bit_random_and_never_repeat(nodes, make_redlock):
    redlock = make_redlock(nodes)
    tokens = []
    for count in range(1000):
        lock = redlock.lock("k", ttl=5.0)
        assert lock.acquire(blocking=False)
        tokens.append(lock.value)
        if count % 100 == 0:  # what Redis holds is the token itself
            assert stored(nodes, redlock, "k") == [lock.value.encode()] * 3
        lock.release()
    assert all(re.fullmatch(r"[0-9a-f]{32}", token) for token in tokens)
    assert len(set(tokens)) == len(tokens)
    # No position is fixed or nearly so (a counter or a clock would show).
    for position in range(32):
        assert len({token[position] for token in tokens}) == 16, position
    ones = sum(bin(int(token, 16)).count("1") for token in tokens)
    assert abs(ones / (128 * len(tokens)) - 0.5) < 0.01


def test_the_owner_text_is_kept_beside_the_token_not_instead_of_it(nodes, make_redlock):
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0, owner="task-1|worker@host")
    assert lock.acquire(blocking=False)
    token, owner = lock.value.split("|", 1)
    assert re.fullmatch(r"[0-9a-f]{32}", token)
    assert owner == "task-1|worker@host"
    lock.release()


# -- ownership --------------------------------------------------------------------------


def test_a_client_without_the_token_cannot_release_or_extend(nodes, make_redlock):
    holder_side = make_redlock(nodes)
    other_side = make_redlock(nodes)  # another process, in effect: its own connections
    holder = holder_side.lock("k", ttl=5.0)
    assert holder.acquire(blocking=False)
    held = stored(nodes, holder_side, "k")

    # Never held: nothing to release or extend.
    stranger = other_side.lock("k", ttl=5.0)
    assert stranger.release() is False
    with pytest.raises(errors.LockLost):
        stranger.extend()
    assert not stranger.acquire(blocking=False)

    # A guessed token, planted as if acquired: refused by every node.
    for guess in (secrets.token_hex(16), holder.value[:-1] + "0", holder.value.upper()):
        if guess == holder.value:
            continue
        forger = other_side.lock("k", ttl=5.0)
        forger._value = guess
        forger._valid_until = holder._valid_until
        assert forger.release() is False
        forger._value = guess
        forger._valid_until = holder._valid_until
        with pytest.raises(errors.LockLost):
            forger.extend(60.0)
    # Force-release by owner needs the right task id, not a prefix of it.
    assert other_side.release_owner("k", "task") == 0

    assert stored(nodes, holder_side, "k") == held
    with nodes[0].client() as client:
        assert client.pttl(holder_side.key("k")) <= 5000
    holder.extend()
    assert holder.release() is True


def test_release_by_task_id_needs_the_whole_id(nodes, make_redlock):
    redlock = make_redlock(nodes)
    lock = redlock.lock("k", ttl=5.0, owner="abcdef|worker@host")
    assert lock.acquire(blocking=False)
    for wrong in ("abc", "bcdef", "abcdef|worker", "worker@host", ""):
        assert redlock.release_owner("k", wrong) == 0, wrong
    assert lock.locked()
    assert redlock.release_owner("k", "abcdef") == 3


def test_key_prefix_isolates_two_apps_sharing_redis(nodes, make_redlock):
    billing = make_redlock(nodes, key_prefix="billing:")
    shipping = make_redlock(nodes, key_prefix="shipping:")
    first = billing.lock("invoice:42", ttl=5.0)
    second = shipping.lock("invoice:42", ttl=5.0)
    assert first.acquire(blocking=False)
    assert second.acquire(blocking=False)  # same name, other app: independent
    # Fencing counters are separate too.
    assert first.fencing_token == second.fencing_token == 1
    assert billing.holder("invoice:42") == first.value
    assert shipping.holder("invoice:42") == second.value
    # One app's release and force-release leave the other's lock alone.
    assert first.release()
    assert shipping.holder("invoice:42") == second.value
    second.extend()
    assert stored(nodes, shipping, "invoice:42") == [second.value.encode()] * 3
    assert stored(nodes, billing, "invoice:42") == [None] * 3
    assert second.release()


# -- transport security -------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, Path]:
    """A self-signed certificate for 127.0.0.1, and an unrelated one."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: no certificate for the TLS tests")
    folder = tmp_path_factory.mktemp("tls")
    made = {}
    for name, subject, extra in (
        ("server", "/CN=127.0.0.1", ["-addext", "subjectAltName=IP:127.0.0.1"]),
        ("other", "/CN=other", []),
    ):
        cert, key = folder / f"{name}.pem", folder / f"{name}.key"
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(key), "-out", str(cert), "-subj", subject, *extra],
            check=True,
            capture_output=True,
        )  # fmt: skip
        made[name], made[f"{name}-key"] = cert, key
    return made


@pytest.fixture
def tls_server(certificates) -> Iterator[tuple[RedisServer, int]]:
    """A redis-server with a TLS port beside its plain one (for the harness' readiness check)."""
    tls_port = free_port()
    server = RedisServer(
        extra_args=(
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(certificates["server"]),
            "--tls-key-file", str(certificates["server-key"]),
            "--tls-ca-cert-file", str(certificates["server"]),
            "--tls-auth-clients", "no",
        )
    )  # fmt: skip
    try:
        server.start()
    except RuntimeError as exc:
        server.cleanup()
        if "tls" in str(exc).lower():
            pytest.skip(f"this redis-server was built without TLS support: {exc}")
        raise
    yield server, tls_port
    server.cleanup()


@pytest.mark.parametrize(
    "query",
    [
        pytest.param("ssl_cert_reqs=none", id="unverified"),
        pytest.param("ssl_ca_certs={ca}", id="verified-by-ca-file"),
    ],
)
def test_rediss_nodes_work(tls_server, certificates, query):
    server, tls_port = tls_server
    url = f"rediss://127.0.0.1:{tls_port}/0?" + query.format(ca=certificates["server"])
    # A TLS handshake is part of the first round trip: give it room on a busy machine.
    redlock = Redlock([url], node_timeout=0.5)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    assert redlock.nodes[0].pool.connection_class.__name__ == "SSLConnection"
    with server.client() as client:  # the plain port sees the same data
        assert client.get(redlock.key("k")) == lock.value.encode()
    lock.extend()
    assert lock.release()
    redlock.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param(
            "rediss://127.0.0.1:{port}/0?ssl_ca_certs={other}",
            "certificate verify failed",
            id="untrusted-certificate",
        ),
        pytest.param("rediss://127.0.0.1:{port}/0", "certificate verify failed", id="no-ca-given"),
        pytest.param("redis://127.0.0.1:{port}/0", "127.0.0.1", id="plain-to-tls-port"),
    ],
)
def test_tls_mismatches_fail_clearly(tls_server, certificates, url, expected):
    _, tls_port = tls_server
    redlock = Redlock([url.format(port=tls_port, other=certificates["other"])], node_timeout=0.5)
    with pytest.raises(errors.QuorumUnavailable) as raised:
        redlock.lock("k", ttl=5.0).acquire(blocking=False)
    assert expected in str(raised.value)
    redlock.close()


# -- authentication ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A server whose only user is ``locker``, allowed the ``redlock:`` keys and channels.

    Module-scoped: with the default user off, the harness' readiness check
    waits through redis-py's retries (seconds) before it sees the answer.
    """
    server = RedisServer(
        extra_args=(
            "--user", "locker", "on", ">s3cret", "~redlock:*", "&redlock:*", "+@all",
            "--user", "default", "off",
        )
    )  # fmt: skip
    server.start()
    yield server
    server.cleanup()


def test_acl_user_and_password_in_the_url(acl_server):
    redlock = Redlock([f"redis://locker:s3cret@127.0.0.1:{acl_server.port}/0"])
    assert "s3cret" not in repr(redlock)
    lock = redlock.lock("k", ttl=5.0)
    assert lock.acquire(blocking=False)
    lock.extend()
    assert lock.release()
    redlock.close()


@pytest.mark.parametrize(
    ("credentials", "prefix", "expected"),
    [
        pytest.param("locker:wrong@", "redlock:", "invalid username-password", id="bad-password"),
        pytest.param("", "redlock:", "Authentication required", id="no-credentials"),
        pytest.param("locker:s3cret@", "other:", "no permissions", id="keys-not-allowed"),
    ],
)
def test_acl_refusals_fail_clearly_without_showing_the_password(
    acl_server, credentials, prefix, expected
):
    redlock = Redlock([f"redis://{credentials}127.0.0.1:{acl_server.port}/0"], key_prefix=prefix)
    with pytest.raises(errors.QuorumUnavailable) as raised:
        redlock.lock("k", ttl=5.0).acquire(blocking=False)
    assert expected in str(raised.value)
    assert "wrong" not in str(raised.value)
    assert "s3cret" not in str(raised.value)
    redlock.close()


# -- data read from Redis -------------------------------------------------------------------

UNSAFE_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "jsonpickle"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def test_no_pickle_or_eval_anywhere_in_the_package():
    # Nothing read from Redis is unpickled or evaluated: tokens, integers and
    # text only. Checked on the source, so a future change cannot slip by.
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names = {node.func.id} & UNSAFE_CALLS
            elif isinstance(node, ast.Attribute) and node.attr in {"load", "unsafe_load"}:
                value = node.value
                names = {"yaml"} if isinstance(value, ast.Name) and value.id == "yaml" else set()
            else:
                continue
            bad = names & (UNSAFE_MODULES | UNSAFE_CALLS | {"yaml"})
            if bad:
                offences.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {sorted(bad)}")
    assert offences == []
