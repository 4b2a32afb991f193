"""Names that are not options: misspellings and other libraries' options refused, the rest kept.

The rule (``celery_redlock.tasks.options``' doc) is checked exhaustively: every
one-letter typo of every option name and of the long peer names is refused,
and every attribute name of Celery's ``Task`` passes.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterator
from typing import Any

import celery
import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.errors import ConfigurationError
from celery_redlock.tasks.locked_task import _CELERY_UNDECLARED, _attributes_to_check
from celery_redlock.tasks.misspelling import closest, distance, normal, resembles
from celery_redlock.tasks.options import (
    _LONG_PEER_NAMES,
    OPTION_NAMES,
    check_attributes,
    check_names,
    unknown_option,
)
from celery_redlock.tasks.other_library_options import PEER_OPTIONS

LETTERS = string.ascii_lowercase + "_"


def typos(name: str) -> Iterator[str]:
    """Every name one letter away: a letter dropped, added, replaced, or two swapped."""
    for i in range(len(name)):
        yield name[:i] + name[i + 1 :]
        for letter in LETTERS:
            yield name[:i] + letter + name[i + 1 :]
    for i in range(len(name) + 1):
        for letter in LETTERS:
            yield name[:i] + letter + name[i:]
    for i in range(len(name) - 1):
        yield name[:i] + name[i + 1] + name[i] + name[i + 2 :]


CELERY_NAMES = frozenset(dir(celery.Task)) | _CELERY_UNDECLARED


def misspellings(name: str) -> set[str]:
    """The typos of ``name`` that are neither an option, nor Celery's, nor empty."""
    return {
        typo
        for typo in typos(name)
        if typo and typo != name and typo not in OPTION_NAMES and typo not in CELERY_NAMES
    }


class TestSpelling:
    def test_distance_counts_each_kind_of_edit_once(self) -> None:
        assert distance("lockttl", "lockttl") == 0
        assert distance("lockttl", "locktl") == 1  # dropped
        assert distance("lockttl", "lockxttl") == 1  # added
        assert distance("lockttl", "lockxtl") == 1  # replaced
        assert distance("lockttl", "lcokttl") == 1  # swapped
        assert distance("lockttl", "logkey") == 4
        assert distance("", "abc") == 3

    def test_normal_form_ignores_case_and_underscores(self) -> None:
        assert normal("Lock__TTL") == normal("lock-ttl") == "lockttl"

    def test_words_in_another_order_resemble(self) -> None:
        assert resembles("ttl_lock", "lock_ttl")
        assert resembles("key_singleton", "singleton_key")
        assert not resembles("ttl", "lock_ttl")

    def test_long_names_tolerate_two_edits_short_ones_one(self) -> None:
        assert resembles("lock_timout", "lock_timeout")
        assert resembles("lock_tmout", "lock_timeout")
        assert resembles("lok_tll", "lock_ttl") is False
        assert resembles("lock_tl", "lock_ttl")

    def test_closest_prefers_the_fewest_edits(self) -> None:
        assert closest("lock_tll", OPTION_NAMES) == "lock_ttl"
        assert closest("singleton_tl", OPTION_NAMES) == "singleton_ttl"
        assert closest("zzz", OPTION_NAMES) is None


class TestEveryMisspellingIsRefused:
    @pytest.mark.parametrize("name", OPTION_NAMES)
    def test_every_typo_of_an_option_is_refused_naming_the_option(self, name: str) -> None:
        missed, misled = [], []
        for typo in sorted(misspellings(name)):
            problem = unknown_option(typo)
            if problem is None:
                missed.append(typo)
                continue
            suggested = re.search(r"did you mean (\w+)\?", problem)
            if suggested is None:
                continue  # told that names with its prefix are kept for options
            # The option meant, or another just as near (lock_tl is as near lock_ttl as ...).
            edits = distance(normal(typo), normal(suggested.group(1)))
            if suggested.group(1) != name and edits > distance(normal(typo), normal(name)):
                misled.append((typo, suggested.group(1)))
        assert missed == []
        assert misled == []

    @pytest.mark.parametrize("name", OPTION_NAMES)
    def test_case_underscores_and_word_order(self, name: str) -> None:
        words = name.split("_")
        variants = {name.upper(), name.title(), name.replace("_", ""), "_".join(reversed(words))}
        variants.discard(name)
        for variant in variants:
            assert unknown_option(variant) is not None, variant

    @pytest.mark.parametrize("name", _LONG_PEER_NAMES)
    def test_every_typo_of_a_long_peer_name_gets_its_hint(self, name: str) -> None:
        exact = unknown_option(name)
        assert exact is not None
        for typo in sorted(misspellings(name)):
            problem = unknown_option(typo)
            assert problem is not None, typo

    @pytest.mark.parametrize("name", sorted(PEER_OPTIONS))
    def test_a_peer_name_names_its_library(self, name: str) -> None:
        problem = unknown_option(name)
        assert problem is not None
        assert problem.startswith("is celery-")

    def test_redlock_tasks_entries_refuse_any_other_name(self) -> None:
        for name in ("my_flag", "acks_late", "rate_limit", "x"):
            with pytest.raises(ConfigurationError) as caught:
                check_names("redlock_tasks['t']", {"singleton": True, name: 1})
            assert caught.value.option == f"redlock_tasks['t'].{name}"
            assert caught.value.problem.startswith("not a celery_redlock option; ")

    def test_an_entry_typo_names_the_option_meant(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            check_names("redlock_tasks['t']", {"lock_tll": 5})
        assert str(caught.value) == (
            "redlock_tasks['t'].lock_tll: not a celery_redlock option; did you mean lock_ttl?"
        )


class TestOtherNamesPass:
    def test_every_celery_task_attribute_passes_the_rule(self) -> None:
        refused = {name: unknown_option(name) for name in CELERY_NAMES}
        assert {name: problem for name, problem in refused.items() if problem} == {}

    @pytest.mark.parametrize(
        "name",
        [
            "my_flag",
            "timeout",
            "ttl",
            "key",
            "api_key",
            "log_key",
            "locale",
            "one",
            "done",
            "single",
            "debug",
            "queue",
            "routing_key",
            "customer_limit",
        ],
    )
    def test_names_of_the_users_own_pass(self, name: str) -> None:
        assert unknown_option(name) is None

    def test_attributes_celery_and_other_bases_define_are_not_checked(self) -> None:
        class Other:
            lock_timeout_ms = 5  # another library's option on another base class

        attributes: dict[str, Any] = {name: object() for name in CELERY_NAMES}
        attributes.update(lock_timeout_ms=7, my_flag=1, _private=2)
        task_class = type("T", (LockedTask, Other), attributes)
        assert _attributes_to_check(task_class) == {"my_flag": 1}

    def test_methods_written_in_a_class_body_are_code_not_options(self) -> None:
        class T(LockedTask):
            def lock_helper(self) -> None: ...

            @property
            def singleton_view(self) -> int:
                return 1

            @staticmethod
            def rate_limit_for(user: str) -> str:
                return user

            @functools.cached_property
            def lock_cache(self) -> int:
                return 1

            lock_tll = 5

        assert _attributes_to_check(T) == {"lock_tll": 5}

    def test_a_lambda_given_as_a_keyword_is_checked(self) -> None:
        task_class = type("T", (LockedTask,), {"lock_kye": lambda args, kwargs: "k"})
        assert set(_attributes_to_check(task_class)) == {"lock_kye"}


class TestAtDefinition:
    """The decorator raises, naming the task, the option and what was meant."""

    def app(self) -> Celery:
        app = Celery("names", set_as_current=False)
        app.conf.redlock_nodes = ["redis://127.0.0.1:1/0"]
        return app

    def define(self, **options: Any) -> Any:
        app = self.app()
        app.finalize()

        @app.task(base=LockedTask, shared=False, name="proj.sync", **options)
        def sync(user_id: int) -> None: ...

        return sync

    @pytest.mark.parametrize(
        ("options", "option", "problem"),
        [
            ({"lock_tll": 5}, "lock_tll", "not a celery_redlock option; did you mean lock_ttl?"),
            (
                {"singelton": True},
                "singelton",
                "not a celery_redlock option; did you mean singleton?",
            ),
            (
                {"once": {"graceful": True, "keys": ["user_id"], "timeout": 60}},
                "once",
                "is celery-once's option; write singleton=True, singleton_key='{user_id}', "
                "singleton_ttl=60 (a duplicate publish returns the queued task), or, to let "
                "copies queue and only keep runs apart, lock_key, lock_ttl and "
                "on_lock_busy='skip'",
            ),
            (
                {"unique_on": ["user_id"]},
                "unique_on",
                "is celery-singleton's option; write singleton_key='{user_id}' "
                "(with singleton=True)",
            ),
            (
                {"raise_on_duplicate": True},
                "raise_on_duplicate",
                "is celery-singleton's option; write on_duplicate='raise'",
            ),
            (
                {"lock_expiry": 30},
                "lock_expiry",
                "is celery-singleton's option; write singleton_ttl=30 (how long a queued copy "
                "holds the key; a running copy's key lives by lock_ttl, renewed by the heartbeat)",
            ),
            (
                {"heimdall": {"unique": True, "unique_raises": True, "times": 2, "per": 60}},
                "heimdall",
                "is celery-heimdall's option; write singleton=True, on_duplicate='raise', "
                "global_rate_limit='2/m'",
            ),
        ],
    )
    def test_a_bad_name_fails_the_decorator(
        self, options: dict[str, Any], option: str, problem: str
    ) -> None:
        with pytest.raises(ConfigurationError) as caught:
            self.define(**options)
        assert (caught.value.task, caught.value.option, caught.value.problem) == (
            "proj.sync",
            option,
            problem,
        )

    def test_once_without_graceful_raises_and_unlock_before_run_is_the_queued_mode(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            self.define(once={"unlock_before_run": True})
        problem = caught.value.problem
        assert "on_duplicate='raise'" in problem
        assert "unlock_before_run" in problem
        assert "singleton_mode='queued'" in problem

    def test_celery_options_and_the_users_own_attributes_pass(self) -> None:
        sync = self.define(
            my_flag=1,
            acks_late=True,
            max_retries=5,
            rate_limit="10/m",
            autoretry_for=(ValueError,),
            retry_backoff=True,
            retry_jitter=False,
            retry_kwargs={"max_retries": 2},
            lock_ttl=30,
        )
        assert sync.my_flag == 1
        assert sync.autoretry_for == (ValueError,)

    def test_a_class_based_task_is_checked_too(self) -> None:
        app = self.app()

        class Sync(LockedTask):
            name = "proj.class_sync"
            singleton_tll = 5

            def run(self, user_id: int) -> None: ...

        with pytest.raises(ConfigurationError) as caught:
            app.register_task(Sync())
        assert caught.value.option == "singleton_tll"
        assert caught.value.problem == "not a celery_redlock option; did you mean singleton_ttl?"

    def test_check_attributes_reports_the_first_refused_name(self) -> None:
        check_attributes("t", {"my_flag": 1})
        with pytest.raises(ConfigurationError) as caught:
            check_attributes("t", {"my_flag": 1, "lock_tll": 5})
        assert caught.value.option == "lock_tll"
