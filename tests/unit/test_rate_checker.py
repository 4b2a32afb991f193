"""The admission checker of the rate-limit tests: it must catch what it is there to catch."""

from __future__ import annotations

import pytest

from tests.worker.rate_checker import Bracket, Model, expected_span, judge, schedule, surely_within


def exact(times: list[float]) -> list[Bracket]:
    """Admissions seen with no lateness: each bracket a single moment."""
    return [(at, at) for at in times]


def test_sliding_runs_in_bursts_of_the_limit_one_window_apart() -> None:
    times = schedule([Model(5, 1.0, margin=0.05)], 12)
    assert times[:5] == [0.0] * 5
    assert times[5:10] == [pytest.approx(1.05)] * 5
    assert times[10:] == [pytest.approx(2.1)] * 2
    assert expected_span([Model(5, 1.0, margin=0.05)], 40) == pytest.approx(7 * 1.05)


def test_gcra_spaces_runs_evenly() -> None:
    times = schedule([Model(5, 1.0, "gcra", margin=0.05)], 4)
    assert times == pytest.approx([0.0, 0.21, 0.42, 0.63])


def test_fixed_windows_open_with_their_first_run() -> None:
    times = schedule([Model(2, 1.0, "fixed")], 5)
    assert times == pytest.approx([0.0, 0.0, 1.0, 1.0, 2.0])


def test_a_fractional_limit_bursts_its_ceiling_then_keeps_its_pace() -> None:
    model = Model(2.5, 1.0, margin=0.05)
    times = schedule([model], 13)
    assert times[:3] == [0.0] * 3
    # then one every 1.05 / 2.5 s
    assert times[-1] == pytest.approx(10 * 1.05 / 2.5)
    assert surely_within(exact(times), 3, 1.0)  # the burst of 3...
    assert not surely_within(exact(times), 4, 1.0)  # ...and never 4 in a second


def test_several_limits_each_bind_in_turn() -> None:
    times = schedule([Model(5, 1.0), Model(8, 2.0)], 10)
    # 5 at once, 3 more a second later (8 per 2 s), the rest when the first 5 leave the 2 s window
    assert times == pytest.approx([0.0] * 5 + [1.0] * 3 + [2.0] * 2)


def test_surely_within_counts_only_brackets_that_fit_in_the_window() -> None:
    assert surely_within(exact([0.0, 0.5, 0.99]), 3, 1.0) == [0.0, 0.99]
    assert surely_within(exact([0.0, 0.5, 1.0]), 3, 1.0) == []  # a window is half-open
    # Seen late: a start recorded 0.6 s after its prerun may have been
    # admitted at 0.0 or at 0.6, so three within 1 s are not shown...
    assert surely_within([(0.0, 0.0), (0.3, 0.3), (0.5, 1.1)], 3, 1.0) == []
    # ...but they are when every bracket fits.
    assert surely_within([(0.0, 0.1), (0.3, 0.4), (0.5, 0.9)], 3, 1.0) == [0.0, 0.9]
    # Anchored on any bracket, not only the first.
    assert surely_within(exact([0.0, 2.0, 2.1, 2.2]), 3, 1.0) == [2.0, 2.2]
    assert surely_within([], 1, 1.0) == []


def test_judge_accepts_a_schedule_the_limits_allow() -> None:
    model = Model(5, 1.0, margin=0.05)
    # Each admission seen within 10 ms, late by up to 40 ms more.
    admitted = [(at, at + 0.01 + 0.002 * n) for n, at in enumerate(schedule([model], 20))]
    ids = [f"id{n}" for n in range(20)]
    assert judge(admitted, [model], published=ids, ran=ids) == []


def test_judge_finds_a_burst_over_the_limit() -> None:
    # Beat's admitted ticks all starting at once when a busy worker frees up.
    admitted = [(0.0, 0.05)] * 8 + [(1.2, 1.2)]
    problems = judge(admitted, [Model(5, 1.0)], expected=1.2)
    assert problems == ["6 admissions within 0.050 s from t=0.000 (limit 5 per 1 s)"]


def test_judge_finds_a_lost_a_doubled_and_a_stranger_message() -> None:
    problems = judge(
        exact([0.0, 0.0, 0.0]),
        [Model(5, 1.0)],
        published=["a", "b", "c"],
        ran=["a", "a", "x"],
        expected=0.0,
    )
    assert problems == [
        "2 of 3 published messages never ran",
        "1 messages ran more than once",
        "1 runs of messages nobody published",
    ]


def test_judge_finds_a_run_that_took_too_long_or_too_short() -> None:
    model = Model(5, 1.0)
    slow = exact([float(n) for n in range(10)])  # one a second, where five a second were allowed
    assert judge(slow, [model]) == [
        "took 9.00 to 9.00 s; the limits allow 1.00 s (more than 20% apart)"
    ]
    # Too long only if even the narrowest reading is: late starts alone are not.
    assert judge([(0.0, 0.0), (0.7, 1.5)], [model], expected=1.0) == []
    assert judge([(0.0, 0.0), (1.3, 1.5)], [model], expected=1.0) == [
        "took 1.30 to 1.50 s; the limits allow 1.00 s (more than 20% apart)"
    ]
    # Too short only if even the widest reading is.
    assert judge([(0.0, 0.0), (0.5, 0.85)], [model], expected=1.0) == []
    assert judge([(0.0, 0.0), (0.5, 0.7)], [model], expected=1.0) == [
        "took 0.50 to 0.70 s; the limits allow 1.00 s (more than 20% apart)"
    ]
