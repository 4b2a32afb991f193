"""Celery benchmark: tasks per second through a real worker, with and without locks.

In one run, on its own ``redis-server`` processes (free 127.0.0.1 ports): the
broker and the result backend share one server, the lock nodes are three
others. A Celery worker (``threads`` pool, 4 threads, started in this process
with ``celery.contrib.testing.worker.start_worker``) runs tasks with a trivial
body (``return n``):

1. a plain ``@app.task``;
2. ``LockedTask`` with a distinct lock per task (``lock_key="bench:{n}"``)
   on 1 lock node, and 3. the same on 3 lock nodes, healthy and with the
   third node paused (SIGSTOP) from before the worker starts until it has
   run every task;
4. the lock a team writes without a plugin, on 1 node: redis-py's ``Lock``
   (``SET NX PX``, Lua compare-and-delete) taken with ``blocking=False``
   around the body, on a key per task, the baseline ``LockedTask`` is held
   to;
5. publish-time deduplication on 1 node: ``LockedTask(singleton=True)``,
   celery-once's ``QueueOnce`` and celery-singleton's ``Singleton``;
6. ``LockedTask`` with ``concurrency_limit=4`` on one key (a semaphore slot
   per run; 4 threads never find it full, so this is the slot's cost), on 1
   and on 3 lock nodes.

For each variant, N tasks are published first, while no worker runs (the
publish rate is reported too: it is where the singleton variants take their
lock); then a worker starts and drains the queue. Worker throughput is
counted inside the worker, from the first task starting (``task_prerun``) to
the last task's result being stored (``task_postrun``), so neither the
worker's start-up nor publishing is in it. Over the same span the benchmark
records the worker process's CPU time and voluntary context switches, and
the lock nodes' CPU time, per task. Every run is checked: N results, all
``SUCCESS``, no lock key left. Variants run interleaved, 3 rounds each.

``--pool prefork`` (concurrency 2) and ``--pool gevent`` (concurrency 100)
measure the same way through a worker in a process of its own, started for
each run with ``celery -A _task_worker worker`` (whose app module builds the
same app from environment variables; the celery command patches for gevent
before anything is imported). Its ``task_prerun``/``task_postrun`` handlers
stamp the span in the broker's server: ``time.monotonic()`` (system-wide, so
the pool processes' stamps compare) and the CPU time and voluntary switches
of the whole worker, main process and pool processes (``psutil``,
``/proc``), at the first task's start and at the N-th success, which they
count with one ``INCR`` per task. The ``concurrency_limit=4`` variants run
only where the pool's concurrency is 4 or less (prefork).

Usage::

    python benchmarks/task_bench.py             # about 2 minutes
    python benchmarks/task_bench.py --quick     # about 25 seconds
    python benchmarks/task_bench.py --markdown  # tables for docs/performance.md
    python benchmarks/task_bench.py --tasks 2000  # tasks per run (default 1,500)
    python benchmarks/task_bench.py --pool prefork  # or gevent: a worker process per run,
                                                    # about 3 minutes with --quick
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import redis
from _common import environment, parser, progress, redis_servers, save, table, verdict
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker

from celery_redlock import LockedTask
from celery_redlock._layout import lock_name, semaphore_name
from celery_redlock.tasks import app_state

try:
    from celery_once import QueueOnce
except ImportError:  # told in the output
    QueueOnce = None
try:
    from celery_singleton import Singleton
except ImportError:  # told in the output
    Singleton = None

# Celery's Redis result backend calls SETEX, which redis-py 8 deprecates.
warnings.filterwarnings("ignore", message="Call to deprecated setex", category=DeprecationWarning)

CONCURRENCY = 4
#: Each pool's concurrency: threads in the benchmark's process, the others in
#: a ``celery worker`` process of their own.
POOLS = {"threads": CONCURRENCY, "prefork": 2, "gevent": 100}
#: The package each process pool comes from, named in the output.
POOL_PACKAGES = {"prefork": "billiard", "gevent": "gevent"}
HERE = Path(__file__).resolve().parent
QUEUE = "bench"
#: Key prefix of the lock nodes.
PREFIX = "bench:"
PLAIN = "plain @app.task"
LOCKED_1 = "LockedTask, lock_key per task, 1 node"
LOCKED_3 = "LockedTask, lock_key per task, 3 nodes"
LIMITED_1 = "LockedTask, concurrency_limit=4 on one key, 1 node"
LIMITED_3 = "LockedTask, concurrency_limit=4 on one key, 3 nodes"
LOCKED_3_PAUSED = "LockedTask, lock_key per task, 3 nodes, 1 paused"
BY_HAND = "redis-py Lock by hand, key per task, 1 node"
ONCE = "celery-once QueueOnce, 1 node"
SINGLETON = "celery-singleton Singleton, 1 node"
PAUSED_GOAL = 0.8  # with one node of three paused, at least this share of the healthy figure
GOAL_1 = 0.9  # LockedTask tasks/s at least this share of plain, 1 node
GOAL_3 = 0.85  # and on 3 nodes
BY_HAND_GOAL_1 = 1.0  # LockedTask tasks/s at least this share of the lock by hand, 1 node
BY_HAND_GOAL_3 = 0.85  # and on 3 nodes, of the lock by hand on 1 node
BY_HAND_TTL = 60  # the hand-written lock's timeout, seconds: LockedTask's default lock_ttl
PREFIX = "bench:"  # the lock nodes' key prefix


# -- the apps and their tasks ------------------------------------------------------


def make_app(broker: str, backend: str | None, nodes: list[str]) -> Celery:
    """An app with every benchmark task; ``backend=None`` for the publishing side.

    The publisher keeps no result backend: with a Redis backend, every
    ``apply_async`` would subscribe to the task's result channel, a cost of
    the caller waiting for results that this benchmark does not measure.
    """
    app = Celery("bench", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        redlock_nodes=nodes,
        redlock_key_prefix=PREFIX,
        # The peers, on the first lock node.
        ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": nodes[0]}},
        singleton_backend_url=nodes[0],
        # An idle worker's BRPOP returns after this long (default 1 s), and a
        # worker stops only then: 0.1 s keeps the restarts between runs short.
        # Busy, BRPOP returns at once: the queue is never empty during a run.
        broker_transport_options={"polling_interval": 0.1},
    )
    task = functools.partial(app.task, shared=False)

    @task(name="bench.plain")
    def plain(n: int) -> int:
        return n

    @task(base=LockedTask, name="bench.locked", lock_key="bench:{n}")
    def locked(n: int) -> int:
        return n

    @task(
        base=LockedTask,
        name="bench.limited",
        concurrency_limit=CONCURRENCY,
        concurrency_key="bench-limit",
    )
    def limited(n: int) -> int:
        return n

    # What a team writes without a plugin: redis-py's Lock around the body.
    by_hand_client = redis.Redis.from_url(nodes[0])

    @task(name="bench.by_hand")
    def by_hand(n: int) -> int:
        lock = by_hand_client.lock(f"by-hand:{n}", timeout=BY_HAND_TTL, blocking=False)
        if not lock.acquire():
            # Never with a key per task; a skipped body would not be measured.
            raise RuntimeError(f"by-hand:{n} is held")
        try:
            return n
        finally:
            lock.release()

    @task(base=LockedTask, name="bench.singleton", singleton=True)
    def singleton(n: int) -> int:
        return n

    if QueueOnce is not None:

        @task(base=QueueOnce, name="bench.queue_once")
        def queue_once(n: int) -> int:
            return n

    if Singleton is not None:

        @task(base=Singleton, name="bench.celery_singleton")
        def celery_singleton(n: int) -> int:
            return n

    return app


@dataclass(frozen=True)
class Variant:
    name: str
    task: str
    nodes: int  # lock nodes: 1 or 3
    paused: bool = False  # the third lock node stopped (SIGSTOP) while the worker runs


def variants() -> list[Variant]:
    found = [
        Variant(PLAIN, "bench.plain", 1),
        Variant(LOCKED_1, "bench.locked", 1),
        Variant(LOCKED_3, "bench.locked", 3),
        Variant(LOCKED_3_PAUSED, "bench.locked", 3, paused=True),
        Variant(BY_HAND, "bench.by_hand", 1),
        Variant("LockedTask(singleton=True), 1 node", "bench.singleton", 1),
        Variant(LIMITED_1, "bench.limited", 1),
        Variant(LIMITED_3, "bench.limited", 3),
    ]
    if QueueOnce is not None:
        found.append(Variant(ONCE, "bench.queue_once", 1))
    if Singleton is not None:
        found.append(Variant(SINGLETON, "bench.celery_singleton", 1))
    return found


def left_behind(key: str) -> bool:
    """Whether ``key`` on a lock node is a lock or slot left held, or a peer's key left behind.

    celery_redlock's fencing buckets (1,024 at most) and a singleton's
    argument preview (``:args``, with the singleton's ttl) stay by design.
    """
    return (
        not key.startswith(PREFIX)
        or lock_name(PREFIX, key) is not None
        or semaphore_name(PREFIX, key) is not None
    )


def _contents(node: redis.Redis, key: bytes) -> object:
    """What a key left behind holds, with its ttl, for the error that reports it."""
    kind = node.type(key)
    held = {
        b"string": node.get,
        b"hash": node.hgetall,
        b"zset": lambda name: node.zrange(name, 0, -1, withscores=True),
    }.get(kind, lambda name: None)(key)
    return (held, node.pttl(key))


# -- counting in the worker --------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """What this process (all its threads) used so far."""

    cpu: float  # seconds, user + system
    switches: int  # voluntary context switches: a thread blocked (I/O, GIL, a lock)

    @classmethod
    def now(cls) -> Usage:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(usage.ru_utime + usage.ru_stime, usage.ru_nvcsw)


def server_cpu(client: redis.Redis) -> float:
    """CPU seconds used by a redis-server so far."""
    found = client.info("cpu")
    return float(found["used_cpu_user"] + found["used_cpu_sys"])


class Stopwatch:
    """First ``task_prerun`` to the ``expected``-th successful ``task_postrun``.

    Records ``time.monotonic`` and the usage of the process (the worker's
    consumer, pool and heartbeat threads; the main thread only waits) at both
    ends.
    """

    def __init__(self) -> None:
        self.expected = 0
        self.first = self.last = 0.0
        self.first_usage = self.last_usage = Usage(0.0, 0)
        self.done = threading.Event()
        self._ended = itertools.count(1)
        signals.task_prerun.connect(self._on_prerun, weak=False)
        signals.task_postrun.connect(self._on_postrun, weak=False)

    def reset(self, expected: int) -> None:
        self.expected = expected
        self.first = self.last = 0.0
        self._ended = itertools.count(1)
        self.done.clear()

    def _on_prerun(self, **_: Any) -> None:
        if not self.first:
            self.first, self.first_usage = time.monotonic(), Usage.now()

    def _on_postrun(self, state: str | None = None, **_: Any) -> None:
        # A run the lock nodes sent back for a retry (a node timeout on a
        # loaded machine) ends again later: only successes count.
        if state != "SUCCESS":
            return
        # next() on itertools.count is atomic: no lock among the pool threads.
        if next(self._ended) == self.expected:
            self.last, self.last_usage = time.monotonic(), Usage.now()
            self.done.set()


@dataclass(frozen=True)
class Span:
    """What the worker measured: first task started to the N-th successful one ended."""

    elapsed: float  # seconds
    cpu: float  # CPU seconds of the worker in that time
    switches: int  # its voluntary context switches in that time


@dataclass(frozen=True)
class Run:
    tasks: int
    worker_elapsed: float  # first task started to last result stored
    worker_cpu: float  # CPU seconds of the worker process in that time
    worker_switches: int  # its voluntary context switches in that time
    node_cpu: float  # CPU seconds of the lock nodes while the worker ran
    publish_elapsed: float

    @property
    def per_second(self) -> float:
        return self.tasks / self.worker_elapsed

    @property
    def published_per_second(self) -> float:
        return self.tasks / self.publish_elapsed


class Bench:
    def __init__(self, broker_url: str, servers: list[Any], count: int) -> None:
        node_urls = [server.url for server in servers]
        self.servers = servers
        self.count = count
        backend = broker_url.rsplit("/", 1)[0] + "/1"  # results in their own database
        self.results = redis.Redis.from_url(backend)
        self.nodes = [redis.Redis.from_url(url) for url in node_urls]
        self.workers = {n: make_app(broker_url, backend, node_urls[:n]) for n in (1, 3)}
        self.publishers = {n: make_app(broker_url, None, node_urls[:n]) for n in (1, 3)}
        self.stopwatch = Stopwatch()

    def run(self, variant: Variant) -> Run:
        self.results.flushdb()
        for node in self.nodes:
            node.flushdb()
        publish = self.publishers[variant.nodes].tasks[variant.task].apply_async
        began = time.monotonic()
        for n in range(self.count):
            publish((n,))
        publish_elapsed = time.monotonic() - began

        nodes = self.nodes[: variant.nodes]
        if variant.paused:
            nodes = nodes[:-1]  # a stopped server tells nothing; resumed before the check
        node_cpu = sum(server_cpu(node) for node in nodes)
        if variant.paused:
            self.servers[variant.nodes - 1].pause()
        try:
            span = self.drain(variant)
        finally:
            if variant.paused:
                self.servers[variant.nodes - 1].resume()
        node_cpu = sum(server_cpu(node) for node in nodes) - node_cpu
        self.check(variant)
        return Run(
            self.count,
            worker_elapsed=span.elapsed,
            worker_cpu=span.cpu,
            worker_switches=span.switches,
            node_cpu=node_cpu,
            publish_elapsed=publish_elapsed,
        )

    def drain(self, variant: Variant) -> Span:
        """Start a worker, wait until it has run every task, stop it."""
        self.stopwatch.reset(self.count)
        with start_worker(
            self.workers[variant.nodes],
            pool="threads",
            concurrency=CONCURRENCY,
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=30,
            queues=[QUEUE],
        ):
            if not self.stopwatch.done.wait(120):
                raise RuntimeError(f"{variant.name}: the worker did not finish the tasks")
        watch = self.stopwatch
        return Span(
            elapsed=watch.last - watch.first,
            cpu=watch.last_usage.cpu - watch.first_usage.cpu,
            switches=watch.last_usage.switches - watch.first_usage.switches,
        )

    def check(self, variant: Variant) -> None:
        """Every task ran once and succeeded, and no lock key is left.

        Only lock keys count: fencing buckets, a singleton's arguments and
        done marks (left for re-delivered copies) are no locks and expire.
        """
        keys = list(self.results.scan_iter("celery-task-meta-*", count=1000))
        states = [json.loads(raw)["status"] for raw in self.results.mget(keys)] if keys else []
        succeeded = states.count("SUCCESS")
        if len(keys) != self.count or succeeded != self.count:
            others = sorted({state for state in states if state != "SUCCESS"})
            raise RuntimeError(
                f"{variant.name}: {len(keys)} results, {succeeded} successes, {self.count} "
                f"expected; other states: {others}"
            )
        # A node that was paused still runs the acquisitions and releases
        # queued for it as it resumes: its keys are not looked at.
        checked = self.nodes[: variant.nodes - 1 if variant.paused else variant.nodes]
        left = [
            (index, key)
            for index, node in enumerate(checked)
            for key in node.scan_iter(count=1000)
            if left_behind(key.decode())
        ]
        if left:
            shown = [
                (index, key, checked[index].type(key), _contents(checked[index], key))
                for index, key in left[:3]
            ]
            raise RuntimeError(
                f"{variant.name}: {len(left)} keys left on the lock nodes "
                f"(node, key, type, contents): {shown}"
            )

    def close(self) -> None:
        for app in [*self.workers.values(), *self.publishers.values()]:
            app_state.forget(app)
            app.close()


class ProcessBench(Bench):
    """The worker in its own process: ``celery worker --pool prefork`` or ``gevent``.

    Its app is ``_task_worker.py``'s, the same tasks as the threads pool's;
    the worker stamps the span it ran in the broker's server (database 2).
    """

    def __init__(self, broker_url: str, servers: list[Any], count: int, pool: str) -> None:
        super().__init__(broker_url, servers, count)  # its in-process worker apps stay unused
        self.pool = pool
        self.node_urls = [server.url for server in servers]
        server = broker_url.rsplit("/", 1)[0]
        self.stamps = redis.Redis.from_url(f"{server}/2")
        self.files = tempfile.TemporaryDirectory(prefix="task-bench-")
        self.log = Path(self.files.name) / "worker.log"
        path = os.environ.get("PYTHONPATH")
        self.env = {
            **os.environ,
            "PYTHONPATH": f"{HERE}{os.pathsep}{path}" if path else str(HERE),
            "BENCH_BROKER": broker_url,
            "BENCH_BACKEND": f"{server}/1",
            "BENCH_STAMPS": f"{server}/2",
            "BENCH_TASKS": str(count),
        }

    def drain(self, variant: Variant) -> Span:
        """Start ``celery worker``, wait for its N-th successful task, stop it."""
        self.stamps.flushdb()
        command = [
            *(sys.executable, "-m", "celery", "-A", "_task_worker", "worker"),
            *("--pool", self.pool, "--concurrency", str(POOLS[self.pool])),
            *("--queues", QUEUE, "--loglevel", "WARNING", "--hostname", f"bench-{self.pool}@%h"),
            *("--without-heartbeat", "--without-mingle", "--without-gossip"),
        ]
        env = {**self.env, "BENCH_NODES": ",".join(self.node_urls[: variant.nodes])}
        with self.log.open("wb") as log:
            worker = subprocess.Popen(
                command,
                cwd=HERE,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its pool's processes stopped with it
            )
            try:
                last = self.wait_last(worker, variant)
            finally:
                self.stop(worker)
        first = json.loads(self.stamps.get("first") or "{}")
        return Span(
            elapsed=last["time"] - first["time"],
            cpu=last["cpu"] - first["cpu"],
            switches=last["switches"] - first["switches"],
        )

    def wait_last(self, worker: subprocess.Popen[bytes], variant: Variant) -> dict[str, Any]:
        """The worker's stamp at its N-th successful task."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = self.stamps.blpop(["last"], timeout=1)
            if found is not None:
                return dict(json.loads(found[1]))
            if worker.poll() is not None:
                break
        raise RuntimeError(
            f"{variant.name}: the worker did not finish the tasks; its log:\n"
            + self.log.read_text(errors="replace")[-3000:]
        )

    @staticmethod
    def stop(worker: subprocess.Popen[bytes]) -> None:
        """A warm shutdown (every task has ended); a kill if it takes too long."""
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(30)
                return
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)

    def close(self) -> None:
        super().close()
        self.stamps.close()
        self.files.cleanup()


def measure(bench: Bench, chosen: list[Variant], rounds: int) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {variant.name: [] for variant in chosen}
    for round_number in range(rounds):
        order = chosen if round_number % 2 == 0 else chosen[::-1]  # no variant always first
        for variant in order:
            runs[variant.name].append(bench.run(variant))
        progress(f"round {round_number + 1}/{rounds} done")
    return runs


# -- report -------------------------------------------------------------------------


def best(runs: list[Run]) -> float:
    return max(run.per_second for run in runs)


def median(runs: list[Run]) -> float:
    return statistics.median(run.per_second for run in runs)


def per_task(runs: list[Run], amount: Callable[[Run], float]) -> float:
    """Median over the rounds of ``amount(run)`` divided by the tasks run."""
    return statistics.median(amount(run) / run.tasks for run in runs)


def results_table(runs: dict[str, list[Run]], markdown: bool) -> str:
    plain_best, plain_median = best(runs[PLAIN]), median(runs[PLAIN])
    rows = [
        [
            name,
            f"{best(found):,.0f}",
            f"{median(found):,.0f}",
            f"{best(found) / plain_best:.2f}x",
            f"{median(found) / plain_median:.2f}x",
            f"{per_task(found, lambda run: run.worker_cpu) * 1e6:,.0f}",
            f"{per_task(found, lambda run: run.worker_switches):.0f}",
            f"{per_task(found, lambda run: run.node_cpu) * 1e6:,.0f}",
            f"{statistics.median(run.published_per_second for run in found):,.0f}",
        ]
        for name, found in runs.items()
    ]
    header = [
        "task",
        "tasks/s best",
        "tasks/s median",
        "vs plain, best",
        "vs plain, median",
        "worker CPU µs/task",
        "worker thread switches/task",
        "lock-node CPU µs/task",
        "published/s",
    ]
    return table(header, rows, markdown)


def paired(runs: dict[str, list[Run]], name: str, baseline: str) -> list[float]:
    """``name``'s tasks/s over ``baseline``'s, round by round (one round runs both)."""
    return sorted(
        ours.per_second / theirs.per_second
        for ours, theirs in zip(runs[name], runs[baseline], strict=True)
    )


def targets(runs: dict[str, list[Run]]) -> list[list[str]]:
    rows = []
    for name, goal in ((LOCKED_1, BY_HAND_GOAL_1), (LOCKED_3, BY_HAND_GOAL_3)):
        ratios = paired(runs, name, BY_HAND)
        middle = statistics.median(ratios)
        rows.append(
            [
                f"{name}: tasks/s ≥ {goal}x {BY_HAND}, median of the rounds' ratios",
                f"{middle:.2f}x ({ratios[0]:.2f}x to {ratios[-1]:.2f}x)",
                verdict(middle >= goal),
            ]
        )
    for name, goal in (
        (LOCKED_1, GOAL_1),
        (LOCKED_3, GOAL_3),
        (LIMITED_1, GOAL_1),
        (LIMITED_3, GOAL_3),
    ):
        if name not in runs:  # not measured with this pool
            continue
        ratio = best(runs[name]) / best(runs[PLAIN])
        measured = f"{ratio:.2f}x (median {median(runs[name]) / median(runs[PLAIN]):.2f}x)"
        rows.append([f"{name}: tasks/s ≥ {goal}x plain", measured, verdict(ratio >= goal)])
    for peer in (ONCE, SINGLETON):
        if peer not in runs:
            continue
        for name in (LOCKED_1, LOCKED_3):
            ours, theirs = best(runs[name]), best(runs[peer])
            rows.append(
                [
                    f"{name}: ratio to plain ≥ {peer}'s",
                    f"{ours / best(runs[PLAIN]):.2f}x vs {theirs / best(runs[PLAIN]):.2f}x",
                    verdict(ours >= theirs),
                ]
            )
    ratio = best(runs[LOCKED_3_PAUSED]) / best(runs[LOCKED_3])
    middle = median(runs[LOCKED_3_PAUSED]) / median(runs[LOCKED_3])
    measured = f"{ratio:.2f}x (median {middle:.2f}x)"
    rows.append(
        [
            f"{LOCKED_3_PAUSED}: tasks/s ≥ {PAUSED_GOAL}x healthy 3 nodes",
            measured,
            verdict(ratio >= PAUSED_GOAL),
        ]
    )
    return rows


def package_version(name: str) -> str:
    try:
        return f"{name} {version(name)}"
    except PackageNotFoundError:
        return f"{name} not installed"


def main() -> None:
    options = parser(__doc__.split("\n\n")[0])
    options.add_argument(
        "--tasks", type=int, metavar="N", help="tasks per run (default 1,500; 300 with --quick)"
    )
    options.add_argument(
        "--pool",
        choices=list(POOLS),
        default="threads",
        help="the worker's pool: threads (default; 4, in this process), prefork (2) or "
        "gevent (100), each of these two a celery worker process of its own",
    )
    args = options.parse_args()
    count, rounds = args.tasks or (300 if args.quick else 1500), 3
    concurrency = POOLS[args.pool]
    # The concurrency limit is the threads pool's: with more runs at once, its
    # variants would measure runs sent back for a full limit, not a slot's cost.
    chosen = [
        variant
        for variant in variants()
        if variant.task != "bench.limited" or concurrency <= CONCURRENCY
    ]
    began = time.monotonic()
    with redis_servers(4) as servers:
        broker = servers.urls[0]
        about = environment(
            broker,
            package_version("celery"),
            package_version("kombu"),
            package_version("celery-once"),
            package_version("celery-singleton"),
            *([] if args.pool == "threads" else [package_version(POOL_PACKAGES[args.pool])]),
        )
        if args.pool == "threads":
            bench = Bench(broker, servers.servers[1:], count)
        else:
            bench = ProcessBench(broker, servers.servers[1:], count, args.pool)
        try:
            runs = measure(bench, chosen, rounds)
        finally:
            bench.close()
    save(args.save, about, pool=args.pool, runs=runs)
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    if args.pool == "threads":
        print(f"{heading}Tasks per second through one worker\n")
        print(
            f"{count:,} tasks per run, {rounds} rounds with the variants interleaved; worker: "
            f"threads pool, concurrency {CONCURRENCY}, Redis broker and result backend.\n"
        )
    else:
        print(f"{heading}Tasks per second through one worker, {args.pool} pool\n")
        print(
            f"{count:,} tasks per run, {rounds} rounds with the variants interleaved; worker: "
            f"{args.pool} pool, concurrency {concurrency}, a celery worker process of its own, "
            "Redis broker and result backend.\n"
        )
    print(results_table(runs, args.markdown))
    if args.pool == "threads":
        print(
            "\nworker CPU and thread switches: the worker process (all its threads), per task; "
            "lock-node CPU: the redis-server lock nodes, per task; medians over the rounds."
        )
    else:
        print(
            "\nworker CPU and thread switches: the worker's processes (main process and pool "
            "processes, all their threads), per task; lock-node CPU: the redis-server lock "
            "nodes, per task; medians over the rounds. The worker counts its successful tasks "
            "with one INCR per task on the broker's server, in every variant's figures."
        )
    if args.pool == "gevent":
        print(
            "\ngevent: Celery builds a result backend (a Redis client, a connection) for every "
            "task, its app's backend being thread-local and gevent's greenlets its threads "
            "(celery/celery#7960): in every variant's figures."
        )
    if len(chosen) < len(variants()):
        print(
            f"\nNot measured with concurrency {concurrency}: the concurrency_limit="
            f"{CONCURRENCY} variants (the limit would be full; they measure a slot's cost)"
        )
    peers = {"celery-once": QueueOnce, "celery-singleton": Singleton}
    missing = [name for name, base in peers.items() if base is None]
    if missing:
        print(f"\nNot measured (not installed): {', '.join(missing)}")
    title = "Targets" if args.pool == "threads" else f"Targets, {args.pool} pool"
    print(f"\n{heading}{title}\n")
    print(table(["target", "measured", "result"], targets(runs), args.markdown))


if __name__ == "__main__":
    main()
