"""vLLM's KV-cache budget and the per-GPU ledger. Pure functions over parsed startups.

The budget (per worker; the engine then uses the minimum block count over ranks):

    V0 0.6.5-0.10 (worker/worker.py::determine_num_available_blocks),
    V1 0.9.1+     (v1/worker/gpu_worker.py::determine_available_memory):
        available_kv = total x gpu_memory_utilization - (weights + activation peak + non-torch increase)
                       [- CUDA graph estimate: 0.18+ when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, default 0.20+]
    V0 0.6.4:     available_kv = total x util - (torch peak + non-torch)      (counts other processes)
    blocks = floor(available_kv / (block_size x bytes_per_token));  tokens = blocks x block_size

Unlike SGLang the fraction is of the card's **total** memory, and CUDA graphs captured after the KV cache
come out of the (1 - util) headroom (unless the 0.18+ estimate already took them from the budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvaudit.model_config import DTYPE_BYTES, ModelGeometry
from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.vllm import Blocks, Concurrency, Failure, KVTokens, Reading
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
from kvaudit.units import GIB, LOG_HALF_ULP, Interval

ENGINE = "vllm"
BUDGET_TOLERANCE_GIB = 0.03  # five logged 2-decimal values


@dataclass
class _Rank:
    rank: Rank
    r: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)


def _gather(startup: Startup) -> dict[Rank, _Rank]:
    out: dict[Rank, _Rank] = {}
    for e in startup.of(Reading):
        rr = out.setdefault(e.rank, _Rank(e.rank))
        rr.r[e.key] = e.value
        rr.lines[e.key] = e.line
    return out


def _num(v: Any) -> float | None:
    try:
        return None if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return None


def cell_size(geom: ModelGeometry, tp: int, elt: float, pp: int = 1, split_v: bool = False) -> tuple[int, str]:
    """vLLM bytes per token per GPU: V0 ``CacheEngine.get_cache_block_size`` / V1 ``AttentionSpec.page_size_bytes``
    over all layers. MLA keeps one latent vector (no V); MHA/GQA keeps K and V of max(1, kv_heads // tp) heads."""
    layers = math.ceil(geom.num_layers / max(1, pp))
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        return int(layers * d * elt), f"MLA {d} x {layers} layers x {elt:g} B (no V)"
    h = max(1, (geom.num_kv_heads or 1) // max(1, tp))
    hd = geom.head_dim or 0
    vhd = (geom.v_head_dim or hd) if split_v else hd
    return int(layers * h * (hd + vhd) * elt), f"K+V {h} head(s) x ({hd} + {vhd}) x {layers} layers x {elt:g} B"


def _elt(name: Any) -> float | None:
    if not isinstance(name, str):
        return None
    key = name.replace("torch.", "").lower()
    if key.startswith("fp8"):
        return 1
    return DTYPE_BYTES.get(key)


def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    args = dict(startup.server_args or {})
    ranks = _gather(startup)
    th = opts.thresholds
    notes: list[str] = []
    findings: list[Finding] = []
    era = startup.era
    geom: ModelGeometry | None = opts.model_geometry

    # --- settings ---------------------------------------------------------------------------------------
    util = opts.mem_fraction_static
    util_source = "cli" if util is not None else None
    if util is None:
        util = next((rr.r["util"] for rr in ranks.values() if "util" in rr.r), None)
        util_source = "log" if util is not None else None
    if util is None and _num(args.get("gpu_memory_utilization")) is not None:
        util, util_source = _num(args["gpu_memory_utilization"]), "args"
    block_size = int(_num(args.get("block_size")) or 16)
    tp = opts.tp_size or int(_num(args.get("tensor_parallel_size")) or 0) or max(1, len(
        [r for r in ranks if r.label.startswith("TP") or r.label.startswith("pid")]) or 1)
    pp = int(_num(args.get("pipeline_parallel_size")) or 1)
    kv_dtype = opts.kv_cache_dtype or args.get("kv_cache_dtype") or "auto"
    elt = _elt(kv_dtype) if kv_dtype != "auto" else None
    if elt is None:
        elt = _elt(args.get("dtype")) or (geom.dtype_bytes if geom else None) or 2
        if elt == 4:
            elt = 2  # an fp32 checkpoint runs in 16-bit unless --dtype float32
        kv_dtype = f"auto ({args.get('dtype') or (geom.torch_dtype if geom else 'bf16')})"

    tokens_ev = startup.of(KVTokens)
    blocks_ev = startup.of(Blocks)
    conc_ev = startup.of(Concurrency)
    logged = tokens_ev[-1].tokens if tokens_ev else (min(b.gpu_blocks for b in blocks_ev) * block_size
                                                    if blocks_ev else None)

    # --- the budget per rank ----------------------------------------------------------------------------
    kvs = [rr.r["kv_gib"] for rr in ranks.values() if "kv_gib" in rr.r]
    fixed = [rr.r["kv_bytes_config_gib"] for rr in ranks.values() if "kv_bytes_config_gib" in rr.r]
    if fixed and not kvs:  # --kv-cache-memory-bytes (0.10.2+): the KV size is set, the util budget is skipped
        kvs = fixed
        notes.append(f"--kv-cache-memory-bytes fixed the KV cache at {min(fixed)} GiB: gpu_memory_utilization and "
                     "the profiling budget do not apply")
    K = min(kvs) if kvs else None
    estimate_applied = era.lo >= (0, 20, 0) or any("equiv_util" in rr.r for rr in ranks.values())
    totals = [rr.r["total_gib"] for rr in ranks.values() if "total_gib" in rr.r]
    T = min(totals) if totals else None
    if T is None:  # the 0.20+ equivalence note recovers total from the estimate: est = (util - equiv) x total
        def first(key: str) -> float | None:  # workers log these lines independently; ranks are alike
            return next((rr.r[key] for rr in ranks.values() if key in rr.r), None)

        est, u_note, equiv = first("graph_estimate_gib"), first("util"), first("equiv_util")
        if None not in (est, u_note, equiv) and u_note > equiv:  # type: ignore[operator]
            T = est / (u_note - equiv)  # type: ignore[operator]
            notes.append(f"total GPU memory ~{T:.1f} GiB recovered from the CUDA-graph note: estimate {est} GiB = "
                         f"({u_note} - {equiv}) x total (approximate: the estimate is rounded to 0.01 GiB)")
    residuals: dict[str, float] = {}
    for rr in (ranks.values() if not fixed else ()):
        res = _budget_residual(rr.r, util, estimate_applied)
        if res is not None:
            residuals[rr.rank.display] = res

    # --- bytes per token --------------------------------------------------------------------------------
    cell = cell_desc = None
    bpt_source = None
    if geom is not None:
        cell, cell_desc = cell_size(geom, tp, elt, pp, split_v=era.lo >= (0, 14, 0))
        bpt_source = "config"
    line_cell = None
    if K is not None and logged and K - LOG_HALF_ULP > 0:  # a KV memory that rounds to ~0 bounds nothing below
        line_cell = Interval((K - LOG_HALF_ULP) * GIB / logged, (K + LOG_HALF_ULP) * GIB / logged)
    if cell is not None and line_cell is not None and not line_cell.contains(cell, slack=cell * 0.002 + block_size):
        if K is not None and K > 0 and logged * cell > (K + LOG_HALF_ULP) * GIB:
            findings.append(F.geometry_mismatch(cell, line_cell.mid, geom.source if geom else "config"))
            cell, bpt_source = int(line_cell.mid), "kv_line (config disagrees)"
    if cell is None and line_cell is not None:
        cell, bpt_source = int(round(line_cell.mid)), "kv_line"

    # --- prediction -------------------------------------------------------------------------------------
    predicted = None
    verdict, reason = Verdict.UNKNOWN, ""
    eff = None
    if K is None or logged is None:
        reason = "cannot check: the log lacks " + " and ".join(
            x for x, v in (("the available KV memory", K), ("the KV token or block count", logged)) if v is None)
    elif bpt_source != "config":
        reason = ("bytes per token were derived from this same line (no --model-config), so the token count "
                  "cannot be checked independently")
    else:
        assert cell is not None
        lo_b = math.floor(max(0.0, K - LOG_HALF_ULP) * GIB / (cell * block_size))
        hi_b = math.floor((K + LOG_HALF_ULP) * GIB / (cell * block_size))
        predicted = TokenInterval(lo_b * block_size, hi_b * block_size)
        # V1 >= 0.21 reports int(concurrency x max_model_len), not blocks x block_size: allow one block
        slack = block_size if era.hi is None or era.hi >= (0, 21, 0) else 0
        if predicted.low - slack <= logged <= predicted.high + slack:
            verdict = Verdict.MATCH
            reason = f"{logged:,} tokens = floor({K} GiB / ({cell:,} B x {block_size})) blocks x {block_size}"
        else:
            verdict = Verdict.MISMATCH
            implied = logged * cell / GIB
            reason = (f"{logged:,} tokens is not what {K} GiB of KV memory holds at {cell:,} B/token "
                      f"({predicted.low:,}..{predicted.high:,}); the count implies {implied:.2f} GiB")
            if T and util:
                eff = round(util - (K - implied) / T, 4)

    formula = Formula(
        mem_fraction_static=util,
        mem_fraction_static_source=util_source,
        pre_load_free_gib=round(T, 2) if T is not None else None,
        pre_load_free_source="total GPU memory (vLLM's fraction is of the total)" if T is not None else None,
        post_load_free_gib=None,
        reserve_gib=round(T * (1 - util), 4) if (T is not None and util is not None) else None,
        rest_gib=K,
        bytes_per_token=cell,
        bytes_per_token_source=bpt_source,
        predicted_tokens=predicted,
        logged_tokens=logged,
        verdict=verdict,
        verdict_reason=reason,
        rule=_rule(era, estimate_applied),
        effective_mem_fraction_static=eff,
        page_size=block_size,
        max_total_tokens_cap=None,
        speculative_headroom_tokens=None,
        kv_bytes_per_token_logged=round(line_cell.mid, 1) if line_cell else None,
    )
    if verdict == Verdict.MATCH:
        findings.append(F.tokens_match(formula, f"floor(available KV {K} GiB / ({cell:,} B x block {block_size})) "
                                                f"x {block_size}"))
    elif verdict == Verdict.MISMATCH:
        findings.append(F.tokens_mismatch(formula, verdict))

    # --- ledgers and findings ---------------------------------------------------------------------------
    ordered = sorted(ranks)
    ledgers = tuple(_ledger(i, ranks[r], util, estimate_applied) for i, r in enumerate(ordered))
    findings += _findings(startup, ranks, ledgers, residuals, util, T, K, cell, logged, conc_ev, estimate_applied, th)
    if not tokens_ev and not blocks_ev and not any(f.severity == Severity.ERROR for f in findings):
        findings.append(F.incomplete_log(startup.last_line, "KV cache size line (GPU KV cache size / # GPU blocks)"))

    arch = args.get("model") or (geom.architecture if geom else None)
    return Audit(
        engine=ENGINE,
        source=opts.source,
        startup_index=startup.index,
        startups_total=startups_total,
        first_line=startup.first_line,
        last_line=startup.last_line,
        engine_version=str(era) if era.evidence else "unknown",
        version_evidence=tuple(dict.fromkeys(era.evidence)),
        model=ModelSummary(str(arch) if arch else None, ("mla" if geom.is_mla else "mha") if geom else "unknown",
                           geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
                           (None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // tp)) if geom else None,
                           geom.head_dim if geom else None, kv_dtype, elt, tp, geom.source if geom else None),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=None,
        hicache_host_gb=None,
        notes=tuple(notes + ([f"bytes per token: {cell_desc}"] if cell_desc else [])),
        engine_display="vLLM",
        formula_text=("KV = total x util - (weights + activation peak + non-torch);  "
                      "tokens = floor(KV / (bytes per token x block)) x block"),
        formula_rows=(
            FormulaRow("total GPU memory", formula.pre_load_free_gib, "GiB", "the fraction applies to the total"),
            FormulaRow("gpu_memory_utilization", util, "", util_source or ""),
            FormulaRow("headroom = (1 - util) x total", formula.reserve_gib, "GiB", "outside the budget"),
            FormulaRow("available KV cache memory (min)", K, "GiB", "the KV budget"),
        ),
        pre_load_label="total",
    )


def _rule(era, estimate_applied: bool) -> str:
    if era.hi is not None and era.hi <= (0, 6, 4) and era.lo >= (0, 6, 4):
        return "0.6.4: total x util - (torch peak + non-torch)"
    base = "total x util - (weights + activation peak + non-torch)"
    return base + (" - CUDA graph estimate (0.18+)" if estimate_applied else "")


def _budget_residual(r: dict[str, float], util: float | None, estimate_applied: bool) -> float | None:
    if "kv_gib" not in r:
        return None
    requested = r.get("requested_gib")
    if requested is None and "total_gib" in r and util is not None:
        requested = r["total_gib"] * util
    if requested is None:
        return None
    if "peak_torch_gib" in r and "non_torch_gib" in r:  # 0.6.4
        return requested - r["peak_torch_gib"] - r["non_torch_gib"] - r["kv_gib"]
    if not {"weights_gib", "non_torch_gib", "activation_gib"} <= set(r):
        return None
    est = r.get("graph_estimate_gib", 0.0) if estimate_applied else 0.0
    return requested - r["weights_gib"] - r["non_torch_gib"] - r["activation_gib"] - r["kv_gib"] - est


def _ledger(i: int, rr: _Rank, util: float | None, estimate_applied: bool) -> RankLedger:
    r = rr.r
    items: list[LedgerItem] = []
    T = r.get("total_gib")
    for key, label, name in (("weights_gib", "weights", "weights"), ("activation_gib", "activation peak", "activation_peak"),
                             ("non_torch_gib", "non-torch memory (CUDA context, NCCL, other)", "non_torch"),
                             ("kv_gib", "KV cache", "kv_cache")):
        if key in r and not (key == "weights_gib" and "peak_torch_gib" in r):
            items.append(LedgerItem(name, label, r[key], "log", line=rr.lines.get(key)))
    if "peak_torch_gib" in r:
        items.insert(0, LedgerItem("torch_peak", "torch peak (weights + activations)", r["peak_torch_gib"], "log",
                                   line=rr.lines.get("peak_torch_gib")))
    est = r.get("graph_estimate_gib")
    if est is not None and estimate_applied:
        items.append(LedgerItem("graphs_target_estimate", "CUDA graph estimate (taken from the budget)", est, "log",
                                line=rr.lines.get("graph_estimate_gib")))
    graphs = r.get("graph_gib")
    if graphs is not None and not (estimate_applied and est is not None):
        items.append(LedgerItem("graphs_target_decode", "CUDA graphs (captured after the KV cache)", graphs, "log",
                                in_reserve=True, line=rr.lines.get("graph_gib")))
    unexplained = tol = None
    free_end = None
    if T is not None and util is not None:
        headroom = T * (1 - util) - (graphs if (graphs is not None and not (estimate_applied and est is not None)) else 0)
        items.append(LedgerItem("headroom", "headroom outside the budget ((1 - util) x total, less graphs)",
                                round(headroom, 3), "model", in_reserve=True))
        if any(it.key == "kv_cache" for it in items):
            unexplained = round(T - sum(it.gib for it in items if it.gib is not None), 3)
            tol = round(LOG_HALF_ULP * (len(items) + 1), 3)
    return RankLedger(
        rank=i, label=rr.rank.display, pre_load_free_gib=T, weights_gib=r.get("weights_gib"), kv_gib=r.get("kv_gib"),
        free_after_weights_gib=None, free_after_pool_gib=None, free_at_end_gib=free_end, free_at_end_source=None,
        end_is_final=False, items=tuple(items), unexplained_gib=unexplained, unexplained_tolerance_gib=tol,
    )


def _findings(startup, ranks, ledgers, residuals, util, T, K, cell, logged, conc_ev, estimate_applied, th) -> list[Finding]:
    out: list[Finding] = []
    if residuals:
        bad = {k: v for k, v in residuals.items() if abs(v) > BUDGET_TOLERANCE_GIB}
        shown = next(rr for rr in ranks.values() if rr.rank.display in residuals)
        parts = shown.r
        if bad:
            worst = max(bad, key=lambda k: abs(bad[k]))
            out.append(F.budget_mismatch(worst, bad[worst], BUDGET_TOLERANCE_GIB, list(bad)))
        else:
            out.append(F.budget_reconciles(parts, util, estimate_applied, list(residuals)))
    for rr in ranks.values():
        nt, tot = rr.r.get("non_torch_gib"), rr.r.get("total_gib") or T
        if nt is not None and tot and nt > max(2.0, 0.05 * tot):
            out.append(F.non_torch_high(rr.rank.display, nt, tot))
            break
    kv_by_rank = {rr.rank.display: rr.r["kv_gib"] for rr in ranks.values() if "kv_gib" in rr.r}
    if len(kv_by_rank) >= 2:
        lo = min(kv_by_rank.items(), key=lambda x: x[1])
        hi = max(kv_by_rank.items(), key=lambda x: x[1])
        if hi[1] - lo[1] > max(th.rank_imbalance_gib, th.rank_imbalance_fraction * (T or hi[1])):
            out.append(F.rank_imbalance("available KV cache memory", lo, hi, hi[1] - lo[1], cell))
    if K is not None and K <= 0:
        out.append(F.not_enough_memory(f"available KV cache memory is {K} GiB: weights, activations and non-torch "
                                       "memory exceed total x gpu_memory_utilization", 0, {"kv_gib": K}))
    for rr in ranks.values():
        est, act = rr.r.get("graph_estimate_gib"), rr.r.get("graph_gib")
        if est is not None and act is not None and est > 1.5 * act + 0.25:
            out.append(F.graph_estimate_high(rr.rank.display, est, act, cell))
            break
    if T is not None and util is not None:
        graphs = max((rr.r.get("graph_gib", 0.0) for rr in ranks.values()), default=0.0)
        head = T * (1 - util) - (0.0 if estimate_applied else graphs)
        if head < th.low_headroom_gib:
            out.append(F.vllm_low_headroom(head, util, T, graphs, th.low_headroom_gib))
    if conc_ev and logged:
        c = conc_ev[-1]
        implied = logged / c.max_model_len if c.max_model_len else None
        if implied is not None and abs(implied - c.factor) > 0.006 + implied * 0.001:
            out.append(F.concurrency_mismatch(logged, c.max_model_len, c.factor, implied))
    failures = startup.of(Failure)
    for f in failures:
        if f.kind in ("no_kv_memory", "kv_needed", "max_len", "free_memory"):
            out.append(F.not_enough_memory(f.message, f.line, f.numbers))
            break
    fatal = [f for f in failures if f.kind in ("engine_failed", "oom", "profiling", "no_kv_memory", "kv_needed",
                                                "max_len", "free_memory")]
    if fatal and logged is None:
        out.append(F.startup_failed(fatal[0].line, fatal[-1].message))
    return out


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    """vLLM: a new gpu_memory_utilization moves the budget by (new - old) x total, one for one."""
    f0 = base.formula
    changes = {k: getattr(new_opts, k) for k in ("mem_fraction_static", "kv_cache_dtype", "tp_size", "context_length")
               if getattr(new_opts, k) is not None and getattr(new_opts, k) != getattr(opts, k)}
    explanation: list[str] = []
    if f0.pre_load_free_gib is None or f0.mem_fraction_static is None or f0.rest_gib is None or not f0.bytes_per_token:
        return WhatIf(changes, f0.logged_tokens, None, f0.rest_gib, None, f0.reserve_gib, None, None, None, None, None,
                      "unknown", ("the log lacks total memory, the utilisation or the available KV memory",))
    T, u0 = f0.pre_load_free_gib, f0.mem_fraction_static
    u1 = new_opts.mem_fraction_static or u0
    cell = f0.bytes_per_token
    if new_opts.kv_cache_dtype and opts.model_geometry is not None:
        new_elt = _elt(new_opts.kv_cache_dtype) or 2
        old_elt = base.model.kv_dtype_bytes or 2
        cell = int(cell * new_elt / old_elt)
        explanation.append(f"KV element {old_elt:g} -> {new_elt:g} B: {f0.bytes_per_token:,} -> {cell:,} B/token")
    kv1 = f0.rest_gib + (u1 - u0) * T
    bs = f0.page_size or 16
    tokens = math.floor(kv1 * GIB / (cell * bs)) * bs if kv1 > 0 else 0
    graphs = max((l.item("graphs_target_decode").gib or 0 for l in base.ranks if l.item("graphs_target_decode")),
                 default=0.0)
    r0, r1 = T * (1 - u0), T * (1 - u1)
    h0, h1 = r0 - graphs, r1 - graphs
    risk = "oom" if (h1 < 0 or kv1 <= 0) else ("low" if h1 < opts.thresholds.low_headroom_gib else "ok")
    explanation.append(f"the budget moves by ({u1} - {u0}) x {T:.2f} GiB = {(u1 - u0) * T:+.2f} GiB; CUDA graphs "
                       f"({graphs:.2f} GiB) live in the (1 - util) headroom")
    return WhatIf(changes, f0.logged_tokens, TokenInterval(tokens, tokens), f0.rest_gib, round(max(kv1, 0), 2),
                  round(r0, 2), round(r1, 2), round(graphs, 3), round(graphs, 3), round(h0, 2), round(h1, 2), risk,
                  tuple(explanation))
