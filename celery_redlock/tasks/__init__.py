"""The Celery integration: the task class, app wiring, options, the run and publish.

Above :mod:`celery_redlock.lock` and :mod:`celery_redlock.ratelimit`; features in :mod:`.features`.
"""
