"""Signals into Prometheus metrics and structured log lines (no Redis, no worker)."""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from celery_redlock import signals
from celery_redlock.contrib import prometheus
from celery_redlock.contrib.eventlog import EVENT_FIELDS, install_logging


class FakeTask:
    name = "crm.sync"


class OtherTask:
    name = "reports.nightly"


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    fresh = CollectorRegistry()
    metrics = prometheus.install(fresh)
    yield fresh
    metrics.disconnect()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_acquired_observes_the_wait_per_task(registry):
    signals.lock_acquired.send(
        sender=FakeTask, task_id="t1", key="crm", waited=0.01, fencing_token=1
    )
    signals.lock_acquired.send(
        sender=FakeTask, task_id="t2", key="crm", waited=2.0, fencing_token=2
    )
    signals.lock_acquired.send(
        sender=OtherTask, task_id="t3", key="report", waited=0.0, fencing_token=1
    )

    name = "celery_redlock_lock_wait_seconds"
    assert sample(registry, f"{name}_count", task="crm.sync") == 2
    assert sample(registry, f"{name}_sum", task="crm.sync") == pytest.approx(2.01)
    assert sample(registry, f"{name}_bucket", task="crm.sync", le="0.01") == 1
    assert sample(registry, f"{name}_bucket", task="crm.sync", le="2.5") == 2
    assert sample(registry, f"{name}_count", task="reports.nightly") == 1


def test_released_observes_the_time_held(registry):
    signals.lock_released.send(sender=FakeTask, task_id="t1", key="crm", held=1.5)

    name = "celery_redlock_lock_held_seconds"
    assert sample(registry, f"{name}_count", task="crm.sync") == 1
    assert sample(registry, f"{name}_sum", task="crm.sync") == 1.5
    assert sample(registry, f"{name}_bucket", task="crm.sync", le="1.0") == 0
    assert sample(registry, f"{name}_bucket", task="crm.sync", le="2.5") == 1


def test_busy_rate_limited_and_duplicates_count_by_action(registry):
    for action in ("retry", "retry", "skip"):
        signals.lock_busy.send(sender=FakeTask, task_id="t", key="crm", waited=0.0, action=action)
    signals.rate_limited.send(
        sender=FakeTask, task_id="t", key="api:acme", retry_after=0.4, action="retry"
    )
    signals.rate_limited.send(
        sender=FakeTask, task_id="t", key="api:acme", retry_after=0.4, action="skip-publish"
    )
    for where in ("publish", "publish", "worker"):
        signals.duplicate_suppressed.send(sender=OtherTask, task_id="q", key="k", where=where)

    assert sample(registry, "celery_redlock_lock_busy_total", task="crm.sync", action="retry") == 2
    assert sample(registry, "celery_redlock_lock_busy_total", task="crm.sync", action="skip") == 1
    limited = "celery_redlock_rate_limited_total"
    assert sample(registry, limited, task="crm.sync", action="retry") == 1
    assert sample(registry, limited, task="crm.sync", action="skip-publish") == 1
    duplicates = "celery_redlock_duplicates_suppressed_total"
    assert sample(registry, duplicates, task="reports.nightly", where="publish") == 2
    assert sample(registry, duplicates, task="reports.nightly", where="worker") == 1


def test_slot_waits_holds_and_busy_runs_per_task(registry):
    signals.slot_acquired.send(
        sender=FakeTask, task_id="t1", key="export:acme", limit=3, slot=0, waited=0.002
    )
    signals.slot_acquired.send(
        sender=FakeTask, task_id="t2", key="export:acme", limit=3, slot=1, waited=4.0
    )
    signals.slot_released.send(sender=FakeTask, task_id="t1", key="export:acme", held=0.3)
    for action in ("retry", "retry", "skip"):
        signals.slot_busy.send(
            sender=FakeTask, task_id="t3", key="export:acme", limit=3, waited=5.0, action=action
        )

    wait = "celery_redlock_slot_wait_seconds"
    assert sample(registry, f"{wait}_count", task="crm.sync") == 2
    assert sample(registry, f"{wait}_bucket", task="crm.sync", le="0.0025") == 1
    assert sample(registry, f"{wait}_sum", task="crm.sync") == pytest.approx(4.002)
    assert sample(registry, "celery_redlock_slot_held_seconds_sum", task="crm.sync") == 0.3
    busy = "celery_redlock_slot_busy_total"
    assert sample(registry, busy, task="crm.sync", action="retry") == 2
    assert sample(registry, busy, task="crm.sync", action="skip") == 1
    # Slots are not locks: the lock metrics did not move.
    assert sample(registry, "celery_redlock_lock_wait_seconds_count", task="crm.sync") is None


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        pytest.param("no progress for progress_timeout; lock expired", "stalled", id="stalled"),
        pytest.param(
            "renewal failed: a majority of nodes no longer hold it", "renewal_failed", id="renewal"
        ),
        pytest.param("expired", "expired", id="expired"),
        pytest.param("something new", "other", id="other"),
    ],
)
def test_lost_locks_count_by_a_bounded_reason(registry, reason, label):
    signals.lock_lost.send(sender=FakeTask, task_id="t", key="crm", held=3.0, reason=reason)

    assert sample(registry, "celery_redlock_locks_lost_total", task="crm.sync", reason=label) == 1


def test_lock_keys_never_become_label_values(registry):
    for n in range(50):
        signals.lock_acquired.send(
            sender=FakeTask, task_id=f"t{n}", key=f"user:{n}", waited=0.001, fencing_token=n
        )
        signals.lock_busy.send(sender=FakeTask, task_id=f"t{n}", key=f"user:{n}", action="retry")

    label_sets = {
        tuple(sorted(s.labels.items()))
        for metric in registry.collect()
        for s in metric.samples
        if s.name.startswith("celery_redlock_")
    }
    values = {value for labels in label_sets for _, value in labels}
    assert not any(value.startswith("user:") for value in values)
    assert sample(registry, "celery_redlock_lock_wait_seconds_count", task="crm.sync") == 50


def test_a_sender_without_a_name_is_unknown(registry):
    signals.lock_busy.send(sender=None, task_id="t", key="k", waited=0.0, action="raise")

    assert sample(registry, "celery_redlock_lock_busy_total", task="unknown", action="raise") == 1


def test_install_twice_reuses_the_metrics_and_disconnect_stops_counting():
    registry = CollectorRegistry()
    first = prometheus.install(registry)
    assert prometheus.install(registry) is first  # no "Duplicated timeseries" error

    signals.lock_lost.send(sender=FakeTask, task_id="t", key="crm", held=1.0, reason="expired")
    first.disconnect()
    signals.lock_lost.send(sender=FakeTask, task_id="t", key="crm", held=1.0, reason="expired")

    lost = sample(registry, "celery_redlock_locks_lost_total", task="crm.sync", reason="expired")
    assert lost == 1


def test_event_log_lines_carry_structured_fields(caplog):
    events = install_logging()
    try:
        with caplog.at_level(logging.DEBUG, logger="celery_redlock.events"):
            signals.lock_acquired.send(
                sender=FakeTask, task_id="t1", key="crm", waited=0.25, fencing_token=7
            )
            signals.lock_lost.send(
                sender=FakeTask, task_id="t1", key="crm", held=3.0, reason="expired"
            )
            signals.rate_limited.send(
                sender=FakeTask, task_id="t2", key="api:acme", retry_after=0.5, action="retry"
            )
    finally:
        events.disconnect()

    records = [r for r in caplog.records if r.name == "celery_redlock.events"]
    assert [r.event for r in records] == ["lock_acquired", "lock_lost", "rate_limited"]
    acquired, lost, limited = records
    assert acquired.levelno == logging.DEBUG
    assert (acquired.task_name, acquired.task_id, acquired.key) == ("crm.sync", "t1", "crm")
    assert (acquired.waited, acquired.fencing_token) == (0.25, 7)
    assert acquired.getMessage() == (
        "lock_acquired task_name=crm.sync task_id=t1 key=crm waited=0.250 fencing_token=7"
    )
    assert lost.levelno == logging.WARNING
    assert (lost.held, lost.reason) == (3.0, "expired")
    assert limited.levelno == logging.INFO
    assert (limited.retry_after, limited.action) == (0.5, "retry")
    assert set(EVENT_FIELDS) == set(signals.__all__)


def test_install_with_log_events_logs_until_disconnected(caplog):
    metrics = prometheus.install(CollectorRegistry(), log_events=True)
    with caplog.at_level(logging.INFO, logger="celery_redlock.events"):
        signals.duplicate_suppressed.send(sender=OtherTask, task_id="q", key="k", where="beat")
        metrics.disconnect()
        signals.duplicate_suppressed.send(sender=OtherTask, task_id="q", key="k", where="beat")

    records = [r for r in caplog.records if r.name == "celery_redlock.events"]
    assert len(records) == 1
    assert records[0].where == "beat"
    assert "duplicate_suppressed task_name=reports.nightly" in records[0].getMessage()


def test_debounced_publishes_and_superseded_copies_are_counted(registry):
    for n in range(3):
        signals.debounce_published.send(
            sender=FakeTask, task_id=f"t{n}", key="debounce:crm.sync", delay=5.0, recorded=True
        )
    signals.debounce_published.send(
        sender=FakeTask, task_id="t3", key="debounce:crm.sync", delay=5.0, recorded=False
    )
    signals.debounce_superseded.send(
        sender=FakeTask, task_id="t0", key="debounce:crm.sync", latest="t3"
    )

    published = "celery_redlock_debounce_published_total"
    assert sample(registry, published, task="crm.sync", recorded="true") == 3
    assert sample(registry, published, task="crm.sync", recorded="false") == 1
    assert sample(registry, "celery_redlock_debounce_superseded_total", task="crm.sync") == 1


ROOT = Path(__file__).resolve().parents[3]


def codes_in_the_code() -> set[str]:
    """The ``code`` of every ``lock_lost`` the package sends, read from its source."""
    found: set[str] = set()
    for path in (ROOT / "celery_redlock").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "_mark_lost"
            ):
                code = node.args[2]
                assert isinstance(code, ast.Constant), ast.dump(code)
                found.add(code.value)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
                for target in node.targets:
                    names = target.elts if isinstance(target, ast.Tuple) else [target]
                    for name, value in zip(names, node.value.elts, strict=False):
                        if isinstance(name, ast.Attribute) and name.attr == "lost_code":
                            assert isinstance(value, ast.Constant), ast.dump(value)
                            found.add(value.value)
            elif (
                isinstance(node, ast.Assign)
                and any(
                    isinstance(t, ast.Attribute) and t.attr == "lost_code" for t in node.targets
                )
                # Elsewhere a code is passed on (``held.lost_code = code``).
                and isinstance(node.value, ast.Constant)
                and node.value.value
            ):
                found.add(node.value.value)
    return found


def test_the_lost_lock_reasons_are_one_list_in_code_and_docs():
    assert codes_in_the_code() == set(signals.LOCK_LOST_CODES)
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"locks_lost_total` \(by `reason`: ([^)]*)\)", readme)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(signals.LOCK_LOST_CODES)
    operations = (ROOT / "docs" / "operations.md").read_text()
    row = next(
        line
        for line in operations.splitlines()
        if line.startswith("| `celery_redlock_locks_lost_total{reason}`")
    )
    assert re.findall(r"`(\w+)`:", row) == list(signals.LOCK_LOST_CODES)
    docstring = prometheus.__doc__ or ""
    entry = docstring[docstring.index("locks_lost_total") : docstring.index("locks lost while")]
    assert re.findall(r"``(\w+)``", entry)[2:] == list(signals.LOCK_LOST_CODES)
