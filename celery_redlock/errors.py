"""The exceptions raised by celery_redlock.

Every exception derives from :class:`RedlockError`, so one ``except`` clause
catches anything this package raises::

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

``QuorumUnavailable`` is deliberately *not* a ``LockNotAcquired``: a busy key
and an unreachable Redis call for different reactions (wait for the holder, or
fail open/closed), so callers can tell them apart.

Errors that wrap a redis-py exception keep it as ``__cause__``. Every
exception can be rebuilt from its args (a ConfigurationError's are its parts),
as Celery does when it reads a task's failure back from the result backend.
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

    Raised as early as possible (when a lock, task or worker is defined) and
    always names the option at fault. It is built from its parts, so every
    message has the same shape::

        ConfigurationError("lock_ttl", "must be > 0 seconds, got 0", task="proj.sync")
        # task 'proj.sync': lock_ttl: must be > 0 seconds, got 0

    Attributes:
        option: name of the offending option, argument or setting.
        problem: what is wrong with it: the message without the names.
        task: the task whose option it is, if any.
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
    """Base for failures concerning one lock key.

    Attributes:
        key: the lock name as the caller gave it (without the key prefix).
    """

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class LockNotAcquired(LockError):
    """The key is held by another owner and could not be taken in time.

    Attributes:
        key: the lock name.
        timeout: how long the caller was prepared to wait, in seconds.
    """

    def __init__(self, message: str, *, key: str = "", timeout: float | None = None) -> None:
        super().__init__(message, key=key)
        self.timeout = timeout


class QuorumUnavailable(LockError):
    """Fewer than a majority of the Redis nodes answered.

    Nothing can be said about who holds the key; the caller decides whether
    to fail open or closed.

    Attributes:
        key: the lock name.
        answered: how many nodes answered.
        needed: the quorum (``N // 2 + 1``).
        failures: ``{node: error}`` for the nodes that did not answer.
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

    Raised by :meth:`Lock.extend` and by a task's ``heartbeat()``. Work done
    under the lock after this point is no longer protected; fencing tokens let
    a storage layer reject it.
    """


class DuplicateTask(RedlockError):
    """A singleton task with the same arguments is already queued or running.

    Attributes:
        task_name: the task's registered name.
        task_id: id of the copy that holds the singleton.
        key: the singleton key.
        ttl: seconds the key still holds for that copy (on a majority of the
            nodes) unless renewed, as celery-once's ``AlreadyQueued.countdown``:
            for a queued copy, what is left of ``singleton_ttl``; a running
            copy's heartbeat renews it to ``lock_ttl`` while the run goes on.
            ``None`` when unknown; ``0.0`` when the key was already gone.
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

    The result of every copy a burst replaced is a failure with this error,
    so ``result.get()`` on it raises instead of waiting forever; the copy
    that runs is ``task_id``.

    Attributes:
        task_name: the task's registered name.
        task_id: id of the later copy that replaced this one (the key's latest
            publish when this copy came up to run).
        key: the debounce key.
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

    Never raised to a caller of ``delay()``: a publish is then sent
    unrecorded, and a run is re-queued with this error as its retry reason.

    Attributes:
        node: the server's display name (password removed).
    """

    def __init__(self, message: str, *, node: str = "") -> None:
        super().__init__(message)
        self.node = node


class RateLimited(RedlockError):
    """A global rate limit refused the call.

    Attributes:
        key: the rate-limit key.
        retry_after: seconds until a call may be admitted again.
    """

    def __init__(self, message: str, *, key: str = "", retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after = retry_after


class RateLimiterUnavailable(RedlockError):
    """The Redis that holds rate-limit counters did not answer, or refused the command.

    No decision was made. When the cause is a timeout the hit may or may not
    have been counted; the caller chooses to fail open (run anyway) or closed
    (retry later).

    Attributes:
        key: the rate-limit key, as the caller gave it.
        node: the server's display name (password removed).
    """

    def __init__(self, message: str, *, key: str = "", node: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.node = node
