"""Sentinel-managed nodes: the URL that names one, and where its master runs now.

``sentinel://h1:26379;sentinel://h2:26379/0?master_name=NAME`` is kombu's syntax, with the master
named in the URL since each node names its own. :class:`MasterFinder` asks through redis-py's
:class:`redis.sentinel.Sentinel`, bounded by the node timeout, never retried
(docs/operations.md, "Sentinel-managed masters").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel

from .endpoint import Endpoint
from .url_options import bad, check_options, integer, query_options, redact

__all__ = ["SENTINEL_SCHEME", "MasterFinder", "SentinelMaster"]

#: The scheme of a Sentinel-managed node's URL (kombu's).
SENTINEL_SCHEME = "sentinel"
#: Query options of a ``sentinel://`` URL besides ``db`` and ``client_name``.
_SENTINEL_OPTIONS = frozenset({"master_name", "sentinel_username", "sentinel_password"})
_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelMaster:
    """A Redis master that Sentinel manages: one lock node, wherever it runs now.

    The login and ``db`` are the master's; ``sentinel_*`` log in to the Sentinels.
    """

    name: str
    master_name: str
    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None
    client_name: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def master(self, host: str, port: int) -> Endpoint:
        """The endpoint of the master found at ``host:port``."""
        return Endpoint(
            name=f"{self.name} (master at {host}:{port})",
            host=host,
            port=port,
            db=self.db,
            username=self.username,
            password=self.password,
            client_name=self.client_name,
        )

    def same_master(self, other: SentinelMaster) -> bool:
        """Whether ``other`` names the same master through a Sentinel of ours."""
        mine = {_sentinel_address(host, port) for host, port in self.sentinels}
        theirs = {_sentinel_address(host, port) for host, port in other.sentinels}
        return self.master_name == other.master_name and bool(mine & theirs)

    @classmethod
    def from_url(cls, url: str) -> SentinelMaster:
        """Parse ``sentinel://[user:password@]host[:port][/db];sentinel://...?master_name=NAME``.

        One Sentinel per ``;`` part; the query may follow any part, once.
        """
        shown = redact(url)
        sentinels: list[tuple[str, int]] = []
        query: dict[str, str] = {}
        login: tuple[str | None, str | None] | None = None
        database: str | None = None
        for piece in (part.strip() for part in url.split(";")):
            if not piece:
                continue
            parts = urlsplit(piece)
            if parts.scheme != SENTINEL_SCHEME:
                raise bad(
                    f"{shown!r}: every part of a Sentinel URL is sentinel://host:port "
                    "(kombu's syntax: sentinel://h1:26379;sentinel://h2:26379/0?master_name=NAME)"
                )
            try:
                port = parts.port or _SENTINEL_PORT
            except ValueError as exc:
                raise bad(f"{shown!r} is not a valid Sentinel URL: {exc}") from exc
            if not parts.hostname:
                raise bad(f"{shown!r} names a Sentinel without a host")
            for name, value in query_options(parts.query, shown).items():
                if name in query:
                    raise bad(f"{shown!r} gives {name!r} twice", option=name)
                query[name] = value
            user = unquote(parts.username) if parts.username else None
            password = unquote(parts.password) if parts.password is not None else None
            if user is not None or password is not None:
                if login is not None and login != (user, password):
                    raise bad(f"{shown!r} gives the master two different logins")
                login = (user, password)
            path = parts.path.strip("/")
            if path:
                if database is not None and database != path:
                    raise bad(f"{shown!r} names two databases ({database} and {path})")
                database = path
            sentinels.append((unquote(parts.hostname), port))
        if not sentinels:
            raise bad(f"{shown!r} names no Sentinel")
        check_options(
            query,
            shown,
            _SENTINEL_OPTIONS,
            _refused,
            "a Sentinel URL takes master_name, db, client_name, sentinel_username "
            "and sentinel_password",
        )
        master_name = query.get("master_name")
        if not master_name:
            raise bad(
                f"{shown!r} names no master; add ?master_name=NAME, the name in the "
                "Sentinels' `sentinel monitor NAME host port quorum` line",
                option="master_name",
            )
        if database is not None and not database.isdigit():
            raise bad(f"{shown!r} names database {database!r}; expected a number")
        db = int(database) if database else 0
        if "db" in query:
            db = integer(query["db"], "db", shown)
        username, password = login if login is not None else (None, None)
        return cls(
            name=shown,
            master_name=master_name,
            sentinels=tuple(sentinels),
            db=db,
            username=username,
            password=password,
            client_name=query.get("client_name"),
            sentinel_username=query.get("sentinel_username"),
            sentinel_password=query.get("sentinel_password"),
        )


def _sentinel_address(host: str, port: int) -> tuple[str, ...]:
    return Endpoint(name="", host=host, port=port).server()


def _refused(option: str) -> str | None:
    if option.startswith("ssl_"):
        return f"{option}: TLS to Sentinel-managed masters is not supported"
    return None


class MasterFinder:
    """Asks the Sentinels of ``master`` where it runs; one per node, shared by its callers."""

    def __init__(self, master: SentinelMaster, timeout: float) -> None:
        self.master = master
        self.timeout = timeout
        bounded: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
            "health_check_interval": 0,
        }
        self._sentinel = Sentinel(
            list(master.sentinels),
            sentinel_kwargs={
                **bounded,
                "username": master.sentinel_username,
                "password": master.sentinel_password,
            },
            **bounded,
            db=master.db,
            username=master.username,
            password=master.password,
            client_name=master.client_name,
            decode_responses=False,
            protocol=2,
        )

    def find(self) -> tuple[str, int]:
        """``(host, port)`` of the master now.

        Raises:
            redis.ConnectionError: no Sentinel named a master that is up.
        """
        try:
            host, port = self._sentinel.discover_master(self.master.master_name)
        except RedisError as exc:
            raise RedisConnectionError(
                f"{self.master.name}: no Sentinel named a master for "
                f"{self.master.master_name!r}: {exc}"
            ) from exc
        return (host.decode() if isinstance(host, bytes) else str(host)), int(port)

    def client(self) -> redis.Redis:
        """A redis-py client that follows the master (re-asks the Sentinels on reconnect)."""
        client: redis.Redis = self._sentinel.master_for(self.master.master_name)
        return client

    def close(self) -> None:
        """Close the connections to the Sentinels."""
        for sentinel in self._sentinel.sentinels:
            sentinel.close()
            sentinel.connection_pool.disconnect()
