"""``check``: the settings and every node, judged by rules that return findings as data.

Nothing here prints. An ``error`` makes ``celery redlock check`` exit 2; too few nodes
answering, exit 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from redis.exceptions import RedisError

from .. import _clock
from .._validators import check_ttl
from ..errors import ConfigurationError, RateLimiterUnavailable
from ..lock.redlock import Redlock
from ..ratelimit import RateLimiter
from ..tasks.policies import TaskPolicy
from ..tasks.settings import Settings, in_user_terms, node_fallback, unknown_settings
from ..tasks.task_table import check_entry, entry_policy, unknown_task
from .node_access import OpenNode
from .node_health import NodeHealth

__all__ = [
    "CLOCK_SPREAD_WARNING_MS",
    "CheckReport",
    "CheckSubject",
    "Finding",
    "clock_spread",
    "conf_findings",
    "node_findings",
    "run_check",
    "settings_findings",
    "task_findings",
]

#: Node clocks further apart than this (milliseconds) are reported.
CLOCK_SPREAD_WARNING_MS = 500.0

Level = Literal["error", "warning", "note"]


class CheckSubject(Protocol):
    """What ``check`` reads of an app: its settings, its nodes and its rate-limit Redis."""

    app: Any

    @property
    def settings(self) -> Settings:
        """The app's checked settings."""

    @property
    def redlock(self) -> Redlock:
        """A Redlock on the app's lock nodes."""

    def probe(self) -> list[NodeHealth]:
        """Every lock node's health."""

    def limiter(self) -> tuple[RateLimiter, OpenNode]:
        """The rate limiter and a plain connection to its Redis (the caller closes it)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing ``check`` found: an ``error``, a ``warning`` or a ``note``."""

    level: Level
    message: str


@dataclasses.dataclass
class CheckReport:
    """Everything ``check`` measured and found."""

    settings: Settings
    quorum: int
    nodes: list[NodeHealth]
    clock_spread_ms: float
    #: The rate-limit Redis: ``{"node", "ok", "ping_ms"}`` or ``{"node", "ok", "error"}``,
    #: and ``"overrides"``: ``[{"key", "rate", "ttl"}]`` in force.
    rate_limit: dict[str, Any]
    findings: list[Finding]

    def messages(self, level: Level) -> list[str]:
        """The findings of one level, in the order found."""
        return [finding.message for finding in self.findings if finding.level == level]

    @property
    def errors(self) -> list[str]:
        """Settings that are wrong: no lock (or no task) can work with them."""
        return self.messages("error")

    @property
    def warnings(self) -> list[str]:
        """Things that work, but weaken the guarantees."""
        return self.messages("warning")

    @property
    def notes(self) -> list[str]:
        """Facts worth knowing about the deployment."""
        return self.messages("note")

    @property
    def reachable(self) -> int:
        """Nodes that answered."""
        return sum(1 for health in self.nodes if health.ok)

    @property
    def quorum_ok(self) -> bool:
        """A majority of nodes answered."""
        return self.reachable >= self.quorum

    @property
    def ok(self) -> bool:
        """A majority answered and nothing is wrong."""
        return self.quorum_ok and not self.errors

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "ok": self.ok,
            "quorum": {
                "reachable": self.reachable,
                "needed": self.quorum,
                "total": len(self.nodes),
                "ok": self.quorum_ok,
            },
            "nodes": [dataclasses.asdict(health) for health in self.nodes],
            "clock_spread_ms": self.clock_spread_ms,
            "settings": {
                "key_prefix": self.settings.key_prefix,
                "default_ttl": self.settings.default_ttl,
                "node_timeout": self.settings.node_timeout,
            },
            "rate_limit": self.rate_limit,
            "errors": self.errors,
            "warnings": self.warnings,
            "notes": self.notes,
        }


def run_check(admin: CheckSubject) -> CheckReport:
    """Probe every node and the rate-limit Redis, and apply every rule.

    Raises:
        ConfigurationError: the settings cannot even be read (a bad node URL).
    """
    settings = admin.settings
    redlock = admin.redlock
    findings = conf_findings(admin.app.conf)
    findings += settings_findings(settings)
    findings += task_findings(admin.app, settings)
    nodes = admin.probe()
    findings += node_findings(settings, nodes)
    rate_limit, rate_findings = _rate_limit_health(admin)
    findings += rate_findings
    return CheckReport(
        settings=settings,
        quorum=redlock.quorum,
        nodes=nodes,
        clock_spread_ms=clock_spread(nodes),
        rate_limit=rate_limit,
        findings=findings,
    )


def conf_findings(conf: Any) -> list[Finding]:
    """Names in ``app.conf`` meant for celery_redlock but never read; the fallback node."""
    found = [Finding("error", problem) for problem in unknown_settings(conf)]
    node = node_fallback(conf)
    if node is not None:
        problem = f"redlock_nodes is not set and the broker is not Redis: locks go to {node}"
        found.append(Finding("warning", f"{problem}; set redlock_nodes to your lock nodes"))
    return found


def settings_findings(settings: Settings) -> list[Finding]:
    """The default ttl against the node timeout."""
    ttl, timeout = settings.default_ttl, settings.node_timeout
    try:
        check_ttl(ttl, timeout, "redlock_default_ttl", timeout_option="redlock_node_timeout")
    except ConfigurationError as exc:
        return [Finding("error", f"{exc}; no lock could be taken")]
    if timeout > ttl / 10:
        return [
            Finding(
                "warning",
                f"redlock_node_timeout ({timeout:g} s) is more than a tenth of "
                f"redlock_default_ttl ({ttl:g} s): a slow node eats much of each lock's validity",
            )
        ]
    return []


def task_findings(app: Any, settings: Settings) -> list[Finding]:
    """Problems in ``redlock_tasks`` and the app's tasks, judged as a worker start-up does."""
    problems: list[str] = []

    def said(exc: ConfigurationError) -> str:
        """The problem, its setting named as the app's configuration spells it."""
        return str(in_user_terms(app.conf, exc.with_context()))

    if settings.tasks:
        try:
            app.loader.import_default_modules()
        except Exception as exc:  # the app's own modules: report, do not crash
            problems.append(
                f"redlock_tasks not checked: importing the app's task modules failed: {exc}"
            )
    registered: list[Any] = []
    if not problems and (app.finalized or app.autofinalize):
        try:
            registered = list(app.tasks.values())  # finalizes the app: tasks check their options
        except ConfigurationError as exc:
            problems.append(said(exc))
    setup_error = getattr(app, "_redlock_setup_error", None)
    if setup_error is not None:
        problems.insert(0, said(setup_error))
    # A default ttl too short for the node timeout is reported once, by settings_findings.
    default_ttl_bad = any(finding.level == "error" for finding in settings_findings(settings))

    def resolve(policy: TaskPolicy) -> None:
        try:
            policy.resolve(settings)
        except ConfigurationError as exc:
            if not (default_ttl_bad and exc.option == "redlock_default_ttl"):
                problems.append(said(exc))

    unknown: list[str] = []
    for name, options in settings.tasks.items():
        task = app.tasks.get(name) if registered else None
        try:
            check_entry(name, options)
            if task is not None:
                resolve(entry_policy(name, type(task), options))
        except ConfigurationError as exc:
            problems.append(said(exc))
            continue
        if registered and task is None:
            unknown.append(unknown_task(name, list(app.tasks)))
    for task in registered:
        policy = getattr(task, "_redlock_policy", None)
        if isinstance(policy, TaskPolicy) and task.name not in settings.tasks:
            resolve(policy)
    found = [Finding("error", problem) for problem in dict.fromkeys(problems)]
    return found + [Finding("warning", problem) for problem in unknown]


def node_findings(settings: Settings, nodes: Sequence[NodeHealth]) -> list[Finding]:
    """Node count, independence, role, latency, eviction, persistence and clocks."""
    found: list[Finding] = []
    up = [health for health in nodes if health.ok]
    count = len(nodes)
    if count == 1:
        found.append(
            Finding("note", "one lock node: a plain single-instance lock, no fault tolerance")
        )
    elif count % 2 == 0:
        found.append(
            Finding(
                "note",
                f"{count} lock nodes tolerate no more failures than {count - 1}; an odd number "
                "is recommended",
            )
        )
    same: dict[str, list[str]] = {}
    for health in up:
        if health.run_id:
            same.setdefault(health.run_id, []).append(health.node)
    for names in same.values():
        if len(names) > 1:
            found.append(
                Finding(
                    "warning",
                    f"{' and '.join(names)} are the same Redis server: a lock node must be an "
                    "independent server, or one failure costs several votes",
                )
            )
    for health in up:
        if health.role not in (None, "master"):
            found.append(
                Finding(
                    "warning",
                    f"{health.node} is a {health.role}: it refuses writes; use independent masters",
                )
            )
        if health.ping_ms is not None and health.ping_ms > settings.node_timeout * 1000:
            found.append(
                Finding(
                    "warning",
                    f"{health.node} answered PING in {health.ping_ms:.1f} ms, more than "
                    f"redlock_node_timeout ({settings.node_timeout * 1000:g} ms): lock "
                    "operations will count it as down",
                )
            )
        policy = health.maxmemory_policy or ""
        if policy.startswith(("allkeys-", "volatile-")):
            limit = "" if health.maxmemory else " once a maxmemory limit is set"
            found.append(
                Finding(
                    "warning",
                    f"{health.node} has maxmemory-policy {policy}: it can evict lock keys{limit} "
                    "(they carry a ttl); use noeviction",
                )
            )
    if up and not any(health.appendonly or health.save for health in up):
        found.append(
            Finding(
                "note",
                "no node persists its data: a restarted node comes back empty; keep it out "
                "for the longest lock ttl before it rejoins",
            )
        )
    spread = clock_spread(nodes)
    if spread > CLOCK_SPREAD_WARNING_MS:
        found.append(
            Finding(
                "warning",
                f"the nodes' clocks are {spread:.0f} ms apart: check time synchronisation; a "
                "clock that jumps expires keys early",
            )
        )
    return found


def clock_spread(nodes: Sequence[NodeHealth]) -> float:
    """Milliseconds between the fastest and the slowest clock of the nodes that answered."""
    offsets = [
        health.clock_offset_ms
        for health in nodes
        if health.ok and health.clock_offset_ms is not None
    ]
    return round(max(offsets) - min(offsets), 3) if len(offsets) > 1 else 0.0


def _rate_limit_health(admin: CheckSubject) -> tuple[dict[str, Any], list[Finding]]:
    try:
        limiter, node = admin.limiter()
    except ConfigurationError as exc:
        return (
            {"node": None, "ok": False, "error": f"celery_redlock configuration: {exc}"},
            [Finding("error", str(exc))],
        )
    try:
        started = _clock.monotonic()
        node.client.ping()
        ping_ms = round((_clock.monotonic() - started) * 1000, 3)
    except (RedisError, OSError) as exc:
        settings = admin.settings
        if settings.rate_limit_fallback is not None:
            meanwhile = "decided on redlock_rate_limit_fallback until it answers"
        elif settings.rate_limit_on_unavailable == "allow":
            meanwhile = "run unchecked until it answers (redlock_rate_limit_on_unavailable)"
        else:
            meanwhile = "re-queued until it answers"
        warning = Finding(
            "warning",
            f"the rate-limit Redis {node.name} did not answer ({exc}): tasks with a "
            f"global_rate_limit are {meanwhile}",
        )
        return {"node": node.name, "ok": False, "error": str(exc), "overrides": []}, [warning]
    finally:
        node.close()
    try:
        overrides = limiter.overrides()
    except RateLimiterUnavailable as exc:
        return {"node": node.name, "ok": False, "error": str(exc), "overrides": []}, []
    found = [
        Finding(
            "note",
            f"rate limit {override.key!r} is overridden: {override.text} for another "
            f"{_seconds_text(override.ttl)} (celery redlock limits {override.key} --clear)",
        )
        for override in overrides
    ]
    listed = [{"key": o.key, "rate": o.text, "ttl": o.ttl} for o in overrides]
    return {"node": node.name, "ok": True, "ping_ms": ping_ms, "overrides": listed}, found


def _seconds_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
