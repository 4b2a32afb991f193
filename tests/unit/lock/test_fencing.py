"""Fencing tokens and node answers, without Redis: the client-side arithmetic."""

from __future__ import annotations

import zlib

import pytest

from celery_redlock import _clock
from celery_redlock._layout import FENCE_BUCKETS, fence_bucket, lock_keys
from celery_redlock.lock.fencing import MAX_TOKEN, RATE_MARGIN, FenceClock, ahead_us, token_for
from celery_redlock.lock.quorum import Tally


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_clock, "monotonic", fake)
    return fake


def test_without_a_clock_estimate_the_proposal_is_past_the_last_token(clock):
    fences = FenceClock()
    assert fences.propose(lead_us=50_000) == 1
    fences.issued(41)
    assert fences.propose(lead_us=50_000) == 42


def test_the_estimate_follows_the_node_clock_from_the_monotonic_clock(clock):
    fences = FenceClock()
    fences.observe(1_700_000_000_500_000, received_at=clock.now)
    assert fences.propose(lead_us=50_000) == 1_700_000_000_550_000
    clock.now += 2.0  # two seconds later, no new reply
    expected = 1_700_000_000_500_000 + int(2e6 * (1 - RATE_MARGIN)) + 50_000
    assert fences.propose(lead_us=50_000) == expected


def test_the_estimate_never_runs_ahead_of_a_node_clock_running_slower_by_the_margin(clock):
    fences = FenceClock()
    fences.observe(5_000_000, received_at=clock.now)
    clock.now += 3600.0
    # A node whose clock ran 1000 ppm slower than ours for an hour.
    node_now = 5_000_000 + 3600e6 * (1 - RATE_MARGIN)
    assert fences.propose(lead_us=0) <= node_now


def test_the_last_token_wins_over_a_stale_estimate(clock):
    fences = FenceClock()
    fences.observe(1_000, received_at=clock.now)
    fences.issued(10_000_000)
    assert fences.propose(lead_us=10) == 10_000_001


def test_proposals_stay_exact_for_lua(clock):
    fences = FenceClock()
    fences.issued(MAX_TOKEN + 5)
    assert fences.propose(lead_us=0) == MAX_TOKEN


@pytest.mark.parametrize(
    ("proposal", "highest", "recorded", "expected"),
    [
        pytest.param(100, 99, 2, (100, True), id="all-below"),
        pytest.param(100, 0, 3, (100, True), id="none"),
        # A bucket equal to the proposal means it may have been issued already.
        pytest.param(100, 100, 0, (101, False), id="equal-is-not-agreement"),
        pytest.param(100, 250, 0, (251, False), id="above"),
        # Granted, but recorded by a minority only (a lagging node refused it).
        pytest.param(100, 99, 1, (100, False), id="recorded-by-a-minority"),
    ],
)
def test_a_token_stands_only_above_every_bucket_seen(proposal, highest, recorded, expected):
    assert token_for(proposal, highest, recorded, 2, ceiling=10_000) == expected


def test_a_proposal_past_the_node_clocks_counts_only_up_to_them():
    # A client whose clock ran 600 s fast: the nodes did not record its
    # proposal, and the token is the nodes' clock plus the allowance.
    ceiling = 1_700_000_000_000_000 + ahead_us(50_000)
    proposal = 1_700_000_600_000_000
    assert token_for(proposal, 1_699_999_999_000_000, 0, 2, ceiling) == (ceiling, False)
    # A bucket already past the ceiling still wins.
    assert token_for(proposal, ceiling + 5, 0, 2, ceiling) == (ceiling + 6, False)


def test_buckets_are_a_stable_hash_of_the_name_bounded_per_prefix():
    assert fence_bucket("redlock:", "invoice:42") == (
        f"redlock:fence:{zlib.crc32(b'invoice:42') % 1024}"
    )
    assert FENCE_BUCKETS == 1024
    buckets = {fence_bucket("redlock:", f"user:{n}") for n in range(20_000)}
    assert len(buckets) == 1024
    assert lock_keys("app:", "x").fence.startswith("app:fence:")


def make_tally(held=0, absent=0, foreign=0, unreachable=0):
    return Tally(
        nodes=held + absent + foreign + unreachable,
        quorum=(held + absent + foreign + unreachable) // 2 + 1,
        held=held,
        absent=absent,
        foreign=foreign,
        unreachable=unreachable,
    )


@pytest.mark.parametrize(
    ("tally", "confirmed", "lost"),
    [
        pytest.param(make_tally(held=2, absent=1), True, False, id="majority"),
        pytest.param(make_tally(held=1, unreachable=2), False, False, id="undecided"),
        pytest.param(make_tally(held=1, absent=1, unreachable=1), False, False, id="one-silent"),
        pytest.param(make_tally(held=1, absent=1, foreign=1), False, True, id="lost"),
    ],
)
def test_a_tally_decides_confirmed_lost_or_undecided(tally, confirmed, lost):
    assert tally.confirmed is confirmed
    assert tally.lost is lost


def test_a_loss_is_described_by_what_each_node_said():
    text = make_tally(held=1, absent=1, foreign=2, unreachable=1).describe()
    assert text == (
        "1 of 5 nodes held it (3 needed): gone from 1 node (expired, deleted, or the node "
        "lost its data), taken over by another owner on 2 nodes, 1 node unreachable"
    )
