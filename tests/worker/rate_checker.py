"""Judge recorded run admissions against a global rate limit: windows, losses, total time.

A run is admitted by the limiter somewhere between its delivery's task_prerun
and the moment its body records its start; the worker tests record both, so
each admission is known as a bracket ``(prerun, start)``. A thread descheduled
in between (a loaded 2-core machine) widens a bracket; it never moves it.
:func:`judge` says what is wrong with one set of brackets:

* more admissions than the limit (⌈limit⌉ for a fractional one) that surely
  fell within one window of the limiter (the period and the margin): their
  brackets fit in it together (:func:`surely_within`);
* a message lost (published and never run) or run twice;
* a total time more than ``tolerance`` away from what the limits allow, as
  :func:`expected_span` computes it: too short if even the widest reading of
  the brackets is, too long if even the narrowest is.

:func:`expected_span` schedules ``count`` runs that are all ready at once,
each at the earliest moment every limit admits it, with the rules of
``scripts/ratelimit_hit.lua`` (a window of ``period + margin`` for
``sliding`` and ``gcra``; a fractional ``sliding`` limit also keeps a pace).
Pure logic, tested in ``tests/unit/test_rate_checker.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bracket", "Model", "expected_span", "judge", "schedule", "surely_within"]

#: Float noise allowed when comparing times, seconds.
_EPSILON = 1e-9

#: How far the server's clock may run from ours over one window, seconds:
#: windows are judged this much shorter.
CLOCK_SPARE = 0.002

#: When a run was admitted: after ``prerun``, before ``start`` (seconds, one clock).
Bracket = tuple[float, float]


@dataclass(frozen=True)
class Model:
    """One limit as the limiter keeps it: ``limit`` per ``period`` under ``algorithm``."""

    limit: float
    period: float
    algorithm: str = "sliding"
    margin: float = 0.0

    @property
    def window(self) -> float:
        """The window the limiter counts in: ``period + margin`` (``fixed``: ``period``)."""
        return self.period if self.algorithm == "fixed" else self.period + self.margin

    @property
    def most(self) -> int:
        """The most starts any window of one period may hold."""
        return math.ceil(self.limit)


class _State:
    """One limit's state while :func:`schedule` runs."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.admitted: list[float] = []
        self.tat = -math.inf  # gcra's, or the pace's, theoretical arrival time
        self.window_start = -math.inf  # fixed

    def ready(self, now: float) -> float:
        """The earliest time >= now this limit admits one more unit."""
        model = self.model
        interval = model.window / model.limit
        if model.algorithm == "gcra":
            return max(now, self.tat)
        if model.algorithm == "fixed":
            opened = self.window_start + model.period
            if now < opened and self._in_window(now) >= model.most:
                now = opened
        elif len(self.admitted) >= model.most:
            now = max(now, self.admitted[-model.most] + model.window)
        if model.limit != math.floor(model.limit):
            # The pace: a bucket of ⌈limit⌉ units refilled at limit per window.
            now = max(now, self.tat + interval - model.most * interval)
        return now

    def admit(self, now: float) -> None:
        model = self.model
        interval = model.window / model.limit
        if model.algorithm == "fixed" and now >= self.window_start + model.period:
            self.window_start = now
        self.admitted.append(now)
        if model.algorithm == "gcra" or model.limit != math.floor(model.limit):
            self.tat = max(self.tat, now) + interval

    def _in_window(self, now: float) -> int:
        return sum(1 for at in self.admitted if at >= self.window_start)


def schedule(models: Sequence[Model], count: int) -> list[float]:
    """Start times of ``count`` runs, all ready at 0, each admitted by every limit at once."""
    states = [_State(model) for model in models]
    times: list[float] = []
    now = 0.0
    for _ in range(count):
        while True:
            later = max(state.ready(now) for state in states)
            if later <= now + _EPSILON:
                break
            now = later
        for state in states:
            state.admit(now)
        times.append(now)
    return times


def expected_span(models: Sequence[Model], count: int) -> float:
    """Seconds from the first start to the last when ``count`` runs are ready at once."""
    times = schedule(models, count)
    return times[-1] - times[0] if times else 0.0


def surely_within(brackets: Sequence[Bracket], count: int, window: float) -> list[float]:
    """``count`` admissions that fell within less than ``window`` however late they were seen.

    Returned as ``[earliest prerun, latest start]`` of the first such group;
    empty when no ``count`` brackets fit in ``window`` together.
    """
    for i, (earliest, start) in enumerate(brackets):
        # Anchored on this bracket's prerun: the others admitted no sooner, soonest started.
        others = sorted(s for j, (p, s) in enumerate(brackets) if j != i and p >= earliest)
        if len(others) >= count - 1:
            latest = max([start, *others[: count - 1]])
            if latest - earliest < window:
                return [earliest, latest]
    return []


def judge(
    admitted: Sequence[Bracket],
    models: Sequence[Model],
    *,
    published: Sequence[str] | None = None,
    ran: Sequence[str] | None = None,
    expected: float | None = None,
    tolerance: float = 0.2,
) -> list[str]:
    """What is wrong with the admissions ``admitted`` under ``models``; empty when nothing is.

    Args:
        admitted: one bracket per run, ``(prerun, start)``.
        models: the limits every one of these runs was counted against.
        published: ids of the messages published; with ``ran``, each must
            have run exactly once.
        ran: ids of the runs that started (one entry per start).
        expected: the total time the limits allow; default:
            :func:`expected_span` of the runs admitted.
        tolerance: how far the total time may be from ``expected``, as a
            fraction of it.
    """
    problems = []
    for model in models:
        found = surely_within(admitted, model.most + 1, model.window - CLOCK_SPARE)
        if found:
            problems.append(
                f"{model.most + 1} admissions within {found[1] - found[0]:.3f} s from "
                f"t={found[0]:.3f} (limit {model.limit:g} per {model.period:g} s)"
            )
    if published is not None and ran is not None:
        counts = Counter(ran)
        lost = sorted(set(published) - set(counts))
        twice = sorted(task_id for task_id, seen in counts.items() if seen > 1)
        strangers = sorted(set(counts) - set(published))
        if lost:
            problems.append(f"{len(lost)} of {len(published)} published messages never ran")
        if twice:
            problems.append(f"{len(twice)} messages ran more than once")
        if strangers:
            problems.append(f"{len(strangers)} runs of messages nobody published")
    if admitted:
        widest = max(s for _, s in admitted) - min(p for p, _ in admitted)
        narrowest = max(0.0, max(p for p, _ in admitted) - min(s for _, s in admitted))
        wanted = expected_span(models, len(admitted)) if expected is None else expected
        if widest < (1 - tolerance) * wanted or narrowest > (1 + tolerance) * wanted:
            problems.append(
                f"took {narrowest:.2f} to {widest:.2f} s; the limits allow {wanted:.2f} s "
                f"(more than {tolerance:.0%} apart)"
            )
    return problems
