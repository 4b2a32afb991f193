"""Where a task's concurrency limit is held: one slot of a semaphore per run.

``@app.task(base=LockedTask, concurrency_limit=3, concurrency_key="export:{tenant_id}")``
lets at most 3 runs per key inside their body at once, across every worker.
:class:`SlotGate` takes the slot for a run (:class:`~..run_context.RunContext`),
after its locks and before the rate limit counts it:

- the slot is a :class:`~celery_redlock.lock.semaphore.Semaphore` slot owned by
  ``task_id|host:pid`` (as a lock is), renewed by the process heartbeat with
  the run's locks and released with them on every way out; the worker's
  main process frees it by that owner when the pool process dies
  (:func:`celery_redlock.tasks.app_setup.free_by_owner`);
- a run that finds every slot taken waits up to ``lock_timeout`` in the
  semaphore's queue, woken by a release, then ``on_lock_busy`` applies: a
  ``"retry"`` re-queue is a busy re-queue like a busy lock's: it does not
  spend ``max_retries``, backs off the same way and counts towards
  ``lock_busy_max_requeues``.
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
    """The concurrency limit of one run: the slot it takes, or what it does without one.

    Example (what :class:`~celery_redlock.tasks.run.TaskRun` does)::

        held = SlotGate(run, policy.concurrency).take()   # registered with the heartbeat
    """

    def __init__(self, run: RunContext, policy: ConcurrencyPolicy) -> None:
        self.run = run
        self.policy = policy
        self.key = policy.key.render(run.args, run.kwargs)

    def take(self) -> HeldLock:
        """Take a slot and hold it with the run's locks; on a full limit, ``on_lock_busy``.

        Waits up to ``lock_timeout`` for a slot (woken by the release of
        one, in arrival order among the waiters).
        """
        run, policy = self.run, self.policy
        owner = LockValue.owner_text(run.task_id, run.worker())
        slots = run.redlock.semaphore(self.key, policy.limit, ttl=run.ttl, owner=owner)
        return run.hold(slots, self.busy, timeout=policy.timeout)

    def busy(self, waited: float) -> NoReturn:
        """Every slot stayed taken: apply ``on_lock_busy`` (re-queue, skip or raise).

        A re-queue is a busy re-queue like a busy lock's: counted by the run's
        busy-requeue header (not ``max_retries``), backing off the same way,
        and ended by ``lock_busy_max_requeues``.
        """
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
