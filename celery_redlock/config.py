"""Settings and per-app state, by their documented path.

They live in :mod:`celery_redlock.tasks.settings`.
"""

from celery_redlock.tasks.settings import *  # noqa: F403
from celery_redlock.tasks.settings import __all__ as __all__
