"""Run by test_transport_load.py in a subprocess that eventlet patches, as ``-P eventlet`` does.

Usage: python _eventlet_lock.py URL URL URL
Prints one JSON line: the operations of 50 green threads that succeeded, the
failures, how long a blocked waiter took to get a released lock and how its
green thread ended, and how often the fan-out's poll woke its green thread
again after it had returned.
"""

import eventlet

eventlet.monkey_patch()

import json  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from eventlet.event import Event  # noqa: E402

from celery_redlock import Redlock  # noqa: E402
from celery_redlock.transport import hub as shared_hub  # noqa: E402
from celery_redlock.transport.connection import POLLIN  # noqa: E402

#: A waiter that had to poll would sleep at least half of this before looking again.
RETRY_DELAY = 30.0


def main() -> None:
    urls = sys.argv[1:]
    # A node timeout no scheduling delay reaches on a loaded machine: only a
    # failure of the transport shows.
    redlock = Redlock(urls, node_timeout=2.0, retry_delay=RETRY_DELAY)
    done: list[int] = []
    failures: list[str] = []

    def work(number: int) -> None:
        for round_number in range(5):
            lock = redlock.lock(f"e:{number}:{round_number % 2}", ttl=10.0)
            try:
                if not lock.acquire(blocking=False):
                    failures.append(f"{number}: not acquired")
                elif not lock.release():
                    failures.append(f"{number}: release not confirmed")
                else:
                    done.append(1)
            except Exception as exc:
                failures.append(f"{number}: {type(exc).__name__}: {exc}")

    pool = eventlet.GreenPool(50)
    for number in range(50):
        pool.spawn_n(work, number)
    pool.waitall()

    # A blocking acquire is handed the lock by the holder's release.
    holder = redlock.lock("e:handoff", ttl=60.0)
    assert holder.acquire(blocking=False)
    got: list[float] = []
    ended: list[str] = []

    def wait() -> None:
        waiter = redlock.lock("e:handoff", ttl=60.0)
        try:
            if waiter.acquire(timeout=RETRY_DELAY / 3):
                got.append(time.monotonic())
                waiter.release()
            ended.append("returned")
        except BaseException as exc:  # reported, not lost in the green thread
            ended.append("".join(traceback.format_exception(exc)))

    waiter = eventlet.spawn(wait)
    eventlet.sleep(0.5)  # the waiter tried, found it held, and listens
    released = time.monotonic()
    holder.release()
    waiter.wait()
    if not waiter.dead:
        ended.append("still running when waiter.wait() returned")
    print(
        json.dumps(
            {
                "patched": not hasattr(select, "poll"),
                "done": len(done),
                "failures": failures[:20],
                "handoff": got[0] - released if got else None,
                "waiter": ended,
                "stray_wakeups": stray_wakeups(),
            }
        )
    )
    redlock.close()


def stray_wakeups(rounds: int = 20) -> int:
    """How many times the fan-out's poll switched back into its green thread after returning.

    Two descriptors ready at once (two nodes' replies, a reply and the hub's
    wake-up pipe): the poll returns, then the green thread waits for an
    event that nothing sets, which only a stray switch ends early.
    """
    strays = 0
    for _ in range(rounds):
        pairs = [socket.socketpair() for _ in range(2)]
        poller = shared_hub._poller()
        for ours, theirs in pairs:
            theirs.send(b"+OK\r\n")
            poller.register(ours.fileno(), POLLIN)
        assert poller.poll(1000)
        with eventlet.Timeout(0.05, False):
            Event().wait()
            strays += 1
        for pair in pairs:
            for end in pair:
                end.close()
    return strays


if __name__ == "__main__":
    main()
