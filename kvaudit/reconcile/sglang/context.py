"""What one startup establishes before any arithmetic: server_args, parallelism, page size, KV dtype, the
scheduler summary, and the per-rank facts. Every other module of the SGLang reconciler reads a :class:`Context`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvaudit.model_config import ModelGeometry
from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.sglang import KVDtype, SchedulerSummary, WeightEnd
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.reconcile.sglang.cell import element_bytes
from kvaudit.reconcile.sglang.facts import RankFacts, gather_facts
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
    summary: SchedulerSummary | None
    notes: list[str]


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
    tags_tp = {r.sort_key[1] for r in facts} if facts else set()
    tp = opts.tp_size or as_int(args.get("tp_size")) or (max(tags_tp) + 1 if tags_tp else 1)
    if opts.tp_size and args.get("tp_size") and opts.tp_size != as_int(args.get("tp_size")):
        notes.append(f"--tp-size {opts.tp_size} overrides the log's tp_size={args.get('tp_size')}")
    dp = as_int(args.get("dp_size")) or 1
    attn_tp = tp // dp if (args.get("enable_dp_attention") and dp > 1 and tp % dp == 0) else tp
    pp = as_int(args.get("pp_size")) or (max((r.sort_key[0] for r in facts), default=0) + 1)
    page_size = as_int(args.get("page_size")) or 1
    summaries = startup.of(SchedulerSummary)
    kv_dtype, kv_elt = resolve_kv_dtype(startup, args, opts, facts)
    return Context(startup, opts, args, facts, startup.era, spec_algo, tp, attn_tp, pp,
                    page_size, kv_dtype, kv_elt, summaries[-1] if summaries else None, notes)


def as_int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def as_float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def resolve_kv_dtype(startup: Startup, args: dict[str, Any], opts: AuditOptions,
              facts: dict[Rank, RankFacts]) -> tuple[str | None, float | None]:
    """KV element type, most specific source first: what-if override, the KV line's dtype (0.5.13+), the
    'Using KV cache dtype' line (0.5.3-0.5.12), server_args, the checkpoint's FP8 KV quant (0.5.3+), and
    'auto' = the model dtype (from 'Load weight end ... dtype=' or the config; fp32 runs as 16-bit)."""
    if opts.kv_cache_dtype and opts.kv_cache_dtype != "auto":
        return opts.kv_cache_dtype, element_bytes(opts.kv_cache_dtype)
    for rf in facts.values():
        for kv in rf.kv:
            if kv.dtype and element_bytes(kv.dtype):
                return kv.dtype, element_bytes(kv.dtype)
    for ev in startup.of(KVDtype):
        if element_bytes(ev.dtype):
            return ev.dtype, element_bytes(ev.dtype)
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
            return ev.dtype, 2 if elt == 4 else elt
    if geom is not None and geom.torch_dtype:
        elt = geom.dtype_bytes
        return f"auto ({geom.torch_dtype})", 2 if elt == 4 else elt
    return None, None




def logged_token_count(ctx: Context) -> int | None:
    for rf in sorted(ctx.facts.values(), key=lambda r: r.rank):
        for kv in rf.kv:
            if kv.tokens is not None and not kv.tokens_approx:
                return kv.tokens
    if ctx.summary is not None:
        return ctx.summary.max_total_num_tokens
    for rf in ctx.facts.values():
        for kv in rf.kv:
            if kv.tokens is not None:
                return kv.tokens
    return None




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
