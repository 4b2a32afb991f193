"""Run by test_transport_load.py in a subprocess: many greenlets, one process.

Usage: python _gevent_load.py URL URL URL GREENLETS ROUNDS
Prints one JSON line: operations that succeeded, failures, and the state of
the fan-out's hub afterwards.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402

from celery_redlock import Redlock  # noqa: E402
from celery_redlock.transport import hub as shared_hub  # noqa: E402


def main() -> None:
    *urls, greenlets, rounds = sys.argv[1:]
    # 500 greenlets starting at once on two shared cores: the first calls make
    # the connections while every other greenlet packs its own call, so one
    # loop turn can take long. A node timeout no scheduling delay reaches
    # (seen: 0.5 s missed once), so that only a failure of the links shows.
    redlock = Redlock(urls, node_timeout=2.0)
    done: list[int] = []
    failures: list[str] = []

    def work(number: int) -> None:
        for round_number in range(int(rounds)):
            lock = redlock.lock(f"g:{number}:{round_number % 3}", ttl=10.0)
            try:
                if not lock.acquire(blocking=False):
                    failures.append(f"{number}: not acquired")
                    continue
                if not lock.release():
                    failures.append(f"{number}: release not confirmed")
                    continue
                done.append(1)
            except Exception as exc:
                failures.append(f"{number}: {type(exc).__name__}: {exc}")

    gevent.joinall([gevent.spawn(work, n) for n in range(int(greenlets))], raise_error=True)

    # Greenlets killed mid-exchange (GreenletExit inside the fan-out) leave
    # nothing behind: the next operations work and the hub is idle.
    victims = [gevent.spawn(work, 10_000 + n) for n in range(200)]
    gevent.sleep(0.002)
    gevent.killall(victims)
    after_kill = len(failures)
    gevent.joinall([gevent.spawn(work, 20_000 + n) for n in range(50)], raise_error=True)
    hub = shared_hub.shared()
    print(
        json.dumps(
            {
                "done": len(done),
                "failures": failures[:20],
                "failure_count": len(failures),
                "failures_after_kill": len(failures) - after_kill,
                "leading": hub.leading,
                "followers": len(hub.followers),
                "links": len(hub.links),
            }
        )
    )
    redlock.close()


if __name__ == "__main__":
    main()
