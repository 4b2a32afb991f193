"""The checker finds what it is meant to find, on histories made up by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from .checker import check, overlapping_pairs
from .history import Section

pytestmark = pytest.mark.faults

TTL = 0.5


def section(owner, token, enter, exit_, arrival, *, accepted=True, valid_until=None):
    valid_until = enter + TTL if valid_until is None else valid_until
    return Section(
        owner=owner,
        token=token,
        enter=enter,
        exit=exit_,
        validity_at_enter=max(0.0, valid_until - enter),
        validity_at_exit=max(0.0, valid_until - exit_),
        valid_until=valid_until,
        accepted=accepted,
        arrival=arrival,
    )


def report_of(history):
    return check(
        "made up",
        history,
        faults=Counter(),
        node_fault_kinds=(),
        nodes=3,
        clients=2,
        ttl=TTL,
        seconds=1.0,
    )


def test_a_clean_history_passes():
    report = report_of(
        [
            section("a-1", 1, 0.0, 0.1, 1),
            section("b-1", 2, 0.2, 0.3, 2),
            section("a-2", 3, 0.3, 0.4, 3),
        ]
    )
    assert report.sections == 3
    assert report.overlaps_valid == report.overlaps_within_validity == 0
    assert report.token_order_violations == 0
    assert report.stale_writes_accepted == report.stale_writes_rejected == 0
    assert report.fresh_writes_rejected == 0


def test_two_valid_holders_at_once_are_an_overlap():
    report = report_of([section("a-1", 1, 0.0, 0.2, 1), section("b-1", 2, 0.1, 0.3, 2)])
    assert report.overlaps_valid == 1
    assert report.overlaps_within_validity == 1
    assert "overlap" in report.examples[0]


def test_an_expired_holder_overlapping_a_new_one_is_not_a_valid_overlap():
    # a-1 was frozen past its validity (0.5 s), b-1 took over, a-1 woke and
    # wrote last with its old token: the store refused it.
    report = report_of(
        [
            section("a-1", 1, 0.0, 1.5, 2, accepted=False),
            section("b-1", 2, 0.8, 0.9, 1),
        ]
    )
    assert report.overlaps_valid == 0
    assert report.overlaps_within_validity == 0
    assert report.overlaps_with_expired == 1
    assert report.expired_sections == 1
    assert report.stale_writes_rejected == 1
    assert report.stale_writes_accepted == 0


def test_a_stale_write_accepted_is_reported():
    # Same story, but the tokens went backwards, so the store took a-1's write.
    report = report_of(
        [
            section("a-1", 5, 0.0, 1.5, 2, accepted=True),
            section("b-1", 2, 0.8, 0.9, 1),
        ]
    )
    assert report.stale_writes_accepted == 1
    assert report.token_order_violations == 1


def test_a_fresh_write_rejected_is_reported():
    report = report_of(
        [
            section("a-1", 5, 0.0, 0.1, 1),
            section("b-1", 2, 0.2, 0.3, 2, accepted=False),
        ]
    )
    assert report.fresh_writes_rejected == 1
    assert report.token_order_violations == 1


def test_a_repeated_token_is_reported():
    report = report_of(
        [
            section("a-1", 5, 0.0, 0.1, 1),
            section("b-1", 5, 0.2, 0.3, 2),
            section("a-2", 6, 0.4, 0.5, 3),
        ]
    )
    assert report.repeated_tokens == 1
    assert report.token_order_violations == 1


def test_long_holds_are_counted():
    long_hold = Section(
        owner="a-1",
        token=1,
        enter=0.0,
        exit=2.0,
        validity_at_enter=0.5,
        validity_at_exit=0.4,
        valid_until=2.4,
        accepted=True,
        arrival=1,
        renewals=6,
    )
    report = report_of([long_hold, section("b-1", 2, 2.5, 2.6, 2)])
    assert report.long_holds == 1
    assert report.token_order_violations == 0
    assert Section.decode(long_hold.encode()) == long_hold


def test_overlapping_pairs_counts_each_pair_once():
    made = [section(str(i), i, float(i), i + 2.5, i) for i in range(4)]
    pairs = overlapping_pairs([(s.enter, s.exit, s) for s in made])
    assert sorted((a.owner, b.owner) for a, b in pairs) == [
        ("0", "1"),
        ("0", "2"),
        ("1", "2"),
        ("1", "3"),
        ("2", "3"),
    ]


def test_sections_survive_the_trip_through_the_witness():
    original = section("c3-17", 123456789, 12345.678901234, 12345.7, 42, accepted=False)
    assert Section.decode(original.encode().encode()) == original
