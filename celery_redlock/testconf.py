"""``redlock_settings`` by its documented path; it lives in :mod:`.testing.temporary_settings`."""

from celery_redlock.testing.temporary_settings import *  # noqa: F403
from celery_redlock.testing.temporary_settings import __all__ as __all__
