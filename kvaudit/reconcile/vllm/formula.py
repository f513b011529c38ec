"""vLLM's KV budget per worker, per era, and the token count it predicts.

The budget (per worker; the engine then takes the **minimum block count over workers**,
``v1/core/kv_cache_utils.py::get_kv_cache_configs``):

    V0 0.6.5-0.10 (``worker/worker.py::determine_num_available_blocks``), V1 0.9.1-0.28
    (``v1/worker/gpu_worker.py::determine_available_memory``):
        available_kv = total x util - (weights + activation peak + non-torch) [- CUDA graph estimate]
    V1 0.27+ (``total_consumed``; released wheels checked from 0.29, and a real 0.27.1 startup prints its
    "consumed memory" line, corpus vllm_c012):
        available_kv = ceil(total x util) - (consumed + transient peak) - CUDA graph estimate
    V0 0.6.4 and the comma-separated 0.6.4.post1-0.6.5 record:
        available_kv = total x util - (torch peak + non-torch)          (counts other processes)
    0.32+ externally held weights: the budget is what remains after them ("... Z GiB remains").

The CUDA-graph estimate is taken from the budget from 0.20 (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
defaults to 1; 0.18-0.19 opt-in, announced by the equivalence note). The "Actual usage is ..." suggestion line
prints the peak activation *with the estimate inside it* and the captured graphs beside it (vllm#57936), so the
budget is ``requested - consumed - printed peak`` and the transient activation is ``printed peak - estimate``.

Tokens: ``blocks = floor(available / (block x bytes per token))``, ``tokens = blocks x block`` (to 0.20), and
``int(max_concurrency x max_model_len)`` from 0.21, within a block of it for uniform pools. Hybrid pools: see
``cell.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvaudit.reconcile.interface import TokenInterval, Verdict
from kvaudit.reconcile.vllm.cell import HybridPool
from kvaudit.reconcile.vllm.context import Context
from kvaudit.reconcile.vllm.facts import RankFacts, graph_estimate
from kvaudit.units import GIB, LOG_HALF_ULP

BUDGET_TOLERANCE_GIB = 0.03  # five logged 2-decimal values


def estimate_applied(ctx: Context) -> bool:
    if any("graph_profiling_disabled" in f.r for f in ctx.facts.values()):
        return False
    return ctx.era.lo >= (0, 20, 0) or any("equiv_util" in f.r for f in ctx.facts.values())


@dataclass(frozen=True)
class Budget:
    """One worker's budget as its lines state it: ``requested - sum(terms) - kv = residual``."""

    rank: str
    requested: float
    requested_text: str
    terms: tuple[tuple[str, float], ...]
    kv: float
    residual: float
    note: str = ""  # which reading of an ambiguous line was taken

    def sentence(self) -> str:
        terms = " + ".join(f"{name} {v:.2f}" for name, v in self.terms)
        return f"{self.requested_text} GiB - ({terms}) = {self.kv:.2f} GiB available for the KV cache"


def requested(rr: RankFacts, util: float | None) -> tuple[float, str] | None:
    r = rr.r
    if "engine_budget_gib" in r:  # 0.32+: weights held by another process come off the top
        return r["engine_budget_gib"], (f"{r.get('budget_gib', 0):.2f} - externally held weights "
                                        f"{r.get('external_weights_gib', 0):.2f} = {r['engine_budget_gib']:.2f}")
    if "requested_gib" in r:
        if "total_gib" in r and "util" in r:
            return r["requested_gib"], f"total {r['total_gib']:.2f} x {r['util']:g} = {r['requested_gib']:.2f}"
        return r["requested_gib"], f"{r['requested_gib']:.2f}"
    if "total_gib" in r and util is not None:
        req = r["total_gib"] * util
        return req, f"total {r['total_gib']:.2f} x {util:g} = {req:.2f}"
    return None


def budget(rr: RankFacts, ctx: Context, total: float | None, peers: list[RankFacts]) -> Budget | None:
    """The worker's budget under the rule its lines belong to, or None when they do not state every term."""
    r = rr.r
    if "kv_gib" not in r:
        return None
    req = requested(rr, ctx.util)
    if req is None:
        return None
    value, text = req
    kv = r["kv_gib"]
    label = rr.rank.display

    def make(terms: list[tuple[str, float]], note: str = "") -> Budget:
        return Budget(label, value, text, tuple(terms), kv, value - sum(v for _, v in terms) - kv, note)

    if "peak_torch_gib" in r and "non_torch_gib" in r:
        return make([("torch peak", r["peak_torch_gib"]), ("non-torch", r["non_torch_gib"])])
    if "consumed_gib" in r and "activation_printed_gib" in r:
        return make([("consumed (weights + non-torch)", r["consumed_gib"]),
                     ("peak activation as printed (holds the graph estimate)", r["activation_printed_gib"])])
    if {"weights_gib", "non_torch_gib", "activation_printed_gib"} <= set(r):
        base = [("weights", r["weights_gib"]), ("non-torch", r["non_torch_gib"])]
        inside = make(base + [("peak activation as printed (holds the graph estimate)", r["activation_printed_gib"])])
        est = graph_estimate(rr, total, peers) if estimate_applied(ctx) else None
        if est is None:
            return make(base + [("activation peak", r["activation_printed_gib"])])
        # 0.20-0.28: whether the printed peak holds the estimate is not documented for this shape; take the
        # reading that adds up, and say which
        outside = make(base + [("activation peak", r["activation_printed_gib"]), ("CUDA graph estimate", est.gib)],
                       "the printed peak excludes the graph estimate")
        return inside if abs(inside.residual) <= abs(outside.residual) else outside
    if {"weights_gib", "non_torch_gib", "activation_gib"} <= set(r):
        terms = [("weights", r["weights_gib"]), ("activation peak", r["activation_gib"]),
                 ("non-torch", r["non_torch_gib"])]
        est = graph_estimate(rr, total, peers) if estimate_applied(ctx) else None
        if est is not None:
            terms.append(("CUDA graph estimate", est.gib))
        return make(terms)
    return None


def rule_text(ctx: Context, budgets: list[Budget], applied: bool) -> str:
    if any(b.terms and b.terms[0][0] == "torch peak" for b in budgets) or (
            ctx.era.hi is not None and ctx.era.hi <= (0, 6, 5) and ctx.era.lo >= (0, 6, 4)):
        return "0.6.4: total x util - (torch peak + non-torch)"
    if ctx.era.lo >= (0, 29, 0) or any(b.terms and b.terms[0][0].startswith("consumed") for b in budgets):
        return "0.27+: total x util - (consumed + transient peak) - CUDA graph estimate"
    base = "total x util - (weights + activation peak + non-torch)"
    return base + (" - CUDA graph estimate (0.18+)" if applied else "")


@dataclass(frozen=True)
class Prediction:
    interval: TokenInterval | None
    verdict: Verdict
    reason: str
    effective_util: float | None = None


def block_interval(K: float, cell: int, block: int) -> TokenInterval:
    lo_b = math.floor(max(0.0, K - LOG_HALF_ULP) * GIB / (cell * block))
    hi_b = math.floor((K + LOG_HALF_ULP) * GIB / (cell * block))
    return TokenInterval(lo_b * block, hi_b * block)


def hybrid_interval(K: float, pool: HybridPool, ctx: Context, max_model_len: int | None,
                    spec_tokens: int) -> tuple[TokenInterval | None, str]:
    """Tokens a hybrid pool of K GiB reports, for every rule the era admits; None when the 0.21+ count needs a
    max_model_len the log does not give."""
    lo_b, hi_b = pool.blocks(max(0.0, K - LOG_HALF_ULP) * GIB), pool.blocks((K + LOG_HALF_ULP) * GIB)
    lows, highs, how = [], [], []
    if ctx.era.hi is None or ctx.era.hi >= (0, 21, 0):
        if max_model_len is None:
            return None, "the 0.21+ count needs max_model_len (the Maximum concurrency line)"
        states = range(1, 2 + spec_tokens)
        lows.append(min(pool.tokens_by_concurrency(lo_b, max_model_len, s) for s in states))
        highs.append(max(pool.tokens_by_concurrency(hi_b, max_model_len, s) for s in states))
        how.append(f"0.21+: int({lo_b:,}..{hi_b:,} blocks / (cdiv({max_model_len:,}, {pool.block_size}) + "
                   f"{pool.other_groups} x {states.start}..{states.stop - 1} state pages) x {max_model_len:,})")
    if ctx.era.lo < (0, 21, 0):
        lows.append(pool.tokens_by_blocks(lo_b))
        highs.append(pool.tokens_by_blocks(hi_b))
        how.append(f"to 0.20: {lo_b:,}..{hi_b:,} blocks // {pool.groups} groups x {pool.block_size}")
    return TokenInterval(min(lows), max(highs)), "; ".join(how)
