"""TensorRT-LLM's KV-cache budget and the per-GPU ledger. Pure functions over parsed startups.

PyTorch backend (``tensorrt_llm/_torch/pyexecutor/_util.py::KvCacheCreator.configure_kv_cache_capacity``,
1.0+; earlier ``estimate_max_tokens``): a temporary KV cache sized for the profiling requests is allocated, the
dummy requests run (autotuner, CUDA-graph warmup), then

    peak      = torch peak + memory outside torch      (NCCL, CUDA graphs, the temporary KV, other processes)
    available = (device total - peak + temporary KV) x free_gpu_memory_fraction     ((total - peak) x f, <=0.19)
    available = min(available, max_tokens x bytes/token, max_gpu_total_bytes)       (when configured)
    max_tokens = floor(available / bytes per token); the C++ pool rounds it up to whole blocks
                 (``Number of tokens per block``): tokens = ceil(max_tokens / block) x block

C++ runtime / TensorRT engine (``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``, ``calculateMaxNumBlocks``):
``available`` = free + the memory pool's free bytes after the engine, context, buffers and decoder are
allocated ("Memory usage when calculating max tokens in paged kv cache: total: T GiB, available: A GiB"), and
``primary = A x fraction`` (``kDefaultGpuMemFraction`` 0.9), then the same token and block arithmetic, the
minimum over ranks (MPI allreduce).

Unlike SGLang (fraction of the free memory before the weights) and vLLM (fraction of the total), the fraction
here applies to what is **free after profiling**: everything else is already spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvaudit.model_config import DTYPE_BYTES, ModelGeometry
from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.trtllm import Cap, Failure, KVAllocation, Reading, WindowNote, WindowPool
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
    TokenInterval,
    Verdict,
    WhatIf,
)
from kvaudit.units import GIB, LOG_HALF_ULP

ENGINE = "trtllm"
DEFAULT_FRACTION = 0.9  # KvCacheConfig / executor::KvCacheConfig default
BUDGET_TOLERANCE_GIB = 0.02  # three logged 2-decimal values through a fraction below 1


@dataclass
class _Rank:
    rank: Rank
    r: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    allocations: list[KVAllocation] = field(default_factory=list)


def _gather(startup: Startup) -> dict[Rank, _Rank]:
    out: dict[Rank, _Rank] = {}
    for e in startup.events:
        if isinstance(e, Reading):
            rr = out.setdefault(e.rank, _Rank(e.rank))
            rr.r[e.key] = e.value
            rr.lines[e.key] = e.line
        elif isinstance(e, KVAllocation):
            out.setdefault(e.rank, _Rank(e.rank)).allocations.append(e)
    return out


def _final_allocation(rr: _Rank) -> KVAllocation | None:
    """The pool the server runs with: on the PyTorch path the allocation after the peak line (the one before
    it is the temporary profiling cache); otherwise the last one."""
    if not rr.allocations:
        return None
    peak_line = rr.lines.get("peak_gib")
    if peak_line is not None:
        after = [a for a in rr.allocations if a.line > peak_line]
        return after[-1] if after else None
    return rr.allocations[-1]


def cell_size(geom: ModelGeometry, tp: int, elt: float) -> tuple[int, str]:
    """``KVCacheManager.get_cache_bytes_per_token``: kv_factor x sum over layers of ceil(kv_heads / tp) x head_dim
    x element bytes; MLA keeps one 576-wide latent (kv_factor 1, one head)."""
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        return int(geom.num_layers * d * elt), f"MLA {d} x {geom.num_layers} layers x {elt:g} B (K only)"
    h = math.ceil((geom.num_kv_heads or 1) / max(1, tp))
    hd = geom.head_dim or 0
    return int(2 * geom.num_layers * h * hd * elt), f"K+V {h} head(s) x {hd} x {geom.num_layers} layers x {elt:g} B"


def _elt(name: str | None) -> float | None:
    if not name:
        return None
    key = name.replace("torch.", "").lower()
    if key.startswith("fp8") or key.startswith("float8"):
        return 1
    if key in ("nvfp4", "fp4"):
        return 0.5 + 1 / 16  # 4-bit values plus one FP8 scale per 16 elements
    return DTYPE_BYTES.get(key)


@dataclass(frozen=True)
class _Budget:
    """What the fraction was applied to, as an interval carried from the logged rounding."""

    free_lo: float
    free_hi: float
    text: str  # how ``free`` was formed
    rule: str


def _budget(r: dict[str, float]) -> _Budget | None:
    if "peak_gib" in r and "total_gib" in r:
        T, P = r["total_gib"], r["peak_gib"]
        tmp = r.get("tmp_kv_gib")
        ulps = 3 if tmp is not None else 2
        free = T - P + (tmp or 0.0)
        text = f"{T:.2f} - {P:.2f}" + (f" + {tmp:.2f}" if tmp is not None else "")
        rule = ("(total - peak + temporary KV) x fraction" if tmp is not None else "(total - peak) x fraction")
        return _Budget(free - ulps * LOG_HALF_ULP, free + ulps * LOG_HALF_ULP, text, rule)
    if "cpp_available_gib" in r:
        A = r["cpp_available_gib"]
        return _Budget(A - LOG_HALF_ULP, A + LOG_HALF_ULP, f"{A:.2f} available", "available x fraction (C++)")
    return None


def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    ranks = _gather(startup)
    notes: list[str] = []
    findings: list[Finding] = []
    th = opts.thresholds
    geom: ModelGeometry | None = opts.model_geometry

    def first(key: str) -> float | None:
        return next((rr.r[key] for rr in ranks.values() if key in rr.r), None)

    # --- settings -------------------------------------------------------------------------------------------
    caps = startup.of(Cap)
    fraction, fraction_source = opts.mem_fraction_static, "cli" if opts.mem_fraction_static is not None else None
    if fraction is None and first("fraction") is not None:
        fraction, fraction_source = first("fraction"), "log"
    if fraction is None:
        both = next((c.fraction for c in caps if c.kind == "both_set" and c.fraction is not None), None)
        if both is not None:
            fraction, fraction_source = both, "log"
    fraction_assumed = fraction is None
    if fraction is None:
        fraction, fraction_source = DEFAULT_FRACTION, "default 0.9 (the log does not state it)"
    block = int(first("tokens_per_block") or 0) or None
    tagged = [r for r in ranks if r.label]
    tp = opts.tp_size or (max(r.sort_key[1] for r in tagged) + 1 if tagged else 1)
    tp_at_least = not opts.tp_size and bool(tagged)
    tp_source = "--tp-size" if opts.tp_size else ("rank tags (at least)" if tagged else "assumed (no rank tags)")
    kv_dtype = opts.kv_cache_dtype
    elt = _elt(kv_dtype) if kv_dtype else None
    kv_assumed = False
    if elt is None:
        model_dtype = (geom.torch_dtype if geom else None) or "bfloat16"
        kv_dtype, elt, kv_assumed = f"auto ({model_dtype}, assumed)", (geom.dtype_bytes if geom else 2) or 2, True

    # --- the pool the server allocated ----------------------------------------------------------------------
    finals = {r: _final_allocation(rr) for r, rr in ranks.items()}
    finals = {r: a for r, a in finals.items() if a is not None}
    final = min(finals.values(), key=lambda a: a.tokens) if finals else None
    logged = final.tokens if final else None
    pool_gib = final.gib if final and final.gib else None
    old_bytes = first("old_kv_bytes")
    if pool_gib is None and old_bytes is not None:
        pool_gib = old_bytes / GIB

    # --- bytes per token ------------------------------------------------------------------------------------
    cell = cell_desc = None
    bpt_source = None
    if geom is not None:
        cell, cell_desc = cell_size(geom, tp, elt)
        bpt_source = "config"
    logged_cell = first("bytes_per_token")
    if logged_cell is not None:
        if cell is not None and abs(cell - logged_cell) > 0.002 * logged_cell:
            findings.append(F.geometry_mismatch(cell, logged_cell, geom.source if geom else "config"))
        cell, bpt_source, cell_desc = int(logged_cell), "log (kv size per token)", None
        if first("fixed_cost_bytes"):
            notes.append(f"the engine adds a fixed cost of {int(first('fixed_cost_bytes')):,} bytes to the "
                         "per-token size (2026 builds); it is not in the token arithmetic here")
    line_cell = None
    if pool_gib and logged:
        line_cell = pool_gib * GIB / logged
        if cell is None:
            cell, bpt_source = int(round(line_cell)), "kv_line"

    # --- the budget and the prediction ----------------------------------------------------------------------
    budgets = {rr.rank.display: b for rr in ranks.values() if (b := _budget(rr.r)) is not None}
    shown = min(budgets.values(), key=lambda b: b.free_lo) if budgets else None  # the engine sizes by the smallest
    available_logged = first("available_gib")
    mm = first("multimodal_gib") or 0.0
    kv_lo = kv_hi = None
    reason = ""
    verdict = Verdict.UNKNOWN
    predicted = None
    eff = None
    rule = shown.rule if shown else None
    if shown is not None:
        lo_free = min(b.free_lo for b in budgets.values())
        hi_free = min(b.free_hi for b in budgets.values())
        kv_lo, kv_hi = lo_free * fraction - mm, hi_free * fraction - mm
        if mm and available_logged is not None:
            # the multimodal encoder reservation comes off the KV budget; whether before or after the fraction
            # is not documented: the logged available memory says which
            before = ((lo_free - mm) * fraction, (hi_free - mm) * fraction)
            if not kv_lo - LOG_HALF_ULP <= available_logged <= kv_hi + LOG_HALF_ULP and \
                    before[0] - LOG_HALF_ULP <= available_logged <= before[1] + LOG_HALF_ULP:
                kv_lo, kv_hi = before
                notes.append(f"the {mm:.2f} GiB multimodal encoder reservation came off before the fraction")
            else:
                notes.append(f"the {mm:.2f} GiB multimodal encoder reservation came off the KV budget after the "
                             "fraction")
        if available_logged is not None:
            if kv_lo - LOG_HALF_ULP - 1e-9 <= available_logged <= kv_hi + LOG_HALF_ULP + 1e-9:
                findings.append(F.budget_reconciles(
                    f"({shown.text}) x {fraction:g}" + (f", less the multimodal reservation {mm:.2f}" if mm else "")
                    + f" = {available_logged:.2f} GiB available for the KV cache", sorted(budgets)))
            else:
                mid = (kv_lo + kv_hi) / 2
                findings.append(F.budget_mismatch(min(budgets, key=lambda k: budgets[k].free_lo),
                                                  available_logged - mid,
                                                  BUDGET_TOLERANCE_GIB, sorted(budgets)))
        elif pool_gib is not None and shown.rule.endswith("(C++)") and logged:
            # the C++ line states no available KV memory: the allocated pool is fraction x available, to within
            # one block of rounding and the pool line's own 0.005
            slack = LOG_HALF_ULP + (pool_gib / logged) * (block or 128)
            if kv_lo - slack <= pool_gib <= kv_hi + slack:
                at = " (the default fraction, which the log does not state)" if fraction_assumed else ""
                findings.append(F.budget_reconciles(
                    f"{shown.text} x {fraction:g}{at} = {(kv_lo + kv_hi) / 2:.2f} GiB, and the pool is {pool_gib:.2f} "
                    "GiB", sorted(budgets)))
    elif available_logged is not None:  # the peak line without the device total: its own rounding only
        kv_lo, kv_hi = available_logged - LOG_HALF_ULP, available_logged + LOG_HALF_ULP
        rule = "the logged available KV memory"
    quota = first("quota_gib")
    if quota is not None:
        notes.append(f"KV cache manager v2: device quota {quota:.2f} GiB")
        kv_lo, kv_hi = (min(kv_lo, quota), min(kv_hi, quota)) if kv_lo is not None else (quota, quota)
    cap_findings: list[Finding] = []
    for c in caps:
        if c.kind in ("max_tokens", "max_gpu_total_bytes") and c.result_gib is not None:
            budget_hi = kv_hi
            kv_lo = min(kv_lo, c.result_gib - LOG_HALF_ULP) if kv_lo is not None else c.result_gib - LOG_HALF_ULP
            kv_hi = min(kv_hi, c.result_gib + LOG_HALF_ULP) if kv_hi is not None else c.result_gib + LOG_HALF_ULP
            if budget_hi is None or c.result_gib < budget_hi - LOG_HALF_ULP:
                cap_findings.append(F.capped_by(c.kind, c.tokens, c.limit_gib, budget_hi))

    windows = {}
    for w in startup.of(WindowPool):
        cur = windows.setdefault(w.window, [None, None])
        cur[0] = w.max_tokens if w.max_tokens is not None else cur[0]
        cur[1] = w.primary_blocks if w.primary_blocks is not None else cur[1]
    spec = first("speculative")
    if len(windows) > 1:
        notes.append("variable sliding-window attention: the pool is split per window size ("
                     + "; ".join(f"window {w:,}: " + ", ".join(x for x in (
                         f"{v[0]:,} max tokens" if v[0] is not None else "",
                         f"{v[1]:,} primary blocks" if v[1] is not None else "") if x)
                         for w, v in sorted(windows.items())) + ")")
    if logged is None:
        reason = "cannot check: the log has no 'Allocated ... for max tokens in paged KV cache (N)' line"
    elif len(windows) > 1:
        reason = ("variable sliding-window attention: BlockManager::calculateWindowSizeToShare splits the budget by "
                  "each window's layers and bytes per token, which the log does not give; the per-window counts "
                  "are in the notes")
    elif spec and bpt_source == "config":
        reason = ("speculative decoding is on: the draft model's KV layers add to the bytes per token, which the "
                  "model config alone does not give (a log with 'kv size' states the total)")
    elif kv_lo is None:
        reason = ("cannot check: the log has neither the profiling peak line nor the C++ 'Memory usage when "
                  "calculating max tokens' line")
    elif bpt_source == "kv_line":
        reason = ("bytes per token were derived from the pool line itself (no --model-config and no 'kv size' in "
                  "the log), so the token count cannot be checked independently")
    elif block is None:
        reason = "the log does not state the tokens per block ('Number of tokens per block')"
    else:
        assert cell is not None
        predicted = TokenInterval(_round_up(math.floor(max(0.0, kv_lo) * GIB / cell), block),
                                  _round_up(math.floor(kv_hi * GIB / cell), block))
        if predicted.low <= logged <= predicted.high:
            verdict = Verdict.MATCH
            reason = (f"{logged:,} tokens = ceil(floor({(kv_lo + kv_hi) / 2:.3f} GiB / {cell:,} B) / {block}) x "
                      f"{block}")
        elif cap_findings and logged < predicted.low:
            verdict = Verdict.EXPLAINED
            reason = f"{logged:,} tokens: the configured cap, not the fraction, sized the pool"
        else:
            verdict = Verdict.MISMATCH
            implied = logged * cell / GIB
            reason = (f"{logged:,} tokens is not what {kv_lo:.2f}..{kv_hi:.2f} GiB holds at {cell:,} B/token "
                      f"({predicted.low:,}..{predicted.high:,}); the count implies {implied:.2f} GiB")
            if shown is not None:
                eff = round((implied + mm) / ((shown.free_lo + shown.free_hi) / 2), 4)
    findings += cap_findings

    # a C++ pool far below the fraction's budget with no cap in the log: probably capped
    if (not cap_findings and verdict != Verdict.MATCH and pool_gib and kv_hi is not None and shown is not None
            and shown.rule.endswith("(C++)") and pool_gib < 0.8 * kv_lo):
        findings.append(F.pool_below_budget(pool_gib, (kv_lo + kv_hi) / 2, fraction,
                                            (shown.free_lo + shown.free_hi) / 2))
        verdict, reason = Verdict.UNKNOWN, (f"the pool ({pool_gib:.2f} GiB) is far below the fraction's budget: "
                                            "a cap the log does not show sized it")

    formula = Formula(
        mem_fraction_static=fraction,
        mem_fraction_static_source=fraction_source,
        pre_load_free_gib=first("total_gib") or first("cpp_total_gib"),
        pre_load_free_source="device total memory" if (first("total_gib") or first("cpp_total_gib")) else None,
        post_load_free_gib=round((shown.free_lo + shown.free_hi) / 2, 3) if shown else None,
        reserve_gib=round((1 - fraction) * (shown.free_lo + shown.free_hi) / 2, 4) if shown else None,
        rest_gib=available_logged if available_logged is not None else (
            round((kv_lo + kv_hi) / 2, 3) if kv_lo is not None else None),
        bytes_per_token=cell,
        bytes_per_token_source=bpt_source,
        predicted_tokens=predicted,
        logged_tokens=logged,
        verdict=verdict,
        verdict_reason=reason,
        rule=rule,
        effective_mem_fraction_static=eff,
        page_size=block,
        max_total_tokens_cap=next((c.tokens for c in caps if c.kind == "max_tokens"), None),
        speculative_headroom_tokens=None,
        kv_bytes_per_token_logged=round(line_cell, 1) if line_cell else None,
    )
    if verdict == Verdict.MATCH:
        budget_text = f"({shown.text}) x {fraction:g}" if shown else "the available KV memory"
        if cap_findings:
            budget_text = f"min({budget_text}, the configured cap)"
        findings.append(F.tokens_match(formula, f"{budget_text} -> floor(/ {cell:,} B) rounded up to blocks of "
                                                f"{block}"))
    elif verdict in (Verdict.MISMATCH, Verdict.EXPLAINED):
        findings.append(F.tokens_mismatch(formula, verdict))

    # --- ledgers and the rest of the findings -------------------------------------------------------------
    ledgers = tuple(_ledger(i, ranks[r], fraction, finals.get(r), mm) for i, r in enumerate(sorted(ranks)))
    findings += _findings(startup, ranks, ledgers, budgets, fraction, cell, logged, pool_gib, th)
    if logged is None and not any(f.severity == Severity.ERROR for f in findings):
        findings.append(F.incomplete_log(startup.last_line, "KV pool line ('Allocated ... for max tokens in paged "
                                                            "KV cache (N)')"))

    est = first("estimated_tokens")
    peak_line = min((rr.lines["peak_gib"] for rr in ranks.values() if "peak_gib" in rr.lines), default=None)
    writeback = [c for c in caps if c.kind == "both_set" and final is not None and c.line < final.line
                 and (peak_line is None or c.line > peak_line)]
    if writeback and logged and block:
        n = writeback[-1].tokens or 0
        notes.append(f"the estimate wrote max_tokens={n:,} back (line {writeback[-1].line}); the C++ pool rounds "
                     f"it up to whole blocks: ceil({n:,} / {block}) x {block} = {_round_up(n, block):,}"
                     + (" = the pool" if _round_up(n, block) == logged else f", but the pool has {logged:,}"))
    elif est is not None:
        notes.append(f"the engine estimated {int(est):,} tokens")
    if fraction_assumed:
        notes.append("free_gpu_memory_fraction is not in the log: the default 0.9 is assumed")
    if tp_at_least:
        notes.append(f"TP size at least {tp}: {tp_source}")
    for w in startup.of(WindowNote)[-1:]:
        notes.append(f"the attention window {w.window:,} was reduced to {w.bound:,} tokens: the pool holds no more "
                     f"(line {w.line})")
    if block is None and first("primary_blocks") and kv_lo is not None:
        per_block = (kv_lo + kv_hi) / 2 / first("primary_blocks")  # type: ignore[operator]
        notes.append(f"{int(first('primary_blocks')):,} primary blocks of about {per_block * 1024:.2f} MiB each "  # type: ignore[arg-type]
                     "(the tokens per block and the model config would give the token count)")

    cpp = shown is not None and shown.rule.endswith("(C++)") or (shown is None and first("peak_gib") is None)
    return Audit(
        engine=ENGINE,
        source=opts.source,
        startup_index=startup.index,
        startups_total=startups_total,
        first_line=startup.first_line,
        last_line=startup.last_line,
        engine_version=str(startup.era) if startup.era.evidence else "unknown",
        version_evidence=tuple(dict.fromkeys(startup.era.evidence)),
        model=ModelSummary(geom.architecture if geom else _model_name(startup.model_path),
                           ("mla" if geom.is_mla else "mha") if geom else "unknown",
                           geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
                           (None if geom.is_mla else math.ceil((geom.num_kv_heads or 1) / tp)) if geom else None,
                           geom.head_dim if geom else None, kv_dtype if (geom or opts.kv_cache_dtype) else None,
                           elt if (geom or opts.kv_cache_dtype) else None, tp, geom.source if geom else None,
                           tp_at_least, tp_source),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=None,
        hicache_host_gb=None,
        notes=tuple(notes + ([f"bytes per token: {cell_desc}"] if cell_desc else [])
                    + (["the KV dtype is assumed (pass --kv-cache-dtype)"] if kv_assumed and bpt_source == "config"
                       else [])),
        engine_display="TensorRT-LLM",
        formula_text=(("KV = available x fraction" if cpp else "KV = (total - peak + temporary KV) x fraction")
                      + ";  tokens = ceil(floor(KV / bytes per token) / block) x block"),
        formula_rows=(
            FormulaRow("device total memory", formula.pre_load_free_gib, "GiB", "the card"),
            FormulaRow("available (free after the engine and buffers)" if cpp
                       else "free after profiling (total - peak + temporary KV)", formula.post_load_free_gib, "GiB",
                       "what the fraction applies to"),
            FormulaRow("free_gpu_memory_fraction", fraction, "", fraction_source or ""),
            FormulaRow("headroom = (1 - fraction) x free", formula.reserve_gib, "GiB", "left outside the KV cache"),
            FormulaRow("available KV cache memory", formula.rest_gib, "GiB", "the KV budget"),
        ),
        pre_load_label="total",
    )


def _model_name(path: str | None) -> str | None:
    """``.../models--openai--gpt-oss-120b/snapshots/<rev>`` -> ``openai/gpt-oss-120b``."""
    if not path:
        return None
    for part in path.split("/"):
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/")
    return path


def _round_up(tokens: int, block: int) -> int:
    return math.ceil(tokens / block) * block


def _ledger(i: int, rr: _Rank, fraction: float, final: KVAllocation | None, mm: float) -> RankLedger:
    r = rr.r
    items: list[LedgerItem] = []

    def add(key: str, label: str, gib: float | None, source: str = "log", in_reserve: bool = False,
            line_key: str | None = None) -> None:
        if gib is not None:
            items.append(LedgerItem(key, label, round(gib, 4), source, in_reserve=in_reserve,
                                    line=rr.lines.get(line_key) if line_key else None))

    kv = final.gib if final and final.gib else (r["old_kv_bytes"] / GIB if "old_kv_bytes" in r else None)
    T = r.get("total_gib") or r.get("cpp_total_gib")
    if "peak_gib" in r:  # PyTorch backend
        weights = r.get("weights_in_torch_gib", r.get("weights_gib"))
        add("weights", "weights (inside torch, after loading)", weights, line_key="weights_in_torch_gib")
        add("activation_peak", "activation peak (inside torch, profiled)", r.get("activation_gib"),
            line_key="activation_gib")
        outside = r.get("outside_torch_gib")
        if outside is not None:
            tmp = r.get("tmp_kv_gib", 0.0)
            add("outside_torch", "outside torch (NCCL, CUDA graphs, CUDA context, other processes; after profiling, "
                "less the temporary KV)", outside - tmp, "derived", line_key="outside_torch_gib")
        elif weights is not None and r.get("activation_gib") is not None:
            add("outside_torch", "outside torch (peak - torch peak)", r["peak_gib"] - weights - r["activation_gib"],
                "derived", line_key="peak_gib")
        add("multimodal_encoder", "multimodal encoder cache (reserved)", mm or None, line_key="multimodal_gib")
        add("kv_cache", "KV cache", kv)
        if T is not None:
            free = T - r["peak_gib"] + r.get("tmp_kv_gib", 0.0)
            left = free - (kv if kv is not None else fraction * free) - mm
            add("headroom", "headroom (free after profiling, less the KV cache: (1 - fraction) x free when no cap "
                "applies)", left, "derived" if kv is not None else "model", in_reserve=True)
    else:  # C++ runtime
        if "engine_gib" in r:
            add("weights", "engine (weights)", r["engine_gib"], line_key="engine_gib")
        else:
            add("weights", "weights", r.get("weights_gib"), line_key="weights_gib")
        add("activation_peak", "execution context (activations, fixed at build)", r.get("context_gib"),
            line_key="context_gib")
        add("runtime_buffers", "runtime buffers", r.get("buffers_gib"), line_key="buffers_gib")
        add("decoder", "decoder", r.get("decoder_gib"), line_key="decoder_gib")
        A = r.get("cpp_available_gib")
        if T is not None and A is not None:
            logged_before = sum(it.gib for it in items if it.gib is not None)
            add("before_kv_other", "other memory before KV sizing (CUDA context, TensorRT workspace, other processes; "
                "not itemised)", (T - A) - logged_before, "derived", line_key="cpp_available_gib")
        add("kv_cache", "KV cache", kv)
        if A is not None:
            add("headroom", "headroom (available less the KV cache: (1 - fraction) x available when no cap applies)",
                A - (kv if kv is not None else fraction * A), "derived" if kv is not None else "model",
                in_reserve=True)
    unexplained = tol = None
    if T is not None and any(it.key == "kv_cache" for it in items) and any(it.key == "headroom" for it in items):
        unexplained = round(T - sum(it.gib for it in items if it.gib is not None), 3)
        tol = round(LOG_HALF_ULP * (len(items) + 1), 3)
    weights_gib = next((it.gib for it in items if it.key == "weights"), None)
    return RankLedger(rank=i, label=rr.rank.display, pre_load_free_gib=T, weights_gib=weights_gib, kv_gib=kv,
                      free_after_weights_gib=None, free_after_pool_gib=None, free_at_end_gib=None,
                      free_at_end_source=None, end_is_final=False, items=tuple(items), unexplained_gib=unexplained,
                      unexplained_tolerance_gib=tol,
                      logged=tuple(sorted({**r, **({"kv_pool_gib": final.gib, "kv_pool_tokens": final.tokens}
                                                   if final else {})}.items())))


def _findings(startup, ranks, ledgers, budgets, fraction, cell, logged, pool_gib, th) -> list[Finding]:
    out: list[Finding] = []
    avail = {rr.rank.display: rr.r["available_gib"] for rr in ranks.values() if "available_gib" in rr.r}
    if not avail:
        avail = {rr.rank.display: rr.r["cpp_available_gib"] for rr in ranks.values() if "cpp_available_gib" in rr.r}
    if len(avail) >= 2:
        lo = min(avail.items(), key=lambda x: x[1])
        hi = max(avail.items(), key=lambda x: x[1])
        if hi[1] - lo[1] > th.rank_imbalance_gib:
            out.append(F.rank_imbalance("available KV cache memory", lo, hi, hi[1] - lo[1], cell))
    for name, b in budgets.items():
        free = (b.free_lo + b.free_hi) / 2
        head = (1 - fraction) * free
        if head < th.low_headroom_gib and logged is not None:
            out.append(F.trtllm_low_headroom(head, fraction, free, th.low_headroom_gib))
            break
    failures = startup.of(Failure)
    quoted: set[int] = set()
    small = next((f for f in failures if f.kind == "too_small"), None)
    if small is not None:
        n = small.numbers
        need = int(n.get("beam_width", 1) * n.get("tokens_per_block", 0) * n.get("blocks_per_sequence", 0))
        have = int(n.get("max_tokens", 0))
        fits: dict[str, float] = {"tokens_needed": need}
        clause = ""
        if need and have:
            per_seq = have // int(n.get("tokens_per_block", 1) or 1) * int(n.get("tokens_per_block", 1) or 1)
            clause = f" -> a pool of at least {need:,} tokens ({need / have:.2f}x this one)"
            fits["max_sequence_length_that_fits"] = per_seq
            if cell:
                extra = (need - have) * cell / GIB
                clause += f", {extra:.2f} GiB more KV memory; or a maximum sequence length of at most {per_seq:,}"
                fits["extra_gib"] = round(extra, 3)
        out.append(F.not_enough_memory(small.message + clause, small.line, {**n, **fits}))
        quoted.add(small.line)
    nofit = next((f for f in failures if f.kind == "no_fit"), None)
    if nofit is not None and small is None:
        out.append(F.not_enough_memory(nofit.message, nofit.line, {}))
        quoted.add(nofit.line)
    for rr in ranks.values():
        k = rr.r.get("available_gib")
        if k is not None and k <= 0 and not quoted:
            out.append(F.not_enough_memory(f"available KV cache memory is {k} GiB on {rr.rank.display}: the profiling "
                                           "peak left nothing for the KV cache", rr.lines.get("available_gib", 0),
                                           {"available_gib": k}))
            break
    executor = next((f for f in failures if f.kind == "executor_failed"), None)
    if executor is not None and "insufficient GPU memory" in executor.message:
        component = next((f.message for f in failures if f.kind == "oom_component"), None)
        total = next((rr.r["oom_total_gib"] for rr in ranks.values() if "oom_total_gib" in rr.r), None)
        free = next((rr.r["oom_free_gib"] for rr in ranks.values() if "oom_free_gib" in rr.r), None)
        detail = ""
        if component:
            detail = f": the {component} could not be created"
            if free is not None and total is not None:
                detail += f" with {free:.2f} GiB free of {total:.2f} GiB"
        out.append(F.not_enough_memory(executor.message.rstrip(".") + detail, executor.line,
                                       {"component": component, "free_gib": free, "total_gib": total}))
        quoted.add(executor.line)
    fatal = [f for f in failures if f.kind not in ("no_blocks", "oom_component")]
    if fatal:
        last = fatal[-1]
        detail = (f"the error quoted in NOT_ENOUGH_MEMORY (line {last.line})" if last.line in quoted
                  else last.message)
        if logged is not None:
            detail += " (after the KV pool was sized)"
        out.append(F.startup_failed(last.line, detail))
    return out


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    """Another free_gpu_memory_fraction scales the KV budget with what was free after profiling; another KV
    dtype rescales bytes per token; a max_tokens caps the pool."""
    f0 = base.formula
    changes = {k: getattr(new_opts, k) for k in ("mem_fraction_static", "kv_cache_dtype", "max_tokens")
               if getattr(new_opts, k, None) is not None and getattr(new_opts, k) != getattr(opts, k, None)}
    free = f0.post_load_free_gib
    if free is None or not f0.bytes_per_token or not f0.page_size:
        return WhatIf(changes, f0.logged_tokens, None, f0.rest_gib, None, f0.reserve_gib, None, None, None, None, None,
                      "unknown", ("the log lacks the profiling peak (or the C++ available memory), bytes per token "
                                  "or the tokens per block",))
    f_old = f0.mem_fraction_static or DEFAULT_FRACTION
    f_new = new_opts.mem_fraction_static or f_old
    cell = f0.bytes_per_token
    explanation: list[str] = []
    if new_opts.kv_cache_dtype:
        new_elt = _elt(new_opts.kv_cache_dtype) or 2
        old_elt = base.model.kv_dtype_bytes or 2
        cell = int(cell * new_elt / old_elt)
        explanation.append(f"KV element {old_elt:g} -> {new_elt:g} B: {f0.bytes_per_token:,} -> {cell:,} B/token")
    kv1 = free * f_new
    tokens = math.floor(kv1 * GIB / cell)
    cap = getattr(new_opts, "max_tokens", None)
    if cap is not None and cap < tokens:
        explanation.append(f"max_tokens {cap:,} caps the {tokens:,} tokens the fraction allows")
        tokens, kv1 = cap, cap * cell / GIB
    tokens = _round_up(tokens, f0.page_size)
    r0, r1 = free * (1 - f_old), free - kv1
    risk = "oom" if r1 < 0 else ("low" if r1 < opts.thresholds.low_headroom_gib else "ok")
    explanation.append(f"KV = {free:.2f} GiB free after profiling x {f_new:g} = {free * f_new:.2f} GiB; the rest "
                       f"({r1:.2f} GiB) stays free")
    return WhatIf(changes, f0.logged_tokens, TokenInterval(tokens, tokens), f0.rest_gib, round(kv1, 2), round(r0, 2),
                  round(r1, 2), 0.0, 0.0, round(r0, 2), round(r1, 2), risk, tuple(explanation))
