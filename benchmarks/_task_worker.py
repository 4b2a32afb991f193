"""The app of task_bench.py's worker in its own process (``--pool prefork`` or ``gevent``).

task_bench.py runs ``celery -A _task_worker worker`` with ``benchmarks/`` on
the path; this module builds the benchmark's app (``task_bench.make_app``)
from the environment:

* ``BENCH_BROKER``, ``BENCH_BACKEND``: the broker and result backend URLs;
* ``BENCH_NODES``: the lock nodes, comma separated;
* ``BENCH_STAMPS``: a Redis database where the worker writes its stamps;
* ``BENCH_TASKS``: the tasks of the run (N).

The worker stamps the span task_bench.py measures, as its threads pool's
``Stopwatch`` does in one process. The first ``task_prerun`` of the worker
(the first process of the pool to start a task writes ``first`` with
``SET NX``) and the N-th successful ``task_postrun`` (counted with ``INCR``
on ``done``: the only Redis call of every task, in every variant) each write
``time.monotonic()`` (system-wide on Linux, so the processes' stamps compare)
and the CPU time and voluntary context switches of the whole worker: its main
process and the pool's processes, all their threads. The last one is pushed
on ``last``, which task_bench.py waits for.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
import redis
from celery import signals
from task_bench import make_app

#: The worker's main process: this module is imported there before the pool
#: forks (prefork), and a gevent worker is this one process.
MAIN = os.getpid()
EXPECTED = int(os.environ["BENCH_TASKS"])

app = make_app(
    os.environ["BENCH_BROKER"], os.environ["BENCH_BACKEND"], os.environ["BENCH_NODES"].split(",")
)
# One connection per greenlet at most: 100 in a gevent worker, redis-py's
# default pool size; room to spare.
stamps = redis.Redis.from_url(os.environ["BENCH_STAMPS"], max_connections=1000)
started = False  # this process has run its first task


def switches(pid: int) -> int:
    """Voluntary context switches of all the threads of process ``pid`` so far."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # the thread ended
            continue
        total += sum(int(line.split()[1]) for line in lines if line.startswith("voluntary_"))
    return total


def usage() -> str:
    """Now, and the CPU time and switches of the worker's processes, as JSON."""
    now = time.monotonic()
    main = psutil.Process(MAIN)
    cpu, switched = 0.0, 0
    for process in [main, *main.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        cpu += times.user + times.system
        switched += switches(process.pid)
    return json.dumps({"time": now, "cpu": cpu, "switches": switched})


@signals.task_prerun.connect(weak=False)
def on_prerun(**_: Any) -> None:
    global started
    if not started:
        started = True
        stamps.set("first", usage(), nx=True)


@signals.task_postrun.connect(weak=False)
def on_postrun(state: str | None = None, **_: Any) -> None:
    # A run sent back for a retry ends again later: only successes count.
    if state == "SUCCESS" and stamps.incr("done") == EXPECTED:
        stamps.rpush("last", usage())
