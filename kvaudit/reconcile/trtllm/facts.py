"""What each TensorRT-LLM rank logged, and the pool the server allocated."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.trtllm import KVAllocation, Reading
from kvaudit.units import GIB


@dataclass
class RankFacts:
    rank: Rank
    r: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    allocations: list[KVAllocation] = field(default_factory=list)

    def final_allocation(self) -> KVAllocation | None:
        """The pool the server runs with: on the PyTorch path the allocation after the peak line (the one
        before it is the temporary profiling cache); otherwise the last one."""
        if not self.allocations:
            return None
        peak_line = self.lines.get("peak_gib")
        if peak_line is not None:
            after = [a for a in self.allocations if a.line > peak_line]
            return after[-1] if after else None
        return self.allocations[-1]


def gather_facts(startup: Startup) -> dict[Rank, RankFacts]:
    out: dict[Rank, RankFacts] = {}
    for e in startup.events:
        if isinstance(e, Reading):
            rr = out.setdefault(e.rank, RankFacts(e.rank))
            rr.r[e.key] = e.value
            rr.lines[e.key] = e.line
        elif isinstance(e, KVAllocation):
            out.setdefault(e.rank, RankFacts(e.rank)).allocations.append(e)
    return out


def first(facts: dict[Rank, RankFacts], key: str) -> float | None:
    """A reading any rank logged (ranks log the settings alike)."""
    return next((rr.r[key] for rr in facts.values() if key in rr.r), None)


@dataclass(frozen=True)
class Pool:
    """The allocated pool, per rank and the smallest (every rank runs with the smallest count)."""

    finals: dict[Rank, KVAllocation]
    smallest: KVAllocation | None
    gib: float | None  # its size (the pre-0.9 byte count when that is all the log has)

    @property
    def tokens(self) -> int | None:
        return self.smallest.tokens if self.smallest else None


def logged_pool(facts: dict[Rank, RankFacts]) -> Pool:
    finals = {r: a for r, rr in facts.items() if (a := rr.final_allocation()) is not None}
    smallest = min(finals.values(), key=lambda a: a.tokens) if finals else None
    gib = smallest.gib if smallest and smallest.gib else None
    old_bytes = first(facts, "old_kv_bytes")
    if gib is None and old_bytes is not None:
        gib = old_bytes / GIB
    return Pool(finals, smallest, gib)
