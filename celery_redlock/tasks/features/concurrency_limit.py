"""Where a task's concurrency limit is held: one slot of a semaphore per run.

``@app.task(base=LockedTask, concurrency_limit=3, concurrency_key="export:{tenant_id}")``
lets at most 3 runs per key inside their body at once, across every worker.
:class:`SlotGate` takes the slot for a :class:`~celery_redlock.tasks.run.TaskRun`,
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

from typing import TYPE_CHECKING, NoReturn

from ... import _clock, signals
from ..._layout import LockValue
from ...errors import QuorumUnavailable
from ...lock.renewal import HeldLock, heartbeat
from ..app_state import redlock_for
from ..feature_policies import ConcurrencyPolicy
from ..run_endings import Taken

if TYPE_CHECKING:
    from ..run import TaskRun

__all__ = ["SlotGate"]


class SlotGate:
    """The concurrency limit of one run: the slot it takes, or what it does without one.

    Example (what :class:`~celery_redlock.tasks.run.TaskRun` does)::

        held = SlotGate(run, policy.concurrency).take()   # registered with the heartbeat
    """

    def __init__(self, run: TaskRun, policy: ConcurrencyPolicy) -> None:
        self.run = run
        self.policy = policy
        self.key = policy.key.render(run.args, run.kwargs)

    def take(self) -> HeldLock:
        """Take a slot and register it with the heartbeat; on a full limit, ``on_lock_busy``.

        Waits up to ``lock_timeout`` for a slot (woken by the release of
        one, in arrival order among the waiters).
        """
        run, policy, key = self.run, self.policy, self.key
        task, task_id = run.task, run.task_id
        owner = LockValue.owner_text(task_id, run.worker())
        slots = redlock_for(task.app).semaphore(key, policy.limit, ttl=run.ttl, owner=owner)
        started = _clock.monotonic()
        try:
            acquired = slots.acquire(blocking=policy.timeout > 0, timeout=policy.timeout)
        except QuorumUnavailable as exc:
            run.requeue_unavailable(f"concurrency slot {key!r} not taken", exc)
        waited = _clock.monotonic() - started
        if not acquired:
            self.busy(waited)
        held = heartbeat().hold(
            slots,
            task_id=task_id,
            progress_timeout=run.policy.progress_timeout,
            on_lost=run.send_lost,
        )
        signals.slot_acquired.send(
            sender=task,
            task_id=task_id,
            key=key,
            limit=policy.limit,
            slot=slots.slot,
            waited=waited,
        )
        return held

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
        self.run.give_up_waiting(taken, policy, waited)
