"""Per-user sync with LockedTask: one sync per user at a time, users in parallel.

Five syncs are queued at once: three for user 1, two for user 2. The lock key
``sync-user:{user_id}`` makes syncs of one user wait for each other (a sync
that finds the lock busy is re-queued until it is free), while
different users sync side by side. Each sync takes longer than the lock's
1-second ttl; ``self.heartbeat()`` after every page keeps the lock alive.

    python examples/locked_sync.py                      # local redis-server nodes
    python examples/locked_sync.py --nodes URL URL URL --broker URL
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from _support import elapsed, make_app, parse_args, redis_urls, running_worker, say

from celery_redlock import LockedTask

PAGES = 6
PAGE_SECONDS = 0.2  # six pages: 1.2 s per sync, longer than the 1 s lock ttl

#: (user_id, task_id, started, finished, fencing token, lowest lock validity seen)
runs: list[tuple[int, str, float, float, int, float]] = []
runs_lock = threading.Lock()


def create_app(broker: str, nodes: list[str]) -> Any:
    """The app and its one task, ``sync_user``."""
    app = make_app("locked_sync", broker, nodes)

    @app.task(
        base=LockedTask,
        bind=True,
        name="examples.sync_user",
        shared=False,
        lock_key="sync-user:{user_id}",
        lock_ttl=1.0,  # short, to show the heartbeat at work; minutes in real life
        lock_progress_timeout=5,  # a sync stuck for 5 s without a page loses its lock
    )
    def sync_user(self: Any, user_id: int) -> int:
        started = elapsed()
        lowest = self.lock.validity
        for _page in range(PAGES):
            time.sleep(PAGE_SECONDS)  # fetch one page from the remote system and store it
            self.heartbeat()  # progress: renews the lock; LockLost if it were gone
            lowest = min(lowest, self.lock.validity)
        token = int(self.lock.fencing_token)
        with runs_lock:
            runs.append((user_id, self.request.id, started, elapsed(), token, lowest))
        return token

    return app


def overlapping(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return bool(a[2] < b[3] and b[2] < a[3])


def main() -> int:
    options = parse_args(__doc__)
    with redis_urls(options) as urls:
        app = create_app(broker=urls[3], nodes=urls[:3])
        sync_user = app.tasks["examples.sync_user"]
        with running_worker(app, concurrency=5):
            say("queued: 3 syncs of user 1, 2 syncs of user 2 (lock ttl 1 s, each sync 1.2 s)")
            results = [sync_user.delay(user) for user in (1, 1, 1, 2, 2)]
            for result in results:
                result.get(timeout=30)
            del results, result  # results talk to the broker: drop them while it runs
        app.close()

    say("\nuser  task      ran from    to      fencing token  lowest validity")
    for user, task_id, started, finished, token, lowest in sorted(runs, key=lambda r: r[2]):
        say(
            f"  {user}   {task_id[:8]}  {started:6.2f} s  {finished:6.2f} s  "
            f"{token:>13}  {lowest:.2f} s"
        )
    same_user = [
        (a, b) for a in runs for b in runs if a is not b and a[0] == b[0] and overlapping(a, b)
    ]
    across_users = [(a, b) for a in runs for b in runs if a[0] != b[0] and overlapping(a, b)]
    kept_alive = all(run[5] > 0 for run in runs)
    say()
    say(f"syncs of one user overlapping: {len(same_user) // 2} (expected 0)")
    say(f"users 1 and 2 synced side by side: {'yes' if across_users else 'no'}")
    say(f"every lock outlived its 1 s ttl through heartbeats: {'yes' if kept_alive else 'no'}")
    ok = len(runs) == 5 and not same_user and bool(across_users) and kept_alive
    say("OK: same-user syncs serialised, users in parallel" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
