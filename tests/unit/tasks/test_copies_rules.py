"""Which runs are copies, which leave a done mark, and how long a re-queued copy waits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context

from celery_redlock._layout import done_key, lock_name
from celery_redlock.tasks.features.redelivery import in_canvas, leaves_mark, redelivered
from celery_redlock.tasks.run_endings import held_at_most


def app_with(**transport: Any) -> Celery:
    app = Celery("copies", set_as_current=False)
    app.conf.broker_transport_options = transport
    return app


def test_kombu_marks_a_redelivered_message_in_its_delivery_info() -> None:
    assert redelivered(Context(delivery_info={"redelivered": True}))
    assert not redelivered(Context(delivery_info={"redelivered": False}))
    assert not redelivered(Context(delivery_info=None))
    assert not redelivered(Context())


@pytest.mark.parametrize(
    ("acks_late", "eta", "leaves"),
    [
        (False, None, False),
        (True, None, True),
        (False, "2026-11-24T20:00:00+00:00", True),
        (None, None, False),
    ],
)
def test_a_run_leaves_a_mark_when_its_message_may_come_again(
    acks_late: bool | None, eta: str | None, leaves: bool
) -> None:
    task = SimpleNamespace(acks_late=acks_late)
    assert leaves_mark(task, Context(eta=eta)) is leaves


def test_a_member_of_a_group_or_chord_is_in_a_canvas() -> None:
    assert in_canvas(Context(group="g1"))
    assert in_canvas(Context(chord={"task": "body"}))
    assert not in_canvas(Context())


@pytest.mark.parametrize(
    ("transport", "countdown", "expected"),
    [
        ({"visibility_timeout": 1}, 3.0, 0.5),
        ({"visibility_timeout": 1}, 0.2, 0.2),
        ({"visibility_timeout": 3600}, 61.0, 61.0),
        ({}, 61.0, 61.0),
        ({"visibility_timeout": None}, 5.0, 5.0),
    ],
)
def test_a_requeued_copy_is_due_before_the_broker_delivers_it_again(
    transport: dict[str, Any], countdown: float, expected: float
) -> None:
    assert held_at_most(app_with(**transport), countdown) == expected


def test_an_sqs_broker_redelivers_after_30_s_unless_told_otherwise() -> None:
    app = app_with()
    app.conf.broker_url = "sqs://"
    assert held_at_most(app, 61.0) == 15.0
    app.conf.broker_transport_options = {"visibility_timeout": 600}
    assert held_at_most(app, 61.0) == 61.0


def test_a_done_mark_is_no_lock_key() -> None:
    key = done_key("redlock:", "5d1c-id")
    assert key == "redlock:done:5d1c-id"
    assert lock_name("redlock:", key) is None
