"""exports.py: at most 3 exports per tenant at once, whichever worker runs them.

Start one or more workers (from this folder), then run try_exports.py:

    celery -A exports worker --loglevel INFO --concurrency 6
"""

import os
import time

import redis
from celery import Celery

from celery_redlock import LockedTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")

app = Celery("exports", broker=BROKER_URL, backend=BROKER_URL)
app.conf.redlock_nodes = os.environ.get("REDLOCK_NODES", BROKER_URL).split(",")

# Where this example counts the exports running, to show the limit holding.
board = redis.Redis.from_url(BROKER_URL)


# Each run holds one of 3 slots of "export:<tenant_id>" while its body runs.
# A run that finds all 3 taken waits up to lock_timeout for one (woken as soon
# as a slot is given up), then is re-queued (on_lock_busy="retry").
@app.task(
    base=LockedTask,
    concurrency_limit=3,
    concurrency_key="export:{tenant_id}",
    lock_timeout=60,
)
def export(tenant_id: str, report: int) -> int:
    running = board.incr(f"running:{tenant_id}")  # this tenant's exports running now
    board.rpush(f"seen:{tenant_id}", running)
    time.sleep(0.3)  # the export
    board.decr(f"running:{tenant_id}")
    return report
