"""A beat schedule calling a rate-limited API, with a backfill on top: within the limit, none lost.

A price API allows 5 calls per second. A real (in-process) ``celery beat``
asks it for ACME's price every 0.5 s, and after a second a backfill of ten
other symbols is published at once: twelve-odd calls wanted in the first
second, room for five. ``global_rate_limit="5/s"`` with one
``rate_limit_key`` for every caller keeps the API's view within its limit:

* a backfill task over the limit is put back on the queue for when the
  window has room (not counted as a retry): every one of them runs;
* a beat tick over the limit is not published at all (the next tick comes
  anyway), and every tick that was published runs.

    python examples/rate_limited_beat.py                 # local redis-server nodes
    python examples/rate_limited_beat.py --nodes URL URL URL --broker URL
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any

from _support import elapsed, make_app, parse_args, redis_urls, running_worker, say
from celery.beat import EmbeddedService
from celery.signals import before_task_publish

from celery_redlock import LockedTask, signals

LIMIT = 5  # calls per second


class PriceAPI:
    """Stands in for the external API: records each call, and refuses any over its limit.

    Like a real API it measures on its own side, when each call arrives: in
    every window of one period, at most ``limit`` calls. The limiter's margin
    (``redlock_rate_limit_margin``, 50 ms) covers the moment between its
    decision and the call.
    """

    def __init__(self, limit: int, period: float = 1.0) -> None:
        self.limit = limit
        self.window = period
        self.calls: list[tuple[float, str, str]] = []  # (time, symbol, task id)
        self.refused = 0
        self._mutex = threading.Lock()

    def quote(self, symbol: str, task_id: str) -> float:
        with self._mutex:
            now = elapsed()
            recent = sum(1 for at, _, _ in self.calls if now - at < self.window)
            if recent >= self.limit:
                self.refused += 1  # a real API would answer 429 Too Many Requests
            self.calls.append((now, symbol, task_id))
        return 100.0 + len(symbol)

    def busiest_second(self) -> int:
        times = sorted(at for at, _, _ in self.calls)
        return max(
            (sum(1 for t in times[i:] if t < start + self.window) for i, start in enumerate(times)),
            default=0,
        )


api = PriceAPI(LIMIT)
beat_published: set[str] = set()
limited: Counter[str] = Counter()


def create_app(broker: str, nodes: list[str]) -> Any:
    """The app, its rate-limited task and a beat schedule that calls it every 0.5 s."""
    app = make_app("rate_limited_beat", broker, nodes)

    @app.task(
        base=LockedTask,
        bind=True,
        name="examples.fetch_price",
        shared=False,
        global_rate_limit=f"{LIMIT}/s",
        rate_limit_key="prices-api",  # one budget for every task calling this API
    )
    def fetch_price(self: Any, symbol: str) -> float:
        return api.quote(symbol, self.request.id)

    app.conf.beat_schedule = {
        "acme-price": {"task": "examples.fetch_price", "schedule": 0.5, "args": ("ACME",)},
    }
    return app


def note_beat_publish(headers: Any = None, **_: Any) -> None:
    if headers and headers.get("celery_beat_task"):
        beat_published.add(headers["id"])


def note_limited(sender: Any = None, action: str = "", **_: Any) -> None:
    limited[action] += 1


def called_ids() -> set[str]:
    return {task_id for _, _, task_id in api.calls}


def main() -> int:
    options = parse_args(__doc__)
    before_task_publish.connect(note_beat_publish, weak=False)
    signals.rate_limited.connect(note_limited, weak=False)
    with redis_urls(options) as urls:
        app = create_app(broker=urls[3], nodes=urls[:3])
        fetch_price = app.tasks["examples.fetch_price"]
        # Beat keeps its schedule in memory here; `celery beat` keeps it in a file.
        beat = EmbeddedService(app, thread=True, scheduler_cls="celery.beat:Scheduler")
        with running_worker(app, concurrency=4):
            beat.start()
            say(f"beat: ACME's price every 0.5 s; the API allows {LIMIT} calls/s")
            time.sleep(1.2)
            symbols = [f"SYM{n}" for n in range(10)]
            say(f"{elapsed():5.2f} s  backfill: 10 more symbols published at once")
            backfill = [fetch_price.delay(symbol) for symbol in symbols]
            for result in backfill:
                result.get(timeout=30)
            backfill_ids = {result.id for result in backfill}
            del backfill, result  # results talk to the broker: drop them while it runs
            say(f"{elapsed():5.2f} s  backfill done")
            time.sleep(1.0)
            beat.stop()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not beat_published <= called_ids():
                time.sleep(0.05)
        app.close()

    runs = Counter(task_id for _, _, task_id in api.calls)
    say()
    say(f"API calls: {len(api.calls)} in {api.calls[-1][0] - api.calls[0][0]:.1f} s")
    say(f"busiest second: {api.busiest_second()} calls (limit {LIMIT})")
    say(f"calls the API refused for going over its limit: {api.refused}")
    ran_backfill = len(backfill_ids & runs.keys())
    say(f"backfill: {ran_backfill}/10 ran; re-queued while over the limit: {limited['retry']}")
    ran_beat = len(beat_published & runs.keys())
    say(
        f"beat: {ran_beat}/{len(beat_published)} published ticks ran; "
        f"ticks not published while over the limit: {limited['skip-publish']}"
    )
    ok = (
        api.refused == 0
        and api.busiest_second() <= LIMIT
        and ran_backfill == 10
        and ran_beat == len(beat_published) > 0
        and all(count == 1 for count in runs.values())
    )
    say("OK: within the limit, no task lost" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
