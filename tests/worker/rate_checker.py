"""Judge recorded run starts against a global rate limit: windows, losses, total time.

A run's start is the time its task body began (recorded by the body itself).
:func:`judge` says what is wrong with one set of starts:

* a window of one period holding more starts than the limit (⌈limit⌉ for
  a fractional one);
* a message lost (published and never run) or run twice;
* a total time that is more than ``tolerance`` away from what the limits
  allow, as :func:`expected_span` computes it.

:func:`expected_span` schedules ``count`` runs that are all ready at once,
each at the earliest moment every limit admits it, with the rules of
``scripts/ratelimit_hit.lua`` (a window of ``period + margin`` for
``sliding`` and ``gcra``; a fractional ``sliding`` limit also keeps a pace).
Pure logic, tested in ``tests/unit/test_rate_checker.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Model", "busiest_window", "expected_span", "judge", "schedule"]

#: Float noise allowed when comparing times, seconds.
_EPSILON = 1e-9


#: How much later than its admission a run's start may be recorded by its body
#: in the worker tests (a thread descheduled between the two, on a loaded
#: 2-core machine): the judged windows are this much shorter than the period.
START_JITTER = 0.05


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


def busiest_window(starts: Iterable[float], period: float) -> tuple[int, float]:
    """The most starts in any window ``[t, t + period)``, and where such a window begins."""
    ordered = sorted(starts)
    best, where, last = 0, 0.0, 0
    for first, at in enumerate(ordered):
        last = max(last, first)
        while last < len(ordered) and ordered[last] < at + period:
            last += 1
        if last - first > best:
            best, where = last - first, at
    return best, where


def judge(
    starts: Sequence[float],
    models: Sequence[Model],
    *,
    published: Sequence[str] | None = None,
    ran: Sequence[str] | None = None,
    span: float | None = None,
    expected: float | None = None,
    tolerance: float = 0.2,
    jitter: float = 0.0,
) -> list[str]:
    """What is wrong with ``starts`` under ``models``; an empty list when nothing is.

    Args:
        starts: run start times, seconds, one clock.
        models: the limits every one of these runs was counted against.
        published: ids of the messages published; with ``ran``, each must
            have run exactly once.
        ran: ids of the runs that started (one entry per start).
        span: the measured total time; default: last start minus first.
        expected: the total time the limits allow; default:
            :func:`expected_span` of the runs started.
        tolerance: how far ``span`` may be from ``expected``, as a fraction of it.
        jitter: how much later than its admission a start may have been
            recorded (a body records its start after the limiter admitted
            it; a thread descheduled in between records it late): the
            windows judged are ``period - jitter`` long.
    """
    problems = []
    for model in models:
        most, where = busiest_window(starts, model.period - jitter)
        if most > model.most:
            problems.append(
                f"{most} starts within {model.period:g} s from t={where:.3f} "
                f"(limit {model.limit:g} per {model.period:g} s)"
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
    if starts:
        measured = max(starts) - min(starts) if span is None else span
        wanted = expected_span(models, len(starts)) if expected is None else expected
        if abs(measured - wanted) > tolerance * wanted:
            problems.append(
                f"took {measured:.2f} s; the limits allow {wanted:.2f} s "
                f"(more than {tolerance:.0%} apart)"
            )
    return problems
