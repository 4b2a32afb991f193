"""Client processes share a semaphore's slots while a nemesis breaks nodes and freezes clients."""

from __future__ import annotations

import pytest

from .driver import SOAK
from .nemesis import CLIENT_PAUSE, KILL_RESTART, PAUSE
from .semaphore_run import SemaphoreRunConfig, most_at_once, run_semaphore

pytestmark = [pytest.mark.faults, pytest.mark.integration]


@pytest.mark.timeout(110)
@pytest.mark.parametrize(
    ("count", "limit"),
    [
        pytest.param(3, 2, id="3-nodes-limit-2"),
        pytest.param(5, 3, id="5-nodes-limit-3"),
    ],
)
def test_never_more_than_limit_valid_holders(servers, witness, publish, count, limit):
    report = run_semaphore(
        SemaphoreRunConfig(
            name=f"semaphore, {count} nodes, limit {limit}",
            nodes=list(servers)[:count],
            witness=witness,
            limit=limit,
            clients=3 * limit,
            seconds=15.0,
            max_seconds=70.0,
            min_holdings=1000,
            min_node_faults=10,
            required_faults=(KILL_RESTART, PAUSE, CLIENT_PAUSE),
            seed=count,
        )
    )
    publish(report)
    assert report.client_errors == []
    assert report.most_within_validity <= limit, report.examples
    assert report.most_valid_at_exit <= limit, report.examples
    assert report.same_slot_overlaps == 0, report.examples
    # The run was busy and hostile enough to mean something.
    assert report.most_within_validity == limit  # every slot was in use at once
    assert report.holdings >= 1000
    assert report.node_faults >= 10
    assert report.faults.get(KILL_RESTART, 0) >= 1
    assert report.faults.get(PAUSE, 0) >= 1
    assert report.faults.get(CLIENT_PAUSE, 0) >= 1
    assert report.long_holds >= 1
    # Nodes disagreed (a node back empty, racing holders) and second rounds settled them.
    assert report.second_rounds >= 1


def test_most_at_once_counts_what_overlaps():
    assert most_at_once([]) == (0, 0.0)
    assert most_at_once([(0.0, 1.0), (1.0, 2.0)])[0] == 1  # touching is not overlapping
    assert most_at_once([(0.0, 1.0), (0.5, 2.0), (0.9, 0.95), (3.0, 4.0)]) == (3, 0.9)
    assert most_at_once([(0.0, 1.0), (0.5, 0.5)])[0] == 1  # empty windows never count


@pytest.mark.soak
@pytest.mark.timeout(SOAK * 1.5 + 120)
@pytest.mark.parametrize(
    ("count", "limit"),
    [pytest.param(3, 2, id="3-nodes-limit-2"), pytest.param(5, 3, id="5-nodes-limit-3")],
)
def test_semaphore_soak(servers, witness, publish, count, limit):
    report = run_semaphore(
        SemaphoreRunConfig(
            name=f"semaphore soak, {count} nodes, limit {limit}",
            nodes=list(servers)[:count],
            witness=witness,
            limit=limit,
            clients=3 * limit,
            seconds=SOAK,
            max_seconds=SOAK + 60.0,
            seed=count,
        )
    )
    publish(report)
    assert report.client_errors == []
    assert report.most_within_validity <= limit, report.examples
    assert report.most_valid_at_exit <= limit, report.examples
    assert report.same_slot_overlaps == 0, report.examples
    assert report.holdings > 0
