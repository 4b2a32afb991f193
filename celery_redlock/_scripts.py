"""Lua scripts shipped as package data (``scripts/*.lua``), loaded once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class LuaScript:
    """One Lua script: its source and the SHA1 that EVALSHA names it by."""

    name: str
    source: bytes
    sha: str


@cache
def load(name: str) -> LuaScript:
    """Return the script ``scripts/<name>.lua``, read and hashed on first use."""
    source = resources.files(__package__).joinpath("scripts", f"{name}.lua").read_bytes()
    return LuaScript(name=name, source=source, sha=hashlib.sha1(source).hexdigest())
