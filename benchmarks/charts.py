"""Draw the PNG charts of docs/performance.md from the benchmarks' saved results.

    .venv/bin/python benchmarks/lock_bench.py --save benchmarks/results/lock.json
    .venv/bin/python benchmarks/task_bench.py --save benchmarks/results/tasks.json
    .venv/bin/python benchmarks/charts.py --lock benchmarks/results/lock.json \\
        --tasks benchmarks/results/tasks.json --out docs/img

(``./dev bench`` does all of it.) The charts show the very run the tables
in docs/performance.md come from, not a measurement of their own:

* ``lock-latency.png``: median acquire + release latency by node count, for
  celery_redlock, pottery and bare redis-py, against the single-node floor;
* ``handoff.png``: distribution of hand-off latencies with 4 processes;
* ``tasks.png``: worker throughput by task kind, median and best round;
* ``adaptive.png`` (docs/rate-limiting.md): calls an adaptive limit let
  through per second, against the service's hidden limit
  (``adaptive_bench.py --save``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FLOOR = "floor (SET NX PX + EVALSHA, 1 node)"
EARLY_MS = 0.001


def median_micros(timing: dict[str, Any]) -> float:
    return statistics.median(timing["latencies"]) * 1e6


def lock_latency_chart(timings: dict[str, Any], out: Path) -> Path:
    def nodes(n: int) -> str:
        return f"{n} node{'s' * (n > 1)}"

    series = {
        "celery_redlock": [(n, f"celery_redlock, {nodes(n)}") for n in (1, 3, 5)],
        "pottery Redlock": [(n, f"pottery Redlock, {nodes(n)}") for n in (1, 3)],
        "bare redis-py, nodes one after another": [
            (1, FLOOR),
            (3, "bare redis-py, 3 nodes one after another"),
        ],
    }
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for label, points in series.items():
        present = [(n, timings[name]) for n, name in points if name in timings]
        axis.plot(
            [n for n, _ in present],
            [median_micros(timing) for _, timing in present],
            marker="o",
            label=label,
        )
    axis.axhline(median_micros(timings[FLOOR]), color="grey", linestyle=":", label="floor, 1 node")
    axis.set_xlabel("lock nodes")
    axis.set_ylabel("median acquire + release (µs)")
    axis.set_xticks([1, 3, 5])
    axis.set_ylim(bottom=0)
    axis.set_title("Uncontended lock latency by node count")
    axis.legend(fontsize="small", loc="upper left")
    return finish(figure, out / "lock-latency.png")


def handoff_chart(handoffs: dict[str, Any], out: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    early = False
    for name, result in handoffs.items():
        # A hand-off can end before release() returns (a lock that replies
        # once a majority has answered); a log axis cannot show that.
        values = sorted(max(latency * 1000, EARLY_MS) for latency in result["latencies"])
        early = early or any(value <= EARLY_MS for value in values)
        if values:
            axis.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    axis.set_xscale("log")
    axis.set_xlabel(
        "release → next holder's acquire returns (ms, log scale)"
        + ("\nhand-offs done before release() returned are drawn at 1 µs" if early else "")
    )
    axis.set_ylabel("fraction of hand-offs")
    axis.set_title("Hand-off latency, 4 contending processes")
    axis.legend(fontsize="small")
    return finish(figure, out / "handoff.png")


def tasks_chart(runs: dict[str, list[dict[str, Any]]], out: Path) -> Path:
    names = list(runs)
    rates = {
        name: [run["tasks"] / run["worker_elapsed"] for run in found]
        for name, found in runs.items()
    }
    figure, axis = plt.subplots(figsize=(7.2, 4.0))
    positions = range(len(names))
    axis.barh(
        [p + 0.2 for p in positions],
        [statistics.median(rates[name]) for name in names],
        height=0.4,
        label="median round",
    )
    axis.barh(
        [p - 0.2 for p in positions],
        [max(rates[name]) for name in names],
        height=0.4,
        label="best round",
    )
    axis.set_yticks(list(positions), names, fontsize="small")
    axis.invert_yaxis()
    axis.set_xlabel("tasks per second, one threads-pool worker")
    axis.set_title("Worker throughput by task kind")
    # Below the plot: the bars reach across most of the axes.
    axis.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return finish(figure, out / "tasks.png")


def finish(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def adaptive_chart(calls: list[list[Any]], out: Path) -> Path:
    end = int(max(at for at, _, _ in calls)) + 1
    went = [0] * end
    refused = [0] * end
    hidden = [0] * end
    for at, ok, limit in calls:
        (went if ok else refused)[int(at)] += 1
        hidden[int(at)] = limit
    figure, axis = plt.subplots(figsize=(6.4, 3.6))
    seconds = list(range(end))
    axis.step(seconds, hidden, where="post", color="grey", linestyle=":", label="hidden limit")
    axis.step(seconds, went, where="post", label="calls let through, per second")
    axis.bar(
        seconds, refused, align="edge", width=1.0, color="tab:red", alpha=0.5, label="refused (429)"
    )
    axis.set_xlabel("seconds")
    axis.set_ylabel("calls per second")
    axis.set_ylim(0, 12)
    axis.legend(loc="upper right", fontsize="small")
    axis.set_title('"40/s" ceiling, 10 calls/s offered, rate_limit_adaptive')
    figure.tight_layout()
    path = out / "adaptive.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", metavar="JSON", help="saved by lock_bench.py --save")
    parser.add_argument("--tasks", metavar="JSON", help="saved by task_bench.py --save")
    parser.add_argument("--adaptive", metavar="JSON", help="saved by adaptive_bench.py --save")
    parser.add_argument("--out", default="docs/img", help="where the PNG files go")
    args = parser.parse_args()
    if not (args.lock or args.tasks or args.adaptive):
        parser.error("give --lock, --tasks and/or --adaptive")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if args.lock:
        lock = json.loads(Path(args.lock).read_text())
        written += [lock_latency_chart(lock["timings"], out), handoff_chart(lock["handoffs"], out)]
    if args.tasks:
        written.append(tasks_chart(json.loads(Path(args.tasks).read_text())["runs"], out))
    if args.adaptive:
        written.append(adaptive_chart(json.loads(Path(args.adaptive).read_text())["calls"], out))
    print("wrote " + ", ".join(str(path) for path in written))


if __name__ == "__main__":
    main()
