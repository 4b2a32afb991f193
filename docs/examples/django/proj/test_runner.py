"""proj/test_runner.py: Django's test runner, with throw-away lock nodes for the run."""

import contextlib

from django.test.runner import DiscoverRunner

from celery_redlock.testconf import redlock_settings
from celery_redlock.testing import RedisServer

from .celery import app


class RedlockTestRunner(DiscoverRunner):
    """Starts three redis-server processes and points CELERY_REDLOCK_NODES at them."""

    def setup_test_environment(self, **kwargs):
        super().setup_test_environment(**kwargs)
        self._redlock = contextlib.ExitStack()
        servers = self._redlock.enter_context(RedisServer.start_many(3))
        self._redlock.enter_context(redlock_settings(app, nodes=servers.urls))

    def teardown_test_environment(self, **kwargs):
        self._redlock.close()
        super().teardown_test_environment(**kwargs)
