"""The fast tier runs without Redis: a unit test that asks for servers fails at once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def server_pool() -> None:
    """Shadows the suite's server pool: tests that need Redis belong to another tier."""
    pytest.fail("tests/unit runs without Redis; move a test that needs a server to another tier")
