"""The redlock_* settings, read once per app, and task policies resolved once per app."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.errors import ConfigurationError
from celery_redlock.tasks import app_state
from celery_redlock.tasks.settings import SETTING_NAMES, Settings, unknown_settings

NODE = "redis://127.0.0.1:1/0"


def read(**conf: Any) -> Settings:
    return Settings.from_conf(conf)


class TestSettings:
    def test_defaults(self) -> None:
        settings = read(redlock_nodes=[NODE])
        assert settings == Settings(nodes=(NODE,))
        assert (settings.key_prefix, settings.default_ttl, settings.node_timeout) == (
            "redlock:",
            60.0,
            0.05,
        )
        assert settings.tasks == {}
        assert settings.rate_limit_url is None
        assert settings.rate_limit_fallback is None
        assert settings.rate_limit_on_unavailable == "retry"
        assert settings.rate_limit_margin == 0.05
        assert settings.enabled is True

    def test_nodes_follow_a_redis_broker_else_localhost(self) -> None:
        assert read(broker_url="redis://broker:6379/3").nodes == ("redis://broker:6379/3",)
        assert read(broker_url="rediss://a/0;redis://b/0").nodes == ("rediss://a/0",)
        assert read(broker_url="amqp://guest@rabbit//").nodes == ("redis://localhost:6379/0",)
        assert read(redlock_nodes=NODE).nodes == (NODE,)

    def test_nodes_follow_a_sentinel_broker_as_one_node(self) -> None:
        sentinels = "sentinel://s1:26379;sentinel://s2:26379/0"
        assert read(
            broker_url=sentinels, broker_transport_options={"master_name": "broker"}
        ).nodes == (f"{sentinels}?master_name=broker",)
        # Without a master name the broker cannot be used: the usual default applies.
        assert read(broker_url=sentinels).nodes == ("redis://localhost:6379/0",)

    @pytest.mark.parametrize(
        ("setting", "value", "problem"),
        [
            ("redlock_nodes", [], "expected a list of Redis URLs, got []"),
            ("redlock_key_prefix", 3, "expected a string, got 3"),
            ("redlock_default_ttl", 0, "must be > 0 seconds, got 0"),
            ("redlock_default_ttl", "60", "expected a number of seconds, got '60'"),
            ("redlock_node_timeout", -1, "must be > 0 seconds, got -1"),
            ("redlock_tasks", ["x"], "expected {task name: {option: value}}, got ['x']"),
            ("redlock_rate_limit_url", 5, "expected a Redis URL, got 5"),
            ("redlock_rate_limit_fallback", 5, "expected a Redis URL, got 5"),
            (
                "redlock_rate_limit_on_unavailable",
                "raise",
                "must be one of 'retry', 'allow', got 'raise'",
            ),
            ("redlock_rate_limit_margin", -0.01, "must be >= 0 seconds, got -0.01"),
            ("redlock_rate_limit_margin", 61, "must be at most 60 seconds, got 61"),
            ("redlock_enabled", "false", "must be True or False, got 'false'"),
            ("redlock_singleton_ttl", 0, "must be > 0 seconds, got 0"),
            ("redlock_on_duplicate", "skip", "must be one of 'return', 'raise', got 'skip'"),
        ],
    )
    def test_bad_values_name_the_setting(self, setting: str, value: Any, problem: str) -> None:
        with pytest.raises(ConfigurationError) as caught:
            read(**{setting: value})
        assert str(caught.value) == f"{setting}: {problem}"
        assert caught.value.option == setting

    def test_the_rate_limiter_settings_are_known(self) -> None:
        conf = {
            "redlock_nodes": [NODE],
            "redlock_rate_limit_fallback": NODE,
            "redlock_rate_limit_on_unavailable": "allow",
            "redlock_rate_limit_margin": 0.1,
        }
        assert unknown_settings(conf) == []
        assert unknown_settings({"redlock_rate_limit_margn": 0.1}) == [
            "redlock_rate_limit_margn is not a celery_redlock setting and is ignored; "
            "did you mean redlock_rate_limit_margin?"
        ]

    def test_the_task_option_defaults_are_known(self) -> None:
        conf = {"redlock_singleton_ttl": 600, "redlock_on_duplicate": "raise"}
        assert unknown_settings(conf) == []
        settings = read(**conf)
        assert (settings.singleton_ttl, settings.on_duplicate) == (600.0, "raise")
        assert unknown_settings({"redlock_on_duplicates": "raise"}) == [
            "redlock_on_duplicates is not a celery_redlock setting and is ignored; "
            "did you mean redlock_on_duplicate?"
        ]

    def test_setting_names_are_the_fields(self) -> None:
        assert tuple(f"redlock_{field.name}" for field in fields(Settings)) == SETTING_NAMES
        settings = read(redlock_nodes=[NODE])
        for name in SETTING_NAMES:
            assert settings.value(name) == getattr(settings, name.removeprefix("redlock_"))

    def test_a_bad_node_url_names_the_setting(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            read(redlock_nodes=["http://x"]).make_redlock()
        assert caught.value.option == "redlock_nodes"
        assert str(caught.value).startswith("redlock_nodes: 'http://x' is not a Redis URL")

    def test_the_limiter_follows_the_rate_limit_settings(self) -> None:
        default = read(redlock_nodes=[NODE]).make_limiter()
        assert (default.margin, default.on_unavailable, len(default.status())) == (
            0.05,
            "raise",
            1,
        )
        chosen = read(
            redlock_nodes=[NODE],
            redlock_rate_limit_margin=0,
            redlock_rate_limit_on_unavailable="allow",
            redlock_rate_limit_fallback="redis://127.0.0.1:2/0",
        ).make_limiter()
        assert (chosen.margin, chosen.on_unavailable) == (0.0, "allow")
        assert [status.role for status in chosen.status()] == ["primary", "fallback"]
        for limiter in (default, chosen):
            limiter.close()

    def test_a_bad_fallback_url_names_the_setting(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            read(redlock_nodes=[NODE], redlock_rate_limit_fallback=NODE).make_limiter()
        assert caught.value.option == "redlock_rate_limit_fallback"


def make_app(**conf: Any) -> Celery:
    app = Celery("settings", set_as_current=False)
    app.conf.update(redlock_nodes=[NODE], **conf)

    @app.task(base=LockedTask, shared=False, name="t.sync", lock_key="sync:{user_id}")
    def sync(user_id: int) -> None: ...

    return app


def test_a_tasks_policy_is_resolved_once_per_app_and_again_after_forget() -> None:
    app = make_app(redlock_default_ttl=5)
    task = app.tasks["t.sync"]
    try:
        first = app_state.policy_for(task)
        assert first is not None
        assert first.ttl == 5.0
        assert app_state.policy_for(task) is first
        app.conf.redlock_default_ttl = 9
        assert app_state.policy_for(task) is first  # settings are read once per app...
        app_state.forget(app)
        again = app_state.policy_for(task)  # ...until forgotten
        assert again is not None
        assert again.ttl == 9.0
    finally:
        app_state.forget(app)


def test_a_plain_task_has_no_policy() -> None:
    app = make_app()

    @app.task(shared=False, name="t.plain")
    def plain() -> None: ...

    assert app_state.policy_for(app.tasks["t.plain"]) is None
