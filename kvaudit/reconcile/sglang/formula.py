"""SGLang's KV-cache sizing formula per era, and the causes a mismatch can have.

``profile_max_num_token`` (``srt/model_executor/model_runner.py`` 0.3.0-0.5.6; ``model_runner_kv_cache_mixin.py``
0.5.7-0.5.15; ``mem_cache/kv_cache_configurator.py`` 0.5.16+)::

    rest = post - (1 - mem_fraction_static) * T          GiB; post and T are MIN over ranks
    max_total_num_tokens = floor(rest * 2**30 / cell)    cell = KV bytes per token on one rank

then, by era: speculative headroom (0.4.4-0.5.6), page rounding (0.4.4+), the ``--max-total-tokens`` cap, and
from 0.5.14 the draft's layers inflate the cell.

Which free memory ``post`` is, with a speculative draft (read in the 0.5.13-0.5.18 and 0.5.23 wheels):

* up to 0.5.13 ``ModelRunner.initialize`` sizes and allocates the target's pool inside the target worker's
  constructor (model_runner.py ``init_memory_pool``), before ``Scheduler.init_model_worker`` builds the draft
  worker: ``post`` is the target's 'Load weight end' reading;
* from 0.5.14 ``Scheduler.init_model_worker`` (managers/scheduler.py) runs ``init_tp_model_worker()``, then
  ``maybe_init_draft_worker()``, then ``init_memory_pools()``, whose ``_profile_available_bytes``
  (model_runner_kv_cache_mixin.py 0.5.14-0.5.15, mem_cache/kv_cache_configurator.py 0.5.16+) reads the free
  memory after *both* models' weights: ``post`` is the draft's 'Load weight end' reading, for every algorithm
  whose draft loads weights (EAGLE, EAGLE3, NEXTN/MTP, STANDALONE, DFLASH, DSPARK; NGRAM loads none). The
  exception is 0.5.14's FROZEN_KV_MTP, whose draft needs the target's pool and is built after it
  (``init_target_memory_pool()`` first; gone in 0.5.15).

The draft term in the cell, by algorithm and pool configurator (model_executor/pool_configurator.py):

* ``DefaultPoolConfigurator`` (MHA, MLA, DSA, and Mamba hybrids over their full-attention layers): EAGLE,
  EAGLE3, FROZEN_KV_MTP (``is_eagle()``) and STANDALONE: ``int(cell x (1 + L_draft / L))`` 0.5.14-0.5.17,
  ``cell + int(cell x L_draft / L)`` 0.5.18+; DFLASH/DSPARK: ``ceil(cell x (L + L_draft) / L)`` 0.5.14-0.5.17
  (dflash_utils.py ``scale_kv_cell_size_per_token_for_dflash``), plus the draft's own bytes per token from its
  config 0.5.18+; NGRAM: none.
* ``HybridSWAPoolConfigurator`` (sliding-window hybrids): 0.5.14 no draft term for any algorithm; 0.5.15+
  EAGLE-family and STANDALONE add ``full_per_token x L_draft`` to the full-attention term; DFLASH adds none
  0.5.14-0.5.17 and the draft's own bytes per token 0.5.18+ (``_dflash_draft_cell_size``); NGRAM none.

kvaudit models the plain-pool EAGLE term and every "none"; the others need the draft's config (its layers and
geometry), which the log does not give, so a prediction under them is not made and said so
(:func:`draft_rules`).
"""

from __future__ import annotations

import math

from dataclasses import replace

from kvaudit.reconcile.interface import TokenInterval, Verdict
from kvaudit.reconcile.sglang.context import Context
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.record import Record, record
from kvaudit.units import GIB, Interval
from kvaudit.versions import Version, VersionRange

def min_interval(values: list[Interval]) -> Interval | None:
    if not values:
        return None
    return Interval(min(v.lo for v in values), min(v.hi for v in values))


@record
class Rule(Record):
    name: str
    lo: Version
    hi: Version | None
    headroom: bool = False  # 0.4.4-0.5.6: target tokens += reqs*(steps*topk + draft_tokens) + 100
    inflate: str | None = None  # "ratio" (0.5.14-0.5.17) or "int" (0.5.18+): cell grows by draft layers
    #: 0.5.14+: the pool is sized from the free memory after the draft's weights (Scheduler.init_model_worker)
    after_draft: bool = False


SPEC_RULES = (
    Rule("<=0.4.3: draft sized apart, target unchanged", (0, 1, 0), (0, 4, 3)),
    Rule("0.4.4-0.5.6: EAGLE headroom added to the target's tokens", (0, 4, 4), (0, 5, 6), headroom=True),
    Rule("0.5.7-0.5.13: no headroom; draft comes out of the reserve", (0, 5, 7), (0, 5, 13)),
    Rule("0.5.14-0.5.17: draft weights loaded first, cell x (1 + L_draft/L_target)", (0, 5, 14), (0, 5, 17),
          inflate="ratio", after_draft=True),
    Rule("0.5.18+: draft weights loaded first, cell + int(cell x L_draft/L_target)", (0, 5, 18), None,
          inflate="int", after_draft=True),
)

#: speculative algorithms by how SGLang prices their draft in the target's cell (speculative/spec_info.py:
#: ``is_eagle()`` is EAGLE, EAGLE3 and FROZEN_KV_MTP; server_args resolves NEXTN to EAGLE; pool_configurator.py
#: treats STANDALONE as EAGLE; ``is_dflash_family()`` is DFLASH and DSPARK, 0.5.16+)
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "MTP", "FROZEN_KV_MTP", "STANDALONE")
DFLASH_FAMILY = ("DFLASH", "DSPARK")
#: NGRAM's draft is a token table: no weights, no KV pool, no draft term
NO_DRAFT_MODEL = ("NGRAM",)


def draft_rules(rule: Rule, algo: str | None, hybrid_swa: bool, layers_known: bool, era: VersionRange
                ) -> tuple[list[Rule], list[str]]:
    """The rule(s) one 0.5.14+ era band gives this algorithm on this kind of pool, and what kvaudit cannot
    model there (said, never guessed: the caller judges nothing on a rule it could not compute). Rules of
    0.5.13 and before pass unchanged. See the module docstring for the engine's terms."""
    if not rule.after_draft:
        return [rule], []
    a = (algo or "").upper()
    span = "0.5.18+" if rule.hi is None else f"{'.'.join(map(str, rule.lo))}-{'.'.join(map(str, rule.hi))}"
    loaded = "draft weights loaded first"
    if a in NO_DRAFT_MODEL:
        return [replace(rule, name=f"{span}: NGRAM, no draft model: no draft term", inflate=None)], []
    if a not in EAGLE_FAMILY + DFLASH_FAMILY:
        return [], [f"SGLang {span} with the speculative algorithm '{algo}': how it prices the draft is not "
                    "modelled"]
    if hybrid_swa:
        if a in DFLASH_FAMILY and rule.hi is not None:
            return [replace(rule, name=f"{span}: {loaded}; {a} on a sliding-window hybrid: no draft term "
                            "(HybridSWAPoolConfigurator)", inflate=None)], []
        if a in DFLASH_FAMILY:
            return [], [f"SGLang {span} adds the {a} draft's own bytes per token (from its config; "
                        "pool_configurator.py _dflash_draft_cell_size) to a sliding-window hybrid's cell: not "
                        "modelled"]
        rules, unmodelled = [], []
        if rule.lo <= (0, 5, 14) and era.overlaps((0, 5, 14), (0, 5, 14)):
            rules.append(replace(rule, name=f"0.5.14: {loaded}; {a} on a sliding-window hybrid: no draft term "
                                 "(HybridSWAPoolConfigurator)", hi=(0, 5, 14), inflate=None))
        if rule.hi is None or era.overlaps((0, 5, 15), rule.hi):
            unmodelled.append(f"SGLang {'0.5.15-0.5.17' if rule.hi is not None else '0.5.18+'} adds the draft's "
                              "full-attention bytes x its layers to a sliding-window hybrid's cell "
                              "(HybridSWAPoolConfigurator): not modelled")
        return rules, unmodelled
    if a in DFLASH_FAMILY:
        what = ("ceil(cell x (L + L_draft) / L), L_draft from the draft's config" if rule.hi is not None
                else "the draft's own bytes per token from its config")
        return [], [f"SGLang {span} sizes a {a} target's cell as {what} (pool_configurator.py "
                    "DefaultPoolConfigurator): not modelled"]
    if not layers_known:
        return [], [f"SGLang {span} grows the cell by the draft's layers over the target's (pool_configurator.py "
                    "DefaultPoolConfigurator); without --model-config the layers are not known"]
    return [rule], []
PLAIN_RULE = Rule("formula", (0, 1, 0), None)


def rules_for(era: VersionRange, spec: bool) -> list[Rule]:
    if not spec:
        return [PLAIN_RULE]
    found = [r for r in SPEC_RULES if era.overlaps(r.lo, r.hi)]
    # newest first: a log whose era is open-ended is most likely recent
    return list(reversed(found)) or [PLAIN_RULE]




@record
class Prediction(Record):
    tokens: TokenInterval
    rule: Rule
    headroom: int | None
    cell: Interval
    #: the fraction's budget before --max-total-tokens (``min(profiled, max_total_tokens)``, model_runner.py /
    #: pool_configurator.py): when the cap binds, the pool says only that the budget reached the cap
    uncapped: TokenInterval | None = None
    #: the free memory after the weights this prediction used (the draft's reading under a 0.5.14+ rule)
    post: Interval | None = None
    #: the budget the engine printed, divided in place of post - (1 - mfs) x T
    engine_rest: Interval | None = None


def predict_stages(ctx: Context, rule: Rule, T: Interval, stages: list[tuple[Interval, Interval]], mfs: float,
                   state: Interval | None, draft_layers: int | None, target_layers: int | None,
                   rest: Interval | None = None) -> Prediction:
    """The prediction with pipeline stages: each stage's own (post, cell), the MIN over stages (reference §1.5:
    ``max_total_num_tokens`` is all-reduced with MIN across the world). ``rest``: the engine's own budget, when it
    printed one (one stage only)."""
    preds = [predict(ctx, rule, T, post, mfs, cell, state, draft_layers, target_layers, rest)
             for post, cell in stages]
    if len(preds) == 1:
        return preds[0]
    low = min(preds, key=lambda p: p.tokens.low)
    uncapped = [p.uncapped for p in preds if p.uncapped is not None]
    return Prediction(TokenInterval(low.tokens.low, min(p.tokens.high for p in preds)), rule, low.headroom, low.cell,
                      TokenInterval(min(u.low for u in uncapped), min(u.high for u in uncapped))
                      if len(uncapped) == len(preds) else None, low.post)


def predict(ctx: Context, rule: Rule, T: Interval, post: Interval, mfs: float, cell: Interval,
            mamba: Interval | None, draft_layers: int | None, target_layers: int | None,
            engine_rest: Interval | None = None) -> Prediction:
    """``engine_rest``: the budget the engine printed ('The available memory for KV cache is X GB'), divided in
    place of ``post - (1 - mfs) x T`` (only without a state pool: whether the line is before or after the Mamba
    share is not known)."""
    reserve = T.scale(1 - mfs)
    rest = post - reserve if engine_rest is None else engine_rest
    if mamba is not None and ctx.era.overlaps((0, 5, 2), None) and engine_rest is None:
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
        reqs = as_int(ctx.args.get("max_running_requests")) or 48
        steps = as_int(ctx.args.get("speculative_num_steps")) or 0
        topk = as_int(ctx.args.get("speculative_eagle_topk")) or 1
        draft_tokens = as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
        headroom = reqs * (steps * topk) + reqs * draft_tokens + 100
        lo, hi = lo + headroom, hi + headroom
    if ctx.page_size > 1 and ctx.era.overlaps((0, 4, 4), None):
        lo, hi = lo // ctx.page_size * ctx.page_size, hi // ctx.page_size * ctx.page_size
    cap = as_int(ctx.args.get("max_total_tokens"))
    uncapped = None
    if cap:
        uncapped = TokenInterval(lo, hi)
        lo, hi = min(lo, cap), min(hi, cap)
    return Prediction(TokenInterval(lo, hi), rule, headroom, c, uncapped, post, engine_rest)




def _multimodal(ctx: Context) -> bool:
    geom = ctx.opts.model_geometry
    if geom is not None:
        return bool(geom.multimodal)
    from kvaudit.parse.sglang import WeightEnd

    return any("ConditionalGeneration" in (e.model_type or "") for e in ctx.startup.of(WeightEnd))


def _reservation_span_logged(ctx: Context) -> bool:
    """Does the log cover the span where 0.5.18+ prints 'Reserving X GB of the KV budget' (between the weights'
    end and the pool's allocation, kv_cache_configurator.py)? Then a reservation it does not print is not there
    (docs/findings.md, rule 10)."""
    from kvaudit.parse.sglang import KVAlloc, PoolEnd, WeightEnd

    ends = [e.line for e in ctx.startup.of(WeightEnd)]
    pools = [e.line for e in ctx.startup.of(KVAlloc)] + [e.line for e in ctx.startup.of(PoolEnd)]
    return bool(ends) and bool(pools) and min(ends) < max(pools)


def _reserve_logged(ctx: Context) -> bool:
    from kvaudit.parse.sglang import OtherPool

    return any(e.kind == "budget_reserve" for e in ctx.startup.of(OtherPool))


def explain_mismatch(ctx: Context, pred: Prediction, logged: int, T: Interval, post: Interval, mfs: float,
                     cell: Interval, cap: int | None, state: Interval | None = None
                     ) -> tuple[Verdict, str, float | None]:
    """Solve for the mem_fraction_static the logged tokens imply (the state pool included: it comes out of the
    same budget), then name the known causes that fit."""
    base = logged - (pred.headroom or 0)
    rest_needed = base * pred.cell.mid / GIB + (state.mid if state is not None else 0.0)
    eff = 1 - (post.mid - rest_needed) / T.mid
    eff_r = round(eff, 4)
    lo, hi = pred.tokens.low, pred.tokens.high
    side = "fewer" if logged < lo else "more"
    gap = (lo - logged) if logged < lo else (logged - hi)
    msg = (f"{logged:,} tokens is {gap:,} {side} than the predicted {lo:,}..{hi:,}; "
           f"the logged count implies mem_fraction_static = {eff:.3f}")
    causes = []
    logged_mfs = as_float(ctx.args.get("mem_fraction_static"))
    if ctx.opts.mem_fraction_static is not None and logged_mfs is not None \
            and abs(logged_mfs - ctx.opts.mem_fraction_static) > 1e-9:
        # the user's flag, not the log, set the fraction checked here (ux audit item 35): the first cause to name
        near = " (which the count fits)" if abs(eff - logged_mfs) < 0.002 else ""
        causes.append(f"--mem-fraction-static {ctx.opts.mem_fraction_static:g} given here overrides the logged "
                      f"server_args mem_fraction_static={logged_mfs:g}{near}")
    if cap and logged <= cap and logged < lo:
        return Verdict.EXPLAINED, msg + f"; --max-total-tokens {cap:,} caps it", eff_r
    if abs(eff - mfs * 0.85) < 0.002:
        causes.append("aiter attention backend (x0.85 when context > 8192)")
    for k in (0.90, 0.95):
        if abs(eff - mfs * k) < 0.002:
            causes.append(f"the multimodal reduction (x{k:.2f}, SGLang <= 0.4.8)")
    if ctx.spec_algo is not None:
        reqs = as_int(ctx.args.get("max_running_requests")) or 48
        steps = as_int(ctx.args.get("speculative_num_steps")) or 0
        topk = as_int(ctx.args.get("speculative_eagle_topk")) or 1
        nd = as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
        head = reqs * steps * topk + reqs * nd + 100
        if pred.headroom is None and abs(logged - hi - head) <= (hi - lo) + 1:
            causes.append(f"EAGLE headroom of {head:,} tokens (SGLang 0.4.4-0.5.6)")
    if ctx.opts.gpu_capacity_gib:
        t_eff = (post.mid - rest_needed) / (1 - mfs)
        if abs(t_eff - ctx.opts.gpu_capacity_gib) < 0.05:
            causes.append("T taken as the card's capacity instead of free memory (a fork or patched build)")
    if state is not None and logged < lo and ctx.era.overlaps((0, 5, 16), None):
        # kv_cache_configurator.py: with post-capture KV sizing a Mamba model's slack is at least the pre-capture
        # activation reserve (server_args.mamba_pre_capture_reserve_mb, 0.5.16-0.5.19; runtime_context's
        # pre_capture_activation_reserve_mb after), read in the 0.5.16-0.5.23 wheels
        causes.append("SGLang 0.5.16+'s minimum slack for Mamba models with post-capture KV sizing "
                      "(max((1 - mfs) x T, a pre-capture activation reserve))")
    if (logged < lo and _multimodal(ctx) and not _reserve_logged(ctx) and ctx.era.overlaps((0, 5, 18), None)
            and not _reservation_span_logged(ctx)):
        # 0.5.18+ takes SGLANG_VLM_CACHE_SIZE_MB (100 MiB by default) out of a multimodal model's budget
        # (kv_cache_configurator.py mm_runtime_reservation_gb) and logs "Reserving X GB of the KV budget"; only an
        # excerpt that does not cover the span where that line stands leaves it open (rule 10: a log that covers
        # the span and has no such line rules the cause out). Older releases have no such reservation, so it is not
        # offered for them. Offered only when it can hold the gap.
        gap_gib = (lo - logged) * pred.cell.mid / GIB
        if gap_gib <= 0.5:
            causes.append(f"a multimodal runtime reservation taken from the KV budget of about {gap_gib:.2f} GiB "
                          "(SGLANG_VLM_CACHE_SIZE_MB, 100 MiB by default in the releases that reserve it; the log "
                          "has no 'Reserving ... GB of the KV budget' line to confirm it)")
    # the direction picks the causes (kvaudit.verdict, rule 2): fewer tokens need less free memory or a larger
    # reserve; more tokens need more free memory or a smaller reserve
    # a gap that repeats across startups of one model family is a rule kvaudit does not model, not a one-off
    # (ux audit item 23): said first, before memory that moved between the two readings
    unmodelled = "a {} reserve than the version rules assume: a rule of this release or model family that kvaudit " \
        "does not model (the likelier cause when the gap repeats across startups)"
    if logged < lo:
        unmodelled = unmodelled.format("larger")
        causes.append(unmodelled + "; or memory taken by another process between the two measurements")
    elif logged > hi:
        unmodelled = unmodelled.format("smaller")
        causes.append(unmodelled + "; or memory freed between the two measurements")
    if causes and not causes[-1].startswith(unmodelled):
        return Verdict.EXPLAINED, msg + "; fits: " + "; ".join(causes), eff_r
    return Verdict.MISMATCH, msg + ("; possible: " + "; ".join(causes) if causes else ""), eff_r
