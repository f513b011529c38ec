"""One LMDeploy startup, reconciled: the settings, bytes per block, the pool, the check its era allows, the ledger
and the findings, assembled into an :class:`Audit`."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from kvaudit.parse.interface import SINGLE_RANK, Failure, Rank, Startup
from kvaudit.parse.lmdeploy import ModelArch, Reading
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import (Audit, AuditOptions, Finding, Formula, FormulaRow, LedgerItem, ModelSummary,
                                         RankLedger, TokenInterval, Verdict, startup_identity)
from kvaudit.reconcile.lmdeploy.cell import Block, pytorch_block, turbomind_block
from kvaudit.reconcile.lmdeploy.settings import Settings, build_settings
from kvaudit.units import GIB, MIB
from kvaudit.record import record

ENGINE = "lmdeploy"
#: half the last digit of TurboMind's "%.3f MB" block size, and of the "{:.2f} MB" SeqMgr/object-cache figures (MiB)
BLOCK_HALF_ULP_MIB = 0.0005
MB2_HALF_ULP_MIB = 0.005
#: how the log level hides the sizing lines (lmdeploy/cli: --log-level defaults to ERROR before 0.10, WARNING after)
LOG_LEVEL_HINT = ("LMDeploy prints its sizing lines at INFO and its default log level hides them: start the server "
                  "with --log-level INFO (DEBUG adds the PyTorch engine's free-memory lines)")
#: the level a line was logged at: the Python logger's ``%(asctime)s - lmdeploy - LEVEL - ...`` (lmdeploy/utils.py
#: get_logger, all releases) and TurboMind's ``[TM][LEVEL]`` (src/turbomind/utils/logger.h, all releases). api_server
#: copies --log-level into TM_LOG_LEVEL, so a log that shows INFO lines had the sizing lines enabled
_LEVEL = re.compile(r" - lmdeploy - (INFO|DEBUG) - |\[TM\]\[(INFO|DEBUG)\]")


def log_level_seen(startup: Startup) -> str | None:
    """The most verbose level the startup's own lines show (DEBUG over INFO), None when none shows."""
    seen = {g for e in startup.events for m in [_LEVEL.search(e.text)] if m for g in m.groups() if g}
    return "DEBUG" if "DEBUG" in seen else ("INFO" if "INFO" in seen else None)


def missing_pool_hint(startup: Startup) -> str:
    """Why the pool line is missing, said truly: a log already at INFO/DEBUG was cut before it (the excerpt ends
    before TurboMind's '[BlockManager]' lines), not hidden by the level."""
    level = log_level_seen(startup)
    if level is None:
        return LOG_LEVEL_HINT
    return (f"the log is already at {level} (its lines show it), so the level did not hide them: the excerpt does "
            "not include them; pass the whole startup, with TurboMind's '[BlockManager] max_block_count' line (or "
            "the PyTorch engine's CacheConfig)")


@record
class Cell:
    """Bytes per block, exact (``bytes``) when the config gives them and the block line agrees; else the block
    line's own figure as an interval (``lo``..``hi`` bytes)."""

    bytes: int | None
    lo: float | None
    hi: float | None
    source: str | None
    description: str = ""


def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    s = build_settings(startup, opts)
    cell, s, raised = _cell(s)
    findings: list[Finding] = list(raised)
    blocks = _blocks(s)
    # tokens are blocks x the block length: a fact only when the log states the length (never a default's guess)
    block_said = not s.block_source.startswith("default")
    tokens = blocks * s.block if blocks is not None and block_said else None
    if tokens is None and s.get("max_cached_tokens") is not None:
        # 0.12.x engine.cc states the pool's token capacity itself (blocks x block length x attention CP)
        tokens = int(s.value("max_cached_tokens"))
    kv_gib = _kv_gib(cell, blocks)
    (pred, verdict, reason, rule, inputs), raised = _check(s, cell, blocks)
    findings += raised
    if not block_said and pred is not None:
        # the check compared blocks; in tokens it would rest on the default block length
        reason += f" (blocks; the tokens per block are not in the log: {s.block} assumed)"
        pred = None
    formula = Formula(
        mem_fraction_static=s.ratio, mem_fraction_static_source=s.ratio_source,
        pre_load_free_gib=None, pre_load_free_source=None,
        post_load_free_gib=_free_gib(s), reserve_gib=_reserve(s), rest_gib=_budget_gib(s),
        bytes_per_token=(cell.bytes // s.block) if cell.bytes else _line_bytes_per_token(s, cell),
        bytes_per_token_source=cell.source if cell.bytes else (
            "the block line / the tokens per block the log states" if _line_bytes_per_token(s, cell) else None),
        predicted_tokens=pred, logged_tokens=tokens, verdict=verdict, verdict_reason=reason, rule=rule,
        page_size=s.block,
        kv_bytes_per_token_logged=round(cell.lo / s.block, 1) if cell.lo and not cell.bytes else None,
        check_inputs=inputs, check_text=rule if verdict == Verdict.MATCH and tokens is not None else None)
    # a match of tokens is raised by kvaudit.verdict from the formula (rule 6); blocks alone are a budget that adds up
    if verdict == Verdict.MATCH and tokens is None:
        findings.append(F.budget_reconciles(f"{blocks:,} blocks = {rule}", [r.display for r in _ranks(s)]))
    findings += _session_findings(s, tokens, blocks)
    findings += _failures(startup)
    lacks = None if blocks is not None or s.get("object_budget_mib") is not None else (
        "KV pool line (TurboMind's '[BlockManager] max_block_count = N' or 'Object cache budget', the PyTorch "
        f"engine's CacheConfig(... num_gpu_blocks=N)); {missing_pool_hint(startup)}")
    notes = _notes(s, cell, blocks, kv_gib)
    return Audit(
        lacks=lacks,
        engine=ENGINE,
        **startup_identity(startup, opts.source, startups_total),
        model=_model(s, startup),
        formula=formula,
        ranks=_ledgers(s, kv_gib),
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=None,
        hicache_host_gb=None,
        notes=tuple(notes),
        engine_display=f"LMDeploy ({'TurboMind' if s.backend == 'turbomind' else 'PyTorch engine'})"
        if s.backend != "unknown" else "LMDeploy",
        formula_text=_formula_text(s),
        formula_rows=_rows(s, cell, blocks, kv_gib),
        pre_load_label="free after the weights",
    )


def _line_bytes_per_token(s: Settings, cell: Cell) -> int | None:
    """Bytes per token from the block line when the log states both the block's size and its length (TurboMind
    BlockManager ``block_size`` in MiB and ``cache_block_seq_len``, or the truncation line): the block line's
    MiB / tokens per block; a default length the log does not state gives none, and so does a whole-MiB line
    (<=0.7, ``block_size_ >> 20``, cut): its block is anywhere in [N, N+1) MiB, a third of N wide at N = 2, and a
    midpoint would be a figure no line states."""
    if (cell.lo is None or cell.hi is None or not s.block or s.block_source.startswith("default")
            or s.get("block_mib_truncated")):
        return None
    return round((cell.lo + cell.hi) / 2 / s.block)


def _model(s: Settings, startup: Startup) -> ModelSummary:
    g = s.geometry
    named = next((e.name for e in reversed(startup.of(ModelArch))), None)  # the engine's own model_arch line
    if g is None:
        return ModelSummary(named, "unknown", None, None, None, None, _kv_dtype(s), _kv_bytes(s), s.tp, None,
                            attention_tp_size_source=s.tp_source)
    return ModelSummary(g.config.architecture if g.config is not None else named, "mha", g.layers, g.kv_heads,
                        g.kv_heads // s.tp if g.kv_heads % s.tp == 0 else None, g.head_dim, _kv_dtype(s),
                        _kv_bytes(s), s.tp, g.source, attention_tp_size_source=s.tp_source)


def _block(s: Settings, quant_policy: int | None = None) -> Block | None:
    """Bytes per block for the model at ``quant_policy`` (the settings' own unless another is tried)."""
    g = s.geometry
    if g is None or not g.layers or not g.kv_heads or not g.head_dim:
        return None
    qp = s.quant_policy if quant_policy is None else quant_policy
    if s.backend == "pytorch":
        # the PyTorch engine keeps an unquantised cache in the model's dtype: 16-bit for every served model
        return pytorch_block(g.layers, g.kv_heads, g.head_dim, s.tp, s.block, qp)
    return turbomind_block(g.layers, g.kv_heads, g.head_dim, s.tp, s.block, qp, s.startup.era)


def _cell(s: Settings) -> tuple[Cell, Settings, tuple[Finding, ...]]:
    """Bytes per block, the settings as the block line establishes them (an assumed quant_policy the line shows to
    be another: a new Settings, the given one unchanged), and the findings this step raised."""
    block = _block(s)
    mib = s.get("block_mib")
    if mib is not None:
        truncated = bool(s.get("block_mib_truncated"))
        lo, hi = ((mib * MIB, (mib + 1) * MIB) if truncated
                  else ((mib - BLOCK_HALF_ULP_MIB) * MIB, (mib + BLOCK_HALF_ULP_MIB) * MIB))
        if block is not None and block.bytes is not None:
            if _fits(block.bytes, mib, lo, hi, truncated):
                return Cell(block.bytes, lo, hi, _source(s), block.description
                            + f"; the block line's {mib:g} MB agrees"), s, ()
            if s.quant_source.startswith("default"):
                # rule 3: an assumed quant_policy cannot make a mismatch; the block line says which one it was
                for qp in (8, 4):
                    other = _block(s, qp)
                    if other is not None and other.bytes is not None and _fits(other.bytes, mib, lo, hi, truncated):
                        said = replace(s, quant_policy=qp, quant_source="inferred from the block size", notes=[
                            *s.notes, f"the block line's {mib:g} MB is quant_policy {qp} for this model (the log "
                                      "does not state the policy)"])
                        return Cell(other.bytes, lo, hi, _source(said), other.description
                                    + f"; the block line's {mib:g} MB agrees"), said, ()
            if s.block_source.startswith("default"):
                # rule 3 again: an assumed block length cannot make a mismatch. The other era's default (TurboMind:
                # 128 tokens before v0.3.0, 64 from it) may be the one the block line shows
                if s.block_other is not None:
                    said = replace(s, block=s.block_other, block_other=None, block_source=(
                        f"inferred from the block size (the default {s.block_other} of cache_block_seq_len "
                        f"{'before' if s.block_other > s.block else 'from'} 0.3.0)"))
                    other = _block(said)
                    if other is not None and other.bytes is not None and _fits(other.bytes, mib, lo, hi, truncated):
                        said.notes.append(f"the block line's {mib:g} MB is {s.block_other} tokens per block for this "
                                          "model: the default before 0.3.0 (the log does not state the block length)")
                        return Cell(other.bytes, lo, hi, _source(said), other.description
                                    + f"; the block line's {mib:g} MB agrees"), said, ()
                s.notes.append(f"the block line's {mib:g} MB is not the model's block at the assumed {s.block} tokens "
                               f"per block ({block.bytes / MIB:g} MiB); the log does not state cache_block_seq_len, "
                               "so no mismatch is judged")
                return (Cell(None, lo, hi, "kv_line", f"the block line: {mib:g} MiB per block of {s.block} tokens "
                                                      "(assumed)"), s, ())
            raised = (F.geometry_mismatch(block.bytes // s.block, mib * MIB / s.block,
                                          f"{_source(s)}; {block.description}"),)
            return (Cell(None, lo, hi, "kv_line", f"the block line: {mib:g} MiB per block of {s.block} tokens"), s,
                    raised)
        per_block = f"{mib:g}..{mib + 1:g} MiB (whole MiB, cut)" if truncated else f"{mib:g} MiB"
        return Cell(None, lo, hi, "kv_line", f"the block line: {per_block} per block of {s.block} tokens"), s, ()
    if block is not None and block.bytes is not None:
        return Cell(block.bytes, block.bytes, block.bytes, _source(s), block.description), s, ()
    return Cell(None, None, None, None, block.description if block is not None else ""), s, ()


def _source(s: Settings) -> str:
    """Where the geometry came from (a block computed from it implies there is one)."""
    return s.geometry.source if s.geometry is not None else "config"


def _fits(nbytes: int, mib: float, lo: float, hi: float, truncated: bool) -> bool:
    return lo <= nbytes < hi or (not truncated and abs(nbytes / MIB - mib) <= BLOCK_HALF_ULP_MIB)


def _blocks(s: Settings) -> int | None:
    for key in ("max_block_count", "num_gpu_blocks"):
        if s.get(key) is not None:
            return int(s.value(key))
    return None


def _kv_gib(cell: Cell, blocks: int | None) -> float | None:
    if blocks is None:
        return None
    if cell.bytes:
        return blocks * cell.bytes / GIB
    if cell.lo is not None and cell.hi is not None and cell.hi - cell.lo < 0.01 * MIB:
        return blocks * (cell.lo + cell.hi) / 2 / GIB  # "%.3f MB": within 0.0005 MiB a block
    return None  # whole MiB, cut (<=0.7): a range, said in the notes, not a figure


def _free_gib(s: Settings) -> float | None:
    """Free memory after the weights as a line states it (MiB), None when no line does."""
    for key in ("object_free_mib", "free_before_mib", "free_mib"):
        if s.get(key) is not None:
            return round(s.value(key) / 1024, 4)
    return None


def _budget_gib(s: Settings) -> float | None:
    if s.get("object_budget_mib") is not None:
        return round(s.value("object_budget_mib") / 1024, 4)
    if s.get("target_mib") is not None:
        return round(s.value("target_mib") / 1024, 4)
    free = _free_gib(s)
    if free is not None and s.get("runtime_mib") is not None:
        return round((free - s.value("runtime_mib") / 1024) * s.ratio, 4)
    return None


def _reserve(s: Settings) -> float | None:
    free, budget = _free_gib(s), _budget_gib(s)
    return round(free - budget, 4) if free is not None and budget is not None else None


def _check(s: Settings, cell: Cell, blocks: int | None) -> tuple[tuple, tuple[Finding, ...]]:
    """(prediction, verdict, reason, rule, the inputs it rests on), by era, and the findings the check raised."""
    if s.get("object_budget_mib") is not None:
        why, raised = _object_cache(s)
        return (None, Verdict.UNKNOWN, why, "object cache: floor(free x ratio) bytes (0.15+)", ()), raised
    return _check_pool(s, cell, blocks), ()


def _check_pool(s: Settings, cell: Cell, blocks: int | None):
    r = s.ratio
    if blocks is None:
        cached = s.get("max_cached_tokens")
        why = (f"the pool holds {int(cached):,} tokens ('max cached tokens'), but the blocks and the memory they were "
               "sized from are not in the log" if cached is not None else "no pool line in the log")
        why += "" if s.startup.of(Failure) else f" ({missing_pool_hint(s.startup)})"
        return None, Verdict.UNKNOWN, why, None, ()
    if s.block_source.startswith("default") and s.block_other is not None:
        # the era spans v0.3.0: TurboMind's default block length was 128 before it and 64 from it
        unsaid = (f"{blocks:,} blocks (the log does not state the tokens per block: at the default of 0.3.0+, "
                  f"{s.block}, {blocks * s.block:,} tokens; at the default before 0.3.0, {s.block_other}, "
                  f"{blocks * s.block_other:,}); ")
    elif s.block_source.startswith("default"):
        unsaid = (f"{blocks:,} blocks (the log does not state the tokens per block: at the default {s.block}, "
                  f"{blocks * s.block:,} tokens); ")
    else:
        unsaid = ""
    if s.backend == "turbomind" and r >= 1:
        want = int(r)
        verdict = Verdict.MATCH if blocks == want else Verdict.MISMATCH
        rule = f"cache_max_entry_count {r:g} >= 1 is the block count itself (TurboMind <=0.14)"
        reason = (f"{blocks:,} blocks = cache_max_entry_count {r:g}: a block count, not a fraction"
                  if verdict == Verdict.MATCH else
                  f"cache_max_entry_count {r:g} >= 1 asks for {want:,} blocks but the pool has {blocks:,}")
        return TokenInterval(want * s.block, want * s.block), verdict, reason, rule, ("mem_fraction_static",)
    if s.get("target_mib") is not None and s.get("linear_mib") is not None:
        return _linear_state(s, cell, blocks)
    if s.backend == "pytorch" and s.get("free_mib") is not None and s.get("runtime_mib") is not None:
        return _pytorch(s, cell, blocks)
    kv_lo = blocks * cell.lo / GIB if cell.lo and _kv_gib(cell, blocks) is not None else None
    if s.backend == "pytorch":
        missing = ("the free memory and the runtime estimate the PyTorch engine sized it from are DEBUG lines "
                   "('minimal free gpu memory', 'estimated max runtime memory': --log-level DEBUG)")
    elif s.startup.era.hi is not None and s.startup.era.hi < (0, 2, 2):
        missing = "TurboMind before 0.2.2 took the ratio of the card's total memory, which the log does not state"
    elif s.startup.era.lo < (0, 2, 2):
        missing = ("TurboMind prints the block count, not the memory the ratio applied to (the card's total before "
                   "0.2.2, the smallest rank's free memory after the weights from 0.2.2; the log's era spans both)")
    else:
        missing = ("TurboMind (<=0.14) prints the block count, not the free memory after the weights that the ratio "
                   "applied to (the smallest rank's)")
    implied = ""
    if kv_lo is not None and r < 1 and cell.hi is not None:
        lo, hi = kv_lo / r, (blocks + 1) * cell.hi / GIB / r
        free = f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}..{hi:.2f}"
        per = f"{cell.bytes:,} B" if cell.bytes else f"{s.get('block_mib'):g} MiB"
        what = ("free after the weights, less the runtime estimate," if s.backend == "pytorch"
                else "free after the weights")
        implied = (f"; {blocks:,} blocks x {per} = {_kv_gib(cell, blocks):.2f} GiB implies {free} GiB {what} at a "
                   f"ratio of {r:g}" + (" (assumed: the log does not state the ratio)" if s.ratio_assumed else ""))
    return None, Verdict.UNKNOWN, unsaid + missing + implied, None, ()


def _linear_state(s: Settings, cell: Cell, blocks: int):
    """0.13-0.14 ``SequenceManager``: blocks = (floor(free_before x ratio) - linear) / block bytes, truncated by the
    block manager (``max_block_count_ = block_count``); the MiB figures are printed to 0.01."""
    target, linear = s.value("target_mib"), s.value("linear_mib")
    lo_b, hi_b = (cell.bytes, cell.bytes) if cell.bytes else (cell.lo, cell.hi)
    if not lo_b or not hi_b:
        return None, Verdict.UNKNOWN, "the block size is not known", None, ()
    lo = math.floor(((target - linear - 2 * MB2_HALF_ULP_MIB) * MIB) / hi_b)
    hi = math.floor(((target - linear + 2 * MB2_HALF_ULP_MIB) * MIB) / lo_b)
    pred = TokenInterval(lo * s.block, hi * s.block)
    verdict = Verdict.MATCH if lo <= blocks <= hi else Verdict.MISMATCH
    rule = (f"(target {target:.2f} - linear state {linear:.2f}) MiB / {(lo_b + hi_b) / 2 / MIB:.3f} MiB per block "
            f"(SequenceManager, 0.13-0.14)")
    reason = (f"{blocks:,} blocks: the linear state ({linear:.2f} MiB) is taken out of the ratio's target first"
              if verdict == Verdict.MATCH else
              f"{blocks:,} blocks where the linear-state rule gives {lo:,}..{hi:,}")
    # the target is the line's own (free_before x ratio, computed by the engine): the ratio is not an input here
    return pred, verdict, reason, rule, ()


def _pytorch(s: Settings, cell: Cell, blocks: int):
    """``update_configs``: int((free - runtime) x ratio / block bytes); free and runtime are ``>> 20`` (MiB, cut)."""
    if not cell.bytes:
        return (None, Verdict.UNKNOWN, "the bytes per block need the model's config (--model-config)", None, ())
    free, run = s.value("free_mib"), s.value("runtime_mib")
    lo = int((free - run - 1) * MIB * s.ratio / cell.bytes)
    hi = int((free + 1 - run) * MIB * s.ratio / cell.bytes)
    pred = TokenInterval(lo * s.block, hi * s.block)
    verdict = Verdict.MATCH if lo <= blocks <= hi else Verdict.MISMATCH
    rule = f"({free:g} - {run:g}) MiB x {s.ratio:g} / {cell.bytes:,} B per block (update_configs)"
    reason = (f"{blocks:,} blocks of {s.block} tokens" if verdict == Verdict.MATCH else
              f"{blocks:,} blocks where the formula gives {lo:,}..{hi:,}")
    return pred, verdict, reason, rule, ("mem_fraction_static",)


def _object_cache(s: Settings) -> tuple[str, tuple[Finding, ...]]:
    """0.15+: one region of floor(free x ratio) bytes. A check of the arithmetic, in MiB to the printed 0.01."""
    budget, free = s.value("object_budget_mib"), s.value("object_free_mib")
    said = s.get("object_ratio")
    exact = s.ratio_source != "log (the object cache line)" or said is None
    r = s.ratio if exact or said is None else said
    tol = MB2_HALF_ULP_MIB * (1 + r) + (0 if exact else free * 0.0005)
    residual = budget - free * r
    label = "TP0"
    if abs(residual) <= tol:
        raised = F.budget_reconciles(f"the object cache {budget:,.2f} MiB = {free:,.2f} MiB free x {r:g} "
                                     f"(to the printed 0.01 MiB)", [label], "TurboMind 0.15+: one region "
                                     "shared by the KV blocks and every other cache")
    else:
        raised = F.budget_mismatch(label, residual / 1024, tol / 1024, [label])
    return (f"TurboMind 0.15+ sizes one object cache in bytes ({budget / 1024:.2f} GiB), shared by the KV blocks and "
            "the engine's other caches: the log gives no token count to check"), (raised,)


def _session_findings(s: Settings, tokens: int | None, blocks: int | None) -> list[Finding]:
    cut, asked = s.get("session_len_cut"), s.get("session_len_asked") or s.session_len
    if cut is not None:
        line = s.lines.get("session_len_cut")
        return [F.session_exceeds_pool(int(asked) if asked else None, int(cut), blocks, s.block, line, stated=True,
                                     quant_policy=s.quant_policy)]
    if tokens is not None and s.session_len and s.session_len > tokens:
        return [F.session_exceeds_pool(s.session_len, tokens, blocks, s.block, None, stated=False,
                                     quant_policy=s.quant_policy)]
    return []


def _failures(startup: Startup) -> list[Finding]:
    out: list[Finding] = []
    for f in startup.of(Failure)[:1]:
        out.append(F.not_enough_memory(f.message, f.line, dict(f.numbers)))
    return out


def _ranks(s: Settings) -> list[Rank]:
    return sorted({e.rank for e in s.startup.of(Reading) if e.rank.label}) or [SINGLE_RANK]


def _ledgers(s: Settings, kv_gib: float | None) -> tuple[RankLedger, ...]:
    ranks = _ranks(s)
    free = _free_gib(s)
    items: list[LedgerItem] = []
    line = s.lines.get("max_block_count") or s.lines.get("num_gpu_blocks")
    if s.get("object_budget_mib") is not None:
        items.append(LedgerItem("kv_cache", "object cache (the KV blocks and the engine's other caches, one region)",
                                round(s.value("object_budget_mib") / 1024, 4), "log",
                                line=s.lines.get("object_budget_mib")))
        kv_gib = s.value("object_budget_mib") / 1024
    else:
        if s.get("linear_mib") is not None:
            items.append(LedgerItem("linear_state", "linear-attention state (pooled)",
                                    round(s.value("linear_mib") / 1024, 4), "log",
                                    line=s.lines.get("linear_mib")))
        if s.get("runtime_mib") is not None:
            items.append(LedgerItem("runtime_estimate", "runtime estimate (logits of a prefill, kept out of the KV "
                                    "budget)", round(s.value("runtime_mib") / 1024, 4), "log",
                                    line=s.lines.get("runtime_mib")))
        if kv_gib is not None:
            items.append(LedgerItem("kv_cache", "KV cache (blocks x bytes per block)", round(kv_gib, 4), "derived",
                                    line=line))
    if free is not None and kv_gib is not None:
        used = sum(it.gib for it in items if it.gib is not None)
        items.append(LedgerItem("headroom", "left free by the ratio (activations, CUDA graphs, other processes)",
                                round(free - used, 4), "derived", in_reserve=True))
    out = []
    for i, r in enumerate(ranks):
        out.append(RankLedger(rank=i, label=r.display, pre_load_free_gib=None, weights_gib=None,
                              kv_gib=round(kv_gib, 4) if kv_gib is not None else None, free_after_weights_gib=free,
                              free_after_pool_gib=None, free_at_end_gib=None, free_at_end_source=None,
                              end_is_final=False, items=tuple(items), unexplained_gib=None,
                              unexplained_tolerance_gib=None,
                              logged=tuple(sorted(s.readings.items()))))
    return tuple(out)


#: the host memory the PyTorch engine gives its CPU blocks unless num_cpu_blocks is set (model_agent.py /
#: executor: ``host_mem_size = 4 << 30``; ``num_cpu_blocks = int(host_mem / block bytes)``)
HOST_CACHE_BYTES = 4 << 30


def _host_blocks(cpu: int, cell: Cell) -> str:
    """What the CPU block count says of the block size, at the engine's default host memory (an assumption: a
    user-set num_cpu_blocks breaks it, so it is said, never made a finding)."""
    lo, hi = HOST_CACHE_BYTES / (cpu + 1), HOST_CACHE_BYTES / cpu
    text = f"; at the engine's default 4 GiB of host memory for them a block is {lo:,.0f}..{hi:,.0f} B"
    if cell.bytes:
        text += " and the config's " + (f"{cell.bytes:,} B agrees" if lo < cell.bytes <= hi else
                                        f"{cell.bytes:,} B does not (num_cpu_blocks set by hand, or another layout)")
    return text


def _kv_dtype(s: Settings) -> str | None:
    name = {0: "16-bit", 4: "int4", 8: "int8"}.get(s.quant_policy)
    said = ("assumed" if s.quant_source.startswith("default") else "inferred" if s.quant_source.startswith("inferred")
            else s.quant_source.split(" (")[0])
    return f"{name} (quant_policy {s.quant_policy}, {said})" if name else None


def _kv_bytes(s: Settings) -> float | None:
    return {0: 2.0, 4: 0.5, 8: 1.0}.get(s.quant_policy)


def _formula_text(s: Settings) -> str:
    if s.get("object_budget_mib") is not None:
        return "object cache = floor(free after the weights x cache_max_entry_count) bytes (TurboMind 0.15+)"
    if s.backend == "pytorch":
        return ("blocks = int((free - runtime estimate) x cache_max_entry_count / bytes per block); "
                "tokens = blocks x block_size")
    return ("blocks = floor(floor(free after the weights x cache_max_entry_count) / bytes per block), or the count "
            "itself when >= 1; tokens = blocks x cache_block_seq_len")


def _rows(s: Settings, cell: Cell, blocks: int | None, kv_gib: float | None) -> tuple[FormulaRow, ...]:
    src = ("the object cache line" if s.get("object_free_mib") is not None else
           "the SeqMgr line" if s.get("free_before_mib") is not None else
           "the DEBUG free-memory line" if s.get("free_mib") is not None else "not in the log")
    rows = [FormulaRow("free after the weights (min over ranks)", _free_gib(s), "GiB", src),
            FormulaRow("cache_max_entry_count", s.ratio, "", s.ratio_source)]
    if s.get("object_budget_mib") is not None:
        rows.append(FormulaRow("object cache budget", s.value("object_budget_mib") / 1024, "GiB", "log"))
        return tuple(rows)
    if cell.bytes:
        rows.append(FormulaRow("MiB per block", round(cell.bytes / MIB, 6), "", cell.source or ""))
    else:
        rows.append(FormulaRow("MiB per block", s.get("block_mib"), "", "log (the block line)"
                               + (", whole MiB, cut" if s.get("block_mib_truncated") else "")
                               if s.get("block_mib") is not None else ""))
    rows.append(FormulaRow("blocks", float(blocks) if blocks is not None else None, "", "log" if blocks is not None
                           else ""))
    rows.append(FormulaRow("tokens per block", float(s.block), "", s.block_source))
    rows.append(FormulaRow("KV cache", kv_gib, "GiB", "blocks x bytes per block"))
    return tuple(rows)


def _notes(s: Settings, cell: Cell, blocks: int | None, kv_gib: float | None) -> list[str]:
    notes = list(s.notes)
    if cell.description:
        notes.append(f"bytes per block: {cell.description}")
    if blocks is not None and kv_gib is None and cell.lo is not None and cell.hi is not None:
        notes.append(f"the block line prints whole MiB, cut (<=0.7): {blocks:,} blocks hold "
                     f"{blocks * cell.lo / GIB:.2f}..{blocks * cell.hi / GIB:.2f} GiB")
    for name, source in (("cache_max_entry_count", s.ratio_source), ("the block size", s.block_source),
                         ("quant_policy", s.quant_source), ("the TP size", s.tp_source)):
        if source.startswith("default"):
            notes.append(f"{name} is not in the log: {source} is assumed")
    if s.geometry is None and s.backend != "unknown":
        notes.append("no model config: pass --model-config (config.json) to check the block size against the model")
    if s.get("prefill_tokens") is not None and s.lines.get("prefill_tokens"):
        notes.append(f"the engine lowered max_prefill_token_num to {int(s.value('prefill_tokens')):,} to leave room "
                     f"for its runtime estimate (line {s.lines['prefill_tokens']})")
    cpu = s.get("num_cpu_blocks")
    if cpu:
        notes.append(f"{int(cpu):,} host (CPU) blocks besides the GPU pool" + _host_blocks(int(cpu), cell))
    return notes
