"""A nightly job made a singleton by configuration alone: five publishes, one run.

``reports.nightly`` is a plain ``@app.task`` -- no base class, nothing in its
code knows about locks. ``app.conf.redlock_tasks`` plus
``celery_redlock.setup(app)`` make it a singleton: while one copy is queued or
running, publishing it again (a second beat, a retry storm, an operator
clicking twice) returns the copy already queued instead of queueing another.

    python examples/nightly_singleton.py                 # local redis-server nodes
    python examples/nightly_singleton.py --nodes URL URL URL --broker URL
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from _support import make_app, parse_args, redis_urls, running_worker, say

import celery_redlock
from celery_redlock import signals

runs: list[str] = []
runs_lock = threading.Lock()
suppressed: list[str] = []


def create_app(broker: str, nodes: list[str]) -> Any:
    """The app: one plain task, configured as a singleton in ``app.conf``."""
    app = make_app("nightly_singleton", broker, nodes)

    @app.task(name="reports.nightly", shared=False)
    def nightly(day: str) -> str:
        with runs_lock:
            runs.append(day)
        time.sleep(1.0)  # build the report
        return f"report for {day} built"

    app.conf.redlock_tasks = {"reports.nightly": {"singleton": True}}
    celery_redlock.setup(app)
    return app


def count_suppressed(sender: Any = None, where: str = "", **_: Any) -> None:
    suppressed.append(where)


def main() -> int:
    options = parse_args(__doc__)
    signals.duplicate_suppressed.connect(count_suppressed, weak=False)
    with redis_urls(options) as urls:
        app = create_app(broker=urls[3], nodes=urls[:3])
        nightly = app.tasks["reports.nightly"]
        with running_worker(app):
            say("publishing reports.nightly('2026-11-22') 5 times")
            results = [nightly.delay("2026-11-22") for _ in range(5)]
            ids = {result.id for result in results}
            for result in results:
                say(f"  publish -> task {result.id}")
            say(f"  {results[0].get(timeout=30)}")
            first_runs = len(runs)
            say("publishing it again now that the run has finished")
            again = nightly.delay("2026-11-22")
            say(f"  publish -> task {again.id}: {again.get(timeout=30)}")
            del results, again  # results talk to the broker: drop them while it runs
        app.close()

    say()
    say(f"5 publishes -> {len(ids)} task id, {first_runs} run")
    say(f"duplicates suppressed at publish: {suppressed.count('publish')}")
    say(f"a publish after the run finished ran again: {'yes' if len(runs) == 2 else 'no'}")
    ok = len(ids) == 1 and first_runs == 1 and len(runs) == 2 and suppressed.count("publish") == 4
    say("OK: 5 publishes, 1 run" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
