"""Telling a misspelt name from another name: resemblance and the closest valid name.

Option and setting names are compared in a normal form (lower case, without
``_`` and ``-``), so ``lockTTL``, ``LOCK_TTL`` and ``lock__ttl`` all read as
``lockttl``. A name *resembles* a valid one when the normal forms are at
most one edit apart (two for valid names of ten characters or more), an
edit being one letter added, dropped, replaced, or two neighbours swapped;
or when it has the same words in another order (``ttl_lock``)::

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
    """Edits from ``a`` to ``b``: letters added, dropped or replaced, neighbours swapped.

    The optimal string alignment distance (Damerau-Levenshtein without
    editing a substring twice). With ``within``, ``None`` when there are more
    edits than that: it is then computed only near the diagonal and given up
    as soon as a row exceeds it, so that a near miss of a short name costs a
    few dozen steps and every task attribute can be checked at definition.
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
    """The valid name ``name`` most likely meant, or ``None`` when none is close.

    A name it resembles, the fewest edits away; else the best of
    :func:`difflib.get_close_matches` over the normal forms.
    """
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
