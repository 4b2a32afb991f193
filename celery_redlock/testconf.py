"""An app's ``redlock_*`` settings for a test, by their documented path.

They live in :mod:`celery_redlock.testing.temporary_settings`.
"""

from celery_redlock.testing.temporary_settings import *  # noqa: F403
from celery_redlock.testing.temporary_settings import __all__ as __all__
