"""When a debounced copy may run: the debounce, or a later countdown or eta (no Redis)."""

from __future__ import annotations

import datetime
import inspect

import pytest

from celery_redlock.tasks.features.debounce import _delay
from celery_redlock.tasks.key_templates import ArgumentPlan
from celery_redlock.tasks.policies import TaskPolicy

PLAN = ArgumentPlan(inspect.signature(lambda doc_id: None))
POLICY = TaskPolicy.from_options("proj.reindex", PLAN, {"debounce": 5.0}).debounce
assert POLICY is not None


def test_the_debounce_replaces_a_shorter_countdown() -> None:
    options = {"countdown": 2, "queue": "q"}
    assert _delay(POLICY, options) == 5.0
    assert options == {"queue": "q"}


def test_a_longer_countdown_wins() -> None:
    assert _delay(POLICY, {"countdown": 12.5}) == 12.5


def test_an_eta_becomes_a_countdown() -> None:
    options = {"eta": datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=60)}
    assert 55.0 < _delay(POLICY, options) <= 60.0
    assert "eta" not in options
    naive = {"eta": datetime.datetime.now(datetime.UTC).replace(tzinfo=None)}
    naive["eta"] += datetime.timedelta(seconds=60)
    assert 55.0 < _delay(POLICY, naive) <= 60.0
    past = {"eta": datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=60)}
    assert _delay(POLICY, past) == 5.0


def test_an_eta_given_as_text_is_read() -> None:
    eta = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=60)
    assert 55.0 < _delay(POLICY, {"eta": eta.isoformat()}) <= 60.0


@pytest.mark.parametrize("countdown", [None, True, "7"])
def test_no_usable_countdown_leaves_the_debounce(countdown: object) -> None:
    assert _delay(POLICY, {"countdown": countdown}) == 5.0
