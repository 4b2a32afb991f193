"""Where a node is and how to log in: parsed from a URL or a redis-py client.

An :class:`Endpoint` holds everything the links of :mod:`.connection` need to open
a connection themselves (address, TLS settings, credentials, database) and
what :func:`~.nodes.make_nodes` needs to tell two spellings of one server
apart. A ``sentinel://`` URL names a master through its Sentinels instead: it
is read by :class:`~.sentinel.SentinelMaster`, with the query-option rules
and the redaction of passwords kept here.

URL query options are checked here, one rule per option:

* honoured: ``db``, ``client_name`` and the ``ssl_*`` settings of ``rediss://``;
* the lock's own setting wins, and a warning names the option: socket and
  connect timeouts (``node_timeout`` governs), ``protocol`` (the lock speaks
  RESP2 on its own connections), ``max_connections`` (the lock multiplexes
  its few connections), retries, keep-alive, health checks, decoding;
* anything else is refused with a :class:`ConfigurationError` naming it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import ConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.retry import Retry

from ..errors import ConfigurationError

__all__ = [
    "SCHEMES",
    "Endpoint",
    "TLSSettings",
    "bad",
    "check_options",
    "integer",
    "prepare_tls",
    "query_options",
    "redact",
]

logger = logging.getLogger("celery_redlock.nodes")

#: The schemes of a URL that names a Redis server itself.
SCHEMES = ("redis", "rediss", "unix")
#: Query options whose values are secrets, hidden by :func:`redact`.
_SECRET_OPTIONS = frozenset({"sentinel_password", "ssl_password"})

#: Query options honoured on any URL.
_HONOURED = frozenset({"db", "client_name"})
#: Query options honoured on ``rediss://`` URLs, named as redis-py names them.
_TLS_OPTIONS = frozenset(
    {
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
    }
)
#: Query options the lock's own settings override, and what governs instead.
_OVERRIDDEN = {
    "socket_timeout": "node_timeout",
    "socket_connect_timeout": "node_timeout",
    "timeout": "node_timeout",
    "retry_on_timeout": "node_timeout (the lock never retries a node within an attempt)",
    "retry_on_error": "node_timeout (the lock never retries a node within an attempt)",
    "max_connections": "the lock's own connections (a few per node, shared by every caller)",
    "protocol": "the lock's own connections (RESP2)",
    "health_check_interval": "the lock's own check of idle connections",
    "socket_keepalive": "the lock's own connections",
    "socket_read_size": "the lock's own connections",
    "decode_responses": "the lock's own connections (bytes)",
    "legacy_responses": "the lock's own connections",
    "single_connection_client": "the lock's own connections",
}
#: TLSSettings fields taken as given, each from the ``ssl_``-prefixed option of its name.
_TLS_AS_GIVEN = ("ca_certs", "ca_path", "ca_data", "certfile", "keyfile", "password", "ciphers")
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


@dataclass(frozen=True)
class TLSSettings:
    """What a TLS connection checks and presents (redis-py's ``ssl_*`` settings)."""

    cert_reqs: int = ssl.CERT_REQUIRED
    check_hostname: bool = True
    ca_certs: str | None = None
    ca_path: str | None = None
    ca_data: str | bytes | None = None
    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = None
    min_version: int | None = None
    ciphers: str | None = None

    def context(self) -> ssl.SSLContext:
        """A client context built the way redis-py builds its own."""
        context = ssl.create_default_context()
        context.check_hostname = self.check_hostname and self.cert_reqs != ssl.CERT_NONE
        context.verify_mode = ssl.VerifyMode(self.cert_reqs)
        if self.certfile or self.keyfile:
            context.load_cert_chain(self.certfile or "", self.keyfile, self.password)
        if self.ca_certs or self.ca_path or self.ca_data:
            context.load_verify_locations(self.ca_certs, self.ca_path, self.ca_data)
        if self.min_version is not None:
            context.minimum_version = ssl.TLSVersion(self.min_version)
        if self.ciphers:
            context.set_ciphers(self.ciphers)
        return context

    def redis_kwargs(self) -> dict[str, Any]:
        """The same settings as redis-py's ``SSLConnection`` arguments."""
        return {
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_check_hostname": self.check_hostname and self.cert_reqs != ssl.CERT_NONE,
            "ssl_ca_certs": self.ca_certs,
            "ssl_ca_path": self.ca_path,
            "ssl_ca_data": self.ca_data,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_password": self.password,
            "ssl_min_version": self.min_version,
            "ssl_ciphers": self.ciphers,
        }


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
            if option in _TLS_OPTIONS and parts.scheme != "rediss":
                return f"{option} applies to rediss:// URLs only"
            return None

        check_options(
            query,
            shown,
            _TLS_OPTIONS,
            refused,
            "the lock honours db, client_name and, on rediss://, the ssl_* options",
        )
        if "db" in query:
            db = integer(query["db"], "db", shown)
        tls = _tls_from_strings(query, shown) if parts.scheme == "rediss" else None
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
        tls = None
        if kind == "tls":
            reqs = kwargs.get("ssl_cert_reqs", "required")
            tls = TLSSettings(
                cert_reqs=_cert_reqs(reqs, name),
                check_hostname=bool(kwargs.get("ssl_check_hostname", True)),
                min_version=kwargs.get("ssl_min_version"),
                **_tls_as_given(kwargs),
            )
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
            tls=tls,
        )


def prepare_tls(endpoints: Iterable[Endpoint]) -> None:
    """Build the TLS contexts of ``endpoints`` now, one per distinct TLS settings.

    Building one loads the CA bundle (tens of milliseconds): done when the
    nodes are made, not while a call waits for its first connections, where
    it would eat the node timeout of every TLS node in turn.

    Raises:
        ConfigurationError: the settings cannot be used (a certificate or CA
            file that does not load, an unknown cipher list...).
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


def redact(url: str) -> str:
    """``url`` without its passwords, for messages and logs (each part of a ``;`` list)."""
    if ";" in url:
        return ";".join(redact(part) for part in url.split(";"))
    parts = urlsplit(url)
    changed = False
    if any(secret in parts.query for secret in _SECRET_OPTIONS):
        changed = True
        hidden = "&".join(
            f"{name}=***" if name in _SECRET_OPTIONS else pair
            for pair in parts.query.split("&")
            for name in [pair.split("=", 1)[0]]
        )
        parts = parts._replace(query=hidden)
    try:
        password = parts.password
    except ValueError:
        password = None
    if password is None or "@" not in parts.netloc:
        return parts.geturl() if changed else url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + netloc).geturl()


def bad(problem: str, option: str = "nodes") -> ConfigurationError:
    """The error for a node given wrongly: ``nodes: problem``, naming ``option``."""
    return ConfigurationError(f"nodes: {problem}", option=option)


def query_options(query: str, shown: str) -> dict[str, str]:
    """A URL's query string as options, each given once (``shown``: the URL for messages)."""
    found: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise bad(f"{shown!r} has a malformed query string: {exc}") from exc
    for name, value in pairs:
        if name in found:
            raise bad(f"{shown!r} gives {name!r} twice", option=name)
        found[name] = value
    return found


def check_options(
    query: Mapping[str, str],
    shown: str,
    accepted: frozenset[str],
    refused: Callable[[str], str | None],
    takes: str,
) -> None:
    """Warn of each option the lock's settings override; refuse any it does not take.

    ``accepted``: options taken besides ``db`` and ``client_name``;
    ``refused(option)``: the problem with an option this URL cannot take, or
    ``None``; ``takes``: what the URL takes, for the message about an unknown option.
    """
    for option in query:
        if option in _OVERRIDDEN:
            logger.warning(
                "nodes: %s: ?%s=... is ignored; %s governs the lock's connections",
                shown,
                option,
                _OVERRIDDEN[option],
            )
            continue
        problem = refused(option)
        if problem is None and option not in _HONOURED and option not in accepted:
            problem = f"unknown URL option {option!r}; {takes}"
        if problem is not None:
            raise bad(f"{shown!r}: {problem}", option=option)


def integer(value: str, option: str, shown: str) -> int:
    """A query option's whole number (``shown``: the URL, for messages)."""
    if not value.isdigit():
        raise bad(f"{shown!r}: {option}={value!r} is not a whole number", option=option)
    return int(value)


def _boolean(value: str, option: str, shown: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise bad(f"{shown!r}: {option}={value!r} is not true or false", option=option)


def _cert_reqs(value: Any, shown: str) -> int:
    if value is None:
        return ssl.CERT_NONE
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lower() in _CERT_REQS:
        return _CERT_REQS[value.lower()]
    raise bad(
        f"{shown}: ssl_cert_reqs={value!r}; expected none, optional or required",
        option="ssl_cert_reqs",
    )


def _tls_from_strings(query: Mapping[str, str], shown: str) -> TLSSettings:
    min_version = None
    if "ssl_min_version" in query:
        raw = query["ssl_min_version"]
        if raw.isdigit():
            min_version = int(raw)
        elif raw in ssl.TLSVersion.__members__:
            min_version = int(ssl.TLSVersion[raw])
        else:
            raise bad(
                f"{shown!r}: ssl_min_version={raw!r}; expected a TLS version such as TLSv1_2",
                option="ssl_min_version",
            )
    return TLSSettings(
        cert_reqs=_cert_reqs(query.get("ssl_cert_reqs", "required"), repr(shown)),
        check_hostname=_boolean(
            query.get("ssl_check_hostname", "true"), "ssl_check_hostname", shown
        ),
        min_version=min_version,
        **_tls_as_given(query),
    )


def _tls_as_given(source: Mapping[str, Any]) -> dict[str, Any]:
    """The TLS settings taken as they are given, from redis-py's ``ssl_*`` names."""
    return {name: source.get(f"ssl_{name}") for name in _TLS_AS_GIVEN}
