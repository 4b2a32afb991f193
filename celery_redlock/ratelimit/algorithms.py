"""The limiter's algorithms: their names and what each can represent.

Each is a branch of ``scripts/ratelimit_hit.lua``, so limits of different algorithms are
decided in one atomic call.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from ..errors import ConfigurationError
from .rates import Rate, micros

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "MIN_GCRA_INTERVAL",
    "Algorithm",
    "check_algorithm",
    "check_rate_for",
    "rate_problem_for",
]

#: The algorithms a limit can use, the default first.
Algorithm = Literal["sliding", "gcra", "fixed"]

#: Every algorithm, in that order.
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)

#: Used when neither the call nor the limiter names one.
DEFAULT_ALGORITHM: Algorithm = ALGORITHMS[0]

#: Shortest gcra spacing, seconds: an admission may come 1 µs late (the server counts µs),
#: which at 100 µs per unit costs at most 1 % of the rate.
MIN_GCRA_INTERVAL = 0.0001

#: Shortest interval of the pace that gives a fractional fixed or sliding limit its average, s.
MIN_PACE_INTERVAL = 0.000001


def check_algorithm(algorithm: Any, option: str = "algorithm") -> Algorithm:
    """``algorithm`` if it names one, else ConfigurationError naming ``option``."""
    if algorithm not in ALGORITHMS:
        raise ConfigurationError(
            option, f"expected one of {', '.join(map(repr, ALGORITHMS))}, got {algorithm!r}"
        )
    return algorithm  # type: ignore[no-any-return]


def check_rate_for(rate: Rate, algorithm: Algorithm, option: str) -> None:
    """Refuse, naming ``option``, a rate ``algorithm`` cannot keep the meaning of."""
    problem = rate_problem_for(rate, algorithm)
    if problem is not None:
        raise ConfigurationError(option, problem[1])


def rate_problem_for(rate: Rate, algorithm: Algorithm) -> tuple[str, str] | None:
    """Why ``algorithm`` cannot keep ``rate``: ``("limit" or "period", problem)``, or ``None``."""
    if algorithm == "gcra" and rate.interval < MIN_GCRA_INTERVAL:
        return "limit", (
            f"{rate} spaces units {rate.interval * 1e6:.3g} µs apart; gcra needs at least "
            "100 µs per unit (at most 10,000 per second). Use 'sliding', or count larger units"
        )
    if algorithm != "gcra" and not rate.whole and rate.interval < MIN_PACE_INTERVAL:
        return "limit", f"{rate} is a fractional rate of more than 1,000,000 units per second"
    if algorithm == "fixed" and micros(rate.period) % 1000:
        return "period", (
            "a fixed window must be a whole number of milliseconds (Redis expires keys in "
            f"milliseconds), got {rate.period!r} s; use 'sliding' or 'gcra', which count "
            "microseconds"
        )
    return None
