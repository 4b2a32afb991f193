"""try_it.py: run beside a worker (celery -A tasks worker) to see debounce and a follow-up."""

import time

from tasks import rebuild_search, reindex

from celery_redlock import errors

# 1. Ten quick edits of document 7: one reindex, with the last version; the
#    other nine results raise Superseded, naming the copy that ran.
edits = [reindex.delay(7, version) for version in range(1, 11)]
print(edits[-1].get(timeout=60))
superseded = 0
for edit in edits[:-1]:
    try:
        edit.get(timeout=60)
    except errors.Superseded:
        superseded += 1
print(f"{superseded} earlier edits superseded")

# 2. While a rebuild runs, a publish queues one follow-up; more publishes
#    return that follow-up instead of queueing others.
running = rebuild_search.delay("eu")
deadline = time.monotonic() + 60
while running.state != "STARTED":
    assert time.monotonic() < deadline, "the rebuild did not start"
    time.sleep(0.05)
follow_up = rebuild_search.delay("eu")
again = {rebuild_search.delay("eu").id for _ in range(3)}
print("one follow-up queued:", follow_up.id != running.id and again == {follow_up.id})
print(running.get(timeout=60), "then", follow_up.get(timeout=60))
