"""proj/celery.py: the Celery app, configured from Django's settings (CELERY_*)."""

import os

from celery import Celery

import celery_redlock

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every CELERY_* setting, CELERY_REDLOCK_* included, becomes app.conf's lowercase one.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
celery_redlock.setup(app)  # applies CELERY_REDLOCK_TASKS
