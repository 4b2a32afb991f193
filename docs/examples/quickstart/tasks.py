"""tasks.py: the three ways celery_redlock is used, in one Celery app.

Start a worker and beat beside it (from this folder):

    celery -A tasks worker --loglevel INFO
    celery -A tasks beat --loglevel INFO
"""

import os
import time

from celery import Celery
from celery.schedules import crontab

import celery_redlock
from celery_redlock import LockedTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")

app = Celery("tasks", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    # Independent Redis masters, three in production (a majority must agree);
    # one, here the broker's Redis, is a plain single-instance lock.
    redlock_nodes=os.environ.get("REDLOCK_NODES", BROKER_URL).split(","),
    # 2. Options for tasks whose code you do not own, by task name.
    redlock_tasks={"reports.nightly": {"singleton": True}},
    beat_schedule={
        "nightly-report": {
            "task": "reports.nightly",
            "schedule": crontab(hour=2, minute=0),
            "args": ("today",),
        },
        "acme-price": {"task": "tasks.fetch_price", "schedule": 0.25, "args": ("ACME",)},
    },
)


# 1. A locked task: one sync per user at a time, the lock kept alive while the
#    sync makes progress and released however the run ends.
@app.task(base=LockedTask, bind=True, lock_key="sync-user:{user_id}", lock_ttl=60)
def sync_user(self, user_id):
    for _page in range(3):
        time.sleep(0.5)  # fetch one page from the remote system and store it
        self.heartbeat()  # progress: renews the lock (LockLost if it is gone)
    return self.lock.fencing_token


# 2. A worker-level singleton: a plain task (as a third-party one would be) made a
#    singleton by redlock_tasks above. While a copy is queued or running,
#    publishing it again returns that copy.
@app.task(name="reports.nightly")
def nightly(day):
    time.sleep(2)  # build the report
    return f"report for {day} built"


# 3. A rate-limited beat task: beat asks for a price 4 times a second, the API
#    allows 2 calls a second across every worker; the ticks over the limit are
#    not published, and calls made by other code wait for the window.
@app.task(base=LockedTask, global_rate_limit="2/s", rate_limit_key="prices-api")
def fetch_price(symbol):
    return 100.0 + len(symbol)  # stands in for a call to the rate-limited API


celery_redlock.setup(app)  # applies redlock_tasks: worker, beat and publishers alike
