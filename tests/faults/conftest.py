"""Fault runs: their figures are printed at the end of the test run.

Environment:

* ``FAULTS_SOAK=<seconds>`` -- also run the soak tests, each that long
  (see test_lock_faults.py);
* ``FAULTS_REPORT=<path>`` -- write every run's figures to this JSON file.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from .checker import Report

_REPORTS: list[Report] = []


@pytest.fixture
def publish() -> Callable[[Report], None]:
    """Keep a run's report for the summary at the end of the run (and FAULTS_REPORT)."""

    def keep(report: Report) -> None:
        _REPORTS.append(report)
        path = os.environ.get("FAULTS_REPORT")
        if path:
            report.save(path)

    return keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the soak out of the run unless ``FAULTS_SOAK`` asks for it."""
    if os.environ.get("FAULTS_SOAK"):
        return
    soak = [item for item in items if item.get_closest_marker("soak")]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if not item.get_closest_marker("soak")]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORTS:
        return
    terminalreporter.section("fault runs")
    for report in _REPORTS:
        terminalreporter.write_line(report.summary())
        for example in report.examples:
            terminalreporter.write_line(f"    {example}")
        for error in report.client_errors:
            terminalreporter.write_line(f"    error: {error}")
