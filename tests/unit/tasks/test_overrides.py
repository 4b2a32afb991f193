"""Per-call overrides (``apply_async(..., redlock={...})``): what a call may set, and how."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from celery_redlock.errors import ConfigurationError
from celery_redlock.tasks import call_overrides as overrides
from celery_redlock.tasks.key_templates import ArgumentPlan
from celery_redlock.tasks.policies import TaskPolicy
from celery_redlock.tasks.settings import Settings

PLAN = ArgumentPlan(inspect.signature(lambda user_id, page=1: None))
SETTINGS = Settings(nodes=("redis://127.0.0.1:1/0",))


def policy(**given: Any) -> TaskPolicy:
    return TaskPolicy.from_options("proj.sync", PLAN, given).resolve(SETTINGS)


LOCKED = policy(lock_key="sync:{user_id}")
SINGLETON = policy(singleton=True)
LIMITED = policy(global_rate_limit="5/s")


def refused(task_policy: TaskPolicy, raw: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        overrides.check("proj.sync", task_policy, raw, SETTINGS)
    return caught.value


def test_values_are_checked_and_returned_in_checked_form() -> None:
    raw = {"lock_timeout": 5, "on_lock_busy": "raise", "lock_ttl": 30, "lock_busy_max_requeues": 4}
    assert overrides.check("proj.sync", LOCKED, raw, SETTINGS) == {
        "lock_timeout": 5.0,
        "on_lock_busy": "raise",
        "lock_ttl": 30.0,
        "lock_busy_max_requeues": 4,
    }


def test_none_leaves_the_task_value() -> None:
    assert overrides.check("proj.sync", LOCKED, {"lock_timeout": None}) == {}


@pytest.mark.parametrize(
    ("given", "meant"),
    [("lock_timout", "lock_timeout"), ("on_duplicat", "on_duplicate"), ("ttl_lock", "lock_ttl")],
)
def test_a_misspelt_name_is_refused_with_the_closest_one(given: str, meant: str) -> None:
    error = refused(LOCKED, {given: 5})
    assert error.option == f"redlock[{given!r}]"
    assert error.task == "proj.sync"
    assert f"did you mean {meant}?" in error.problem


@pytest.mark.parametrize("name", ["lock_key", "singleton", "global_rate_limit", "lock_enabled"])
def test_options_that_say_what_calls_share_cannot_be_set_per_call(name: str) -> None:
    error = refused(LOCKED, {name: "x"})
    assert error.option == f"redlock[{name!r}]"
    assert error.problem.startswith("cannot be set per call")
    assert "did you mean" not in error.problem


def test_an_unrelated_name_lists_what_can_be_set() -> None:
    error = refused(LOCKED, {"colour": "blue"})
    for name in overrides.CALL_OPTIONS:
        assert name in error.problem


@pytest.mark.parametrize(
    ("raw", "option", "problem"),
    [
        ({"lock_timeout": -1}, "redlock['lock_timeout']", "must be >= 0 seconds, got -1"),
        (
            {"on_lock_busy": "wait"},
            "redlock['on_lock_busy']",
            "must be one of 'retry', 'skip', 'raise', got 'wait'",
        ),
        ({"lock_busy_max_requeues": 0}, "redlock['lock_busy_max_requeues']", "got 0"),
        ({"lock_ttl": "60"}, "redlock['lock_ttl']", "expected a number of seconds, got '60'"),
        ({"lock_ttl": 0.08}, "redlock['lock_ttl']", "too short for redlock_node_timeout"),
    ],
)
def test_a_bad_value_is_refused_naming_the_override(
    raw: dict[str, Any], option: str, problem: str
) -> None:
    error = refused(LOCKED, raw)
    assert error.option == option
    assert problem in error.problem
    assert str(error).startswith(f"task 'proj.sync': {option}: ")


def test_not_a_dict_is_refused() -> None:
    error = refused(LOCKED, [("lock_timeout", 5)])
    assert error.option == "redlock"


@pytest.mark.parametrize(
    ("task_policy", "raw", "missing"),
    [
        (LOCKED, {"on_duplicate": "raise"}, "not a singleton"),
        (LOCKED, {"on_rate_limited": "skip"}, "no global_rate_limit"),
        (SINGLETON, {"lock_timeout": 5}, "no run lock"),
        (LIMITED, {"lock_ttl": 5}, "holds no lock"),
    ],
)
def test_an_override_the_task_has_no_use_for_is_refused(
    task_policy: TaskPolicy, raw: dict[str, Any], missing: str
) -> None:
    assert missing in refused(task_policy, raw).problem


def test_with_values_replaces_only_what_the_call_sets() -> None:
    both = policy(lock_key="sync:{user_id}", singleton=True, global_rate_limit="5/s")
    changed = both.with_values(
        {
            "lock_timeout": 5.0,
            "on_lock_busy": "skip",
            "lock_busy_max_requeues": 3,
            "lock_ttl": 20.0,
            "lock_progress_timeout": 7.0,
            "on_duplicate": "raise",
            "singleton_ttl": 99.0,
            "on_rate_limited": "raise",
        },
    )
    assert changed.lock is not None
    assert both.lock is not None
    assert (changed.lock.timeout, changed.lock.on_busy, changed.lock.max_requeues) == (
        5.0,
        "skip",
        3,
    )
    assert changed.lock.key is both.lock.key
    assert changed.singleton is not None
    assert both.singleton is not None
    assert (changed.singleton.on_duplicate, changed.singleton.ttl) == ("raise", 99.0)
    assert changed.singleton.key is both.singleton.key
    assert changed.rate is not None
    assert changed.rate.on_limited == "raise"
    assert (changed.ttl, changed.progress_timeout) == (20.0, 7.0)
    assert both.with_values({}) == both


def test_a_concurrency_limit_takes_the_busy_and_ttl_overrides() -> None:
    limited = policy(concurrency_limit=3, concurrency_key="export:{user_id}")
    raw = {"lock_timeout": 5, "on_lock_busy": "skip", "lock_busy_max_requeues": 2, "lock_ttl": 9}
    checked = overrides.check("proj.sync", limited, raw, SETTINGS)
    changed = limited.with_values(checked)
    assert changed.concurrency is not None
    assert (changed.concurrency.timeout, changed.concurrency.on_busy) == (5.0, "skip")
    assert changed.concurrency.max_requeues == 2
    assert changed.ttl == 9.0
    assert changed.concurrency.key is limited.concurrency.key  # type: ignore[union-attr]
    assert changed.lock is None
