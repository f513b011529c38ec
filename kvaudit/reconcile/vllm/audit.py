"""One vLLM startup, reconciled: the settings, each worker's budget, the predicted pool, the ledger and the
findings, assembled into an :class:`Audit`."""

from __future__ import annotations

import math
import dataclasses

from kvaudit.parse.vllm import AutoFit, Blocks, Concurrency, Failure, KVTokens, Setting
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import (
    Audit,
    AuditOptions,
    Finding,
    Formula,
    FormulaRow,
    ModelSummary,
    Verdict,
    startup_identity,
)
from kvaudit.reconcile.vllm.cell import (
    HybridPool,
    SlidingWindowPool,
    cell_size,
    hybrid_pool,
    sliding_window_pool,
    sliding_window_unmodelled,
)
from kvaudit.reconcile.vllm.checks import (
    budget_findings,
    concurrency_findings,
    grouped_line,
    failure_findings,
    graph_findings,
    suggestion_findings,
    headroom_findings,
    rank_findings,
)
from kvaudit.reconcile.values import as_int
from kvaudit.reconcile.vllm.context import CPU_BLOCKS, Context, build_context
from kvaudit.reconcile.vllm.facts import first
from kvaudit.reconcile.vllm.formula import (
    CLAMP_SOURCE,
    Budget,
    Prediction,
    block_interval,
    budget,
    estimate_applied,
    hybrid_candidates,
    rule_text,
    sliding_candidates,
    sliding_fits_some_batch,
)
from kvaudit.reconcile.vllm.ledger import rank_ledger
from kvaudit.units import GIB, LOG_HALF_ULP, Interval
from kvaudit.record import record

ENGINE = "vllm"


def reconcile(startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    """The audit as a pipeline of named steps, each returning what it established (and the findings it raised)."""
    ctx = build_context(startup, opts)
    applied = estimate_applied(ctx)
    pool_seen = logged_pool(ctx)
    kv = kv_budgets(ctx)
    cells, geometry = bytes_per_token(ctx, kv, pool_seen)
    pred = _predict(ctx, kv.K, kv.T, pool_seen.logged, pool_seen.event, cells, kv.kvs, kv.exact)
    if ctx.cpu and ctx.block_source.startswith("default") and pred.verdict == Verdict.MISMATCH:
        # the CPU backend's block is 16, or 128 with IPEX (CPU_BLOCKS), and a log rarely says which: the one that
        # gives the logged pool is named; with neither, the mismatch stands against the first
        for block, why in CPU_BLOCKS[1:]:
            trial = dataclasses.replace(ctx, block_size=block, block_source=f"default ({why})", notes=list(ctx.notes))
            seen2 = logged_pool(trial)
            cells2, geometry2 = bytes_per_token(trial, kv, seen2)
            pred2 = _predict(trial, kv.K, kv.T, seen2.logged, seen2.event, cells2, kv.kvs, kv.exact)
            if pred2.verdict == Verdict.MATCH:
                ctx, pool_seen, cells, geometry, pred = trial, seen2, cells2, geometry2, pred2
                ctx.notes.append(f"block size {why}: the one that gives the logged pool (the log does not state it)")
                break
    formula = formula_of(ctx, kv, pool_seen, cells, pred, applied)
    if pred.verdict == Verdict.MATCH:  # the worked formula; the verdict raises TOKENS_* (kvaudit.verdict, rule 6)
        formula = dataclasses.replace(formula, check_text=(
            pred.reason if pool_seen.logged == 0 and kv.K is not None and kv.K + LOG_HALF_ULP <= 0 else
            _match_text(kv.K, cells.cell, ctx.block_size, cells.pool, cells.swa)))
    peers = list(ctx.facts.values())
    ledgers = tuple(rank_ledger(i, ctx.facts[r], ctx, applied, peers, kv.T or kv.T_note)
                    for i, r in enumerate(sorted(ctx.facts)))
    findings = [*geometry, *checked_findings(ctx, opts, kv, pool_seen, cells, ledgers, applied)]
    closing_notes(ctx, kv, pool_seen)
    return Audit(
        lacks=None if pool_seen.stated else "KV cache size line (GPU KV cache size / # GPU blocks)",
        engine=ENGINE,
        **startup_identity(startup, opts.source, startups_total),
        model=_model_summary(ctx, cells.pool, cells.swa),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=_speculative_summary(ctx.args),
        hicache_host_gb=None,
        # a device whose budget rule kvaudit has not read (UNMODELLED_DEVICES): the support table's "accelerator",
        # not modelled, so the coverage every output shows agrees with the unchecked pool
        platform_kind="accelerator" if ctx.device is not None else None,
        notes=tuple(ctx.notes + ([f"bytes per token: {cells.description}"] if cells.description else [])),
        engine_display="vLLM",
        # the era's own budget rule (the same words as the "predicted tokens" row), not one rule for every era
        formula_text=(f"KV = {(formula.rule or '').split(': ', 1)[-1]};  " + (
            "tokens = floor(KV / (bytes per token x block)) x block" if cells.pool is None and cells.swa is None
            else "blocks = KV // page // group size; tokens per the release's count (see the predicted row)")),
        formula_rows=(() if ctx.cpu or ctx.device is not None else (  # the CPU backend: no device total, no fraction
            FormulaRow("total GPU memory", formula.pre_load_free_gib, "GiB", "the fraction applies to the total"),
            FormulaRow("gpu_memory_utilization", ctx.util, "", ctx.util_source or ""),
            FormulaRow("headroom = (1 - util) x total", formula.reserve_gib, "GiB", "outside the budget"))) + (
            FormulaRow("available KV cache memory (min)", kv.K, "GiB",
                       _cpu_budget_said(ctx) if ctx.cpu else
                       "the KV budget" + (f" (seen on {_seen_text(kv.kvs)})" if kv.kvs and "all" not in kv.kvs
                                          else "")),),
        pre_load_label="total",
        budget_other_label="what the budget holds besides the KV cache (weights, activation peak, non-torch memory)",
    )


# ----------------------------------------------------------------------------------------------------------
# the steps


@record
class LoggedPool:
    """The pool the engine logged: its token count (the smallest data-parallel engine's), from its line."""

    logged: int | None
    event: KVTokens | None  # the KV-size line it came from, None when it came from a block count
    stated: bool  # a KV size or block line is in the log


@record
class KVBudgets:
    """The available KV memory per worker (K the smallest), the card's total T and the workers' budgets."""

    kvs: dict[str, float]
    fixed: float | None  # --kv-cache-memory-bytes, when it set the pool
    K: float | None
    T: float | None
    T_note: float | None  # a total recovered from the CUDA-graph note, when no line states it
    budgets: tuple[Budget, ...]
    T_note_range: tuple[float, float] | None = None  # what the note's rounding allows of that total
    exact: bool = False  # K is a size set in whole GiB (the CPU backend's default space), not a 0.01 GiB print


@record
class Cells:
    """Bytes per token, where they come from, and what the KV line implies."""

    pool: HybridPool | None
    cell: int | None
    description: str | None
    source: str | None
    line_cell: Interval | None
    tp_fit_note: str | None
    swa: SlidingWindowPool | None = None  # a sliding-window hybrid's groups (Gemma-3/4)
    unmodelled: str | None = None  # why the config's pool is not modelled here (no check, no geometry finding)


def logged_pool(ctx: Context) -> LoggedPool:
    tokens_ev = ctx.startup.of(KVTokens)
    blocks_ev = ctx.startup.of(Blocks)
    stated = bool(tokens_ev or blocks_ev)
    if not tokens_ev:
        if blocks_ev and ctx.device is not None and ctx.block_source.startswith("unknown"):
            # blocks x 16 would be CUDA's count: this device's default block is its platform's (HPU: 128)
            ctx.notes.append(f"{min(b.gpu_blocks for b in blocks_ev):,} blocks (line {blocks_ev[0].line}): the log "
                             f"does not state the block size, and on {ctx.device[0]} it is not CUDA's 16, so no "
                             "token count is derived from them")
            return LoggedPool(None, None, stated)
        return LoggedPool(min(b.gpu_blocks for b in blocks_ev) * ctx.block_size if blocks_ev else None, None, stated)
    per_dp = {}
    for e in tokens_ev:
        per_dp[e.dp] = e  # the last line of each data-parallel engine
    event = min(per_dp.values(), key=lambda e: e.tokens)
    if len(per_dp) > 1:
        ctx.notes.append(f"{len(per_dp)} data-parallel engines logged their own pool; the smallest is checked")
    return LoggedPool(event.tokens, event, stated)


def _startup_plan(ctx: Context) -> list[str]:
    """What the persisted startup plan did (v1/worker/startup_plan.py, VLLM_ENABLE_STARTUP_PLAN=1, read in the
    0.26.0 wheel): applied, its kv_cache_memory_bytes replaces profiling (the next line says 'as specified by
    kv_cache_memory_bytes config' though no flag was passed); not applied, the free memory at the start was below
    the plan's baseline and the pool was profiled; saved, the next startup may reuse this one's size."""
    said = {e.value: e for e in ctx.startup.of(Setting) if e.key == "startup_plan"}
    free, base = first(ctx.facts, "plan_free_gib"), first(ctx.facts, "plan_baseline_gib")
    free_text = (f" (recorded with {base:.2f} GiB free; {free:.2f} GiB free at this start)"
                 if free is not None and base is not None else "")
    out = []
    if "applied" in said:
        out.append(f"a persisted startup plan (VLLM_ENABLE_STARTUP_PLAN=1, line {said['applied'].line}), not "
                   f"--kv-cache-memory-bytes,{free_text}")
    if "not applied" in said and free is not None and base is not None:
        out.append(f"the persisted startup plan was not applied (line {said['not applied'].line}): {free:.2f} GiB was "
                   f"free at the start, {base - free:.2f} GiB less than the {base:.2f} GiB it was recorded with "
                   "(another process, or memory not yet released, holds it), so the pool was profiled")
    if "unreadable" in said:
        out.append(f"a startup plan could not be read (line {said['unreadable'].line}): the pool was profiled")
    if "saved" in said:
        out.append(f"this startup's KV size was saved as a startup plan (line {said['saved'].line}): a later start "
                   "with the same configuration and at least as much free memory reuses it without profiling")
    return out


def kv_budgets(ctx: Context) -> KVBudgets:
    facts = ctx.facts
    notes = ctx.notes
    kvs = {rr.rank.display: rr.r["kv_gib"] for rr in facts.values() if "kv_gib" in rr.r}
    fixed = [rr.r["kv_bytes_config_gib"] for rr in facts.values() if "kv_bytes_config_gib" in rr.r]
    plan = _startup_plan(ctx)
    applied = bool(plan) and plan[0].startswith("a persisted startup plan")
    if fixed and not kvs:  # --kv-cache-memory-bytes (0.10.2+): the KV size is set, the util budget is skipped
        kvs = {"all": min(fixed)}
        who = plan.pop(0) if applied else "--kv-cache-memory-bytes"
        notes.append(f"{who} fixed the KV cache at {min(fixed)} GiB: gpu_memory_utilization and "
                     "the profiling budget do not apply")
    notes.extend(plan)
    exact = False
    if ctx.cpu and not kvs and ctx.cpu_space is not None:
        # the CPU backend: the budget is VLLM_CPU_KVCACHE_SPACE (platforms/cpu.py), not total x util - usage
        gib, how, at = ctx.cpu_space
        kvs, exact = {"all": gib}, how == "default"
        notes.append("the CPU backend's KV budget is VLLM_CPU_KVCACHE_SPACE: " + (
            f"not set, so its default of {gib:g} GiB (line {at}'s warning; a default, not a measurement)"
            if how == "default" else f"not set, so {gib:g} GiB, the share of free host memory vLLM chose and printed "
                                     f"(line {at}, to 0.01 GiB)"))
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
    T_range = None
    if T is None:
        est, u_note, equiv = first(facts, "graph_estimate_gib"), first(facts, "util"), first(facts, "equiv_util")
        raised = first(facts, "suggested_util")
        if equiv is None and None not in (u_note, raised) and u_note < raised < 1.0:  # type: ignore[operator]
            # 0.18's opt-in note: suggested = round(util + estimate / total, 4), the mirror of the equivalence
            # (util - suggested + util = util - estimate / total); 1.0 is a cap, not the sum
            equiv = round(2 * u_note - raised, 6)  # type: ignore[operator]
        if None not in (est, u_note, equiv) and u_note > equiv and est > 0:  # type: ignore[operator]
            T_note = est / (u_note - equiv)  # type: ignore[operator]
            # gpu_worker.py: equiv = round(util - estimate / total, 4), the estimate printed to 0.01 GiB: both
            # roundings carry into the total (0.04 / 0.0003 is anything from 116 to 180 GiB)
            d_lo, d_hi = u_note - equiv - 0.00005, u_note - equiv + 0.00005  # type: ignore[operator]
            lo = max(0.0, est - LOG_HALF_ULP) / d_hi  # type: ignore[operator]
            hi = (est + LOG_HALF_ULP) / d_lo if d_lo > 0 else float("inf")  # type: ignore[operator]
            T_range = (lo, hi)
            hi_text = f"{hi:.1f}" if hi != float("inf") else "unbounded"
            notes.append(f"total GPU memory {lo:.1f}..{hi_text} GiB (about {T_note:.1f}) recovered from the CUDA-graph "
                         f"note: estimate {est} GiB = "
                         + (f"({raised} - {u_note})" if raised is not None and first(facts, "equiv_util") is None
                            else f"({u_note} - {equiv})")
                         + " x total, both rounded: every figure derived from it carries that interval")
    peers = list(facts.values())
    budgets = [] if fixed or ctx.cpu else [b for b in (budget(rr, ctx, T or T_note, peers) for rr in facts.values())
                                           if b is not None]
    for rr in facts.values():
        if "external_weights_gib" in rr.r:
            notes.append(f"{rr.rank.display}: {rr.r['external_weights_gib']:.2f} GiB of weights are held by another "
                         f"process (0.32+): of the {rr.r.get('budget_gib', 0):.2f} GiB budget, "
                         f"{rr.r.get('engine_budget_gib', 0):.2f} GiB remained for the engine")
            break
    return KVBudgets(kvs, min(fixed) if fixed else None, K, T, T_note, tuple(budgets), T_range, exact)


def bytes_per_token(ctx: Context, kv: KVBudgets, seen: LoggedPool) -> tuple[Cells, tuple[Finding, ...]]:
    """From config.json (a hybrid model's page layout, else one cell), checked against what the KV line implies;
    a disagreement is first tried against a larger TP the log does not rule out, else it is a mismatch (the
    findings returned beside the cells)."""
    findings: list[Finding] = []
    geom, K, logged, logged_ev = ctx.geom, kv.K, seen.logged, seen.event
    pool: HybridPool | None = None
    cell = None
    description = None
    source = None
    tp_fit_note = None
    swa: SlidingWindowPool | None = None
    unmodelled = None
    if geom is not None:
        pool = hybrid_pool(geom, ctx.tp, ctx.kv_elt, ctx.block_size)
        unmodelled = _swa_unmodelled(ctx, geom)
        swa = sliding_window_pool(geom, ctx.tp, ctx.kv_elt, ctx.block_size) if unmodelled is None else None
        if geom.is_hybrid_swa and not geom.is_mamba_hybrid and swa is None and unmodelled is None:
            unmodelled = "the sliding and full layers' pages cannot be unified (vLLM raises NotImplementedError)"
        if (pool is not None or swa is not None) and unmodelled is None:
            unmodelled = _grouped_layers_unknown(ctx, pool, swa)
            if unmodelled is not None:
                pool = swa = None
        if pool is not None:
            cell, description = pool.bytes_per_token, pool.describe()
        elif swa is not None:
            cell, description = swa.bytes_per_token, swa.describe()
        elif unmodelled is None and (pad := grouped_line(ctx)) is not None:
            # the config read as one layer type (an MLA + linear-attention hybrid such as Kimi-Linear, a drafter's
            # layers), the log's padding warning as two or more: the uniform cell is not the pool's
            unmodelled = (f"the log's padding warning (line {pad}) shows KV cache groups of two or more layer "
                          "types, and the config as kvaudit reads it gives one")
        if unmodelled is not None and pool is None and swa is None:
            description = f"not modelled here: {unmodelled}"
        elif pool is None and swa is None:
            cell, description = cell_size(geom, ctx.tp, ctx.kv_elt, ctx.pp, split_v=ctx.era.lo >= (0, 14, 0))
        source = "config" if unmodelled is None else None
    line_cell = None
    if K is not None and logged and K - LOG_HALF_ULP > 0 and (logged_ev is None or not logged_ev.with_host):
        line_cell = Interval((K - LOG_HALF_ULP) * GIB / logged, (K + LOG_HALF_ULP) * GIB / logged)
    slack_b = ctx.block_size
    if (cell is not None and pool is None and swa is None and line_cell is not None
            and not line_cell.contains(cell, slack=cell * 0.002 + slack_b)
            and logged * cell > (K + LOG_HALF_ULP) * GIB):  # type: ignore[operator]
        fitted = (_tp_that_fits(ctx, line_cell, slack_b, K, logged, len(kv.kvs))
                  if ctx.tp_at_least or ctx.tp_assumed else None)
        if fitted is not None:
            how = ("which fits" if line_cell.contains(fitted[1], slack=fitted[1] * 0.002 + slack_b) else
                   f"whose pool ({(logged or 0) * fitted[1] / GIB:.2f} GiB) fits within the budget shown, the gap "
                   f"left to the {fitted[0] * ctx.pp - len(kv.kvs)} workers whose budgets the log does not show")
            said = (f"at TP {ctx.tp} (assumed: the log does not state it)" if ctx.tp_assumed and not ctx.tp_at_least
                    else f"at the TP the log establishes ({'at least ' if ctx.tp_at_least else ''}{ctx.tp})")
            tp_fit_note = (f"{said} the "
                           f"config gives {cell:,} B/token, more than the pool holds; at TP {fitted[0]} it gives "
                           f"{fitted[1]:,} B/token, {how}: the TP size is not established, so the count is not "
                           "checked")
            cell, source = fitted[1], f"config at TP {fitted[0]} (fitted to the KV line)"
        else:
            findings.append(F.geometry_mismatch(cell, line_cell.mid, geom.source if geom else "config"))
            cell, source = int(line_cell.mid), "kv_line (config disagrees)"
    if cell is None and line_cell is not None:
        cell, source = int(round(line_cell.mid)), "kv_line"
    return Cells(pool, cell, description, source, line_cell, tp_fit_note, swa, unmodelled), tuple(findings)


#: speculative methods whose drafter has no attention layers of its own (``config/speculative.py``)
DRAFTS_WITHOUT_KV = ("ngram", "ngram_gpu", "suffix")


def _draft(args) -> dict | None:
    spec = args.get("speculative_config")
    return spec if isinstance(spec, dict) and spec else None


def _speculative_summary(args) -> str | None:
    """The draft as the log names it: its method, its model (never taken for the engine's model) and tokens."""
    spec = _draft(args)
    if spec is None:
        return None
    method = spec.get("method") or "draft model"
    parts = [f"draft {spec['model']}" if isinstance(spec.get("model"), str) else "",
             f"{_speculative_tokens(args)} speculative tokens" if _speculative_tokens(args) else ""]
    inner = ", ".join(p for p in parts if p)
    return f"{method}" + (f" ({inner})" if inner else "")


def _grouped_layers_unknown(ctx: Context, pool: HybridPool | None, swa: SlidingWindowPool | None) -> str | None:
    """Why the config's layers are not the pool's groups: a drafter's attention layers join the target's KV
    groups (``kv_cache_utils.get_kv_cache_groups`` sees every layer's spec: EAGLE, DFlash, MTP, draft models), or
    the log's "Add N padding layers" warnings show other groups than the config's layers make."""
    spec = _draft(ctx.args)
    if spec is not None and str(spec.get("method") or "") not in DRAFTS_WITHOUT_KV:
        return (f"the {spec.get('method') or 'draft'} drafter's attention layers join the KV groups, and its "
                "layers are not in the model config")
    logged = sorted({int(e.value) for e in ctx.startup.of(Setting) if e.key == "padding_layers"})
    if pool is not None:
        g = pool.group_size
        mine = sorted({n for n in (g * math.ceil(pool.full_layers / g) - pool.full_layers,
                                   g * pool.other_groups - pool.other_layers) if n})
    else:
        assert swa is not None
        g = swa.group_size
        mine = sorted({n for n in (g * swa.full_groups - swa.full_layers, g * swa.swa_groups - swa.swa_layers) if n})
    if logged != mine:
        said = ", ".join(f"Add {n} padding layers" for n in logged) or "no padding warning"
        counts = (pool.full_layers, pool.other_layers) if pool is not None else (swa.full_layers, swa.swa_layers)  # type: ignore[union-attr]
        return (f"the log's grouping ({said}) is not the one the config's {counts[0]} + {counts[1]} layers give "
                f"({', '.join(f'{n} padding' for n in mine) or 'no padding'}): other layers share the pool")
    return None


def _swa_unmodelled(ctx: Context, geom) -> str | None:
    """Why a sliding-window model's pool is not modelled here: the model's own reason, or the hybrid KV cache
    manager switched off (every layer then sized as full attention, ``unify_hybrid_kv_cache_specs``)."""
    if not geom.is_hybrid_swa or geom.is_mamba_hybrid:
        return None
    if ctx.args.get("disable_hybrid_kv_cache_manager") is True:
        return "the hybrid KV cache manager is disabled (--disable-hybrid-kv-cache-manager)"
    said = next((e for e in ctx.startup.of(Setting) if e.key == "sliding_as_full"), None)
    if said is not None:
        return (f"the log says the sliding-window layers are sized as full attention (line {said.line}: "
                f"'{said.value}')")
    return sliding_window_unmodelled(geom)


def formula_of(ctx: Context, kv: KVBudgets, seen: LoggedPool, cells: Cells, pred: Prediction, applied) -> Formula:
    T = kv.T
    return Formula(
        mem_fraction_static=ctx.util,
        mem_fraction_static_source=ctx.util_source,
        pre_load_free_gib=round(T, 2) if T is not None else None,
        pre_load_free_source="total GPU memory (vLLM's fraction is of the total)" if T is not None else None,
        post_load_free_gib=None,
        reserve_gib=round(T * (1 - ctx.util), 4) if (T is not None and ctx.util is not None) else None,
        rest_gib=kv.K,
        bytes_per_token=cells.cell,
        bytes_per_token_source=cells.source,
        predicted_tokens=pred.interval,
        logged_tokens=seen.logged,
        verdict=pred.verdict,
        verdict_reason=pred.reason,
        rule=("CPU backend: VLLM_CPU_KVCACHE_SPACE (host memory of a set size; no fraction applies)" if ctx.cpu
              else f"not modelled on {ctx.device[0]}: the device's own budget rule" if ctx.device is not None
              else rule_text(ctx, list(kv.budgets), applied, kv.fixed)),
        effective_mem_fraction_static=pred.effective_util,
        page_size=ctx.block_size,
        # "default (16 on CUDA)" when neither the args nor a hybrid layout line set it: not "log"
        page_size_source=("default" if ctx.block_source.startswith("default") else
                          "engine args" if ctx.block_source == "engine args" else "log"),
        max_total_tokens_cap=None,
        speculative_headroom_tokens=None,
        kv_bytes_per_token_logged=round(cells.line_cell.mid, 1) if cells.line_cell else None,
    )


def checked_findings(ctx: Context, opts: AuditOptions, kv: KVBudgets, seen: LoggedPool, cells: Cells,
                     ledgers: tuple, applied) -> list[Finding]:
    """The checks beyond the token count: budgets, ranks, failures, graphs, suggestions, headroom, concurrency."""
    th = opts.thresholds
    T, T_any, cell, logged = kv.T, kv.T or kv.T_note, cells.cell, seen.logged
    if ctx.device is not None:
        # no model of the device: the engine's own failures are said, nothing is computed against a CUDA rule
        return failure_findings(ctx, None, None, None, logged, kv.fixed)
    out: list[Finding] = []
    out += budget_findings(list(kv.budgets))
    out += rank_findings(ctx, ledgers, T, cell, th)
    out += failure_findings(ctx, kv.K, T, cell, logged, kv.fixed)
    out += graph_findings(ctx, applied, T_any, cell, th.low_headroom_gib, kv.T_note_range if kv.T is None else None)
    out += suggestion_findings(ctx, applied, T_any, list(kv.budgets))
    out += headroom_findings(ctx, ledgers, T, th)
    out += concurrency_findings(ctx, logged, ctx.hybrid is not None or cells.pool is not None or cells.swa is not None
                                or _mamba_line(ctx) is not None or grouped_line(ctx) is not None)
    return out


def closing_notes(ctx: Context, kv: KVBudgets, seen: LoggedPool) -> None:
    """What the reader should know about settings the log implies or does not state."""
    notes = ctx.notes
    for a in ctx.startup.of(AutoFit):
        notes.append(f"max_model_len auto-fit: {a.from_len:,} -> {a.to_len:,}"
                     + (f" to fit {a.kv_gib} GiB of KV memory" if a.kv_gib is not None else "")
                     + (f" + {a.host_gib} GiB on the host" if a.host_gib is not None else "") + f" (line {a.line})")
    if ctx.hybrid is not None:
        h = ctx.hybrid
        notes.append("hybrid pool: " + ", ".join(x for x in (
            f"attention block size {h.block_size} tokens (set so an attention page holds a Mamba page)"
            if h.block_size else "",
            f"Mamba page padded by {h.mamba_padding_pct:g}%" if h.mamba_padding_pct is not None else "") if x))
    pads = sorted({(int(e.value), e.extra) for e in ctx.startup.of(Setting) if e.key == "padding_layers"})
    if pads:
        # _get_kv_cache_groups_uniform_page_size pads the last group of a layer type; a padded layer takes its
        # share of every block, so the pool holds fewer tokens than its memory suggests
        notes.append("vLLM padded its KV cache groups (" + "; ".join(
            f"{n} padding layers, up to {pct:.2f}% of the KV memory unused" for n, pct in pads) +
            ", its warning): a padded layer takes its share of every block, which is why the pool holds fewer "
            "tokens than its GiB suggest")
    slept = [(rr.lines["sleep_freed_gib"], rr.rank.display, rr.r["sleep_freed_gib"], rr.r.get("sleep_in_use_gib"))
             for rr in ctx.facts.values() if "sleep_freed_gib" in rr.r]
    if slept:
        at, who, freed, in_use = min(slept)
        # worker.py / gpu_worker.py sleep(): freed = free after - free before; in use = total - free after
        notes.append(f"sleep mode (line {at}, {who}{f' and {len(slept) - 1} more' if len(slept) > 1 else ''}): "
                     f"{freed:.2f} GiB freed, {in_use:.2f} GiB of the card still in use after it (the device's total "
                     "minus its free memory: every process on it); printed after the startup, not part of its budget")
    if ctx.tp_at_least or ctx.tp_assumed:
        notes.append(f"TP size {'at least ' if ctx.tp_at_least else ''}{ctx.tp}: {ctx.tp_source}")
    mamba_at = _mamba_line(ctx)
    if ctx.block_source.startswith("default") and mamba_at is not None and ctx.hybrid is None:
        # a Mamba hybrid's attention block is raised to hold a Mamba page (model_executor/models/config.py), and
        # its 'Setting attention block size' line is not in the log: 16 would be a guess
        notes.append(f"a Mamba hybrid (line {mamba_at}: CUDA-graph sizes capped to its Mamba cache blocks, "
                     "config/compilation.py): its attention block size is set to fit a Mamba page, and the line "
                     "that states it is not in the log")
    elif ctx.block_source.startswith("default") and (pad := grouped_line(ctx)) is not None and not ctx.cpu:
        # a grouped pool (the padding warning): 16 for sliding-window groups, raised to hold a state page for a
        # Mamba/linear-attention hybrid (model_executor/models/config.py): the log does not say which
        notes.append(f"block size: not in the log; the pool is grouped (line {pad}), so it is 16 (vLLM's CUDA "
                     "default) for sliding-window groups but larger for a Mamba/linear-attention hybrid, whose "
                     "attention block is raised to hold a state page ('Setting attention block size')")
    elif ctx.block_source.startswith("default") and seen.logged is not None and (
            kv.K is not None or ctx.startup.of(Blocks)):
        # only where it was used: a prediction (a budget and a logged pool) or a block count read as tokens; a
        # failed or cut startup that logged neither sized nothing with it
        if not ctx.cpu:
            notes.append("block size 16 is vLLM's CUDA default; the log does not state it")
        elif not any(n.startswith("block size ") for n in notes):
            notes.append(f"block size {ctx.block_source[len('default ('):-1]}: the log does not state it (128, "
                         "the default with IPEX, is tried when 16 does not give the logged pool)")


def _cpu_budget_said(ctx: Context) -> str:
    """What the CPU backend's budget is, for its formula row: the space the log states, or that none does."""
    if ctx.cpu_space is None:
        return "VLLM_CPU_KVCACHE_SPACE, set in the environment: no line states it"
    gib, how, at = ctx.cpu_space
    return (f"VLLM_CPU_KVCACHE_SPACE's default (line {at}'s warning), not a measurement" if how == "default" else
            f"VLLM_CPU_KVCACHE_SPACE unset: the share of free host memory vLLM chose (line {at})")


def _mamba_line(ctx: Context) -> int | None:
    """The line of config/compilation.py's 'Capping cudagraph capture sizes ... to fit Mamba cache blocks' warning
    (0.18+, printed only for a hybrid Mamba/attention model), None when the log has none."""
    return next((e.line for e in ctx.startup.of(Setting) if e.key == "mamba_cache_blocks"), None)


def _model_summary(ctx: Context, pool: HybridPool | None, swa: SlidingWindowPool | None = None) -> ModelSummary:
    geom = ctx.geom
    arch = ctx.args.get("model") or (geom.architecture if geom else None)
    attention = "unknown"
    if geom is not None:
        attention = "mla" if geom.is_mla else "hybrid" if pool is not None else (
            "hybrid" if geom.is_mamba_hybrid else "sliding-window" if geom.is_hybrid_swa else "mha")
    return ModelSummary(str(arch) if arch else None, attention,
                        geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
                        (None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // ctx.tp)) if geom else None,
                        geom.head_dim if geom else None, ctx.kv_dtype, ctx.kv_elt, ctx.tp,
                        geom.source if geom else None, ctx.tp_at_least, ctx.tp_source)


def _seen_text(kvs: dict[str, float]) -> str:
    names = sorted(kvs)
    return ", ".join(names) if len(names) <= 4 else f"{len(names)} ranks"


#: how far below the budget shown a pool may sit and still be read as sized on an unseen worker's smaller
#: budget (real TP logs: 0.09 GiB of 8.11 on vllm#21348, 1.12 GiB of 21.47 on a two-node DGX Spark run)
UNSEEN_WORKER_GAP = 0.08


def _tp_that_fits(ctx: Context, line_cell: Interval, slack_b: int, K: float | None = None,
                  logged: int | None = None, budgets_seen: int = 0) -> tuple[int, int] | None:
    """The smallest TP (a power of two above the one assumed) at which the config's bytes per token fit the KV
    line: exactly, or, when the log shows fewer budgets than that TP has workers, as a pool within the smallest
    budget shown and close below it (vLLM sizes the pool on the smallest worker's budget,
    v1/core/kv_cache_utils.py get_kv_cache_configs)."""
    geom = ctx.geom
    assert geom is not None
    t = ctx.tp * 2
    while t <= 64:
        c, _ = cell_size(geom, t, ctx.kv_elt, ctx.pp, split_v=ctx.era.lo >= (0, 14, 0))
        if line_cell.contains(c, slack=c * 0.002 + slack_b):
            return t, c
        if K is not None and logged and budgets_seen < t * ctx.pp:
            pool = logged * c / GIB
            if pool <= K + LOG_HALF_ULP:
                return (t, c) if pool >= (K - LOG_HALF_ULP) * (1 - UNSEEN_WORKER_GAP) else None
        t *= 2
    return None


def _match_text(K, cell, block, pool: HybridPool | None, swa: SlidingWindowPool | None = None) -> str:
    if swa is not None:
        return (f"available KV {K} GiB in {swa.page_bytes:,} B pages x group size {swa.group_size}, "
                f"{swa.full_groups} full + {swa.swa_groups} sliding groups (window {swa.sliding_window})")
    if pool is not None:
        return (f"available KV {K} GiB in {pool.page_bytes:,} B pages x group size {pool.group_size}, "
                f"{pool.groups} groups, block {pool.block_size}")
    return f"floor(available KV {K} GiB / ({cell:,} B x block {block})) x {block}"


def _match_equation(logged: int, K: float, cell: int, block: int, rule: str) -> str:
    """The MATCH line with a budget inside the logged figure's rounding (+-0.005 GiB) that gives the logged count
    exactly, the fewest decimals first: the logged 3.81 GiB itself gives 31,200 where vllm_c014 has 31,232 (ux
    audit item 8: an equation redone by hand must give the number it claims). Without one (0.21+'s count is
    int(concurrency x max_model_len), within a block), the rule and the rounding's span."""
    for places in range(2, 6):
        step = 10 ** -places
        x = math.ceil((K - LOG_HALF_ULP) / step) * step
        while x <= K + LOG_HALF_ULP + 1e-12:
            text = f"{x:.{places}f}"
            if math.floor(float(text) * GIB / (cell * block)) * block == logged:
                if float(text) == K:
                    return f"{logged:,} tokens = {rule}"
                return (f"{logged:,} tokens = floor({text} GiB / ({cell:,} B x {block})) blocks x {block}; the "
                        f"logged {K} GiB is rounded to 0.01 ({K - LOG_HALF_ULP:.3f}..{K + LOG_HALF_ULP:.3f})")
            x += step
    return (f"{logged:,} tokens is within a block of {rule}, for a budget in the logged {K} GiB's rounding "
            f"({K - LOG_HALF_ULP:.3f}..{K + LOG_HALF_ULP:.3f})")


def _predict(ctx: Context, K, T, logged, logged_ev, cells: Cells, kvs: dict[str, float],
             exact: bool = False) -> Prediction:
    cell, bpt_source, pool, swa = cells.cell, cells.source, cells.pool, cells.swa
    if ctx.device is not None:
        # judged nothing: no budget rule, no block size, no count to hold against them (UNMODELLED_DEVICES)
        return Prediction(None, Verdict.UNKNOWN, f"vLLM on {ctx.device[0]} (line {ctx.device[1]}): kvaudit has no "
                                                 "model of this device's KV budget, so the pool is read, not checked")
    if logged_ev is not None and logged_ev.with_host:
        return Prediction(None, Verdict.UNKNOWN, f"the {logged_ev.device} + host count ({logged:,} tokens) includes "
                                                 "host-offloaded cache, which the GPU budget does not size")
    if K is None or logged is None:
        count = "the KV token or block count"
        # an error that names the pool's size (V0's max-seq-len check, 0.20+'s Mamba-blocks check) is no count
        # line kvaudit checks, but the log is not silent on it: say where it stands
        named = next(((f.line, f"{int(f.numbers['max_tokens']):,} tokens") if "max_tokens" in f.numbers else
                      (f.line, f"{int(f.numbers['mamba_blocks']):,} Mamba blocks")
                      for f in ctx.startup.of(Failure) if {"max_tokens", "mamba_blocks"} & set(f.numbers)), None)
        if named is not None:
            count += f" line (only the error names the pool: {named[1]}, line {named[0]})"
        died = next((f for f in ctx.startup.of(Failure) if f.kind in ("no_kv_memory", "kv_needed", "free_memory")),
                    None)
        if ctx.cpu and K is None and logged is not None:
            return Prediction(None, Verdict.UNKNOWN, (
                "the CPU backend's KV budget is VLLM_CPU_KVCACHE_SPACE, and no line states it (set in the "
                "environment: vLLM warns only when it is not set): the pool is read, not checked"))
        if logged is None and named is None and (died is not None or (K is not None and K <= 0)):
            # the engine stopped before it made a pool: nothing is missing from the log (ux audit item 36)
            why = (f"the KV budget was {K} GiB" if K is not None and K <= 0 else
                   f"line {died.line}" if died is not None else "")
            return Prediction(None, Verdict.UNKNOWN,
                              f"no pool to check: the startup failed before the KV pool was allocated ({why})")
        return Prediction(None, Verdict.UNKNOWN, "cannot check: the log lacks " + " and ".join(
            x for x, v in (("the available KV memory", K), (count, logged)) if v is None))
    if cells.unmodelled:
        return Prediction(None, Verdict.UNKNOWN, f"the pool's layout is not modelled here: {cells.unmodelled}")
    if cells.tp_fit_note:
        return Prediction(None, Verdict.UNKNOWN, cells.tp_fit_note)
    if bpt_source != "config":
        if ctx.hybrid is not None or _mamba_line(ctx) is not None:
            return Prediction(None, Verdict.UNKNOWN,
                              "a hybrid (Mamba) pool: its tokens per GiB follow from the layer groups, which need the "
                              "model config (--model-config)")
        if (pad := grouped_line(ctx)) is not None:
            return Prediction(None, Verdict.UNKNOWN,
                              f"a grouped pool (line {pad}: vLLM padded its KV cache groups, which it does only for "
                              "a model of two or more layer types): its tokens per GiB follow from the layer groups, "
                              "which need the model config (--model-config)")
        why = ("the config's bytes per token were not used (see GEOMETRY_MISMATCH)" if ctx.opts.model_geometry
               is not None else "no --model-config")
        return Prediction(None, Verdict.UNKNOWN,
                          f"bytes per token were derived from this same line ({why}), so the token count "
                          "cannot be checked independently")
    block = ctx.block_size
    if pool is not None or swa is not None:
        return _predict_grouped(ctx, K, logged, pool, swa)
    assert cell is not None  # bpt_source "config" above: the config gave bytes per token
    interval = block_interval(K, cell, block, exact)
    # V1 >= 0.21 reports int(concurrency x max_model_len), not blocks x block_size: allow one block
    slack = block if ctx.era.hi is None or ctx.era.hi >= (0, 21, 0) else 0
    rule = f"floor({f'{K:g}' if exact else K} GiB / ({cell:,} B x {block})) blocks x {block}"
    seen = sorted(kvs)
    complete = "all" in kvs or (not ctx.tp_at_least and len(seen) >= ctx.workers)
    if interval.high == 0 and logged == 0 and K + LOG_HALF_ULP <= 0:
        # a budget at or below zero: the engine clamps the block count at 0 (CLAMP_SOURCE), and 0 is the formula
        return Prediction(interval, Verdict.MATCH, f"0 tokens: the budget of {K} GiB is not positive, and vLLM "
                                                   f"clamps the block count at 0 ({CLAMP_SOURCE})")
    if interval.low - slack <= logged <= interval.high + slack:
        if exact:  # a size set in whole GiB: no rounding to search
            return Prediction(interval, Verdict.MATCH, f"{logged:,} tokens = {rule}")
        return Prediction(interval, Verdict.MATCH, _match_equation(logged, K, cell, block, rule))
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


def _predict_grouped(ctx: Context, K: float, logged: int, pool: HybridPool | None,
                     swa: SlidingWindowPool | None) -> Prediction:
    """A grouped pool (Mamba hybrid or sliding window): each rule the era and the count admit is checked on its
    own; the verdict names the one that holds. A setting the log does not state (max_num_batched_tokens, the Mamba
    cache mode) is tried at the release's values, each named; when none holds but another value of it would, the
    count is not checked (UNKNOWN), and it is a mismatch only when no value could give it."""
    mml = next((c.max_model_len for c in reversed(ctx.startup.of(Concurrency))), None) or as_int(
        ctx.args.get("max_model_len"))
    if pool is not None and ctx.block_source.startswith("default"):
        # HybridAttentionMambaModelConfig.verify_and_update_config raises the attention block so an attention page
        # holds a Mamba page and says so ("Setting attention block size to N tokens"): without that line the block
        # is not 16, and the Mamba state size that sets it is not in the config geometry read here
        return Prediction(None, Verdict.UNKNOWN, (
            "hybrid pool: the attention block size is not in the log (vLLM raises it so an attention page holds a "
            "Mamba page: the 'Setting attention block size to N tokens' line), so the count is not checked"))
    if pool is not None:
        cands, why = hybrid_candidates(K, pool, ctx, mml, _speculative_tokens(ctx.args), logged)
    else:
        assert swa is not None
        cands, why = sliding_candidates(K, swa, ctx, mml, logged)
    if why:
        ctx.notes.append(why)
    kind = "hybrid pool" if pool is not None else "sliding-window pool"
    if not cands:
        return Prediction(None, Verdict.UNKNOWN, f"{kind}: {why}")
    hit = next((c for c in cands if c.interval.contains(logged)), None)
    if hit is not None:
        if hit.assumed:
            ctx.notes.append(f"the count was checked with {hit.assumed}: the value that reproduces it")
        return Prediction(hit.interval, Verdict.MATCH, f"{logged:,} tokens = {hit.how}")
    near = min(cands, key=lambda c: min(abs(logged - c.interval.low), abs(logged - c.interval.high)))
    tried = "; ".join(f"{c.interval.low:,}..{c.interval.high:,} ({c.how})" for c in cands)
    if swa is not None and mml and any(c.assumed for c in cands):
        other = sliding_fits_some_batch(K, swa, mml, logged)
        if other is not None:
            return Prediction(near.interval, Verdict.UNKNOWN, (
                f"sliding-window pool: max_num_batched_tokens is not stated and none of its defaults gives "
                f"{logged:,} tokens; about {other:,} would: the count is not checked ({tried})"))
    if pool is not None and any(c.assumed for c in cands):
        return Prediction(near.interval, Verdict.UNKNOWN, (
            f"hybrid pool: the Mamba cache mode is not stated and neither mode gives {logged:,} tokens ({tried})"))
    return Prediction(near.interval, Verdict.MISMATCH, f"{logged:,} tokens is none of: {tried}")


def _speculative_tokens(args) -> int:
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        return as_int(spec.get("num_speculative_tokens")) or as_int(spec.get("num_spec_tokens")) or 0
    return as_int(args.get("num_speculative_tokens")) or 0


__all__ = ["reconcile"]
