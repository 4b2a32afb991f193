"""A task module as a library ships it: a plain ``shared_task``, no celery_redlock in sight.

``redlock_tasks`` makes ``thirdparty.nightly`` a singleton by name. The task
records its runs on the witness of whichever app runs it (``app.witness``,
see :func:`tests.worker.support.create_app`).
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task


@shared_task(bind=True, name="thirdparty.nightly")
def nightly(self: Any, day: str, duration: float = 1.0) -> str:
    self.app.witness.enter(f"nightly:{day}", self.request.id)
    time.sleep(duration)
    self.app.witness.leave(f"nightly:{day}", self.request.id)
    return str(self.request.id)
