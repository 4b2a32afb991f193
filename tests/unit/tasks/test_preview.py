"""A singleton's call as text: what the publish stores and ``celery redlock locks`` shows."""

from __future__ import annotations

from celery_redlock._layout import PREVIEW_CHARS, ArgsPreview, LockValue, lock_keys
from celery_redlock.tasks.features.singleton_call_text import call_text


class TestArgumentText:
    def test_a_call_reads_as_a_call(self) -> None:
        assert call_text((7, "eu"), {"flag": True}) == "(7, 'eu', flag=True)"
        assert call_text((), {}) == "()"

    def test_big_values_are_shortened_and_the_whole_is_capped(self) -> None:
        text = call_text(("x" * 1000, list(range(100))), {"blob": {"k": "v" * 500}})
        assert len(text) <= PREVIEW_CHARS
        assert "..." in text

    def test_celerys_reprs_stand_in_for_hidden_arguments(self) -> None:
        options = {"argsrepr": "('<card>',)", "kwargsrepr": "{'pin': '****'}"}
        assert call_text(("4111...",), {"pin": "1234"}, options) == "('<card>', 'pin': '****')"
        assert call_text((1,), {"a": 2}, {"argsrepr": "[hidden]"}) == "(hidden, a=2)"

    def test_the_stored_value_names_the_task_and_round_trips(self) -> None:
        preview = ArgsPreview("task-1", "(7, flag=True)")
        assert str(preview) == "task-1|(7, flag=True)"
        assert ArgsPreview.parse(str(preview).encode()) == preview
        assert ArgsPreview.parse("task-1|a|b") == ArgsPreview("task-1", "a|b")
        assert ArgsPreview.parse(None) is None
        assert ArgsPreview.parse("no separator") is None

    def test_the_lock_value_format_is_unchanged(self) -> None:
        assert LockValue.parse("tok|id|queued") == LockValue("tok", "id", "queued")
        keys = lock_keys("redlock:", "singleton:t:abc")
        assert keys.args == "redlock:{singleton:t:abc}:args"
        assert keys.lock == "redlock:{singleton:t:abc}"
