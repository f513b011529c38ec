"""One SGLang startup -> an :class:`Audit`: T and post, the fraction, bytes per token, the prediction and
verdict, the ledgers and the findings. Pure: no I/O."""

from __future__ import annotations

import math

from dataclasses import replace
from typing import Any

from kvaudit.model_config import ModelGeometry
from kvaudit.parse.interface import Startup
from kvaudit.parse.sglang import (AiterFractionKept, CapWarning, Failure, HiCacheAutoSize, HiCacheHost, MfsAdjust,
                                  SlidingWindowSplit, WeightBegin, WeightEnd)
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
from kvaudit.reconcile.sglang.cell import (_one_full_pool, config_cell, kv_line_cell, nsa_fp8_line_not_budget,
                                          rocm_evidence, swa_pool_unused)
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.reconcile.sglang.checks import concurrency_findings, failure_findings, ledger_findings
from kvaudit.reconcile.sglang.context import (
    Context,
    build_context,
    context_length_of,
    logged_token_count,
    post_capture,
    rounded,
)
from kvaudit.reconcile.sglang import dsv4 as DSV4
from kvaudit.reconcile.sglang.formula import (Prediction, Rule, draft_rules, explain_mismatch, min_interval,
                                          predict_stages, rules_for)
from kvaudit.reconcile.sglang.pool import components, is_swa, state_gib
from kvaudit.reconcile.sglang.ledger import rank_ledger, request_table
from kvaudit.record import Record, record
from kvaudit.units import GIB, LOG_HALF_ULP, Interval

ENGINE = "sglang"

#: On unified memory (GB10 / DGX Spark, Jetson: kvaudit.platforms) SGLang's T is the free memory it reads at the end
#: of ``init_torch_distributed`` (model_runner.py ``init_torch_distributed`` -> ``get_available_gpu_memory``, all
#: 0.4.x-0.5.x releases), and the ``Load weight begin`` line prints a second reading taken later; on a card the two
#: agree to the rounding, on unified memory the host's own allocations between them (the same pool of system
#: memory) lower the printed one. Measured on 21 real GB10 startups (jethac/dgx-spark-hijinks @2916605, corpus
#: sglang_c026/c027/c030/c032..c035): every pool lies below the formula from the printed numbers, each needs T
#: 0.03..0.10 GiB above the printed line (none matches without it, all with it); the largest gap reported on GB10
#: is 0.063 GiB of budget at (1 - mfs) = 0.4, i.e. 0.16 GiB of T. The prediction therefore takes T in
#: [printed, printed + 0.16] there, and says so.
UNIFIED_T_DRIFT_GIB = 0.16
#: a widened prediction wider than this share of the pool checks nothing (a small budget on unified memory)
UNIFIED_MAX_SPREAD = 0.05
#: On ROCm the printed 'Load weight begin' reading is likewise only a lower bound of T. T is read at the end of
#: ``init_torch_distributed``; then ``ModelRunner.initialize`` runs ``compute_initial_expert_location_metadata``,
#: whose ``ModelConfigForExpertLocation.from_model_config`` calls ``get_model_architecture``: the model registry
#: imports every sglang model module (read in the 0.4.7, 0.5.6, 0.5.9 and 0.5.20 wheels: model_runner.py,
#: eplb/expert_location.py; AMD's logs print the registry's 'Ignore import error when loading
#: sglang.srt.models.mindspore' between 'Init torch distributed ends' and 'Load weight begin'), and only then
#: does ``load_model`` print its reading. On ROCm those imports (aiter, apex's fused RoPE, the HIP kernels they
#: load) take device memory; CUDA loads modules lazily. No line prints T itself ('Init torch distributed ends'
#: prints only the usage), so the drift is measured from the pools: on AMD's sglang-ci logs
#: (michael-amd/sglang-ci@0232641, 0.5.4-0.5.6 images on MI300X and MI355X) the 44 startups whose pool lies below
#: the printed numbers' formula need T 0.002..0.50 GiB above the printed reading (Grok 2.5 with aiter 0.25..0.50,
#: GPT-OSS and Qwen3-30B 0.03..0.14, DeepSeek-R1 PD 0.002..0.085; corpus sglang_c053). The prediction takes T in
#: [printed, printed + 0.6] (the largest seen, and a fifth more) where the log shows ROCm, and says so.
ROCM_T_DRIFT_GIB = 0.6
#: the releases whose ModelRunner reads T before that import (0.4.7, when expert-location metadata came in,
#: through 0.5.20, the newest read)
ROCM_T_DRIFT_RELEASES = ((0, 4, 7), (0, 5, 20))

def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    """The audit as a pipeline of named steps, each returning what it established (and the findings it raised)."""
    ctx = build_context(startup, opts)
    free = free_memory(ctx)
    fraction = fraction_of(ctx, opts)
    cells, raised = bytes_per_token(ctx, opts)
    findings: list[Finding] = list(raised)
    pools4 = DSV4.check(startup, ctx.args, _platform_T(ctx, opts, free.T, free.pre_source) if free.T else None,
                        free.post, fraction.value)
    if pools4 is not None:
        # DeepSeek-V4: one coefficient over the full/SWA/compressed pools, printed by the engine (reconcile/sglang/
        # dsv4.py); the KV lines of other models do not exist here
        cells = Cells(None, pools4.cell, "DSv4 memory calculation (bytes per full token)", None, pools4.logged, False)
        ctx.notes.extend(pools4.notes)
    elif DSV4.has_dsv4(startup):
        ctx.notes.append("DeepSeek-V4 pools (DeepSeekV4TokenToKVPool): checked from the engine's 'DSv4 memory "
                         "calculation' line, which this excerpt lacks; their sizes are not derived from a config")
    state = state_pool(ctx)
    budget = PoolBudget(cells.iv, state)
    cap, raised = cap_of(ctx, cells, budget)
    findings += raised
    (free, fraction), raised = solve_unknowns(ctx, free, fraction, cells, budget, cap)
    findings += raised
    outcome = verdict_of(ctx, opts, free, fraction, cells, state, cap)
    scaled = _aiter_scaled_alternative(ctx, fraction)
    if scaled is not None and outcome.verdict != Verdict.MATCH and cells.logged is not None:
        # a release range that spans the aiter rule change: the printed fraction is 0.5.5+'s rule, the printed
        # fraction x 0.85 0.4.9-0.5.4's; each is its own narrow check, never their union (AMD's v0.5.3 images:
        # models short by 15-35% under the first rule, within 0.3% under the second). The rule the count fits
        # (a match, else the nearer prediction) is the one reported, and said.
        second = verdict_of(ctx, opts, free, scaled, cells, state, cap)
        if second.verdict == Verdict.MATCH or (
                second.prediction is not None and outcome.prediction is not None
                and _gap(second.prediction.tokens, cells.logged) < _gap(outcome.prediction.tokens, cells.logged)):
            ctx.notes.append(f"the pool fits SGLang 0.4.9-0.5.4's aiter rule ({fraction.value} printed, x 0.85 "
                             "applied in ModelRunner after server_args is printed) rather than 0.5.5+'s (the printed "
                             "value already scaled): the release is 0.5.4 or older")
            fraction, outcome = scaled, second
    if pools4 is not None:
        outcome = dsv4_outcome(pools4)
    used = outcome.prediction.post if outcome.prediction is not None else None
    if used is not None and free.post_draft is not None and used == free.post_draft and free.post != used:
        # a 0.5.14+ rule sized the pool after the draft's weights (formula.py): its reading is the post shown
        free = replace(free, post=used, post_source="Load weight end (draft)")
        ctx.notes.append(_draft_post_note(ctx, used, "the release's rule"))
    resized, bound, bound_approx = post_capture(ctx)
    if resized and pools4 is None:
        outcome = post_capture_outcome(outcome, bound, bound_approx, cells.logged)
    if cap.cap and cells.logged is not None and cells.logged == cap.cap:
        pred = outcome.prediction
        findings.append(F.tokens_capped(cap.cap, (pred.uncapped or pred.tokens) if pred else None))
    shortfall, eff_mfs = shortfall_of(ctx, free, budget, outcome)
    formula = formula_of(ctx, free, fraction, cells, state, cap, replace(outcome, eff_mfs=eff_mfs))
    # the formula's verdict stands in the formula: kvaudit.verdict raises TOKENS_* from it (rule 6)
    ledgers = ledgers_of(ctx, cells, fp4_line_without_scales(cells, outcome))
    findings.extend(ledger_and_failure_findings(ctx, opts, ledgers, formula, free, shortfall, cells, outcome))
    host = host_pools(ctx)
    return Audit(
        lacks="scheduler summary (max_total_num_tokens=...)" if ctx.summary is None else None,
        engine=ENGINE,
        **startup_identity(startup, opts.source, startups_total),
        model=_model_summary(ctx, opts.model_geometry),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=ctx.spec_algo,
        hicache_host_gb=round(sum(p.host_gb for p in host), 2) if host else None,
        notes=tuple(ctx.notes),
        engine_display="SGLang",
        formula_text="rest = post - (1 - mfs) x T;  tokens = floor(rest x 2^30 / bytes per token)",
        formula_rows=_formula_rows(formula, free.post_source),
        pre_load_label="free before loading",
        budget_other_label="the weights and what else loaded before the pool",
        rocm=rocm_evidence(ctx),
    )


# ----------------------------------------------------------------------------------------------------------
# the steps


@record
class FreeMemory(Record):
    """T (free before the weights) and post (free after them), each the minimum over ranks."""

    T: Interval | None
    post: Interval | None
    pre_source: str | None
    #: where post was read: the target's 'Load weight end', or the draft's when SGLang sized the pool after it
    post_source: str = "Load weight end"
    #: the draft's 'Load weight end' reading, min over ranks, when the log shows it after the target's: the post
    #: of SGLang 0.5.14+ (Scheduler.init_model_worker loads the draft before init_memory_pools); already ``post``
    #: when the log also shows it before the pool
    post_draft: Interval | None = None

    def reserve(self, mfs: float | None) -> Interval | None:
        """(1 - mfs) x T: what the fraction holds back of the free memory before the weights."""
        return self.T.scale(1 - mfs) if (self.T is not None and mfs is not None) else None


@record
class Fraction(Record):
    value: float | None
    source: str | None


@record
class Cells(Record):
    """Bytes per token and where they come from; the token count the log states."""

    cell: Any  # cell.Cell from config.json, or None
    iv: Interval | None  # the bytes per token the formula uses
    source: str | None
    line_mid: float | None  # what the KV line implies
    logged: int | None
    approx: bool


@record
class PoolBudget(Record):
    """What a pool of N tokens (and the state pool) takes out of the budget."""

    cell_iv: Interval | None
    state: Interval | None

    def gib(self, tokens: int) -> float:
        assert self.cell_iv is not None
        return tokens * self.cell_iv.mid / GIB + (self.state.mid if self.state is not None else 0.0)


@record
class Cap(Record):
    cap: int | None  # --max-total-tokens
    probable: str | None  # why the pool looks capped although no cap is stated
    capped: bool
    engine_rest: float | None  # the KV budget the engine logged


@record
class Outcome(Record):
    prediction: Prediction | None
    verdict: Verdict
    reason: str
    eff_mfs: float | None
    negative: tuple  # CapWarning lines with a negative profiled count


def free_memory(ctx: Context) -> FreeMemory:
    facts = ctx.facts
    pres = [rf.pre for rf in facts.values() if rf.pre is not None]
    T = min_interval(pres)
    post = min_interval([rf.post for rf in facts.values() if rf.post is not None])
    prof = DSV4.memory_profile(ctx.startup)
    if prof is not None and (T is None or post is None):
        # DeepSeek-V4 launch builds print the two readings the budget is made of (reconcile/sglang/dsv4.py):
        # total_gpu_memory is the model runner's pre-load free memory, available_gpu_memory the free memory now
        return FreeMemory(T or Interval.logged(prof.total_gib), post or Interval.logged(prof.available_gib),
                          "Load weight begin" if T is not None else "Memory profiling (total_gpu_memory)")
    if T is not None and len(pres) < len(facts):
        ctx.notes.append(f"T is the minimum over the {len(pres)} of {len(facts)} ranks whose lines are in the log")
    pre_source = next((rf.pre_source for rf in facts.values() if rf.pre_source), None)
    before_pool = min_interval([rf.draft_post_before_pool for rf in facts.values()
                                if rf.draft_post_before_pool is not None])
    if post is not None and before_pool is not None:
        # the log shows the draft loaded between the target's weights and its pool (SGLang 0.5.14+,
        # managers/scheduler.py init_model_worker: init_tp_model_worker, maybe_init_draft_worker,
        # init_memory_pools; _profile_available_bytes reads the free memory then): that reading sized the pool,
        # whatever the release range says
        ctx.notes.append(_draft_post_note(ctx, before_pool, "the log's order"))
        return FreeMemory(T, before_pool, pre_source, "Load weight end (draft)", before_pool)
    # an excerpt without the pool's lines does not show the order: the draft's reading is the post of the
    # 0.5.14+ rules only (verdict_of)
    after = [Interval.logged(rf.draft_post) for rf in facts.values()
             if rf.draft_post is not None and rf.lines.get("weights") is not None
             and rf.lines.get("draft_weights", -1) > rf.lines["weights"] and "pool_start" not in rf.lines]
    return FreeMemory(T, post, pre_source, post_draft=min_interval(after) if post is not None else None)


def _draft_post_note(ctx: Context, post: Interval, why: str) -> str:
    lines = sorted(rf.lines["draft_weights"] for rf in ctx.facts.values() if "draft_weights" in rf.lines)
    where = f" (line {lines[0]})" if lines else ""
    return (f"post is the draft's 'Load weight end' reading, {post.mid:.2f} GiB{where}, not the target's: SGLang "
            "0.5.14+ loads the draft's weights before it sizes the pool (managers/scheduler.py init_model_worker: "
            "init_tp_model_worker, maybe_init_draft_worker, then init_memory_pools, whose _profile_available_bytes "
            f"reads the free memory after both); taken by {why}")


def fraction_of(ctx: Context, opts: AuditOptions) -> Fraction:
    """mem_fraction_static: server_args, the user's flag, the engine's own reductions (multimodal, aiter)."""
    mfs = as_float(ctx.args.get("mem_fraction_static"))
    source = "server_args" if mfs is not None else None
    if opts.mem_fraction_static is not None:
        if mfs is not None and abs(mfs - opts.mem_fraction_static) > 1e-9:
            ctx.notes.append(f"--mem-fraction-static {opts.mem_fraction_static} overrides server_args' {mfs}")
        mfs, source = opts.mem_fraction_static, "cli"
    prof = DSV4.memory_profile(ctx.startup)
    if mfs is None and prof is not None:
        mfs, source = prof.mem_fraction_static, "Memory profiling line (two decimals)"
    adjust = ctx.startup.of(MfsAdjust)
    if adjust and source != "cli":
        mfs, source = adjust[-1].mem_fraction_static, "log (multimodal reduction)"
    if mfs is not None and str(ctx.args.get("attention_backend")) == "aiter" and source == "server_args":
        # AMD aiter with a context above 8192 scales the fraction by 0.85. 0.4.9-0.5.4 do it in ModelRunner, after
        # server_args is printed (model_runner.py model_specific_adjustment): the printed value is scaled here.
        # From 0.5.5 ServerArgs.__post_init__ does it (server_args.py _handle_attention_backend_compatibility;
        # arg_groups/attention_hook.py from 0.5.19, also on an explicit fraction unless
        # SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION, PR 37242, which logs that it kept it): the printed value
        # (resolved_dict) already includes it, or is the kept one.
        ctx_len = context_length_of(ctx)
        kept = ctx.startup.of(AiterFractionKept)
        if kept:
            ctx.notes.append(f"aiter backend: SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION kept the explicit fraction "
                             f"{kept[0].mem_fraction_static:g} as-is (0.5.19+, attention_hook.py; no x 0.85), so "
                             "less is left for the attention workspace and CUDA graphs")
        elif ctx_len and ctx_len > 8192 and ctx.era.overlaps((0, 4, 9), (0, 5, 4)):
            if ctx.era.within((0, 4, 9), (0, 5, 4)):
                ctx.notes.append(f"aiter backend with context {ctx_len:,} > 8192: SGLang <=0.5.4 uses {mfs} x 0.85 "
                                 "(ModelRunner, after server_args is printed)")
                mfs, source = round(mfs * 0.85, 6), f"{source} x 0.85 (aiter)"
            else:
                ctx.notes.append(f"aiter backend with context {ctx_len:,} > 8192: SGLang 0.4.9-0.5.4 scales the "
                                 "printed fraction by 0.85, 0.5.5+ prints it already scaled; this log's release "
                                 f"range ({ctx.era}) spans both, so the printed {mfs} is checked first and "
                                 f"{mfs} x 0.85 where the pool does not match it")
        elif ctx_len and ctx_len > 8192 and ctx.era.lo >= (0, 5, 5):
            ctx.notes.append(f"aiter backend with context {ctx_len:,} > 8192: the printed fraction {mfs} already "
                             "includes SGLang's x 0.85 (ServerArgs post-processing, 0.5.5+)")
    return Fraction(mfs, source)


def _gap(tokens: Any, logged: int) -> int:
    """How far a logged count lies outside a predicted interval (0 inside it)."""
    return max(tokens.low - logged, logged - tokens.high, 0)


def _aiter_scaled_alternative(ctx: Context, fraction: Fraction) -> Fraction | None:
    """The fraction under 0.4.9-0.5.4's aiter rule (printed x 0.85) when the log's release range spans that rule
    and 0.5.5+'s (the printed value already scaled), the aiter backend runs at a context above 8,192 and the
    fraction is the printed one; else None (one rule applies, and fraction_of used it)."""
    mfs = fraction.value
    if (mfs is None or fraction.source != "server_args" or str(ctx.args.get("attention_backend")) != "aiter"
            or ctx.startup.of(AiterFractionKept)):
        return None
    ctx_len = context_length_of(ctx)
    if not ctx_len or ctx_len <= 8192 or not ctx.era.overlaps((0, 4, 9), (0, 5, 4)) \
            or ctx.era.within((0, 4, 9), (0, 5, 4)):
        return None
    return Fraction(round(mfs * 0.85, 6), "server_args x 0.85 (aiter, 0.4.9-0.5.4's rule)")


def bytes_per_token(ctx: Context, opts: AuditOptions) -> tuple[Cells, tuple[Finding, ...]]:
    """From config.json when there is one, checked against what the KV line implies; else the KV line's. With
    the findings this step raised (a config that disagrees with the line)."""
    findings: list[Finding] = []
    logged, approx = logged_token_count(ctx)
    geom: ModelGeometry | None = opts.model_geometry
    cell, cell_note = config_cell(ctx)
    line_cell, line_mid = kv_line_cell(ctx, None if approx else logged)
    source = None
    iv: Interval | None = None
    if cell is not None:
        iv, source = Interval.exact(cell.profile), "config"
        if line_cell is not None and cell.pool_without_scales is not None and not line_cell.contains(
                cell.pool, slack=0.5) and line_cell.contains(cell.pool_without_scales, slack=0.5):
            # an FP4 pool whose KV line counts the packed values only (SGLang <=0.5.14's get_kv_size_bytes)
            ctx.notes.append(f"the KV line counts the FP4 values without their scales ({cell.pool_without_scales:,} "
                             f"of the {cell.pool:,} B a token holds): SGLang up to 0.5.14 logs k/v_buffer only")
            cell = replace(cell, pool=cell.pool_without_scales)
        mixed = _mixed_kv(ctx, geom)
        if mixed and line_cell is not None:
            # the config gives K and V one size; the lines do not: a layout kvaudit does not model, not a wrong model
            ctx.notes.append(mixed)
            iv, source = line_cell, "kv_line"
        elif line_cell is not None and not opts.hypothetical and not line_cell.contains(cell.pool, slack=0.5):
            over = line_over_budget(ctx, line_cell, None if approx else logged)
            if over is not None:
                # the line counts bytes the division did not price: it is no evidence against the config's cell
                ctx.notes.append(over + "; the config's bytes per token are used")
            else:
                findings.append(F.geometry_mismatch(cell.pool, line_mid or 0, geom.source if geom else "config"))
                iv, source = line_cell, "kv_line (config disagrees)"
    elif line_cell is not None and nsa_fp8_line_not_budget(ctx):
        source = "none: the NSA FP8 KV line gives the stored rows, not the budget's bytes per token"
    elif line_cell is not None and (over := line_over_budget(ctx, line_cell, None if approx else logged)):
        source = "none: " + over
    elif line_cell is not None:
        iv, source = line_cell, "kv_line"
    if cell_note:
        ctx.notes.append(cell_note)
    unused = swa_pool_unused(ctx)
    if unused is not None:
        findings.append(unused)
    if geom is not None and geom.defaults_used and cell is not None:
        ctx.notes.append(f"the config leaves out {', '.join(geom.defaults_used)}: taken from its model family's "
                         f"defaults ({geom.model_type}), as SGLang's AutoConfig does")
    return Cells(cell, iv, source, line_mid, logged, approx), tuple(findings)


def state_pool(ctx: Context) -> Interval | None:
    """A hybrid linear-attention model's state pool comes out of the same budget (0.5.2+, reference §2.6):
    what the budget was charged for, without the state pool's padding slot (pool.budget_share)."""
    spec = ctx.spec_algo is not None
    states = [s for s in (state_gib(components(rf), budget=not spec) for rf in ctx.facts.values()) if s is not None]
    if not states:
        return None
    g, parts = max(states)
    return Interval(g - parts * LOG_HALF_ULP, g + parts * LOG_HALF_ULP)


def cap_of(ctx: Context, cells: Cells, budget: PoolBudget) -> tuple[Cap, tuple[Finding, ...]]:
    """A capped pool (--max-total-tokens, the engine's cap warning, or one that looks capped): the fraction
    cannot be read from it. With the finding of a probable cap."""
    logged = cells.logged
    cap = as_int(ctx.args.get("max_total_tokens"))
    engine_rest = min((rf.kv_budget for rf in ctx.facts.values() if rf.kv_budget is not None), default=None)
    probable = None
    if cap is None and logged and not cells.approx and "max_total_tokens" not in ctx.args:
        if engine_rest is not None and cells.iv is not None and budget.gib(logged) < 0.9 * engine_rest:
            probable = (f"{logged:,} tokens take {budget.gib(logged):.2f} GiB, well below the "
                        f"{engine_rest:.2f} GiB the engine logged as available for the KV cache")
        elif logged % 1000 == 0:
            probable = f"{logged:,} is a round number, not what a memory budget divides into"
    capped = (cap is not None and cap == logged) or bool(ctx.startup.of(CapWarning)) or probable is not None
    raised = (F.tokens_capped_probably(logged, probable),) if probable and logged else ()
    return Cap(cap, probable, capped, engine_rest), raised


def solve_unknowns(ctx: Context, free: FreeMemory, fraction: Fraction, cells: Cells, budget: PoolBudget, cap: Cap
                   ) -> tuple[tuple[FreeMemory, Fraction], tuple[Finding, ...]]:
    """The fraction from the engine's own KV budget, else inferred; T from the tokens when the log lacks it.
    A value solved here is said so: the check that would use it cannot be made (verdict_of). With the finding
    of an inferred fraction."""
    findings: list[Finding] = []
    T, post, logged = free.T, free.post, cells.logged
    if fraction.value is None and cap.engine_rest is not None and T is not None and post is not None:
        fraction = Fraction(round(1 - (post.mid - cap.engine_rest) / T.mid, 4),
                            "solved from the logged 'available memory for KV cache'")
    if fraction.value is None and not cap.capped and T is not None and post is not None and logged \
            and cells.iv is not None:
        inferred = 1 - (post.mid - budget.gib(logged)) / T.mid
        if 0 < inferred < 1:
            # T and post are printed to 0.01 GiB: a 4th decimal would be noise (ux audit item 20)
            fraction = Fraction(round(inferred, 3), "inferred")
            allocated = [st[0] for st in (state_gib(components(rf)) for rf in ctx.facts.values()) if st is not None]
            findings.append(F.mfs_inferred(round(inferred, 3),
                                           budget.state.mid if budget.state is not None else None,
                                           max(allocated) if allocated else None))
    mfs = fraction.value
    if T is None and mfs is not None and mfs < 1 and post is not None and logged and cells.iv is not None \
            and not cells.approx:
        t_mid = (post.mid - budget.gib(logged)) / (1 - mfs)
        free = FreeMemory(Interval(t_mid - 0.01, t_mid + 0.01), post,
                          "solved from the logged tokens (no 'Load weight begin' line)")
    return (free, fraction), tuple(findings)


def verdict_of(ctx: Context, opts: AuditOptions, free: FreeMemory, fraction: Fraction, cells: Cells,
               state: Interval | None, cap: Cap) -> Outcome:
    """The formula's prediction under each rule of the release, and whether the logged count is one of them."""
    T, post, mfs, cell_iv, logged = free.T, free.post, fraction.value, cells.iv, cells.logged
    negative = tuple(ev for ev in ctx.startup.of(CapWarning) if ev.profiled < 0)
    missing = [name for name, v in (("T (pre-load free memory)", T), ("free memory after weights", post),
                                    ("mem_fraction_static", mfs), ("bytes per token", cell_iv)) if v is None]
    preds: list[Prediction] = []
    formula_rests: list[Interval] = []  # post - (1 - mfs) x T per rule, when the engine's own budget is divided
    engine_budget: Interval | None = None
    rules, unmodelled = _spec_rules(ctx)
    if not missing:
        assert T is not None and post is not None and mfs is not None and cell_iv is not None
        geom = opts.model_geometry
        draft_layers = (geom.num_nextn_predict_layers or 1) if geom is not None else None
        # the layers SGLang's cell counts (DefaultPoolConfigurator: a Mamba hybrid's full-attention layers only)
        target_layers = ((geom.full_attention_layers if geom.is_mamba_hybrid and geom.full_attention_layers
                          else geom.num_layers) if geom is not None else None)
        t_pred = _platform_T(ctx, opts, T, free.pre_source)
        fp4_line = cells.source == "kv_line" and ctx.kv_elt == 0.5 and not any(
            k.kv_gib is not None for rf in ctx.facts.values() for k in rf.kv)
        ordered = free.post_source == "Load weight end (draft)"  # the log shows the draft before the pool
        engine_budget = _engine_budget(ctx, cap, state)
        for r in rules:
            draft = r.after_draft and free.post_draft is not None
            stages = _stage_inputs(ctx, free.post_draft or post if draft else post, cell_iv, cells.source,
                                   draft=draft or ordered)
            preds.append(predict_stages(ctx, r, t_pred, stages, mfs, state, draft_layers, target_layers,
                                        engine_budget))
            if engine_budget is not None:
                formula_rests.append(stages[0][0] - t_pred.scale(1 - mfs))
        if fp4_line:
            # FP4 MHA without a config: the budget divides by values + scales (pool_configurator.py
            # _compute_cell_size: 1 scale byte per 16 half-byte values, 9/8 of the values), and the KV line counts
            # the values alone up to 0.5.14 (get_kv_size_bytes) and both from 0.5.16: each reading is checked
            for r in rules:
                draft = r.after_draft and free.post_draft is not None
                stages = _stage_inputs(ctx, free.post_draft or post if draft else post, cell_iv, cells.source,
                                       draft=draft or ordered)
                scaled = [(p, Interval(c.lo * 9 / 8, c.hi * 9 / 8)) for p, c in stages]
                preds.append(predict_stages(ctx, replace(r, name=r.name + "; " + FP4_SCALED),
                                            t_pred, scaled, mfs, state, draft_layers, target_layers, engine_budget))
                if engine_budget is not None:
                    formula_rests.append(stages[0][0] - t_pred.scale(1 - mfs))
    if engine_budget is not None and formula_rests:
        note = ("the engine printed its KV budget ('The available memory for KV cache is "
                f"{engine_budget.mid:.2f} GB'): the tokens are predicted from it, not from post - (1 - mfs) x T on "
                f"the printed readings ({formula_rests[0].mid:.3f} GiB), which the engine takes at other moments "
                "(T at the end of init_torch_distributed, the free memory inside profile_max_num_token, each the "
                f"minimum over ranks); the two agree to {ENGINE_BUDGET_TOL_GIB} GiB or the count is not checked")
        ctx.notes.append(note)
    if unmodelled and not missing:
        ctx.notes.append("not modelled for this release range and speculative algorithm: " + "; ".join(unmodelled))
    first = preds[0] if preds else None
    if cap.probable:
        reason = (f"the pool looks capped ({cap.probable}); a capped pool does not follow from the formula, "
                  "and the fraction is not inferred from it")
        if first is not None:
            reason += f"; the formula allows up to {first.tokens.high:,}"
        return Outcome(first, Verdict.UNKNOWN, reason, None, negative)
    if not preds and unmodelled and not missing:
        return Outcome(None, Verdict.UNKNOWN, "not checked: " + "; ".join(unmodelled), None, negative)
    if missing or logged is None:
        wants = missing + ([] if logged is not None else ["the KV pool's token count"])
        died = _failed_before_pool(ctx)
        if died is not None and logged is None:
            # the server never made a pool: nothing is missing from the log, and no more of it would help
            reason = f"no pool to check: the startup failed before the KV pool was allocated (line {died})"
            if first is not None:
                reason += f"; the formula gives {first.tokens.low:,}..{first.tokens.high:,} tokens"
            return Outcome(first, Verdict.UNKNOWN, reason, None, negative)
        nsa = nsa_fp8_line_not_budget(ctx) if "bytes per token" in missing and cells.cell is None else None
        if first is None and nsa and cells.line_mid is not None:
            reason = f"not checked: {nsa}"
        elif first is None and cells.source and cells.source.startswith("none: ") and cells.line_mid is not None:
            reason = "not checked: " + cells.source[len("none: "):] + _how_to_check(
                wants, opts.model_geometry is not None, ctx.startup)
        elif first is None:
            reason = ("cannot check: the log lacks " + ", ".join(wants)
                      + _how_to_check(wants, opts.model_geometry is not None, ctx.startup))
        else:
            reason = (f"the formula gives {first.tokens.low:,}..{first.tokens.high:,} tokens; the log does not say "
                      "what the engine allocated (no KV line or scheduler summary)")
        return Outcome(first, Verdict.UNKNOWN, reason, None, negative)
    assert first is not None
    if cells.approx:
        return Outcome(first, Verdict.UNKNOWN,
                       f"the log gives the token count only approximately ({logged:,}, abridged); the formula "
                       f"gives {first.tokens.low:,}..{first.tokens.high:,}", None, negative)
    if fraction.source == "inferred":
        return Outcome(None, Verdict.UNKNOWN,
                       "mem_fraction_static was inferred from these same numbers, so the token count cannot be "
                       "checked independently; pass --mem-fraction-static to check it", None, negative)
    if free.pre_source and free.pre_source.startswith("solved"):
        return Outcome(None, Verdict.UNKNOWN,
                       "T was solved from the token count, so the token count cannot be checked independently",
                       None, negative)
    hit = next((p for p in preds if p.tokens.contains(logged)), None)
    if hit is not None and engine_budget is not None:
        off = _budget_off(engine_budget, formula_rests[preds.index(hit)])
        if off is not None and off > ENGINE_BUDGET_TOL_GIB:
            return Outcome(hit, Verdict.UNKNOWN,
                           f"{logged:,} tokens is the engine's own budget of {engine_budget.mid:.2f} GiB divided "
                           f"({hit.rule.name}), but that budget is {off:.3f} GiB off post - (1 - mfs) x T from the "
                           "printed readings: the budget it was computed from is not checked", None, negative)
    both = _rules_that_fit(preds, logged, ctx.page_size)
    if hit is not None and both is not None:
        a, b = both
        return Outcome(hit, Verdict.UNKNOWN,
                       f"{logged:,} tokens fits both the '{a.rule.name}' rule ({a.tokens.low:,}..{a.tokens.high:,}) "
                       f"and the '{b.rule.name}' rule ({b.tokens.low:,}..{b.tokens.high:,}) of the release range, "
                       "which size the pool differently: these numbers cannot tell which one the build follows, "
                       "so the count is not checked", None, negative)
    widened = T is not None and _platform_T(ctx, opts, T, free.pre_source) != T
    if hit is not None and widened and hit.tokens.high - hit.tokens.low > UNIFIED_MAX_SPREAD * hit.tokens.high:
        # a small budget: the platform's drift alone spans much of it, and a check that cannot fail is no match
        rocm = T is not None and _rocm_T(ctx, T, free.pre_source) != T
        where, drift = ("on ROCm", ROCM_T_DRIFT_GIB) if rocm else ("on unified memory", UNIFIED_T_DRIFT_GIB)
        return Outcome(hit, Verdict.UNKNOWN,
                       f"{logged:,} tokens lie in {hit.tokens.low:,}..{hit.tokens.high:,}, but {where} T "
                       f"may be up to {drift} GiB above the printed reading, which spans more than "
                       f"{UNIFIED_MAX_SPREAD:.0%} of this small pool: not checked", None, negative)
    if hit is not None and _cap_bound(hit, cap.cap, logged):
        assert hit.uncapped is not None
        return Outcome(hit, Verdict.MATCH,
                       f"{logged:,} tokens is the --max-total-tokens cap: the fraction's budget allows "
                       f"{hit.uncapped.low:,}..{hit.uncapped.high:,}, so the cap, not mem_fraction_static, sized the "
                       "pool", None, negative)
    if hit is not None:
        return Outcome(hit, Verdict.MATCH,
                       f"{logged:,} tokens lie in the predicted interval {hit.tokens.low:,}..{hit.tokens.high:,}"
                       + (f" ({hit.rule.name}; kvaudit makes no prediction for the rest of the release range: "
                          f"{'; '.join(unmodelled)})" if unmodelled else ""),
                       None, negative)
    assert T is not None and post is not None and mfs is not None and cell_iv is not None
    if unmodelled:
        # the count fits none of the modelled rules, and the release range holds a rule kvaudit cannot compute:
        # a mismatch would be a guess
        return Outcome(first, Verdict.UNKNOWN,
                       f"{logged:,} tokens lie outside {first.tokens.low:,}..{first.tokens.high:,} "
                       f"({first.rule.name}); not judged: " + "; ".join(unmodelled), None, negative)
    read = sum(1 for rf in ctx.facts.values() if rf.pre is not None and rf.post is not None)
    ranks = max(len(ctx.facts), ctx.tp * ctx.pp)
    if 0 < read < ranks and logged < first.tokens.low:
        # SGLang takes T and the post-weights reading as the minimum over every rank (get_available_gpu_memory
        # with distributed=True; min_per_gpu_memory): the ranks the log does not show can only lower the budget
        # (their weights are the same shard size, so a rank with d GiB less free memory has d x mfs GiB less
        # rest). From a subset of ranks the prediction is an upper bound: fewer tokens is not judged, more is.
        short = (first.tokens.low - logged) * cell_iv.mid / GIB
        return Outcome(first, Verdict.UNKNOWN,
                       f"{logged:,} tokens is {first.tokens.low - logged:,} fewer than the "
                       f"{first.tokens.low:,}..{first.tokens.high:,} predicted from the readings of {read} of "
                       f"{ranks} ranks; SGLang sizes the pool from the minimum over all ranks, and a rank the log "
                       f"does not show with {short / mfs:.2f} GiB less free memory gives this count: not judged "
                       "(more tokens than predicted would be)", None, negative)
    verdict, reason, eff_mfs = explain_mismatch(ctx, first, logged, T, first.post or post, mfs, cell_iv, cap.cap,
                                                state)
    return Outcome(first, verdict, reason, eff_mfs, negative)


#: why kvaudit does not check a pool sized after capture (docs/sglang-log-grammar.md, "Post-capture KV sizing")
POST_CAPTURE_NOT_MODELLED = (
    "post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, SGLang 0.5.16+): the pool was sized again after "
    "CUDA-graph capture, from the free memory then less (1 - mfs) x T and terms the log does not print (the KV "
    "pages already backed, a multimodal reservation, a Mamba reserve; kv_pool_runtime.py "
    "compute_post_capture_kv_resize): kvaudit does not model it, so the pool size is not checked")


def post_capture_outcome(before: Outcome, bound: int | None, approx: bool, logged: int | None) -> Outcome:
    """A pool sized after capture is not judged: the pre-capture formula sizes only the address space (the 'VA
    upper bound'), which caps the final pool; a comparison with it would be a false mismatch."""
    reason = POST_CAPTURE_NOT_MODELLED
    if bound is not None:
        reason += (f"; the pre-capture sizing reserved address space for {'about ' if approx else ''}{bound:,} "
                   "tokens (the 'VA upper bound' line), the most the pool can hold")
    if logged is None:
        reason += "; the excerpt ends before the 'Post-capture KV sizing' line that gives the pool"
    pred = before.prediction
    if pred is not None:
        reason += (f"; the pre-capture formula gives {pred.tokens.low:,}..{pred.tokens.high:,} tokens for that "
                   "bound")
    return Outcome(None, Verdict.UNKNOWN, reason, None, before.negative)


def host_pools(ctx: Context) -> list[HiCacheHost]:
    """The HiCache host pools of one rank (the lowest that logged any): host RAM per rank."""
    pools = ctx.startup.of(HiCacheHost)
    if not pools:
        return []
    first = min(p.rank for p in pools)
    return [p for p in pools if p.rank == first]


def dsv4_outcome(c: DSV4.DSv4Check) -> Outcome:
    """The DeepSeek-V4 verdict: the engine's division checked to the page, and the budget it started from checked
    against post - (1 - mfs) x T (a budget off the formula is a mismatch even when the division is right)."""
    rule = Rule(DSV4.RULE, (0, 5, 10), None)
    pred = Prediction(c.tokens, rule, None, c.cell)
    reason = c.reason + (f"; {c.budget_note}" if c.budget_note else "")
    verdict = c.verdict
    if c.budget_off and verdict == Verdict.MATCH:
        verdict = Verdict.MISMATCH
        reason = f"{c.budget_note}; the division itself is right ({c.reason})"
    return Outcome(pred, verdict, reason, None, ())


def line_over_budget(ctx: Context, line_cell: Interval, logged: int | None) -> str | None:
    """Why the KV line's bytes per token are not the ones the budget was divided by, or None: the pool holds more
    tokens than the engine's own printed budget ('The available memory for KV cache is X GB') holds at the line's
    bytes, beyond any EAGLE headroom (0.4.4-0.5.6). The division cannot give more tokens than the budget holds, so
    the line counts bytes the division did not price. Seen on the Ascend A3 images cann8.5-a3-release20260113..17
    (shun8686/for_debug logs/log_0116.tar.gz): DeepSeek-V3.2 prints 'KV size: 5.52 GB' beside a 5.03 GB budget,
    the indexer's keys at 2 B in the line against about 1 B (and scales) in the division."""
    budget = min((rf.kv_budget for rf in ctx.facts.values() if rf.kv_budget is not None), default=None)
    if budget is None or logged is None or line_cell.lo <= 0:
        return None
    reqs = as_int(ctx.args.get("max_running_requests")) or 48
    steps = as_int(ctx.args.get("speculative_num_steps")) or 0
    topk = as_int(ctx.args.get("speculative_eagle_topk")) or 1
    draft_tokens = as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
    head = reqs * (steps * topk + draft_tokens) + 100 if ctx.spec_algo is not None else 0
    most = math.floor((budget + LOG_HALF_ULP) * GIB / line_cell.lo) + head
    if logged <= most:
        return None
    return (f"the pool's {logged:,} tokens at the KV line's {line_cell.mid:,.0f} B each exceed the engine's own "
            f"budget of {budget:.2f} GiB (at most {most:,} tokens): the line counts bytes the division did not "
            "price, so its bytes per token are not the budget's")


#: How far the budget an SGLang build prints ('The available memory for KV cache is X GB', the engine's own
#: ``rest``) may lie from ``post - (1 - mfs) x T`` on the printed readings and still be that formula: the engine
#: reads T at the end of init_torch_distributed and the free memory again inside profile_max_num_token, both as
#: the minimum over ranks, while the log prints each rank's 'Load weight begin'/'Load weight end' readings.
#: Measured on the Ascend A3 images cann8.3.rc2-a3-release1223..release20260106 (shun8686/for_debug @a2acf677 and
#: @dd831fee, corpus sglang_c075-c079; 63 audited startups with the line, the harness and pod logs repeat some):
#: the printed budget less the readings' formula is -0.022..+0.032 GiB (midpoints; as intervals each within
#: 0.03 GiB) on every startup but the Qwen3-480B DP-attention PD prefill's +0.046/+0.050 (c079 and its December
#: sibling), which is therefore not checked.
ENGINE_BUDGET_TOL_GIB = 0.03


def _engine_budget(ctx: Context, cap: Cap, state: Interval | None) -> Interval | None:
    """The budget the engine printed, as the interval its two decimals allow: what it divided by the bytes per
    token. Not with a state pool (whether the line is before or after the Mamba share is not known) nor with
    pipeline stages (each stage has its own)."""
    if cap.engine_rest is None or state is not None or ctx.pp > 1:
        return None
    return Interval.logged(cap.engine_rest)


def _budget_off(printed: Interval, formula: Interval | None) -> float | None:
    """GiB between the engine's printed budget and post - (1 - mfs) x T (0 when the intervals meet)."""
    if formula is None:
        return None
    return max(0.0, formula.lo - printed.hi, printed.lo - formula.hi)


def _rules_that_fit(preds: list[Prediction], logged: int, page: int) -> tuple[Prediction, Prediction] | None:
    """Two rules of the release range that both hold the count while they size the pool differently (their
    predictions' middles more than a page apart, e.g. EAGLE headroom to 0.5.6 and none from 0.5.7; two readings
    of one rule, such as the FP4 cell's, are not two eras): a match
    under either would hold only through the slack that spans both, and says nothing of which one the build
    follows."""
    fit = [p for p in preds if p.tokens.contains(logged)]
    for i, a in enumerate(fit):
        for b in fit[i + 1:]:
            apart = abs((a.tokens.low + a.tokens.high) - (b.tokens.low + b.tokens.high)) > 2 * max(page, 1)
            if (a.rule.lo, a.rule.hi) != (b.rule.lo, b.rule.hi) and apart:
                return a, b
    return None


def _spec_rules(ctx: Context) -> tuple[list[Rule], list[str]]:
    """The rules of the log's release range for its speculative algorithm and pool kind, and what kvaudit cannot
    model among them (formula.py draft_rules). Frozen-KV MTP (0.5.14+, speculative/frozen_kv_mtp_worker_v2.py) is
    EAGLE-family there (``is_eagle()``); in 0.5.14 alone ``init_model_worker`` allocates the target's pool before
    the draft (``init_target_memory_pool()`` first), which the log's order shows (free_memory)."""
    rules = rules_for(ctx.era, ctx.spec_algo is not None)
    if ctx.spec_algo is None:
        return rules, []
    geom = ctx.opts.model_geometry
    out: list[Rule] = []
    unmodelled: list[str] = []
    for r in rules:
        got, why = draft_rules(r, ctx.spec_algo, _hybrid_swa(ctx), geom is not None, ctx.era)
        out += got
        unmodelled += why
    return out, unmodelled


def _hybrid_swa(ctx: Context) -> bool:
    """Was the pool sized as a sliding-window hybrid (HybridSWAPoolConfigurator)? The log's split line or SWA
    pool says so; else the config, unless the log shows one plain pool (cell.py _one_full_pool)."""
    if any(e.role == "target" for e in ctx.startup.of(SlidingWindowSplit)):
        return True
    if any(rf.swa_summary is not None or is_swa(components(rf)) for rf in ctx.facts.values()):
        return True
    geom = ctx.opts.model_geometry
    return bool(geom is not None and geom.is_hybrid_swa and not _one_full_pool(ctx))


def _rocm_T(ctx: Context, T: Interval, pre_source: str | None) -> Interval:
    """T on ROCm: up to ROCM_T_DRIFT_GIB above the printed 'Load weight begin' reading (see the constant)."""
    lo, hi = ROCM_T_DRIFT_RELEASES
    if pre_source != "Load weight begin" or not ctx.era.overlaps(lo, hi):
        return T
    sign = rocm_evidence(ctx)
    if sign is None:
        return T
    note = (f"ROCm ({sign}): SGLang's T is read at the end of init_torch_distributed, before the model registry's "
            "imports load AMD's kernels, and the printed 'Load weight begin' reading comes after them; the "
            f"prediction takes T up to {ROCM_T_DRIFT_GIB} GiB above it (measured on AMD's sglang-ci startups: up "
            f"to 0.50 GiB), so a pool up to {ROCM_T_DRIFT_GIB} x (1 - mfs) GiB below the printed numbers' formula "
            "is not a mismatch")
    if note not in ctx.notes:
        ctx.notes.append(note)
    return Interval(T.lo, T.hi + ROCM_T_DRIFT_GIB)


def _platform_T(ctx: Context, opts: AuditOptions, T: Interval, pre_source: str | None) -> Interval:
    """T as the engine read it: on a unified-memory platform up to UNIFIED_T_DRIFT_GIB above the printed
    'Load weight begin' reading, on ROCm up to ROCM_T_DRIFT_GIB above it (see the constants); elsewhere the
    printed reading itself."""
    rocm = _rocm_T(ctx, T, pre_source)
    platform = opts.platform
    if platform is None or not getattr(platform, "unified_memory", False) or pre_source != "Load weight begin":
        return rocm
    if rocm != T:  # AMD's MI300A: unified and ROCm; the wider bound holds both
        return rocm
    note = (f"unified memory ({platform.name}): SGLang's T is read at the end of init_torch_distributed, and the "
            "host's own allocations before the printed 'Load weight begin' reading lower that one; the prediction "
            f"takes T up to {UNIFIED_T_DRIFT_GIB} GiB above it (measured on GB10 startups), so a pool up to "
            f"{UNIFIED_T_DRIFT_GIB} x (1 - mfs) GiB below the printed numbers' formula is not a mismatch")
    if note not in ctx.notes:
        ctx.notes.append(note)
    return Interval(T.lo, T.hi + UNIFIED_T_DRIFT_GIB)


def shortfall_of(ctx: Context, free: FreeMemory, budget: PoolBudget, outcome: Outcome
                 ) -> tuple[dict[str, float], float | None]:
    """A memory error: the fraction that would have worked, and what the engine's own (negative) count implies."""
    T, post, state = free.T, free.post, budget.state
    eff_mfs = outcome.eff_mfs
    shortfall: dict[str, float] = {}
    if T is not None and post is not None and T.mid > 0:
        shortfall["minimum_mem_fraction_static"] = round(1 - (post.mid - (state.mid if state else 0)) / T.mid, 4)
    if outcome.negative:
        first = outcome.negative[0]
        shortfall["profiled"] = first.profiled
        shortfall["line"] = first.line
        if T is not None and post is not None and budget.cell_iv is not None:
            eff_mfs = round(1 - (post.mid - budget.gib(first.profiled)) / T.mid, 4)
            shortfall["effective_mem_fraction_static"] = eff_mfs
            if outcome.prediction is not None:
                shortfall["formula_tokens"] = outcome.prediction.tokens.low
    return shortfall, eff_mfs


def _cap_bound(pred: Prediction, cap: int | None, logged: int | None) -> bool:
    """--max-total-tokens sized the pool: the logged count is the cap and the fraction's budget allows at least
    that much on every reading (``min(profiled, max_total_tokens)``, then page rounding)."""
    return (cap is not None and logged is not None and logged == cap and pred.uncapped is not None
            and pred.uncapped.low >= logged)


#: the rule name of the FP4 prediction that divides by values + scales (pool_configurator.py _compute_cell_size)
FP4_SCALED = "FP4 cell = the KV line's values x 9/8 (scales the line does not count)"


def formula_of(ctx: Context, free: FreeMemory, fraction: Fraction, cells: Cells, state: Interval | None, cap: Cap,
               outcome: Outcome) -> Formula:
    T, post, mfs = free.T, free.post, fraction.value
    reserve = free.reserve(mfs)
    rest = (post - reserve) if (post is not None and reserve is not None) else None
    prediction = outcome.prediction
    check_text = None
    if (outcome.verdict == Verdict.MATCH and prediction is not None and prediction.uncapped is not None
            and _cap_bound(prediction, cap.cap, cells.logged) and T is not None and post is not None
            and mfs is not None):
        u = prediction.uncapped
        check_text = (f"min(--max-total-tokens {cap.cap:,}, ({post.mid:.2f} - (1 - {mfs:g}) x {T.mid:.2f}) GiB / "
                      f"{round(prediction.cell.mid):,} B per token = {u.low:,}..{u.high:,}): the cap bound")
    elif (outcome.verdict == Verdict.MATCH and prediction is not None and prediction.engine_rest is not None
            and T is not None and post is not None and mfs is not None):
        # the engine's own budget was divided (its 'The available memory for KV cache is' line): the equation says so
        check_text = (f"the engine's own budget {prediction.engine_rest.mid:.2f} GiB ('The available memory for KV "
                      f"cache is' line; ({post.mid:.2f} - (1 - {mfs:g}) x {T.mid:.2f}) gives "
                      f"{(post - T.scale(1 - mfs)).mid:.2f}) / {round(prediction.cell.mid):,} B per token"
                      + (f" + {prediction.headroom:,} speculative headroom" if prediction.headroom else "")
                      + (f", rounded down to pages of {ctx.page_size}" if ctx.page_size > 1 else ""))
    elif (outcome.verdict == Verdict.MATCH and prediction is not None and prediction.rule.name == DSV4.RULE
            and T is not None and post is not None and mfs is not None):
        # DeepSeek-V4 rounds the division down to whole pages: the printed equation says so (ux audit item 8)
        page = as_int(ctx.args.get("page_size"))
        pages = (f"pages of {page}" if page else
                 f"pages of {min(DSV4.DEFAULT_PAGES)} (or {max(DSV4.DEFAULT_PAGES)}: the log does not say)")
        check_text = (f"({post.mid:.2f} - (1 - {mfs:g}) x {T.mid:.2f}) GiB / {round(prediction.cell.mid):,} B per "
                      f"full token, rounded down to {pages}")
    elif (outcome.verdict == Verdict.MATCH and prediction is not None and FP4_SCALED in prediction.rule.name
            and T is not None and post is not None and mfs is not None and cells.line_mid):
        # the prediction divided by values + scales: the printed equation says so, or it does not reproduce
        check_text = (f"({post.mid:.2f} - (1 - {mfs:g}) x {T.mid:.2f}) GiB / ({round(cells.line_mid):,} x 9/8 "
                      f"= {prediction.cell.mid:,.0f} B per token, FP4 values + scales)")
    return Formula(
        mem_fraction_static=mfs,
        mem_fraction_static_source=fraction.source,
        pre_load_free_gib=rounded(T.mid) if T else None,
        pre_load_free_source=free.pre_source,
        post_load_free_gib=rounded(post.mid) if post else None,
        reserve_gib=rounded(reserve.mid, 4) if reserve else None,
        rest_gib=rounded(rest.mid, 4) if rest else None,
        # from the KV line: the figure at the stated page's padding (the one kv_line_bytes_per_token says), so
        # one quantity is never printed as two numbers; the padding's whole range is bytes_per_token_range
        bytes_per_token=(cells.cell.profile if (cells.cell is not None and cells.source == "config")
                         else round(cells.line_mid) if cells.line_mid and cells.iv is not None
                         and cells.iv.contains(cells.line_mid)
                         else (round(cells.iv.mid) if cells.iv else None)),
        bytes_per_token_source=cells.source,
        predicted_tokens=prediction.tokens if prediction else None,
        logged_tokens=cells.logged,
        verdict=outcome.verdict,
        verdict_reason=outcome.reason,
        rule=prediction.rule.name if prediction else None,
        effective_mem_fraction_static=outcome.eff_mfs,
        page_size=ctx.page_size,
        max_total_tokens_cap=cap.cap,
        speculative_headroom_tokens=prediction.headroom if prediction else None,
        kv_bytes_per_token_logged=round(cells.line_mid, 1) if cells.line_mid else None,
        logged_tokens_approximate=cells.approx,
        probable_cap=cap.probable,
        state_pool_gib=round(state.mid, 3) if state is not None else None,
        check_inputs=("mem_fraction_static", "pre_load_free_gib", "post_load_free_gib", "bytes_per_token")
        + (("attention_tp_size",) if cells.source == "config" else ()),
        bytes_per_token_range=(cells.iv.lo, cells.iv.hi) if cells.iv is not None else None,
        check_text=check_text,
    )


def fp4_line_without_scales(cells: Cells, outcome: Outcome) -> bool:
    """Does this FP4 pool's KV line count the packed values alone, so the scales the budget paid for (9/8 of the
    values) are not in it? Known when the config's cell says so (bytes_per_token) or the prediction that matched
    divided by the values x 9/8 (ux audit item 9: the ledger books them, not 'unexplained')."""
    if cells.cell is not None and cells.cell.pool_without_scales is not None \
            and cells.cell.pool == cells.cell.pool_without_scales:
        return True
    pred = outcome.prediction
    return outcome.verdict == Verdict.MATCH and pred is not None and FP4_SCALED in pred.rule.name


def ledgers_of(ctx: Context, cells: Cells, fp4_scales: bool = False) -> tuple:
    """Every GiB per rank: weights, the pool, graphs, what stayed free (ledger.rank_ledger)."""
    req_bytes, req_how = request_table(ctx, cells.logged, context_length_of(ctx))
    return tuple(rank_ledger(i, ctx.facts[r], ctx, cells.cell, cells.logged, req_bytes, req_how, rank0=(i == 0),
                             fp4_scales=fp4_scales)
                 for i, r in enumerate(sorted(ctx.facts)))


def ledger_and_failure_findings(ctx: Context, opts: AuditOptions, ledgers: tuple, formula: Formula,
                                free: FreeMemory, shortfall: dict[str, float], cells: Cells,
                                outcome: Outcome) -> list[Finding]:
    out = list(ledger_findings(ctx, ledgers, formula, free.reserve(formula.mem_fraction_static), opts.thresholds))
    out.extend(concurrency_findings(ctx, cells.logged, context_length_of(ctx)))
    memory_failed = any(f.kind in ("not_enough_memory", "no_kv_memory") for f in ctx.startup.of(Failure))
    out.extend(failure_findings(ctx, shortfall if (memory_failed or outcome.negative) else None, formula))
    host = host_pools(ctx)
    if host:
        # host RAM, never GPU KV: the finding books it outside the ledger. The size follows from the device pool
        # only when --hicache-ratio sized it (hicache_size 0); --hicache-size or the host's free memory (0.5.20+,
        # PR 40135) size it otherwise, and a 0.5.20+ line states its tokens itself
        by_ratio = (as_float(ctx.args.get("hicache_size")) or 0) == 0 and all(p.tokens is None for p in host)
        ratio = as_float(ctx.args.get("hicache_ratio"))
        auto = ctx.startup.of(HiCacheAutoSize)
        if auto:
            # 0.5.22+ lowered the default ratio to fit the host's free memory: the printed server_args ratio is
            # the one asked, not the one that sized the pools
            a0 = auto[0]
            ratio = a0.ratio
            ctx.notes.append(f"HiCache auto-sizing (SGLang 0.5.22+, hicache_auto_size.py): ratio {a0.ratio_asked:g} "
                             f"-> {a0.ratio:g} to fit {a0.host_budget_gib:.1f} GiB of host memory per rank; the "
                             f"host pools ({a0.host_pools_gib:.1f} GiB) are host RAM, not GPU KV")
        out.append(F.hicache_host(round(sum(p.host_gb for p in host), 2), cells.logged if by_ratio and ratio else None,
                                  cells.cell.pool if cells.cell else None, ratio,
                                  [f"{p.what} {p.host_gb:.2f} GB" + (f" ({p.tokens:,} tokens)" if p.tokens else "")
                                   for p in host] if len(host) > 1 or host[0].tokens else None))
    return out


def _formula_rows(f: Formula, post_source: str = "Load weight end") -> tuple[FormulaRow, ...]:
    return (
        FormulaRow("T (free before weights, min over ranks)", f.pre_load_free_gib, "GiB", f.pre_load_free_source or ""),
        FormulaRow("post (free after weights, min)", f.post_load_free_gib, "GiB",
                   ("Memory profiling (available_gpu_memory)"
                    if (f.pre_load_free_source or "").startswith("Memory profiling")
                    else post_source) if f.post_load_free_gib else ""),
        FormulaRow("mem_fraction_static", f.mem_fraction_static, "", f.mem_fraction_static_source or ""),
        FormulaRow("reserve = (1 - mfs) x T", f.reserve_gib, "GiB"),
        FormulaRow("rest = post - reserve", f.rest_gib, "GiB", "the KV budget"),
    )




def _model_summary(ctx: Context, geom: ModelGeometry | None) -> ModelSummary:
    types = [e.model_type for e in ctx.startup.of(WeightEnd) if e.role == "target" and e.model_type]
    tp_bits: dict[str, Any] = dict(attention_tp_size_at_least=ctx.tp_at_least,
                                   attention_tp_size_source=ctx.attn_tp_source)
    if geom is None:
        kvs = [kv for rf in ctx.facts.values() for kv in rf.kv]
        attention = "mla" if any(k.kv_gib is not None for k in kvs) else ("mha" if kvs else "unknown")
        return ModelSummary(types[0] if types else None, attention, None, None, None, None, ctx.kv_dtype,
                            ctx.kv_elt, ctx.attn_tp, None, **tp_bits)
    per_rank = None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // max(1, ctx.attn_tp))
    return ModelSummary(geom.architecture or (types[0] if types else None), "mla" if geom.is_mla else "mha",
                        geom.num_layers, geom.num_kv_heads, per_rank, geom.head_dim, ctx.kv_dtype, ctx.kv_elt,
                        ctx.attn_tp, geom.source, **tp_bits)


def _mixed_kv(ctx: Context, geom: ModelGeometry | None) -> str | None:
    """K and V logged at different sizes where the config gives them the same head size: the cache stores K and
    V in different dtypes (a fork's FP8 K with NVFP4 V, 2026) or layouts; kvaudit models one dtype for both."""
    if geom is None or geom.is_mla or (geom.v_head_dim and geom.v_head_dim != geom.head_dim) \
            or geom.swa_v_head_dim or geom.full_head_dim:
        return None
    for rf in ctx.facts.values():
        for kv in rf.kv:
            k, v = kv.k_gib, kv.v_gib
            if k is not None and v is not None and min(k, v) > 0.05 and abs(k - v) > 0.1 * max(k, v):
                return (f"K and V are logged at different sizes (line {kv.line}: K {k:.2f} GB, V {v:.2f} GB) where "
                        "the config gives them one head size: the cache stores K and V in different dtypes or layouts "
                        "(e.g. FP8 K with NVFP4 V), which kvaudit does not model; bytes per token from the KV lines")
    return None


def _failed_before_pool(ctx: Context) -> int | None:
    """The line of a fatal failure logged before any KV pool line (the target's), None when the pool came first
    or nothing failed."""
    from kvaudit.reconcile.sglang.checks import FATAL

    first_kv = min((k.line for rf in ctx.facts.values() for k in rf.kv), default=None)
    fails = [f.line for f in ctx.startup.of(Failure) if f.kind in FATAL and f.kind != "unbalanced"]
    if not fails:
        return None
    line = min(fails)
    return line if first_kv is None or line < first_kv else None


def _how_to_check(missing: list[str], have_config: bool, startup: Startup) -> str:
    """What the user can add so that the check runs: only what would help, said truly of this log."""
    hints = []
    dsv4 = DSV4.has_dsv4(startup)
    if "mem_fraction_static" in missing:
        hints.append("--mem-fraction-static (the value the server ran with)")
    if "bytes per token" in missing and dsv4:
        # DeepSeek-V4's coefficient is the engine's own (DSv4 memory calculation); a config does not give it here
        hints.append("the log's 'DSv4 memory calculation' line (DeepSeek-V4 pools are checked from it)")
    elif "bytes per token" in missing and not have_config:
        hints.append("--model-config (the model's config.json)")
    begins = [e for e in startup.of(WeightBegin) if e.role == "target"]
    if any(m.startswith("T ") for m in missing):
        if not begins:
            hints.append("the log from 'Load weight begin' on (the excerpt starts after it)")
        elif all(e.avail_gib is None for e in begins):
            hints.append("a release that prints 'Load weight begin. avail mem=' (this line carries no reading)")
    if any(m.startswith("free memory") for m in missing) and not startup.of(WeightEnd):
        hints.append("the log's 'Load weight end' line")
    if "the KV pool's token count" in missing:
        hints.append("the log up to the scheduler summary (max_total_num_tokens=...)")
    return ("; to check it, pass " + ", ".join(hints)) if hints else ""


def _stage_inputs(ctx: Context, post: Interval, cell_iv: Interval, bpt_source: str | None, draft: bool = False
                  ) -> list[tuple[Interval, Interval]]:
    """(post, bytes per token) per pipeline stage: each stage sizes its pool from its own free memory and
    layers, and the engine takes the MIN over stages (reference §1.5). One stage without PP, or when bytes per
    token come from a KV line (that rank's stage only). ``draft``: a stage's free memory is its ranks' draft
    reading (0.5.14+ sizes the pool after the draft's weights)."""
    if ctx.pp <= 1 or bpt_source != "config":
        return [(post, cell_iv)]
    out = []
    for stage in range(ctx.pp):
        posts = [p for r, rf in ctx.facts.items() if r.sort_key[0] == stage
                 for p in ([Interval.logged(rf.draft_post)] if draft and rf.draft_post is not None
                           else [rf.post] if rf.post is not None else [])]
        cell, _ = config_cell(ctx, stage)
        if cell is not None:
            out.append((min_interval(posts) or post, Interval.exact(cell.profile)))
    return out or [(post, cell_iv)]
