"""A process publishing a burst of ``t.debounced`` for one document, in turn with others.

``python -m tests.worker.debounce_publisher`` builds the test app from the
``CR_*`` environment variables and publishes ``t.debounced(CR_DOC, n)``
``CR_COPIES`` times. Publishers take turns through a token on the witness
(``debounce:turn``), so publishes from several processes are totally ordered:
each publish takes the token, numbers itself (``n``, from ``debounce:n``),
publishes, records ``n task_id monotonic_before`` on ``debounce:published``
and gives the token back, then pauses ``CR_PAUSE`` seconds.
It says it is ready on ``debounce:ready`` before it waits for its first turn.
"""

from __future__ import annotations

import os
import time

from .support import create_app

app = create_app(
    os.environ["CR_BROKER"], os.environ["CR_NODES"].split(","), os.environ["CR_WITNESS"]
)
task = app.tasks["t.debounced"]
client = app.witness.client
doc = os.environ["CR_DOC"]
pause = float(os.environ["CR_PAUSE"])
client.rpush("debounce:ready", os.getpid())
for _ in range(int(os.environ["CR_COPIES"])):
    token = client.blpop(["debounce:turn"], timeout=60)
    assert token is not None, "no turn within 60 s"
    n = int(client.incr("debounce:n"))
    before = time.monotonic()
    result = task.delay(doc, n)
    client.rpush("debounce:published", f"{n} {result.id} {before:.6f}")
    client.rpush("debounce:turn", "token")
    time.sleep(pause)
