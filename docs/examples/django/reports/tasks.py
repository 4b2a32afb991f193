"""reports/tasks.py: a locked task and a plain one that CELERY_REDLOCK_TASKS makes a singleton."""

from celery import shared_task

from celery_redlock import LockedTask


@shared_task(base=LockedTask, bind=True, lock_key="report:{customer_id}")
def build_report(self, customer_id):
    held = self.lock is not None  # None when locks are off (or on a direct call)
    return {"customer": customer_id, "locked": held}


@shared_task
def rebuild_index():
    return "index rebuilt"
