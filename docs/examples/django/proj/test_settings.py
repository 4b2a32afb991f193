"""proj/test_settings.py: settings for `manage.py test`: tasks run eagerly, locks off."""

from .settings import *  # noqa: F403

CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
# LockedTasks run as plain tasks and no Redis is contacted, unless a test turns
# locks on (override_settings(CELERY_REDLOCK_ENABLED=True)): the runner below
# then gives them throw-away redis-server nodes.
CELERY_REDLOCK_ENABLED = False
TEST_RUNNER = "proj.test_runner.RedlockTestRunner"
