"""An app with a misspelt task option: ``celery -A tests.worker.misspelt worker`` must not start."""

from __future__ import annotations

import os

from celery_redlock import LockedTask

from .support import create_app

app = create_app(
    os.environ["CR_BROKER"], os.environ["CR_NODES"].split(","), os.environ["CR_WITNESS"]
)


@app.task(base=LockedTask, name="t.misspelt", lock_key="report:{day}", lock_tll=5)
def misspelt(day: str) -> str:
    return day
