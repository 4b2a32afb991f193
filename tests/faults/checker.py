"""Checks a fault run's history of critical sections.

What must hold, whatever the nemesis did:

* **mutual exclusion** -- two sections whose locks were both still valid at
  exit never overlap in time; more strictly, the part of any section during
  which its lock was valid never overlaps another's;
* **fencing** -- tokens increase in the order the lock was acquired (none
  repeated, none smaller than an earlier one), so the store rejects every
  write from a holder that someone newer has overtaken (a *stale* write), and
  never rejects a fresh one.

"Overtaken" is decided from the history alone, not from the tokens: a write
is stale when a section that acquired the lock later already wrote to the
store before it. The tokens are what is under test.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

from .history import Section

#: How many offending pairs a report quotes.
EXAMPLES = 5


@dataclass
class Report:
    """The figures of one fault run."""

    name: str
    nodes: int
    clients: int
    ttl: float
    seconds: float
    sections: int
    faults: dict[str, int]
    node_faults: int
    expired_sections: int
    overlaps_valid: int
    overlaps_within_validity: int
    overlaps_with_expired: int
    token_order_violations: int
    repeated_tokens: int
    long_holds: int
    stale_writes_accepted: int
    stale_writes_rejected: int
    fresh_writes_rejected: int
    quorum_unavailable: int
    client_errors: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def summary(self) -> str:
        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults.items()))
        return (
            f"{self.name}: {self.sections} critical sections in {self.seconds:.1f} s "
            f"({self.clients} clients, {self.nodes} nodes, ttl {self.ttl} s); "
            f"faults: {faults or 'none'}; "
            f"overlaps among valid holders {self.overlaps_valid} "
            f"(within validity {self.overlaps_within_validity}, "
            f"with an expired holder {self.overlaps_with_expired}); "
            f"token order violations {self.token_order_violations} "
            f"(repeated tokens {self.repeated_tokens}); "
            f"long renewed holds {self.long_holds}; "
            f"stale writes accepted {self.stale_writes_accepted}, "
            f"rejected {self.stale_writes_rejected}; "
            f"fresh writes rejected {self.fresh_writes_rejected}; "
            f"sections past validity {self.expired_sections}; "
            f"attempts without quorum {self.quorum_unavailable}; "
            f"client errors {len(self.client_errors)}"
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        """Add this report to the JSON file at ``path``, keyed by its name."""
        target = Path(path)
        reports = json.loads(target.read_text()) if target.exists() else {}
        reports[self.name] = self.as_dict()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(reports, indent=2, sort_keys=True) + "\n")


def overlapping_pairs(
    intervals: Sequence[tuple[float, float, Section]],
) -> list[tuple[Section, Section]]:
    """Pairs of intervals ``(start, end, section)`` that share an instant."""
    ordered = sorted(intervals, key=lambda interval: interval[0])
    pairs = []
    for i, (_, end, section) in enumerate(ordered):
        for start, _, other in ordered[i + 1 :]:
            if start >= end:
                break
            pairs.append((section, other))
    return pairs


def _describe(kind: str, first: Section, second: Section) -> str:
    return (
        f"{kind}: {first.owner} token {first.token} [{first.enter:.6f}, {first.exit:.6f}] "
        f"validity at exit {first.validity_at_exit:.4f} / {second.owner} token {second.token} "
        f"[{second.enter:.6f}, {second.exit:.6f}] validity at exit {second.validity_at_exit:.4f}"
    )


def check(
    name: str,
    sections: Iterable[Section],
    *,
    faults: Counter[str],
    node_fault_kinds: Iterable[str],
    nodes: int,
    clients: int,
    ttl: float,
    seconds: float,
    quorum_unavailable: int = 0,
    client_errors: Sequence[str] = (),
) -> Report:
    """Check ``sections`` and sum them up in a :class:`Report`."""
    history = list(sections)
    examples: list[str] = []

    valid = [(s.enter, s.exit, s) for s in history if s.valid_at_exit]
    overlaps_valid = overlapping_pairs(valid)
    examples += [_describe("overlap", a, b) for a, b in overlaps_valid[:EXAMPLES]]

    windows = [(s.enter, min(s.exit, s.valid_until), s) for s in history if s.valid_until > s.enter]
    within_validity = overlapping_pairs(windows)
    examples += [_describe("overlap within validity", a, b) for a, b in within_validity[:EXAMPLES]]

    everything = overlapping_pairs([(s.enter, s.exit, s) for s in history])
    with_expired = [(a, b) for a, b in everything if not (a.valid_at_exit and b.valid_at_exit)]

    by_acquisition = sorted(history, key=lambda s: s.acquired_by)
    out_of_order = [(a, b) for a, b in pairwise(by_acquisition) if b.token <= a.token]
    examples += [_describe("token order", a, b) for a, b in out_of_order[:EXAMPLES]]
    repeated = len(history) - len({s.token for s in history})

    stale_accepted = stale_rejected = fresh_rejected = 0
    newest_acquisition = float("-inf")
    for section in sorted(history, key=lambda s: s.arrival):
        stale = newest_acquisition > section.acquired_by
        if stale and section.accepted:
            stale_accepted += 1
            examples.append(f"stale write accepted: {section.owner} token {section.token}")
        elif stale:
            stale_rejected += 1
        elif not section.accepted:
            fresh_rejected += 1
            examples.append(f"fresh write rejected: {section.owner} token {section.token}")
        newest_acquisition = max(newest_acquisition, section.acquired_by)

    node_kinds = set(node_fault_kinds)
    return Report(
        name=name,
        nodes=nodes,
        clients=clients,
        ttl=ttl,
        seconds=round(seconds, 1),
        sections=len(history),
        faults=dict(faults),
        node_faults=sum(count for kind, count in faults.items() if kind in node_kinds),
        expired_sections=sum(1 for s in history if not s.valid_at_exit),
        overlaps_valid=len(overlaps_valid),
        overlaps_within_validity=len(within_validity),
        overlaps_with_expired=len(with_expired),
        token_order_violations=len(out_of_order),
        repeated_tokens=repeated,
        long_holds=sum(1 for s in history if s.renewals > 0),
        stale_writes_accepted=stale_accepted,
        stale_writes_rejected=stale_rejected,
        fresh_writes_rejected=fresh_rejected,
        quorum_unavailable=quorum_unavailable,
        client_errors=list(client_errors),
        examples=examples[: 4 * EXAMPLES],
    )
