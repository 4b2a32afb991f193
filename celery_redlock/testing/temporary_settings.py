"""An app's ``redlock_*`` settings for the length of a test.

::

    from celery_redlock.testing.temporary_settings import redlock_settings

    with redlock_settings(app, enabled=False):          # LockedTasks run as plain tasks
        assert sync_user.delay(42).get() == ...

    with redlock_settings(app, nodes=[fakeredis.FakeRedis()]):
        ...

Names drop the ``redlock_`` prefix. The app's cached state is dropped on the way in and out,
so the next call reads the settings in force; any configuration source works, Django's
included (docs/django.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigurationError
from ..tasks.app_state import forget
from ..tasks.settings import SETTING_NAMES

__all__ = ["redlock_settings"]

_MISSING = object()


@contextlib.contextmanager
def redlock_settings(app: Any, **settings: Any) -> Iterator[Any]:
    """Give ``app`` these ``redlock_*`` settings inside the block; yields the app.

    ``None`` stands for "unset": the setting's default applies.

    Raises:
        ConfigurationError: a name that is not a celery_redlock setting.
    """
    names = {f"redlock_{name}": value for name, value in settings.items()}
    unknown = sorted(set(names) - set(SETTING_NAMES))
    if unknown:
        raise ConfigurationError(
            "redlock_settings",
            f"unknown setting(s) {', '.join(name.removeprefix('redlock_') for name in unknown)}; "
            f"known: {', '.join(name.removeprefix('redlock_') for name in SETTING_NAMES)}",
        )
    app.conf.get("redlock_nodes")  # loads a pending configuration: app.conf is final now
    changes = app.conf.changes
    saved = {name: changes.get(name, _MISSING) for name in names}
    forget(app)
    try:
        for name, value in names.items():
            app.conf[name] = value
        yield app
    finally:
        for name, value in saved.items():
            if value is _MISSING:
                changes.pop(name, None)
            else:
                changes[name] = value
        forget(app)
