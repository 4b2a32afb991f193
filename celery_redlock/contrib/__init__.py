"""Optional integrations, each in its own module and imported only when used.

* :mod:`celery_redlock.contrib.prometheus`: counters and histograms fed by
  :mod:`celery_redlock.signals` (needs ``pip install 'celery_redlock[prometheus]'``).
* :mod:`celery_redlock.contrib.eventlog`: one structured log line per lock
  event on the ``celery_redlock.events`` logger (no extra dependency).
"""
