"""An app configured as Django's are, through ``namespace="CELERY"``, with one bad setting.

``CR_BAD=ttl``: ``CELERY_REDLOCK_DEFAULT_TTL`` is not a number of seconds;
``CR_BAD=tasks``: a ``CELERY_REDLOCK_TASKS`` entry has a misspelt option.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_redlock import LockedTask, setup


class Settings:
    CELERY_BROKER_URL = os.environ["CR_BROKER"]
    CELERY_REDLOCK_NODES = os.environ["CR_NODES"].split(",")
    CELERY_REDLOCK_DEFAULT_TTL: Any = "a minute" if os.environ.get("CR_BAD") == "ttl" else 60
    CELERY_REDLOCK_TASKS: Any = (
        {"namespaced.report": {"singleton": True, "singelton_ttl": 60}}
        if os.environ.get("CR_BAD") == "tasks"
        else {}
    )


app = Celery("namespaced")
app.config_from_object(Settings, namespace="CELERY")
setup(app)


@app.task(base=LockedTask, name="namespaced.sync", lock_key="sync")
def sync() -> None:
    return None


@app.task(name="namespaced.report")
def report(day: str) -> str:
    return day
