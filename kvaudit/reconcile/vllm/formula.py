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
``int(max_concurrency x max_model_len)`` from 0.21, within a block of it for uniform pools. Hybrid and
sliding-window pools: see ``cell.py``; their count changed rule at 0.20.1 (``CONCURRENCY_COUNT_SINCE``) and each
rule is checked on its own (``Candidate``).
"""

from __future__ import annotations

import math

from kvaudit.reconcile.interface import TokenInterval, Verdict
from kvaudit.reconcile.vllm.cell import HybridPool, SlidingWindowPool
from kvaudit.reconcile.vllm.context import Context
from kvaudit.reconcile.vllm.facts import RankFacts, graph_estimate
from kvaudit.units import GIB, LOG_HALF_ULP
from kvaudit.record import record

BUDGET_TOLERANCE_GIB = 0.03  # five logged 2-decimal values


def estimate_applied(ctx: Context) -> bool:
    if any("graph_profiling_disabled" in f.r for f in ctx.facts.values()):
        return False
    return ctx.era.lo >= (0, 20, 0) or any("equiv_util" in f.r for f in ctx.facts.values())


@record
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
        said, _, aside = self.requested_text.partition(" (")  # an aside on the figures goes after the unit
        return (f"{said} GiB{' (' + aside if aside else ''} - ({terms}) = {self.kv:.2f} GiB available for the "
                "KV cache")


def requested(rr: RankFacts, util: float | None) -> tuple[float, str] | None:
    r = rr.r
    if "engine_budget_gib" in r:  # 0.32+: weights held by another process come off the top
        return r["engine_budget_gib"], (f"{r.get('budget_gib', 0):.2f} - externally held weights "
                                        f"{r.get('external_weights_gib', 0):.2f} = {r['engine_budget_gib']:.2f}")
    if "requested_gib" in r:
        if "total_gib" in r and "util" in r:
            # vLLM multiplies the unrounded total and prints both rounded: redone from the printed total, the
            # product can differ in the last digit (79.22 x 0.9 = 71.30, printed 71.29); said, so no one is misled
            said = f"total {r['total_gib']:.2f} x {r['util']:g} = {r['requested_gib']:.2f}"
            if abs(round(r["total_gib"] * r["util"], 2) - round(r["requested_gib"], 2)) >= 0.005:
                said += " (vLLM's own figures, from its unrounded total)"
            return r["requested_gib"], said
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
        elif "graph_estimate_gib" in r and "kv_gib" in r:
            # a release the log does not pin (a hardware plugin's summary, vllm-ascend worker.py) that logged its
            # graph estimate: whether the budget paid it is not known from the era; take the reading that adds up
            # and say which (corpus vllm_c018: 57.91 - 51.68 - 0.29 - 0.51 - 0.29 = 5.14 ~ 5.15)
            without = make(terms)
            paid = make(terms + [("graph estimate", r["graph_estimate_gib"])], "the budget paid the graph estimate")
            return paid if abs(paid.residual) < abs(without.residual) else without
        return make(terms)
    return None


def rule_text(ctx: Context, budgets: list[Budget], applied: bool, fixed: float | None = None) -> str:
    if fixed is not None:
        # v1/worker/gpu_worker.py determine_available_memory (0.10.2+): kv_cache_memory_bytes set, profiling skipped
        return "kv_cache_memory_bytes as set (no profiling; gpu_memory_utilization does not apply)"
    if any(b.terms and b.terms[0][0] == "torch peak" for b in budgets) or (
            ctx.era.hi is not None and ctx.era.hi <= (0, 6, 5) and ctx.era.lo >= (0, 6, 4)):
        return "0.6.4: total x util - (torch peak + non-torch)"
    if ctx.era.lo >= (0, 29, 0) or any(b.terms and b.terms[0][0].startswith("consumed") for b in budgets):
        return "0.27+: total x util - (consumed + transient peak) - CUDA graph estimate"
    base = "total x util - (weights + activation peak + non-torch)"
    return base + (" - CUDA graph estimate (0.18+)" if applied else "")


@record
class Prediction:
    interval: TokenInterval | None
    verdict: Verdict
    reason: str
    effective_util: float | None = None


def block_interval(K: float, cell: int, block: int, exact: bool = False) -> TokenInterval:
    """The tokens a budget of K GiB (printed to 0.01: +-LOG_HALF_ULP; ``exact``: a budget set, not measured) holds.
    A budget at or below zero holds no block: every release clamps the count, ``num_gpu_blocks =
    max(num_gpu_blocks, 0)`` (V0 ``worker/worker.py::determine_num_available_blocks``, read in the 0.2.6, 0.2.7,
    0.3.0, 0.6.3, 0.6.4.post1 and 0.7.3 wheels; V1 ``v1/core/kv_cache_utils.py::get_num_blocks``, 0.11.0 and
    0.14.0), so the interval never runs below 0."""
    half = 0.0 if exact else LOG_HALF_ULP
    lo_b = math.floor(max(0.0, K - half) * GIB / (cell * block))
    hi_b = math.floor(max(0.0, K + half) * GIB / (cell * block))
    return TokenInterval(lo_b * block, hi_b * block)


#: where each era clamps a negative block count at 0 (``block_interval``)
CLAMP_SOURCE = ("num_gpu_blocks = max(num_gpu_blocks, 0): V0 worker.py determine_num_available_blocks, V1 "
                "kv_cache_utils.py get_num_blocks")


#: the release boundary of the hybrid count (``v1/core/kv_cache_utils.py::_report_kv_cache_config``): to 0.20.0
#: ``num_blocks // len(groups) x min block``, from 0.20.1 ``int(max_concurrency x max_model_len)``
CONCURRENCY_COUNT_SINCE = (0, 20, 1)

#: ``EngineArgs.get_batch_defaults`` (``engine/arg_utils.py``, 0.20-0.22 wheels): the max_num_batched_tokens a GPU
#: server gets when neither the args nor a "Chunked prefill is enabled" line state it (2048 under 70 GiB or on
#: A100, 8192 above; the LLM class 8192 / 16384)
BATCHED_TOKENS_DEFAULTS = ((2048, "the API server's default on cards under 70 GiB or A100"),
                           (8192, "the API server's default on cards of 70 GiB or more (the LLM class's under)"),
                           (16384, "the LLM class's default on cards of 70 GiB or more"))


@record
class Candidate:
    """One rule's prediction: the token interval and how it was computed. A verdict is taken against one rule
    at a time (never against the span of two eras' rules, which could not fail)."""

    interval: TokenInterval
    how: str
    assumed: str = ""  # a setting the log does not state, taken at a default to compute this one


def count_eras(ctx: Context, logged: int | None, min_block: int) -> tuple[bool, bool, str]:
    """Whether the 0.20.0 and the 0.20.1+ counting rules apply, and why one was ruled out: the era first; then
    a count that is not a multiple of the block cannot be ``num_blocks // groups x block`` (the old rule)."""
    old = ctx.era.lo < CONCURRENCY_COUNT_SINCE or _prerelease_of(ctx, CONCURRENCY_COUNT_SINCE)
    new = ctx.era.hi is None or ctx.era.hi >= CONCURRENCY_COUNT_SINCE
    why = ""
    if old and new and logged is not None and min_block > 0 and logged % min_block:
        old, why = False, (f"{logged:,} is not a multiple of the {min_block}-token block, so it is the 0.20.1+ count "
                           "int(max_concurrency x max_model_len), not the 0.20.0 num_blocks // groups x block")
    return old, new, why


def _prerelease_of(ctx: Context, release: tuple[int, int, int]) -> bool:
    """A ``0.20.1.dev0`` / ``0.20.1rc1`` build: it precedes the release, and may not hold its change (a real
    0.20.1.dev0+g101584af0 startup still counts blocks // groups x block: corpus vllm_c020)."""
    from kvaudit.parse.vllm import Banner

    import re

    pre = re.compile(r"v?" + re.escape(".".join(str(x) for x in release)) + r"(?![\d])\S*(?:dev|rc)")
    return any(isinstance(b.version, str) and pre.match(b.version) for b in ctx.startup.of(Banner))


def mamba_state_pages(ctx: Context, spec_tokens: int) -> list[tuple[int, str, str]]:
    """The pages one request holds in each Mamba group (``MambaSpec.max_memory_usage_bytes``, 0.22.0 wheel):
    ``align`` 2 + speculative blocks, ``none`` 1 + speculative blocks (``all``: every block of the context, see
    ``hybrid_candidates``). The mode is the log's ("Mamba cache mode is set to 'align'") or the args'; when
    neither states it, both are tried, each named."""
    mode = setting(ctx, "mamba_cache_mode") or ctx.args.get("mamba_cache_mode")
    if mode is None and ctx.args.get("enable_prefix_caching") is False:
        mode = "none"  # config/vllm.py turns 'align' on only with prefix caching; off, the default 'none' holds
    pages = {"align": 2 + spec_tokens, "none": 1 + spec_tokens}
    if isinstance(mode, str) and mode in pages:
        return [(pages[mode], mode, "")]
    if mode == "all":
        return []
    return [(pages[m], m, f"mamba_cache_mode {m} (not stated)") for m in ("none", "align")]


def setting(ctx: Context, key: str) -> str | None:
    """The last value a line of the log states for ``key`` (parse.vllm.Setting)."""
    from kvaudit.parse.vllm import Setting

    return next((e.value for e in reversed(ctx.startup.of(Setting)) if e.key == key), None)


def batched_tokens(ctx: Context) -> list[tuple[int, str]]:
    """max_num_batched_tokens as the log states it, else the release's defaults (each named as assumed)."""
    from kvaudit.reconcile.values import as_int

    stated = as_int(ctx.args.get("max_num_batched_tokens")) or as_int(setting(ctx, "max_num_batched_tokens"))
    if stated:
        return [(stated, "")]
    return [(v, f"max_num_batched_tokens {v:,} ({why}; not stated)") for v, why in BATCHED_TOKENS_DEFAULTS]


def hybrid_candidates(K: float, pool: HybridPool, ctx: Context, max_model_len: int | None, spec_tokens: int,
                      logged: int | None) -> tuple[list[Candidate], str]:
    """What a Mamba-hybrid pool of K GiB reports under each rule the era and the count admit; an empty list with
    the reason when none can be computed."""
    lo_b, hi_b = pool.blocks(max(0.0, K - LOG_HALF_ULP) * GIB), pool.blocks((K + LOG_HALF_ULP) * GIB)
    old, new, why = count_eras(ctx, logged, pool.block_size)
    out: list[Candidate] = []
    if old:
        out.append(Candidate(TokenInterval(pool.tokens_by_blocks(lo_b), pool.tokens_by_blocks(hi_b)),
                             f"to 0.20.0: {lo_b:,}..{hi_b:,} blocks // {pool.groups} groups x {pool.block_size}"))
    if new:
        if max_model_len is None:
            if not out:
                return [], "the 0.20.1+ count needs max_model_len (the Maximum concurrency line)"
        else:
            states = mamba_state_pages(ctx, spec_tokens)
            if not states and not out:
                return [], "mamba_cache_mode 'all' (a state page per block of context) is not modelled here"
            for pages, mode, assumed in states:
                lo, hi = (pool.tokens_by_concurrency(b, max_model_len, pages) for b in (lo_b, hi_b))
                out.append(Candidate(TokenInterval(lo, hi), (
                    f"0.20.1+: int({lo_b:,}..{hi_b:,} blocks / (cdiv({max_model_len:,}, {pool.block_size}) + "
                    f"{pool.other_groups} Mamba groups x {pages} state pages ({mode} mode)) x {max_model_len:,})"),
                    assumed))
    return out, why


def sliding_candidates(K: float, pool: SlidingWindowPool, ctx: Context, max_model_len: int | None,
                       logged: int | None) -> tuple[list[Candidate], str]:
    """What a sliding-window pool of K GiB reports under each rule the era and the count admit."""
    lo_b, hi_b = pool.blocks(max(0.0, K - LOG_HALF_ULP) * GIB), pool.blocks((K + LOG_HALF_ULP) * GIB)
    min_block = min(pool.full_block, pool.swa_block)
    old, new, why = count_eras(ctx, logged, min_block)
    out: list[Candidate] = []
    if old:
        out.append(Candidate(TokenInterval(pool.tokens_by_blocks(lo_b), pool.tokens_by_blocks(hi_b)),
                             f"to 0.20.0: {lo_b:,}..{hi_b:,} blocks // {pool.groups} groups x {min_block}"))
    if new:
        if max_model_len is None:
            if not out:
                return [], "the 0.20.1+ count needs max_model_len (the Maximum concurrency line)"
        else:
            seen: set[int] = set()
            for mnbt, assumed in batched_tokens(ctx):
                per = pool.blocks_per_request(max_model_len, mnbt)
                if per in seen:
                    continue  # a default the max_model_len cap makes the same as one already tried
                seen.add(per)
                lo, hi = (pool.tokens_by_concurrency(b, max_model_len, mnbt) for b in (lo_b, hi_b))
                out.append(Candidate(TokenInterval(lo, hi), (
                    f"0.20.1+: int({lo_b:,}..{hi_b:,} blocks / {per:,} blocks per request x {max_model_len:,}); "
                    f"per request {pool.full_groups} full group(s) x cdiv({max_model_len:,}, {pool.full_block}) + "
                    f"{pool.swa_groups} sliding groups x (cdiv(min({pool.sliding_window} - 1 + {mnbt:,}, "
                    f"{max_model_len:,}), {pool.swa_block}) + 1)"), assumed))
    return out, why


def sliding_fits_some_batch(K: float, pool: SlidingWindowPool, max_model_len: int, logged: int) -> int | None:
    """A max_num_batched_tokens that would give the logged count (the smallest), None when none does: when the
    log does not state it and no default reproduces the count, the count is not checked, unless nothing could."""
    lo_b, hi_b = pool.blocks(max(0.0, K - LOG_HALF_ULP) * GIB), pool.blocks((K + LOG_HALF_ULP) * GIB)
    for mnbt in range(1, max_model_len + 1, max(1, pool.swa_block)):
        if pool.tokens_by_concurrency(lo_b, max_model_len, mnbt) <= logged <= pool.tokens_by_concurrency(
                hi_b, max_model_len, mnbt):
            return mnbt
        if min(pool.sliding_window - 1 + mnbt, max_model_len) >= max_model_len:
            break
    return None
