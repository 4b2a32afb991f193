"""Where a node is and how to log in, parsed from a URL or a redis-py client.

An :class:`Endpoint` is all a :mod:`.connection` link needs to connect, and what tells two
spellings of one server apart. ``sentinel://`` URLs are :mod:`.sentinel`'s.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import ConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.retry import Retry

from .tls import TLS_OPTIONS, TLSSettings, tls_from_kwargs, tls_from_query
from .url_options import bad, check_options, integer, query_options, redact

__all__ = ["SCHEMES", "Endpoint", "prepare_tls"]

#: The schemes of a URL that names a Redis server itself.
SCHEMES = ("redis", "rediss", "unix")

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


@dataclass(frozen=True)
class Endpoint:
    """One Redis server as the lock reaches it."""

    name: str
    host: str | None = None
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    credential_provider: Any = None
    client_name: str | None = None
    tls: TLSSettings | None = None
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    def credentials(self) -> tuple[str | None, str | None]:
        """``(username, password)`` for AUTH, asking the credential provider if there is one."""
        if self.credential_provider is not None:
            given = tuple(self.credential_provider.get_credentials())
            if len(given) == 1:
                return None, str(given[0])
            return (None if given[0] is None else str(given[0])), str(given[1])
        return self.username, self.password

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for this endpoint, built once (see :func:`prepare_tls`)."""
        assert self.tls is not None
        if not self._context:
            self._context.append(self.tls.context())
        return self._context[0]

    def server(self) -> tuple[str, ...]:
        """What identifies the server (not the database): for spotting duplicates."""
        if self.path is not None:
            return ("unix", os.path.realpath(self.path))
        assert self.host is not None
        host = self.host.lower().strip("[]")
        if host in _LOOPBACK_NAMES:
            host = "loopback"
        else:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                pass
            else:
                host = "loopback" if address.is_loopback else str(address)
        return ("tcp", host, str(self.port))

    def client(self, timeout: float) -> redis.Redis:
        """A redis-py client for the same server, with the lock's timeouts and no retries."""
        kwargs: dict[str, Any] = {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "client_name": self.client_name,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
            "decode_responses": False,
            "health_check_interval": 0,
            "protocol": 2,
        }
        if self.credential_provider is not None:
            kwargs["credential_provider"] = self.credential_provider
        if self.path is not None:
            pool = ConnectionPool(
                connection_class=UnixDomainSocketConnection, path=self.path, **kwargs
            )
        elif self.tls is not None:
            kwargs.update(self.tls.redis_kwargs())
            pool = ConnectionPool(
                connection_class=SSLConnection, host=self.host, port=self.port, **kwargs
            )
        else:
            pool = ConnectionPool(host=self.host, port=self.port, **kwargs)
        return redis.Redis(connection_pool=pool)

    # -- parsing ----------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """Parse a ``redis://``, ``rediss://`` or ``unix://`` URL, checking every part."""
        if not isinstance(url, str):
            raise bad(f"expected a Redis URL or a redis.Redis client, got {url!r}")
        shown = redact(url)
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise bad(
                f"{shown!r} is not a Redis URL; expected redis://host:port/db, "
                "rediss://host:port/db or unix:///path/to/socket"
            )
        try:
            port = parts.port
        except ValueError as exc:
            raise bad(f"{shown!r} is not a valid Redis URL: {exc}") from exc
        query = query_options(parts.query, shown)
        db = 0
        if parts.scheme == "unix":
            if not parts.path:
                raise bad(f"{shown!r} names no socket; expected unix:///path/to/socket")
        else:
            if not parts.hostname:
                raise bad(f"{shown!r} names no host; expected redis://host:port/db")
            database = parts.path.strip("/")
            if database and not database.isdigit():
                raise bad(
                    f"{shown!r} names database {database!r}; expected a number "
                    "(redis://host:port/0)"
                )
            db = int(database) if database else 0

        def refused(option: str) -> str | None:
            if option in TLS_OPTIONS and parts.scheme != "rediss":
                return f"{option} applies to rediss:// URLs only"
            return None

        check_options(
            query,
            shown,
            TLS_OPTIONS,
            refused,
            "the lock honours db, client_name and, on rediss://, the ssl_* options",
        )
        if "db" in query:
            db = integer(query["db"], "db", shown)
        tls = tls_from_query(query, shown) if parts.scheme == "rediss" else None
        return cls(
            name=shown,
            host=None if parts.scheme == "unix" else unquote(parts.hostname or ""),
            port=port or 6379,
            path=unquote(parts.path) if parts.scheme == "unix" else None,
            db=db,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            client_name=query.get("client_name"),
            tls=tls,
        )

    @classmethod
    def from_connection_kwargs(
        cls, kind: str, kwargs: Mapping[str, Any], name: str | None = None
    ) -> Endpoint:
        """Read a redis-py pool's ``connection_kwargs`` (``kind``: tcp, tls or unix)."""
        path = kwargs.get("path") if kind == "unix" else None
        host = None if kind == "unix" else str(kwargs.get("host") or "localhost")
        port = int(kwargs.get("port") or 6379)
        db = int(kwargs.get("db") or 0)
        if name is None:
            name = f"unix://{path}" if kind == "unix" else f"{host}:{port}"
            name = f"{name}/{db}"
        if kwargs.get("ssl_validate_ocsp") or kwargs.get("ssl_validate_ocsp_stapled"):
            raise bad(f"{name}: OCSP validation is not supported on the lock's connections")
        return cls(
            name=name,
            host=host,
            port=port,
            path=path,
            db=db,
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            credential_provider=kwargs.get("credential_provider"),
            client_name=kwargs.get("client_name"),
            tls=tls_from_kwargs(kwargs, name) if kind == "tls" else None,
        )


def prepare_tls(endpoints: Iterable[Endpoint]) -> None:
    """Build the TLS contexts of ``endpoints`` now, one per distinct TLS settings.

    Loading a CA bundle takes tens of milliseconds: done while a call waits for its first
    connections, it would eat every TLS node's timeout in turn.

    Raises:
        ConfigurationError: the settings cannot be used (a file that does not load, a bad cipher).
    """
    built: dict[TLSSettings, ssl.SSLContext] = {}
    for endpoint in endpoints:
        if endpoint.tls is None or endpoint._context:
            continue
        context = built.get(endpoint.tls)
        if context is None:
            try:
                context = built[endpoint.tls] = endpoint.tls.context()
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise bad(f"{endpoint.name}: the TLS settings cannot be used: {exc}") from exc
        endpoint._context.append(context)
