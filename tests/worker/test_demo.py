"""The README's first command: ``./dev demo`` runs the whole tour and cleans up."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from .support import ROOT, listening

pytestmark = pytest.mark.celery


def test_dev_demo_runs_every_step_and_stops_what_it_started() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./dev demo" in readme
    assert "./dev test" in readme
    started = time.monotonic()
    done = subprocess.run(
        ["./dev", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # What the README promises a new user once .venv exists: the whole tour in under a minute.
    assert elapsed < 60, f"the demo took {elapsed:.0f} s"
    # From stdout alone: set-up messages (pip) go to stderr and may come at any point.
    summary = done.stdout.split("\nsummary\n", 1)[1]
    rows = [line for line in summary.splitlines() if line.strip()]
    assert len(rows) == 11, summary
    assert all(line.rstrip().endswith("ok") for line in rows), summary
    ports = [int(port) for port in re.findall(r"\d{4,5}", done.stdout.splitlines()[0])]
    assert len(ports) == 5
    assert not any(listening(port) for port in ports), "the demo left redis-server running"
