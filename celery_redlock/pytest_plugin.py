"""The pytest plugin by its documented path; it lives in :mod:`.testing.pytest_plugin`."""

from celery_redlock.testing.pytest_plugin import *  # noqa: F403
from celery_redlock.testing.pytest_plugin import __all__ as __all__
