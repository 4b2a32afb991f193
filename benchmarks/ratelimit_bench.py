"""Rate-limit decisions from one process, against a local redis-server, with baselines.

In one run and on one server, for each workload, variants run interleaved:

* ``bare EVALSHA``: a trivial script (``return 1``) through a plain redis-py
  client: the floor of any Lua-based decision from Python;
* ``celery_redlock``: ``RateLimiter.hit`` with each algorithm (``sliding``,
  ``gcra``, ``fixed``), for one limit, for two limits in one call (the key's
  own and a global one) and for 16 limits (the most one call accepts);
* ``limits``: the ``limits`` package's ``MovingWindowRateLimiter`` on a
  ``RedisStorage``, for one limit, and for two limits as two calls (it has
  no atomic multi-limit hit).

For each: decisions per second, wall and client CPU microseconds per
decision, and the server's own microseconds per script call (``INFO
commandstats``). Workloads: ``hot key`` hammers one key far over its limit
(100/s, so most decisions are refusals); ``many keys`` spreads hits over 1,000
keys that all stay under their limit (every decision admits). The best of
``--rounds`` rounds counts, which damps the noise of a busy machine.

Then the worst accepted inputs, each timed on the server (``SLOWLOG`` with no
threshold): the largest cost, 16 limits at once, full sliding logs.

Usage::

    python benchmarks/ratelimit_bench.py            # about 2 minutes
    python benchmarks/ratelimit_bench.py --quick    # about 20 seconds
    python benchmarks/ratelimit_bench.py --markdown # tables for docs/rate-limiting.md
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version

import redis
from _common import environment, parser, progress, redis_servers, save, table

from celery_redlock import RateLimiter
from celery_redlock.ratelimit import Limit
from celery_redlock.ratelimit.rates import MAX_LIMIT, Rate

try:
    import limits
    from limits.storage import RedisStorage
    from limits.strategies import MovingWindowRateLimiter
except ImportError:  # pragma: no cover - told to the user below
    limits = None

TRIVIAL = "return 1"
#: The other limits of a multi-limit decision: 600,000 per minute (gcra's fastest).
GLOBAL = Rate(600_000, 60.0)


@dataclass(frozen=True)
class Workload:
    name: str
    keys: int
    limit: int
    period: float


WORKLOADS = [
    Workload("hot key", keys=1, limit=100, period=1.0),
    Workload("many keys", keys=1000, limit=100, period=60.0),
]
ALGORITHMS = ["sliding", "gcra", "fixed"]
SHAPES = {"1 limit": 1, "2 limits": 2, "16 limits": 16}


@dataclass(frozen=True)
class Measure:
    """One variant's best round."""

    per_second: float
    wall_us: float  # per decision
    cpu_us: float  # client CPU per decision
    server_us: float  # server time per script call (commandstats)
    calls_per_decision: int  # script calls per decision (limits x2: 2)


Calls = Callable[[int], None]


def key_names(workload: Workload, tag: str) -> list[str]:
    return [f"{tag}:{i}" for i in range(workload.keys)]


def bare(url: str, workload: Workload) -> tuple[Calls, int]:
    client = redis.Redis.from_url(url)
    sha = client.script_load(TRIVIAL)
    evalsha = client.evalsha
    keys = key_names(workload, "bare")
    position = 0

    def calls(n: int) -> None:
        nonlocal position
        for _ in range(n):
            evalsha(sha, 1, keys[position % len(keys)])
            position += 1

    return calls, 1


def ours(url: str, workload: Workload, algorithm: str, shape: int) -> tuple[Calls, int]:
    limiter = RateLimiter(url, algorithm=algorithm)  # type: ignore[arg-type]
    hit, limit, period = limiter.hit, workload.limit, workload.period
    names = key_names(workload, "ours")
    others = [Limit(f"global:{i}", GLOBAL) for i in range(shape - 1)]
    lists = [[Limit(name, Rate(limit, period)), *others] for name in names] if others else []
    position = 0

    def calls(n: int) -> None:
        nonlocal position
        for _ in range(n):
            if lists:
                hit(lists[position % len(lists)])
            else:
                hit(names[position % len(names)], limit, period)
            position += 1

    return calls, 1


def theirs(url: str, workload: Workload, shape: int) -> tuple[Calls, int]:
    assert limits is not None
    limiter = MovingWindowRateLimiter(RedisStorage(url))
    item = limits.RateLimitItemPerSecond(workload.limit, int(workload.period))
    shared = limits.RateLimitItemPerMinute(GLOBAL.limit)
    keys = key_names(workload, "limits")
    hit = limiter.hit
    position = 0

    def calls(n: int) -> None:
        nonlocal position
        for _ in range(n):
            if hit(item, keys[position % len(keys)]) and shape == 2:
                hit(shared, "global")
            position += 1

    return calls, shape


def variants(workload: Workload) -> dict[str, Callable[[str], tuple[Calls, int]]]:
    made: dict[str, Callable[[str], tuple[Calls, int]]] = {
        "bare EVALSHA (return 1)": lambda url: bare(url, workload)
    }
    for shape_name, shape in SHAPES.items():
        for algorithm in ALGORITHMS:
            made[f"celery_redlock {algorithm}, {shape_name}"] = (
                lambda url, algorithm=algorithm, shape=shape: ours(url, workload, algorithm, shape)
            )
    if limits is not None:
        made["limits MovingWindow, 1 limit"] = lambda url: theirs(url, workload, 1)
        made["limits MovingWindow, 2 limits (2 calls)"] = lambda url: theirs(url, workload, 2)
    return made


def server_usec(client: redis.Redis) -> tuple[int, int]:
    """Script calls and their total microseconds on the server so far."""
    stats = client.info("commandstats")
    calls = usec = 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        entry = stats.get(name, {})
        calls += int(entry.get("calls", 0))
        usec += int(entry.get("usec", 0))
    return calls, usec


def measure(make: Callable[[str], tuple[Calls, int]], url: str, duration: float) -> Measure:
    admin = redis.Redis.from_url(url)
    admin.flushall()
    calls, per_decision = make(url)
    calls(200)  # warm-up: connections, script caches
    admin.config_resetstat()
    batch, done = 100, 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        calls(batch)
        done += batch
        wall = time.perf_counter() - wall0
        if wall >= duration:
            break
    cpu = time.process_time() - cpu0
    script_calls, usec = server_usec(admin)
    admin.close()
    return Measure(
        per_second=done / wall,
        wall_us=wall / done * 1e6,
        cpu_us=cpu / done * 1e6,
        server_us=usec / script_calls if script_calls else float("nan"),
        calls_per_decision=per_decision,
    )


def run(url: str, duration: float, rounds: int) -> dict[str, dict[str, Measure]]:
    best: dict[str, dict[str, Measure]] = {}
    for round_number in range(rounds):
        for workload in WORKLOADS:
            made = variants(workload)
            names = list(made)
            if round_number % 2:
                names.reverse()  # no variant always runs first
            found = best.setdefault(workload.name, {})
            for name in names:
                result = measure(made[name], url, duration)
                if name not in found or result.per_second > found[name].per_second:
                    found[name] = result
        progress(f"round {round_number + 1}/{rounds} done")
    return best


def worst_inputs(url: str) -> list[tuple[str, int]]:
    """Server microseconds of the most expensive decisions the limiter accepts."""
    admin = redis.Redis.from_url(url)
    admin.flushall()
    admin.config_set("slowlog-max-len", 100000)
    limiter = RateLimiter(url)
    full = [Limit(f"full:{i}", Rate(1_000_000, 1.0)) for i in range(16)]
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # a member in most of each log's 1,000 buckets
        limiter.hit(full)
        time.sleep(0.0005)
    members = admin.zcard(limiter.state_key("full:0"))
    biggest = Rate(MAX_LIMIT, 1000.0)
    cases: list[tuple[str, Callable[[], object]]] = [
        (
            f"16 sliding limits, {members} members each, refused (retry_after searched)",
            lambda: limiter.hit(full, cost=1_000_000),
        ),
        (f"16 sliding limits, {members} members each, admitted", lambda: limiter.hit(full)),
        (
            "1 sliding limit, cost 1,000,000,000 (the largest)",
            lambda: limiter.hit("big", biggest, cost=MAX_LIMIT),
        ),
        (
            "16 sliding limits, cost 1,000,000,000",
            lambda: limiter.hit([Limit(f"big:{i}", biggest) for i in range(16)], cost=MAX_LIMIT),
        ),
        (
            "16 gcra limits, cost 10,000",
            lambda: limiter.hit(
                [Limit(f"g:{i}", Rate(10_000, 1.0), "gcra") for i in range(16)], cost=10_000
            ),
        ),
        (
            "16 fixed limits, cost 1,000,000,000",
            lambda: limiter.hit(
                [Limit(f"f:{i}", biggest, "fixed") for i in range(16)], cost=MAX_LIMIT
            ),
        ),
    ]
    found = []
    for name, call in cases:
        admin.config_set("slowlog-log-slower-than", 0)
        admin.slowlog_reset()
        call()
        entries = [
            entry["duration"]
            for entry in admin.slowlog_get(100)
            if entry["command"].split(b" ", 1)[0].upper() in (b"EVALSHA", b"EVAL")
        ]
        found.append((name, max(entries)))
    admin.config_set("slowlog-log-slower-than", 10000)
    limiter.close()
    admin.close()
    return found


def results_table(best: dict[str, dict[str, Measure]], markdown: bool) -> str:
    header = [
        "workload",
        "variant",
        "decisions/s",
        "µs wall",
        "µs CPU (client)",
        "µs server per call",
        "wall vs bare",
    ]
    rows = []
    for workload, found in best.items():
        floor = found["bare EVALSHA (return 1)"]
        for name, result in found.items():
            rows.append(
                [
                    workload,
                    name,
                    f"{result.per_second:,.0f}",
                    f"{result.wall_us:,.0f}",
                    f"{result.cpu_us:,.0f}",
                    f"{result.server_us:,.1f}",
                    f"{result.wall_us / floor.wall_us:.2f}x",
                ]
            )
    return table(header, rows, markdown)


def main() -> None:
    arguments = parser(__doc__.split("\n\n")[0])
    arguments.add_argument("--duration", type=float, help="seconds per measurement")
    arguments.add_argument("--rounds", type=int, help="measurements per variant (best counts)")
    args = arguments.parse_args()
    duration = args.duration or (0.2 if args.quick else 0.6)
    rounds = args.rounds or (1 if args.quick else 3)
    if limits is None:
        print("limits is not installed: pip install -e '.[bench]'", file=sys.stderr)
    began = time.monotonic()
    with redis_servers(1) as servers:
        url = servers.urls[0]
        about = environment(
            url, f"limits {version('limits')}" if limits is not None else "limits not installed"
        )
        best = run(url, duration, rounds)
        worst = worst_inputs(url)
    save(args.save, about, best=best, worst=worst)
    heading = "### " if args.markdown else ""
    print(f"Measured on: {about}; run took {time.monotonic() - began:.0f} s\n")
    print(f"{heading}Decisions from one process\n")
    print(f"{rounds} round(s) of {duration:g} s per variant, interleaved; best round shown.\n")
    print(results_table(best, args.markdown))
    print(f"\n{heading}Worst accepted inputs, server time of one decision\n")
    rows = [[name, f"{us:,}"] for name, us in worst]
    print(table(["decision", "µs on the server"], rows, args.markdown))


if __name__ == "__main__":
    main()
