"""Redlock, Lock, Semaphore, fencing and renewal: no Celery import.

Above :mod:`celery_redlock.transport`, below :mod:`celery_redlock.tasks`.
"""
