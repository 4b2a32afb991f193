"""Rates, limits, the limiter's argument checks and its reply decoding (no Redis)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from redis.crc import key_slot

from celery_redlock import RateLimitDecision, RateLimiter, errors
from celery_redlock._layout import RateKeys
from celery_redlock.ratelimit import Limit, LimitDecision
from celery_redlock.ratelimit.decision import combine, from_reply, unchecked
from celery_redlock.ratelimit.limit import Resolved
from celery_redlock.ratelimit.rates import DynamicRate, Rate, micros, parse_rate, rate_source

#: Nothing listens here; nothing in these tests connects.
URL = "redis://127.0.0.1:6390/0"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("10/s", Rate(10, 1.0), id="per-second"),
        pytest.param("100/m", Rate(100, 60.0), id="per-minute"),
        pytest.param("1000/h", Rate(1000, 3600.0), id="per-hour"),
        pytest.param("50000/d", Rate(50000, 86400.0), id="per-day"),
        pytest.param("7", Rate(7, 1.0), id="bare-string"),
        pytest.param(" 5 / m ", Rate(5, 60.0), id="spaces"),
        pytest.param(3, Rate(3, 1.0), id="int"),
        pytest.param(2.0, Rate(2, 1.0), id="whole-float"),
        pytest.param("0.5/m", Rate(0.5, 60.0), id="half-per-minute"),
        pytest.param("2.5/s", Rate(2.5, 1.0), id="fraction"),
        pytest.param("33.3/m", Rate(33.3, 60.0), id="odd-fraction"),
        pytest.param("3.33333/s", Rate(3.33333, 1.0), id="many-digits"),
        pytest.param(0.1, Rate(0.1, 1.0), id="float-tenth"),
        pytest.param(0.1 + 0.2, Rate(0.30000000000000004, 1.0), id="float-sum"),
        pytest.param("1e3/h", Rate(1000, 3600.0), id="exponent"),
        pytest.param("1000000/s", Rate(1_000_000, 1.0), id="fastest"),
        pytest.param("0.0028/d", Rate(0.0028, 86400.0), id="one-a-year"),
        pytest.param(Rate(4, 2.0), Rate(4, 2.0), id="rate"),
    ],
)
def test_parse_rate(value, expected):
    assert parse_rate(value) == expected


def test_a_fraction_keeps_its_meaning():
    # Not 5 per 2 s, not 333 per 600 s, not 7500000000000001/2.5e+16s.
    rate = parse_rate("2.5/s")
    assert (rate.window_limit, rate.interval, rate.whole) == (3, 0.4, False)
    assert parse_rate("33.3/m").window_limit == 34
    assert str(parse_rate(0.1 + 0.2)) == "0.3/s"
    assert parse_rate(0.1 + 0.2).interval == pytest.approx(10 / 3)


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        pytest.param(Rate(100, 60.0), "100/m", id="minute"),
        pytest.param(Rate(50000, 86400.0), "50000/d", id="day"),
        pytest.param(Rate(2.5, 1.0), "2.5/s", id="fraction"),
        pytest.param(Rate(3, 2.5), "3/2.5s", id="odd-period"),
    ],
)
def test_rate_reads_back(rate, text):
    assert str(rate) == text
    assert parse_rate(text) == rate


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("fast", id="word"),
        pytest.param("10/w", id="unknown-unit"),
        pytest.param("10/min", id="long-unit"),
        pytest.param("10/m/s", id="two-units"),
        pytest.param("/m", id="no-count"),
        pytest.param("0/s", id="zero"),
        pytest.param("-5/m", id="negative"),
        pytest.param("nan/s", id="nan-string"),
        pytest.param("inf", id="inf-string"),
        pytest.param("1e400/s", id="overflows-a-float"),
        pytest.param("2000000000/d", id="over-max-limit"),
        pytest.param("2000000/s", id="over-max-rate"),
        pytest.param("0.001/d", id="less-than-one-a-year"),
        pytest.param(1e-300, id="tiny-float"),
        pytest.param(0, id="zero-int"),
        pytest.param(-1.5, id="negative-float"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
        pytest.param([10, "s"], id="list"),
        pytest.param(Rate(5, 0.0001), id="rate-period-below-1ms"),
        pytest.param(Rate(5, 400 * 86400.0), id="rate-period-over-366-days"),
        pytest.param(Rate(float("nan"), 1.0), id="rate-nan"),
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


def test_micros_does_not_round():
    assert micros(0.0025) == 2500.0
    assert micros(0.001) == 1000.0
    assert micros(1 / 3) == pytest.approx(333333.3333333333)
    assert micros(86400) == 86_400_000_000.0


def test_a_callable_rate_is_evaluated_per_call_and_checked():
    plans = {"acme": "100/s", "small": "2.5/s"}
    source = rate_source(lambda key: plans[key.split(":")[1]], option="rate")
    assert isinstance(source, DynamicRate)
    assert source.resolve("api:acme") == Rate(100, 1.0)
    plans["acme"] = "5/m"
    assert source.resolve("api:acme") == Rate(5, 60.0)
    assert source.resolve("api:small") == Rate(2.5, 1.0)
    plans["acme"] = "lots"
    with pytest.raises(errors.ConfigurationError) as raised:
        source.resolve("api:acme")
    assert raised.value.option.startswith("rate (returned by ")
    assert rate_source("10/s") == Rate(10, 1.0)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        pytest.param(("", "1/s"), "key", id="empty-key"),
        pytest.param((b"k", "1/s"), "key", id="bytes-key"),
        pytest.param(("bad\udcff", "1/s"), "key", id="lone-surrogate"),
        pytest.param(("k" * 1025, "1/s"), "key", id="key-too-long"),
        pytest.param(("k", "often"), "rate", id="bad-rate"),
        pytest.param(("k", "1/s", "leaky"), "algorithm", id="bad-algorithm"),
        pytest.param(("k", "20000/s", "gcra"), "rate", id="gcra-too-fast"),
        pytest.param(("k", Rate(1, 0.0025), "fixed"), "rate", id="fixed-sub-ms"),
    ],
)
def test_bad_limits_name_the_option(args, option):
    with pytest.raises(errors.ConfigurationError) as raised:
        Limit(*args)
    assert raised.value.option == option


def test_limits_compare_and_show_themselves():
    assert Limit("k", "10/s") == Limit("k", Rate(10, 1.0))
    assert Limit("k", "10/s") != Limit("k", "10/s", "gcra")
    assert repr(Limit("k", "10/s", "gcra")) == "Limit('k', '10/s', 'gcra')"
    with pytest.raises(AttributeError):
        Limit("k", "10/s").key = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        pytest.param({"limit": 0}, "limit", id="limit-zero"),
        pytest.param({"limit": -3}, "limit", id="limit-negative"),
        pytest.param({"limit": True}, "limit", id="limit-bool"),
        pytest.param({"limit": "10"}, "limit", id="limit-str-with-period"),
        pytest.param({"limit": float("nan")}, "limit", id="limit-nan"),
        pytest.param({"limit": 2e9}, "limit", id="limit-over-max"),
        pytest.param({"limit": 2e6}, "limit", id="rate-over-max"),
        pytest.param({"period": 0}, "period", id="period-zero"),
        pytest.param({"period": -1.0}, "period", id="period-negative"),
        pytest.param({"period": 0.0001}, "period", id="period-below-1ms"),
        pytest.param({"period": 4e7}, "period", id="period-over-366-days"),
        pytest.param({"period": float("inf")}, "period", id="period-inf"),
        pytest.param({"period": "60"}, "period", id="period-str"),
        pytest.param({"period": 0.0025, "algorithm": "fixed"}, "period", id="fixed-sub-ms"),
        pytest.param({"limit": 20000, "algorithm": "gcra"}, "limit", id="gcra-too-fast"),
        pytest.param({"cost": 0}, "cost", id="cost-zero"),
        pytest.param({"cost": 11}, "cost", id="cost-over-limit"),
        pytest.param({"cost": 1.0}, "cost", id="cost-float"),
        pytest.param({"cost": True}, "cost", id="cost-bool"),
        pytest.param({"key": ""}, "key", id="key-empty"),
        pytest.param({"key": b"k"}, "key", id="key-bytes"),
        pytest.param({"key": "k\ud800"}, "key", id="key-not-utf8"),
        pytest.param({"key": "é" * 513}, "key", id="key-over-1kib"),
        pytest.param({"algorithm": "leaky"}, "algorithm", id="algorithm-unknown"),
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
        pytest.param(("k",), {}, "limit", id="no-limit"),
        pytest.param(("k", 10), {}, "period", id="number-without-period"),
        pytest.param(("k", "often"), {}, "rate", id="bad-rate"),
        pytest.param(([],), {}, "limits", id="no-limits"),
        pytest.param(([("k", "1/s")] * 17,), {}, "limits", id="too-many"),
        pytest.param(([("k", "1/s"), ("k", "2/s", "gcra")],), {}, "limits", id="key-twice"),
        pytest.param(([("k", "1/s")], 10, 1.0), {}, "limit", id="list-with-limit"),
        pytest.param((["k"],), {}, "limits", id="bare-key-in-list"),
        pytest.param((42,), {}, "limits", id="not-a-key"),
        pytest.param(([("k", "2/s"), ("g", "10/s")],), {"cost": 3}, "cost", id="cost-over-one"),
        pytest.param(
            ([Limit("k", lambda key: "nonsense")],), {}, "rate (returned by ", id="callable"
        ),
    ],
)
def test_bad_limit_lists_name_the_argument(args, kwargs, option):
    limiter = RateLimiter(URL)
    with pytest.raises(errors.ConfigurationError) as raised:
        limiter.hit(*args, **kwargs)
    assert raised.value.option.startswith(option)


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        pytest.param(("http://h/",), {}, "client_or_url", id="not-redis-url"),
        pytest.param((42,), {}, "client_or_url", id="not-a-url"),
        pytest.param(("redis://h:port/0",), {}, "client_or_url", id="bad-port"),
        pytest.param((URL,), {"algorithm": "leaky"}, "algorithm", id="algorithm"),
        pytest.param((URL,), {"node_timeout": 0}, "node_timeout", id="timeout-zero"),
        pytest.param((URL,), {"node_timeout": 1e-9}, "node_timeout", id="timeout-tiny"),
        pytest.param((URL,), {"node_timeout": "1"}, "node_timeout", id="timeout-str"),
        pytest.param((URL,), {"key_prefix": None}, "key_prefix", id="prefix"),
        pytest.param((URL,), {"key_prefix": "p\udcff"}, "key_prefix", id="prefix-not-utf8"),
        pytest.param((URL,), {"margin": -0.01}, "margin", id="margin-negative"),
        pytest.param((URL,), {"margin": 120.0}, "margin", id="margin-too-long"),
        pytest.param((URL,), {"on_unavailable": "ignore"}, "on_unavailable", id="policy"),
        pytest.param((URL,), {"retry_interval": 0}, "retry_interval", id="retry-zero"),
        pytest.param((URL,), {"fallback": "http://h/"}, "fallback", id="fallback-url"),
        pytest.param((URL,), {"fallback": URL}, "fallback", id="fallback-is-primary"),
    ],
)
def test_bad_limiter_arguments(args, kwargs, option):
    with pytest.raises(errors.ConfigurationError) as raised:
        RateLimiter(*args, **kwargs)
    assert raised.value.option == option
    assert str(raised.value).startswith(f"{option}: ")


@pytest.mark.parametrize(
    ("rate", "ttl", "option"),
    [
        pytest.param("often", 60.0, "rate", id="bad-rate"),
        pytest.param(Rate(1, 0.0025), 60.0, "rate", id="sub-ms-period"),
        pytest.param("20000/s", 60.0, "rate", id="too-fast-for-gcra"),
        pytest.param("10/s", 0, "ttl", id="ttl-zero"),
        pytest.param("10/s", 400 * 86400.0, "ttl", id="ttl-over-366-days"),
        pytest.param("10/s", float("inf"), "ttl", id="ttl-inf"),
        pytest.param("10/s", None, "ttl", id="ttl-none"),
    ],
)
def test_bad_overrides_name_the_argument(rate, ttl, option):
    limiter = RateLimiter(URL)
    with pytest.raises(errors.ConfigurationError) as raised:
        limiter.set_override("k", rate, ttl=ttl)
    assert raised.value.option == option


def test_password_is_not_shown():
    limiter = RateLimiter("redis://:hunter2@127.0.0.1:6390/0", fallback="redis://:pw@h:1/0")
    assert "hunter2" not in repr(limiter)
    assert "pw" not in repr(limiter)
    with pytest.raises(errors.ConfigurationError) as raised:
        RateLimiter("redis://:hunter2@h:port/0")
    assert "hunter2" not in str(raised.value)


def test_accepts_a_client():
    limiter = RateLimiter(redis.Redis(host="127.0.0.1", port=6390, decode_responses=True))
    assert "127.0.0.1:6390" in repr(limiter)


@pytest.mark.parametrize("key", ["api:acme", "a}b", "x{y", "{already-tagged}", "ünïcode"], ids=repr)
@pytest.mark.parametrize("prefix", ["redlock:rate:", "{app}:", "odd{"])
def test_one_limit_keeps_its_keys_in_one_cluster_slot(key, prefix):
    layout = RateKeys(prefix)
    keys = {layout.state(key, name) for name in ("sliding", "gcra", "fixed")}
    keys |= {layout.pace(key, "sliding"), layout.pace(key, "fixed"), layout.override(key)}
    assert len(keys) == 6
    assert len({key_slot(name.encode()) for name in keys}) == 1


@pytest.mark.parametrize("key", ["api:acme", "a}b", "x{y", "}:override", "ü"], ids=repr)
def test_override_keys_read_back(key):
    layout = RateKeys("redlock:rate:")
    assert layout.override_key_name(layout.override(key)) == key
    assert layout.override_key_name(layout.state(key, "sliding")) is None


def test_state_key_format():
    assert RateLimiter(URL).state_key("api:acme") == "redlock:rate:{api:acme}:sliding"
    limiter = RateLimiter(URL, key_prefix="p:", algorithm="gcra")
    assert limiter.state_key("k") == "p:{k}:gcra"
    assert limiter.state_key("k", "fixed") == "p:{k}:fixed"


TEN_PER_SECOND = Rate(10, 1.0)


def _resolved(key="k", rate=TEN_PER_SECOND, algorithm="sliding"):
    return Resolved(key, rate, algorithm)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(
            [1, 9, 0, 60_000_000, b"10", b"1000000", 0],
            LimitDecision("k", "sliding", 10, 1.0, True, 9, 0.0, 60.0),
            id="first",
        ),
        pytest.param(
            [0, 0, 250_000, 250_000, b"10", b"1000000", 0],
            LimitDecision("k", "sliding", 10, 1.0, False, 0, 0.25, 0.25),
            id="full",
        ),
        pytest.param(
            [0, 3, 3, 900_000, b"2.5", b"2500", 1],
            LimitDecision("k", "sliding", 2.5, 0.0025, False, 3, 0.000003, 0.9, True),
            id="overridden-fraction",
        ),
        pytest.param(
            [0, 3, 250_000, 900_000, b"7.5", b"1000000", 2 + 4 + 8],
            LimitDecision(
                "k",
                "sliding",
                7.5,
                1.0,
                False,
                3,
                0.25,
                0.9,
                adapted=True,
                paused=True,
                raised=True,
            ),
            id="adapted-paused-raised",
        ),
    ],
)
def test_script_replies_become_decisions_in_seconds(reply, expected):
    decision = from_reply([reply], [_resolved()], node="n")
    assert decision.limits == (expected,)
    assert decision.node == "n"
    assert decision.checked


def test_several_limits_sum_up():
    a = LimitDecision("a", "sliding", 10, 1.0, True, 7, 0.0, 1.0)
    b = LimitDecision("b", "gcra", 50000, 86400.0, False, 2, 1.5, 3.0)
    c = LimitDecision("c", "fixed", 5, 60.0, False, 4, 0.5, 60.0)
    decision = combine([a, b, c], node="n")
    assert decision == RateLimitDecision(
        allowed=False,
        limit=50000,
        remaining=2,
        retry_after=1.5,
        reset_after=60.0,
        limits=(a, b, c),
        node="n",
    )
    assert decision.refused_by == (b, c)
    admitted = combine([a], node="n")
    assert (admitted.allowed, admitted.retry_after, admitted.refused_by) == (True, 0.0, ())


def test_an_unchecked_decision_says_so():
    decision = unchecked([_resolved(rate=Rate(2.5, 1.0)), _resolved("g", Rate(100, 60.0))])
    assert decision.allowed
    assert not decision.checked
    assert decision.node is None
    assert (decision.limit, decision.remaining) == (2.5, 3)
    assert [limit.key for limit in decision.limits] == ["k", "g"]


def test_decisions_are_frozen():
    decision = combine([LimitDecision("a", "sliding", 10, 1.0, True, 7, 0.0, 1.0)], node="n")
    with pytest.raises(AttributeError):
        decision.allowed = False  # type: ignore[misc]


def test_a_child_forked_while_the_health_lock_is_held_does_not_hang():
    limiter = RateLimiter(URL)
    routes = limiter._routes
    route = routes.candidates()[0]
    with routes._lock:
        pid = os.fork()
        if pid == 0:  # the child: record a failure and a recovery, then leave at once
            routes.failed(route, OSError("down"), took=0.0)
            routes.succeeded(route)
            os._exit(0 if routes.status()[0].answering else 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the child hung on a lock held at fork time")
