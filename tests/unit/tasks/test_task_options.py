"""Task options: the option list, checks at definition, and resolution against settings."""

from __future__ import annotations

import dataclasses
import inspect
import re
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from celery_redlock import LockedTask
from celery_redlock.errors import ConfigurationError
from celery_redlock.ratelimit.rates import DynamicRate, Rate
from celery_redlock.tasks import options
from celery_redlock.tasks import settings as config
from celery_redlock.tasks.key_templates import ArgumentPlan
from celery_redlock.tasks.policies import TaskPolicy
from celery_redlock.tasks.settings import Settings

PLAN = ArgumentPlan(inspect.signature(lambda user_id, page=1: None))
SETTINGS = Settings(nodes=("redis://127.0.0.1:1/0",))
ROOT = Path(__file__).resolve().parents[3]
#: A default value as the docs write one: a number, a quoted word, None, False or True.
LITERAL = r'[\d.]+|"\w+"|None|False|True'


def shown(value: Any) -> str:
    """A default as the docs write it: ``3600`` for 3600.0, ``"retry"`` for a string."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f'"{value}"' if isinstance(value, str) else str(value)


def documented_defaults() -> dict[str, str]:
    """The default column of each option's row in docs/configuration.md's option tables."""
    section = (ROOT / "docs" / "configuration.md").read_text().split("## Task options", 1)[1]
    found: dict[str, str] = {}
    header: list[str] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif header[:3] == ["option", "type", "default"] and re.fullmatch(r"`\w+`", cells[0]):
            found.setdefault(cells[0].strip("`"), cells[2])
    return found


def attribute_comments() -> dict[str, str]:
    """The ``#:`` comment above each option attribute of LockedTask, as one line."""
    source = (ROOT / "celery_redlock" / "tasks" / "locked_task.py").read_text()
    found: dict[str, str] = {}
    block: list[str] = []
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#:"):
            block.append(text[2:].strip())
            continue
        declared = re.match(r"(\w+): .+ = None$", text)
        if declared and block:
            found[declared.group(1)] = " ".join(block)
        block = []
    return found


def policy(**given: Any) -> TaskPolicy:
    return TaskPolicy.from_options("proj.sync", PLAN, given)


def refused(**given: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        policy(**given)
    assert caught.value.task == "proj.sync"
    assert str(caught.value).startswith(f"task 'proj.sync': {caught.value.option}: ")
    return caught.value


class TestTheOptionList:
    def test_names_are_unique_and_each_has_a_feature(self) -> None:
        assert len(set(options.OPTION_NAMES)) == len(options.OPTION_NAMES)
        features = {option.feature for option in options.TASK_OPTIONS}
        assert features == {"lock", "singleton", "debounce", "rate", "concurrency"}

    def test_defaults_pass_their_own_check(self) -> None:
        for option in options.TASK_OPTIONS:
            if option.default is not None:
                assert option.check(option.default, option.name) == option.default

    def test_the_documented_defaults_are_the_option_list_s(self) -> None:
        # LockedTask leaves every option at None, so the list's default (or a
        # setting's) applies; its comments and the docs' tables state them.
        documented, comments = documented_defaults(), attribute_comments()
        setting_defaults = {f"redlock_{f.name}": f.default for f in dataclasses.fields(Settings)}
        for option in options.TASK_OPTIONS:
            assert getattr(LockedTask, option.name) is None, option.name
            cell, comment = documented[option.name], comments[option.name]
            literals = re.findall(f"`({LITERAL})`", cell)
            stated = re.findall(f"(?:\\(default:?|, else) (?:``)?({LITERAL})(?![\\w.])", comment)
            stated += re.findall(r"``(\"\w+\")`` \(default", comment)
            if option.default is None:
                assert set(literals) <= {"None"}, option.name
                assert set(stated) <= {"None"}, option.name
            else:
                assert literals == [shown(option.default)], option.name
                assert stated == [shown(option.default)], option.name
            if option.setting is not None:
                assert f"`{option.setting}`" in cell, option.name
                assert option.setting in comment, option.name
                for number in re.findall(r"(?:\(|``, )(\d+)\)", cell + comment):
                    assert float(number) == setting_defaults[option.setting], option.name

    def test_a_default_from_the_settings_names_a_setting(self) -> None:
        with_setting = [option for option in options.TASK_OPTIONS if option.setting]
        assert [(option.name, option.setting) for option in with_setting] == [
            ("lock_ttl", "redlock_default_ttl"),
            ("singleton_ttl", "redlock_singleton_ttl"),
            ("on_duplicate", "redlock_on_duplicate"),
        ]
        assert SETTINGS.value("redlock_default_ttl") == 60.0
        assert all(option.setting in config.SETTING_NAMES for option in with_setting)

    def test_rate_algorithms_are_the_rate_limiters(self) -> None:
        (option,) = [
            option for option in options.TASK_OPTIONS if option.name == "rate_limit_algorithm"
        ]
        assert isinstance(option.check, partial)
        assert option.check.keywords["choices"] == ("sliding", "gcra", "fixed")
        assert option.default == "sliding"

    def test_read_fills_every_option(self) -> None:
        values = options.read("t", {"lock_ttl": 5})
        assert set(values) == set(options.OPTION_NAMES)
        assert values["lock_ttl"] == 5.0
        assert values["on_lock_busy"] == "retry"
        assert values["singleton_ttl"] == 3600.0

    def test_unknown_names_are_refused_naming_the_entry(self) -> None:
        options.check_names("redlock_tasks['t']", {"singleton": True})
        with pytest.raises(
            ConfigurationError, match=r"not a celery_redlock option; did you mean lock_ttl\?"
        ) as caught:
            options.check_names("redlock_tasks['t']", {"lock_tll": 5, "singleton": True})
        assert caught.value.option == "redlock_tasks['t'].lock_tll"


class TestChecksAtDefinition:
    @pytest.mark.parametrize(
        ("given", "option", "problem"),
        [
            ({"lock_ttl": 0}, "lock_ttl", "must be > 0 seconds, got 0"),
            ({"lock_ttl": "60"}, "lock_ttl", "expected a number of seconds, got '60'"),
            ({"lock_timeout": -1}, "lock_timeout", "must be >= 0 seconds, got -1"),
            (
                {"on_lock_busy": "wait"},
                "on_lock_busy",
                "must be one of 'retry', 'skip', 'raise', got 'wait'",
            ),
            ({"lock_enabled": 1}, "lock_enabled", "must be True or False, got 1"),
            ({"singleton": "yes"}, "singleton", "must be True or False, got 'yes'"),
            ({"singleton_beat_window": 0}, "singleton_beat_window", "must be > 0 seconds, got 0"),
            (
                {"on_duplicate": "ignore"},
                "on_duplicate",
                "must be one of 'return', 'raise', got 'ignore'",
            ),
            ({"rate_limit_key": "k"}, "rate_limit_key", "needs global_rate_limit to be set"),
            (
                {"concurrency_key": "export:{user_id}"},
                "concurrency_key",
                "needs concurrency_limit to be set",
            ),
            (
                {"concurrency_limit": 0},
                "concurrency_limit",
                "expected a whole number of slots from 1 to 100000, got 0",
            ),
            (
                {"concurrency_limit": 2.0},
                "concurrency_limit",
                "expected a whole number of slots from 1 to 100000, got 2.0",
            ),
            (
                {"concurrency_limit": True},
                "concurrency_limit",
                "expected a whole number of slots from 1 to 100000, got True",
            ),
            (
                {"concurrency_limit": 100001},
                "concurrency_limit",
                "expected a whole number of slots from 1 to 100000, got 100001",
            ),
            (
                {"concurrency_limit": 3, "concurrency_key": "export:{tenant}"},
                "concurrency_key",
                "'export:{tenant}' names {tenant}, which is not an argument of the task "
                "(it takes: user_id, page)",
            ),
            (
                {"global_rate_limit": "5/s", "rate_limit_algorithm": "leaky"},
                "rate_limit_algorithm",
                "must be one of 'sliding', 'gcra', 'fixed', got 'leaky'",
            ),
            (
                {"lock_key": "sync:{nope}"},
                "lock_key",
                "'sync:{nope}' names {nope}, which is not an argument of the task "
                "(it takes: user_id, page)",
            ),
            (
                {"lock_key": "sync:{}"},
                "lock_key",
                "'sync:{}' must name arguments ({user_id}, {page}), not positions ({} or {0})",
            ),
            (
                {"singleton": True, "singleton_key": ""},
                "singleton_key",
                "must be a non-empty str.format template or a callable (args, kwargs) -> str, "
                "got ''",
            ),
        ],
    )
    def test_bad_values_name_task_option_and_problem(
        self, given: dict[str, Any], option: str, problem: str
    ) -> None:
        error = refused(**given)
        assert (error.option, error.problem) == (option, problem)

    def test_a_bad_rate_names_the_option(self) -> None:
        error = refused(global_rate_limit="5/x")
        assert error.option == "global_rate_limit"
        assert error.problem.startswith("'5/x' has an unknown unit")


class TestWhatATaskDoes:
    def test_a_plain_locked_task_takes_a_run_lock_named_after_it(self) -> None:
        plain = policy()
        assert plain.lock is not None
        assert plain.singleton is None
        assert plain.rate is None
        assert plain.lock_names((7,), {}) == ["proj.sync"]
        assert (plain.lock.timeout, plain.lock.on_busy) == (0.0, "retry")

    def test_a_singleton_or_a_rate_limit_alone_takes_no_run_lock(self) -> None:
        assert policy(singleton=True).lock is None
        assert policy(global_rate_limit="5/s").lock is None
        assert policy(singleton=True, lock_key="k:{user_id}").lock is not None
        assert policy(singleton=True, lock_enabled=True).lock is not None
        assert not policy(lock_enabled=False).active

    def test_a_singleton_of_unhashable_arguments_names_the_task(self) -> None:
        single = policy(singleton=True).singleton
        assert single is not None
        with pytest.raises(ConfigurationError) as caught:
            single.name("proj.sync", (object(),), {})
        assert (caught.value.option, caught.value.task) == ("singleton_key", "proj.sync")
        assert caught.value.problem.startswith("argument user_id = <object object")

    def test_lock_names_render_the_templates(self) -> None:
        both = policy(lock_key="sync:{user_id}:{page}", singleton=True, singleton_key="{user_id}")
        assert both.lock_names((7,), {"page": 2}) == ["sync:7:2", "singleton:proj.sync:7"]


class TestConcurrencyLimits:
    def test_a_limit_alone_takes_a_slot_per_key_and_no_run_lock(self) -> None:
        limited = policy(concurrency_limit=3, concurrency_key="export:{user_id}")
        assert limited.active
        assert limited.lock is None
        assert limited.concurrency is not None
        assert limited.concurrency.limit == 3
        assert limited.slot_names((7,), {}) == ["export:7"]
        assert limited.lock_names((7,), {}) == []

    def test_the_key_defaults_to_the_task_name(self) -> None:
        assert policy(concurrency_limit=1).slot_names((7,), {}) == ["proj.sync"]

    def test_the_wait_and_the_busy_action_are_the_run_locks(self) -> None:
        limited = policy(concurrency_limit=2, lock_timeout=5, on_lock_busy="skip")
        assert limited.concurrency is not None
        assert (limited.concurrency.timeout, limited.concurrency.on_busy) == (5.0, "skip")
        assert policy(concurrency_limit=2).concurrency.timeout == 0.0  # type: ignore[union-attr]

    def test_a_limit_beside_a_lock_key_keeps_the_run_lock(self) -> None:
        both = policy(concurrency_limit=2, lock_key="sync:{user_id}")
        assert both.lock_names((7,), {}) == ["sync:7"]
        assert both.slot_names((7,), {}) == ["proj.sync"]

    def test_no_limit_holds_no_slot(self) -> None:
        assert policy().concurrency is None
        assert policy().slot_names((7,), {}) == []

    def test_the_slot_ttl_must_outlive_twice_the_node_timeout(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            policy(concurrency_limit=2, lock_ttl=0.1).resolve(SETTINGS)
        assert caught.value.option == "lock_ttl"
        assert policy(concurrency_limit=2, lock_ttl=0.5).resolve(SETTINGS).ttl == 0.5

    @pytest.mark.parametrize("option", ["lock_ttl", "singleton_ttl"])
    def test_a_ttl_longer_than_a_lock_can_live_is_refused(self, option: str) -> None:
        """Accepted, the slot (or lock) would be refused with it in the worker, at every run."""
        given: dict[str, Any] = {"concurrency_limit": 3, option: 365 * 86400 + 1}
        if option == "singleton_ttl":
            given["singleton"] = True
        assert refused(**given).option == option
        ok = {key: (365 * 86400 if key == option else value) for key, value in given.items()}
        assert policy(**ok).concurrency is not None

    @pytest.mark.parametrize("name", ["concurency_limit", "concurrency_keys", "concurrency_lmt"])
    def test_a_misspelt_option_is_refused(self, name: str) -> None:
        problem = options.unknown_option(name, 3)
        assert problem is not None
        assert problem.startswith("not a celery_redlock option")


class TestResolution:
    def test_an_unset_lock_ttl_comes_from_the_settings(self) -> None:
        assert policy().ttl is None
        assert policy().resolve(SETTINGS).ttl == 60.0
        custom = Settings(nodes=SETTINGS.nodes, default_ttl=7.5)
        assert policy().resolve(custom).ttl == 7.5
        assert policy(lock_ttl=3).resolve(custom).ttl == 3.0

    def test_unset_singleton_options_come_from_the_settings(self) -> None:
        app_wide = Settings(nodes=SETTINGS.nodes, singleton_ttl=90, on_duplicate="raise")
        resolved = policy(singleton=True).resolve(app_wide).singleton
        assert resolved is not None
        assert (resolved.ttl, resolved.on_duplicate) == (90, "raise")
        own = policy(singleton=True, singleton_ttl=5, on_duplicate="return").resolve(app_wide)
        assert own.singleton is not None
        assert (own.singleton.ttl, own.singleton.on_duplicate) == (5.0, "return")
        unset = policy(singleton=True).resolve(SETTINGS).singleton
        assert unset is not None
        assert (unset.ttl, unset.on_duplicate) == (3600.0, "return")

    def test_an_app_wide_singleton_ttl_too_short_names_the_setting(self) -> None:
        short = Settings(nodes=SETTINGS.nodes, singleton_ttl=0.08)
        with pytest.raises(ConfigurationError) as caught:
            policy(singleton=True).resolve(short)
        assert caught.value.option == "redlock_singleton_ttl"
        assert policy(singleton=True, singleton_ttl=1).resolve(short).singleton is not None

    @pytest.mark.parametrize(
        ("given", "option"),
        [
            ({"lock_ttl": 0.1}, "lock_ttl"),
            ({"singleton": True, "singleton_ttl": 0.1}, "singleton_ttl"),
            ({"singleton": True, "singleton_beat_window": 0.1}, "singleton_beat_window"),
        ],
    )
    def test_every_lock_must_outlive_twice_the_node_timeout(
        self, given: dict[str, Any], option: str
    ) -> None:
        with pytest.raises(ConfigurationError) as caught:
            policy(**given).resolve(SETTINGS)
        assert (caught.value.option, caught.value.task) == (option, "proj.sync")
        assert caught.value.problem == (
            "0.1 s is too short for redlock_node_timeout (0.05 s); use more than 0.1 s"
        )
        policy(**given).resolve(Settings(nodes=SETTINGS.nodes, node_timeout=0.01))

    def test_a_default_ttl_too_short_names_the_setting(self) -> None:
        short = Settings(nodes=SETTINGS.nodes, default_ttl=0.08)
        with pytest.raises(ConfigurationError) as caught:
            policy().resolve(short)
        assert caught.value.option == "redlock_default_ttl"

    def test_a_rate_limit_alone_holds_no_lock_to_check(self) -> None:
        short = Settings(nodes=SETTINGS.nodes, default_ttl=0.08)
        assert policy(global_rate_limit="5/s").resolve(short).ttl == 0.08


class TestRateLimits:
    def test_one_rate_counts_on_the_task_name(self) -> None:
        rate = policy(global_rate_limit="5/s").rate
        assert rate is not None
        assert [limit.key for limit in rate.call_limits((7,), {})] == ["proj.sync"]
        assert rate.call_limits((7,), {})[0].rate == Rate(5, 1.0)
        assert rate.call_limits((7,), {})[0].algorithm == "sliding"
        assert rate.call_cost((7,), {}) == 1

    def test_several_rates_on_one_key_each_count_on_a_key_of_their_own(self) -> None:
        rate = policy(global_rate_limit=["10/s", "50000/d"], rate_limit_key="api:{user_id}").rate
        assert rate is not None
        assert [limit.key for limit in rate.call_limits((7,), {})] == ["api:7/s", "api:7/d"]
        assert rate.describe() == "10/s, 50000/d"

    @pytest.mark.parametrize(
        "given",
        [
            [("10/s", "api:{user_id}"), ("1000/h", "api")],
            [("10/s", "api:{user_id}", None), ("1000/h", "api", "fixed")],
            [{"rate": "10/s", "key": "api:{user_id}"}, {"rate": "1000/h", "key": "api"}],
        ],
    )
    def test_a_per_tenant_limit_beside_a_global_one(self, given: Any) -> None:
        rate = policy(global_rate_limit=given).rate
        assert rate is not None
        limits = rate.call_limits((7,), {})
        assert [(limit.key, limit.rate) for limit in limits] == [
            ("api:7", Rate(10, 1.0)),
            ("api", Rate(1000, 3600.0)),
        ]
        algorithm = "fixed" if len(given[1]) == 3 and given[1][2] else "sliding"
        assert limits[1].algorithm == algorithm

    def test_an_algorithm_applies_to_the_limits_that_name_none(self) -> None:
        rate = policy(
            global_rate_limit=[("10/s", "a", "sliding"), ("1/m", "b")], rate_limit_algorithm="gcra"
        ).rate
        assert rate is not None
        assert [limit.algorithm for limit in rate.call_limits((7,), {})] == ["sliding", "gcra"]

    def test_a_callable_rate_is_read_on_every_call_with_the_key(self) -> None:
        plans = {"api:1": "5/s", "api:2": "50/s"}
        rate = policy(global_rate_limit=plans.__getitem__, rate_limit_key="api:{user_id}").rate
        assert rate is not None
        (one,) = rate.call_limits((2,), {})
        assert isinstance(one.rate, DynamicRate)
        assert one.rate.resolve(one.key) == Rate(50, 1.0)

    def test_a_cost_as_a_number_or_a_function_of_the_call(self) -> None:
        fixed = policy(global_rate_limit="10/s", rate_limit_cost=3).rate
        by_page = policy(global_rate_limit="10/s", rate_limit_cost=lambda a, kw: a[1]).rate
        assert fixed is not None
        assert by_page is not None
        assert fixed.call_cost((7,), {}) == 3
        assert by_page.call_cost((7, 4), {}) == 4
        with pytest.raises(ConfigurationError) as caught:
            by_page.call_cost((7, 0), {})
        assert caught.value.option == "rate_limit_cost"
        assert caught.value.task == "proj.sync"
        assert caught.value.problem.endswith("returned 0; it must return a whole number >= 1")

    def test_a_budget_names_a_separate_count_of_the_same_limits(self) -> None:
        rate = policy(global_rate_limit="5/s").rate
        assert rate is not None
        (limit,) = rate.call_limits((7,), {}, budget="publish")
        assert (limit.key, limit.budget) == ("proj.sync", "publish")

    @pytest.mark.parametrize(
        ("given", "option", "problem"),
        [
            (
                {"global_rate_limit": ("10/s", "api")},
                "global_rate_limit[1]",
                "'api' is not a rate",
            ),
            (
                {"global_rate_limit": [("10/s", "api", "leaky")]},
                "global_rate_limit[0]",
                "expected one of 'sliding', 'gcra', 'fixed', got 'leaky'",
            ),
            (
                {"global_rate_limit": [("10/s", "")]},
                "global_rate_limit[0]",
                "a limit's key is a non-empty template or a callable",
            ),
            (
                {"global_rate_limit": [("10/s", "k", "gcra", "extra")]},
                "global_rate_limit[0]",
                "a limit is (rate, key) or (rate, key, algorithm)",
            ),
            (
                {"global_rate_limit": [{"rate": "10/s", "keys": "k"}]},
                "global_rate_limit[0]",
                "a limit is {'rate': ..., 'key': ..., 'algorithm': ...}",
            ),
            ({"global_rate_limit": []}, "global_rate_limit", "expected 1 to 16 limits, got 0"),
            (
                {"global_rate_limit": ["1/s"] * 17},
                "global_rate_limit",
                "expected 1 to 16 limits, got 17",
            ),
            (
                {"global_rate_limit": [("10/s", "api:{nope}"), "1/m"]},
                "global_rate_limit[0]",
                "'api:{nope}' names {nope}, which is not an argument",
            ),
            (
                {"global_rate_limit": ["10/s", "20/s"]},
                "global_rate_limit[1]",
                "two limits per 1 s on the same key",
            ),
            (
                {"global_rate_limit": ["10/s", len]},
                "global_rate_limit[1]",
                "a callable rate needs a key of its own",
            ),
            (
                {"global_rate_limit": "20000/s", "rate_limit_algorithm": "gcra"},
                "global_rate_limit",
                "20000/s spaces units 50 µs apart; gcra needs at least 100 µs per unit",
            ),
            (
                {"global_rate_limit": ["1/s", "1/0.0025s"], "rate_limit_algorithm": "fixed"},
                "global_rate_limit[1]",
                "a fixed window must be a whole number of milliseconds",
            ),
            (
                {"global_rate_limit": ["5/s", "50/m"], "rate_limit_cost": 6},
                "rate_limit_cost",
                "6 is more than the limit 5/s: such a run could never start",
            ),
            (
                {"global_rate_limit": "5/s", "rate_limit_cost": 0},
                "rate_limit_cost",
                "expected a whole number >= 1 or a callable (args, kwargs) -> int, got 0",
            ),
            ({"rate_limit_cost": 2}, "rate_limit_cost", "needs global_rate_limit to be set"),
        ],
    )
    def test_bad_limits_name_task_option_and_problem(
        self, given: dict[str, Any], option: str, problem: str
    ) -> None:
        error = refused(**given)
        assert error.option == option
        assert error.problem.startswith(problem), error.problem


class TestFlowControlOptions:
    def test_debounce_takes_a_run_lock_per_debounce_key(self) -> None:
        made = policy(debounce=5, debounce_key="doc:{user_id}")
        assert made.debounce is not None
        assert made.debounce.delay == 5.0
        assert made.debounce.ttl == 3600.0
        assert made.debounce.name("proj.sync", (7,), {}) == "debounce:proj.sync:doc:7"
        assert made.lock_names((7,), {}) == ["debounce:proj.sync:doc:7"]
        assert made.lock_names((8,), {}) == ["debounce:proj.sync:doc:8"]

    def test_debounce_without_a_key_is_one_key_per_task(self) -> None:
        made = policy(debounce=0.5)
        assert made.debounce is not None
        assert made.debounce.name("proj.sync", (1,), {}) == "debounce:proj.sync"
        assert made.debounce.name("proj.sync", (2,), {"page": 3}) == "debounce:proj.sync"

    def test_a_lock_key_of_its_own_replaces_the_debounce_lock(self) -> None:
        made = policy(debounce=1, debounce_key="doc:{user_id}", lock_key="user:{user_id}")
        assert made.lock_names((7,), {}) == ["user:7"]
        assert policy(debounce=1, lock_enabled=False).lock is None

    @pytest.mark.parametrize(
        ("given", "option"),
        [
            ({"debounce": 0}, "debounce"),
            ({"debounce": -1.0}, "debounce"),
            ({"debounce": "5"}, "debounce"),
            ({"debounce": True}, "debounce"),
            ({"debounce": float("inf")}, "debounce"),
            ({"debounce_key": "doc:{user_id}"}, "debounce_key"),
            ({"debounce_ttl": 10}, "debounce_ttl"),
            ({"debounce": 1, "debounce_ttl": 0}, "debounce_ttl"),
            ({"debounce": 365 * 86400 + 1}, "debounce"),
            ({"debounce": 365 * 86400 - 3599}, "debounce_ttl"),
            ({"debounce": 1, "debounce_ttl": 365 * 86400}, "debounce_ttl"),
            ({"debounce": 1, "debounce_key": "doc:{usr_id}"}, "debounce_key"),
            ({"debounce": 1, "debounce_key": ""}, "debounce_key"),
            ({"debounce": 1, "singleton": True}, "debounce"),
            ({"singleton": True, "singleton_mode": "twice"}, "singleton_mode"),
            ({"singleton": True, "singleton_mode": 2}, "singleton_mode"),
            ({"singleton_mode": "queued"}, "singleton_mode"),
        ],
    )
    def test_bad_flow_control_options_are_refused(self, given: Any, option: str) -> None:
        assert refused(**given).option == option

    def test_singleton_modes(self) -> None:
        one = policy(singleton=True)
        assert one.singleton is not None
        assert one.singleton.mode == "one"
        assert one.lock_names((1,), {}) == one.singleton.names("proj.sync", (1,), {})
        queued = policy(singleton=True, singleton_mode="queued", singleton_key="s:{user_id}")
        assert queued.singleton is not None
        assert queued.singleton.names("proj.sync", (1,), {}) == [
            "singleton:proj.sync:s:1",
            "singleton:proj.sync:s:1:queued",
        ]
        assert queued.lock_names((1,), {}) == queued.singleton.names("proj.sync", (1,), {})

    @pytest.mark.parametrize(
        ("name", "meant"),
        [
            ("debounce_keys", "debounce_key"),
            ("debounced", "debounce"),
            ("singleton_mod", "singleton_mode"),
        ],
    )
    def test_near_misses_name_the_option(self, name: str, meant: str) -> None:
        problem = options.unknown_option(name)
        assert problem is not None
        assert meant in problem

    def test_names_starting_like_a_debounce_option_are_kept_for_options(self) -> None:
        problem = options.unknown_option("debounce_window_seconds")
        assert problem is not None
        assert "'debounce'" in problem


class TestBusyRequeueBudget:
    def test_unset_means_no_limit(self) -> None:
        lock = policy(lock_key="sync:{user_id}").lock
        assert lock is not None
        assert lock.max_requeues is None

    def test_a_whole_number_is_the_limit(self) -> None:
        lock = policy(lock_key="sync:{user_id}", lock_busy_max_requeues=5).lock
        assert lock is not None
        assert lock.max_requeues == 5

    @pytest.mark.parametrize("value", [0, -1, True, 2.5, "3"])
    def test_anything_else_is_refused(self, value: Any) -> None:
        assert refused(lock_busy_max_requeues=value).option == "lock_busy_max_requeues"
