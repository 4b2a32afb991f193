"""The fast tier runs without Redis: a unit test that asks for servers fails at once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def server_pool() -> None:
    """Shadows the suite's server pool: tests that need Redis belong to another tier."""
    pytest.fail("tests/unit runs without Redis; move a test that needs a server to another tier")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the unit tier: the exceptions the layer contract still lets pass, and why."""
    from .test_package_layout import registered_exceptions

    lines = registered_exceptions()
    if lines:
        terminalreporter.section(f"package layout: {len(lines)} registered exceptions")
        for line in lines:
            terminalreporter.write_line(line)
