"""from_celery_singleton.py: celery-singleton's Singleton options, rewritten for celery_redlock.

Publishes without a worker (the copies wait in the queue), so every
duplicate is visible. BROKER_URL and REDLOCK_NODES name the Redis servers.
"""

import os

from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.admin import Admin
from celery_redlock.errors import DuplicateTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
app = Celery("singleton_example", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    # singleton_backend_url -> redlock_nodes; singleton_key_prefix -> redlock_key_prefix
    redlock_nodes=os.environ.get("REDLOCK_NODES", BROKER_URL).split(","),
    redlock_key_prefix="myapp:",
    task_default_queue="singleton-example",  # nothing consumes it: copies stay queued
)


# @app.task(base=Singleton)
@app.task(base=LockedTask, singleton=True)
def do_stuff(*args, **kwargs):
    return "I just woke up"


# @app.task(base=Singleton, unique_on=["username"], raise_on_duplicate=True, lock_expiry=600)
@app.task(
    base=LockedTask,
    singleton=True,
    singleton_key="{username}",
    on_duplicate="raise",
    singleton_ttl=600,  # while queued; a running copy keeps it by its heartbeat
)
def do_something(username, otherarg=None):
    return username


a = do_stuff.delay(1, 2, 3, a="b")
assert do_stuff.delay(1, 2, 3, a="b").id == a.id  # the same AsyncResult
assert do_stuff.delay(4, 5, 6).id != a.id  # other arguments, another task

# DuplicateTaskError(task_id) -> DuplicateTask(task_id)
bob = do_something.delay("bob", otherarg=99)
try:
    do_something.delay("bob", otherarg=100)
    raise AssertionError("a duplicate was queued")
except DuplicateTask as exc:
    assert exc.task_id == bob.id

# clear_locks(app) -> release what the pattern names, here every singleton.
with Admin(app) as admin:
    released = [admin.release(view.name) for view in admin.locks("singleton:*").locks]
assert do_something.delay("bob").id != bob.id

print(f"OK: celery-singleton options rewritten; clear_locks released {len(released)}")
