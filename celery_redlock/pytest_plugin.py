"""The pytest plugin, by its documented path.

``pytest_plugins = ["celery_redlock.pytest_plugin"]``; it lives in
:mod:`celery_redlock.testing.pytest_plugin`.
"""

from celery_redlock.testing.pytest_plugin import *  # noqa: F403
from celery_redlock.testing.pytest_plugin import __all__ as __all__
