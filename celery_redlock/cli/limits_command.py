"""``celery redlock limits``: rate limits and their use now, and overrides, from a shell."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..admin import LimitUse
from ..errors import ConfigurationError, RateLimiterUnavailable
from ..ratelimit import ALGORITHMS, Algorithm
from ..ratelimit.rates import UNITS, Rate, parse_rate
from ..tasks.features.rate_limit import PUBLISH_BUDGET
from .session import BadConfiguration, Session, duration, json_option, table

__all__ = ["limits"]

_T = TypeVar("_T")


if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
else:  # click before 8.2 has no generic ParamType
    _FloatParam = click.ParamType


class _Duration(_FloatParam):
    """Seconds, written ``90``, ``90s``, ``30m``, ``1h`` or ``7d``."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip().lower()
        scale = UNITS.get(text[-1:], None)
        number = text[:-1] if scale is not None else text
        try:
            seconds = float(number) * (scale or 1.0)
        except ValueError:
            self.fail(f"{value!r} is not a duration such as 90s, 30m, 1h or 7d", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive duration", param, ctx)
        return seconds


@click.command()
@click.argument("key", required=False)
@click.option("--task", "task_name", help="Show this task's limits, on each key they counted.")
@click.option("--rate", help='A limit to look at, in Celery\'s syntax, e.g. "100/m".')
@click.option("--limit", type=click.IntRange(min=1), help="Units per period (with --period).")
@click.option("--period", type=click.FloatRange(min=0.001), help="The window, seconds.")
@click.option(
    "--algorithm",
    type=click.Choice(ALGORITHMS),
    help="The algorithm of the limit given (default: the one with state, else sliding).",
)
@click.option(
    "--set",
    "set_rate",
    metavar="RATE",
    help="Override KEY's limit with RATE in every worker at once (with --ttl).",
)
@click.option("--ttl", type=_Duration(), help="How long the override lasts: 90s, 30m, 1h, 7d.")
@click.option("--clear", is_flag=True, help="Remove KEY's override: its own rate applies again.")
@click.option("--pause", type=_Duration(), help="Refuse every run of KEY for this long: 30s, 5m.")
@click.option("--resume", is_flag=True, help="End KEY's pause now.")
@json_option
@click.pass_obj
def limits(
    session: Session,
    key: str | None,
    task_name: str | None,
    rate: str | None,
    limit: int | None,
    period: float | None,
    algorithm: Algorithm | None,
    set_rate: str | None,
    ttl: float | None,
    clear: bool,
    pause: float | None,
    resume: bool,
    as_json: bool,
) -> None:
    """Show rate limits and their use now, or change one without restarting workers.

    Without KEY: every limit the app's tasks declare (global_rate_limit),
    with the units used in the current window, and every override in force.
    With KEY (a task's rate_limit_key, or its name): each limit on KEY and its
    use, its override, and which algorithms hold state; --rate (or --limit
    and --period) looks at KEY under a limit of your choice. Nothing is
    counted.

    --set RATE --ttl 1h makes RATE the limit of KEY for an hour, in every
    worker from its next run; --clear removes it. --pause 30s refuses every
    run of KEY (and beat's publishes) for 30 s, as a task's rate_limited()
    does; --resume ends a pause. A limit a task counts on
    several keys (global_rate_limit=["10/s", "50000/d"]) has one key per
    rate: NAME/s and NAME/d.

    With --task NAME: the task's limits (its global_rate_limit and
    rate_limit_key, or its redlock_tasks entry), each on its one key or, for
    a key template such as "api:{customer}", on every key the template has
    counted (KEY picks one).
    """
    if task_name is not None:
        given_any = (rate, limit, period, algorithm, set_rate, ttl)
        if clear or any(value is not None for value in given_any):
            raise click.UsageError("--task reads the limits from the task: leave out the others")
        _task_limits(session, task_name, key, as_json)
        return
    if set_rate is not None or clear:
        _change_override(session, key, set_rate, ttl, clear, as_json)
        return
    if pause is not None or resume:
        _pause(session, key, pause, resume, as_json)
        return
    if ttl is not None:
        raise click.UsageError("--ttl goes with --set")
    given: Any = None
    if rate is not None:
        if limit is not None or period is not None:
            raise click.UsageError("give either --rate or --limit with --period, not both")
        try:
            given = parse_rate(rate, option="--rate")
        except ConfigurationError as exc:
            raise click.BadParameter(exc.problem or str(exc), param_hint="--rate") from exc
    elif (limit is None) != (period is None):
        raise click.UsageError("--limit and --period go together (or use --rate, e.g. 100/m)")
    elif limit is not None and period is not None:
        given = Rate(limit, period)
    if key is None:
        if given is not None or algorithm is not None:
            raise click.UsageError("--rate, --limit and --algorithm need a KEY")
        _show_every_limit(session, as_json)
        return
    view = _limits_call(session, session.admin.rate, key, rate=given, algorithm=algorithm)
    if as_json:
        click.echo(json.dumps(view.as_dict(), indent=2))
        return
    click.echo(f"rate limit {key!r} on {view.node}")
    if view.limits:
        click.echo(_usetable(view.limits))
    else:
        click.echo("no task of this app declares a limit on this key, and it has no override;")
        click.echo("give --rate to see its use under a limit of your choice")
    for use in view.limits[:1]:
        if use.ceiling is not None:
            click.echo(f"adaptive: {use.rate} in force, under a ceiling of {use.ceiling}")
    if view.backoff is not None and view.backoff.paused_for > 0:
        click.echo(
            f"paused: {duration(view.backoff.paused_for)} more "
            f"(celery redlock limits {key} --resume ends it)"
        )
    if view.override is not None:
        click.echo(
            f"override: {view.override.text} for {duration(view.override.ttl)} more "
            f"(celery redlock limits {key} --clear removes it)"
        )
    held = [entry for entry in view.state if entry["exists"] or entry["error"]]
    if held:
        rows = [
            [
                entry["algorithm"] + (f" ({entry['budget']})" if entry["budget"] else ""),
                "-" if entry["ttl"] is None else duration(entry["ttl"]),
                entry["state_key"] + (f"  ({entry['error']})" if entry["error"] else ""),
            ]
            for entry in held
        ]
        click.echo(table(["STATE", "EXPIRES IN", "KEY"], rows))


def _pause(
    session: Session, key: str | None, pause: float | None, resume: bool, as_json: bool
) -> None:
    if key is None:
        raise click.UsageError("--pause and --resume need the KEY of the limit")
    if pause is not None and resume:
        raise click.UsageError("give --pause or --resume, not both")
    if resume:
        ended = _limits_call(session, session.admin.resume, key)
        if as_json:
            click.echo(json.dumps({"key": key, "resumed": ended}))
        else:
            click.echo(f"{key!r} resumed" if ended else f"{key!r} was not paused")
        return
    try:
        made = _limits_call(session, session.admin.pause, key, pause)
    except BadConfiguration as exc:
        error = exc.__cause__
        problem = error.problem if isinstance(error, ConfigurationError) else None
        raise click.BadParameter(problem or str(exc), param_hint="--pause") from exc
    if as_json:
        click.echo(json.dumps({"key": key, "paused_for": made.paused_for}))
    else:
        click.echo(f"{key!r} is paused for {duration(made.paused_for)}, in every worker and beat")


def _limits_call(session: Session, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    try:
        return session.call(method, *args, **kwargs)
    except RateLimiterUnavailable as exc:
        raise click.ClickException(str(exc)) from exc


def _show_every_limit(session: Session, as_json: bool) -> None:
    uses, per_call, overrides = _limits_call(session, session.admin.rate_limits)
    if as_json:
        data = {
            "limits": [use.as_dict() for use in uses],
            "per_call": [known.as_dict() for known in per_call],
            "overrides": [{"key": o.key, "rate": o.text, "ttl": o.ttl} for o in overrides],
        }
        click.echo(json.dumps(data, indent=2))
        return
    if uses:
        click.echo(_usetable(uses))
    for known in per_call:
        click.echo(
            f"{known.key}  {known.task}  {known.rate}  {known.algorithm}: one limit per call; "
            "name a key to see its use"
        )
    if not uses and not per_call:
        click.echo("no task of this app declares a global_rate_limit")
    for override in overrides:
        click.echo(
            f"override on {override.key!r}: {override.text} for {duration(override.ttl)} more"
        )


def _usetable(uses: Sequence[LimitUse]) -> str:
    rows = [
        [
            use.key,
            use.task or "-",
            use.rate + (" (override)" if use.overridden else ""),
            use.algorithm,
            "beat publishes" if use.budget == PUBLISH_BUDGET else "runs",
            str(use.used),
            str(use.remaining),
            "now" if use.retry_after <= 0 else duration(use.retry_after),
        ]
        for use in uses
    ]
    headers = ["KEY", "TASK", "RATE", "ALGORITHM", "COUNTS", "USED", "REMAINING", "NEXT"]
    return table(headers, rows)


def _change_override(
    session: Session,
    key: str | None,
    set_rate: str | None,
    ttl: float | None,
    clear: bool,
    as_json: bool,
) -> None:
    if key is None:
        raise click.UsageError("--set and --clear need the KEY of the limit")
    if set_rate is not None and clear:
        raise click.UsageError("give --set or --clear, not both")
    if clear:
        removed = _limits_call(session, session.admin.clear_override, key)
        if as_json:
            click.echo(json.dumps({"key": key, "cleared": removed}))
        else:
            click.echo(
                f"override on {key!r} removed: its configured rate applies from the next run"
                if removed
                else f"{key!r} had no override"
            )
        return
    if ttl is None:
        raise click.UsageError("--set needs --ttl: an override always expires (e.g. --ttl 1h)")
    try:
        made = _limits_call(session, session.admin.set_override, key, set_rate, ttl=ttl)
    except BadConfiguration as exc:
        error = exc.__cause__
        if isinstance(error, ConfigurationError) and error.option in ("rate", "ttl"):
            hint = "--set" if error.option == "rate" else "--ttl"
            raise click.BadParameter(error.problem or str(error), param_hint=hint) from error
        raise
    if as_json:
        click.echo(json.dumps({"key": made.key, "rate": made.text, "ttl": made.ttl}))
    else:
        click.echo(
            f"{key!r} is limited to {made.text} for {duration(made.ttl)}, in every worker "
            "from its next run"
        )


def _task_limits(session: Session, task_name: str, key: str | None, as_json: bool) -> None:
    try:
        declared, uses = _limits_call(session, session.admin.task_rates, task_name, key)
    except LookupError as exc:
        raise click.UsageError(str(exc.args[0])) from exc
    if as_json:
        data = {
            "task": task_name,
            "declared": [known.as_dict() for known in declared],
            "limits": [use.as_dict() for use in uses],
        }
        click.echo(json.dumps(data, indent=2))
        return
    shown = ", ".join(f"{known.rate} ({known.algorithm}) on {known.key!r}" for known in declared)
    click.echo(f"task {task_name}: global_rate_limit {shown}")
    if uses:
        click.echo(_usetable(uses))
    if key is not None:
        return
    for known in declared:
        if known.fixed_key:
            continue
        if known.glob is None:
            click.echo(f"{known.key}: a function names the key; give KEY to see one key's use")
        elif not any(known.counts_on(use.key) for use in uses):
            click.echo(f"nothing counted on {known.glob!r} in this window")
