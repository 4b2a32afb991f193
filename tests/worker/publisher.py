"""A publishing process that finalizes its app before importing a task module.

``python -m tests.worker.publisher`` builds the test app from the ``CR_*``
environment variables with ``redlock_tasks`` naming ``thirdparty.nightly``,
calls ``setup(app)``, finalizes the app, and only then imports
:mod:`tests.worker.thirdparty` (as a web process does when a view imports a
library's tasks late). It publishes ``thirdparty.nightly`` ``CR_COPIES``
times with the same arguments and prints the task ids as JSON. It logs at
INFO to stderr, so that a test sees any ERROR it logs.
"""

from __future__ import annotations

import importlib
import json
import logging
import os

from celery_redlock import setup

from .support import create_app

logging.basicConfig(level=logging.INFO)
app = create_app(
    os.environ["CR_BROKER"],
    os.environ["CR_NODES"].split(","),
    os.environ["CR_WITNESS"],
    redlock_tasks={"thirdparty.nightly": {"singleton": True}},
)
setup(app)
app.finalize()
importlib.import_module("tests.worker.thirdparty")
nightly = app.tasks["thirdparty.nightly"]
ids = [nightly.delay("2026-01-01").id for _ in range(int(os.environ.get("CR_COPIES", "3")))]
print(json.dumps(ids))
