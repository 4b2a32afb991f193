"""from_celery_once.py: celery-once's QueueOnce options, rewritten for celery_redlock.

Publishes without a worker (the copies wait in the queue), so every
duplicate is visible. BROKER_URL and REDLOCK_NODES name the Redis servers.
"""

import os
import time

from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.admin import Admin
from celery_redlock.errors import DuplicateTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
app = Celery("once_example", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    # ONCE = {"backend": ..., "settings": {"url": ..., "default_timeout": 3600}}
    redlock_nodes=os.environ.get("REDLOCK_NODES", BROKER_URL).split(","),
    task_default_queue="once-example",  # nothing consumes it: copies stay queued
)


# @app.task(base=QueueOnce, once={"graceful": True})
@app.task(base=LockedTask, singleton=True)  # on_duplicate="return" is the default
def slow_task(n):
    time.sleep(30)


# @app.task(base=QueueOnce)  -- raises AlreadyQueued on a duplicate
@app.task(base=LockedTask, singleton=True, on_duplicate="raise")
def strict_task(n):
    time.sleep(30)


# @app.task(base=QueueOnce, once={"keys": ["a"], "timeout": 60 * 60 * 10})
@app.task(base=LockedTask, singleton=True, singleton_key="{a}", singleton_ttl=60 * 60 * 10)
def slow_add(a, b):
    return a + b


# graceful: celery-once returned EagerResult(None, None, REJECTED); celery_redlock
# returns the queued copy.
first = slow_task.delay(10)
assert slow_task.delay(10).id == first.id

# AlreadyQueued(countdown) -> DuplicateTask, naming the queued copy and how long
# its key still holds (here what is left of singleton_ttl, 3600 s by default).
queued = strict_task.delay(10)
try:
    strict_task.delay(10)
    raise AssertionError("a duplicate was queued")
except DuplicateTask as exc:
    assert exc.task_id == queued.id
    assert 0 < exc.ttl <= 3600

# keys=["a"]: only `a` decides what a duplicate is.
assert slow_add.delay(1, 1).id == slow_add.delay(1, 2).id
assert slow_add.delay(2, 2).id != slow_add.delay(1, 1).id

# clear_lock(key) by hand -> release the singleton (or: celery -A proj redlock release NAME).
with Admin(app) as admin:
    names = [view.name for view in admin.locks("singleton:*").locks]
    for name in names:
        admin.release(name)
assert slow_task.delay(10).id != first.id  # published anew

print(f"OK: celery-once options rewritten; {len(names)} queued singletons released")
