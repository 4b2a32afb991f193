"""What every example needs around its scenario: Redis nodes and a real worker.

Not an example itself. ``redis_urls`` starts three lock nodes and a broker
(throw-away ``redis-server`` processes on free ports) unless the command line
names your own with ``--nodes``/``--broker``; ``running_worker`` runs a real
Celery worker (threads pool) in this process and stops it on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock.testing import RedisServer

_STARTED = time.monotonic()


def parse_args(doc: str | None, *, broker: bool = True) -> argparse.Namespace:
    """``--nodes URL URL URL`` and, for Celery examples, ``--broker URL``."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--nodes", nargs="+", metavar="URL", help="your own lock nodes (default: start 3)"
    )
    if broker:
        parser.add_argument("--broker", metavar="URL", help="your own Redis broker, with --nodes")
    options = parser.parse_args()
    if broker and bool(options.nodes) != bool(options.broker):
        parser.error("give --nodes and --broker together, or neither")
    return options


@contextlib.contextmanager
def redis_urls(options: argparse.Namespace, *, broker: bool = True) -> Iterator[list[str]]:
    """The lock node URLs, then the broker's (if wanted); local servers unless given."""
    if options.nodes:
        yield [*options.nodes, *([options.broker] if broker else [])]
        return
    with RedisServer.start_many(4 if broker else 3) as servers:
        ports = ", ".join(str(server.port) for server in servers)
        what = "3 lock nodes and a broker" if broker else "3 lock nodes"
        say(f"started {what}: redis-server on ports {ports}")
        try:
            yield servers.urls
        finally:
            # Celery results left in reference cycles (a retried task's
            # exception) unsubscribe from the broker when collected: let
            # them go while it still answers, not after it has stopped.
            gc.collect()


def make_app(name: str, broker: str, nodes: list[str]) -> Celery:
    """A Celery app on ``broker`` (also its result backend) locking on ``nodes``."""
    app = Celery(name, broker=broker, backend=broker, set_as_current=False)
    app.conf.update(
        redlock_nodes=nodes,
        redlock_key_prefix=f"examples:{name}:",
        task_default_queue=f"examples.{name}",
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    return app


@contextlib.contextmanager
def running_worker(app: Celery, concurrency: int = 4) -> Iterator[Any]:
    """A real worker (threads pool) consuming ``app``'s queue in this process."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as worker:
        yield worker


def elapsed() -> float:
    """Seconds since the example started."""
    return time.monotonic() - _STARTED


def say(message: str = "") -> None:
    """Print a line at once."""
    print(message, flush=True)
