"""One SGLang startup -> an :class:`Audit`: T and post, the fraction, bytes per token, the prediction and
verdict, the ledgers and the findings. Pure: no I/O."""

from __future__ import annotations

from kvaudit.model_config import ModelGeometry
from kvaudit.parse.interface import Startup
from kvaudit.parse.sglang import CapWarning, Failure, HiCacheHost, MfsAdjust, WeightEnd
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
from kvaudit.reconcile.sglang.cell import config_cell, kv_line_cell
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.reconcile.sglang.checks import concurrency_findings, failure_findings, ledger_findings
from kvaudit.reconcile.sglang.context import (
    Context,
    build_context,
    context_length_of,
    logged_token_count,
    rounded,
)
from kvaudit.reconcile.sglang.formula import Prediction, explain_mismatch, min_interval, predict_stages, rules_for
from kvaudit.reconcile.sglang.pool import components, state_gib
from kvaudit.reconcile.sglang.ledger import rank_ledger, request_table
from kvaudit.units import GIB, LOG_HALF_ULP, Interval

ENGINE = "sglang"

def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    ctx = build_context(startup, opts)
    th = opts.thresholds
    findings: list[Finding] = []
    facts = ctx.facts
    ranks = sorted(facts)

    # --- T and post (min over ranks) --------------------------------------------------------------------
    pres = [rf.pre for rf in facts.values() if rf.pre is not None]
    posts = [rf.post for rf in facts.values() if rf.post is not None]
    T = min_interval(pres)
    post = min_interval(posts)
    pre_source = next((rf.pre_source for rf in facts.values() if rf.pre_source), None)
    if T is not None and len(pres) < len(ranks):
        ctx.notes.append(f"T is the minimum over the {len(pres)} of {len(ranks)} ranks whose lines are in the log")

    # --- mem_fraction_static ---------------------------------------------------------------------------
    mfs = as_float(ctx.args.get("mem_fraction_static"))
    mfs_source = "server_args" if mfs is not None else None
    if opts.mem_fraction_static is not None:
        if mfs is not None and abs(mfs - opts.mem_fraction_static) > 1e-9:
            ctx.notes.append(f"--mem-fraction-static {opts.mem_fraction_static} overrides server_args' {mfs}")
        mfs, mfs_source = opts.mem_fraction_static, "cli"
    adjust = startup.of(MfsAdjust)
    if adjust and mfs_source != "cli":
        mfs, mfs_source = adjust[-1].mem_fraction_static, "log (multimodal reduction)"
    if mfs is not None and str(ctx.args.get("attention_backend")) == "aiter" and mfs_source != "cli":
        ctx_len = context_length_of(ctx)
        if ctx_len and ctx_len > 8192 and ctx.era.overlaps((0, 4, 9), None):
            ctx.notes.append(f"aiter backend with context {ctx_len:,} > 8192: SGLang uses {mfs} x 0.85")
            mfs, mfs_source = round(mfs * 0.85, 6), f"{mfs_source} x 0.85 (aiter)"

    # --- bytes per token -------------------------------------------------------------------------------
    logged, approx = logged_token_count(ctx)
    geom: ModelGeometry | None = opts.model_geometry
    cell, cell_note = config_cell(ctx)
    line_cell, line_cell_mid = kv_line_cell(ctx, None if approx else logged)
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

    # the state pool of a hybrid linear-attention model comes out of the same budget (0.5.2+, reference §2.6)
    # (what the budget was charged for: without the state pool's padding slot, pool.budget_share)
    spec = ctx.spec_algo is not None
    states = [s for s in (state_gib(components(rf), budget=not spec) for rf in facts.values()) if s is not None]
    state: Interval | None = None
    if states:
        g, parts = max(states)
        state = Interval(g - parts * LOG_HALF_ULP, g + parts * LOG_HALF_ULP)

    draft_layers, target_layers = None, None
    if geom is not None:
        target_layers = geom.num_layers
        draft_layers = geom.num_nextn_predict_layers or 1

    def budget_for(tokens: int) -> float:
        """GiB the pool of ``tokens`` tokens (and the state pool) took out of the budget."""
        assert cell_iv is not None
        return tokens * cell_iv.mid / GIB + (state.mid if state is not None else 0.0)

    # --- a capped pool: the fraction cannot be read from it ---------------------------------------------
    cap = as_int(ctx.args.get("max_total_tokens"))
    engine_rest = min((rf.kv_budget for rf in facts.values() if rf.kv_budget is not None), default=None)
    probable_cap = None
    if cap is None and logged and not approx and "max_total_tokens" not in ctx.args:
        if engine_rest is not None and cell_iv is not None and budget_for(logged) < 0.9 * engine_rest:
            probable_cap = (f"{logged:,} tokens take {budget_for(logged):.2f} GiB, well below the "
                            f"{engine_rest:.2f} GiB the engine logged as available for the KV cache")
        elif logged % 1000 == 0:
            probable_cap = f"{logged:,} is a round number, not what a memory budget divides into"
    capped = (cap is not None and cap == logged) or bool(startup.of(CapWarning)) or probable_cap is not None
    if probable_cap:
        findings.append(F.tokens_capped_probably(logged, probable_cap))

    # --- mfs from the engine's own KV budget, else inferred, when nothing gives it ----------------------
    if mfs is None and engine_rest is not None and T is not None and post is not None:
        mfs = round(1 - (post.mid - engine_rest) / T.mid, 4)
        mfs_source = "solved from the logged 'available memory for KV cache'"
    if mfs is None and not capped and T is not None and post is not None and logged and cell_iv is not None:
        inferred = 1 - (post.mid - budget_for(logged)) / T.mid
        if 0 < inferred < 1:
            mfs, mfs_source = round(inferred, 4), "inferred"
            findings.append(F.mfs_inferred(mfs, state.mid if state is not None else None))

    # --- T solved from the tokens when the log lacks it -------------------------------------------------
    if T is None and mfs is not None and mfs < 1 and post is not None and logged and cell_iv is not None \
            and not approx:
        t_mid = (post.mid - budget_for(logged)) / (1 - mfs)
        T = Interval(t_mid - 0.01, t_mid + 0.01)
        pre_source = "solved from the logged tokens (no 'Load weight begin' line)"

    reserve = T.scale(1 - mfs) if (T is not None and mfs is not None) else None
    rest = (post - reserve) if (post is not None and reserve is not None) else None

    # --- prediction and verdict -------------------------------------------------------------------------
    prediction: Prediction | None = None
    verdict, reason = Verdict.UNKNOWN, ""
    eff_mfs = None
    missing = [name for name, v in (("T (pre-load free memory)", T), ("free memory after weights", post),
                                    ("mem_fraction_static", mfs), ("bytes per token", cell_iv)) if v is None]
    if not missing:
        assert T is not None and post is not None and mfs is not None and cell_iv is not None
        rules = rules_for(ctx.era, ctx.spec_algo is not None)
        stages = _stage_inputs(ctx, post, cell_iv, bpt_source)
        preds = [predict_stages(ctx, r, T, stages, mfs, state, draft_layers, target_layers) for r in rules]
    if probable_cap:
        reason = (f"the pool looks capped ({probable_cap}); a capped pool does not follow from the formula, "
                  "and the fraction is not inferred from it")
        if not missing:
            prediction = preds[0]
            reason += f"; the formula allows up to {prediction.tokens.high:,}"
    elif missing or logged is None:
        wants = missing + ([] if logged is not None else ["the KV pool's token count"])
        reason = "cannot check: the log lacks " + ", ".join(wants) + _how_to_check(wants, geom is not None)
        if not missing:
            prediction = preds[0]
            p = prediction.tokens
            reason = (f"the formula gives {p.low:,}..{p.high:,} tokens; the log does not say what the engine "
                      "allocated (no KV line or scheduler summary)")
    elif approx:
        prediction = preds[0]
        p = prediction.tokens
        reason = (f"the log gives the token count only approximately ({logged:,}, abridged); the formula "
                  f"gives {p.low:,}..{p.high:,}")
    elif mfs_source == "inferred":
        reason = ("mem_fraction_static was inferred from these same numbers, so the token count cannot be "
                  "checked independently; pass --mem-fraction-static to check it")
    elif pre_source and pre_source.startswith("solved"):
        reason = "T was solved from the token count, so the token count cannot be checked independently"
    else:
        hit = next((p for p in preds if p.tokens.contains(logged)), None)
        if hit is not None:
            prediction, verdict = hit, Verdict.MATCH
            reason = f"{logged:,} tokens lie in the predicted interval {hit.tokens.low:,}..{hit.tokens.high:,}"
        else:
            prediction = preds[0]
            verdict, reason, eff_mfs = explain_mismatch(ctx, prediction, logged, T, post, mfs, cell_iv, cap, state)
    if cap and logged is not None and logged == cap:
        findings.append(F.tokens_capped(cap, prediction.tokens if prediction else None))

    # --- a memory error: what fraction would have worked, and what the engine's own count implies ---------
    shortfall: dict[str, float] = {}
    if T is not None and post is not None and T.mid > 0:
        shortfall["minimum_mem_fraction_static"] = round(1 - (post.mid - (state.mid if state else 0)) / T.mid, 4)
    negative = [ev for ev in startup.of(CapWarning) if ev.profiled < 0]
    if negative:
        shortfall["profiled"] = negative[0].profiled
        shortfall["line"] = negative[0].line
        if T is not None and post is not None and cell_iv is not None:
            eff_mfs = round(1 - (post.mid - budget_for(negative[0].profiled)) / T.mid, 4)
            shortfall["effective_mem_fraction_static"] = eff_mfs
            if prediction is not None:
                shortfall["formula_tokens"] = prediction.tokens.low

    formula = Formula(
        mem_fraction_static=mfs,
        mem_fraction_static_source=mfs_source,
        pre_load_free_gib=rounded(T.mid) if T else None,
        pre_load_free_source=pre_source,
        post_load_free_gib=rounded(post.mid) if post else None,
        reserve_gib=rounded(reserve.mid, 4) if reserve else None,
        rest_gib=rounded(rest.mid, 4) if rest else None,
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
        logged_tokens_approximate=approx,
        probable_cap=probable_cap,
        state_pool_gib=round(state.mid, 3) if state is not None else None,
        check_inputs=("mem_fraction_static", "pre_load_free_gib", "post_load_free_gib", "bytes_per_token")
        + (("attention_tp_size",) if bpt_source == "config" else ()),
    )
    if verdict == Verdict.MATCH:
        findings.append(F.tokens_match(formula))
    elif verdict in (Verdict.MISMATCH, Verdict.EXPLAINED):
        findings.append(F.tokens_mismatch(formula, verdict))

    # --- ledger -----------------------------------------------------------------------------------------
    ctx_len = context_length_of(ctx)
    req_bytes, req_how = request_table(ctx, logged, ctx_len)
    ledgers = tuple(
        rank_ledger(i, facts[r], ctx, cell, logged, req_bytes, req_how, rank0=(i == 0))
        for i, r in enumerate(ranks)
    )
    findings.extend(ledger_findings(ctx, ledgers, formula, reserve, th))
    findings.extend(concurrency_findings(ctx, logged, ctx_len))
    memory_failed = any(f.kind in ("not_enough_memory", "no_kv_memory") for f in startup.of(Failure))
    findings.extend(failure_findings(ctx, shortfall if (memory_failed or negative) else None, formula))
    hicache = startup.of(HiCacheHost)
    hicache_gb = hicache[0].host_gb if hicache else None
    if hicache_gb is not None:
        findings.append(F.hicache_host(hicache_gb, logged, cell.pool if cell else None,
                                       as_float(ctx.args.get("hicache_ratio"))))
    if ctx.summary is None and not any(f.severity == Severity.ERROR for f in findings):
        findings.append(F.incomplete_log(startup.last_line))

    return Audit(
        engine=ENGINE,
        **startup_identity(startup, opts.source, startups_total),
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




def _model_summary(ctx: Context, geom: ModelGeometry | None) -> ModelSummary:
    types = [e.model_type for e in ctx.startup.of(WeightEnd) if e.role == "target" and e.model_type]
    tp_bits = dict(attention_tp_size_at_least=ctx.tp_at_least, attention_tp_size_source=ctx.attn_tp_source)
    if geom is None:
        kvs = [kv for rf in ctx.facts.values() for kv in rf.kv]
        attention = "mla" if any(k.kv_gib is not None for k in kvs) else ("mha" if kvs else "unknown")
        return ModelSummary(types[0] if types else None, attention, None, None, None, None, ctx.kv_dtype,
                            ctx.kv_elt, ctx.attn_tp, None, **tp_bits)
    per_rank = None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // max(1, ctx.attn_tp))
    return ModelSummary(geom.architecture or (types[0] if types else None), "mla" if geom.is_mla else "mha",
                        geom.num_layers, geom.num_kv_heads, per_rank, geom.head_dim, ctx.kv_dtype, ctx.kv_elt,
                        ctx.attn_tp, geom.source, **tp_bits)


def _how_to_check(missing: list[str], have_config: bool) -> str:
    """What the user can add so that the check runs."""
    hints = []
    if "mem_fraction_static" in missing:
        hints.append("--mem-fraction-static (the value the server ran with)")
    if "bytes per token" in missing and not have_config:
        hints.append("--model-config (the model's config.json)")
    if any(m.startswith("T ") or m.startswith("free memory") for m in missing):
        hints.append("the log from 'Load weight begin' on (the excerpt starts after it)")
    if "the KV pool's token count" in missing:
        hints.append("the log up to the scheduler summary (max_total_num_tokens=...)")
    return ("; to check it, pass " + ", ".join(hints)) if hints else ""


def _stage_inputs(ctx: Context, post: Interval, cell_iv: Interval, bpt_source: str | None
                  ) -> list[tuple[Interval, Interval]]:
    """(post, bytes per token) per pipeline stage: each stage sizes its pool from its own free memory and
    layers, and the engine takes the MIN over stages (reference §1.5). One stage without PP, or when bytes per
    token come from a KV line (that rank's stage only)."""
    if ctx.pp <= 1 or bpt_source != "config":
        return [(post, cell_iv)]
    out = []
    for stage in range(ctx.pp):
        posts = [rf.post for r, rf in ctx.facts.items() if r.sort_key[0] == stage and rf.post is not None]
        cell, _ = config_cell(ctx, stage)
        if cell is not None:
            out.append((min_interval(posts) or post, Interval.exact(cell.profile)))
    return out or [(post, cell_iv)]
