"""What one startup establishes before any arithmetic: server_args, parallelism, page size, KV dtype, the
scheduler summary, and the per-rank facts. Every other module of the SGLang reconciler reads a :class:`Context`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvaudit.model_config import ModelGeometry
from kvaudit.parse.interface import Rank, RankEvent, Startup
from kvaudit.parse.sglang import KVDtype, PostCaptureKV, SchedulerSummary, WeightEnd
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.reconcile.sglang.cell import element_bytes
from kvaudit.reconcile.sglang.facts import RankFacts, gather_facts
from kvaudit.reconcile.values import as_int
from kvaudit.versions import VersionRange

NO_SPEC = (None, "None", "", "NONE", "none")

@dataclass
class Context:
    startup: Startup
    opts: AuditOptions
    args: dict[str, Any]
    facts: dict[Rank, RankFacts]
    era: VersionRange
    spec_algo: str | None
    tp: int
    attn_tp: int
    pp: int
    page_size: int
    kv_dtype: str | None
    kv_elt: float | None
    page_size_known: bool = False  # server_args stated it
    tp_at_least: bool = False  # tp and attn_tp come from the rank tags seen: the server may have more ranks
    attn_tp_source: str = ""
    summary: SchedulerSummary | None = None
    notes: list[str] = field(default_factory=list)


def build_context(startup: Startup, opts: AuditOptions) -> Context:
    args = dict(startup.server_args or {})
    facts = gather_facts(startup)
    notes: list[str] = []
    algo = args.get("speculative_algorithm")
    spec_algo = None if algo in NO_SPEC else str(algo)
    draft_seen = any(
        getattr(e, "role", "target") == "draft" for e in startup.events
    )
    if spec_algo is None and draft_seen:
        spec_algo = "unknown (draft worker lines seen)"
    tagged = [s.tagged_rank for s in startup.of(SchedulerSummary) if s.tagged_rank is not None]
    # every rank that printed a line counts, not only those with memory facts: an excerpt of HiCache host lines
    # (c062: ``[... ATTN_CP5 TP5] Allocating 120.00 GB host memory``) names eight ranks
    tagged += [e.rank for e in startup.events if isinstance(e, RankEvent) and e.rank.label]
    tp, attn_tp, at_least, attn_source = _parallelism(args, opts, facts, notes, tagged)
    pp = as_int(args.get("pp_size")) or (max((r.sort_key[0] for r in facts), default=0) + 1)
    page_size = as_int(args.get("page_size"))
    summaries = startup.of(SchedulerSummary)
    kv_dtype, kv_elt = resolve_kv_dtype(startup, args, opts, facts)
    return Context(startup, opts, args, facts, startup.era, spec_algo, tp, attn_tp, pp,
                   page_size or 1, kv_dtype, kv_elt, page_size is not None, at_least, attn_source,
                   summaries[-1] if summaries else None, notes)


def _dp_attention_from_tags(ranks: list[Rank]) -> int | None:
    """The attention-TP size that ``DPn TPn`` tags establish: under DP attention ``dp_rank = tp_rank //
    attn_tp`` (``srt/layers/dp_attention.py::compute_dp_attention_world_info``), so the sizes every seen tag
    agrees with. One size (a tag with DP > 0 pins it) -> that size; none (DP1 TP0: a data-parallel controller
    without DP attention) or several -> None."""
    pairs = [(r.sort_key[2], r.sort_key[1]) for r in ranks if "DP" in r.label and "TP" in r.label]
    if not pairs or not any(d > 0 for d, _ in pairs):
        return None
    top = max(t for _, t in pairs) + 1
    fits = [a for a in range(1, top + 1) if all(t // a == d for d, t in pairs)]
    return fits[0] if len(fits) == 1 else None


def _parallelism(args: dict[str, Any], opts: AuditOptions, facts: dict[Rank, RankFacts],
                 notes: list[str], summary_ranks: list[Rank] | None = None) -> tuple[int, int, bool, str]:
    """TP size and the attention-TP size (the KV-head divisor, reference §2), from what establishes them:
    --tp-size, server_args (tp_size, dp_size, enable_dp_attention), else the rank tags, which give only a
    lower bound ("at least N": an excerpt may not show every rank)."""
    # the scheduler summaries' tags count too: an excerpt of summary lines alone names every TP rank
    tags_tp = {r.sort_key[1] for r in facts} | {r.sort_key[1] for r in summary_ranks or ()}
    args_tp = as_int(args.get("tp_size"))
    at_least = False
    if opts.tp_size:
        tp, source = opts.tp_size, "--tp-size"
        if args_tp and opts.tp_size != args_tp:
            notes.append(f"--tp-size {opts.tp_size} overrides the log's tp_size={args.get('tp_size')}")
    elif args_tp:
        tp, source = args_tp, "server_args tp_size"
    elif tags_tp:
        tp, source, at_least = max(tags_tp) + 1, "rank tags", True
    else:
        tp, source = 1, "assumed 1 (no server_args, no rank tags)"
    dp = as_int(args.get("dp_size")) or 1
    if "enable_dp_attention" in args and not opts.tp_size:
        if args.get("enable_dp_attention") and dp > 1 and tp % dp == 0:
            return tp, tp // dp, at_least, f"server_args: tp_size {tp} / dp_size {dp} (DP attention)"
        return tp, tp, at_least, source
    tagged = _dp_attention_from_tags(list(facts))
    if tagged is not None and not opts.tp_size:
        return tp, tagged, False, f"rank tags DPn TPn (DP attention: {tagged} TP rank(s) per DP group)"
    return tp, tp, at_least, source


def resolve_kv_dtype(startup: Startup, args: dict[str, Any], opts: AuditOptions,
              facts: dict[Rank, RankFacts]) -> tuple[str | None, float | None]:
    """KV element type, most specific source first: what-if override, the KV line's dtype (0.5.13+), the
    'Using KV cache dtype' line (0.5.3-0.5.12), server_args, the checkpoint's FP8 KV quant (0.5.3+), and
    'auto' = the model dtype (from 'Load weight end ... dtype=' or the config; fp32 runs as 16-bit)."""
    assumed = "kv_cache_dtype" not in args and not opts.kv_cache_dtype
    if opts.kv_cache_dtype and opts.kv_cache_dtype != "auto":
        return opts.kv_cache_dtype, element_bytes(opts.kv_cache_dtype)
    for rf in facts.values():
        for kv in rf.kv:
            if kv.dtype and element_bytes(kv.dtype):
                return kv.dtype, element_bytes(kv.dtype)
    for logged in startup.of(KVDtype):
        if element_bytes(logged.dtype):
            return logged.dtype, element_bytes(logged.dtype)
    arg = args.get("kv_cache_dtype")
    if isinstance(arg, str) and arg != "auto" and element_bytes(arg) and opts.kv_cache_dtype != "auto":
        return arg, element_bytes(arg)
    geom: ModelGeometry | None = opts.model_geometry
    if geom is not None and geom.kv_cache_quant_algo and geom.kv_cache_quant_algo.upper() == "FP8" \
            and startup.era.overlaps((0, 5, 3), None):
        return "fp8_e4m3 (checkpoint kv_cache_quant_algo)", 1
    for ev in startup.of(WeightEnd):
        if ev.role == "target" and ev.dtype and element_bytes(ev.dtype):
            elt = element_bytes(ev.dtype)
            return ev.dtype + (" (assumed: the model's dtype; the log does not name the KV dtype)"
                               if assumed else ""), 2 if elt == 4 else elt
    if geom is not None and geom.torch_dtype:
        elt = geom.dtype_bytes
        return f"auto ({geom.torch_dtype})" + (", assumed: the log does not name the KV dtype" if assumed else ""), \
            2 if elt == 4 else elt
    return None, None




def logged_token_count(ctx: Context) -> tuple[int | None, bool]:
    """The pool's token count and whether the log gives it only approximately (an abridged ``#tokens: 273K``).
    An exact KV line first, then the scheduler summary, then an abridged figure. For a sliding-window hybrid
    the count is the full-attention pool's (``max_total_num_tokens`` is ``full_tokens``, reference §2.5)."""
    resized = [ev for ev in ctx.startup.of(PostCaptureKV) if ev.tokens is not None]
    if resized:
        # post-capture KV sizing: the pool is what the resize left, not the pre-capture upper bound
        return resized[0].tokens, False
    for rf in sorted(ctx.facts.values(), key=lambda r: r.rank):
        if rf.swa_summary is not None and rf.swa_summary.detail.get("full_size"):
            return int(rf.swa_summary.detail["full_size"]), False
        for kv in rf.kv:
            if kv.tokens is not None and not kv.tokens_approx and kv.label.upper() != "SWA" and not kv.upper_bound:
                return kv.tokens, False
    if ctx.summary is not None:
        return ctx.summary.max_total_num_tokens, False
    for rf in ctx.facts.values():
        for kv in rf.kv:
            if kv.tokens is not None and not kv.upper_bound:
                return kv.tokens, True
    return None, False


def post_capture(ctx: Context) -> tuple[bool, int | None, bool]:
    """Whether the startup sized its pool after CUDA-graph capture (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``,
    0.5.16+: a 'VA upper bound' KV line or a 'Post-capture KV sizing' line), the pre-capture upper bound in tokens
    when a line states it, and whether that figure is abridged (``273K``)."""
    bounds = [kv for rf in ctx.facts.values() for kv in rf.kv if kv.upper_bound and kv.tokens is not None]
    active = bool(bounds) or bool(ctx.startup.of(PostCaptureKV)) or any(
        kv.upper_bound for rf in ctx.facts.values() for kv in rf.kv)
    if not bounds:
        return active, None, False
    low = min(bounds, key=lambda kv: kv.tokens or 0)
    return active, low.tokens, low.tokens_approx


def context_length_of(ctx: Context) -> int | None:
    if ctx.opts.context_length:
        return ctx.opts.context_length
    if ctx.summary is not None and ctx.summary.context_len:
        return ctx.summary.context_len
    v = as_int(ctx.args.get("context_length"))
    if v:
        return v
    geom: ModelGeometry | None = ctx.opts.model_geometry
    return geom.max_position_embeddings if geom else None



def rounded(x: float, nd: int = 2) -> float:
    return round(x, nd)
