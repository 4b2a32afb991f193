"""test_tasks.py: the tasks of tasks.py tested with locks off, on fakeredis, on real Redis."""

import pytest
from celery.exceptions import Retry

from celery_redlock.errors import RateLimited
from tasks import fetch_price, nightly, sync_user


def test_the_report_is_built(redlock_disabled_app):
    # redlock_enabled = False: a plain task, no Redis anywhere.
    assert nightly.delay("today").get() == "report for today built"


def test_each_sync_holds_the_users_lock(redlock_fake_app):
    # One fakeredis node: the lock is taken and released, fencing tokens increase.
    first = sync_user.delay(42).get()
    second = sync_user.delay(42).get()
    assert second > first


def test_publishing_twice_returns_the_queued_copy(redlock_fake_app, monkeypatch):
    # Published, not run: eager mode off for this test, and Celery's in-memory
    # broker, where no worker takes the message. Only task ids are compared, so
    # no result backend is needed (ignore_result).
    monkeypatch.setitem(redlock_fake_app.conf, "task_always_eager", False)
    with redlock_fake_app.connection_for_write("memory://") as broker:
        publish = {"connection": broker, "ignore_result": True}
        first = nightly.apply_async(("2026-11-24",), **publish)
        again = nightly.apply_async(("2026-11-24",), **publish)
        other_day = nightly.apply_async(("2026-11-25",), **publish)
    assert again.id == first.id
    assert other_day.id != first.id


def test_prices_stop_at_the_global_limit(redlock_real_app):
    # Three throw-away redis-server processes: the limit counts for real.
    assert [fetch_price.delay("ACME").get() for _ in range(2)] == [104.0, 104.0]
    # The third in the same second is re-queued for when the window allows it;
    # in eager mode Celery raises that retry instead of queueing it.
    with pytest.raises(Retry) as retried:
        fetch_price.delay("ACME")
    assert isinstance(retried.value.exc, RateLimited)


def test_a_direct_call_is_a_plain_function_call(redlock_real_app):
    # As in Celery: no lock, no singleton, no rate limit on a direct call.
    assert [fetch_price("ACME") for _ in range(5)] == [104.0] * 5
