"""A tour of celery_redlock on local Redis nodes and real workers.

Run it with ``python -m celery_redlock.demo`` (or ``./dev demo``).
"""
