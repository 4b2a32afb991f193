"""The validators of the Celery integration, and errors built from their parts."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest
import redis

from celery_redlock.errors import ConfigurationError
from celery_redlock.ratelimit.rates import Rate
from celery_redlock.tasks import setting_checks as check
from celery_redlock.tasks.setting_checks import RateEntry


def problem(validator: Any, value: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        validator(value, "opt", *args, **kwargs)
    assert caught.value.option == "opt"
    assert str(caught.value) == f"opt: {caught.value.problem}"
    return str(caught.value.problem)


class TestConfigurationError:
    def test_built_from_its_parts(self) -> None:
        error = ConfigurationError("lock_ttl", "must be > 0 seconds, got 0", task="proj.sync")
        assert str(error) == "task 'proj.sync': lock_ttl: must be > 0 seconds, got 0"
        assert (error.option, error.problem, error.task) == (
            "lock_ttl",
            "must be > 0 seconds, got 0",
            "proj.sync",
        )
        assert isinstance(error, ValueError)

    def test_with_context_moves_the_problem_not_the_words(self) -> None:
        error = ConfigurationError("nodes", "'x' is not a Redis URL")
        assert (str(error), error.task) == ("nodes: 'x' is not a Redis URL", None)
        moved = error.with_context(option="redlock_nodes")
        assert str(moved) == "redlock_nodes: 'x' is not a Redis URL"
        assert moved.option == "redlock_nodes"
        for_task = ConfigurationError("lock_ttl", "bad").with_context(task="t")
        assert str(for_task) == "task 't': lock_ttl: bad"

    def test_survives_pickling_and_rebuilding_from_its_message(self) -> None:
        error = ConfigurationError("lock_ttl", "bad", task="t")
        again = pickle.loads(pickle.dumps(error))
        assert (str(again), again.option, again.task) == (str(error), "lock_ttl", "t")
        # What a result backend does: the class called with the stored args.
        rebuilt = ConfigurationError(*error.args)
        assert (str(rebuilt), rebuilt.option, rebuilt.task) == (str(error), "lock_ttl", "t")


class TestSeconds:
    @pytest.mark.parametrize("value", [1, 0.5, 3600, 1e-3])
    def test_positive_numbers(self, value: float) -> None:
        assert check.seconds(value, "opt") == float(value)
        assert isinstance(check.seconds(value, "opt"), float)

    def test_zero_only_when_allowed(self) -> None:
        assert check.seconds(0, "opt", allow_zero=True) == 0.0
        assert problem(check.seconds, 0) == "must be > 0 seconds, got 0"
        assert problem(check.seconds, -1, allow_zero=True) == "must be >= 0 seconds, got -1"

    @pytest.mark.parametrize("value", ["60", True, None, math.nan, math.inf, [1]])
    def test_not_a_number_of_seconds(self, value: Any) -> None:
        assert problem(check.seconds, value) == f"expected a number of seconds, got {value!r}"


class TestPositiveInt:
    def test_accepts_whole_numbers_from_one(self) -> None:
        assert check.positive_int(1, "opt") == 1
        assert check.positive_int(10**6, "opt") == 10**6

    @pytest.mark.parametrize("value", [0, -1, 1.0, True, "3"])
    def test_refuses_the_rest(self, value: Any) -> None:
        assert problem(check.positive_int, value) == f"expected a whole number >= 1, got {value!r}"


class TestChoice:
    def test_one_of_the_choices(self) -> None:
        assert check.choice("skip", "opt", ("retry", "skip")) == "skip"

    @pytest.mark.parametrize("value", ["wait", "SKIP", 1, None])
    def test_anything_else(self, value: Any) -> None:
        assert (
            problem(check.choice, value, ("retry", "skip"))
            == f"must be one of 'retry', 'skip', got {value!r}"
        )


class TestFlag:
    def test_bools_only(self) -> None:
        assert check.flag(True, "opt") is True
        assert check.flag(False, "opt") is False
        assert problem(check.flag, 1) == "must be True or False, got 1"
        assert problem(check.flag, "yes") == "must be True or False, got 'yes'"


class TestStringsAndRedis:
    def test_string(self) -> None:
        assert check.string("", "opt") == ""
        assert problem(check.string, 7) == "expected a string, got 7"

    def test_redis_url(self) -> None:
        client = redis.Redis()
        assert check.redis_url("redis://h/0", "opt") == "redis://h/0"
        assert check.redis_url(client, "opt") is client
        assert problem(check.redis_url, 5) == "expected a Redis URL, got 5"

    def test_redis_urls(self) -> None:
        assert check.redis_urls("redis://h/0", "opt") == ("redis://h/0",)
        assert check.redis_urls(["redis://a/0", "redis://b/0"], "opt") == (
            "redis://a/0",
            "redis://b/0",
        )
        assert problem(check.redis_urls, []) == "expected a list of Redis URLs, got []"
        assert problem(check.redis_urls, 5) == "expected a list of Redis URLs, got 5"

    def test_table(self) -> None:
        assert check.table({"t": {"singleton": True}}, "opt") == {"t": {"singleton": True}}
        assert problem(check.table, ["t"]) == "expected {task name: {option: value}}, got ['t']"
        assert problem(check.table, {"t": 1}).startswith("expected {task name:")


class TestRate:
    def test_celery_syntax(self) -> None:
        assert check.rate_limits("100/m", "opt") == (RateEntry(Rate(limit=100, period=60.0)),)

    def test_problems_name_the_option_given(self) -> None:
        assert problem(check.rate_limits, "5/x").startswith("'5/x' has an unknown unit 'x'")
        assert problem(check.rate_limits, "0/s").startswith("'0/s' allows no calls")
