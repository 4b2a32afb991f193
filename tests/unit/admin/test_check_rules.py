"""``celery redlock check``'s rules, on measured data made up for each case."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.admin import CheckReport, Finding, NodeHealth
from celery_redlock.admin.check import (
    clock_spread,
    conf_findings,
    node_findings,
    settings_findings,
    task_findings,
)
from celery_redlock.admin.node_health import persistence
from celery_redlock.tasks.settings import Settings

SETTINGS = Settings(nodes=("redis://127.0.0.1:1/0",))


def healthy(name: str, **changes: Any) -> NodeHealth:
    values: dict[str, Any] = {
        "node": name,
        "ok": True,
        "ping_ms": 0.2,
        "version": "7.0.15",
        "role": "master",
        "run_id": f"run-{name}",
        "clock_offset_ms": 0.0,
        "maxmemory": 0,
        "maxmemory_policy": "noeviction",
        "appendonly": True,
        "save": "",
    }
    values.update(changes)
    return NodeHealth(**values)


def down(name: str) -> NodeHealth:
    return NodeHealth(node=name, ok=False, error="Connection refused")


def messages(found: list[Finding], level: str) -> list[str]:
    return [finding.message for finding in found if finding.level == level]


class TestSettingsRules:
    def test_a_sound_ttl_finds_nothing(self) -> None:
        assert settings_findings(SETTINGS) == []

    def test_a_ttl_under_twice_the_node_timeout_is_an_error(self) -> None:
        (finding,) = settings_findings(Settings(nodes=SETTINGS.nodes, default_ttl=0.08))
        assert finding == Finding(
            "error",
            "redlock_default_ttl: 0.08 s is too short for redlock_node_timeout (0.05 s); "
            "use more than 0.1 s; no lock could be taken",
        )

    def test_a_node_timeout_over_a_tenth_of_the_ttl_is_a_warning(self) -> None:
        (finding,) = settings_findings(Settings(nodes=SETTINGS.nodes, default_ttl=0.4))
        assert finding.level == "warning"
        assert "more than a tenth of redlock_default_ttl (0.4 s)" in finding.message


class TestNodeRules:
    def test_three_healthy_independent_nodes_find_nothing(self) -> None:
        assert node_findings(SETTINGS, [healthy("a"), healthy("b"), healthy("c")]) == []

    def test_one_node_and_an_even_count_are_notes(self) -> None:
        assert messages(node_findings(SETTINGS, [healthy("a")]), "note") == [
            "one lock node: a plain single-instance lock, no fault tolerance"
        ]
        four = [healthy(name) for name in "abcd"]
        assert messages(node_findings(SETTINGS, four), "note") == [
            "4 lock nodes tolerate no more failures than 3; an odd number is recommended"
        ]

    def test_the_same_server_twice_is_a_warning(self) -> None:
        nodes = [healthy("a", run_id="same"), healthy("b", run_id="same"), healthy("c")]
        (warning,) = messages(node_findings(SETTINGS, nodes), "warning")
        assert warning.startswith("a and b are the same Redis server")

    def test_replica_slow_and_evicting_nodes_are_warnings(self) -> None:
        nodes = [
            healthy("a", role="slave"),
            healthy("b", ping_ms=80.0),
            healthy("c", maxmemory_policy="volatile-lru"),
        ]
        warnings = messages(node_findings(SETTINGS, nodes), "warning")
        assert warnings == [
            "a is a slave: it refuses writes; use independent masters",
            "b answered PING in 80.0 ms, more than redlock_node_timeout (50 ms): lock "
            "operations will count it as down",
            "c has maxmemory-policy volatile-lru: it can evict lock keys once a maxmemory "
            "limit is set (they carry a ttl); use noeviction",
        ]

    def test_no_persistence_anywhere_is_a_note(self) -> None:
        nodes = [healthy(name, appendonly=False, save="") for name in "abc"]
        assert messages(node_findings(SETTINGS, nodes), "note") == [
            "no node persists its data: a restarted node comes back empty; keep it out for "
            "the longest lock ttl before it rejoins"
        ]

    def test_clocks_apart_are_a_warning_and_down_nodes_do_not_count(self) -> None:
        nodes = [healthy("a", clock_offset_ms=-400.0), healthy("b", clock_offset_ms=350.0)]
        assert clock_spread(nodes) == 750.0
        assert messages(node_findings(SETTINGS, [*nodes, healthy("c")]), "warning") == [
            "the nodes' clocks are 750 ms apart: check time synchronisation; a clock that "
            "jumps expires keys early"
        ]
        assert clock_spread([healthy("a"), down("b")]) == 0.0

    @pytest.mark.parametrize(
        ("appendonly", "save", "shown"),
        [
            (True, "", "aof"),
            (False, "3600 1", "rdb"),
            (True, "60 1", "aof+rdb"),
            (False, "", "off"),
        ],
    )
    def test_persistence(self, appendonly: bool, save: str, shown: str) -> None:
        assert persistence(healthy("a", appendonly=appendonly, save=save)) == shown
        assert persistence(healthy("a", appendonly=False, save=None)) == "aof off"


class TestTaskRules:
    def app(self, **conf: Any) -> Celery:
        app = Celery("check", set_as_current=False)
        app.conf.update(redlock_nodes=["redis://127.0.0.1:1/0"], **conf)

        @app.task(base=LockedTask, shared=False, name="t.quick", lock_ttl=0.08)
        def quick() -> None: ...

        @app.task(shared=False, name="t.plain")
        def plain(n: int) -> None: ...

        return app

    def test_a_task_lock_ttl_too_short_is_an_error(self) -> None:
        found = task_findings(self.app(), SETTINGS)
        assert messages(found, "error") == [
            "task 't.quick': lock_ttl: 0.08 s is too short for redlock_node_timeout (0.05 s); "
            "use more than 0.1 s"
        ]

    def test_redlock_tasks_entries_are_checked_like_the_worker_does(self) -> None:
        tasks = {
            "t.plain": {"lock_key": "p:{nope}"},
            "t.missing": {"singleton": True},
            "t.quick": {"lock_tll": 5},
        }
        settings = Settings(nodes=SETTINGS.nodes, tasks=tasks)
        found = task_findings(self.app(), settings)
        assert messages(found, "error") == [
            "redlock_tasks['t.plain'].lock_key: 'p:{nope}' names {nope}, which is not an "
            "argument of the task (it takes: n)",
            "redlock_tasks['t.quick'].lock_tll: not a celery_redlock option; did you mean "
            "lock_ttl?",
        ]
        # A name no module registered may be registered later: a warning, as at worker start.
        assert messages(found, "warning") == [
            "redlock_tasks['t.missing']: this app has no such task; check the name, and that "
            "the module defining it is imported (include= or imports=); the entry applies "
            "once it is"
        ]

    def test_an_unknown_task_name_suggests_the_closest_registered_one(self) -> None:
        settings = Settings(nodes=SETTINGS.nodes, tasks={"t.plian": {"singleton": True}})
        (warning,) = messages(task_findings(self.app(), settings), "warning")
        assert warning.startswith(
            "redlock_tasks['t.plian']: this app has no such task; did you mean 't.plain'? "
        )


class TestConfRules:
    def test_unknown_redlock_settings_are_errors_naming_the_setting_meant(self) -> None:
        conf = {"redlock_nodes": ["redis://r:1/0"], "redlock_node": ["x"], "debug": True}
        assert messages(conf_findings(conf), "error") == [
            "redlock_node is not a celery_redlock setting and is ignored; did you mean "
            "redlock_nodes?"
        ]

    def test_the_fallback_to_localhost_is_a_warning(self) -> None:
        (warning,) = messages(conf_findings({"broker_url": "amqp://guest@rabbit//"}), "warning")
        assert warning.startswith(
            "redlock_nodes is not set and the broker is not Redis: locks go to "
            "redis://localhost:6379/0"
        )
        assert conf_findings({"broker_url": "redis://broker:6379/0"}) == []
        assert conf_findings({"redlock_nodes": ["redis://r:1/0"]}) == []


def test_the_report_judges_quorum_and_errors() -> None:
    report = CheckReport(
        settings=SETTINGS,
        quorum=2,
        nodes=[healthy("a"), down("b"), down("c")],
        clock_spread_ms=0.0,
        rate_limit={"node": "a", "ok": True, "ping_ms": 0.1},
        findings=[Finding("note", "n"), Finding("warning", "w")],
    )
    assert (report.reachable, report.quorum_ok, report.ok) == (1, False, False)
    data = report.as_dict()
    assert data["quorum"] == {"reachable": 1, "needed": 2, "total": 3, "ok": False}
    assert (data["errors"], data["warnings"], data["notes"]) == ([], ["w"], ["n"])
    report.nodes[1] = healthy("b")
    assert report.ok
    report.findings.append(Finding("error", "e"))
    assert not report.ok
