"""One vLLM startup, reconciled: the settings, each worker's budget, the predicted pool, the ledger and the
findings, assembled into an :class:`Audit`."""

from __future__ import annotations

from kvaudit.parse.vllm import AutoFit, Blocks, Concurrency, KVTokens
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import (
    Audit,
    AuditOptions,
    Finding,
    Formula,
    FormulaRow,
    ModelSummary,
    Severity,
    Verdict,
    startup_identity,
)
from kvaudit.reconcile.vllm.cell import HybridPool, cell_size, hybrid_pool
from kvaudit.reconcile.vllm.checks import (
    budget_findings,
    concurrency_findings,
    failure_findings,
    graph_findings,
    suggestion_findings,
    headroom_findings,
    rank_findings,
)
from kvaudit.reconcile.values import as_int
from kvaudit.reconcile.vllm.context import Context, build_context
from kvaudit.reconcile.vllm.facts import first
from kvaudit.reconcile.vllm.formula import (
    Budget,
    Prediction,
    block_interval,
    budget,
    estimate_applied,
    hybrid_interval,
    rule_text,
)
from kvaudit.reconcile.vllm.ledger import rank_ledger
from kvaudit.units import GIB, LOG_HALF_ULP, Interval

ENGINE = "vllm"


def reconcile(startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    ctx = build_context(startup, opts)
    notes = ctx.notes
    findings: list[Finding] = []
    facts = ctx.facts
    applied = estimate_applied(ctx)

    # --- the logged pool ----------------------------------------------------------------------------------
    tokens_ev = startup.of(KVTokens)
    blocks_ev = startup.of(Blocks)
    if tokens_ev:
        per_dp = {}
        for e in tokens_ev:
            per_dp[e.dp] = e  # the last line of each data-parallel engine
        logged_ev = min(per_dp.values(), key=lambda e: e.tokens)
        logged: int | None = logged_ev.tokens
        if len(per_dp) > 1:
            notes.append(f"{len(per_dp)} data-parallel engines logged their own pool; the smallest is checked")
    else:
        logged_ev = None
        logged = min(b.gpu_blocks for b in blocks_ev) * ctx.block_size if blocks_ev else None

    # --- the budget per worker ----------------------------------------------------------------------------
    kvs = {rr.rank.display: rr.r["kv_gib"] for rr in facts.values() if "kv_gib" in rr.r}
    fixed = [rr.r["kv_bytes_config_gib"] for rr in facts.values() if "kv_bytes_config_gib" in rr.r]
    if fixed and not kvs:  # --kv-cache-memory-bytes (0.10.2+): the KV size is set, the util budget is skipped
        kvs = {"all": min(fixed)}
        notes.append(f"--kv-cache-memory-bytes fixed the KV cache at {min(fixed)} GiB: gpu_memory_utilization and "
                     "the profiling budget do not apply")
    K = min(kvs.values()) if kvs else None
    totals = [rr.r["total_gib"] for rr in facts.values() if "total_gib" in rr.r]
    T = min(totals) if totals else None
    # each worker's budget is its own (its card's total, its own usage); the pool follows the smallest budget,
    # so the formula shows the total of the worker that set it, not another card's (LMCache#503: 95.22 / 95.00)
    setter = next((rr for rr in facts.values() if "kv_gib" in rr.r and K is not None and rr.r["kv_gib"] == K
                   and "total_gib" in rr.r), None)
    if setter is not None:
        T = setter.r["total_gib"]
    T_note = None
    if T is None:
        est, u_note, equiv = first(facts, "graph_estimate_gib"), first(facts, "util"), first(facts, "equiv_util")
        if None not in (est, u_note, equiv) and u_note > equiv:  # type: ignore[operator]
            T_note = est / (u_note - equiv)  # type: ignore[operator]
            notes.append(f"total GPU memory ~{T_note:.1f} GiB recovered from the CUDA-graph note: estimate {est} GiB = "
                         f"({u_note} - {equiv}) x total (approximate: the estimate is rounded to 0.01 GiB)")
    peers = list(facts.values())
    budgets: list[Budget] = []
    if not fixed:
        for rr in facts.values():
            b = budget(rr, ctx, T or T_note, peers)
            if b is not None:
                budgets.append(b)
    for rr in facts.values():
        if "external_weights_gib" in rr.r:
            notes.append(f"{rr.rank.display}: {rr.r['external_weights_gib']:.2f} GiB of weights are held by another "
                         f"process (0.32+): of the {rr.r.get('budget_gib', 0):.2f} GiB budget, "
                         f"{rr.r.get('engine_budget_gib', 0):.2f} GiB remained for the engine")
            break

    # --- bytes per token ------------------------------------------------------------------------------------
    geom = ctx.geom
    pool: HybridPool | None = None
    cell = None
    cell_desc = None
    bpt_source = None
    tp_fit_note = None
    if geom is not None:
        pool = hybrid_pool(geom, ctx.tp, ctx.kv_elt, ctx.block_size)
        if pool is not None:
            cell, cell_desc = pool.bytes_per_token, pool.describe()
        else:
            cell, cell_desc = cell_size(geom, ctx.tp, ctx.kv_elt, ctx.pp, split_v=ctx.era.lo >= (0, 14, 0))
        bpt_source = "config"
    line_cell = None
    if K is not None and logged and K - LOG_HALF_ULP > 0 and (logged_ev is None or not logged_ev.with_host):
        line_cell = Interval((K - LOG_HALF_ULP) * GIB / logged, (K + LOG_HALF_ULP) * GIB / logged)
    slack_b = ctx.block_size
    if (cell is not None and pool is None and line_cell is not None
            and not line_cell.contains(cell, slack=cell * 0.002 + slack_b)
            and logged * cell > (K + LOG_HALF_ULP) * GIB):  # type: ignore[operator]
        fitted = _tp_that_fits(ctx, line_cell, slack_b) if ctx.tp_at_least or ctx.tp_assumed else None
        if fitted is not None:
            tp_fit_note = (f"at the TP the log establishes ({'at least ' if ctx.tp_at_least else ''}{ctx.tp}) the "
                           f"config gives {cell:,} B/token, more than the pool holds; at TP {fitted[0]} it gives "
                           f"{fitted[1]:,} B/token, which fits: the TP size is not established, so the count is not "
                           "checked")
            cell, bpt_source = fitted[1], f"config at TP {fitted[0]} (fitted to the KV line)"
        else:
            findings.append(F.geometry_mismatch(cell, line_cell.mid, geom.source if geom else "config"))
            cell, bpt_source = int(line_cell.mid), "kv_line (config disagrees)"
    if cell is None and line_cell is not None:
        cell, bpt_source = int(round(line_cell.mid)), "kv_line"

    # --- prediction -----------------------------------------------------------------------------------------
    pred = _predict(ctx, K, T, logged, logged_ev, cell, bpt_source, pool, kvs, tp_fit_note)

    formula = Formula(
        mem_fraction_static=ctx.util,
        mem_fraction_static_source=ctx.util_source,
        pre_load_free_gib=round(T, 2) if T is not None else None,
        pre_load_free_source="total GPU memory (vLLM's fraction is of the total)" if T is not None else None,
        post_load_free_gib=None,
        reserve_gib=round(T * (1 - ctx.util), 4) if (T is not None and ctx.util is not None) else None,
        rest_gib=K,
        bytes_per_token=cell,
        bytes_per_token_source=bpt_source,
        predicted_tokens=pred.interval,
        logged_tokens=logged,
        verdict=pred.verdict,
        verdict_reason=pred.reason,
        rule=rule_text(ctx, budgets, applied),
        effective_mem_fraction_static=pred.effective_util,
        page_size=ctx.block_size,
        max_total_tokens_cap=None,
        speculative_headroom_tokens=None,
        kv_bytes_per_token_logged=round(line_cell.mid, 1) if line_cell else None,
    )
    if pred.verdict == Verdict.MATCH:
        findings.append(F.tokens_match(formula, _match_text(K, cell, ctx.block_size, pool)))
    elif pred.verdict == Verdict.MISMATCH:
        findings.append(F.tokens_mismatch(formula, pred.verdict))

    # --- ledgers and findings -------------------------------------------------------------------------------
    ordered = sorted(facts)
    ledgers = tuple(rank_ledger(i, facts[r], ctx, applied, peers, T or T_note) for i, r in enumerate(ordered))
    th = opts.thresholds
    findings += budget_findings(budgets)
    findings += rank_findings(ctx, ledgers, T, cell, th)
    findings += failure_findings(ctx, K, T, cell, logged, min(fixed) if fixed else None)
    findings += graph_findings(ctx, applied, T or T_note, cell, opts.thresholds.low_headroom_gib)
    findings += suggestion_findings(ctx, applied, T or T_note)
    findings += headroom_findings(ctx, ledgers, T, th)
    findings += concurrency_findings(ctx, logged, ctx.hybrid is not None or pool is not None)
    if not tokens_ev and not blocks_ev and not any(f.severity == Severity.ERROR for f in findings):
        findings.append(F.incomplete_log(startup.last_line, "KV cache size line (GPU KV cache size / # GPU blocks)"))
    for a in startup.of(AutoFit):
        notes.append(f"max_model_len auto-fit: {a.from_len:,} -> {a.to_len:,}"
                     + (f" to fit {a.kv_gib} GiB of KV memory" if a.kv_gib is not None else "")
                     + (f" + {a.host_gib} GiB on the host" if a.host_gib is not None else "") + f" (line {a.line})")
    if ctx.hybrid is not None:
        h = ctx.hybrid
        notes.append("hybrid pool: " + ", ".join(x for x in (
            f"attention block size {h.block_size} tokens (set so an attention page holds a Mamba page)"
            if h.block_size else "",
            f"Mamba page padded by {h.mamba_padding_pct:g}%" if h.mamba_padding_pct is not None else "") if x))
    if ctx.tp_at_least or ctx.tp_assumed:
        notes.append(f"TP size {'at least ' if ctx.tp_at_least else ''}{ctx.tp}: {ctx.tp_source}")
    if ctx.block_source.startswith("default") and (K is not None or logged is not None):
        notes.append("block size 16 is vLLM's CUDA default; the log does not state it")

    arch = ctx.args.get("model") or (geom.architecture if geom else None)
    attention = ("mla" if geom.is_mla else ("hybrid" if pool is not None else "mha")) if geom else "unknown"
    return Audit(
        engine=ENGINE,
        **startup_identity(startup, opts.source, startups_total),
        model=ModelSummary(str(arch) if arch else None, attention,
                           geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
                           (None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // ctx.tp)) if geom else None,
                           geom.head_dim if geom else None, ctx.kv_dtype, ctx.kv_elt, ctx.tp,
                           geom.source if geom else None, ctx.tp_at_least, ctx.tp_source),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=None,
        hicache_host_gb=None,
        notes=tuple(notes + ([f"bytes per token: {cell_desc}"] if cell_desc else [])),
        engine_display="vLLM",
        # the era's own budget rule (the same words as the "predicted tokens" row), not one rule for every era
        formula_text=(f"KV = {formula.rule.split(': ', 1)[-1]};  "
                      "tokens = floor(KV / (bytes per token x block)) x block"),
        formula_rows=(
            FormulaRow("total GPU memory", formula.pre_load_free_gib, "GiB", "the fraction applies to the total"),
            FormulaRow("gpu_memory_utilization", ctx.util, "", ctx.util_source or ""),
            FormulaRow("headroom = (1 - util) x total", formula.reserve_gib, "GiB", "outside the budget"),
            FormulaRow("available KV cache memory (min)", K, "GiB",
                       "the KV budget" + (f" (seen on {_seen_text(kvs)})" if kvs and "all" not in kvs else "")),
        ),
        pre_load_label="total",
    )


def _seen_text(kvs: dict[str, float]) -> str:
    names = sorted(kvs)
    return ", ".join(names) if len(names) <= 4 else f"{len(names)} ranks"


def _tp_that_fits(ctx: Context, line_cell: Interval, slack_b: int) -> tuple[int, int] | None:
    geom = ctx.geom
    assert geom is not None
    t = ctx.tp * 2
    while t <= 64:
        c, _ = cell_size(geom, t, ctx.kv_elt, ctx.pp, split_v=ctx.era.lo >= (0, 14, 0))
        if line_cell.contains(c, slack=c * 0.002 + slack_b):
            return t, c
        t *= 2
    return None


def _match_text(K, cell, block, pool: HybridPool | None) -> str:
    if pool is not None:
        return (f"available KV {K} GiB in {pool.page_bytes:,} B pages x group size {pool.group_size}, "
                f"{pool.groups} groups, block {pool.block_size}")
    return f"floor(available KV {K} GiB / ({cell:,} B x block {block})) x {block}"


def _predict(ctx: Context, K, T, logged, logged_ev, cell, bpt_source, pool: HybridPool | None,
             kvs: dict[str, float], tp_fit_note: str | None) -> Prediction:
    if logged_ev is not None and logged_ev.with_host:
        return Prediction(None, Verdict.UNKNOWN, f"the {logged_ev.device} + host count ({logged:,} tokens) includes "
                                                 "host-offloaded cache, which the GPU budget does not size")
    if K is None or logged is None:
        return Prediction(None, Verdict.UNKNOWN, "cannot check: the log lacks " + " and ".join(
            x for x, v in (("the available KV memory", K), ("the KV token or block count", logged)) if v is None))
    if tp_fit_note:
        return Prediction(None, Verdict.UNKNOWN, tp_fit_note)
    if bpt_source != "config":
        if ctx.hybrid is not None:
            return Prediction(None, Verdict.UNKNOWN,
                              "a hybrid (Mamba) pool: its tokens per GiB follow from the layer groups, which need the "
                              "model config (--model-config)")
        return Prediction(None, Verdict.UNKNOWN,
                          "bytes per token were derived from this same line (no --model-config), so the token count "
                          "cannot be checked independently")
    block = ctx.block_size
    if pool is not None:
        mml = next((c.max_model_len for c in reversed(ctx.startup.of(Concurrency))), None) or as_int(
            ctx.args.get("max_model_len"))
        spec = _speculative_tokens(ctx.args)
        interval, how = hybrid_interval(K, pool, ctx, mml, spec)
        if interval is None:
            return Prediction(None, Verdict.UNKNOWN, f"hybrid pool: {how}")
        slack = 0
        rule = how
    else:
        interval = block_interval(K, cell, block)
        # V1 >= 0.21 reports int(concurrency x max_model_len), not blocks x block_size: allow one block
        slack = block if ctx.era.hi is None or ctx.era.hi >= (0, 21, 0) else 0
        rule = f"floor({K} GiB / ({cell:,} B x {block})) blocks x {block}"
    seen = sorted(kvs)
    complete = "all" in kvs or (not ctx.tp_at_least and len(seen) >= ctx.workers)
    if interval.low - slack <= logged <= interval.high + slack:
        return Prediction(interval, Verdict.MATCH, f"{logged:,} tokens = {rule}")
    implied = logged * cell / GIB
    if logged < interval.low and not complete:
        missing = (f"the log shows {len(seen)} of {'at least ' if ctx.tp_at_least else ''}{ctx.workers} workers' "
                   f"budgets ({', '.join(seen)})")
        return Prediction(interval, Verdict.UNKNOWN,
                          f"checked only as an upper bound: {K} GiB (the smallest budget seen) holds "
                          f"{interval.low:,}..{interval.high:,} tokens and the pool has {logged:,}, consistent with "
                          f"another worker's smaller budget of about {implied:.2f} GiB; {missing}")
    eff = None
    if T and ctx.util:
        eff = round(ctx.util - (K - implied) / T, 4)
    return Prediction(interval, Verdict.MISMATCH,
                      f"{logged:,} tokens is not what {K} GiB of KV memory holds at {cell:,} B/token "
                      f"({interval.low:,}..{interval.high:,}); the count implies {implied:.2f} GiB", eff)


def _speculative_tokens(args) -> int:
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        return as_int(spec.get("num_speculative_tokens")) or 0
    return as_int(args.get("num_speculative_tokens")) or 0


__all__ = ["reconcile"]
