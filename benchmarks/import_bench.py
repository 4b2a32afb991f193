"""Import benchmark: what each public import line costs a fresh process.

Each line runs in a fresh interpreter (``python -c``), timed inside it from
before the line to after it, with the number of modules it loaded (beyond the
interpreter's own) and whether any ``celery.worker`` module or operator tool
(admin, cli, contrib, demo, testing) is among them. A bare Celery app
(``import celery; celery.Celery()``) is the reference. Lines run interleaved,
several rounds each; the median time counts.

Usage::

    python benchmarks/import_bench.py             # about 30 seconds
    python benchmarks/import_bench.py --quick     # fewer rounds
    python benchmarks/import_bench.py --markdown  # the table in docs/performance.md
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys

from _common import millis, parser, progress, table

LINES = {
    "bare Celery app": "import celery; celery.Celery()",
    "lock": "from celery_redlock import Redlock",
    "package": "import celery_redlock",
    "publisher": "from celery_redlock import LockedTask, setup",
    "publisher with its app": (
        "import celery; from celery_redlock import LockedTask, setup; setup(celery.Celery())"
    ),
}

#: Run in the fresh interpreter: time the line, then count what it loaded.
PROBE = """
import sys, time, json
before = set(sys.modules)
began = time.perf_counter()
exec({line!r})
took = time.perf_counter() - began
new = set(sys.modules) - before
tools = ("celery_redlock.admin", "celery_redlock.cli.commands", "celery_redlock.contrib",
         "celery_redlock.demo", "celery_redlock.testing")
print(json.dumps({{
    "seconds": took,
    "modules": len(new),
    "celery": sum(name.split(".")[0] == "celery" for name in new),
    "worker": sum(name.startswith("celery.worker") for name in new),
    "tools": sum(name.startswith(tools) for name in new),
}}))
"""


def probe(line: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(line=line)], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    rounds = 5 if args.quick else 15
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in LINES}
    for number in range(rounds):
        names = list(LINES) if number % 2 == 0 else list(reversed(LINES))
        for name in names:
            runs[name].append(probe(LINES[name]))
        progress(f"round {number + 1}/{rounds} done")
    reference = statistics.median(run["seconds"] for run in runs["bare Celery app"])
    rows = []
    for name, line in LINES.items():
        seconds = statistics.median(run["seconds"] for run in runs[name])
        last = runs[name][-1]
        rows.append(
            [
                name,
                f"`{line}`",
                millis(seconds),
                f"{seconds / reference:.2f}x",
                str(int(last["modules"])),
                str(int(last["celery"])),
                str(int(last["worker"])),
                str(int(last["tools"])),
            ]
        )
    header = [
        "import",
        "line",
        "median ms",
        "vs bare app",
        "modules",
        "celery.*",
        "celery.worker.*",
        "operator tools",
    ]
    print(f"Python {platform.python_version()}, {rounds} fresh interpreters per line")
    print(table(header, rows, args.markdown))


if __name__ == "__main__":
    main()
