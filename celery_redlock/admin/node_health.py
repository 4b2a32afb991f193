"""Node health as data: a quick :func:`ping` of every node, or a full :func:`probe` of one."""

from __future__ import annotations

import dataclasses
import time

from redis.exceptions import RedisError

from .. import _clock
from ..lock.redlock import Redlock
from ..transport.failure_text import detail
from ..transport.nodes import Command, NodeFailure, fan_out
from .node_access import NodeClient

__all__ = ["NodeHealth", "persistence", "ping", "probe"]


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


def ping(redlock: Redlock) -> list[NodeHealth]:
    """PING every node at once, within the node timeout (``node``, ``ok``, ``error`` only)."""
    nodes = redlock.nodes
    results = fan_out(nodes, [[Command(("PING",))]] * len(nodes), redlock.node_timeout)
    found = []
    for node, result in zip(nodes, results, strict=True):
        if isinstance(result, NodeFailure):
            found.append(NodeHealth(node=node.name, ok=False, error=detail(result)))
        elif isinstance(result[0], Exception):
            found.append(NodeHealth(node=node.name, ok=False, error=str(result[0])))
        else:
            found.append(NodeHealth(node=node.name, ok=True))
    return found


def probe(node: NodeClient) -> NodeHealth:
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


def persistence(health: NodeHealth) -> str:
    """``aof``, ``rdb``, ``aof+rdb``, ``off``; ``aof off`` when the RDB rules are unknown."""
    if health.save is None and not health.appendonly:
        return "aof off"
    kinds = [kind for kind, on in (("aof", health.appendonly), ("rdb", health.save)) if on]
    return "+".join(kinds) or "off"
