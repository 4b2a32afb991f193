"""reports/tests.py: Django tests of the tasks, with locks off and on."""

from django.test import SimpleTestCase, override_settings

from celery_redlock import LockedTask
from proj.celery import app

from .tasks import build_report, rebuild_index


class ReportTests(SimpleTestCase):
    def test_the_report_is_built_without_locks(self):
        # CELERY_REDLOCK_ENABLED = False in the test settings: a plain task.
        self.assertEqual(build_report.delay(7).get(), {"customer": 7, "locked": False})

    @override_settings(CELERY_REDLOCK_ENABLED=True)
    def test_the_report_holds_its_lock(self):
        # Locks on, on the runner's throw-away redis-server nodes.
        self.assertEqual(build_report.delay(7).get(), {"customer": 7, "locked": True})

    @override_settings(CELERY_REDLOCK_ENABLED=True)
    def test_the_index_rebuild_is_a_singleton(self):
        # CELERY_REDLOCK_TASKS made the plain task a singleton; it runs through its lock.
        self.assertIsInstance(app.tasks["reports.tasks.rebuild_index"], LockedTask)
        self.assertEqual(rebuild_index.delay().get(), "index rebuilt")
