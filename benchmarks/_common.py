"""Helpers shared by the benchmark scripts: servers, timing, percentiles, tables.

Every script starts its own ``redis-server`` processes on free 127.0.0.1
ports (never 6379), so a run measures nothing but itself and leaves no data
behind. Variants of one measurement run interleaved, several rounds each, and
the round with the best median counts: that damps the noise of a busy machine
without hiding a variant's real cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from celery_redlock.testing import RedisServer, ServerGroup


@contextmanager
def redis_servers(count: int) -> Iterator[ServerGroup]:
    """``count`` throw-away servers on free ports, removed on exit."""
    with RedisServer.start_many(count) as servers:
        yield servers


def environment(url: str, *extra: str) -> str:
    """One line naming what the figures were measured on."""
    with redis.Redis.from_url(url) as client:
        redis_version = client.info("server")["redis_version"]
    parts = [
        f"{os.cpu_count()} CPUs",
        f"redis-server {redis_version}",
        f"Python {platform.python_version()}",
        f"redis-py {redis.__version__}",
        *extra,
        f"load average {os.getloadavg()[0]:.2f}",
    ]
    return ", ".join(parts)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (``fraction`` in [0, 1])."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Timing:
    """``count`` calls of one operation: each call's latency and the total time."""

    latencies: list[float]  # seconds
    elapsed: float  # seconds, the whole loop

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.elapsed

    @property
    def median(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


def time_calls(operation: Callable[[], object], count: int, warmup: int = 100) -> Timing:
    """Call ``operation`` ``count`` times (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        operation()
    clock = time.perf_counter
    latencies = [0.0] * count
    began = clock()
    for index in range(count):
        start = clock()
        operation()
        latencies[index] = clock() - start
    return Timing(latencies, clock() - began)


def best_rounds(
    variants: dict[str, Callable[[], object]], count: int, rounds: int
) -> dict[str, Timing]:
    """Time every variant ``rounds`` times, interleaved; keep each one's best median."""
    best: dict[str, Timing] = {}
    for round_number in range(rounds):
        names = list(variants)
        if round_number % 2:
            names.reverse()  # no variant always runs first
        for name in names:
            timing = time_calls(variants[name], count)
            if name not in best or timing.median < best[name].median:
                best[name] = timing
        progress(f"round {round_number + 1}/{rounds} done")
    return best


def micros(seconds: float) -> str:
    """Seconds as a whole number of microseconds, with thousands separators."""
    return f"{seconds * 1e6:,.0f}"


def millis(seconds: float) -> str:
    """Seconds as milliseconds with two decimals."""
    return f"{seconds * 1e3:.2f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    """A table as aligned text, or as Markdown when ``markdown``."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    )


def verdict(reached: bool) -> str:
    return "reached" if reached else "NOT reached"


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark script shares."""
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--quick", action="store_true", help="fewer iterations, a short run")
    result.add_argument("--markdown", action="store_true", help="print Markdown tables")
    result.add_argument(
        "--save", metavar="PATH", help="also write the raw results as JSON (for charts.py)"
    )
    return result


def save(path: str | None, about: str, **results: Any) -> None:
    """Write raw results (dataclasses, dicts and lists of them) as JSON to ``path``."""
    if path is None:
        return

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        return value

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"about": about, **plain(results)}))
    progress(f"raw results written to {target}")


def progress(message: str) -> None:
    """A progress note on stderr, so that stdout holds only the results."""
    print(message, file=sys.stderr, flush=True)
