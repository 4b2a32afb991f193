"""At most 3 exports at once, from 8 threads (or processes, or hosts) sharing 3 nodes."""

import os
import threading
import time

from celery_redlock import Redlock

nodes = os.environ.get("REDLOCK_NODES", "redis://localhost:6379/0").split(",")
redlock = Redlock(nodes)
running, most = 0, 0
counting = threading.Lock()


def export(n: int) -> None:
    global running, most
    # A slot lives 30 s unless renewed; auto_renew keeps it while the block runs.
    with redlock.semaphore("exports:acme", limit=3, ttl=30.0, auto_renew=True):
        with counting:
            running += 1
            most = max(most, running)
        time.sleep(0.2)  # the export
        with counting:
            running -= 1


threads = [threading.Thread(target=export, args=(n,)) for n in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(f"OK: 8 exports, at most {most} at once")
