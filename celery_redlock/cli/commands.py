"""``celery -A proj redlock``: look at and repair locks and rate limits from a shell.

Installed as a ``celery.commands`` entry point, so Celery adds it to its own
command line and hands it the app named by ``-A``::

    celery -A proj redlock locks 'sync-user:*'   # held locks, owner task, ttl left, arguments
    celery -A proj redlock release sync-user:42  # forced release, after a prompt
    celery -A proj redlock release --task-id ID  # every lock of one task
    celery -A proj redlock release --pattern 'singleton:*'   # celery-singleton's clear_locks
    celery -A proj redlock limits                # every task's limit and its use now
    celery -A proj redlock limits --task proj.call_api       # one task's limits, on each key
    celery -A proj redlock limits api:acme --set 10/s --ttl 1h   # override, every worker
    celery -A proj redlock check                 # nodes, quorum, clocks, settings

The group and the lock commands; ``limits`` is :mod:`.limits_command`, shared parts
:mod:`.session`. Each only renders what :class:`~celery_redlock.admin.Admin` returns. The
command docstrings are the ``--help`` text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from celery.bin.base import handle_preload_options

from ..admin import CheckReport, LockView, ReleaseOutcome
from ..admin.node_health import persistence
from .limits_command import limits
from .session import EXIT_CONFIG, EXIT_UNAVAILABLE, Session, duration, json_option, table

__all__ = ["redlock"]

_F = TypeVar("_F", bound=Callable[..., Any])

# Delivers preload options once, for any Celery version; typed here because Celery is not.
_handle_preload_options: Callable[[_F], _F] = handle_preload_options

#: Locks listed before asking to release many.
_LISTED = 20


@click.group(name="redlock")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.001),
    default=1.0,
    show_default=True,
    help="Longest wait for one Redis node, seconds.",
)
@click.pass_context
@_handle_preload_options
def redlock(ctx: click.Context, /, timeout: float, **preload: Any) -> None:
    """Inspect and repair celery_redlock locks and rate limits.

    Reads the app's redlock_* settings. Each command takes --json for
    machine-readable output. Exit status: 0 fine, 1 too few nodes answered
    or a prompt was declined, 2 bad redlock_* settings.
    """
    # ``preload``: options Celery adds to every command, already delivered by the helper.
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("run it through Celery: celery -A proj redlock ...")
    session = Session(ctx.obj, app, timeout)
    ctx.call_on_close(session.close)
    ctx.obj = session


# -- locks ----------------------------------------------------------------------


@redlock.command()
@click.argument("pattern", default="*")
@json_option
@click.pass_obj
def locks(session: Session, pattern: str, as_json: bool) -> None:
    """List locks whose name matches PATTERN (a Redis glob; default: all).

    Shows, for each lock, the owner's task id and worker, the time left
    until fewer than a majority of nodes hold it, the key's fencing counter,
    how many nodes agree (3/3, or which nodes differ and how) and, for a
    singleton, the arguments it was published with. Then each semaphore's
    holders, one row per slot: task id, worker, time left, nodes. Exits 1
    when too few nodes answered for the list to be complete.
    """
    listing = session.call(session.admin.locks, pattern)
    if as_json:
        click.echo(json.dumps(listing.as_dict(), indent=2))
    else:
        for node_name, error in listing.failed.items():
            click.echo(session.style(f"{node_name} did not answer: {error}", fg="yellow"), err=True)
        if listing.locks:
            rows = [
                [
                    view.name,
                    view.task_id or "-",
                    view.worker or "-",
                    duration(view.ttl),
                    "-" if view.fencing_token is None else str(view.fencing_token),
                    view.agreement(),
                    view.args or "-",
                ]
                for view in listing.locks
            ]
            headers = ["LOCK", "TASK", "WORKER", "TTL", "FENCE", "NODES", "ARGS"]
            click.echo(table(headers, rows))
        if listing.semaphores:
            rows = [
                [
                    view.name,
                    str(holder.slot),
                    holder.task_id or "-",
                    holder.worker or "-",
                    duration(holder.ttl),
                    f"{holder.agree}/{holder.total}"
                    + ("" if holder.held else ", not held by a majority"),
                ]
                for view in listing.semaphores
                for holder in view.holders
            ]
            headers = ["SEMAPHORE", "SLOT", "TASK", "WORKER", "TTL", "NODES"]
            click.echo(table(headers, rows))
        if not listing.locks and not listing.semaphores:
            click.echo(f"no locks match {pattern!r}")
    if not listing.complete:
        click.echo(
            f"only {listing.answered} of {len(listing.node_names)} nodes answered "
            f"({listing.quorum} needed): the list may be incomplete",
            err=True,
        )
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


# -- release --------------------------------------------------------------------


@redlock.command()
@click.argument("name", required=False)
@click.option("--task-id", help="Release every lock this task holds, if it still does.")
@click.option("--pattern", help="Release every lock whose name matches this Redis glob.")
@click.option("--yes", "-y", is_flag=True, help="Release without asking.")
@json_option
@click.pass_obj
def release(
    session: Session,
    name: str | None,
    task_id: str | None,
    pattern: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Force-release lock NAME on every node, whoever holds it.

    Or every lock of one task (--task-id ID: its run lock and its singleton,
    queued or running; a lock that changed hands meanwhile is left alone),
    or every lock whose name matches a glob (--pattern 'singleton:*' frees
    every singleton, as celery-singleton's clear_locks() does).

    The holder is not told: if its task is still running, it now runs
    unprotected until its next heartbeat notices the loss. Waiters are woken
    at once. Asks for confirmation unless --yes is given.
    """
    if sum(given is not None for given in (name, task_id, pattern)) != 1:
        raise click.UsageError("give one of NAME, --task-id ID or --pattern GLOB")
    if task_id is not None:
        _release_task(session, task_id, yes, as_json)
    elif pattern is not None:
        _release_matching(session, pattern, yes, as_json)
    else:
        assert name is not None
        _release_one(session, name, yes, as_json)


def _release_one(session: Session, name: str, yes: bool, as_json: bool) -> None:
    view = session.call(session.admin.describe, name)
    if view is None:
        message = f"lock {name!r} is not held on any node that answered"
        if as_json:
            click.echo(json.dumps({"name": name, "held_on": 0, "released": False, "nodes": []}))
        else:
            click.echo(message)
        return
    if not yes:
        holder = view.task_id or "an owner without a task id"
        where = f" on {view.worker}" if view.worker else ""
        click.confirm(
            f"Release lock {name!r} held by {holder}{where} ({view.agree}/{view.total} nodes)? "
            "The holder is not told",
            abort=True,
            err=True,
        )
    outcome = session.call(session.admin.release, name)
    if as_json:
        click.echo(json.dumps(outcome.as_dict(), indent=2))
    else:
        _echo_released(outcome)
    if not outcome.released:
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


def _echo_released(outcome: ReleaseOutcome) -> None:
    click.echo(
        f"released lock {outcome.name!r}: it was held on {outcome.deleted} of "
        f"{len(outcome.nodes)} nodes"
    )
    for entry in outcome.nodes:
        if entry["error"] is not None:
            click.echo(
                f"{entry['node']} did not answer ({entry['error']}); "
                "the key there expires with its ttl",
                err=True,
            )


def _confirm_many(views: Sequence[LockView], question: str) -> None:
    for view in views[:_LISTED]:
        click.echo(f"  {view.name}  {view.task_id or '-'}  {view.worker or '-'}", err=True)
    if len(views) > _LISTED:
        click.echo(f"  ... and {len(views) - _LISTED} more", err=True)
    click.confirm(question, abort=True, err=True)


def _release_task(session: Session, task_id: str, yes: bool, as_json: bool) -> None:
    views = session.call(session.admin.held_by, task_id)
    if views and not yes:
        _confirm_many(
            views, f"Release these {len(views)} lock(s) of task {task_id}? The task is not told"
        )
    released = session.call(session.admin.release_task, task_id, views)
    if as_json:
        click.echo(json.dumps([entry.as_dict() for entry in released], indent=2))
        return
    if not released:
        click.echo(f"task {task_id} holds no lock on the nodes that answered")
    for entry in released:
        click.echo(
            f"released lock {entry.name!r} of task {task_id}: freed on {entry.freed} of "
            f"{entry.total} nodes"
        )


def _release_matching(session: Session, pattern: str, yes: bool, as_json: bool) -> None:
    listing = session.call(session.admin.locks, pattern)
    views = listing.locks
    if views and not yes:
        _confirm_many(
            views,
            f"Release these {len(views)} lock(s) matching {pattern!r}, whoever holds them? "
            "The holders are not told",
        )
    outcomes = [session.call(session.admin.release, view.name) for view in views]
    if as_json:
        click.echo(json.dumps([outcome.as_dict() for outcome in outcomes], indent=2))
    else:
        if not outcomes:
            click.echo(f"no locks match {pattern!r}")
        for outcome in outcomes:
            _echo_released(outcome)
    if not listing.complete or not all(outcome.released for outcome in outcomes):
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


redlock.add_command(limits)


# -- check ----------------------------------------------------------------------


@redlock.command()
@json_option
@click.pass_obj
def check(session: Session, as_json: bool) -> None:
    """Check the settings and the health of every lock node.

    Per node: reachable, PING latency, Redis version and role, clock offset,
    eviction policy and persistence. Then: whether a quorum answers, the
    spread of the nodes' clocks, the ttl against the node timeout, the
    rate-limit Redis, redlock_tasks and the app's task options. Exits 1 when
    fewer than a majority of nodes answer, 2 when a setting is wrong;
    warnings do not change the exit status.
    """
    report = session.call(session.admin.check)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print_check(session, report)
    if report.errors:
        raise click.exceptions.Exit(EXIT_CONFIG)
    if not report.quorum_ok:
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


def _print_check(session: Session, report: CheckReport) -> None:
    settings, nodes = report.settings, report.nodes
    click.echo(
        f"{len(nodes)} lock node{'s' if len(nodes) != 1 else ''}, quorum {report.quorum}, "
        f"key prefix {settings.key_prefix!r}"
    )
    rows = []
    for health in nodes:
        if not health.ok:
            rows.append([health.node, session.style("DOWN", fg="red", bold=True)] + ["-"] * 6)
            continue
        rows.append(
            [
                health.node,
                session.style("ok", fg="green"),
                f"{health.ping_ms:.2f} ms",
                health.version or "?",
                health.role or "?",
                f"{round(health.clock_offset_ms or 0.0, 1) + 0.0:+.1f} ms",
                health.maxmemory_policy or "?",
                persistence(health),
            ]
        )
    headers = ["NODE", "STATUS", "PING", "VERSION", "ROLE", "CLOCK", "EVICTION", "PERSISTENCE"]
    click.echo(table(headers, rows))
    for health in nodes:
        if not health.ok:
            click.echo(f"  {health.node}: {health.error}")
    quorum = (
        session.style("reachable", fg="green")
        if report.quorum_ok
        else session.style("UNREACHABLE", fg="red", bold=True)
    )
    click.echo(
        f"quorum:      {quorum} ({report.reachable} of {len(nodes)} nodes answer, "
        f"{report.quorum} needed)"
    )
    click.echo(f"clocks:      {report.clock_spread_ms:.1f} ms apart")
    click.echo(
        f"ttl:         redlock_default_ttl {settings.default_ttl:g} s, "
        f"redlock_node_timeout {settings.node_timeout:g} s"
    )
    rate_limit = report.rate_limit
    if rate_limit.get("node"):
        state = "reachable" if rate_limit["ok"] else "DOWN"
        click.echo(f"rate limits: {rate_limit['node']} {state}")
    for label, entries, colour in (
        ("error", report.errors, "red"),
        ("warning", report.warnings, "yellow"),
        ("note", report.notes, None),
    ):
        for entry in entries:
            click.echo(f"{session.style(label, fg=colour)}: {entry}")
