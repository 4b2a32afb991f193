"""Rates in Celery's syntax, the limiter's argument checks and its reply decoding (no Redis)."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from celery_redlock import RateLimitDecision, RateLimiter, errors
from celery_redlock._rates import Rate, parse_rate
from celery_redlock.ratelimit import _decision

#: Nothing listens here; nothing in these tests connects.
URL = "redis://127.0.0.1:6390/0"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("10/s", Rate(10, 1.0), id="per-second"),
        pytest.param("100/m", Rate(100, 60.0), id="per-minute"),
        pytest.param("1000/h", Rate(1000, 3600.0), id="per-hour"),
        pytest.param("7", Rate(7, 1.0), id="bare-string"),
        pytest.param(" 5 / m ", Rate(5, 60.0), id="spaces"),
        pytest.param(3, Rate(3, 1.0), id="int"),
        pytest.param(2.0, Rate(2, 1.0), id="whole-float"),
        pytest.param("0.5/m", Rate(1, 120.0), id="half-per-minute"),
        pytest.param("2.5/s", Rate(5, 2.0), id="fraction"),
        pytest.param(0.1, Rate(1, 10.0), id="float-tenth"),
        pytest.param("1e3/h", Rate(1000, 3600.0), id="exponent"),
        pytest.param(Rate(4, 2.0), Rate(4, 2.0), id="rate"),
    ],
)
def test_parse_rate(value, expected):
    assert parse_rate(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("fast", id="word"),
        pytest.param("10/d", id="unknown-unit"),
        pytest.param("10/min", id="long-unit"),
        pytest.param("10/m/s", id="two-units"),
        pytest.param("/m", id="no-count"),
        pytest.param("0/s", id="zero"),
        pytest.param("-5/m", id="negative"),
        pytest.param("nan/s", id="nan-string"),
        pytest.param("inf", id="inf-string"),
        pytest.param(0, id="zero-int"),
        pytest.param(-1.5, id="negative-float"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
        pytest.param([10, "s"], id="list"),
    ],
)
def test_bad_rates_name_the_option(value):
    with pytest.raises(errors.ConfigurationError) as raised:
        parse_rate(value)
    assert raised.value.option == "global_rate_limit"
    assert str(raised.value).startswith("global_rate_limit: ")
    with pytest.raises(errors.ConfigurationError) as raised:
        parse_rate(value, option="redlock_tasks['crm.sync'].global_rate_limit")
    assert raised.value.option == "redlock_tasks['crm.sync'].global_rate_limit"


def test_a_zero_rate_says_how_to_remove_a_limit():
    with pytest.raises(errors.ConfigurationError, match="leave the option unset"):
        parse_rate("0/m")


def test_rate_reads_back():
    assert str(parse_rate("100/m")) == "100/60s"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        pytest.param({"limit": 0}, "limit", id="limit-zero"),
        pytest.param({"limit": -3}, "limit", id="limit-negative"),
        pytest.param({"limit": 2.5}, "limit", id="limit-float"),
        pytest.param({"limit": True}, "limit", id="limit-bool"),
        pytest.param({"limit": "10"}, "limit", id="limit-str"),
        pytest.param({"period": 0}, "period", id="period-zero"),
        pytest.param({"period": -1.0}, "period", id="period-negative"),
        pytest.param({"period": 0.0001}, "period", id="period-below-1ms"),
        pytest.param({"period": float("inf")}, "period", id="period-inf"),
        pytest.param({"period": "60"}, "period", id="period-str"),
        pytest.param({"cost": 0}, "cost", id="cost-zero"),
        pytest.param({"cost": 11}, "cost", id="cost-over-limit"),
        pytest.param({"cost": 1.0}, "cost", id="cost-float"),
        pytest.param({"key": ""}, "key", id="key-empty"),
        pytest.param({"key": b"k"}, "key", id="key-bytes"),
        pytest.param({"algorithm": "gcra"}, "algorithm", id="algorithm-unknown"),
    ],
)
@pytest.mark.parametrize("method", ["hit", "peek"])
def test_bad_hit_arguments_name_the_argument(method, kwargs, option):
    limiter = RateLimiter(URL)
    arguments = {"key": "k", "limit": 10, "period": 1.0, **kwargs}
    with pytest.raises(errors.ConfigurationError) as raised:
        getattr(limiter, method)(**arguments)
    assert raised.value.option == option
    assert str(raised.value).startswith(f"{option}: ")
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        pytest.param(("http://h/",), {}, "client_or_url", id="not-redis-url"),
        pytest.param((42,), {}, "client_or_url", id="not-a-url"),
        pytest.param(("redis://h:port/0",), {}, "client_or_url", id="bad-port"),
        pytest.param((URL,), {"algorithm": "leaky"}, "algorithm", id="algorithm"),
        pytest.param((URL,), {"node_timeout": 0}, "node_timeout", id="timeout-zero"),
        pytest.param((URL,), {"node_timeout": "1"}, "node_timeout", id="timeout-str"),
        pytest.param((URL,), {"key_prefix": None}, "key_prefix", id="prefix"),
    ],
)
def test_bad_limiter_arguments(args, kwargs, option):
    with pytest.raises(errors.ConfigurationError) as raised:
        RateLimiter(*args, **kwargs)
    assert raised.value.option == option
    assert str(raised.value).startswith(f"{option}: ")


def test_password_is_not_shown():
    limiter = RateLimiter("redis://:hunter2@127.0.0.1:6390/0")
    assert "hunter2" not in repr(limiter)
    with pytest.raises(errors.ConfigurationError) as raised:
        RateLimiter("redis://:hunter2@h:port/0")
    assert "hunter2" not in str(raised.value)


def test_accepts_a_client():
    limiter = RateLimiter(redis.Redis(host="127.0.0.1", port=6390, decode_responses=True))
    assert "127.0.0.1:6390" in repr(limiter)


@pytest.mark.parametrize("key", ["api:acme", "a}b", "x{y", "{already-tagged}", "ünïcode"], ids=repr)
@pytest.mark.parametrize("prefix", ["redlock:rate:", "{app}:", "odd{"])
def test_one_limit_keeps_its_keys_in_one_cluster_slot(key, prefix):
    limiter = RateLimiter(URL, key_prefix=prefix)
    fixed, sliding = limiter.state_key(key, "fixed"), limiter.state_key(key, "sliding")
    assert fixed != sliding
    assert key_slot(fixed.encode()) == key_slot(sliding.encode())


def test_state_key_format():
    assert RateLimiter(URL).state_key("api:acme") == "redlock:rate:{api:acme}:fixed"
    limiter = RateLimiter(URL, key_prefix="p:", algorithm="sliding")
    assert limiter.state_key("k") == "p:{k}:sliding"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param([1, 1, 0, 60000], RateLimitDecision(True, 10, 9, 0.0, 60.0), id="first"),
        pytest.param([1, 10, 0, 1500], RateLimitDecision(True, 10, 0, 0.0, 1.5), id="last"),
        pytest.param([0, 10, 250, 250], RateLimitDecision(False, 10, 0, 0.25, 0.25), id="full"),
        pytest.param([0, 7, 3, 900], RateLimitDecision(False, 10, 3, 0.003, 0.9), id="too-big"),
        pytest.param([1, 0, 0, 0], RateLimitDecision(True, 10, 10, 0.0, 0.0), id="empty-peek"),
    ],
)
def test_script_replies_become_decisions_in_seconds(reply, expected):
    assert _decision(reply, 10) == expected


def test_decisions_are_frozen():
    decision = _decision([1, 1, 0, 1000], 5)
    with pytest.raises(AttributeError):
        decision.allowed = False  # type: ignore[misc]
