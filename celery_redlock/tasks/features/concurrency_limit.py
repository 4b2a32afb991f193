"""Where a task's concurrency limit is held: one slot of a semaphore per run.

``@app.task(base=LockedTask, concurrency_limit=3, concurrency_key="export:{tenant_id}")``
lets at most 3 runs per key inside their body at once, across every worker. The slot is owned,
renewed and freed like a lock (``task_id|host:pid``); a full limit is waited for and handled as
a busy lock (``lock_timeout``, then ``on_lock_busy``).
"""

from __future__ import annotations

from typing import NoReturn

from ... import signals
from ..._layout import LockValue
from ...lock.held_lease import HeldLock
from ..feature_policies import ConcurrencyPolicy
from ..run_context import RunContext
from ..run_endings import Taken, give_up_waiting

__all__ = ["SlotGate"]


class SlotGate:
    """The concurrency limit of one run: the slot it takes, or what it does without one."""

    def __init__(self, run: RunContext, policy: ConcurrencyPolicy) -> None:
        self.run = run
        self.policy = policy
        self.key = policy.key.render(run.args, run.kwargs)

    def take(self) -> HeldLock:
        """Take a slot (waiting up to ``lock_timeout``) and hold it with the run's locks."""
        run, policy = self.run, self.policy
        owner = LockValue.owner_text(run.task_id, run.worker())
        slots = run.redlock.semaphore(self.key, policy.limit, ttl=run.ttl, owner=owner)
        return run.hold(slots, self.busy, timeout=policy.timeout)

    def busy(self, waited: float) -> NoReturn:
        """Every slot stayed taken: apply ``on_lock_busy``, as for a busy lock."""
        policy, key = self.policy, self.key
        taken = Taken(
            key=key,
            subject=f"concurrency limit {key!r}",
            state="full",
            found=f"all {policy.limit} slots of concurrency key {key!r} are taken",
            signal=signals.slot_busy,
            details={"limit": policy.limit},
        )
        give_up_waiting(self.run, taken, policy, waited)
