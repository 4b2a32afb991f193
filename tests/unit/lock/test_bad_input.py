"""Bad arguments fail at once with a ConfigurationError naming the argument."""

from __future__ import annotations

import pytest

from celery_redlock import Redlock, errors

URL = "redis://127.0.0.1:6390/0"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        pytest.param({"nodes": []}, "nodes", id="no-nodes"),
        pytest.param({"nodes": ["http://host/"]}, "nodes", id="not-redis-url"),
        pytest.param({"nodes": ["redis://"]}, "nodes", id="no-host"),
        pytest.param({"nodes": ["redis://h:notaport/0"]}, "nodes", id="bad-port"),
        pytest.param({"nodes": [42]}, "nodes", id="not-a-url"),
        pytest.param({"nodes": [URL], "node_timeout": 0}, "node_timeout", id="zero-node-timeout"),
        pytest.param({"nodes": [URL], "node_timeout": "1"}, "node_timeout", id="str-node-timeout"),
        pytest.param({"nodes": [URL], "default_ttl": -1}, "default_ttl", id="negative-ttl"),
        pytest.param({"nodes": [URL], "key_prefix": 3}, "key_prefix", id="prefix-type"),
        pytest.param({"nodes": [URL], "retry_delay": float("nan")}, "retry_delay", id="nan"),
    ],
)
def test_bad_redlock_arguments(kwargs, option):
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock(**kwargs)
    assert raised.value.option == option
    assert option in str(raised.value)


def test_password_is_not_shown_in_errors():
    with pytest.raises(errors.ConfigurationError) as raised:
        Redlock(["redis://:hunter2@h:notaport/0"])
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("name", "ttl", "timeout", "option"),
    [
        pytest.param("k", 0, None, "ttl", id="zero-ttl"),
        pytest.param("k", -5, None, "ttl", id="negative-ttl"),
        pytest.param("k", 0.05, None, "ttl", id="ttl-below-node-timeout"),
        pytest.param("k", True, None, "ttl", id="bool-ttl"),
        pytest.param(b"k", 10, None, "name", id="bytes-name"),
        pytest.param(7, 10, None, "name", id="int-name"),
        pytest.param("", 10, None, "name", id="empty-name"),
        pytest.param("k", 10, -1, "timeout", id="negative-timeout"),
    ],
)
def test_bad_lock_arguments(name, ttl, timeout, option):
    redlock = Redlock([URL])
    with pytest.raises(errors.ConfigurationError) as raised:
        redlock.lock(name, ttl=ttl, timeout=timeout)
    assert raised.value.option == option
    assert option in str(raised.value)


def test_negative_acquire_timeout():
    lock = Redlock([URL]).lock("k", ttl=10)
    with pytest.raises(errors.ConfigurationError, match="timeout"):
        lock.acquire(timeout=-0.5)


def test_error_tree():
    assert issubclass(errors.ConfigurationError, ValueError)
    for error in (
        errors.ConfigurationError,
        errors.LockNotAcquired,
        errors.QuorumUnavailable,
        errors.LockLost,
        errors.DuplicateTask,
        errors.RateLimited,
    ):
        assert issubclass(error, errors.RedlockError)
    assert not issubclass(errors.QuorumUnavailable, errors.LockNotAcquired)
