"""conftest.py (the project's root one): celery_redlock's fixtures for the app in tasks.py."""

import pytest

pytest_plugins = ["celery_redlock.pytest_plugin"]


@pytest.fixture
def redlock_app():
    from tasks import app

    # Run tasks in the test's own process, and raise their exceptions there.
    app.conf.update(task_always_eager=True, task_eager_propagates=True)
    return app
