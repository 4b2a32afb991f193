"""Semaphores as data: who holds which slot, for which task, on how many nodes."""

from __future__ import annotations

import dataclasses
from typing import Any

from redis.exceptions import RedisError

from .._layout import LockValue, semaphore_keys, semaphore_name, semaphore_pattern
from ..lock.redlock import Redlock
from .node_access import lock_nodes

__all__ = ["SemaphoreView", "SlotHolder", "list_semaphores"]


@dataclasses.dataclass
class SlotHolder:
    """One holder of one slot, as the nodes see it."""

    slot: int
    value: str
    task_id: str | None
    worker: str | None
    #: Seconds until fewer than a majority hold it (no majority: its longest ttl on a node).
    ttl: float
    #: Nodes holding this value in this slot.
    agree: int
    total: int
    #: Held by a majority: it counts against the limit.
    held: bool

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        data = dataclasses.asdict(self)
        data["ttl"] = round(self.ttl, 3)
        return data


@dataclasses.dataclass
class SemaphoreView:
    """The holders of one semaphore, by slot number."""

    name: str
    holders: list[SlotHolder]

    @property
    def held(self) -> int:
        """Slots held by a majority of the nodes."""
        return sum(holder.held for holder in self.holders)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "name": self.name,
            "held": self.held,
            "holders": [holder.as_dict() for holder in self.holders],
        }


def list_semaphores(
    redlock: Redlock, pattern: str = "*"
) -> tuple[list[SemaphoreView], dict[str, str]]:
    """The semaphores whose name matches ``pattern``, and the nodes that failed."""
    prefix = redlock.key_prefix
    names: set[str] = set()
    failed: dict[str, str] = {}
    for node in lock_nodes(redlock):
        try:
            for raw in node.client.scan_iter(match=semaphore_pattern(prefix, pattern), count=1000):
                key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                name = semaphore_name(prefix, key)
                if name is not None:
                    names.add(name)
        except (RedisError, OSError) as exc:
            failed[node.name] = str(exc)
    views = [view for name in sorted(names) if (view := describe_semaphore(redlock, name)).holders]
    return views, failed


def describe_semaphore(redlock: Redlock, name: str) -> SemaphoreView:
    """What every node that answers holds for semaphore ``name`` (expired slots left out)."""
    keys = semaphore_keys(redlock.key_prefix, name)
    seen: dict[tuple[int, str], list[float]] = {}
    nodes = lock_nodes(redlock)
    for node in nodes:
        try:
            pipe = node.client.pipeline(transaction=True)
            pipe.hgetall(keys.holders)
            pipe.zrange(keys.expiry, 0, -1, withscores=True)
            pipe.time()
            values, expiries, (seconds, micros) = pipe.execute()
        except (RedisError, OSError):
            continue
        now_ms = seconds * 1000 + micros / 1000
        until = {_text(slot): score for slot, score in expiries}
        for raw_slot, raw_value in values.items():
            number = _text(raw_slot)
            left = (until.get(number, 0.0) - now_ms) / 1000
            if left > 0 and number.isdigit():
                seen.setdefault((int(number), _text(raw_value)), []).append(left)
    holders = []
    for (slot, value), ttls in sorted(seen.items()):
        ttls.sort(reverse=True)
        parsed = LockValue.parse(value)
        agree = len(ttls)
        held = agree >= redlock.quorum
        holders.append(
            SlotHolder(
                slot=slot,
                value=value,
                task_id=parsed.task_id if parsed else None,
                worker=parsed.where if parsed else None,
                ttl=ttls[redlock.quorum - 1] if held else ttls[0],
                agree=agree,
                total=len(nodes),
                held=held,
            )
        )
    return SemaphoreView(name=name, holders=holders)


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
