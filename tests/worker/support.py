"""What the worker tier's tests share: the app and tasks they run, and how to watch them.

``create_app(broker, nodes, witness)`` builds a fresh app; a worker started
with ``celery -A tests.worker.support worker`` builds it from the
``CR_BROKER``, ``CR_NODES`` (comma separated) and ``CR_WITNESS`` environment
variables. Tasks write what they do to the witness node, a Redis outside the
lock's node set, so a test can check overlaps after the fact. The helpers
below start workers (:func:`in_process_worker`, :class:`WorkerProcess`) and
read what the tasks did (:func:`overlaps`, :func:`wait_for_event`, ...).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.beat import Scheduler
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.signals import after_task_publish, task_prerun, worker_ready

from celery_redlock import LockedTask, Redlock, setup
from celery_redlock._layout import semaphore_keys
from celery_redlock.errors import LockLost
from celery_redlock.signals import lock_busy, lock_lost
from celery_redlock.tasks.run_endings import BUSY_HEADER
from celery_redlock.testing import RedisServer

#: The repository's root: where ``celery -A tests.worker.support`` runs.
ROOT = Path(__file__).resolve().parents[2]

#: The apps' redlock_node_timeout: the 50 ms default is less than a loaded CI
#: machine's scheduling delay (seen: a first call's three connections not all
#: opened in time). Below half the shortest lifetime the tasks use (a 0.5 s
#: beat window), and tests about timeouts set their own.
APP_NODE_TIMEOUT = 0.2

#: The node timeout of the tests' own looks at the nodes (free_now, free_slots):
#: they check what the workers did, not how fast a node answers.
LOOK_NODE_TIMEOUT = 1.0


class Witness:
    """Records task events on the witness node."""

    def __init__(self, url: str) -> None:
        # Shared by every run of a worker: up to 500 greenlets at once in a
        # gevent worker, more than redis-py's default pool of 100 allows. The
        # bodies block on it (BLPOP up to 60 s): no socket timeout shorter than that.
        self.client = redis.Redis.from_url(url, max_connections=2000, socket_timeout=120)

    def event(self, kind: str, key: str, task_id: str | None, **extra: Any) -> None:
        fields = " ".join(f"{name}={value}" for name, value in extra.items())
        self.client.rpush(
            "events", f"{kind} {key} {task_id} {time.monotonic():.6f} {os.getpid()} {fields}"
        )

    def enter(self, key: str, task_id: str | None) -> None:
        if self.client.incr(f"inside:{key}") > 1:
            self.client.incr("overlaps")
        self.event("enter", key, task_id)

    def leave(self, key: str, task_id: str | None) -> None:
        self.event("exit", key, task_id)
        self.client.decr(f"inside:{key}")

    def events(self) -> list[list[str]]:
        return [entry.decode().split() for entry in self.client.lrange("events", 0, -1)]


class FakeApi:
    """An API that refuses calls above a limit it keeps to itself, with a Retry-After.

    The hidden limit (``api:hidden`` on the witness, calls per second, 0 for
    none) is a sliding log of one second on the witness's clock; ``api:refuse``
    set to N refuses the next N calls for ``api:retry_after`` seconds each.
    Every call is recorded as an event: ``call api <task id> <time> <pid> ok=1``.
    """

    SCRIPT = """
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if redis.call('DECR', 'api:refuse') >= 0 then
        return tostring(redis.call('GET', 'api:retry_after'))
    end
    redis.call('SET', 'api:refuse', 0)
    local hidden = tonumber(redis.call('GET', 'api:hidden') or '0')
    redis.call('ZREMRANGEBYSCORE', 'api:log', '-inf', now - 1000000)
    if hidden > 0 and redis.call('ZCARD', 'api:log') >= hidden then
        local oldest = redis.call('ZRANGE', 'api:log', 0, 0, 'WITHSCORES')
        return tostring((tonumber(oldest[2]) + 1000000 - now) / 1e6)
    end
    redis.call('ZADD', 'api:log', now, now .. ':' .. math.random())
    redis.call('PEXPIRE', 'api:log', 2000)
    return false
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.script = client.register_script(self.SCRIPT)

    def call(self, task_id: str | None) -> float | None:
        """None if the call went through, else its Retry-After in seconds."""
        reply = self.script()
        ok = reply is None
        self.client.rpush(
            "events", f"call api {task_id} {time.monotonic():.6f} {os.getpid()} {int(ok)}"
        )
        return None if ok else float(reply)


def create_app(
    broker: str, nodes: list[str], witness_url: str, backend: str | None = None, **conf: Any
) -> Celery:
    app = Celery("crtest", broker=broker, backend=backend or broker, set_as_current=False)
    app.conf.update(
        redlock_nodes=nodes,
        redlock_key_prefix="t:",
        redlock_node_timeout=APP_NODE_TIMEOUT,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        task_default_queue="crtest",
        result_extended=True,
    )
    app.conf.update(conf)
    witness = Witness(witness_url)
    # Not shared: every test builds its own app with the same task names.
    task = functools.partial(app.task, shared=False)

    @task(base=LockedTask, bind=True, name="t.serial", lock_key="serial:{key}", lock_timeout=60)
    def serial(self: Any, key: str, duration: float = 0.05) -> str:
        witness.enter(key, self.request.id)
        time.sleep(duration)
        witness.leave(key, self.request.id)
        return str(self.request.id)

    @task(
        base=LockedTask,
        bind=True,
        name="t.serial_retry",
        lock_key="serial:{key}",
        max_retries=None,
    )
    def serial_retry(self: Any, key: str, duration: float = 0.05) -> str:
        witness.enter(key, self.request.id)
        time.sleep(duration)
        witness.leave(key, self.request.id)
        return str(self.request.id)

    # -- contention (test_contention.py) ------------------------------------------

    @task(
        base=LockedTask, bind=True, name="t.sync_user", lock_key="sync-user:{user_id}", lock_ttl=60
    )
    def sync_user(self: Any, user_id: int, pages: int = 3, page: float = 0.3) -> dict[str, Any]:
        """The README's locked task with its defaults: no lock_timeout, Celery's max_retries."""
        key = f"sync-user:{user_id}"
        witness.enter(key, self.request.id)
        for _ in range(pages):
            time.sleep(page)
            self.heartbeat()
        witness.leave(key, self.request.id)
        return {"token": int(self.lock.fencing_token), **requeue_counts(self.request)}

    @task(base=LockedTask, bind=True, name="t.busy_zero", lock_key="zero:{key}", max_retries=0)
    def busy_zero(self: Any, key: str) -> dict[str, Any]:
        return requeue_counts(self.request)

    @task(
        base=LockedTask,
        bind=True,
        name="t.busy_budget",
        lock_key="budget:{key}",
        lock_busy_max_requeues=2,
    )
    def busy_budget(self: Any, key: str) -> str:
        return "ran"

    @task(base=LockedTask, bind=True, name="t.long", lock_key="long", lock_ttl=1.0)
    def long(self: Any, duration: float) -> dict[str, Any]:
        lowest = self.lock.validity
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            time.sleep(0.05)
            self.heartbeat()
            lowest = min(lowest, self.lock.validity)
            if self.lock_lost:
                break
        return {"lost": self.lock_lost, "lowest_validity": lowest, "token": self.lock.fencing_token}

    @task(
        base=LockedTask,
        bind=True,
        name="t.hung",
        lock_key="hung",
        lock_ttl=1.0,
        lock_progress_timeout=0.5,
    )
    def hung(self: Any, sleep: float) -> dict[str, Any]:
        self.heartbeat()
        witness.event("hung-started", "hung", self.request.id)
        time.sleep(sleep)  # no progress reported
        lost_flag = self.lock_lost
        try:
            self.heartbeat()
        except LockLost as exc:
            return {"lost_flag": lost_flag, "raised": str(exc)}
        return {"lost_flag": lost_flag, "raised": None}

    @task(base=LockedTask, bind=True, name="t.fail", lock_key="exit:{key}")
    def fail(self: Any, key: str) -> None:
        raise ValueError(f"failing on purpose for {key}")

    @task(base=LockedTask, bind=True, name="t.retry_once", lock_key="exit:{key}")
    def retry_once(self: Any, key: str) -> str:
        witness.event("run", key, self.request.id, retries=self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=0.2)
        return "second run"

    @task(base=LockedTask, bind=True, name="t.ignore", lock_key="exit:{key}")
    def ignore(self: Any, key: str) -> None:
        witness.event("run", key, self.request.id)
        raise Ignore()

    @task(base=LockedTask, bind=True, name="t.reject", lock_key="exit:{key}")
    def reject(self: Any, key: str) -> None:
        witness.event("run", key, self.request.id)
        raise Reject("rejecting on purpose", requeue=False)

    @task(base=LockedTask, bind=True, name="t.soft", lock_key="exit:{key}", soft_time_limit=0.5)
    def soft(self: Any, key: str) -> str:
        try:
            time.sleep(10)
        except SoftTimeLimitExceeded:
            witness.event("soft-limit", key, self.request.id)
            raise
        return "not reached"

    @task(base=LockedTask, bind=True, name="t.hard", lock_key="exit:{key}", time_limit=1.0)
    def hard(self: Any, key: str) -> str:
        witness.event("started", key, self.request.id)
        time.sleep(30)
        return "not reached"

    @task(base=LockedTask, bind=True, name="t.sleepy", lock_key="exit:{key}", lock_ttl=30)
    def sleepy(self: Any, key: str, duration: float = 30) -> str:
        witness.event("started", key, self.request.id)
        time.sleep(duration)
        return "slept"

    @task(
        base=LockedTask,
        bind=True,
        name="t.short_ttl",
        lock_key="exit:{key}",
        lock_ttl=2.0,
    )
    def short_ttl(self: Any, key: str, duration: float = 30) -> str:
        witness.event("started", key, self.request.id)
        time.sleep(duration)
        return "slept"

    @task(base=LockedTask, bind=True, name="t.single", singleton=True)
    def single(self: Any, n: int, duration: float = 0.5, flag: bool = False) -> str:
        witness.enter(f"single:{n}", self.request.id)
        time.sleep(duration)
        witness.leave(f"single:{n}", self.request.id)
        return str(self.request.id)

    @task(
        base=LockedTask,
        bind=True,
        name="t.single_raise",
        singleton=True,
        on_duplicate="raise",
    )
    def single_raise(self: Any, n: int) -> str:
        time.sleep(0.5)
        return str(self.request.id)

    @task(base=LockedTask, bind=True, name="t.single_retry", singleton=True, max_retries=3)
    def single_retry(self: Any, n: int) -> int:
        witness.event("run", f"single_retry:{n}", self.request.id, retries=self.request.retries)
        if self.request.retries < 2:
            raise self.retry(countdown=0.1)
        return int(self.request.retries)

    @task(base=LockedTask, bind=True, name="t.single_short", singleton=True, lock_ttl=2.0)
    def single_short(self: Any, n: int, duration: float = 30) -> str:
        witness.event("started", f"single_short:{n}", self.request.id)
        time.sleep(duration)
        return "slept"

    # -- flow control (test_flow_control.py) ------------------------------------------

    @task(base=LockedTask, bind=True, name="t.debounced", debounce=5.0, debounce_key="doc:{doc}")
    def debounced(self: Any, doc: str, n: int) -> int:
        witness.event("run", f"debounced:{doc}", self.request.id, n=n)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.debounced_fast",
        debounce=1.0,
        debounce_key="doc:{doc}",
        max_retries=3,
    )
    def debounced_fast(self: Any, doc: str, n: int, retries: int = 0) -> int:
        witness.event("run", f"debounced_fast:{doc}", self.request.id, n=n)
        if self.request.retries < retries:
            raise self.retry(countdown=0.1)
        return n

    @task(base=LockedTask, bind=True, name="t.queued", singleton=True, singleton_mode="queued")
    def queued(self: Any, n: int, duration: float = -1.0) -> str:
        """Hold the run until the test pushes ``release:queued:<n>`` (or for ``duration`` s)."""
        witness.enter(f"queued:{n}", self.request.id)
        if duration < 0:
            witness.client.blpop([f"release:queued:{n}"], timeout=60)
        else:
            time.sleep(duration)
        witness.leave(f"queued:{n}", self.request.id)
        return str(self.request.id)

    @task(
        base=LockedTask,
        bind=True,
        name="t.queued_retry",
        singleton=True,
        singleton_mode="queued",
        max_retries=3,
    )
    def queued_retry(self: Any, n: int) -> int:
        """Retry twice; the first attempt waits for ``release:queued_retry:<n>``."""
        key = f"queued_retry:{n}"
        witness.enter(key, self.request.id)
        witness.event("run", key, self.request.id, retries=self.request.retries)
        if self.request.retries == 0:
            witness.client.blpop([f"release:{key}"], timeout=60)
        witness.leave(key, self.request.id)
        if self.request.retries < 2:
            raise self.retry(countdown=0.3)
        return int(self.request.retries)

    @task(bind=True, name="t.plain")
    def plain(self: Any, n: int, duration: float = 0.3) -> str:
        witness.enter(f"plain:{n}", self.request.id)
        time.sleep(duration)
        witness.leave(f"plain:{n}", self.request.id)
        return str(self.request.id)

    @task(base=LockedTask, bind=True, name="t.limited", global_rate_limit="5/s")
    def limited(self: Any, n: int) -> int:
        witness.event("run", "limited", self.request.id, n=n)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.limited_sliding",
        global_rate_limit="5/s",
        rate_limit_algorithm="sliding",
    )
    def limited_sliding(self: Any, n: int) -> int:
        witness.event("run", "limited", self.request.id, n=n)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.limited_skip",
        global_rate_limit="2/m",
        on_rate_limited="skip",
    )
    def limited_skip(self: Any, n: int) -> int:
        witness.event("run", "limited_skip", self.request.id, n=n)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.limited_raise",
        global_rate_limit="2/m",
        on_rate_limited="raise",
    )
    def limited_raise(self: Any, n: int) -> int:
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.limited_key",
        global_rate_limit="2/m",
        rate_limit_key="api:{customer}",
        on_rate_limited="skip",
    )
    def limited_key(self: Any, customer: str) -> str:
        witness.event("run", f"api:{customer}", self.request.id)
        return customer

    @task(
        base=LockedTask,
        bind=True,
        name="t.limited_tight",
        global_rate_limit="2/s",
        max_retries=1,
    )
    def limited_tight(self: Any, n: int) -> int:
        witness.event("run", "limited_tight", self.request.id, n=n)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.crashy",
        lock_key="crash:{key}",
        lock_ttl=2.0,
        acks_late=True,
    )
    def crashy(self: Any, key: str, duration: float = 1.0) -> str:
        witness.enter(key, self.request.id)
        time.sleep(duration)
        witness.leave(key, self.request.id)
        return "done"

    # -- the rate-limit invariant (test_rate_invariant.py) --------------------------

    def started(self: Any, key: str) -> None:
        """Record a run's start: the first thing its body does."""
        witness.event("start", key, self.request.id)

    @task(base=LockedTask, bind=True, name="t.rate_default", global_rate_limit="5/s")
    def rate_default(self: Any, n: int) -> int:
        started(self, "rate_default")
        return n

    @task(base=LockedTask, bind=True, name="t.rate_late", global_rate_limit="1/3s", acks_late=True)
    def rate_late(self: Any, n: int) -> int:
        """A rate limit only (no lock), acknowledged late (test_copies.py)."""
        started(self, "rate_late")
        return n

    @task(base=LockedTask, bind=True, name="t.rate_beat", global_rate_limit="5/s")
    def rate_beat(self: Any) -> None:
        started(self, "rate_beat")

    @task(
        base=LockedTask,
        bind=True,
        name="t.rate_busy",
        global_rate_limit="10/8s",
        lock_key="rated:{key}",
        lock_ttl=1.0,
        max_retries=None,
    )
    def rate_busy(self: Any, key: str) -> None:
        started(self, f"rate_busy:{key}")
        time.sleep(0.02)

    @task(
        base=LockedTask,
        bind=True,
        name="t.rate_busy_minute",
        global_rate_limit="100/m",
        lock_key="rated:{key}",
        lock_ttl=1.0,
        max_retries=None,
    )
    def rate_busy_minute(self: Any, key: str) -> None:
        started(self, f"rate_busy_minute:{key}")
        time.sleep(0.02)

    @task(base=LockedTask, bind=True, name="t.hold", lock_key="rated:{key}")
    def hold(self: Any, key: str, duration: float) -> None:
        witness.event("hold-start", key, self.request.id)
        time.sleep(duration)
        witness.event("hold-end", key, self.request.id)

    @task(base=LockedTask, bind=True, name="t.rate_fraction", global_rate_limit="2.5/s")
    def rate_fraction(self: Any, n: int) -> int:
        started(self, "rate_fraction")
        return n

    @task(base=LockedTask, bind=True, name="t.rate_two", global_rate_limit=["5/s", "8/2s"])
    def rate_two(self: Any, n: int) -> int:
        started(self, "rate_two")
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.rate_tenant",
        global_rate_limit=[("3/s", "tenant:{tenant}"), ("5/s", "tenants")],
    )
    def rate_tenant(self: Any, tenant: str) -> None:
        started(self, f"rate_tenant:{tenant}")

    @task(
        base=LockedTask,
        bind=True,
        name="t.rate_cost",
        global_rate_limit="6/s",
        rate_limit_cost=lambda args, kwargs: args[0],
    )
    def rate_cost(self: Any, units: int) -> int:
        started(self, "rate_cost")
        return units

    plans = {"small": "2/s", "big": "20/s"}

    @task(
        base=LockedTask,
        bind=True,
        name="t.rate_plan",
        global_rate_limit=lambda key: plans[key.split(":")[1]],
        rate_limit_key="plan:{tenant}",
    )
    def rate_plan(self: Any, tenant: str) -> None:
        started(self, f"rate_plan:{tenant}")

    # -- a service that refuses above a limit it keeps to itself (test_adaptive_rate.py) --

    api = FakeApi(witness.client)

    @task(
        base=LockedTask,
        bind=True,
        name="t.api_pause",
        global_rate_limit="20/s",
        rate_limit_key="pause-api",
        max_retries=0,
    )
    def api_pause(self: Any, n: int) -> int:
        started(self, "api_pause")
        retry_after = api.call(self.request.id)
        if retry_after is not None:
            try:
                self.rate_limited(retry_after=retry_after)
            finally:  # the pause is written by now
                witness.event("paused", "api_pause", self.request.id)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.api_adaptive",
        global_rate_limit="40/s",
        rate_limit_key="adaptive-api",
        rate_limit_adaptive=True,
        max_retries=0,
    )
    def api_adaptive(self: Any, n: int) -> int:
        retry_after = api.call(self.request.id)
        if retry_after is not None:
            self.rate_limited(retry_after=retry_after)
        return n

    @task(
        base=LockedTask,
        bind=True,
        name="t.killable",
        lock_key="kill:{key}",
        lock_ttl=30,
        lock_timeout=20,
    )
    def killable(self: Any, key: str, duration: float = 0.3) -> str:
        """The first run of ``key`` waits to be killed; later ones sleep ``duration``."""
        first = witness.client.incr(f"runs:{key}") == 1
        witness.event("enter", key, self.request.id)
        if first:
            witness.client.blpop([f"release:{key}"], timeout=60)
        else:
            time.sleep(duration)
        witness.event("exit", key, self.request.id)
        return str(self.request.id)

    def watch(self: Any) -> dict[str, Any]:
        """Hold the lock, reporting progress, until the test sets ``stop:watch``."""
        witness.event("enter", "watch", self.request.id)
        while not witness.client.exists("stop:watch"):
            time.sleep(0.05)
            try:
                self.heartbeat()
            except LockLost as exc:
                return {"lost": True, "reason": str(exc)}
        return {"lost": self.lock_lost, "reason": None}

    task(base=LockedTask, bind=True, name="t.watch", lock_key="watch", lock_ttl=1.0)(watch)
    # The same with renewal rounds a second apart: a round that hears the
    # nodes' failures runs before the lock expires even on a loaded machine.
    task(base=LockedTask, bind=True, name="t.watch_3s", lock_key="watch", lock_ttl=3.0)(watch)

    @task(bind=True, name="t.block", acks_late=True)
    def block(self: Any, key: str) -> None:
        """Hold a pool slot until the test pushes a token to ``release:<key>``.

        Acknowledged when it ends, so the worker's prefetch (concurrency times 1)
        counts it while it runs: with early acks a worker whose threads are
        all blocked may reserve as many again, and N blockers need not land
        one per slot of every worker.
        """
        witness.event("block-start", key, self.request.id)
        witness.client.blpop([f"release:{key}"], timeout=60)

    # -- concurrency limits (test_concurrency_limit.py) -------------------------------

    def inside(self: Any, key: str, duration: float) -> None:
        """The body of a concurrency-limited run: counted in while it runs.

        ``running:<key>`` is incremented first and decremented last, inside
        the slot, and every value it reached is kept in ``peaks:<key>``: its
        largest is the most runs of ``key`` that were ever inside at once.
        """
        witness.client.rpush(f"peaks:{key}", witness.client.incr(f"running:{key}"))
        witness.event("start", key, self.request.id, parent=os.getppid())
        time.sleep(duration)
        witness.event("end", key, self.request.id)
        witness.client.decr(f"running:{key}")

    @task(
        base=LockedTask,
        bind=True,
        name="t.export",
        concurrency_limit=3,
        concurrency_key="export:{tenant}",
        lock_timeout=60,
    )
    def export(self: Any, tenant: str, duration: float = 0.4) -> str:
        inside(self, f"export:{tenant}", duration)
        return str(self.request.id)

    @task(
        base=LockedTask,
        bind=True,
        name="t.export_short_ttl",
        concurrency_limit=3,
        concurrency_key="export:{tenant}",
        lock_ttl=2.0,
    )
    def export_short_ttl(self: Any, tenant: str, duration: float = 30) -> str:
        inside(self, f"export:{tenant}", duration)
        return "done"

    @task(
        base=LockedTask,
        bind=True,
        name="t.slot_exit",
        concurrency_limit=1,
        concurrency_key="slot-exit:{key}",
    )
    def slot_exit(self: Any, key: str, how: str) -> str:
        witness.event("run", key, self.request.id, how=how, retries=self.request.retries)
        if how == "fail":
            raise ValueError(f"failing on purpose for {key}")
        if how == "retry" and self.request.retries == 0:
            raise self.retry(countdown=0.2)
        if how == "ignore":
            raise Ignore()
        if how == "reject":
            raise Reject("rejecting on purpose", requeue=False)
        if how == "sleep":
            time.sleep(30)
        return how

    @task(
        base=LockedTask,
        bind=True,
        name="t.slot_busy",
        concurrency_limit=1,
        concurrency_key="slot-busy:{key}",
        max_retries=0,
    )
    def slot_busy(self: Any, key: str) -> int:
        headers = self.request.headers or {}
        busy = headers.get("redlock_busy", getattr(self.request, "redlock_busy", 0))
        witness.event("run", key, self.request.id, busy=busy)
        return int(self.request.retries)

    @task(
        base=LockedTask,
        bind=True,
        name="t.slot_rated",
        concurrency_limit=1,
        concurrency_key="slot-busy:{key}",
        global_rate_limit="100/m",
    )
    def slot_rated(self: Any, key: str) -> None:
        witness.event("run", key, self.request.id)

    @task(
        base=LockedTask,
        bind=True,
        name="t.slot_hung",
        concurrency_limit=1,
        concurrency_key="slot-hung",
        lock_ttl=1.0,
        lock_progress_timeout=0.5,
    )
    def slot_hung(self: Any, sleep: float) -> dict[str, Any]:
        self.heartbeat()
        witness.event("hung-started", "slot-hung", self.request.id)
        time.sleep(sleep)  # no progress reported
        lost_flag = self.lock_lost
        try:
            self.heartbeat()
        except LockLost as exc:
            return {"lost_flag": lost_flag, "raised": str(exc), "lock": self.lock is None}
        return {"lost_flag": lost_flag, "raised": None, "lock": self.lock is None}

    @task(
        base=LockedTask,
        bind=True,
        name="t.slot_wait",
        concurrency_limit=1,
        concurrency_key="slot-busy:{key}",
        lock_timeout=60,
    )
    def slot_wait(self: Any, key: str) -> int:
        witness.event("run", key, self.request.id)
        return int(self.request.retries)

    @task(
        base=LockedTask,
        bind=True,
        name="t.slot_skip",
        concurrency_limit=1,
        concurrency_key="slot-busy:{key}",
        on_lock_busy="skip",
    )
    def slot_skip(self: Any, key: str) -> None:
        witness.event("run", key, self.request.id)

    # -- hard time limits (test_locked_task.py, test_concurrency_limit.py) ---------

    def limited_run(self: Any, key: str, how: str, keys: list[str]) -> str:
        """``hang`` until the hard limit; ``lose``: delete the run's keys, a genuine loss."""
        witness.event("run", key, self.request.id, how=how)
        if how == "hang":
            time.sleep(30)
        if how == "lose":
            for url in nodes:
                with redis.Redis.from_url(url) as client:
                    client.delete(*keys)
        return how

    @task(
        base=LockedTask,
        bind=True,
        name="t.limit_lock",
        lock_key="limit:{key}",
        lock_timeout=30,
    )
    def limit_lock(self: Any, key: str, how: str) -> str:
        return limited_run(self, key, how, [self.lock.redlock.key(f"limit:{key}")])

    @task(
        base=LockedTask,
        bind=True,
        name="t.limit_slot",
        concurrency_limit=1,
        concurrency_key="limit-slot:{key}",
        lock_timeout=30,
    )
    def limit_slot(self: Any, key: str, how: str) -> str:
        slot = semaphore_keys("t:", f"limit-slot:{key}")
        return limited_run(self, key, how, [slot.holders, slot.expiry])

    app.witness = witness  # type: ignore[attr-defined]
    return app


# -- observing what the tasks did ------------------------------------------------


def requeue_counts(request: Any) -> dict[str, int]:
    """A run's Celery ``retries`` and its busy-lock re-queues (the ``redlock_busy`` header)."""
    busy = (request.headers or {}).get(BUSY_HEADER, getattr(request, BUSY_HEADER, 0))
    return {"retries": int(request.retries), "busy": int(busy or 0)}


def overlaps(events: list[list[str]]) -> int:
    """Count enter events that came while another run of the same key was inside."""
    inside: dict[str, int] = {}
    found = 0
    for kind, key, *_ in events:
        if kind == "enter":
            inside[key] = inside.get(key, 0) + 1
            found += inside[key] > 1
        elif kind == "exit":
            inside[key] -= 1
    return found


def looker(nodes: list[RedisServer], prefix: str = "t:") -> Redlock:
    """A Redlock for the tests' looks at the nodes: a node timeout no loaded machine reaches."""
    return Redlock([node.url for node in nodes], key_prefix=prefix, node_timeout=LOOK_NODE_TIMEOUT)


def free_slots(
    nodes: list[RedisServer],
    key: str,
    limit: int,
    prefix: str = "t:",
    redlock: Redlock | None = None,
) -> int:
    """How many of the ``limit`` slots of semaphore ``key`` a fresh owner can take right now."""
    own = redlock is None
    looking = looker(nodes, prefix) if redlock is None else redlock
    taken = []
    try:
        for _ in range(limit):
            slot = looking.semaphore(key, limit, ttl=5)
            if not slot.acquire(blocking=False):
                break
            taken.append(slot)
        return len(taken)
    finally:
        for slot in taken:
            slot.release()
        if own:
            looking.close()


def wait_slots_free(nodes: list[RedisServer], key: str, limit: int, timeout: float) -> float:
    """Seconds until all ``limit`` slots of ``key`` could be taken; fails after ``timeout``.

    Counted to the end of the look that found them free (they were free by
    then); the looks share their connections, so a look is quick.
    """
    started = time.monotonic()
    redlock = looker(nodes)
    try:
        while time.monotonic() - started < timeout:
            if free_slots(nodes, key, limit, redlock=redlock) == limit:
                return time.monotonic() - started
            time.sleep(0.05)
    finally:
        redlock.close()
    raise AssertionError(f"semaphore {key!r} still has slots held after {timeout} s")


def peak(app: Celery, key: str) -> int:
    """The most runs of ``key`` that were inside their slot at once (see ``inside``)."""
    return max((int(v) for v in app.witness.client.lrange(f"peaks:{key}", 0, -1)), default=0)


def most_at_once(events: list[list[str]], key: str) -> int:
    """The largest number of ``start``/``end`` intervals of ``key`` open at one moment."""
    # Sorted by time, and at one instant an end (-1) before a start (+1).
    edges = sorted(
        (float(e[3]), 1 if e[0] == "start" else -1)
        for e in events
        if e[1] == key and e[0] in ("start", "end")
    )
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def free_now(
    nodes: list[RedisServer], key: str, prefix: str = "t:", redlock: Redlock | None = None
) -> bool:
    """Whether a fresh owner can take lock ``key`` right now."""
    looking = looker(nodes, prefix) if redlock is None else redlock
    try:
        lock = looking.lock(key, ttl=5)
        taken = lock.acquire(blocking=False)
        if taken:
            lock.release()
        return taken
    finally:
        if redlock is None:
            looking.close()


def wait_free(nodes: list[RedisServer], key: str, timeout: float) -> float:
    """Seconds until lock ``key`` could be taken (to that look's end); fails after ``timeout``."""
    started = time.monotonic()
    redlock = looker(nodes)  # one for all the looks: no connecting on each
    try:
        while time.monotonic() - started < timeout:
            if free_now(nodes, key, redlock=redlock):
                return time.monotonic() - started
            time.sleep(0.05)
    finally:
        redlock.close()
    raise AssertionError(f"lock {key!r} still held after {timeout} s")


def note_prerun(witness: Witness, task_id: str | None) -> None:
    """Record that a delivery of ``task_id`` is about to be called (in ``preruns``)."""
    witness.client.rpush("preruns", f"{task_id} {time.monotonic():.6f}")


@contextlib.contextmanager
def preruns_noted(app: Celery) -> Iterator[None]:
    """Note each delivery of ``app``'s tasks in this process (a worker subprocess always does)."""

    def note(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            note_prerun(app.witness, task_id)

    task_prerun.connect(note, weak=False)
    try:
        yield
    finally:
        task_prerun.disconnect(note)


def admissions(app: Celery, kind: str, key: str) -> list[tuple[float, float]]:
    """When each run of ``key`` (events ``kind``) was let in by its limits, as a bracket.

    A run is admitted after its delivery's task_prerun (:func:`preruns_noted`)
    and before its body records its start; a thread descheduled in between
    only widens the bracket, it never moves it.
    """
    preruns: dict[str, list[float]] = {}
    for entry in app.witness.client.lrange("preruns", 0, -1):
        task_id, at = entry.decode().split()
        preruns.setdefault(task_id, []).append(float(at))
    found = []
    for event in app.witness.events():
        if event[0] == kind and event[1] == key:
            start = float(event[3])
            found.append((max(at for at in preruns[event[2]] if at <= start), start))
    return found


def run_times(app: Celery, key: str) -> list[float]:
    return sorted(float(e[3]) for e in app.witness.events() if e[0] == "run" and e[1] == key)


def most_in_any_window(times: list[float], window: float) -> int:
    return max(
        (sum(1 for t in times[i:] if t < start + window) for i, start in enumerate(times)),
        default=0,
    )


def wait_for_event(app: Celery, kind: str, timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in app.witness.events():
            if event[0] == kind:
                return event
        time.sleep(0.02)
    raise AssertionError(f"no {kind!r} event within {timeout} s")


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# -- workers ----------------------------------------------------------------------


@contextlib.contextmanager
def in_process_worker(app: Celery, pool: str, concurrency: int = 4) -> Iterator[Any]:
    """A worker in a thread of the test process (``threads`` or ``solo`` pool)."""
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency if pool != "solo" else 1,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as worker:
        yield worker


class GatedScheduler(Scheduler):  # type: ignore[misc]
    """Beat's own scheduler, publishing only while the witness holds ``beat-on``.

    A test stops the ticks by deleting the key, then stops the process: no
    tick is ever cut short between its publish and the record of it.
    """

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not app.witness.client.exists("beat-on"):
            return 0.05
        return float(super().tick(*args, **kwargs))


class WorkerProcess:
    """``celery worker`` in a subprocess, so a test can kill it."""

    def __init__(
        self,
        broker_url: str,
        nodes: list[str],
        witness: RedisServer,
        log: Path,
        pool: str = "prefork",
        concurrency: int = 2,
        conf: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.witness = witness
        self.log_path = log
        env = {
            **os.environ,
            "CR_BROKER": broker_url,
            "CR_NODES": ",".join(nodes),
            "CR_WITNESS": witness.url,
            # Celery settings of the worker's app, as JSON.
            "CR_CONF": json.dumps(conf or {}),
            **(env or {}),
        }
        witness.client().delete("worker-ready")
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.worker.support",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                str(concurrency),
                "--loglevel",
                "INFO",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
                "--hostname",
                f"w{os.getpid()}-{time.monotonic_ns()}@%h",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(30)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = self.witness.client()
        while time.monotonic() < deadline:
            if client.get("worker-ready"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"worker did not start; its log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool children."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def start_beat(
    broker_url: str,
    nodes: list[str],
    witness: RedisServer,
    files: Path,
    every: float,
    task: str = "t.single",
    scheduler: str | None = None,
) -> tuple[subprocess.Popen[bytes], Any]:
    """``celery beat`` sending ``task`` every ``every`` s (``t.single(11)`` by default).

    Its log and schedule file are ``files`` with ``.log`` and ``.schedule``
    appended; ``scheduler`` replaces beat's own (``tests.worker.support:GatedScheduler``).
    """
    env = {
        **os.environ,
        "CR_BROKER": broker_url,
        "CR_NODES": ",".join(nodes),
        "CR_WITNESS": witness.url,
        "CR_BEAT_EVERY": str(every),
        "CR_BEAT_TASK": task,
    }
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.worker.support",
        "beat",
        "--loglevel",
        "INFO",
        "--schedule",
        f"{files}.schedule",
        "--max-interval",
        "1",
    ]
    if scheduler is not None:
        command += ["--scheduler", scheduler]
    log = Path(f"{files}.log").open("wb")  # noqa: SIM115 (closed by the caller)
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return process, log


def stop_beat(process: subprocess.Popen[bytes]) -> None:
    """Stop a beat started by :func:`start_beat`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


if "CR_BROKER" in os.environ:
    app = create_app(
        os.environ["CR_BROKER"],
        os.environ["CR_NODES"].split(","),
        os.environ["CR_WITNESS"],
        **json.loads(os.environ.get("CR_CONF") or "{}"),
    )

    if os.environ.get("CR_THIRDPARTY"):
        # A library's task module, made a singleton by name (tests.worker.thirdparty).
        app.conf.redlock_tasks = {"thirdparty.nightly": {"singleton": True}}
        app.conf.imports = ("tests.worker.thirdparty",)
        setup(app)

    if os.environ.get("CR_BEAT_EVERY"):
        beat_task = os.environ.get("CR_BEAT_TASK", "t.single")
        app.conf.beat_schedule = {
            "single-tick": {
                "task": beat_task,
                "schedule": float(os.environ["CR_BEAT_EVERY"]),
                "args": (11, 0.1) if beat_task == "t.single" else (),
            }
        }

        @after_task_publish.connect(weak=False)
        def note_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
            app.witness.event("published", str(sender), (headers or {}).get("id"))

    if os.environ.get("CR_METRICS_PORT"):
        from celery_redlock.contrib import prometheus

        prometheus.serve_worker(app, port=int(os.environ["CR_METRICS_PORT"]), addr="127.0.0.1")

    @lock_lost.connect(weak=False)
    def note_lost(sender: Any = None, task_id: Any = None, key: Any = None, **fields: Any) -> None:
        app.witness.event("lost", str(key), task_id, code=fields.get("code"))

    @lock_busy.connect(weak=False)
    def note_busy(sender: Any = None, task_id: Any = None, key: Any = None, **_: Any) -> None:
        app.witness.event("busy", str(key), task_id)

    @task_prerun.connect(weak=False)
    def note_delivery(task_id: str | None = None, **_: Any) -> None:
        note_prerun(app.witness, task_id)

    @worker_ready.connect(weak=False)
    def announce_ready(sender: Any = None, **_: Any) -> None:
        app.witness.client.set("worker-ready", os.getpid())
