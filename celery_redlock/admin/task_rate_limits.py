"""The rate limits an app's tasks declare, and which keys each may count on.

Read from the app alone, nothing from Redis; their use now is :mod:`.rate_limits`'.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .._layout import period_key
from ..ratelimit import Algorithm
from ..ratelimit.rates import DynamicRate, Rate
from ..tasks.feature_policies import TaskLimit
from ..tasks.misspelling import closest
from ..tasks.policies import TaskPolicy
from ..tasks.settings import Settings
from ..tasks.task_table import entry_policy

__all__ = ["TaskRateLimit", "task_limits"]


@dataclasses.dataclass(frozen=True)
class TaskRateLimit:
    """One limit a task declares (``global_rate_limit``)."""

    task: str
    #: The limit's key: fixed, or a template over the task's arguments.
    key: str
    #: The configured rate as text (a callable rate: its name).
    rate: str
    algorithm: Algorithm
    #: The key is the same for every call (no template field, no callable).
    fixed_key: bool
    #: The rate, or ``None`` for a callable rate.
    parsed: Rate | None = None
    #: A Redis glob matching every key the limit counts on; ``None`` for a key function.
    glob: str | None = None
    #: The rate as the task gives it: a :class:`Rate`, or a callable rate.
    source: Rate | DynamicRate | None = dataclasses.field(default=None, compare=False)

    def counts_on(self, key: str) -> bool:
        """Whether this limit may count on ``key`` (any key, when a function names it)."""
        if self.fixed_key:
            return self.key == key
        if self.glob is None:
            return True
        return _glob_regex(self.glob).fullmatch(key) is not None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "task": self.task,
            "key": self.key,
            "rate": self.rate,
            "algorithm": self.algorithm,
            "fixed_key": self.fixed_key,
            "glob": self.glob,
        }


def task_limits(app: Any, settings: Settings, task: str | None = None) -> list[TaskRateLimit]:
    """Every limit the app's tasks (or task ``task``) declare, ``redlock_tasks`` included.

    Raises:
        LookupError: the app has no task ``task``, or it has no limit.
        ConfigurationError: a task's options are wrong (``check`` reports those).
    """
    app.loader.import_default_modules()
    if task is not None and task not in app.tasks:
        meant = closest(task, [name for name in app.tasks if not name.startswith("celery.")])
        hint = f"; did you mean {meant!r}?" if meant is not None else ""
        raise LookupError(f"this app has no task {task!r}{hint}")
    policies: dict[str, TaskPolicy] = {}
    for name, each in sorted(app.tasks.items()):
        policy = getattr(each, "_redlock_policy", None)
        if isinstance(policy, TaskPolicy):
            policies[name] = policy
    for name, options in settings.tasks.items():
        each = app.tasks.get(name)
        if each is not None:
            # An entry's options are the ones applied to the task (task_table).
            policies[name] = entry_policy(name, type(each), options)
    found = []
    for name, policy in sorted(policies.items()):
        if task is not None and name != task:
            continue
        for limit in policy.rate.limits if policy.rate is not None else ():
            found.append(_declared(name, limit))
    if task is not None and not found:
        raise LookupError(f"task {task!r} has no global_rate_limit")
    return found


def _declared(task: str, limit: TaskLimit) -> TaskRateLimit:
    template = limit.key
    source = template.source
    if source is None:
        key, fixed = template.default, True
    elif callable(source):
        key, fixed = getattr(source, "__qualname__", repr(source)), False
    else:
        key, fixed = source, not template.fields
        if fixed:
            key = source.format_map({})
    glob = template.glob()
    if limit.period is not None:
        key = period_key(key, limit.period)
        glob = None if glob is None else period_key(glob, limit.period)
    parsed = limit.rate if isinstance(limit.rate, Rate) else None
    return TaskRateLimit(
        task, key, limit.describe(), limit.algorithm, fixed, parsed, glob, limit.rate
    )


def _glob_regex(glob: str) -> re.Pattern[str]:
    """A glob of ``KeyTemplate.glob`` (``*``, ``?`` and backslash escapes) as a regex."""
    parts, escaped = [], False
    for char in glob:
        if escaped:
            parts.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)
