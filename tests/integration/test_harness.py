"""The throw-away server harness (celery_redlock.testing): finding binaries, start-up errors."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from celery_redlock.testing import (
    BUNDLED,
    RedisServer,
    RedisServerNotFound,
    ServerStartError,
    bundled_server,
    find_redis_server,
    server_build,
)

pytestmark = pytest.mark.integration


def test_a_server_that_refuses_its_arguments_is_reported_with_what_it_said():
    # Errors in the arguments come before the log file opens: only what the
    # process printed tells them. Compared with a direct run of the binary,
    # so nothing depends on the server's wording.
    server = RedisServer(extra_args=("--no-such-setting", "1"))
    try:
        with pytest.raises(ServerStartError) as raised:
            server.start()
    finally:
        server.cleanup()
    direct = subprocess.run(
        [server.binary, "--no-such-setting", "1"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert direct.returncode != 0
    last_line = (direct.stdout + direct.stderr).strip().splitlines()[-1]
    assert last_line in raised.value.output
    assert last_line in str(raised.value)
    assert "exited with status" in str(raised.value)
    assert not server.running


def test_the_build_is_what_the_binary_says_it_is():
    binary = find_redis_server()
    build = server_build(binary)
    with RedisServer(binary=binary) as server, server.client() as client:
        info = client.info("server")
    # Valkey also reports a Redis version, for clients that look for one.
    version = info.get("valkey_version", info["redis_version"])
    assert build.version == tuple(int(part) for part in str(version).split("."))
    assert build.product == ("Valkey" if "valkey_version" in info else "Redis")
    assert build.label in str(build)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_a_bundled_name_gives_the_wheel_binary_it_promises(name, monkeypatch):
    bundled = BUNDLED[name]
    if importlib.util.find_spec(bundled.package) is None:
        pytest.skip(f"{bundled.distribution} is not installed (the servers extra installs it)")
    binary = bundled_server(name)
    assert Path(binary).parts[-len(Path(bundled.path).parts) :] == Path(bundled.path).parts
    build = server_build(binary)
    assert (build.product, build.version[0]) == (bundled.product, bundled.major)
    monkeypatch.setenv("REDIS_SERVER", name)
    assert find_redis_server() == binary
    assert RedisServer().binary == binary
    assert find_redis_server(name) == binary


def test_redis_server_accepts_a_path_or_a_command(monkeypatch, tmp_path):
    binary = find_redis_server()
    monkeypatch.setenv("REDIS_SERVER", binary)
    assert find_redis_server() == binary
    monkeypatch.setenv("PATH", str(Path(binary).parent))
    monkeypatch.setenv("REDIS_SERVER", Path(binary).name)
    assert find_redis_server() == binary
    # An explicit choice wins over the environment.
    assert find_redis_server(binary) == binary


@pytest.mark.parametrize(
    "choice",
    [
        pytest.param("/nonexistent/redis-server", id="missing-path"),
        pytest.param("no-such-server-command", id="unknown-command"),
        pytest.param("{tmp}", id="a-directory"),
        pytest.param("{tmp}/not-executable", id="not-executable"),
    ],
)
def test_a_bad_choice_of_server_is_an_error_naming_it(choice, monkeypatch, tmp_path):
    (tmp_path / "not-executable").write_text("")
    choice = choice.format(tmp=tmp_path)
    monkeypatch.setenv("REDIS_SERVER", choice)
    with pytest.raises(RedisServerNotFound, match=choice):
        find_redis_server()
    with pytest.raises(RedisServerNotFound):
        RedisServer()


def test_an_unknown_bundled_name_lists_the_known_ones():
    with pytest.raises(RedisServerNotFound) as raised:
        bundled_server("redis99")
    assert all(name in str(raised.value) for name in BUNDLED)


def test_a_binary_that_is_not_a_server_is_refused(tmp_path):
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'hello'\n")
    fake.chmod(0o755)
    with pytest.raises(RedisServerNotFound, match="does not look like"):
        server_build(str(fake))
