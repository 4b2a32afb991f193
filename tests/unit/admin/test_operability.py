"""What operators read: unknown settings, start-up notices, re-queue summaries.

No Redis: the pure rules behind the worker's start-up report, ``celery redlock
check``'s settings findings and the re-queue warning.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_redlock.admin.startup_notice import notices
from celery_redlock.errors import QuorumUnavailable, RateLimiterUnavailable
from celery_redlock.tasks import app_state
from celery_redlock.tasks.settings import SETTING_NAMES, Settings, node_fallback, unknown_settings
from celery_redlock.transport.commands import NodeFailure
from celery_redlock.transport.failure_text import detail, reason, short_error, summary

NODE = "redis://127.0.0.1:1/0"


def namespaced(**settings: Any) -> Celery:
    """An app configured the way Django projects do: ``config_from_object(..., namespace=)``."""
    app = Celery("proj", set_as_current=False)
    app.config_from_object(type("Settings", (), settings), namespace="CELERY")
    return app


class TestUnknownSettings:
    @pytest.mark.parametrize(
        ("given", "meant"),
        [
            ("redlock_node", "redlock_nodes"),
            ("redlock_default_tll", "redlock_default_ttl"),
            ("redlok_nodes", "redlock_nodes"),
            ("redlock_key_prefx", "redlock_key_prefix"),
            ("redlock_task", "redlock_tasks"),
            ("redlock_rate_limit_uri", "redlock_rate_limit_url"),
            ("redlock_enable", "redlock_enabled"),
        ],
    )
    def test_a_misspelt_setting_names_the_setting_meant(self, given: str, meant: str) -> None:
        assert unknown_settings({"redlock_nodes": [NODE], given: 1}) == [
            f"{given} is not a celery_redlock setting and is ignored; did you mean {meant}?"
        ]

    def test_every_setting_and_other_settings_pass(self) -> None:
        conf = dict.fromkeys(SETTING_NAMES, 1)
        conf.update(broker_url="redis://b/0", task_acks_late=True, redis_backend_use_ssl=None)
        assert unknown_settings(conf) == []

    def test_an_unknown_redlock_name_with_nothing_near_is_still_reported(self) -> None:
        assert unknown_settings({"redlock_whatever": 1}) == [
            "redlock_whatever is not a celery_redlock setting and is ignored"
        ]

    def test_a_celery_app_reports_what_it_was_given(self) -> None:
        app = Celery("x", set_as_current=False)
        app.conf.update(redlock_nodes=[NODE], redlock_default_tll=5, REDLOCK_KEY_PREFIX="x:")
        assert unknown_settings(app.conf) == [
            "REDLOCK_KEY_PREFIX is not read: with no namespace, Celery reads this setting as "
            "redlock_key_prefix",
            "redlock_default_tll is not a celery_redlock setting and is ignored; did you mean "
            "redlock_default_ttl?",
        ]

    def test_django_style_settings_are_read_through_the_namespace(self) -> None:
        app = namespaced(
            CELERY_BROKER_URL="amqp://guest@rabbit//",
            CELERY_REDLOCK_NODES=[NODE],
            CELERY_REDLOCK_KEY_PREFIX="dj:",
            CELERY_REDLOCK_DEFAULT_TTL=30,
            CELERY_REDLOCK_TASKS={"proj.nightly": {"singleton": True}},
        )
        settings = Settings.from_conf(app.conf)
        assert (settings.nodes, settings.key_prefix, settings.default_ttl) == ((NODE,), "dj:", 30)
        assert settings.tasks == {"proj.nightly": {"singleton": True}}
        assert unknown_settings(app.conf) == []
        assert node_fallback(app.conf) is None

    def test_django_style_typos_are_told_in_the_apps_own_spelling(self) -> None:
        app = namespaced(
            CELERY_REDLOCK_NODES=[NODE],
            CELERY_REDLOCK_NODE_TIMOUT=0.1,
            CELERY_REDLOK_TASKS={},
            REDLOCK_DEFAULT_TTL=5,
            celery_redlock_key_prefix="x:",
            DEBUG=True,
            DATABASES={},
        )
        assert unknown_settings(app.conf) == [
            "CELERY_REDLOCK_NODE_TIMOUT is not a celery_redlock setting and is ignored; did "
            "you mean CELERY_REDLOCK_NODE_TIMEOUT?",
            "CELERY_REDLOK_TASKS is not a celery_redlock setting and is ignored; did you mean "
            "CELERY_REDLOCK_TASKS?",
            "REDLOCK_DEFAULT_TTL is not read: with namespace 'CELERY', Celery reads this "
            "setting as CELERY_REDLOCK_DEFAULT_TTL or redlock_default_ttl",
            "celery_redlock_key_prefix is not read: with namespace 'CELERY', Celery reads this "
            "setting as CELERY_REDLOCK_KEY_PREFIX or redlock_key_prefix",
        ]
        assert Settings.from_conf(app.conf).default_ttl == 60.0  # not read, as reported

    def test_a_namespaced_name_without_the_namespace_is_not_read(self) -> None:
        app = Celery("x", set_as_current=False)
        app.conf.update(CELERY_REDLOCK_NODES=[NODE])
        assert unknown_settings(app.conf) == [
            "CELERY_REDLOCK_NODES is not read: with no namespace, Celery reads this setting as "
            "redlock_nodes"
        ]


class TestStartupNotices:
    def test_the_fallback_to_localhost_is_told(self) -> None:
        app = Celery("x", broker="amqp://guest@rabbit//", set_as_current=False)
        app.conf.redlock_default_tll = 5
        assert node_fallback(app.conf) == "redis://localhost:6379/0"
        assert notices(app) == [
            "redlock_default_tll is not a celery_redlock setting and is ignored; did you mean "
            "redlock_default_ttl?",
            "redlock_nodes is not set and the broker is not Redis: locks go to "
            "redis://localhost:6379/0; set redlock_nodes to your lock nodes",
        ]
        app.close()

    def test_no_fallback_with_a_redis_broker_or_nodes(self) -> None:
        assert node_fallback({"broker_url": "redis://broker:6379/0"}) is None
        assert node_fallback({"broker_url": "amqp://", "redlock_nodes": [NODE]}) is None

    def test_configured_names_no_module_registered_are_told(self) -> None:
        app = Celery("x", broker="redis://b/0", set_as_current=False)

        @app.task(shared=False, name="proj.nightly")
        def nightly() -> None: ...

        (notice,) = notices(app, ["proj.nigthly"])
        assert notice.startswith(
            "redlock_tasks['proj.nigthly']: this app has no such task; did you mean "
            "'proj.nightly'? "
        )
        app_state.forget(app)
        app.close()


class TestRequeueSummary:
    def quorum(self) -> QuorumUnavailable:
        failures: dict[str, BaseException] = {
            "redis://r2:6379/0": NodeFailure(
                "redis://r2:6379/0", OSError("cannot connect to r2:6379: Connection refused")
            ),
            "redis://r3:6379/0": NodeFailure(
                "redis://r3:6379/0",
                OSError("Error 111 connecting to r3:6379. Connection refused."),
            ),
        }
        return QuorumUnavailable(
            "lock 'k': only 1 of 3 Redis nodes answered, 2 needed; check the nodes (...)",
            key="k",
            answered=1,
            needed=2,
            failures=failures,
        )

    def test_a_quorum_summary_is_one_short_line(self) -> None:
        assert summary(self.quorum()) == (
            "1 of 3 lock nodes answered, 2 needed (redis://r2:6379/0: connection refused; "
            "redis://r3:6379/0: connection refused)"
        )

    def test_the_short_error_keeps_the_attributes_and_the_original(self) -> None:
        original = self.quorum()
        short = short_error(original, "lock 'k' not taken")
        assert isinstance(short, QuorumUnavailable)
        assert str(short) == f"lock 'k' not taken, Redis unavailable: {summary(original)}"
        assert (short.key, short.answered, short.needed) == ("k", 1, 2)
        assert short.failures == original.failures
        assert short.__cause__ is original
        assert "\n" not in str(short)

    def test_the_rate_limiter_summary_names_its_node(self) -> None:
        error = RateLimiterUnavailable("long message", key="api", node="redis://r1:6379/0")
        error.__cause__ = NodeFailure(
            "redis://r1:6379/0", OSError("no reply within the node timeout")
        )
        assert summary(error) == (
            "rate-limit Redis redis://r1:6379/0 did not answer (no reply within the node timeout)"
        )
        assert isinstance(short_error(error, "rate limit 'api' not checked"), type(error))

    def test_a_node_failure_keeps_its_cause(self) -> None:
        cause = OSError("Connection refused")
        failure = NodeFailure("n", cause)
        assert failure.cause is cause
        assert failure.__cause__ is cause
        assert (str(failure), detail(failure)) == ("n: Connection refused", "Connection refused")

    def test_a_long_reason_is_cut(self) -> None:
        text = reason(NodeFailure("n", OSError("x" * 500)))
        assert len(text) == 60
        assert text.endswith("…")
