"""tasks.py: flow control: a debounced reindex, and a singleton with one follow-up."""

import os
import time

from celery import Celery

from celery_redlock import LockedTask

broker = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
app = Celery("tasks", broker=broker, backend=broker)
app.conf.redlock_nodes = os.environ.get("REDLOCK_NODES", "redis://localhost:6379/0").split(",")
app.conf.task_track_started = True  # try_it.py waits for the rebuild to start


# A burst of edits to one document reindexes it once, 2 s after the last edit,
# with the last edit's version. Each document debounces on its own.
@app.task(base=LockedTask, debounce=2.0, debounce_key="reindex:{doc_id}")
def reindex(doc_id, version):
    return f"doc {doc_id} indexed at version {version}"


# One rebuild per shard runs at a time; a publish while one runs queues one
# follow-up (which sees every change made before it was published), and
# further publishes return that follow-up.
@app.task(base=LockedTask, singleton=True, singleton_mode="queued")
def rebuild_search(shard, seconds=3.0):
    time.sleep(seconds)
    return f"shard {shard} rebuilt"
