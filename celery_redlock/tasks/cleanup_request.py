"""The worker's request for a LockedTask: :class:`CleanupRequest`, loaded by workers only.

Kept apart, and named by path, so a publisher imports no ``celery.worker`` module.
"""

from __future__ import annotations

from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from .app_setup import cleanup_logger, free_by_owner, request_owner

__all__ = ["CleanupRequest"]

#: Exceptions with which Celery reports that a run's pool process is gone.
_PROCESS_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


class CleanupRequest(Request):  # type: ignore[misc]
    """The worker's request for a LockedTask: frees the locks of a run whose process died.

    In the main process, by exact owner: a hard time limit, a terminate or a lost pool process
    ends the run without its ``finally`` (and a re-queue sends no ``task_failure``).
    """

    #: Set when Celery re-queues the message (see :meth:`reject`).
    _requeued = False

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """Celery's handling, then free the locks after a hard time limit."""
        super().on_timeout(soft, timeout)
        if not soft:
            self._free()

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        """Free the locks if the run's process is gone, then Celery's handling; log a re-queue."""
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback
        gone = isinstance(exc, _PROCESS_GONE)
        if gone:
            # Before Celery re-queues: a copy taken at once must not find its dead twin's lock.
            self._free()
        try:
            return super().on_failure(
                exc_info, send_failed_event=send_failed_event, return_ok=return_ok
            )
        finally:
            if gone and self._requeued:
                cleanup_logger.warning(
                    "task %s (%s): its pool process died (%s); re-queued, will run again",
                    self.task_name,
                    self.id,
                    type(exc).__name__,
                )

    def reject(self, requeue: bool = False) -> None:
        """Celery's reject; notes a re-queue for the log line of :meth:`on_failure`."""
        if requeue and not self.acknowledged:
            self._requeued = True
        super().reject(requeue=requeue)

    def _free(self) -> None:
        free_by_owner(self.task, self.id, self.args, self.kwargs, request_owner(self))
