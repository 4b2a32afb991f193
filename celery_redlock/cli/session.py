"""What the ``celery redlock`` commands share: the session, exit statuses, output."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

from ..admin import Admin
from ..errors import ConfigurationError

__all__ = [
    "EXIT_CONFIG",
    "EXIT_UNAVAILABLE",
    "BadConfiguration",
    "Session",
    "duration",
    "json_option",
    "table",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")

#: Exit status when fewer than a majority of the lock nodes answered.
EXIT_UNAVAILABLE = 1
#: Exit status for bad ``redlock_*`` settings (like click's usage errors).
EXIT_CONFIG = 2


class BadConfiguration(click.ClickException):
    """A ``redlock_*`` setting is wrong: the message names it; exit status 2."""

    exit_code = EXIT_CONFIG

    def __init__(self, error: ConfigurationError | str) -> None:
        super().__init__(f"celery_redlock configuration: {error}")


class Session:
    """What the subcommands share: an :class:`Admin` for the app, and colours."""

    def __init__(self, cli: Any, app: Any, timeout: float) -> None:
        self.cli = cli
        self.admin = Admin(app, timeout=timeout)

    def call(self, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``method(*args, **kwargs)``, with bad settings as :class:`BadConfiguration`."""
        try:
            return method(*args, **kwargs)
        except ConfigurationError as exc:
            raise BadConfiguration(exc) from exc

    def style(self, text: str, **styles: Any) -> str:
        """``text`` in colour unless the user asked for none (``celery -C``)."""
        if getattr(self.cli, "no_color", False):
            return text
        return click.style(text, **styles)

    def close(self) -> None:
        """Close the admin's connections."""
        self.admin.close()


def json_option(function: _F) -> _F:
    """The ``--json`` flag every command takes (its value arrives as ``as_json``)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print JSON for scripts instead of a table.",
    )(function)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell (styles in a cell do not count)."""
    rows = [list(headers), *map(list, rows)]
    widths = [
        max(len(click.unstyle(row[column])) for row in rows) for column in range(len(headers))
    ]
    lines = []
    for row in rows:
        cells = [
            cell + " " * (width - len(click.unstyle(cell)))
            for cell, width in zip(row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """``12.3s``, ``4m05s``, ``2h03m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
