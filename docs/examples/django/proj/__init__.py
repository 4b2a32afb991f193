"""proj/__init__.py: load the Celery app whenever Django starts."""

from .celery import app as celery_app

__all__ = ["celery_app"]
