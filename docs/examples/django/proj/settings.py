"""proj/settings.py: Django settings, with Celery's and celery_redlock's under CELERY_."""

import os

SECRET_KEY = "example-only"
INSTALLED_APPS = ["reports"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True

CELERY_BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
# Three independent Redis masters in production (or sentinel:// URLs).
CELERY_REDLOCK_NODES = os.environ.get("REDLOCK_NODES", CELERY_BROKER_URL).split(",")
CELERY_REDLOCK_DEFAULT_TTL = 120
# Tasks of other apps, configured by name.
CELERY_REDLOCK_TASKS = {"reports.tasks.rebuild_index": {"singleton": True}}
