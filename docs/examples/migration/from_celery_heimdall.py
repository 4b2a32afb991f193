"""from_celery_heimdall.py: celery-heimdall's HeimdallTask options, rewritten for celery_redlock.

Publishes without a worker (the copies wait in the queue), so every
duplicate is visible; the rate limit is shown on the limiter itself.
BROKER_URL and REDLOCK_NODES name the Redis servers.
"""

import os

from celery import Celery

from celery_redlock import LockedTask, RateLimiter
from celery_redlock.errors import DuplicateTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
NODES = os.environ.get("REDLOCK_NODES", BROKER_URL).split(",")
app = Celery("heimdall_example", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(redlock_nodes=NODES, task_default_queue="heimdall-example")


# heimdall={"unique": True, "unique_timeout": 60 * 60}
@app.task(base=LockedTask, singleton=True, singleton_ttl=60 * 60)
def generate_report(customer_id):
    return customer_id


# heimdall={"unique": True, "key": lambda args, kwargs: "generate_report", "unique_raises": True}
@app.task(
    base=LockedTask,
    singleton=True,
    singleton_key=lambda args, kwargs: "generate_report",
    on_duplicate="raise",
)
def generate_any_report(customer_id):
    return customer_id


# heimdall={"times": 2, "per": 60}
@app.task(base=LockedTask, global_rate_limit="2/m")
def download_report_from_amazon(customer_id):
    return customer_id


first = generate_report.delay(1)
assert generate_report.delay(1).id == first.id  # the existing task's AsyncResult

# AlreadyQueuedError.likely_culprit -> DuplicateTask.task_id
running = generate_any_report.delay(1)
try:
    generate_any_report.delay(2)
    raise AssertionError("a duplicate was queued")
except DuplicateTask as exc:
    assert exc.task_id == running.id

# times=2, per=60: the third run in a minute waits for the window (it is re-queued,
# not lost). The same limit, asked of the limiter directly:
limiter = RateLimiter(NODES[0])
hits = [limiter.hit("amazon-reports", limit=2, period=60).allowed for _ in range(3)]
limiter.close()
assert hits == [True, True, False]

print("OK: celery-heimdall options rewritten")
