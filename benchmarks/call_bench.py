"""Call benchmark: CPU per locked task, split into the lock and the Celery layer around it.

No broker and no worker: each task body is called the way Celery's tracer
calls it (``task.__call__`` with a pushed request), in one thread, on its own
``redis-server`` processes (free 127.0.0.1 ports). Measured in one run, as CPU
time of the process (``time.process_time``) per call:

1. a plain ``@app.task`` (the tracer's share: pushing the request; Celery
   then calls the task's ``run``, or its ``__call__`` where its class defines
   one, as ``LockedTask`` does);
2. a ``LockedTask`` with ``lock_key="bench:{n}"`` (a distinct lock per call),
   on 1 lock node and on 3;
3. the lock alone: ``redlock.lock(name)``, ``acquire()``, ``release()`` with
   the same ttl and owner a task uses, on 1 and on 3 nodes;
4. redis-py's naive pair on one node: ``SET key token NX PX ttl`` and an
   ``EVALSHA`` compare-and-delete, the floor the lock pair is held to.

The Celery layer of a locked task (key rendering, policy lookups, the run's
bookkeeping, the Lock object, heartbeat registration and signals) is
measured directly: (2) on 1 node with ``Lock.acquire`` and ``Lock.release``
replaced by stand-ins that do no I/O, minus (1). (2) minus (1) minus (3)
is shown too: it is larger, as the task's code and the lock's share the
CPU's caches.
Variants run interleaved; the round with the least CPU per call counts.
``--profile`` prints a cProfile of the locked task on 1 node instead, then where a
lock pair's time goes on 1 and 3 nodes beside the naive pair's (own time by part).

Usage::

    python benchmarks/call_bench.py             # about 30 seconds
    python benchmarks/call_bench.py --quick
    python benchmarks/call_bench.py --profile   # where the time goes
"""

from __future__ import annotations

import cProfile
import dataclasses
import itertools
import multiprocessing
import os
import pstats
import secrets
import time
import timeit
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from _common import environment, parser, progress, redis_servers, save, table, verdict
from celery import Celery, Task
from celery.app.trace import task_has_custom

from celery_redlock import LockedTask, RateLimiter, Redlock, signals
from celery_redlock._layout import LockValue
from celery_redlock.lock.lock import Lock
from celery_redlock.lock.renewal import heartbeat
from celery_redlock.tasks import app_state
from celery_redlock.tasks.run import TaskRun

TTL = 60.0
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
PLAIN = "plain task"
LOCKED = "LockedTask, {} node(s)"
LOCK = "lock pair alone, {} node(s)"
STUBBED = "LockedTask, 1 node, lock round trips stubbed out"
NAIVE = "redis-py naive pair, 1 node"
#: Celery-layer CPU per locked task, excluding the lock's own work (µs).
LAYER_GOAL = 40.0
#: Locks held and renewed together to measure a renewal's cost per lock.
RENEWED_LOCKS = 2000
#: Client processes driving one node as hard as they can.
SATURATING_PROCESSES = 4
#: The commands our clients send: everything else a node runs is inside a script.
SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro")


def make_app(nodes: list[str]) -> Celery:
    app = Celery("callbench", broker="memory://", set_as_current=False)
    app.conf.update(redlock_nodes=nodes, redlock_key_prefix="callbench:")

    @app.task(name="bench.plain", shared=False)
    def plain(n: int) -> int:
        return n

    @app.task(base=LockedTask, name="bench.locked", lock_key="bench:{n}", shared=False)
    def locked(n: int) -> int:
        return n

    return app


def traced(task: Any) -> Callable[[], object]:
    """One call of ``task`` as Celery's tracer makes it: a request pushed, then ``__call__``."""
    numbers = itertools.count()
    hostname = "bench@host"
    # What the tracer calls: the task when its class defines __call__, else its run.
    call = task if task_has_custom(task, "__call__") else task.run

    def once() -> None:
        n = next(numbers)
        task.push_request(
            id=str(uuid.uuid4()),
            args=(n,),
            kwargs={},
            called_directly=False,
            hostname=hostname,
            retries=0,
            delivery_info={},
        )
        try:
            if call(n) != n:
                raise RuntimeError(f"{task.name}: wrong result")
        finally:
            task.pop_request()

    return once


def without_round_trips(operation: Callable[[], object]) -> Callable[[], object]:
    """``operation`` with ``Lock.acquire`` and ``Lock.release`` doing no I/O.

    The stand-ins leave the lock as a granted acquisition and a confirmed
    release would; everything else the task does around them is real.
    """

    def acquire(lock: Lock, blocking: bool = True, timeout: float | None = None) -> bool:
        lock._value = "stand-in"
        lock._valid_until = time.monotonic() + lock.ttl
        lock._fencing_token = 1
        return True

    def release(lock: Lock) -> bool:
        lock._forget()
        return True

    real = Lock.acquire, Lock.release

    def once() -> None:
        Lock.acquire, Lock.release = acquire, release  # type: ignore[method-assign]
        try:
            operation()
        finally:
            Lock.acquire, Lock.release = real  # type: ignore[method-assign]

    return once


def lock_pair(app: Celery) -> Callable[[], object]:
    """What a task's run lock does with the lock itself, nothing else."""
    redlock = app_state.redlock_for(app)
    numbers = itertools.count()
    owner = LockValue.owner_text(str(uuid.uuid4()), "bench@host:1")

    def once() -> None:
        lock = redlock.lock(f"pair:{next(numbers)}", ttl=TTL, owner=owner)
        if not lock.acquire(blocking=False):
            raise RuntimeError("lock pair: not acquired")
        if not lock.release():
            raise RuntimeError("lock pair: release found the lock gone")

    return once


def naive_pair(url: str) -> Callable[[], object]:
    client = redis.Redis.from_url(url)
    sha = client.script_load(COMPARE_AND_DELETE)
    ttl_ms = int(TTL * 1000)
    numbers = itertools.count()

    def once() -> None:
        key, token = f"naive:{next(numbers)}", secrets.token_hex(16)
        if not client.set(key, token, nx=True, px=ttl_ms):
            raise RuntimeError("naive pair: SET NX failed")
        client.evalsha(sha, 1, key, token)

    return once


# -- what one operation costs a node --------------------------------------------------


@dataclass(frozen=True)
class NodeUse:
    """What one operation cost each node, on average over the nodes it used."""

    calls: float  # commands the client sent (EVALSHA, EVAL)
    commands: float  # commands the node ran, those inside scripts included
    bytes_in: float  # RESP bytes the node read
    bytes_out: float  # RESP bytes the node wrote
    cpu: float  # seconds of the node's CPU (user + system)


def _counters(client: redis.Redis) -> list[float]:
    commandstats = client.info("commandstats")
    scripts = sum(commandstats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in SCRIPTS)
    calls = sum(stat["calls"] for stat in commandstats.values())
    stats, cpu = client.info("stats"), client.info("cpu")
    return [
        float(scripts),
        float(calls),
        float(stats["total_net_input_bytes"]),
        float(stats["total_net_output_bytes"]),
        float(cpu["used_cpu_user"] + cpu["used_cpu_sys"]),
    ]


def node_use(clients: list[redis.Redis], operation: Callable[[], object], count: int) -> NodeUse:
    """Per operation, per node: commands, bytes each way and CPU, from the nodes' INFO."""
    operation()
    idle = [_counters(client) for client in clients]
    before = [_counters(client) for client in clients]  # the INFO calls' own share
    for _ in range(count):
        operation()
    after = [_counters(client) for client in clients]
    shares = [
        [(a - b - (b - i)) / count for i, b, a in zip(*node, strict=True)]
        for node in zip(idle, before, after, strict=True)
    ]
    return NodeUse(*(sum(column) / len(shares) for column in zip(*shares, strict=True)))


def saturation(url: str, processes: int, seconds: float) -> dict[str, float]:
    """Lock pairs per second ``processes`` processes get from one node, and its CPU meanwhile."""
    context = multiprocessing.get_context("fork")
    done = context.Value("i", 0)
    start = context.Barrier(processes + 1)

    def worker() -> None:
        redlock = Redlock([url], key_prefix="saturate:")
        numbers = itertools.count()
        start.wait()
        stop = time.monotonic() + seconds
        pairs = 0
        while time.monotonic() < stop:
            lock = redlock.lock(f"s:{os.getpid()}:{next(numbers)}", ttl=TTL)
            lock.acquire(blocking=False)
            lock.release()
            pairs += 1
        with done.get_lock():
            done.value += pairs

    workers = [context.Process(target=worker) for _ in range(processes)]
    for process in workers:
        process.start()
    client = redis.Redis.from_url(url)
    cpu = _counters(client)[4]
    start.wait()
    began = time.monotonic()
    for process in workers:
        process.join()
    elapsed = time.monotonic() - began
    used = _counters(client)[4] - cpu
    client.close()
    return {"pairs_per_second": done.value / elapsed, "node_cpu_share": used / elapsed}


def capacity(urls: list[str], apps: dict[int, Celery], count: int) -> dict[str, Any]:
    """Node cost per locked task, per rate decision, per renewed lock; one node's ceiling."""
    found: dict[str, Any] = {}
    for nodes, app in apps.items():
        clients = [redis.Redis.from_url(url) for url in urls[:nodes]]
        found[f"locked task, {nodes} node(s)"] = node_use(
            clients, traced(app.tasks["bench.locked"]), count
        )
    clients = [redis.Redis.from_url(urls[0])]
    limiter = RateLimiter(urls[0])
    numbers = itertools.count()
    found["rate decision (1 limit, sliding)"] = node_use(
        clients, lambda: limiter.hit(f"cap:{next(numbers) % 100}", "1000000/s"), count
    )
    limiter.close()
    redlock = Redlock(urls[:3], key_prefix="held:")
    held = [redlock.lock(f"held:{index}", ttl=TTL) for index in range(RENEWED_LOCKS)]
    for lock in held:
        lock.acquire(blocking=False)
    clients = [redis.Redis.from_url(url) for url in urls[:3]]
    per_round = node_use(clients, lambda: redlock.renew(held), 5)
    found["held lock, one renewal round"] = NodeUse(
        *(value / RENEWED_LOCKS for value in dataclasses.astuple(per_round))
    )
    for lock in held:
        lock.release()
    redlock.close()
    found["saturation"] = saturation(urls[0], SATURATING_PROCESSES, 3.0)
    return found


def capacity_table(found: dict[str, Any], markdown: bool) -> str:
    rows = [
        [
            name,
            f"{use.calls:.2f}",
            f"{use.commands:.2f}",
            f"{use.bytes_in:,.0f}",
            f"{use.bytes_out:,.0f}",
            f"{use.cpu * 1e6:,.1f}",
        ]
        for name, use in found.items()
        if isinstance(use, NodeUse)
    ]
    header = ["operation", "script calls", "commands run", "bytes in", "bytes out"]
    return table([*header, "node CPU µs"], rows, markdown)


# -- the Celery layer, piece by piece ---------------------------------------------------


def pieces(app: Celery) -> dict[str, float]:
    """Seconds per call of each step the Celery layer takes around the lock (``timeit``)."""
    task = app.tasks["bench.locked"]
    task.push_request(
        id=str(uuid.uuid4()), args=(1,), kwargs={}, called_directly=False, hostname="bench@host"
    )
    try:
        policy = app_state.policy_for(task)
        assert policy is not None
        template = policy.lock.key if policy.lock is not None else None
        assert template is not None
        redlock = app_state.redlock_for(app)
        lock = redlock.lock("pieces", ttl=TTL)
        lock.acquire(blocking=False)
        run = TaskRun(task, policy, (1,), {})
        beat = heartbeat()

        def hold_and_drop() -> None:
            beat.drop(beat.hold(lock, task_id="t", on_lost=None))

        steps: dict[str, Callable[[], object]] = {
            "redlock_enabled read (enabled_for)": lambda: app_state.enabled_for(app),
            "policy and Redlock lookups (policy_for, redlock_for)": lambda: (
                app_state.policy_for(task),
                app_state.redlock_for(app),
            ),
            "direct-call check (_called_directly)": task._called_directly,
            "the run object (TaskRun)": lambda: TaskRun(task, policy, (1,), {}),
            "key rendering (lock_key template)": lambda: template.render((1,), {}),
            "owner text (task id, host, pid)": lambda: LockValue.owner_text("t", run.worker()),
            "Lock object (redlock.lock)": lambda: redlock.lock("bench:1", ttl=TTL, owner="t|w"),
            "heartbeat registration (hold + drop)": hold_and_drop,
            "two signals sent, no receivers": lambda: (
                signals.lock_acquired.send(sender=task, task_id="t", key="k", waited=0.0),
                signals.lock_released.send(sender=task, task_id="t", key="k", held=0.0),
            ),
            "Celery's request copy (Task.__call__), no longer paid": lambda: Task.__call__(task, 1),
        }
        found = {
            name: min(timeit.repeat(step, number=5000, repeat=5)) / 5000
            for name, step in steps.items()
        }
        lock.release()
    finally:
        task.pop_request()
    return found


def cpu_per_call(operation: Callable[[], object], count: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call over ``count`` calls, after a warm-up."""
    for _ in range(min(200, count)):
        operation()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        operation()
    return (time.process_time() - cpu) / count, (time.perf_counter() - wall) / count


def measure(variants: dict[str, Callable[[], object]], count: int, rounds: int) -> dict[str, Any]:
    best: dict[str, tuple[float, float]] = {}
    for round_number in range(rounds):
        names = list(variants)
        if round_number % 2:
            names.reverse()
        for name in names:
            cpu, wall = cpu_per_call(variants[name], count)
            if name not in best or cpu < best[name][0]:
                best[name] = (cpu, wall)
        progress(f"round {round_number + 1}/{rounds} done")
    return {name: {"cpu": cpu, "wall": wall} for name, (cpu, wall) in best.items()}


def _profiled(operation: Callable[[], object], count: int) -> pstats.Stats:
    """cProfile's statistics of ``count`` calls of ``operation``, after 200 to warm up."""
    for _ in range(200):
        operation()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(count):
        operation()
    profiler.disable()
    return pstats.Stats(profiler)


def profile(operation: Callable[[], object], count: int) -> None:
    stats = _profiled(operation, count)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


def _part(where: str, function: str) -> str:
    """The part of a call a profiled function belongs to."""
    if "celery_redlock/transport" in where:
        return "transport: fan-out, hub, links, RESP"
    if "celery_redlock" in where:
        return "lock: acquire, release, token, tally"
    if "socket' objects>" in function and "send" in function:
        return "socket send (system call)"
    if "socket' objects>" in function and "recv" in function:
        return "socket recv (system call, waits for the reply)"
    if "poll' objects>" in function or "select" in function:
        return "poll (system call, waits for the reply)"
    if "/redis/" in where:
        return "redis-py"
    return "the rest (builtins, os.urandom, the loop)"


def by_part(operation: Callable[[], object], count: int) -> dict[str, float]:
    """cProfile's own time (wall clock) per call of ``operation``, summed by :func:`_part`."""
    stats = _profiled(operation, count)
    parts: dict[str, float] = {}
    for (where, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        name = _part(where, function)
        parts[name] = parts.get(name, 0.0) + row[2] / count
    return parts


def print_parts(apps: dict[int, Celery], naive: Callable[[], object], count: int) -> None:
    """Where a pair's time goes: the lock pair on 1 and 3 nodes beside the naive pair."""
    columns = {
        NAIVE: by_part(naive, count),
        LOCK.format(1): by_part(lock_pair(apps[1]), count),
        LOCK.format(3): by_part(lock_pair(apps[3]), count),
    }
    names = sorted({name for parts in columns.values() for name in parts})
    rows = [
        [name, *(f"{parts.get(name, 0.0) * 1e6:,.1f}" for parts in columns.values())]
        for name in names
    ]
    rows.append(["total", *(f"{sum(parts.values()) * 1e6:,.1f}" for parts in columns.values())])
    print("\nOwn time per pair by part, cProfile (wall clock, profiler overhead included), µs\n")
    print(table(["part", *columns], rows, False))


def main() -> None:
    options = parser(__doc__.split("\n\n")[0])
    options.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the 1-node locked task, then the pairs by part",
    )
    args = options.parse_args()
    count, rounds = (1000, 3) if args.quick else (3000, 5)
    began = time.monotonic()
    with redis_servers(3) as servers:
        urls = servers.urls
        apps = {nodes: make_app(urls[:nodes]) for nodes in (1, 3)}
        try:
            if args.profile:
                profile(traced(apps[1].tasks["bench.locked"]), count)
                print_parts(apps, naive_pair(urls[0]), count)
                return
            about = environment(urls[0])
            variants: dict[str, Callable[[], object]] = {
                PLAIN: traced(apps[1].tasks["bench.plain"]),
                NAIVE: naive_pair(urls[0]),
            }
            variants[STUBBED] = without_round_trips(traced(apps[1].tasks["bench.locked"]))
            for nodes, app in apps.items():
                variants[LOCKED.format(nodes)] = traced(app.tasks["bench.locked"])
                variants[LOCK.format(nodes)] = lock_pair(app)
            found = measure(variants, count, rounds)
            parts = pieces(apps[1])
            used = capacity(urls, apps, count)
            progress("capacity done")
        finally:
            for app in apps.values():
                app_state.forget(app)
    save(args.save, about, calls=found, pieces=parts, capacity=used)
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    print(f"{heading}CPU per call, one thread, no broker\n")
    print(f"{count:,} calls per round, {rounds} rounds interleaved, least CPU round shown.\n")
    rows = [
        [name, f"{item['cpu'] * 1e6:,.1f}", f"{item['wall'] * 1e6:,.1f}"]
        for name, item in found.items()
    ]
    print(table(["call", "CPU µs per call", "wall µs per call"], rows, args.markdown))
    plain = found[PLAIN]["cpu"]
    layer = found[STUBBED]["cpu"] - plain
    checks = [
        (
            "Celery layer: CPU per locked task beyond the plain task, lock round trips "
            f"stubbed out, ≤ {LAYER_GOAL:g} µs",
            f"{layer * 1e6:,.1f} µs",
            layer * 1e6 <= LAYER_GOAL,
        )
    ]
    for nodes in (1, 3):
        rest = found[LOCKED.format(nodes)]["cpu"] - plain - found[LOCK.format(nodes)]["cpu"]
        print(
            f"\nLockedTask on {nodes} node(s) less the plain task and the lock pair measured "
            f"alone: {rest * 1e6:,.1f} µs"
        )
    pair, naive = found[LOCK.format(1)]["cpu"], found[NAIVE]["cpu"]
    checks.append(
        (
            "lock pair CPU, 1 node ≤ redis-py naive pair",
            f"{pair * 1e6:,.1f} µs vs {naive * 1e6:,.1f} µs ({pair / naive:.2f}x)",
            pair <= naive,
        )
    )
    print(f"\n{heading}The Celery layer, step by step\n")
    print("Each step alone, timeit, best of 5 x 5,000 calls; wall µs (no I/O).\n")
    rows = [[name, f"{seconds * 1e6:.2f}"] for name, seconds in parts.items()]
    print(table(["step", "µs per locked task"], rows, args.markdown))
    print(f"\n{heading}What one operation costs a lock node\n")
    print(
        "From the nodes' INFO (commandstats, stats, cpu) before and after each series, "
        "less what the INFO calls themselves cost; per node, averaged over the nodes used; "
        "commands run count those inside scripts. A renewal "
        f"round renews {RENEWED_LOCKS:,} held locks on 3 nodes; its figures are per lock.\n"
    )
    print(capacity_table(used, args.markdown))
    sat = used["saturation"]
    print(
        f"\nOne node driven by {SATURATING_PROCESSES} client processes for 3 s: "
        f"{sat['pairs_per_second']:,.0f} lock pairs/s, using {sat['node_cpu_share']:.0%} "
        "of one CPU (the clients share the machine's CPUs with it)."
    )
    print(f"\n{heading}Targets\n")
    rows = [[goal, measured, verdict(reached)] for goal, measured, reached in checks]
    print(table(["target", "measured", "result"], rows, args.markdown))


if __name__ == "__main__":
    main()
