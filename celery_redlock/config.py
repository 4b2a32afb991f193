"""Settings and per-app state by their documented path (:mod:`.tasks.settings`, ``app_state``)."""

from celery_redlock.tasks import app_state, settings
from celery_redlock.tasks.app_state import *  # noqa: F403
from celery_redlock.tasks.settings import *  # noqa: F403

__all__ = [*settings.__all__, *app_state.__all__]
