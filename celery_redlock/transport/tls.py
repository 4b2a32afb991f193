"""TLS for a node's connections: what is checked and presented, and how it is read.

The settings are redis-py's ``ssl_*`` ones, read from a ``rediss://`` URL's
query options or from a redis-py client's connection arguments.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .url_options import bad, boolean

__all__ = ["TLS_OPTIONS", "TLSSettings", "tls_from_kwargs", "tls_from_query"]

#: Query options honoured on ``rediss://`` URLs, named as redis-py names them.
TLS_OPTIONS = frozenset(
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
#: TLSSettings fields taken as given, each from the ``ssl_``-prefixed option of its name.
_TLS_AS_GIVEN = ("ca_certs", "ca_path", "ca_data", "certfile", "keyfile", "password", "ciphers")
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


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


def tls_from_query(query: Mapping[str, str], shown: str) -> TLSSettings:
    """The TLS settings of a ``rediss://`` URL's query options (``shown``: the URL)."""
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
        check_hostname=boolean(
            query.get("ssl_check_hostname", "true"), "ssl_check_hostname", shown
        ),
        min_version=min_version,
        **_tls_as_given(query),
    )


def _tls_as_given(source: Mapping[str, Any]) -> dict[str, Any]:
    """The TLS settings taken as they are given, from redis-py's ``ssl_*`` names."""
    return {name: source.get(f"ssl_{name}") for name in _TLS_AS_GIVEN}


def tls_from_kwargs(kwargs: Mapping[str, Any], name: str) -> TLSSettings:
    """The TLS settings of a redis-py client's connection arguments."""
    return TLSSettings(
        cert_reqs=_cert_reqs(kwargs.get("ssl_cert_reqs", "required"), name),
        check_hostname=bool(kwargs.get("ssl_check_hostname", True)),
        min_version=kwargs.get("ssl_min_version"),
        **_tls_as_given(kwargs),
    )
