"""``redlock_tasks`` entries applied whatever the order of setup, finalize and registration.

No Redis: only which class and policy each task ends up with.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task, shared_task

from celery_redlock import LockedTask, setup
from celery_redlock.errors import ConfigurationError
from celery_redlock.tasks import app_state
from celery_redlock.tasks.policies import TaskPolicy
from celery_redlock.tasks.task_table import apply_entries, check_entry, unknown_task

NODE = "redis://127.0.0.1:1/0"


@pytest.fixture
def make_app() -> Iterator[Any]:
    made: list[Celery] = []

    def make(**entries: dict[str, Any]) -> Celery:
        app = Celery("table", set_as_current=False)
        app.conf.update(redlock_nodes=[NODE], redlock_tasks=entries)
        made.append(app)
        return app

    yield make
    for app in made:
        app_state.forget(app)
        app.close()


def policy(task: Any) -> TaskPolicy:
    found = task._redlock_policy
    assert isinstance(found, TaskPolicy)
    return found


def test_a_task_defined_after_finalize_gets_its_entry_at_definition(make_app: Any) -> None:
    app = make_app(**{"late.task": {"singleton": True, "singleton_key": "{day}"}})
    setup(app)
    app.finalize()

    @app.task(shared=False, name="late.task")
    def late(day: str) -> str:
        return day

    assert isinstance(late, LockedTask)
    assert policy(late).singleton is not None
    assert policy(late).singleton.name("late.task", ("mon",), {}) == "singleton:late.task:mon"
    assert late.run("tue") == "tue"  # its code is untouched


def test_a_shared_task_imported_after_finalize_gets_its_entry(make_app: Any) -> None:
    app = make_app(**{"shared.late": {"lock_key": "shared"}})
    setup(app)
    app.finalize()

    @shared_task(name="shared.late")
    def late() -> None: ...

    task = app.tasks["shared.late"]
    assert isinstance(task, LockedTask)
    assert policy(task).lock_names((), {}) == ["shared"]


def test_a_class_registered_after_finalize_gets_its_entry(make_app: Any) -> None:
    app = make_app(**{"cls.task": {"lock_key": "k:{n}"}})
    setup(app)
    app.finalize()

    class Plain(Task):  # type: ignore[misc]
        name = "cls.task"

        def run(self, n: int) -> int:
            return n

    task = app.register_task(Plain())
    assert isinstance(app.tasks["cls.task"], LockedTask)
    assert policy(task).lock_names((3,), {}) == ["k:3"]


def test_tasks_registered_before_setup_or_before_finalize_get_theirs(make_app: Any) -> None:
    app = make_app(**{"early.one": {"lock_key": "one"}, "early.two": {"lock_key": "two"}})

    @app.task(shared=False, name="early.one")
    def one() -> None: ...

    app.finalize()
    setup(app)  # after finalize: applied at once

    @app.task(shared=False, name="early.two")
    def two() -> None: ...

    assert isinstance(app.tasks["early.one"], LockedTask)
    assert isinstance(app.tasks["early.two"], LockedTask)


def test_a_bad_entry_fails_the_definition_of_its_task(make_app: Any) -> None:
    app = make_app(**{"late.bad": {"lock_key": "k:{nope}"}})
    setup(app)
    app.finalize()
    with pytest.raises(ConfigurationError) as caught:

        @app.task(shared=False, name="late.bad")
        def bad(n: int) -> None: ...

    assert caught.value.option == "redlock_tasks['late.bad'].lock_key"
    assert caught.value.problem.startswith("'k:{nope}' names {nope}")


def test_unregistered_names_are_returned_not_refused(make_app: Any) -> None:
    app = make_app(**{"nowhere.task": {"singleton": True}})
    app.finalize()
    assert apply_entries(app) == ["nowhere.task"]


def test_every_entry_is_checked_registered_or_not(make_app: Any) -> None:
    app = make_app(**{"nowhere.task": {"singleton": True, "singleton_ttl": -1}})
    app.finalize()
    with pytest.raises(ConfigurationError) as caught:
        apply_entries(app)
    assert caught.value.option == "redlock_tasks['nowhere.task'].singleton_ttl"
    with pytest.raises(ConfigurationError, match="did you mean lock_ttl"):
        check_entry("x", {"lock_tll": 5})


def test_a_user_registry_class_is_kept_under_the_watch(make_app: Any) -> None:
    app = make_app(**{"late.task": {"lock_key": "k"}})
    registry_class = type(app._tasks)
    setup(app)
    assert isinstance(app._tasks, registry_class)
    setup(app)  # twice is harmless
    app.finalize()

    @app.task(shared=False, name="late.task")
    def late() -> None: ...

    assert isinstance(late, LockedTask)


def test_an_unknown_name_suggests_the_nearest_registered_one() -> None:
    message = unknown_task("proj.nightly_reprot", ["proj.nightly_report", "celery.chord"])
    assert message.startswith(
        "redlock_tasks['proj.nightly_reprot']: this app has no such task; did you mean "
        "'proj.nightly_report'? "
    )
    assert "did you mean" not in unknown_task("proj.x", ["celery.chord"])
