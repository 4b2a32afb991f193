"""The run-start checker of the rate-limit tests: it must catch what it is there to catch."""

from __future__ import annotations

import pytest

from tests.worker.rate_checker import Model, busiest_window, expected_span, judge, schedule


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
    assert busiest_window(times, 1.0)[0] == 3


def test_several_limits_each_bind_in_turn() -> None:
    times = schedule([Model(5, 1.0), Model(8, 2.0)], 10)
    # 5 at once, 3 more a second later (8 per 2 s), the rest when the first 5 leave the 2 s window
    assert times == pytest.approx([0.0] * 5 + [1.0] * 3 + [2.0] * 2)


def test_busiest_window_is_half_open() -> None:
    assert busiest_window([0.0, 0.5, 1.0, 1.5], 1.0) == (2, 0.0)
    assert busiest_window([0.0, 0.1, 0.2, 0.99], 1.0) == (4, 0.0)
    assert busiest_window([], 1.0) == (0, 0.0)


def test_judge_accepts_a_schedule_the_limits_allow() -> None:
    model = Model(5, 1.0, margin=0.05)
    starts = [at + 0.01 * n for n, at in enumerate(schedule([model], 20))]
    ids = [f"id{n}" for n in range(20)]
    assert judge(starts, [model], published=ids, ran=ids) == []


def test_judge_finds_a_burst_over_the_limit() -> None:
    # Beat's admitted ticks all starting at once when a busy worker frees up.
    starts = [0.0] * 8 + [1.2]
    problems = judge(starts, [Model(5, 1.0)], expected=1.2)
    assert problems == ["8 starts within 1 s from t=0.000 (limit 5 per 1 s)"]


def test_judge_finds_a_lost_a_doubled_and_a_stranger_message() -> None:
    problems = judge(
        [0.0, 0.0, 0.0],
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
    slow = [float(n) for n in range(10)]  # one a second, where five a second were allowed
    assert judge(slow, [model]) == ["took 9.00 s; the limits allow 1.00 s (more than 20% apart)"]
    assert judge([0.0, 0.0], [model], span=0.5, expected=1.0) == [
        "took 0.50 s; the limits allow 1.00 s (more than 20% apart)"
    ]
    assert judge([0.0, 0.0], [model], span=1.15, expected=1.0) == []
