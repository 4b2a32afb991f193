"""Telling a misspelt name from another name: resemblance and the closest valid name.

Names compare in a normal form (lower case, no ``_`` or ``-``). A name *resembles* a valid one
at most one edit away (two for names of :data:`LONG_NAME` or more), or with its words reordered::

    >>> resembles("lock_tll", "lock_ttl"), resembles("my_flag", "lock_ttl")
    (True, False)
    >>> closest("singelton", ["singleton", "singleton_key"])
    'singleton'
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "distance", "normal", "resembles"]

#: Valid names at least this long (in normal form) tolerate two edits, shorter ones one.
LONG_NAME = 10


def normal(name: str) -> str:
    """``name`` in lower case without ``_`` and ``-``."""
    return name.lower().replace("_", "").replace("-", "")


def distance(a: str, b: str, within: int | None = None) -> int | None:
    """Edits from ``a`` to ``b`` (optimal string alignment distance), or ``None`` past ``within``.

    With ``within`` only the diagonal band is computed, giving up early: cheap enough to check
    every task attribute at definition.
    """
    if within is None:
        within = max(len(a), len(b))
    if abs(len(a) - len(b)) > within:
        return None
    far, width = within + 1, len(b)
    previous2: list[int] = []
    previous = [j if j <= within else far for j in range(width + 1)]
    for i, left in enumerate(a, 1):
        current = [i if i <= within else far] + [far] * width
        for j in range(max(1, i - within), min(width, i + within) + 1):
            right = b[j - 1]
            best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right))
            if i > 1 and j > 1 and left == b[j - 2] and a[i - 2] == right:
                best = min(best, previous2[j - 2] + 1)
            current[j] = min(best, far)
        if min(current) > within:
            return None
        previous2, previous = previous, current
    return previous[width] if previous[width] <= within else None


def _edits(given: str, wanted: str) -> int | None:
    """:func:`distance` when within the allowance for ``wanted`` (see the module doc)."""
    return distance(given, wanted, 2 if len(wanted) >= LONG_NAME else 1)


def _same_words(name: str, valid: str) -> bool:
    words = sorted(word for word in name.lower().split("_") if word)
    return len(words) > 1 and words == sorted(valid.lower().split("_"))


def resembles(name: str, valid: str) -> bool:
    """Whether ``name`` reads as a misspelling of ``valid`` (see the module doc)."""
    return _edits(normal(name), normal(valid)) is not None or _same_words(name, valid)


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name most likely meant (fewest edits, else difflib's best), or ``None``."""
    choices = list(valid)
    given = normal(name)
    best: tuple[int, str] | None = None
    for choice in choices:
        edits = _edits(given, normal(choice))
        if edits is None and _same_words(name, choice):
            edits = LONG_NAME
        if edits is not None and (best is None or edits < best[0]):
            best = (edits, choice)
    if best is not None:
        return best[1]
    by_normal = {normal(choice): choice for choice in choices}
    found = difflib.get_close_matches(given, list(by_normal), n=1, cutoff=0.75)
    return by_normal[found[0]] if found else None
