"""Key templates: ``"sync-user:{user_id}"`` rendered over a task call's arguments."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import ConfigurationError

__all__ = ["KeyTemplate", "task_signature"]

KeySource = str | Callable[[tuple[Any, ...], dict[str, Any]], str] | None


def task_signature(task_class: type) -> inspect.Signature:
    """The signature a task is called with (without ``self`` for bound tasks)."""
    raw = inspect.getattr_static(task_class, "run")
    if isinstance(raw, staticmethod):
        return inspect.signature(raw.__func__)
    signature = inspect.signature(raw)
    parameters = list(signature.parameters.values())[1:]
    return signature.replace(parameters=parameters)


class KeyTemplate:
    """A key built from a task call: a ``str.format`` template, a callable, or fixed.

    A template's fields name the task's arguments, defaults applied
    (``"user:{user_id}"``, ``"{order.customer}"``, ``"{items[0]}"``). A
    callable gets ``(args, kwargs)`` as the caller passed them.
    """

    def __init__(
        self, source: KeySource, *, default: str, task_name: str, option: str, signature: Any
    ) -> None:
        self.source = source
        self.default = default
        self.signature: inspect.Signature = signature
        self.fields: tuple[str, ...] = ()
        if source is None or callable(source):
            return
        if not isinstance(source, str) or not source:
            raise ConfigurationError(
                f"task {task_name!r}: {option} must be a non-empty str.format template or a "
                f"callable (args, kwargs) -> str, got {source!r}",
                option=option,
            )
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise ConfigurationError(
                f"task {task_name!r}: {option} {source!r} is not a valid template: {exc}",
                option=option,
            ) from exc
        names = []
        for _, field, _, _ in parsed:
            if field is None:
                continue
            base = field.split(".", 1)[0].split("[", 1)[0]
            if not base or base.isdigit():
                raise ConfigurationError(
                    f"task {task_name!r}: {option} {source!r} must name arguments "
                    "({user_id}), not positions ({} or {0})",
                    option=option,
                )
            names.append(base)
        parameters = self.signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        for name in names:
            if name not in parameters and not takes_any:
                raise ConfigurationError(
                    f"task {task_name!r}: {option} {source!r} names {{{name}}}, which is not "
                    f"an argument of the task (it takes: {', '.join(parameters) or 'nothing'})",
                    option=option,
                )
        self.fields = tuple(names)

    def render(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The key for one call."""
        source = self.source
        if source is None:
            return self.default
        if callable(source):
            key = source(tuple(args), dict(kwargs))
            if not isinstance(key, str) or not key:
                raise ConfigurationError(
                    f"key function {source!r} returned {key!r}; it must return a non-empty str",
                    option="key",
                )
            return key
        return source.format_map(self.arguments(args, kwargs))

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults applied, ``**kwargs`` flattened."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                values.update(value)
            else:
                values[name] = value
        return values
