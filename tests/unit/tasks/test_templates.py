"""Key templates and the argument plan they render from."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from celery_redlock.errors import ConfigurationError
from celery_redlock.tasks.key_templates import ArgumentPlan, KeyTemplate, task_arguments


def bound(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What ``Signature.bind`` makes of a call: the reference the plan must match."""
    try:
        call = signature.bind(*args, **kwargs)
    except TypeError:
        return TypeError
    call.apply_defaults()
    values: dict[str, Any] = {}
    for name, value in call.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            values.update(value)
        else:
            values[name] = value
    return values


def plain(a: Any, b: Any = 2, c: Any = None) -> None: ...
def mixed(a: Any, /, b: Any, *rest: Any, k: Any = 1, **more: Any) -> None: ...
def nothing() -> None: ...


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1,), {}),
    ((1, 2), {}),
    ((1, 2, 3), {}),
    ((1, 2, 3, 4), {}),
    ((), {"a": 1}),
    ((1,), {"a": 1}),
    ((1,), {"c": 3}),
    ((), {"c": 3, "a": 0}),
    ((1,), {"zzz": 1}),
    ((1, 2), {"k": 5, "extra": 6}),
]


@pytest.mark.parametrize("function", [plain, mixed, nothing], ids=lambda f: f.__name__)
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_the_plan_names_arguments_exactly_as_bind_does(
    function: Callable[..., None], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    signature = inspect.signature(function)
    expected = bound(signature, args, kwargs)
    plan = ArgumentPlan(signature)
    if expected is TypeError:
        with pytest.raises(TypeError):
            plan.arguments(args, kwargs)
    else:
        got = plan.arguments(args, kwargs)
        assert got == expected
        assert list(got) == list(expected)  # signature order


def test_task_arguments_drop_self_of_bound_tasks() -> None:
    app = Celery("templates", set_as_current=False)

    @app.task(bind=True, shared=False, name="t.bound")
    def with_self(self: Any, user_id: int, page: int = 1) -> None: ...

    @app.task(shared=False, name="t.unbound")
    def without_self(user_id: int) -> None: ...

    assert task_arguments(type(app.tasks["t.bound"])).names == ("user_id", "page")
    assert task_arguments(type(app.tasks["t.unbound"])).names == ("user_id",)


PLAN = ArgumentPlan(inspect.signature(lambda user_id, order=None, items=(), **extra: None))


def template(source: Any) -> KeyTemplate:
    return KeyTemplate(source, default="fixed", task_name="t", option="lock_key", plan=PLAN)


class TestKeyTemplate:
    def test_fields_name_arguments_with_defaults_applied(self) -> None:
        assert template("user:{user_id}:{order}").render((7,), {}) == "user:7:None"
        assert template("{items[0]}/{order.real}").render((1, 2, ["a"]), {}) == "a/2"
        assert template("k:{anything}").render((1,), {"anything": "x"}) == "k:x"
        assert template("user:{user_id}").fields == ("user_id",)

    def test_no_source_is_the_default_and_a_callable_gets_the_call(self) -> None:
        assert template(None).render((1,), {}) == "fixed"
        assert template(lambda args, kwargs: f"{args[0]}-{kwargs['x']}").render((1,), {"x": 2}) == (
            "1-2"
        )

    def test_a_callable_must_return_a_key(self) -> None:
        with pytest.raises(ConfigurationError) as caught:
            template(lambda args, kwargs: None).render((), {})
        assert (caught.value.option, caught.value.task) == ("lock_key", "t")
        assert caught.value.problem.endswith("returned None; it must return a non-empty str")

    @pytest.mark.parametrize(
        ("source", "problem"),
        [
            ("user:{user_id", "'user:{user_id' is not a valid template: "),
            (
                "user:{0}",
                "'user:{0}' must name arguments ({user_id}, {order}, {items}), not positions",
            ),
            (42, "must be a non-empty str.format template or a callable"),
        ],
    )
    def test_bad_templates(self, source: Any, problem: str) -> None:
        with pytest.raises(ConfigurationError) as caught:
            template(source)
        assert caught.value.option == "lock_key"
        assert caught.value.problem.startswith(problem)

    def test_a_field_must_be_a_parameter_unless_the_task_takes_any_keyword(self) -> None:
        strict = ArgumentPlan(inspect.signature(lambda user_id: None))
        with pytest.raises(ConfigurationError, match=r"names \{nope\}.*it takes: user_id"):
            KeyTemplate("{nope}", default="", task_name="t", option="lock_key", plan=strict)
        assert template("{nope}").fields == ("nope",)  # PLAN takes **extra


class TestHintsNameTheTasksOwnParameters:
    """An error about a template suggests the fields this task can use, not an example's."""

    def plan(self, function: Callable[..., Any]) -> ArgumentPlan:
        return ArgumentPlan(inspect.signature(function))

    def refused(self, source: str, function: Callable[..., Any]) -> str:
        with pytest.raises(ConfigurationError) as caught:
            KeyTemplate(
                source, default="", task_name="t", option="lock_key", plan=self.plan(function)
            )
        return caught.value.problem

    def test_a_position_is_answered_with_the_tasks_parameters(self) -> None:
        problem = self.refused("report:{}", lambda customer, region="eu": None)
        assert problem == (
            "'report:{}' must name arguments ({customer}, {region}), not positions ({} or {0})"
        )
        assert "user_id" not in problem

    def test_a_task_without_parameters_says_so(self) -> None:
        problem = self.refused("report:{0}", lambda: None)
        assert problem.startswith("'report:{0}' must name arguments (the task takes none)")

    def test_a_missing_name_suggests_the_nearest_parameter(self) -> None:
        problem = self.refused("report:{custmer}", lambda customer, region="eu": None)
        assert problem == (
            "'report:{custmer}' names {custmer}, which is not an argument of the task "
            "(it takes: customer, region); did you mean {customer}?"
        )

    def test_star_parameters_are_not_offered_as_fields(self) -> None:
        problem = self.refused("{}", lambda customer, *rest, **more: None)
        assert problem.startswith("'{}' must name arguments ({customer}), not positions")

    def test_a_keyword_a_call_does_not_pass_names_the_option(self) -> None:
        flexible = KeyTemplate(
            "r:{region}",
            default="",
            task_name="t",
            option="rate_limit_key",
            plan=self.plan(lambda **kwargs: None),
        )
        assert flexible.render((), {"region": "eu"}) == "r:eu"
        with pytest.raises(ConfigurationError) as caught:
            flexible.render((), {"zone": "eu"})
        assert (caught.value.option, caught.value.task) == ("rate_limit_key", "t")
        assert caught.value.problem == (
            "'r:{region}' names {region}, which this call does not pass (it passes: zone)"
        )


class TestGlobs:
    def plan(self) -> ArgumentPlan:
        return ArgumentPlan(inspect.signature(lambda customer, region="eu": None))

    def make(self, source: Any) -> KeyTemplate:
        return KeyTemplate(source, default="proj.call", task_name="t", option="k", plan=self.plan())

    def test_fields_become_stars_and_glob_characters_are_escaped(self) -> None:
        assert self.make("api:{customer}:{region}").glob() == "api:*:*"
        assert self.make("a*[b]:{customer}").glob() == "a\\*\\[b\\]:*"
        assert self.make(None).glob() == "proj.call"
        assert self.make(lambda args, kwargs: "k").glob() is None

    def test_a_key_without_fields_is_fixed(self) -> None:
        assert self.make("api").fixed == "api"
        assert self.make("{{api}}").fixed == "{api}"
        assert self.make(None).fixed == "proj.call"
        assert self.make("api:{customer}").fixed is None
        assert self.make(lambda args, kwargs: "k").fixed is None
