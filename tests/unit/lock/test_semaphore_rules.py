"""The semaphore's pure rules: limits, and when nodes' answers decide an attempt."""

from __future__ import annotations

import pytest

from celery_redlock.errors import ConfigurationError
from celery_redlock.lock.semaphore_slots import (
    MAX_LIMIT,
    Answers,
    agreed,
    check_limit,
    decided,
    target,
)


@pytest.mark.parametrize("limit", [1, 3, MAX_LIMIT])
def test_whole_limits_are_accepted(limit: int) -> None:
    assert check_limit(limit) == limit


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1, 2.0, "2", None, True])
def test_other_limits_name_the_option(limit: object) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_limit(limit, "concurrency_limit")
    assert caught.value.option == "concurrency_limit"


def grant(slot: int) -> list[object]:
    return [[slot, -1, 0, []]]


def test_a_majority_must_grant_the_same_slot_number() -> None:
    assert agreed(Answers(grants={0: 1, 1: 1, 2: 0}), quorum=2) == 1
    # Three nodes, three numbers: every node granted, yet no slot is held.
    assert agreed(Answers(grants={0: 0, 1: 1, 2: 2}), quorum=2) is None
    assert agreed(Answers(grants={0: 4}), quorum=1) == 4


def test_a_fan_out_may_stop_once_the_outcome_is_known() -> None:
    done = decided(quorum=2, nodes=3)
    assert not done([grant(0), None, None])
    assert done([grant(0), None, grant(0)])
    assert not done([grant(0), grant(1), None])  # the third node settles it
    assert done([grant(-1), grant(-1), None])  # two refusals: no majority left
    assert not done([grant(-1), grant(0), None])


def test_nodes_that_disagree_settle_on_the_slot_most_of_them_can_give() -> None:
    # Node 0 granted 2 (0 and 1 taken), node 1 granted 1 (0 taken), node 2 granted 0.
    answers = Answers(grants={0: 2, 1: 1, 2: 0}, free={0: [2], 1: [1, 2], 2: [0, 1, 2]})
    assert target(answers, quorum=2) == 2  # free or granted on all three
    # Lowest number among slots with equal support.
    assert target(Answers(grants={0: 1, 1: 0}, free={0: [1, 0], 1: [0, 1]}), 2) == 0


def test_no_settling_when_no_slot_can_have_a_majority() -> None:
    # A refusal reports no free slots: node 2 supports nothing.
    answers = Answers(grants={0: 1, 1: 0}, free={0: [1], 1: [0], 2: []})
    assert target(answers, quorum=2) is None
