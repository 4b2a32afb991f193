"""What each public import line loads, each in a fresh interpreter.

A web process that only publishes loads no Celery worker module and none of
the operator tools; a user of the lock alone loads no Celery at all.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Modules, by name and with their submodules, that a publisher never needs.
WORKER_AND_TOOLS = (
    "celery.worker",
    *(f"celery_redlock.{tool}" for tool in ("admin", "cli", "contrib", "demo", "testing")),
)
#: Celery and the libraries that come with it.
CELERY = ("celery", "kombu", "billiard")

IMPORT_LINES = [
    pytest.param("from celery_redlock import Redlock, RateLimiter, errors", CELERY, id="lock"),
    pytest.param("import celery_redlock", WORKER_AND_TOOLS, id="package"),
    pytest.param("from celery_redlock import LockedTask, setup", WORKER_AND_TOOLS, id="publisher"),
    pytest.param(
        "import celery_redlock; celery_redlock.LockedTask; celery_redlock.setup",
        WORKER_AND_TOOLS,
        id="publisher-by-attribute",
    ),
]


def loaded_by(line: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``line``."""
    code = f"{line}\nimport sys\nprint('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(("line", "unwanted"), IMPORT_LINES)
def test_an_import_loads_only_what_it_needs(line: str, unwanted: tuple[str, ...]) -> None:
    loaded = loaded_by(line)
    assert "celery_redlock" in loaded
    assert [
        name
        for name in loaded
        if name.partition(".")[0] in unwanted
        or any(name == prefix or name.startswith(f"{prefix}.") for prefix in unwanted)
    ] == []


def test_the_checks_see_what_a_worker_loads() -> None:
    # The same check finds the worker modules and the tools where they are used.
    loaded = loaded_by("import celery_redlock.tasks.cleanup_request, celery_redlock.admin")
    assert "celery.worker.request" in loaded
    assert "celery_redlock.admin" in loaded


def test_every_public_name_is_there_and_unknown_ones_are_not() -> None:
    import celery_redlock

    for name in celery_redlock.__all__:
        assert getattr(celery_redlock, name) is not None
    assert set(celery_redlock.__all__) <= set(dir(celery_redlock))
    with pytest.raises(AttributeError, match="Nothing"):
        celery_redlock.Nothing  # noqa: B018
