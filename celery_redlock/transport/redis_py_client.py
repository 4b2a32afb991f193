"""A node reached through a client's own command methods, one call after another.

For clients whose sockets are not ours to drive (``fakeredis``, a proxy, an instrumented
subclass): slower than the fan-out's links and bound by the client's timeouts, but the replies
and failures look the same to the lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, RedisError, ResponseError

from .commands import Call, Command, NodeFailure, NodeResult

__all__ = ["run_direct"]


def run_direct(client: redis.Redis, name: str, calls: Sequence[Call | Command]) -> NodeResult:
    """Run ``calls`` on ``client``; a ``ResponseError`` in place of its call's reply."""
    replies: list[Any] = []
    try:
        for call in calls:
            try:
                replies.append(_bytes(_one(client, call)))
            except ResponseError as exc:
                replies.append(exc)
    except (RedisError, OSError) as exc:
        return NodeFailure(name, exc)
    return replies


def _one(client: redis.Redis, call: Call | Command) -> Any:
    if isinstance(call, Command):
        return client.execute_command(*call.args)
    keys, args = call.keys, call.args
    try:
        return client.evalsha(call.script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return client.eval(call.script.source.decode(), len(keys), *keys, *args)


def _bytes(reply: Any) -> Any:
    """Replies as the fan-out's links return them, even from a decoding client."""
    if isinstance(reply, str):
        return reply.encode()
    if isinstance(reply, list):
        return [_bytes(item) for item in reply]
    return reply
