"""What each vLLM worker logged, gathered per rank, and the terms derived from it.

Reading keys (``kvaudit/parse/vllm.py``): ``total_gib``, ``util``, ``requested_gib``, ``weights_gib``,
``non_torch_gib``, ``activation_gib`` (V0 records, plugins: the activation peak alone),
``activation_printed_gib`` (the "Actual usage is ..." suggestion line: the peak *as printed*, which holds the
CUDA-graph estimate when one was applied), ``consumed_gib`` (0.29+: weights + non-torch), ``peak_torch_gib``
(0.6.4), ``kv_gib``, ``graph_gib`` (captured), ``graph_estimate_gib``, ``equiv_util``, ``budget_gib`` /
``external_weights_gib`` / ``engine_budget_gib`` (0.32+ externally held weights), ``kv_bytes_config_gib``,
``suggested_util`` (0.18-0.19's opt-in graph note), ``sleep_freed_gib`` / ``sleep_in_use_gib`` (sleep mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.vllm import Reading
from kvaudit.record import record


@dataclass
class RankFacts:
    rank: Rank
    r: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        return self.r.get(key)

    def has(self, *keys: str) -> bool:
        return all(k in self.r for k in keys)


def gather_facts(startup: Startup) -> dict[Rank, RankFacts]:
    out: dict[Rank, RankFacts] = {}
    for e in startup.of(Reading):
        rr = out.setdefault(e.rank, RankFacts(e.rank))
        rr.r[e.key] = e.value
        rr.lines[e.key] = e.line
    return out


@record
class GraphEstimate:
    """The CUDA-graph memory the 0.18+ profiler reserved out of the KV budget, and where that number came from:
    ``Estimated CUDA graph memory`` / ``CUDA graph pool memory ... (estimated)`` (logged, 2 decimals), or the
    utilisation-equivalence note, ``estimate = (util - equivalent util) x total`` (derived; the equivalent
    utilisation is printed to 4 decimals, so the estimate carries up to +-0.00005 x total)."""

    gib: float
    source: str  # "log" | "equivalence"
    line: int | None


def graph_estimate(rr: RankFacts, total: float | None, peers: list[RankFacts]) -> GraphEstimate | None:
    """This rank's estimate; workers log these lines independently and alike, so a peer's stands in."""
    for f in [rr] + peers:
        if "graph_estimate_gib" in f.r:
            return GraphEstimate(f.r["graph_estimate_gib"], "log", f.lines.get("graph_estimate_gib"))
    for f in [rr] + peers:
        u, e = f.r.get("util"), f.r.get("equiv_util")
        if u is not None and e is not None and total and u >= e and "equiv_util" in f.lines:
            return GraphEstimate(round((u - e) * total, 4), "equivalence", f.lines.get("equiv_util"))
    return None


def first(facts: dict[Rank, RankFacts], key: str) -> float | None:
    return next((f.r[key] for f in facts.values() if key in f.r), None)
