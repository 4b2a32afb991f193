"""Held locks as data: list them, describe one, force-release one, or all of a task's."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .._layout import ArgsPreview, LockValue, lock_name, lock_pattern
from ..lock.redlock import Redlock
from .node_access import lock_nodes
from .semaphores import SemaphoreView, list_semaphores

__all__ = [
    "LockListing",
    "LockView",
    "OwnerRelease",
    "ReleaseOutcome",
    "describe",
    "force_release",
    "list_locks",
    "release_owned",
]


@dataclasses.dataclass
class LockView:
    """What the lock nodes hold for one lock name."""

    name: str
    key: str
    #: A majority of nodes hold the same value; ``None``: the silent nodes could tip it.
    held: bool | None
    value: str | None
    task_id: str | None
    worker: str | None
    #: Seconds until fewer than a majority of nodes hold the value.
    ttl: float
    #: The key's fencing counter, largest over the nodes (losing attempts may count too).
    fencing_token: int | None
    agree: int
    total: int
    #: Per node: ``holds``, ``absent``, ``other`` (another value) or ``unreachable``.
    nodes: list[dict[str, Any]]
    #: A singleton's call as published (``(42, force=True)``); ``None`` for other locks.
    args: str | None = None

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


@dataclasses.dataclass
class LockListing:
    """The locks and semaphores matching a pattern, and how complete the answer is."""

    pattern: str
    quorum: int
    #: Every lock node's name, in order.
    node_names: list[str]
    #: ``{node: error}`` for the nodes that could not be scanned.
    failed: dict[str, str]
    locks: list[LockView]
    #: Semaphores matching the pattern, with their holders per slot.
    semaphores: list[SemaphoreView] = dataclasses.field(default_factory=list)

    @property
    def answered(self) -> int:
        """How many nodes were scanned."""
        return len(self.node_names) - len(self.failed)

    @property
    def complete(self) -> bool:
        """A majority of nodes answered, so no held lock can be missing."""
        return self.answered >= self.quorum

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "pattern": self.pattern,
            "quorum": self.quorum,
            "nodes": [
                {"node": name, "ok": name not in self.failed, "error": self.failed.get(name)}
                for name in self.node_names
            ],
            "complete": self.complete,
            "locks": [view.as_dict() for view in self.locks],
            "semaphores": [view.as_dict() for view in self.semaphores],
        }


@dataclasses.dataclass
class ReleaseOutcome:
    """What a forced release did on each node."""

    name: str
    quorum: int
    #: Per node: ``{"node", "deleted", "error"}``.
    nodes: list[dict[str, Any]]

    @property
    def deleted(self) -> int:
        """Nodes on which the key was there and is gone."""
        return sum(1 for entry in self.nodes if entry["deleted"])

    @property
    def answered(self) -> int:
        """Nodes that answered."""
        return sum(1 for entry in self.nodes if entry["error"] is None)

    @property
    def released(self) -> bool:
        """A majority answered: no one can be holding the lock any more."""
        return self.answered >= self.quorum

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "name": self.name,
            "held_on": self.deleted,
            "released": self.released,
            "nodes": self.nodes,
        }


def list_locks(redlock: Redlock, pattern: str = "*") -> LockListing:
    """The locks whose name matches ``pattern`` (a Redis glob) on any node."""
    names, failed = _scan(redlock, pattern)
    semaphores, also_failed = list_semaphores(redlock, pattern)
    failed.update(also_failed)
    tokens = _fencing_tokens(redlock, names)
    previews = _previews(redlock, names)
    views = [
        view
        for name in names
        if (view := describe(redlock, name, tokens.get(name), previews.get(name))) is not None
    ]
    return LockListing(
        pattern=pattern,
        quorum=redlock.quorum,
        node_names=[node.name for node in lock_nodes(redlock)],
        failed=failed,
        locks=views,
        semaphores=semaphores,
    )


def _owner(value: str | None) -> tuple[str | None, str | None]:
    """``(task_id, worker)`` from a lock value; a free-text owner shows as the task id."""
    parsed = LockValue.parse(value)
    if parsed is None:
        return None, None
    return parsed.task_id, parsed.where


def _scan(redlock: Redlock, pattern: str) -> tuple[list[str], dict[str, str]]:
    """Lock names matching ``pattern`` on any node, and the nodes that failed."""
    prefix = redlock.key_prefix
    match = lock_pattern(prefix, pattern)
    names: set[str] = set()
    failed: dict[str, str] = {}
    for node in lock_nodes(redlock):
        try:
            for raw in node.client.scan_iter(match=match, count=1000):
                key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                name = lock_name(prefix, key)
                if name is not None:
                    names.add(name)
        except (RedisError, OSError) as exc:
            failed[node.name] = str(exc)
    return sorted(names), failed


def _fencing_tokens(redlock: Redlock, names: Sequence[str]) -> dict[str, int]:
    """The largest fencing value of each name's bucket over the nodes that answer."""
    return redlock.fencing_values(names)


def _previews(redlock: Redlock, names: Sequence[str]) -> dict[str, list[ArgsPreview]]:
    """The stored call texts of each name, from every node that has one."""
    found: dict[str, list[ArgsPreview]] = {}
    if not names:
        return found
    for node in lock_nodes(redlock):
        try:
            pipe = node.client.pipeline(transaction=False)
            for name in names:
                pipe.get(redlock.keys(name).args)
            values = pipe.execute()
        except (RedisError, OSError):
            continue
        for name, value in zip(names, values, strict=True):
            preview = ArgsPreview.parse(value)
            if preview is not None:
                found.setdefault(name, []).append(preview)
    return found


def describe(
    redlock: Redlock,
    name: str,
    fencing_token: int | None = None,
    previews: Sequence[ArgsPreview] | None = None,
) -> LockView | None:
    """A :class:`LockView` of ``name``, or ``None`` when no node that answered holds it."""
    found = redlock.inspect(name)
    # Each entry is (value, ttl) from a node that answered, or its failure.
    values = Counter(
        entry[0] for entry in found if isinstance(entry, tuple) and entry[0] is not None
    )
    if not values:
        return None
    value = values.most_common(1)[0][0]
    nodes: list[dict[str, Any]] = []
    ttls: list[float] = []
    unreachable = 0
    for node, entry in zip(lock_nodes(redlock), found, strict=True):
        if not isinstance(entry, tuple):
            unreachable += 1
            nodes.append({"node": node.name, "state": "unreachable", "error": str(entry)})
            continue
        there, ttl = entry
        state = "holds" if there == value else "absent" if there is None else "other"
        if state == "holds":
            ttls.append(ttl)
        nodes.append({"node": node.name, "state": state, "ttl": round(ttl, 3), "value": there})
    ttls.sort(reverse=True)
    agree = len(ttls)
    held: bool | None = agree >= redlock.quorum
    if not held and agree + unreachable >= redlock.quorum:
        held = None
    task_id, worker = _owner(value)
    if previews is None:
        previews = _previews(redlock, [name]).get(name, [])
    args = next((p.text for p in previews if task_id is not None and p.task_id == task_id), None)
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
        total=len(nodes),
        nodes=nodes,
        args=args,
    )


def force_release(redlock: Redlock, name: str) -> ReleaseOutcome:
    """Delete lock ``name`` on every node, whoever holds it, and wake its waiters.

    The holder is not told; the fencing counter stays, so the next token is still larger.
    """
    keys = redlock.keys(name)
    key, channel = keys.lock, keys.released
    outcome: list[dict[str, Any]] = []
    for node in lock_nodes(redlock):
        try:
            pipe = node.client.pipeline(transaction=True)
            pipe.delete(key)
            # What release.lua publishes: blocked waiters retry at once.
            pipe.publish(channel, "1")
            pipe.delete(keys.args)
            deleted, _, _ = pipe.execute()
        except (RedisError, OSError) as exc:
            outcome.append({"node": node.name, "deleted": False, "error": str(exc)})
            continue
        outcome.append({"node": node.name, "deleted": bool(deleted), "error": None})
    return ReleaseOutcome(name=name, quorum=redlock.quorum, nodes=outcome)


@dataclasses.dataclass
class OwnerRelease:
    """What releasing one task's lock by its task id did."""

    name: str
    task_id: str
    #: Nodes on which the task's value was there and is gone.
    freed: int
    total: int

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return dataclasses.asdict(self)


def release_owned(redlock: Redlock, task_id: str, views: Sequence[LockView]) -> list[OwnerRelease]:
    """Free every lock of ``views`` held by ``task_id``, on every node, if it still is.

    The delete compares the exact owner, so a lock that changed hands since (even to a
    re-delivered copy) is left alone.
    """
    released = []
    for view in views:
        if view.task_id != task_id or view.worker is None:
            continue
        freed = redlock.release_owner(view.name, task_id, view.worker)
        _forget_preview(redlock, view.name, task_id)
        released.append(OwnerRelease(view.name, task_id, freed, len(view.nodes)))
    return released


def _forget_preview(redlock: Redlock, name: str, task_id: str) -> None:
    key = redlock.keys(name).args
    for node in lock_nodes(redlock):
        try:
            preview = ArgsPreview.parse(node.client.get(key))
            if preview is not None and preview.task_id == task_id:
                node.client.delete(key)
        except (RedisError, OSError):
            continue  # it expires with its ttl
