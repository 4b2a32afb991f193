"""Client processes on one lock while a nemesis breaks nodes and freezes clients.

The short runs are part of the default suite. The soak runs the same thing
for longer, when asked::

    FAULTS_SOAK=600 FAULTS_REPORT=faults.json ./dev test tests/faults -k soak

Each run's figures are printed at the end of the test run.
"""

from __future__ import annotations

import pytest

from .driver import SOAK, FaultRun, run
from .nemesis import CLIENT_PAUSE, FENCE_EXPIRE, KILL_RESTART, PAUSE, STALE_KEY

pytestmark = [pytest.mark.faults, pytest.mark.integration]

#: Node faults (kills with a delayed empty restart, pauses) every run must see.
MIN_NODE_FAULTS = 10


def assert_safe(report):
    assert report.client_errors == []
    # Mutual exclusion among holders whose lock was valid.
    assert report.overlaps_valid == 0, report.examples
    assert report.overlaps_within_validity == 0, report.examples
    # Fencing: tokens follow the order of acquisition, the store refuses
    # every write from an overtaken holder and no other.
    assert report.token_order_violations == 0, report.examples
    assert report.repeated_tokens == 0, report.examples
    assert report.stale_writes_accepted == 0, report.examples
    assert report.fresh_writes_rejected == 0, report.examples


@pytest.mark.timeout(110)
@pytest.mark.parametrize(
    ("count", "min_sections"),
    [
        pytest.param(3, 2000, id="3-nodes"),
        # Five nodes lose two at a time, so attempts wait for paused nodes more often.
        pytest.param(5, 1000, id="5-nodes"),
    ],
)
def test_short_fault_run(servers, witness, publish, count, min_sections):
    report = run(
        FaultRun(
            name=f"short, {count} nodes",
            nodes=list(servers)[:count],
            witness=witness,
            seconds=15.0,
            max_seconds=70.0,
            min_sections=min_sections,
            min_node_faults=MIN_NODE_FAULTS,
            required_faults=(KILL_RESTART, PAUSE, CLIENT_PAUSE, STALE_KEY, FENCE_EXPIRE),
            seed=count,
        )
    )
    publish(report)
    assert_safe(report)
    assert report.sections >= min_sections
    assert report.node_faults >= MIN_NODE_FAULTS
    assert report.faults.get(KILL_RESTART, 0) >= 1
    assert report.faults.get(PAUSE, 0) >= 1
    assert report.faults.get(CLIENT_PAUSE, 0) >= 1
    assert report.faults.get(STALE_KEY, 0) >= 1
    assert report.faults.get(FENCE_EXPIRE, 0) >= 1
    assert report.long_holds >= 1
    # A frozen client woke up past its ttl and wrote with its stale token.
    assert report.stale_writes_rejected >= 1


@pytest.mark.soak
@pytest.mark.timeout(SOAK * 1.5 + 120)
@pytest.mark.parametrize("count", [pytest.param(3, id="3-nodes"), pytest.param(5, id="5-nodes")])
def test_soak(servers, witness, publish, count):
    report = run(
        FaultRun(
            name=f"soak, {count} nodes",
            nodes=list(servers)[:count],
            witness=witness,
            seconds=SOAK,
            max_seconds=SOAK + 60.0,
            seed=count,
        )
    )
    publish(report)
    assert_safe(report)
    assert report.sections > 0
