"""The Celery app and tasks the worker tests run, in-process or as a subprocess.

``create_app(broker, nodes, witness)`` builds a fresh app; a worker started
with ``celery -A tests.celery.taskapp worker`` builds it from the
``CR_BROKER``, ``CR_NODES`` (comma separated) and ``CR_WITNESS`` environment
variables. Tasks write what they do to the witness node, a Redis outside the
lock's node set, so a test can check overlaps after the fact.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.signals import worker_ready

from celery_redlock import LockedTask
from celery_redlock.errors import LockLost


class Witness:
    """Records task events on the witness node."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

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


def create_app(
    broker: str, nodes: list[str], witness_url: str, backend: str | None = None, **conf: Any
) -> Celery:
    app = Celery("crtest", broker=broker, backend=backend or broker, set_as_current=False)
    app.conf.update(
        redlock_nodes=nodes,
        redlock_key_prefix="t:",
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
        raise Ignore()

    @task(base=LockedTask, bind=True, name="t.reject", lock_key="exit:{key}")
    def reject(self: Any, key: str) -> None:
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

    app.witness = witness  # type: ignore[attr-defined]
    return app


if "CR_BROKER" in os.environ:
    app = create_app(
        os.environ["CR_BROKER"], os.environ["CR_NODES"].split(","), os.environ["CR_WITNESS"]
    )

    if os.environ.get("CR_BEAT_EVERY"):
        app.conf.beat_schedule = {
            "single-tick": {
                "task": "t.single",
                "schedule": float(os.environ["CR_BEAT_EVERY"]),
                "args": (11, 0.1),
            }
        }

    @worker_ready.connect(weak=False)
    def announce_ready(sender: Any = None, **_: Any) -> None:
        app.witness.client.set("worker-ready", os.getpid())
