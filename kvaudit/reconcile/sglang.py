"""SGLang's KV-cache sizing formula and the per-GPU ledger. Pure functions over parsed startups.

The formula (``ModelRunner.profile_max_num_token``, ``srt/model_executor/model_runner.py`` in 0.3.0-0.5.6;
``model_runner_kv_cache_mixin.py`` 0.5.7-0.5.15; ``mem_cache/kv_cache_configurator.py`` 0.5.16+)::

    rest = post - (1 - mem_fraction_static) * T          GiB; post and T are MIN over ranks
    max_total_num_tokens = floor(rest * 2**30 / cell)    cell = KV bytes per token on one rank

``T`` is the free memory measured after torch.distributed/NCCL init and *before* the weights load (not
the card's capacity); ``post`` the free memory after the weights. Then, by era: speculative headroom
(0.4.4-0.5.6), page rounding (0.4.4+), the ``--max-total-tokens`` cap, and from 0.5.14 the draft's layers
inflate the cell. docs/how-it-works.md walks through it with numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kvaudit.model_config import DTYPE_BYTES, ModelGeometry
from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.sglang import (
    CapWarning,
    DistInit,
    Failure,
    GraphBegin,
    GraphEnd,
    HiCacheHost,
    KVAlloc,
    KVDtype,
    MfsAdjust,
    OtherPool,
    PoolEnd,
    SchedulerSummary,
    WeightBegin,
    WeightEnd,
)
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import (
    Audit,
    AuditOptions,
    Finding,
    Formula,
    FormulaRow,
    LedgerItem,
    ModelSummary,
    RankLedger,
    Severity,
    Thresholds,
    TokenInterval,
    Verdict,
    WhatIf,
)
from kvaudit.units import GIB, LOG_HALF_ULP, MIB, Interval
from kvaudit.versions import Version, VersionRange

ENGINE = "sglang"

# The PyTorch caching allocator serves large tensors from segments rounded up to 2 MiB
# (c10/cuda/CUDACachingAllocator.cpp, kLargeBuffer / kRoundLarge); SGLang's pools are one tensor per layer.
ALLOC_ROUND = 2 * MIB

NO_SPEC = (None, "None", "", "NONE", "none")


# ----------------------------------------------------------------------------------------------------------
# per-rank facts gathered from the events


@dataclass
class _RankFacts:
    rank: Rank
    pre: Interval | None = None
    pre_source: str | None = None
    post: Interval | None = None
    weights: float | None = None
    kv: list[KVAlloc] = field(default_factory=list)
    other_pools: list[OtherPool] = field(default_factory=list)
    pool_end: float | None = None
    graph_begin: dict[str, float] = field(default_factory=dict)
    graph_usage: dict[str, float] = field(default_factory=dict)
    draft_weights: float | None = None
    draft_post: float | None = None
    draft_kv: list[KVAlloc] = field(default_factory=list)
    draft_pool_end: float | None = None
    dist_usage: float | None = None
    readings: list[tuple[int, float, str]] = field(default_factory=list)  # (line, avail GiB, what)
    lines: dict[str, int] = field(default_factory=dict)  # where each fact was logged

    @property
    def kv_total(self) -> float | None:
        vals = [k.total_gib for k in self.kv if k.total_gib is not None and not k.upper_bound]
        return sum(vals) if vals else None

    @property
    def kv_components(self) -> int:
        return sum((k.k_gib is not None) + (k.v_gib is not None) + (k.kv_gib is not None) for k in self.kv)


def _gather(startup: Startup) -> dict[Rank, _RankFacts]:
    facts: dict[Rank, _RankFacts] = {}

    def get(rank: Rank) -> _RankFacts:
        if rank not in facts:
            facts[rank] = _RankFacts(rank)
        return facts[rank]

    for ev in startup.events:
        if isinstance(ev, WeightBegin) and ev.role == "target" and ev.avail_gib is not None:
            rf = get(ev.rank)
            if rf.pre is None or rf.pre_source != "Load weight begin":
                rf.pre, rf.pre_source = Interval.logged(ev.avail_gib), "Load weight begin"
            rf.readings.append((ev.line, ev.avail_gib, "before weights"))
        elif isinstance(ev, WeightEnd):
            rf = get(ev.rank)
            rf.lines["weights" if ev.role == "target" else "draft_weights"] = ev.line
            if ev.role == "target":
                if ev.avail_gib is not None:
                    rf.post = Interval.logged(ev.avail_gib)
                    rf.readings.append((ev.line, ev.avail_gib, "after weights"))
                rf.weights = ev.usage_gib
                if rf.pre is None and ev.avail_gib is not None and ev.usage_gib is not None:
                    rf.pre = Interval.logged(ev.avail_gib + ev.usage_gib, 2 * LOG_HALF_ULP)
                    rf.pre_source = "Load weight end (avail + mem usage)"
            else:
                rf.draft_weights = ev.usage_gib
                rf.draft_post = ev.avail_gib
                if ev.avail_gib is not None:
                    rf.readings.append((ev.line, ev.avail_gib, "after draft weights"))
        elif isinstance(ev, DistInit):
            rf = get(ev.rank)
            if ev.role == "target":
                rf.dist_usage = ev.usage_gib
                if ev.begin_avail_gib is not None and rf.pre is None:
                    rf.pre = Interval(ev.begin_avail_gib - 2.0, ev.begin_avail_gib + LOG_HALF_ULP)
                    rf.pre_source = "Init torch begin (before NCCL; approximate)"
        elif isinstance(ev, KVAlloc):
            rf = get(ev.rank)
            (rf.kv if ev.role == "target" else rf.draft_kv).append(ev)
            rf.lines["kv_cache" if ev.role == "target" else "draft_kv_cache"] = ev.line
        elif isinstance(ev, OtherPool):
            if ev.role == "target" and ev.counts_in_total and ev.gib is not None:
                get(ev.rank).other_pools.append(ev)
                get(ev.rank).lines[f"pool_{ev.kind}"] = ev.line
        elif isinstance(ev, PoolEnd) and ev.avail_gib is not None:
            rf = get(ev.rank)
            if ev.role == "target":
                rf.pool_end = ev.avail_gib
                rf.lines["pool_end"] = ev.line
            else:
                rf.draft_pool_end = ev.avail_gib
                rf.lines["draft_pool_end"] = ev.line
            rf.readings.append((ev.line, ev.avail_gib, f"{'draft ' if ev.role == 'draft' else ''}Memory pool end"))
        elif isinstance(ev, GraphBegin):
            rf = get(ev.rank)
            if ev.avail_gib is not None:
                rf.graph_begin.setdefault(ev.name, ev.avail_gib)
                rf.lines.setdefault(f"begin {ev.name}", ev.line)
                rf.readings.append((ev.line, ev.avail_gib, f"before {ev.name} graphs"))
        elif isinstance(ev, GraphEnd):
            rf = get(ev.rank)
            usage = ev.usage_gib
            if usage is None and ev.avail_gib is not None and ev.name in rf.graph_begin:
                usage = rf.graph_begin[ev.name] - ev.avail_gib
            if usage is not None:
                rf.graph_usage[ev.name] = rf.graph_usage.get(ev.name, 0.0) + usage
                rf.lines[f"graphs_{ev.name.replace(' ', '_')}"] = ev.line
            if ev.avail_gib is not None:
                rf.readings.append((ev.line, ev.avail_gib, f"after {ev.name} graphs"))
    return facts


# ----------------------------------------------------------------------------------------------------------
# era rules


def _min_interval(values: list[Interval]) -> Interval | None:
    if not values:
        return None
    return Interval(min(v.lo for v in values), min(v.hi for v in values))


@dataclass(frozen=True)
class _Rule:
    name: str
    lo: Version
    hi: Version | None
    headroom: bool = False  # 0.4.4-0.5.6: target tokens += reqs*(steps*topk + draft_tokens) + 100
    inflate: str | None = None  # "ratio" (0.5.14-0.5.17) or "int" (0.5.18+): cell grows by draft layers


_SPEC_RULES = (
    _Rule("<=0.4.3: draft sized apart, target unchanged", (0, 1, 0), (0, 4, 3)),
    _Rule("0.4.4-0.5.6: EAGLE headroom added to the target's tokens", (0, 4, 4), (0, 5, 6), headroom=True),
    _Rule("0.5.7-0.5.13: no headroom; draft comes out of the reserve", (0, 5, 7), (0, 5, 13)),
    _Rule("0.5.14-0.5.17: draft weights loaded first, cell x (1 + L_draft/L_target)", (0, 5, 14), (0, 5, 17),
          inflate="ratio"),
    _Rule("0.5.18+: draft weights loaded first, cell + int(cell x L_draft/L_target)", (0, 5, 18), None,
          inflate="int"),
)
_PLAIN_RULE = _Rule("formula", (0, 1, 0), None)


def _rules(era: VersionRange, spec: bool) -> list[_Rule]:
    if not spec:
        return [_PLAIN_RULE]
    found = [r for r in _SPEC_RULES if era.overlaps(r.lo, r.hi)]
    # newest first: a log whose era is open-ended is most likely recent
    return list(reversed(found)) or [_PLAIN_RULE]


# ----------------------------------------------------------------------------------------------------------
# bytes per token


@dataclass(frozen=True)
class CellSize:
    profile: int  # what profile_max_num_token divides by (before any draft inflation)
    pool: int  # bytes per token the pool tensors really hold
    buffers: tuple[int, ...]  # per-layer tensor bytes per token (for allocator rounding)
    description: str


def _elt(dtype: str | None) -> float | None:
    if not dtype:
        return None
    key = dtype.replace("torch.", "").lower()
    return DTYPE_BYTES.get(key)


def cell_size(geom: ModelGeometry, era: VersionRange, attn_tp: int, kv_elt: float, pp: int = 1) -> CellSize:
    """SGLang's ``cell_size`` (bytes per token per rank), per era. Reference: docs/how-it-works.md
    section "Bytes per token"; upstream ``get_cell_size_per_token`` / ``pool_configurator.py``."""
    layers = geom.num_layers
    if geom.is_mamba_hybrid and geom.full_attention_layers:
        layers = geom.full_attention_layers  # 0.5.2+: only full-attention layers hold a KV cache
    if pp > 1:
        layers = math.ceil(layers / pp)
    new_mha = era.lo >= (0, 5, 7)  # H*(hd+vhd)*L*elt from 0.5.7; H*hd*L*2*elt before
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        if kv_elt == 0.5:
            profile = (d * layers) // 2 + (d // 16) * layers
            pool_d = profile // layers
        else:
            profile = int(d * layers * kv_elt)
            pool_d = int(d * kv_elt)
            if geom.index_head_dim and kv_elt == 1 and era.lo >= (0, 5, 9):
                pool_d = geom.kv_lora_rank + geom.kv_lora_rank // 128 * 4 + geom.qk_rope_head_dim * 2  # type: ignore
                if era.lo >= (0, 5, 17):
                    profile = pool_d * layers
        extra = 0
        if geom.index_head_dim and not era.hi or (geom.index_head_dim and era.hi and era.hi >= (0, 5, 4)):
            ihd = geom.index_head_dim
            extra = (ihd + ihd // 128 * 4) * layers
        desc = f"MLA ({geom.kv_lora_rank} + {geom.qk_rope_head_dim}) x {layers} layers x {kv_elt:g} B"
        if extra:
            desc += f" + indexer {extra // layers} B x {layers}"
        return CellSize(profile + extra, pool_d * layers + extra, tuple([pool_d + extra // layers] * layers), desc)
    kv_heads = geom.num_kv_heads or 1
    h = max(1, kv_heads // max(1, attn_tp))
    hd = geom.head_dim or 0
    vhd = geom.v_head_dim or hd
    k_bytes = h * hd * kv_elt
    v_bytes = h * vhd * kv_elt
    if kv_elt == 0.5:
        base = h * (hd + vhd) * layers
        profile = base // 2 + (h * hd * layers * 2) // 16
    elif new_mha:
        profile = int(h * (hd + vhd) * layers * kv_elt)
    else:
        profile = int(h * hd * layers * 2 * kv_elt)
    split = f"{kv_heads} KV heads / attention-TP {attn_tp}" if attn_tp > 1 else f"{kv_heads} KV heads"
    if kv_heads < attn_tp:
        split += " (replicated: 1 per rank)"
    desc = f"MHA/GQA {h} head(s) ({split}) x ({hd} + {vhd}) x {layers} layers x {kv_elt:g} B"
    buffers = tuple([int(k_bytes)] * layers + [int(v_bytes)] * layers)
    return CellSize(profile, int((k_bytes + v_bytes) * layers), buffers, desc)


def _rounding_bytes(buffers: tuple[int, ...], rows: int) -> int:
    total = 0
    for per_token in buffers:
        b = per_token * rows
        total += -(-b // ALLOC_ROUND) * ALLOC_ROUND - b
    return total


# ----------------------------------------------------------------------------------------------------------
# the audit


@dataclass
class _Context:
    startup: Startup
    opts: AuditOptions
    args: dict[str, Any]
    facts: dict[Rank, _RankFacts]
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


def _context(startup: Startup, opts: AuditOptions) -> _Context:
    args = dict(startup.server_args or {})
    facts = _gather(startup)
    notes: list[str] = []
    algo = args.get("speculative_algorithm")
    spec_algo = None if algo in NO_SPEC else str(algo)
    draft_seen = any(
        getattr(e, "role", "target") == "draft" for e in startup.events
    )
    if spec_algo is None and draft_seen:
        spec_algo = "unknown (draft worker lines seen)"
    tags_tp = {r.sort_key[1] for r in facts} if facts else set()
    tp = opts.tp_size or _as_int(args.get("tp_size")) or (max(tags_tp) + 1 if tags_tp else 1)
    if opts.tp_size and args.get("tp_size") and opts.tp_size != _as_int(args.get("tp_size")):
        notes.append(f"--tp-size {opts.tp_size} overrides the log's tp_size={args.get('tp_size')}")
    dp = _as_int(args.get("dp_size")) or 1
    attn_tp = tp // dp if (args.get("enable_dp_attention") and dp > 1 and tp % dp == 0) else tp
    pp = _as_int(args.get("pp_size")) or (max((r.sort_key[0] for r in facts), default=0) + 1)
    page_size = _as_int(args.get("page_size")) or 1
    summaries = startup.of(SchedulerSummary)
    kv_dtype, kv_elt = _kv_dtype(startup, args, opts, facts)
    return _Context(startup, opts, args, facts, startup.era, spec_algo, tp, attn_tp, pp,
                    page_size, kv_dtype, kv_elt, summaries[-1] if summaries else None, notes)


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _as_float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _kv_dtype(startup: Startup, args: dict[str, Any], opts: AuditOptions,
              facts: dict[Rank, _RankFacts]) -> tuple[str | None, float | None]:
    """KV element type, most specific source first: what-if override, the KV line's dtype (0.5.13+), the
    'Using KV cache dtype' line (0.5.3-0.5.12), server_args, the checkpoint's FP8 KV quant (0.5.3+), and
    'auto' = the model dtype (from 'Load weight end ... dtype=' or the config; fp32 runs as 16-bit)."""
    if opts.kv_cache_dtype and opts.kv_cache_dtype != "auto":
        return opts.kv_cache_dtype, _elt(opts.kv_cache_dtype)
    for rf in facts.values():
        for kv in rf.kv:
            if kv.dtype and _elt(kv.dtype):
                return kv.dtype, _elt(kv.dtype)
    for ev in startup.of(KVDtype):
        if _elt(ev.dtype):
            return ev.dtype, _elt(ev.dtype)
    arg = args.get("kv_cache_dtype")
    if isinstance(arg, str) and arg != "auto" and _elt(arg) and opts.kv_cache_dtype != "auto":
        return arg, _elt(arg)
    geom: ModelGeometry | None = opts.model_geometry
    if geom is not None and geom.kv_cache_quant_algo and geom.kv_cache_quant_algo.upper() == "FP8" \
            and startup.era.overlaps((0, 5, 3), None):
        return "fp8_e4m3 (checkpoint kv_cache_quant_algo)", 1
    for ev in startup.of(WeightEnd):
        if ev.role == "target" and ev.dtype and _elt(ev.dtype):
            elt = _elt(ev.dtype)
            return ev.dtype, 2 if elt == 4 else elt
    if geom is not None and geom.torch_dtype:
        elt = geom.dtype_bytes
        return f"auto ({geom.torch_dtype})", 2 if elt == 4 else elt
    return None, None


def _cell(ctx: _Context) -> tuple[CellSize | None, str | None]:
    geom: ModelGeometry | None = ctx.opts.model_geometry
    if geom is None or ctx.kv_elt is None:
        return None, None
    if geom.is_hybrid_swa:
        return None, "hybrid sliding-window model: per-pool split not modelled; checked in bytes instead"
    return cell_size(geom, ctx.era, ctx.attn_tp, ctx.kv_elt, ctx.pp), None


def _logged_tokens(ctx: _Context) -> int | None:
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


def _pad_rows(era: VersionRange, page_size: int) -> int:
    """Extra rows the pool allocates beyond #tokens: ``page_size`` (0.4.5+), 1 before ("padded slot 0")."""
    return page_size if era.lo >= (0, 4, 5) else 1


def _kv_line_cell(ctx: _Context, tokens: int | None) -> tuple[Interval | None, float | None]:
    """Bytes per token implied by the target KV line(s): size / (tokens + padding rows), as an interval."""
    sizes = []
    comps = 0
    for rf in sorted(ctx.facts.values(), key=lambda r: r.rank):
        if rf.kv_total is not None:
            sizes.append(rf.kv_total)
            comps = rf.kv_components
            break
    if not sizes or not tokens:
        return None, None
    rows = tokens + _pad_rows(ctx.era, ctx.page_size)
    total = Interval(sizes[0] - comps * LOG_HALF_ULP, sizes[0] + comps * LOG_HALF_ULP)
    if total.lo <= 0:  # a size that rounds to 0.00 bounds nothing below: no usable bytes per token
        return None, None
    cell = Interval(total.lo * GIB / rows, total.hi * GIB / rows)
    return cell, sizes[0] * GIB / rows


def _request_table(ctx: _Context, tokens: int | None, context_len: int | None) -> tuple[int | None, str]:
    """req_to_token: rows x (context_len + extra) x int32 (``ReqToTokenPool``, srt/mem_cache/memory_pool.py).
    Rows: max_num_reqs (+1 in 0.4.0-0.4.8); max_num_reqs = --max-running-requests when given, else
    clamp(tokens / context_len * 512, 2048, 4096). Extra: 4 (+ speculative_num_draft_tokens from 0.5.1)."""
    if not context_len:
        return None, "context length unknown"
    reqs = _as_int(ctx.args.get("max_running_requests"))
    how = "--max-running-requests"
    if reqs is None and ctx.spec_algo is not None and ctx.era.overlaps((0, 4, 5), (0, 5, 18)):
        reqs, how = 48, "48 (speculative decoding default)"
    if reqs is None and tokens:
        upper = 5120 if ctx.era.hi is not None and ctx.era.hi <= (0, 3, 0) else 4096
        reqs = max(2048, min(upper, int(tokens / context_len * 512)))
        how = "default clamp(tokens/context_len*512, 2048, 4096)"
    if reqs is None:
        return None, "max_running_requests unknown"
    rows = reqs + 1 if ctx.era.within((0, 4, 0), (0, 4, 8)) else reqs
    extra = 4
    if ctx.spec_algo is not None and ctx.era.lo >= (0, 5, 1):
        extra += _as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
    nbytes = rows * (context_len + extra) * 4
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND, f"{rows} rows ({how}) x ({context_len:,} + {extra}) x 4 B"


def _context_len(ctx: _Context) -> int | None:
    if ctx.opts.context_length:
        return ctx.opts.context_length
    if ctx.summary is not None and ctx.summary.context_len:
        return ctx.summary.context_len
    v = _as_int(ctx.args.get("context_length"))
    if v:
        return v
    geom: ModelGeometry | None = ctx.opts.model_geometry
    return geom.max_position_embeddings if geom else None


@dataclass(frozen=True)
class _Prediction:
    tokens: TokenInterval
    rule: _Rule
    headroom: int | None
    cell: Interval


def _predict(ctx: _Context, rule: _Rule, T: Interval, post: Interval, mfs: float, cell: Interval,
             mamba: Interval | None, draft_layers: int | None, target_layers: int | None) -> _Prediction:
    reserve = T.scale(1 - mfs)
    rest = post - reserve
    if mamba is not None and ctx.era.overlaps((0, 5, 2), None):
        rest = rest - mamba
    c = cell
    if rule.inflate and draft_layers and target_layers:
        ratio = draft_layers / target_layers
        if rule.inflate == "ratio":
            c = Interval(c.lo * (1 + ratio), c.hi * (1 + ratio))
        else:
            c = Interval(c.lo + int(c.lo * ratio), c.hi + int(c.hi * ratio))
    lo = math.floor(rest.lo * GIB / c.hi)
    hi = math.floor(rest.hi * GIB / c.lo)
    headroom = None
    if rule.headroom:
        reqs = _as_int(ctx.args.get("max_running_requests")) or 48
        steps = _as_int(ctx.args.get("speculative_num_steps")) or 0
        topk = _as_int(ctx.args.get("speculative_eagle_topk")) or 1
        draft_tokens = _as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
        headroom = reqs * (steps * topk) + reqs * draft_tokens + 100
        lo, hi = lo + headroom, hi + headroom
    if ctx.page_size > 1 and ctx.era.overlaps((0, 4, 4), None):
        lo, hi = lo // ctx.page_size * ctx.page_size, hi // ctx.page_size * ctx.page_size
    cap = _as_int(ctx.args.get("max_total_tokens"))
    if cap:
        lo, hi = min(lo, cap), min(hi, cap)
    return _Prediction(TokenInterval(lo, hi), rule, headroom, c)


def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    ctx = _context(startup, opts)
    th = opts.thresholds
    findings: list[Finding] = []
    facts = ctx.facts
    ranks = sorted(facts)

    # --- T and post (min over ranks) --------------------------------------------------------------------
    pres = [rf.pre for rf in facts.values() if rf.pre is not None]
    posts = [rf.post for rf in facts.values() if rf.post is not None]
    T = _min_interval(pres)
    post = _min_interval(posts)
    pre_source = next((rf.pre_source for rf in facts.values() if rf.pre_source), None)
    if T is not None and len(pres) < len(ranks):
        ctx.notes.append(f"T is the minimum over the {len(pres)} of {len(ranks)} ranks whose lines are in the log")

    # --- mem_fraction_static ---------------------------------------------------------------------------
    mfs = _as_float(ctx.args.get("mem_fraction_static"))
    mfs_source = "server_args" if mfs is not None else None
    if opts.mem_fraction_static is not None:
        if mfs is not None and abs(mfs - opts.mem_fraction_static) > 1e-9:
            ctx.notes.append(f"--mem-fraction-static {opts.mem_fraction_static} overrides server_args' {mfs}")
        mfs, mfs_source = opts.mem_fraction_static, "cli"
    adjust = startup.of(MfsAdjust)
    if adjust and mfs_source != "cli":
        mfs, mfs_source = adjust[-1].mem_fraction_static, "log (multimodal reduction)"
    if mfs is not None and str(ctx.args.get("attention_backend")) == "aiter" and mfs_source != "cli":
        ctx_len = _context_len(ctx)
        if ctx_len and ctx_len > 8192 and ctx.era.overlaps((0, 4, 9), None):
            ctx.notes.append(f"aiter backend with context {ctx_len:,} > 8192: SGLang uses {mfs} x 0.85")
            mfs, mfs_source = round(mfs * 0.85, 6), f"{mfs_source} x 0.85 (aiter)"

    # --- bytes per token -------------------------------------------------------------------------------
    logged = _logged_tokens(ctx)
    geom: ModelGeometry | None = opts.model_geometry
    cell, cell_note = _cell(ctx)
    line_cell, line_cell_mid = _kv_line_cell(ctx, logged)
    bpt_source = None
    cell_iv: Interval | None = None
    if cell is not None:
        cell_iv, bpt_source = Interval.exact(cell.profile), "config"
        if line_cell is not None and not opts.hypothetical and not line_cell.contains(cell.pool, slack=0.5):
            implied = line_cell_mid or 0
            findings.append(F.geometry_mismatch(cell.pool, implied, geom.source if geom else "config"))
            cell_iv, bpt_source = line_cell, "kv_line (config disagrees)"
    elif line_cell is not None:
        cell_iv, bpt_source = line_cell, "kv_line"
        if cell_note:
            ctx.notes.append(cell_note)
    elif cell_note:
        ctx.notes.append(cell_note)

    mamba = None
    mamba_vals = [sum(p.gib or 0 for p in rf.other_pools if p.kind == "mamba") for rf in facts.values()]
    if any(mamba_vals):
        n_parts = max((len(p.detail) for rf in facts.values() for p in rf.other_pools if p.kind == "mamba"), default=1)
        m = max(mamba_vals)
        mamba = Interval(m - n_parts * LOG_HALF_ULP, m + n_parts * LOG_HALF_ULP)

    draft_layers, target_layers = None, None
    if geom is not None:
        target_layers = geom.num_layers
        draft_layers = geom.num_nextn_predict_layers or 1

    # --- infer mfs when nothing gives it ----------------------------------------------------------------
    capped = _as_int(ctx.args.get("max_total_tokens")) == logged or bool(startup.of(CapWarning))
    if mfs is None and not capped and T is not None and post is not None and logged and cell_iv is not None:
        rest_mid = logged * cell_iv.mid / GIB
        inferred = 1 - (post.mid - rest_mid) / T.mid
        if 0 < inferred < 1:
            mfs, mfs_source = round(inferred, 4), "inferred"
            findings.append(F.mfs_inferred(mfs))

    # --- T solved from the tokens when the log lacks it -------------------------------------------------
    if T is None and mfs is not None and mfs < 1 and post is not None and logged and cell_iv is not None:
        rest_mid = logged * cell_iv.mid / GIB
        t_mid = (post.mid - rest_mid) / (1 - mfs)
        T = Interval(t_mid - 0.01, t_mid + 0.01)
        pre_source = "solved from the logged tokens (no 'Load weight begin' line)"

    reserve = T.scale(1 - mfs) if (T is not None and mfs is not None) else None
    rest = (post - reserve) if (post is not None and reserve is not None) else None

    # --- prediction and verdict -------------------------------------------------------------------------
    prediction: _Prediction | None = None
    verdict, reason = Verdict.UNKNOWN, ""
    eff_mfs = None
    missing = [name for name, v in (("T (pre-load free memory)", T), ("free memory after weights", post),
                                    ("mem_fraction_static", mfs), ("bytes per token", cell_iv),
                                    ("the KV pool's token count", logged)) if v is None]
    cap = _as_int(ctx.args.get("max_total_tokens"))
    if missing:
        reason = "cannot check: the log lacks " + ", ".join(missing)
    elif mfs_source == "inferred":
        reason = ("mem_fraction_static was inferred from these same numbers, so the token count cannot be "
                  "checked independently; pass --mem-fraction-static to check it")
    elif pre_source and pre_source.startswith("solved"):
        reason = "T was solved from the token count, so the token count cannot be checked independently"
    else:
        assert T is not None and post is not None and mfs is not None and cell_iv is not None and logged
        rules = _rules(ctx.era, ctx.spec_algo is not None)
        preds = [_predict(ctx, r, T, post, mfs, cell_iv, mamba, draft_layers, target_layers) for r in rules]
        hit = next((p for p in preds if p.tokens.contains(logged)), None)
        if hit is not None:
            prediction, verdict = hit, Verdict.MATCH
            reason = f"{logged:,} tokens lie in the predicted interval {hit.tokens.low:,}..{hit.tokens.high:,}"
        else:
            prediction = preds[0]
            verdict, reason, eff_mfs = _explain_mismatch(ctx, prediction, logged, T, post, mfs, cell_iv, cap)
    if cap and logged is not None and logged == cap:
        findings.append(F.tokens_capped(cap, prediction.tokens if prediction else None))
    for ev in startup.of(CapWarning):
        if ev.profiled < 0:
            findings.append(F.not_enough_memory(f"profiled value {ev.profiled}", ev.line, {"profiled": ev.profiled}))

    formula = Formula(
        mem_fraction_static=mfs,
        mem_fraction_static_source=mfs_source,
        pre_load_free_gib=_r(T.mid) if T else None,
        pre_load_free_source=pre_source,
        post_load_free_gib=_r(post.mid) if post else None,
        reserve_gib=_r(reserve.mid, 4) if reserve else None,
        rest_gib=_r(rest.mid, 4) if rest else None,
        bytes_per_token=(cell.profile if (cell is not None and bpt_source == "config")
                         else (round(cell_iv.mid) if cell_iv else None)),
        bytes_per_token_source=bpt_source,
        predicted_tokens=prediction.tokens if prediction else None,
        logged_tokens=logged,
        verdict=verdict,
        verdict_reason=reason,
        rule=prediction.rule.name if prediction else None,
        effective_mem_fraction_static=eff_mfs,
        page_size=ctx.page_size,
        max_total_tokens_cap=cap,
        speculative_headroom_tokens=prediction.headroom if prediction else None,
        kv_bytes_per_token_logged=round(line_cell_mid, 1) if line_cell_mid else None,
    )
    if verdict == Verdict.MATCH:
        findings.append(F.tokens_match(formula))
    elif verdict in (Verdict.MISMATCH, Verdict.EXPLAINED):
        findings.append(F.tokens_mismatch(formula, verdict))

    # --- ledger -----------------------------------------------------------------------------------------
    ctx_len = _context_len(ctx)
    req_bytes, req_how = _request_table(ctx, logged, ctx_len)
    ledgers = tuple(
        _ledger(i, facts[r], ctx, cell, logged, req_bytes, req_how, rank0=(i == 0))
        for i, r in enumerate(ranks)
    )
    findings.extend(_ledger_findings(ctx, ledgers, formula, reserve, th))
    findings.extend(_failure_findings(ctx))
    hicache = startup.of(HiCacheHost)
    hicache_gb = hicache[0].host_gb if hicache else None
    if hicache_gb is not None:
        findings.append(F.hicache_host(hicache_gb, logged, cell.pool if cell else None,
                                       _as_float(ctx.args.get("hicache_ratio"))))
    if ctx.summary is None and not any(f.severity == Severity.ERROR for f in findings):
        findings.append(F.incomplete_log(startup.last_line))

    return Audit(
        engine=ENGINE,
        source=opts.source,
        startup_index=startup.index,
        startups_total=startups_total,
        first_line=startup.first_line,
        last_line=startup.last_line,
        engine_version=str(ctx.era) if ctx.era.evidence else "unknown",
        version_evidence=tuple(dict.fromkeys(ctx.era.evidence)),
        model=_model_summary(ctx, geom),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=ctx.spec_algo,
        hicache_host_gb=hicache_gb,
        notes=tuple(ctx.notes),
        engine_display="SGLang",
        formula_text="rest = post - (1 - mfs) x T;  tokens = floor(rest x 2^30 / bytes per token)",
        formula_rows=_formula_rows(formula),
        pre_load_label="free before loading",
    )


def _formula_rows(f: Formula) -> tuple[FormulaRow, ...]:
    return (
        FormulaRow("T (free before weights, min over ranks)", f.pre_load_free_gib, "GiB", f.pre_load_free_source or ""),
        FormulaRow("post (free after weights, min)", f.post_load_free_gib, "GiB",
                   "Load weight end" if f.post_load_free_gib else ""),
        FormulaRow("mem_fraction_static", f.mem_fraction_static, "", f.mem_fraction_static_source or ""),
        FormulaRow("reserve = (1 - mfs) x T", f.reserve_gib, "GiB"),
        FormulaRow("rest = post - reserve", f.rest_gib, "GiB", "the KV budget"),
    )


def _r(x: float, nd: int = 2) -> float:
    return round(x, nd)


def _model_summary(ctx: _Context, geom: ModelGeometry | None) -> ModelSummary:
    types = [e.model_type for e in ctx.startup.of(WeightEnd) if e.role == "target" and e.model_type]
    if geom is None:
        kvs = [kv for rf in ctx.facts.values() for kv in rf.kv]
        attention = "mla" if any(k.kv_gib is not None for k in kvs) else ("mha" if kvs else "unknown")
        return ModelSummary(types[0] if types else None, attention, None, None, None, None, ctx.kv_dtype,
                            ctx.kv_elt, ctx.attn_tp, None)
    per_rank = None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // max(1, ctx.attn_tp))
    return ModelSummary(geom.architecture or (types[0] if types else None), "mla" if geom.is_mla else "mha",
                        geom.num_layers, geom.num_kv_heads, per_rank, geom.head_dim, ctx.kv_dtype, ctx.kv_elt,
                        ctx.attn_tp, geom.source)


def _explain_mismatch(ctx: _Context, pred: _Prediction, logged: int, T: Interval, post: Interval, mfs: float,
                      cell: Interval, cap: int | None) -> tuple[Verdict, str, float | None]:
    """Solve for the mem_fraction_static the logged tokens imply, then name the known causes that fit."""
    base = logged - (pred.headroom or 0)
    rest_needed = base * pred.cell.mid / GIB
    eff = 1 - (post.mid - rest_needed) / T.mid
    eff_r = round(eff, 4)
    lo, hi = pred.tokens.low, pred.tokens.high
    side = "fewer" if logged < lo else "more"
    gap = (lo - logged) if logged < lo else (logged - hi)
    msg = (f"{logged:,} tokens is {gap:,} {side} than the predicted {lo:,}..{hi:,}; "
           f"the logged count implies mem_fraction_static = {eff_r}")
    causes = []
    if cap and logged <= cap and logged < lo:
        return Verdict.EXPLAINED, msg + f"; --max-total-tokens {cap:,} caps it", eff_r
    if abs(eff - mfs * 0.85) < 0.002:
        causes.append("aiter attention backend (x0.85 when context > 8192)")
    for k in (0.90, 0.95):
        if abs(eff - mfs * k) < 0.002:
            causes.append(f"the multimodal reduction (x{k:.2f}, SGLang <= 0.4.8)")
    if ctx.spec_algo is not None:
        reqs = _as_int(ctx.args.get("max_running_requests")) or 48
        steps = _as_int(ctx.args.get("speculative_num_steps")) or 0
        topk = _as_int(ctx.args.get("speculative_eagle_topk")) or 1
        nd = _as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
        head = reqs * steps * topk + reqs * nd + 100
        if pred.headroom is None and abs(logged - hi - head) <= (hi - lo) + 1:
            causes.append(f"EAGLE headroom of {head:,} tokens (SGLang 0.4.4-0.5.6)")
    if ctx.opts.gpu_capacity_gib:
        t_eff = (post.mid - rest_needed) / (1 - mfs)
        if abs(t_eff - ctx.opts.gpu_capacity_gib) < 0.05:
            causes.append("T taken as the card's capacity instead of free memory (a fork or patched build)")
    if logged < lo:
        causes.append("memory taken by another process between the two measurements, or a smaller reserve "
                      "than the version rules assume")
    if causes and not causes[-1].startswith("memory taken"):
        return Verdict.EXPLAINED, msg + "; fits: " + "; ".join(causes), eff_r
    return Verdict.MISMATCH, msg + ("; possible: " + "; ".join(causes) if causes else ""), eff_r


def _ledger(index: int, rf: _RankFacts, ctx: _Context, cell: CellSize | None, tokens: int | None,
            req_bytes: int | None, req_how: str, rank0: bool) -> RankLedger:
    """Items in the order they took memory. Logged sizes where the log has them, modelled ones (request
    table, allocator rounding) from the formula, differences between two readings where nothing is printed
    (attention-backend buffers). ``unexplained`` = T on this rank - every item - free at the end."""
    items: list[LedgerItem] = []
    unmodelled: list[str] = []
    pad = _pad_rows(ctx.era, ctx.page_size)
    if ctx.opts.gpu_capacity_gib is not None and rf.pre is not None:
        items.append(LedgerItem("before_t", "CUDA context, NCCL, other processes (before T)",
                                _r(ctx.opts.gpu_capacity_gib - rf.pre.mid, 3), "derived"))
    if rf.weights is not None:
        items.append(LedgerItem("weights", "weights", rf.weights, "log", line=rf.lines.get("weights")))
    elif rf.pre is not None and rf.post is not None:
        items.append(LedgerItem("weights", "weights (before - after)", _r(rf.pre.mid - rf.post.mid, 3), "derived",
                                line=rf.lines.get("weights")))

    kv_logged = rf.kv_total
    kv_exact = None
    if cell is not None and tokens is not None and kv_logged is not None:
        kv_exact = (tokens + pad) * cell.pool / GIB
        if abs(kv_exact - kv_logged) > LOG_HALF_ULP * max(1, rf.kv_components) + 0.001:
            kv_exact = None  # the config disagrees with this rank's line: trust the log
    if kv_logged is not None:
        items.append(LedgerItem("kv_cache", "KV cache (target)", _r(kv_exact, 4) if kv_exact else kv_logged,
                                "model" if kv_exact else "log", line=rf.lines.get("kv_cache")))
    for pool in rf.other_pools:
        items.append(LedgerItem(f"pool_{pool.kind}", f"{pool.kind} pool", pool.gib, "log", line=pool.line))
    kv_line = rf.lines.get("kv_cache")
    if rf.kv:
        if req_bytes is not None:
            items.append(LedgerItem("request_table", f"request table ({req_how})", _r(req_bytes / GIB, 4),
                                    "model", in_reserve=True, line=kv_line))
        else:
            unmodelled.append(f"request table ({req_how})")
        if kv_exact is not None and cell is not None and tokens is not None:
            rounding = _rounding_bytes(cell.buffers, tokens + pad)
            freelist = -(-(tokens + pad) * 8 // ALLOC_ROUND) * ALLOC_ROUND
            items.append(LedgerItem("allocator_rounding", "allocator rounding (2 MiB segments) + token free list",
                                    _r((rounding + freelist) / GIB, 4), "model", in_reserve=True, line=kv_line))
        else:
            unmodelled.append("allocator rounding (needs --model-config)")

    # Memory pool end -> first target graph capture: attention-backend workspaces (nothing logs their size)
    first_graph = rf.graph_begin.get("target decode", rf.graph_begin.get("target prefill"))
    if rf.pool_end is not None and first_graph is not None:
        begin_line = rf.lines.get("begin target decode", rf.lines.get("begin target prefill"))
        items.append(LedgerItem("attention_backend", "attention backend buffers (pool end -> graph begin)",
                                _r(rf.pool_end - first_graph, 3), "derived", in_reserve=True, line=begin_line))
    for name in sorted(n for n in rf.graph_usage if not n.startswith("draft")):
        key = f"graphs_{name.replace(' ', '_')}"
        items.append(LedgerItem(key, f"CUDA graphs ({name})", _r(rf.graph_usage[name], 3), "log", in_reserve=True,
                                line=rf.lines.get(key)))
    if rf.draft_weights is not None:
        # 0.5.14+ loads the draft before sizing the pool, so its weights sit inside the mfs budget
        items.append(LedgerItem("draft_weights", "draft weights", rf.draft_weights, "log",
                                in_reserve=not ctx.era.lo >= (0, 5, 14), line=rf.lines.get("draft_weights")))
    dkv = [k.total_gib for k in rf.draft_kv if k.total_gib is not None]
    if dkv:
        items.append(LedgerItem("draft_kv_cache", "draft KV cache", _r(sum(dkv), 3), "log", in_reserve=True,
                                line=rf.lines.get("draft_kv_cache")))
        if rf.draft_pool_end is not None and rf.draft_post is not None:
            overhead = _r(rf.draft_post - rf.draft_pool_end - sum(dkv), 3)
            if overhead:
                items.append(LedgerItem("draft_pool_overhead", "draft pool overhead", overhead, "derived",
                                        in_reserve=True, line=rf.lines.get("draft_pool_end")))
    for name in sorted(n for n in rf.graph_usage if n.startswith("draft")):
        key = f"graphs_{name.replace(' ', '_')}"
        items.append(LedgerItem(key, f"CUDA graphs ({name})", _r(rf.graph_usage[name], 3), "log", in_reserve=True,
                                line=rf.lines.get(key)))

    # free at the end of startup: the scheduler summary (rank 0 prints it), else this rank's last reading
    end, end_source, final, end_line = None, None, False, 0
    if rank0 and ctx.summary is not None and ctx.summary.available_gpu_mem_gib is not None:
        end, end_source, final = ctx.summary.available_gpu_mem_gib, "scheduler summary (available_gpu_mem)", True
        end_line = ctx.summary.line
    elif rf.readings:
        end_line, end, what = max(rf.readings)
        end_source = f"last reading: {what}, line {end_line}"
        final = ctx.summary is not None and what.startswith("after") and what.endswith("graphs")
    unexplained = tol = None
    if rf.pre is not None and end is not None:
        # only what happened before the end reading; an excerpt may cut a rank's later lines
        counted = [it for it in items if it.gib is not None and it.key != "before_t"
                   and (it.line is None or it.line <= end_line)]
        tol = _r(LOG_HALF_ULP * (sum(1 for it in counted if it.source != "model") + 1) + rf.pre.width / 2, 3)
        unexplained = _r(rf.pre.mid - sum(it.gib for it in counted) - end, 3)  # type: ignore[misc]
    return RankLedger(
        rank=index,
        label=rf.rank.display,
        pre_load_free_gib=_r(rf.pre.mid) if rf.pre else None,
        weights_gib=next((it.gib for it in items if it.key == "weights"), None),
        kv_gib=kv_logged,
        free_after_weights_gib=_r(rf.post.mid) if rf.post else None,
        free_after_pool_gib=rf.pool_end,
        free_at_end_gib=end,
        free_at_end_source=end_source,
        end_is_final=final,
        items=tuple(items),
        unexplained_gib=unexplained,
        unexplained_tolerance_gib=tol,
        unmodelled=tuple(unmodelled),
    )


def _ledger_findings(ctx: _Context, ledgers: tuple[RankLedger, ...], formula: Formula, reserve: Interval | None,
                     th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    # rank imbalance: the formula sizes every rank by the smallest T and post
    worst = None
    for what, attr in (("free memory before the weights (T)", "pre_load_free_gib"),
                       ("free memory after the weights", "free_after_weights_gib")):
        vals = [(l.label, getattr(l, attr)) for l in ledgers if getattr(l, attr) is not None]
        if len(vals) < 2:
            continue
        lo, hi = min(vals, key=lambda x: x[1]), max(vals, key=lambda x: x[1])
        spread = hi[1] - lo[1]
        if spread > max(th.rank_imbalance_gib, th.rank_imbalance_fraction * hi[1]) and (
                worst is None or spread > worst[3]):
            worst = (what, lo, hi, spread)
    if worst is not None:
        out.append(F.rank_imbalance(*worst, formula.bytes_per_token))

    # does the static reserve explain the memory free after the pool?
    if reserve is not None and formula.mem_fraction_static_source != "inferred":
        explained = []
        for l in ledgers:
            if l.free_after_pool_gib is None or l.free_after_weights_gib is None or l.kv_gib is None:
                continue
            req = _gib(l, "request_table")
            rnd = _gib(l, "allocator_rounding")
            pools = sum(it.gib or 0 for it in l.items if it.key == "kv_cache" or it.key.startswith("pool_"))
            expected = l.free_after_weights_gib - pools - req - rnd
            tol = th.reserve_tolerance_gib + (0.0 if l.item("allocator_rounding") else 0.08)
            if abs(l.free_after_pool_gib - expected) <= tol:
                explained.append(l)
        if explained:
            l = min(explained, key=lambda x: x.free_after_pool_gib or 0)
            out.append(F.reserve_explains_free(l, reserve.mid, formula, _gib(l, "request_table"),
                                               _gib(l, "allocator_rounding"), [x.label for x in explained],
                                               len(ledgers)))

    off = [l for l in ledgers if l.unexplained_gib is not None
           and abs(l.unexplained_gib) > th.unexplained_gib + (l.unexplained_tolerance_gib or 0)]
    if off:
        out.append(F.unexplained(off))

    # memory idle at the end of startup (or after the pool, when the log stops before the end)
    for l in ledgers:
        t = l.pre_load_free_gib
        idle = l.free_at_end_gib if l.end_is_final else l.free_after_pool_gib
        if t and idle is not None and idle >= max(th.unused_min_gib, th.unused_fraction * t):
            extra = int(idle * GIB / formula.bytes_per_token) if formula.bytes_per_token else None
            out.append(F.unused_memory(l, idle, t, formula, extra, l.end_is_final))
            break
    low = [l for l in ledgers if l.end_is_final and l.free_at_end_gib is not None
           and l.free_at_end_gib < th.low_headroom_gib]
    if low:
        out.append(F.low_headroom(min(low, key=lambda x: x.free_at_end_gib or 0), th.low_headroom_gib))
    return out


def _gib(l: RankLedger, key: str) -> float:
    it = l.item(key)
    return (it.gib or 0.0) if it else 0.0


def _failure_findings(ctx: _Context) -> list[Finding]:
    out: list[Finding] = []
    failures = ctx.startup.of(Failure)
    seen: set[str] = set()
    for f in failures:
        if f.kind in ("not_enough_memory", "no_kv_memory", "host_memory"):
            key = f.kind
            if key not in seen:
                seen.add(key)
                out.append(F.not_enough_memory(f.message, f.line, f.numbers))
        elif f.kind == "unbalanced":
            if "unbalanced" not in seen:
                seen.add("unbalanced")
                out.append(F.engine_unbalanced(f.line, f.numbers))
    fatal = [f for f in failures if f.kind in ("traceback", "exception", "oom", "pool_too_small",
                                                 "not_enough_memory", "no_kv_memory", "unbalanced")]
    if fatal and ctx.summary is None:
        first = fatal[0]
        detail = next((f.message for f in fatal if f.kind in ("exception", "oom", "not_enough_memory",
                                                               "no_kv_memory")), first.message)
        out.append(F.startup_failed(first.line, detail))
    return out


# ----------------------------------------------------------------------------------------------------------
# what-if


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    """Rerun the formula with changed inputs; say what the reserve would still cover."""
    new_opts = replace(new_opts, hypothetical=True)
    after = reconcile(startup, new_opts)
    changes: dict[str, Any] = {}
    for name in ("mem_fraction_static", "kv_cache_dtype", "tp_size", "context_length"):
        new = getattr(new_opts, name)
        if new is not None and new != getattr(opts, name):
            changes[name] = new
    explanation: list[str] = []
    f0, f1 = base.formula, after.formula
    tokens_after = None
    if f1.rest_gib is not None and f1.bytes_per_token:
        ctx = _context(startup, new_opts)
        T = Interval(f1.pre_load_free_gib - LOG_HALF_ULP, f1.pre_load_free_gib + LOG_HALF_ULP)  # type: ignore
        post = Interval.logged(f1.post_load_free_gib)  # type: ignore[arg-type]
        if "tp_size" in changes and base.formula.post_load_free_gib is not None and ctx.tp:
            old_tp = _context(startup, opts).tp
            w = max((l.weights_gib or 0) for l in base.ranks) if base.ranks else 0
            new_w = w * old_tp / ctx.tp
            post = Interval(post.lo + w - new_w, post.hi + w - new_w)
            explanation.append(f"weights per GPU scale with TP: {w:.2f} -> {new_w:.2f} GiB (approximation)")
        rules = _rules(ctx.era, ctx.spec_algo is not None)
        cell = Interval.exact(f1.bytes_per_token)
        pred = _predict(ctx, rules[0], T, post, f1.mem_fraction_static or 0, cell, None,
                        None, None)
        tokens_after = pred.tokens
    tokens_before = f0.logged_tokens
    kv_before = max((l.kv_gib or 0) for l in base.ranks) if base.ranks else None
    kv_after = None
    if tokens_after is not None and f1.bytes_per_token:
        kv_after = round(tokens_after.low * f1.bytes_per_token / GIB, 2)
    # what came out of the reserve in this startup, and the same items at the new token count
    ratio = (tokens_after.low / tokens_before) if (tokens_after and tokens_before) else 1.0
    worst = min(base.ranks, key=lambda l: l.free_at_end_gib if l.free_at_end_gib is not None else 1e9,
                default=None)
    needs_before = needs_after = None
    if worst is not None:
        needs_before = needs_after = 0.0
        for it in worst.items:
            if not it.in_reserve or it.gib is None:
                continue
            g = it.gib
            needs_before += g
            if it.key in ("draft_kv_cache", "allocator_rounding"):
                g *= ratio
            elif it.key == "request_table" and ("context_length" in changes or ratio != 1.0):
                g = _scaled_request_table(startup, new_opts, tokens_after.low if tokens_after else None) or g
            needs_after += g
        needs_before, needs_after = round(needs_before, 3), round(needs_after, 3)
    headroom_before = worst.free_at_end_gib if worst else None
    headroom_after = None
    risk = "unknown"
    r0, r1 = f0.reserve_gib, f1.reserve_gib
    if None not in (r0, r1, needs_before, needs_after, headroom_before):
        # what neither the items nor the final reading account for stays as it was (rounding, small buffers)
        slack = r0 - needs_before - headroom_before  # type: ignore[operator]
        headroom_after = round(r1 - needs_after - slack, 2)  # type: ignore[operator]
        if headroom_after < 0:
            risk = "oom"
        elif headroom_after < opts.thresholds.low_headroom_gib or headroom_after < 0.5 * headroom_before:  # type: ignore[operator]
            risk = "low"
        else:
            risk = "ok"
        explanation.append(
            f"at this startup graphs, draft, request table and rounding took {needs_before:.2f} GiB of the "
            f"{r0:.2f} GiB reserve and left {headroom_before:.2f} GiB for activations on {worst.label}")  # type: ignore[union-attr]
    return WhatIf(changes, tokens_before, tokens_after, kv_before, kv_after, r0, r1, needs_before, needs_after,
                  headroom_before, headroom_after, risk, tuple(explanation + list(after.notes)))


def _scaled_request_table(startup: Startup, opts: AuditOptions, tokens: int | None) -> float | None:
    ctx = _context(startup, opts)
    b, _ = _request_table(ctx, tokens, _context_len(ctx))
    return b / GIB if b is not None else None
