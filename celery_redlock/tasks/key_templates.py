"""Key templates: ``"sync-user:{user_id}"`` rendered over a task call's arguments.

Templates are checked against the task's signature once, at definition; a call only names its
arguments (:class:`ArgumentPlan`). The lock names built from keys are here too.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kombu import serialization

from .._layout import glob_escape
from ..errors import ConfigurationError
from .misspelling import closest

__all__ = [
    "ArgumentPlan",
    "KeySource",
    "KeyTemplate",
    "as_delivered",
    "beat_interval_name",
    "beat_tick_name",
    "canonical_hash",
    "debounce_name",
    "queued_name",
    "singleton_name",
    "task_arguments",
]

#: What a key option accepts: a template, a callable ``(args, kwargs) -> str``, or nothing.
KeySource = str | Callable[[tuple[Any, ...], dict[str, Any]], str] | None

_EMPTY = inspect.Parameter.empty
_PLAIN = inspect.Parameter.POSITIONAL_OR_KEYWORD
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD


class ArgumentPlan:
    """A task's arguments by name, for one call: its signature, read once.

    Gives what ``signature.bind`` would, with a fast path for plain parameters; anything else
    goes through ``bind`` (and its usual ``TypeError``).
    """

    def __init__(self, signature: inspect.Signature) -> None:
        self.signature = signature
        parameters = signature.parameters
        self.names: tuple[str, ...] = tuple(parameters)
        self.takes_any_keyword = any(p.kind is _VAR_KEYWORD for p in parameters.values())
        self._plain = all(p.kind is _PLAIN for p in parameters.values())
        self._known = frozenset(self.names)
        self._defaults = {
            name: p.default for name, p in parameters.items() if p.default is not _EMPTY
        }

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, in signature order, defaults applied."""
        if not self._plain or len(args) > len(self.names):
            return self._bound(args, kwargs)
        values = dict(zip(self.names, args, strict=False))
        for name in kwargs:
            if name in values or name not in self._known:
                return self._bound(args, kwargs)  # a TypeError, from bind()
        values.update(kwargs)
        for name in self.names[len(args) :]:
            if name not in values:
                if name not in self._defaults:
                    return self._bound(args, kwargs)  # missing: a TypeError
                values[name] = self._defaults[name]
        return {name: values[name] for name in self.names}

    def _bound(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self.signature.parameters[name].kind is _VAR_KEYWORD:
                values.update(value)
            else:
                values[name] = value
        return values


def as_delivered(
    args: Sequence[Any], kwargs: Mapping[str, Any], serializer: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` as a worker receives them: through ``serializer`` and back.

    So publisher and worker render one key (JSON makes a tuple a list, an int dict key a str).
    Reads back with its own content type accepted, whatever ``accept_content`` says.

    Raises:
        kombu.exceptions.EncodeError: what publishing the call would raise.
    """
    dumps: Any = serialization.dumps  # kombu is untyped
    loads: Any = serialization.loads
    content_type, encoding, body = dumps((list(args), dict(kwargs)), serializer)
    delivered_args, delivered_kwargs = loads(body, content_type, encoding, accept={content_type})
    return tuple(delivered_args), dict(delivered_kwargs)


def _parameters(plan: ArgumentPlan) -> list[str]:
    """The names a template can use: the task's parameters, without ``*args``/``**kwargs``."""
    plain = (inspect.Parameter.VAR_POSITIONAL, _VAR_KEYWORD)
    return [name for name, p in plan.signature.parameters.items() if p.kind not in plain]


def _fields(plan: ArgumentPlan) -> str:
    """``{user_id}, {page}``: the task's parameters as template fields."""
    return ", ".join(f"{{{name}}}" for name in _parameters(plan))


def task_arguments(task_class: type) -> ArgumentPlan:
    """The argument plan of a task class (its ``run`` without ``self`` for bound tasks)."""
    raw = inspect.getattr_static(task_class, "run")
    if isinstance(raw, staticmethod):
        return ArgumentPlan(inspect.signature(raw.__func__))
    signature = inspect.signature(raw)
    parameters = list(signature.parameters.values())[1:]
    return ArgumentPlan(signature.replace(parameters=parameters))


def _canonical(value: Any, path: str) -> Any:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return int(value) if value.is_integer() else value
    if isinstance(value, list | tuple):
        return [_canonical(item, f"{path}[{n}]") for n, item in enumerate(value)]
    if isinstance(value, Mapping):
        items = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise _unhashable(path, name)
            items[name] = _canonical(item, f"{path}[{name!r}]")
        return items
    raise _unhashable(path, value)


def _unhashable(path: str, value: Any) -> ConfigurationError:
    return ConfigurationError(
        "singleton_key",
        f"argument {path} = {value!r} ({type(value).__name__}) has no stable hash; pass "
        "JSON-like arguments or give the task a singleton_key",
    )


def canonical_hash(arguments: Mapping[str, Any]) -> str:
    """A stable digest of a call's bound arguments: a singleton's key when it names none."""
    canonical = {name: _canonical(value, name) for name, value in arguments.items()}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def singleton_name(task_name: str, key: str) -> str:
    """The lock name of a singleton call of ``task_name`` keyed (or argument-hashed) ``key``."""
    return f"singleton:{task_name}:{key}"


def queued_name(singleton: str) -> str:
    """The lock name of the queued follow-up of the singleton ``singleton`` ("queued" mode)."""
    return f"{singleton}:queued"


def debounce_name(task_name: str, key: str) -> str:
    """The name of a debounced task's key: its record and its run lock."""
    return f"debounce:{task_name}:{key}" if key else f"debounce:{task_name}"


def beat_tick_name(singleton: str) -> str:
    """The lock name that marks one beat tick of the singleton called ``singleton``."""
    return f"beat-{singleton}"


def beat_interval_name(singleton: str) -> str:
    """The lock name that holds one interval of the singleton's interval beat entry."""
    return f"{beat_tick_name(singleton)}:interval"


class KeyTemplate:
    """A key built from a task call: a ``str.format`` template, a callable, or fixed.

    Fields name the task's arguments (``"{order.customer}"``, ``"{items[0]}"``); a callable gets
    ``(args, kwargs)``. Bad templates raise ``ConfigurationError`` naming ``option`` and the task.
    """

    def __init__(
        self,
        source: KeySource,
        *,
        default: str,
        task_name: str,
        option: str,
        plan: ArgumentPlan,
    ) -> None:
        self.source = source
        self.default = default
        self.plan = plan
        self.option = option
        self.task_name = task_name
        self.fields: tuple[str, ...] = ()
        if source is None or callable(source):
            return
        if not isinstance(source, str) or not source:
            raise ConfigurationError(
                option,
                "must be a non-empty str.format template or a callable (args, kwargs) -> str, "
                f"got {source!r}",
                task=task_name,
            )
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise ConfigurationError(
                option, f"{source!r} is not a valid template: {exc}", task=task_name
            ) from exc
        names = []
        for _, field, _, _ in parsed:
            if field is None:
                continue
            base = field.split(".", 1)[0].split("[", 1)[0]
            if not base or base.isdigit():
                raise ConfigurationError(
                    option,
                    f"{source!r} must name arguments ({_fields(plan) or 'the task takes none'}), "
                    "not positions ({} or {0})",
                    task=task_name,
                )
            names.append(base)
        for name in names:
            if name not in plan.names and not plan.takes_any_keyword:
                meant = closest(name, _parameters(plan))
                hint = f"; did you mean {{{meant}}}?" if meant is not None else ""
                raise ConfigurationError(
                    option,
                    f"{source!r} names {{{name}}}, which is not an argument of the task "
                    f"(it takes: {', '.join(_parameters(plan)) or 'nothing'}){hint}",
                    task=task_name,
                )
        self.fields = tuple(names)

    @property
    def fixed(self) -> str | None:
        """The one key this source renders whatever the call; ``None`` if calls differ."""
        if self.source is None:
            return self.default
        if callable(self.source) or self.fields:
            return None
        return self.source.format()

    def glob(self) -> str | None:
        """A Redis glob matching every key the template renders; ``None`` for a callable."""
        if self.source is None:
            return glob_escape(self.default)
        if callable(self.source):
            return None
        parts = []
        for literal, field, _, _ in string.Formatter().parse(self.source):
            parts.append(glob_escape(literal))
            if field is not None:
                parts.append("*")
        return "".join(parts)

    def render(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The key for one call."""
        source = self.source
        if source is None:
            return self.default
        if callable(source):
            key = source(tuple(args), dict(kwargs))
            if not isinstance(key, str) or not key:
                raise ConfigurationError(
                    self.option,
                    f"{source!r} returned {key!r}; it must return a non-empty str",
                    task=self.task_name,
                )
            return key
        arguments = self.plan.arguments(args, kwargs)
        try:
            return source.format_map(arguments)
        except KeyError as exc:  # a task taking **kwargs, called without the field
            raise ConfigurationError(
                self.option,
                f"{source!r} names {{{exc.args[0]}}}, which this call does not pass "
                f"(it passes: {', '.join(arguments) or 'nothing'})",
                task=self.task_name,
            ) from None

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults applied, ``**kwargs`` flattened."""
        return self.plan.arguments(args, kwargs)
