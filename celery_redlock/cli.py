"""``celery -A proj redlock``: look at and repair locks and rate limits from a shell.

Installed as a ``celery.commands`` entry point, so Celery adds it to its own
command line and hands it the app named by ``-A``::

    celery -A proj redlock locks 'sync-user:*'   # held locks, owner task, ttl left
    celery -A proj redlock release sync-user:42  # forced release, after a prompt
    celery -A proj redlock limits api:acme --rate 100/m
    celery -A proj redlock check                 # nodes, quorum, clocks, settings

Every command prints a table by default and JSON with its own ``--json``
flag. Exit status: 0 on success, 1 when too few nodes answered (or a prompt
was declined), 2 for bad ``redlock_*`` settings.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import Any, TypeVar

import click
from celery.bin.base import handle_preload_options
from redis.exceptions import RedisError

from . import _clock
from ._keys import task_signature
from ._nodes import Node, NodeFailure, make_nodes
from ._rates import parse_rate
from .config import Settings, settings_for
from .errors import ConfigurationError, RateLimiterUnavailable
from .policies import TaskPolicy, check_option_names
from .ratelimit import Algorithm, RateLimitDecision, RateLimiter
from .redlock import Redlock

__all__ = ["redlock"]

_F = TypeVar("_F", bound=Callable[..., Any])

# Celery's helper that delivers preload options (``user_preload_options``)
# once, for any Celery version; typed here because Celery is not.
_handle_preload_options: Callable[[_F], _F] = handle_preload_options

#: Exit status when fewer than a majority of the lock nodes answered.
EXIT_UNAVAILABLE = 1
#: Exit status for bad ``redlock_*`` settings (like click's usage errors).
EXIT_CONFIG = 2

#: Node clocks further apart than this (milliseconds) are reported.
CLOCK_SPREAD_WARNING_MS = 500.0

_ALGORITHMS: tuple[Algorithm, ...] = ("fixed", "sliding")


class BadConfiguration(click.ClickException):
    """A ``redlock_*`` setting is wrong: the message names it; exit status 2."""

    exit_code = EXIT_CONFIG

    def __init__(self, error: ConfigurationError | str) -> None:
        super().__init__(f"celery_redlock configuration: {error}")


class _Session:
    """What the subcommands share: the app, its settings and one Redlock.

    The Redlock is built for inspection: the same nodes and key prefix as the
    app's, but the command's ``--timeout`` per node instead of the lock's
    ``redlock_node_timeout``, so a merely busy node is not reported down.
    """

    def __init__(self, cli: Any, app: Any, timeout: float) -> None:
        self.cli = cli
        self.app = app
        self.timeout = timeout
        self._opened: list[Redlock | RateLimiter] = []

    @cached_property
    def settings(self) -> Settings:
        try:
            return settings_for(self.app)
        except ConfigurationError as exc:
            raise BadConfiguration(exc) from exc

    @cached_property
    def redlock(self) -> Redlock:
        inspecting = dataclasses.replace(self.settings, node_timeout=self.timeout)
        try:
            made = inspecting.make_redlock()
        except ConfigurationError as exc:
            raise BadConfiguration(exc) from exc
        self._opened.append(made)
        return made

    def limiter(self) -> tuple[RateLimiter, Node]:
        """The app's rate limiter and a raw connection to the same Redis."""
        settings = self.settings
        where = settings.rate_limit_url or settings.nodes[0]
        option = "redlock_rate_limit_url" if settings.rate_limit_url else "redlock_nodes"
        try:
            limiter = RateLimiter(
                where, key_prefix=f"{settings.key_prefix}rate:", node_timeout=self.timeout
            )
            node = make_nodes([where], self.timeout)[0]
        except ConfigurationError as exc:
            message = str(exc).split(": ", 1)[-1]
            raise BadConfiguration(f"{option}: {message}") from exc
        self._opened.append(limiter)
        return limiter, node

    def style(self, text: str, **styles: Any) -> str:
        """``text`` in colour unless the user asked for none (``celery -C``)."""
        if getattr(self.cli, "no_color", False):
            return text
        return click.style(text, **styles)

    def close(self) -> None:
        for opened in self._opened:
            opened.close()


def _json_option(function: _F) -> _F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print JSON for scripts instead of a table.",
    )(function)


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
    # ``preload`` holds the app's preload options, which Celery adds to every
    # top-level command; handle_preload_options has delivered them already.
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("run it through Celery: celery -A proj redlock ...")
    session = _Session(ctx.obj, app, timeout)
    ctx.call_on_close(session.close)
    ctx.obj = session


# -- locks ----------------------------------------------------------------------


@dataclasses.dataclass
class LockView:
    """What the lock nodes hold for one lock name."""

    name: str
    key: str
    #: A majority of nodes hold the same value; ``None`` when the nodes that
    #: did not answer could tip it either way.
    held: bool | None
    value: str | None
    task_id: str | None
    worker: str | None
    #: Seconds until fewer than a majority of nodes hold the value.
    ttl: float
    #: The key's fencing counter, the largest over the nodes: the holder's
    #: token, or more when attempts that did not win also counted.
    fencing_token: int | None
    agree: int
    total: int
    #: Per node: ``holds``, ``absent``, ``other`` (another value) or ``unreachable``.
    nodes: list[dict[str, Any]]

    def agreement(self) -> str:
        """``3/3``, or the count followed by the nodes that differ."""
        text = f"{self.agree}/{self.total}"
        odd = [f"{node['node']} {node['state']}" for node in self.nodes if node["state"] != "holds"]
        if odd:
            text += f" ({', '.join(odd)})"
        if self.held is None:
            text += ", unconfirmed"
        elif not self.held:
            text += ", not held by a majority"
        return text

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        data = dataclasses.asdict(self)
        data["ttl"] = round(self.ttl, 3)
        return data


def _owner(value: str | None) -> tuple[str | None, str | None]:
    """``(task_id, worker)`` from a lock value ``token|task_id|host:pid``.

    A value written with a free-text owner (``token|owner``) gives the owner
    as the task column; a bare token gives nothing.
    """
    if not value:
        return None, None
    parts = value.split("|", 2)
    if len(parts) == 3:
        return parts[1], parts[2]
    if len(parts) == 2:
        return parts[1], None
    return None, None


def _glob_escape(text: str) -> str:
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


def _scan(redlock: Redlock, pattern: str) -> tuple[list[str], dict[str, str]]:
    """Lock names matching ``pattern`` on any node, and the nodes that failed."""
    prefix = redlock.key_prefix
    match = f"{_glob_escape(prefix)}{{{pattern}}}"
    names: set[str] = set()
    failed: dict[str, str] = {}
    for node in redlock.nodes:
        try:
            for raw in node.client.scan_iter(match=match, count=1000):
                key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                # Fencing counters end in ":fence" and rate-limit state lives
                # under "<prefix>rate:"; neither is a lock.
                if key.endswith(":fence") or key.startswith(f"{prefix}rate:"):
                    continue
                if key.startswith(f"{prefix}{{") and key.endswith("}"):
                    names.add(key[len(prefix) + 1 : -1])
        except (RedisError, OSError) as exc:
            failed[node.name] = str(exc)
    return sorted(names), failed


def _fencing_tokens(redlock: Redlock, names: Sequence[str]) -> dict[str, int]:
    """The largest fencing counter of each name over the nodes that answer."""
    best: dict[str, int] = {}
    if not names:
        return best
    for node in redlock.nodes:
        try:
            pipe = node.client.pipeline(transaction=False)
            for name in names:
                pipe.get(redlock._fence_key(name))
            values = pipe.execute()
        except (RedisError, OSError):
            continue
        for name, value in zip(names, values, strict=True):
            if value is not None:
                best[name] = max(best.get(name, 0), int(value))
    return best


def describe(redlock: Redlock, name: str, fencing_token: int | None) -> LockView | None:
    """A :class:`LockView` of ``name``, or ``None`` when no node that answered holds it."""
    found = redlock.inspect(name)
    values = Counter(
        entry[0] for entry in found if not isinstance(entry, NodeFailure) and entry[0] is not None
    )
    if not values:
        return None
    value = values.most_common(1)[0][0]
    nodes: list[dict[str, Any]] = []
    ttls: list[float] = []
    for node, entry in zip(redlock.nodes, found, strict=True):
        if isinstance(entry, NodeFailure):
            nodes.append({"node": node.name, "state": "unreachable", "error": str(entry)})
            continue
        there, ttl = entry
        state = "holds" if there == value else "absent" if there is None else "other"
        if state == "holds":
            ttls.append(ttl)
        nodes.append({"node": node.name, "state": state, "ttl": round(ttl, 3), "value": there})
    ttls.sort(reverse=True)
    agree = len(ttls)
    unreachable = sum(1 for entry in found if isinstance(entry, NodeFailure))
    held: bool | None = agree >= redlock.quorum
    if not held and agree + unreachable >= redlock.quorum:
        held = None
    task_id, worker = _owner(value)
    return LockView(
        name=name,
        key=redlock.key(name),
        held=held,
        value=value,
        task_id=task_id,
        worker=worker,
        ttl=ttls[redlock.quorum - 1] if agree >= redlock.quorum else ttls[0],
        fencing_token=fencing_token,
        agree=agree,
        total=len(redlock.nodes),
        nodes=nodes,
    )


@redlock.command()
@click.argument("pattern", default="*")
@_json_option
@click.pass_obj
def locks(session: _Session, pattern: str, as_json: bool) -> None:
    """List locks whose name matches PATTERN (a Redis glob; default: all).

    Shows, for each lock, the owner's task id and worker, the time left
    until fewer than a majority of nodes hold it, the key's fencing counter
    and how many nodes agree (3/3, or which nodes differ and how). Exits 1
    when too few nodes answered for the list to be complete.
    """
    redlock = session.redlock
    names, failed = _scan(redlock, pattern)
    tokens = _fencing_tokens(redlock, names)
    views = [
        view for name in names if (view := describe(redlock, name, tokens.get(name))) is not None
    ]
    incomplete = len(redlock.nodes) - len(failed) < redlock.quorum
    if as_json:
        click.echo(
            json.dumps(
                {
                    "pattern": pattern,
                    "quorum": redlock.quorum,
                    "nodes": [
                        {
                            "node": node.name,
                            "ok": node.name not in failed,
                            "error": failed.get(node.name),
                        }
                        for node in redlock.nodes
                    ],
                    "complete": not incomplete,
                    "locks": [view.as_dict() for view in views],
                },
                indent=2,
            )
        )
    else:
        for node_name, error in failed.items():
            click.echo(session.style(f"{node_name} did not answer: {error}", fg="yellow"), err=True)
        if views:
            rows = [
                [
                    view.name,
                    view.task_id or "-",
                    view.worker or "-",
                    _duration(view.ttl),
                    "-" if view.fencing_token is None else str(view.fencing_token),
                    view.agreement(),
                ]
                for view in views
            ]
            click.echo(_table(["LOCK", "TASK", "WORKER", "TTL", "FENCE", "NODES"], rows))
        else:
            click.echo(f"no locks match {pattern!r}")
    if incomplete:
        click.echo(
            f"only {len(redlock.nodes) - len(failed)} of {len(redlock.nodes)} nodes answered "
            f"({redlock.quorum} needed): the list may be incomplete",
            err=True,
        )
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


# -- release --------------------------------------------------------------------


def force_release(redlock: Redlock, name: str) -> list[dict[str, Any]]:
    """Delete lock ``name`` on every node, whoever holds it, and wake its waiters.

    Returns one entry per node: ``{"node", "deleted", "error"}``. The fencing
    counter is kept, so the next holder still gets a larger token.
    """
    key = redlock.key(name)
    channel = redlock._channel(name)
    outcome: list[dict[str, Any]] = []
    for node in redlock.nodes:
        try:
            pipe = node.client.pipeline(transaction=True)
            pipe.delete(key)
            # What release.lua publishes: blocked waiters retry at once.
            pipe.publish(channel, "1")
            deleted, _ = pipe.execute()
        except (RedisError, OSError) as exc:
            outcome.append({"node": node.name, "deleted": False, "error": str(exc)})
            continue
        outcome.append({"node": node.name, "deleted": bool(deleted), "error": None})
    return outcome


@redlock.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Release without asking.")
@_json_option
@click.pass_obj
def release(session: _Session, name: str, yes: bool, as_json: bool) -> None:
    """Force-release lock NAME on every node, whoever holds it.

    The holder is not told: if its task is still running, it now runs
    unprotected until its next heartbeat notices the loss. Waiters are woken
    at once. Asks for confirmation unless --yes is given.
    """
    redlock = session.redlock
    view = describe(redlock, name, None)
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
    outcome = force_release(redlock, name)
    deleted = sum(1 for entry in outcome if entry["deleted"])
    answered = sum(1 for entry in outcome if entry["error"] is None)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "name": name,
                    "held_on": deleted,
                    "released": answered >= redlock.quorum,
                    "nodes": outcome,
                },
                indent=2,
            )
        )
    else:
        click.echo(f"released lock {name!r}: it was held on {deleted} of {len(outcome)} nodes")
        for entry in outcome:
            if entry["error"] is not None:
                click.echo(
                    f"{entry['node']} did not answer ({entry['error']}); "
                    "the key there expires with its ttl",
                    err=True,
                )
    if answered < redlock.quorum:
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


# -- limits ---------------------------------------------------------------------


def _raw_rate_state(limiter: RateLimiter, node: Node, key: str) -> list[dict[str, Any]]:
    """Each algorithm's state key for ``key``: units counted and ttl left."""
    pipe = node.client.pipeline(transaction=False)
    for algorithm in _ALGORITHMS:
        state_key = limiter.state_key(key, algorithm)
        if algorithm == "fixed":
            pipe.get(state_key)
        else:
            pipe.zcard(state_key)
        pipe.pttl(state_key)
    try:
        replies = pipe.execute(raise_on_error=False)
    except (RedisError, OSError) as exc:
        raise click.ClickException(
            f"rate limits: Redis at {node.name} did not answer ({exc})"
        ) from exc
    found: list[dict[str, Any]] = []
    for index, algorithm in enumerate(_ALGORITHMS):
        count, pttl = replies[2 * index], replies[2 * index + 1]
        if isinstance(count, Exception) or isinstance(pttl, Exception):
            error = count if isinstance(count, Exception) else pttl
            found.append(
                {
                    "algorithm": algorithm,
                    "state_key": limiter.state_key(key, algorithm),
                    "used": None,
                    "ttl": None,
                    "error": str(error),
                }
            )
            continue
        exists = int(pttl) != -2
        found.append(
            {
                "algorithm": algorithm,
                "state_key": limiter.state_key(key, algorithm),
                "used": int(count or 0) if exists else None,
                "ttl": max(int(pttl), 0) / 1000 if int(pttl) >= 0 else None,
                "error": None,
            }
        )
    return found


@redlock.command()
@click.argument("key")
@click.option("--limit", type=click.IntRange(min=1), help="Units the limit admits per period.")
@click.option("--period", type=click.FloatRange(min=0.001), help="The window, seconds.")
@click.option("--rate", help='The limit in Celery\'s syntax instead, e.g. "100/m".')
@click.option(
    "--algorithm",
    type=click.Choice(_ALGORITHMS),
    help="The algorithm the limit uses (default: the one with state, else fixed).",
)
@_json_option
@click.pass_obj
def limits(
    session: _Session,
    key: str,
    limit: int | None,
    period: float | None,
    rate: str | None,
    algorithm: Algorithm | None,
    as_json: bool,
) -> None:
    """Show the state of rate-limit KEY (a task's rate_limit_key, or its name).

    Prints what each algorithm has counted and when it resets. Given the
    limit (--limit and --period, or --rate), also what a hit now would get:
    allowed or not, units remaining, seconds until it is allowed. Nothing is
    counted.
    """
    if rate is not None:
        if limit is not None or period is not None:
            raise click.UsageError("give either --rate or --limit with --period, not both")
        try:
            parsed = parse_rate(rate, option="--rate")
        except ConfigurationError as exc:
            raise click.BadParameter(
                str(exc).removeprefix("--rate: "), param_hint="--rate"
            ) from exc
        limit, period = parsed.limit, parsed.period
    elif (limit is None) != (period is None):
        raise click.UsageError("--limit and --period go together (or use --rate, e.g. 100/m)")
    limiter, node = session.limiter()
    try:
        state = _raw_rate_state(limiter, node, key)
    finally:
        node.close()
    decision: RateLimitDecision | None = None
    if limit is not None and period is not None:
        if algorithm is None:
            with_state = [entry["algorithm"] for entry in state if entry["used"] is not None]
            algorithm = with_state[0] if len(with_state) == 1 else "fixed"
        try:
            decision = limiter.peek(key, limit, period, algorithm=algorithm)
        except RateLimiterUnavailable as exc:
            raise click.ClickException(str(exc)) from exc
        except ConfigurationError as exc:
            raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(
            json.dumps(
                {
                    "key": key,
                    "node": node.name,
                    "state": state,
                    "decision": None
                    if decision is None
                    else {
                        "algorithm": algorithm,
                        "period": period,
                        **dataclasses.asdict(decision),
                    },
                },
                indent=2,
            )
        )
        return
    click.echo(f"rate limit {key!r} on {node.name}")
    rows = [
        [
            entry["algorithm"],
            "-" if entry["used"] is None else str(entry["used"]),
            "-" if entry["ttl"] is None else _duration(entry["ttl"]),
            entry["state_key"] + (f"  ({entry['error']})" if entry["error"] else ""),
        ]
        for entry in state
    ]
    click.echo(_table(["ALGORITHM", "USED", "RESETS IN", "STATE KEY"], rows))
    if decision is not None:
        verdict = (
            "a hit now is allowed"
            if decision.allowed
            else f"next hit allowed in {_duration(decision.retry_after)}"
        )
        click.echo(
            f"limit {decision.limit} per {period:g}s ({algorithm}): "
            f"{decision.remaining} remaining, {verdict}"
        )


# -- check ----------------------------------------------------------------------


@dataclasses.dataclass
class NodeHealth:
    """What ``check`` learnt about one node."""

    node: str
    ok: bool
    error: str | None = None
    ping_ms: float | None = None
    version: str | None = None
    role: str | None = None
    run_id: str | None = None
    #: This node's clock minus this host's, milliseconds (± half a round trip).
    clock_offset_ms: float | None = None
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    appendonly: bool | None = None
    #: RDB snapshot rules (``CONFIG GET save``); ``None`` when CONFIG is refused.
    save: str | None = None


def probe(node: Node) -> NodeHealth:
    """PING, TIME, INFO and ``CONFIG GET save`` on one node."""
    client = node.client
    try:
        pings = []
        for _ in range(3):
            started = _clock.monotonic()
            client.ping()
            pings.append((_clock.monotonic() - started) * 1000)
        wall = time.time()
        started = _clock.monotonic()
        seconds, micros = client.time()
        elapsed = _clock.monotonic() - started
        offset_ms = (seconds + micros / 1e6 - (wall + elapsed / 2)) * 1000
        info = client.info()
    except (RedisError, OSError) as exc:
        return NodeHealth(node=node.name, ok=False, error=str(exc))
    save: str | None
    try:
        reply = client.config_get("save")
        raw = next(iter(reply.values()), None) if reply else None
        save = raw.decode() if isinstance(raw, bytes) else raw
    except (RedisError, OSError):
        save = None  # CONFIG renamed or refused (managed Redis services)
    return NodeHealth(
        node=node.name,
        ok=True,
        ping_ms=round(min(pings), 3),
        version=str(info.get("redis_version", "?")),
        role=str(info.get("role", "?")),
        run_id=str(info.get("run_id", "")) or None,
        clock_offset_ms=round(offset_ms, 3),
        maxmemory=int(info.get("maxmemory", 0)),
        maxmemory_policy=str(info.get("maxmemory_policy", "?")),
        appendonly=bool(int(info.get("aof_enabled", 0))),
        save=save,
    )


def _persistence(health: NodeHealth) -> str:
    """``aof``, ``rdb``, ``aof+rdb``, ``off``; ``aof off`` when the RDB rules are unknown."""
    if health.save is None and not health.appendonly:
        return "aof off"
    kinds = [kind for kind, on in (("aof", health.appendonly), ("rdb", health.save)) if on]
    return "+".join(kinds) or "off"


def _check_tasks(app: Any) -> list[str]:
    """Problems in ``redlock_tasks``, found without changing any task."""
    problems = []
    setup_error = getattr(app, "_redlock_setup_error", None)
    if setup_error is not None:
        problems.append(str(setup_error))
    tasks = settings_for(app).tasks
    if not tasks:
        return problems
    try:
        app.loader.import_default_modules()
    except Exception as exc:  # the app's own modules: report, do not crash
        problems.append(
            f"redlock_tasks not checked: importing the app's task modules failed: {exc}"
        )
        return problems
    for name, options in tasks.items():
        task = app.tasks.get(name)
        if task is None:
            problems.append(
                f"redlock_tasks names task {name!r}, which this app does not know; "
                "check the name and that its module is imported (include= or imports=)"
            )
            continue
        try:
            check_option_names(name, options)
            TaskPolicy.from_options(name, task_signature(type(task)), options)
        except ConfigurationError as exc:
            problems.append(f"redlock_tasks: {exc}")
    return problems


@redlock.command()
@_json_option
@click.pass_obj
def check(session: _Session, as_json: bool) -> None:
    """Check the settings and the health of every lock node.

    Per node: reachable, PING latency, Redis version and role, clock offset,
    eviction policy and persistence. Then: whether a quorum answers, the
    spread of the nodes' clocks, the ttl against the node timeout, the
    rate-limit Redis and redlock_tasks. Exits 1 when fewer than a majority
    of nodes answer, 2 when a setting is wrong; warnings do not change the
    exit status.
    """
    settings = session.settings
    redlock = session.redlock
    errors: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []

    if settings.default_ttl <= 2 * settings.node_timeout:
        errors.append(
            f"redlock_default_ttl ({settings.default_ttl:g} s) must be more than twice "
            f"redlock_node_timeout ({settings.node_timeout:g} s): no lock could be taken"
        )
    elif settings.node_timeout > settings.default_ttl / 10:
        warnings.append(
            f"redlock_node_timeout ({settings.node_timeout:g} s) is more than a tenth of "
            f"redlock_default_ttl ({settings.default_ttl:g} s): a slow node eats much of "
            "each lock's validity"
        )
    errors.extend(_check_tasks(session.app))

    nodes = [probe(node) for node in redlock.nodes]
    up = [health for health in nodes if health.ok]
    quorum_ok = len(up) >= redlock.quorum
    count = len(nodes)
    if count == 1:
        notes.append("one lock node: a plain single-instance lock, no fault tolerance")
    elif count % 2 == 0:
        notes.append(
            f"{count} lock nodes tolerate no more failures than {count - 1}; an odd number "
            "is recommended"
        )
    same: dict[str, list[str]] = {}
    for health in up:
        if health.run_id:
            same.setdefault(health.run_id, []).append(health.node)
    for names in same.values():
        if len(names) > 1:
            warnings.append(
                f"{' and '.join(names)} are the same Redis server: a lock node must be an "
                "independent server, or one failure costs several votes"
            )
    for health in up:
        if health.role not in (None, "master"):
            warnings.append(
                f"{health.node} is a {health.role}: it refuses writes; use independent masters"
            )
        if health.ping_ms is not None and health.ping_ms > settings.node_timeout * 1000:
            warnings.append(
                f"{health.node} answered PING in {health.ping_ms:.1f} ms, more than "
                f"redlock_node_timeout ({settings.node_timeout * 1000:g} ms): lock "
                "operations will count it as down"
            )
        policy = health.maxmemory_policy or ""
        if policy.startswith(("allkeys-", "volatile-")):
            limit = "" if health.maxmemory else " once a maxmemory limit is set"
            warnings.append(
                f"{health.node} has maxmemory-policy {policy}: it can evict lock keys{limit} "
                "(they carry a ttl); use noeviction"
            )
    if up and not any(health.appendonly or health.save for health in up):
        notes.append(
            "no node persists its data: a restarted node comes back empty; keep it out "
            "for the longest lock ttl before it rejoins"
        )
    offsets = [health.clock_offset_ms for health in up if health.clock_offset_ms is not None]
    spread = round(max(offsets) - min(offsets), 3) if len(offsets) > 1 else 0.0
    if spread > CLOCK_SPREAD_WARNING_MS:
        warnings.append(
            f"the nodes' clocks are {spread:.0f} ms apart: check time synchronisation; a "
            "clock that jumps expires keys early"
        )

    rate_limit = _check_rate_limit(session, errors, warnings)

    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": quorum_ok and not errors,
                    "quorum": {
                        "reachable": len(up),
                        "needed": redlock.quorum,
                        "total": count,
                        "ok": quorum_ok,
                    },
                    "nodes": [dataclasses.asdict(health) for health in nodes],
                    "clock_spread_ms": spread,
                    "settings": {
                        "key_prefix": settings.key_prefix,
                        "default_ttl": settings.default_ttl,
                        "node_timeout": settings.node_timeout,
                    },
                    "rate_limit": rate_limit,
                    "errors": errors,
                    "warnings": warnings,
                    "notes": notes,
                },
                indent=2,
            )
        )
    else:
        _print_check(session, settings, redlock, nodes, spread, rate_limit, errors, warnings, notes)
    if errors:
        raise click.exceptions.Exit(EXIT_CONFIG)
    if not quorum_ok:
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


def _check_rate_limit(session: _Session, errors: list[str], warnings: list[str]) -> dict[str, Any]:
    try:
        limiter, node = session.limiter()
    except BadConfiguration as exc:
        errors.append(exc.message.removeprefix("celery_redlock configuration: "))
        return {"node": None, "ok": False, "error": exc.message}
    del limiter
    try:
        started = _clock.monotonic()
        node.client.ping()
        ping_ms = round((_clock.monotonic() - started) * 1000, 3)
    except (RedisError, OSError) as exc:
        warnings.append(
            f"the rate-limit Redis {node.name} did not answer ({exc}): tasks with a "
            "global_rate_limit are re-queued until it does"
        )
        return {"node": node.name, "ok": False, "error": str(exc)}
    finally:
        node.close()
    return {"node": node.name, "ok": True, "ping_ms": ping_ms}


def _print_check(
    session: _Session,
    settings: Settings,
    redlock: Redlock,
    nodes: list[NodeHealth],
    spread: float,
    rate_limit: dict[str, Any],
    errors: list[str],
    warnings: list[str],
    notes: list[str],
) -> None:
    up = sum(1 for health in nodes if health.ok)
    click.echo(
        f"{len(nodes)} lock node{'s' if len(nodes) != 1 else ''}, quorum {redlock.quorum}, "
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
                _persistence(health),
            ]
        )
    headers = ["NODE", "STATUS", "PING", "VERSION", "ROLE", "CLOCK", "EVICTION", "PERSISTENCE"]
    click.echo(_table(headers, rows))
    for health in nodes:
        if not health.ok:
            click.echo(f"  {health.node}: {health.error}")
    quorum = (
        session.style("reachable", fg="green")
        if up >= redlock.quorum
        else session.style("UNREACHABLE", fg="red", bold=True)
    )
    click.echo(
        f"quorum:      {quorum} ({up} of {len(nodes)} nodes answer, {redlock.quorum} needed)"
    )
    click.echo(f"clocks:      {spread:.1f} ms apart")
    click.echo(
        f"ttl:         redlock_default_ttl {settings.default_ttl:g} s, "
        f"redlock_node_timeout {settings.node_timeout:g} s"
    )
    if rate_limit.get("node"):
        state = "reachable" if rate_limit["ok"] else "DOWN"
        click.echo(f"rate limits: {rate_limit['node']} {state}")
    for label, entries, colour in (
        ("error", errors, "red"),
        ("warning", warnings, "yellow"),
        ("note", notes, None),
    ):
        for entry in entries:
            click.echo(f"{session.style(label, fg=colour)}: {entry}")


# -- output helpers ---------------------------------------------------------------


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell (styles in a cell do not count)."""
    rows = [list(headers), *map(list, rows)]
    widths = [
        max(len(click.unstyle(row[column])) for row in rows) for column in range(len(headers))
    ]
    lines = []
    for row in rows:
        cells = [
            cell + " " * (width - len(click.unstyle(cell)))
            for cell, width in zip(row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """``12.3s``, ``4m05s``, ``2h03m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
