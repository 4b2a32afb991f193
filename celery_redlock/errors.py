"""The exceptions raised by celery_redlock.

One ``except RedlockError`` catches them all::

    RedlockError
     ├── ConfigurationError      bad option, argument or setting (also a ValueError)
     ├── LockError               something went wrong with one lock key
     │    ├── LockNotAcquired    another owner holds the key
     │    ├── QuorumUnavailable  fewer than a majority of nodes answered
     │    └── LockLost           a lock we held expired or was taken over
     ├── DuplicateTask           a singleton task is already queued or running
     ├── Superseded              a debounced copy was replaced by a later publish
     ├── DebounceUnavailable     the Redis holding debounce records did not answer
     ├── RateLimited             a global rate limit refused a task
     └── RateLimiterUnavailable  the Redis holding rate-limit counters did not answer

``QuorumUnavailable`` is not a ``LockNotAcquired``: a busy key (wait) and unreachable Redis
(fail open or closed) call for different reactions. A wrapped redis-py error is the
``__cause__``. Each rebuilds from its args, as a result backend does.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DebounceUnavailable",
    "DuplicateTask",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "QuorumUnavailable",
    "RateLimited",
    "RateLimiterUnavailable",
    "RedlockError",
    "Superseded",
]


class RedlockError(Exception):
    """Root of every exception raised by celery_redlock."""


class ConfigurationError(RedlockError, ValueError):
    """An option, argument or ``app.conf`` setting has a bad value.

    Raised as early as possible, built from its parts (``problem``: the message without the
    names) so every message has one shape::

        ConfigurationError("lock_ttl", "must be > 0 seconds, got 0", task="proj.sync")
        # task 'proj.sync': lock_ttl: must be > 0 seconds, got 0
    """

    def __init__(self, option: str, problem: str, task: str | None = None) -> None:
        super().__init__(option, problem, task)  # the args rebuild it (a result backend's way)
        self.option = option
        self.problem = problem
        self.task = task

    def __str__(self) -> str:
        option, problem, task = self.args
        return f"{option}: {problem}" if task is None else f"task {task!r}: {option}: {problem}"

    def with_context(
        self, *, option: str | None = None, task: str | None = None
    ) -> ConfigurationError:
        """The same problem, reported under another option name or for a task."""
        return ConfigurationError(option or self.option, self.problem, task=task or self.task)


class LockError(RedlockError):
    """Base for failures concerning one lock ``key`` (as given, without the key prefix)."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class LockNotAcquired(LockError):
    """The key is held by another owner and could not be taken within ``timeout`` seconds."""

    def __init__(self, message: str, *, key: str = "", timeout: float | None = None) -> None:
        super().__init__(message, key=key)
        self.timeout = timeout


class QuorumUnavailable(LockError):
    """Fewer than a majority of the Redis nodes answered: who holds the key is unknown.

    ``answered`` nodes of the ``needed`` quorum; ``failures``: ``{node: error}`` of the rest.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str = "",
        answered: int = 0,
        needed: int = 0,
        failures: dict[str, BaseException] | None = None,
    ) -> None:
        super().__init__(message, key=key)
        self.answered = answered
        self.needed = needed
        self.failures = dict(failures or {})


class LockLost(LockError):
    """A lock this owner held is no longer held (expired, or taken over).

    Work done after this point is unprotected; fencing tokens let a storage layer reject it.
    """


class DuplicateTask(RedlockError):
    """A singleton task with the same arguments is already queued or running.

    Attributes:
        task_id: id of the copy that holds the singleton (``key``).
        ttl: seconds the key still holds for it unless renewed (celery-once's
            ``AlreadyQueued.countdown``): what is left of ``singleton_ttl`` while queued, renewed
            to ``lock_ttl`` while running; ``None`` when unknown, ``0.0`` when already gone.
    """

    def __init__(
        self,
        message: str,
        *,
        task_name: str = "",
        task_id: str | None = None,
        key: str = "",
        ttl: float | None = None,
    ) -> None:
        super().__init__(message)
        self.task_name = task_name
        self.task_id = task_id
        self.key = key
        self.ttl = ttl


class Superseded(RedlockError):
    """A copy of a debounced task did not run: a later publish of its key replaced it.

    A replaced copy's result fails with it, so ``result.get()`` raises instead of waiting
    forever; ``task_id`` is the copy that replaced it.
    """

    def __init__(
        self, message: str, *, task_name: str = "", task_id: str | None = None, key: str = ""
    ) -> None:
        super().__init__(message)
        self.task_name = task_name
        self.task_id = task_id
        self.key = key


class DebounceUnavailable(RedlockError):
    """The Redis holding debounce records did not answer, or refused the script.

    Never raised to ``delay()``'s caller: the publish goes unrecorded; a run is re-queued.
    """

    def __init__(self, message: str, *, node: str = "") -> None:
        super().__init__(message)
        self.node = node


class RateLimited(RedlockError):
    """A global rate limit on ``key`` refused the call; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, key: str = "", retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after = retry_after


class RateLimiterUnavailable(RedlockError):
    """The Redis that holds rate-limit counters did not answer, or refused the command.

    No decision was made (after a timeout the hit may have been counted); the caller fails
    open or closed. ``node``: the server's name, without its password.
    """

    def __init__(self, message: str, *, key: str = "", node: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.node = node
