"""``celery -A proj redlock``: the command group and its commands."""

from .commands import redlock

__all__ = ["redlock"]
