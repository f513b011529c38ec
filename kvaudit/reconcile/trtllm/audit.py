"""One TensorRT-LLM startup, reconciled: settings, the pool, bytes per token, the budget and its prediction,
the ledger and the findings, assembled into an :class:`Audit`."""

from __future__ import annotations

import dataclasses
import math

from kvaudit.parse.interface import Startup
from kvaudit.parse.trtllm import WindowNote
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
from kvaudit.reconcile.trtllm.budget import Budget, Prediction, kv_budget, predict, round_up
from kvaudit.reconcile.trtllm.cell import ELEMENT_NAMES, Cell, bytes_per_token
from kvaudit.reconcile.trtllm.checks import rank_and_failure_findings
from kvaudit.reconcile.trtllm.context import Context, build_context
from kvaudit.reconcile.trtllm.facts import Pool, logged_pool
from kvaudit.reconcile.trtllm.ledger import rank_ledger
from kvaudit.units import GIB, LOG_HALF_ULP

ENGINE = "trtllm"

#: Why an AutoDeploy startup's pool is not checked. tensorrt_llm/_torch/auto_deploy/shim/ad_executor.py
#: (``_CacheManagerWithFakePool``, 0.2x-1.2 builds; NVIDIA/TensorRT-LLM at 000a01de, and the 1.2.0rc5 log of
#: jeansblog/Nemotron3nano): "We use the default KVCacheManager but with a fake pool by setting head_dim=0. The actual
#: cache pools are managed by auto_deploy layerwise cache pools"; its ``calculate_max_num_blocks`` returns
#: AutoDeploy's own page count (``cache_seq_interface.info.num_pages``, set by the resize_kv_cache transform from
#: ``free_mem_ratio`` of the memory free after a forward pass). The C++ pool line is that placeholder: its GiB (0.00)
#: is not the caches' memory, and neither free_gpu_memory_fraction nor KvCacheCreator's formula applies.
AUTODEPLOY = ("the AutoDeploy backend allocates its own layer-wise caches (resize_kv_cache: free_mem_ratio of the "
              "memory free after a forward pass) and gives TensorRT-LLM's KV cache manager a placeholder pool with "
              "head_dim=0 (ad_executor.py _CacheManagerWithFakePool): the pool line's GiB is not the caches' memory "
              "and kvaudit has no model of AutoDeploy's sizing, so the pool is not checked")


def reconcile(startup: Startup, opts: AuditOptions, startups_total: int = 1) -> Audit:
    ctx = build_context(startup, opts)
    findings: list[Finding] = []
    pool = logged_pool(ctx.facts)
    if ctx.autodeploy:  # the placeholder manager's 0.00 GiB is no size of the caches: the tokens only
        finals = {r: dataclasses.replace(a, gib=None) for r, a in pool.finals.items()}
        pool = dataclasses.replace(pool, finals=finals, gib=None, smallest=(
            dataclasses.replace(pool.smallest, gib=None) if pool.smallest is not None else None))
    cell = bytes_per_token(ctx, pool)
    findings += cell.findings
    if cell.implied_elt is not None:
        ctx = dataclasses.replace(ctx, kv_dtype=f"{ELEMENT_NAMES[cell.implied_elt]} (from the pool line)",
                                  kv_elt=cell.implied_elt, kv_assumed=False)
    budget = kv_budget(ctx, pool)
    findings += budget.findings
    pred = predict(ctx, budget, cell, pool)
    findings += budget.capped
    if ctx.autodeploy:
        pages = ctx.first("autodeploy_pages")
        pred = Prediction(None, Verdict.UNKNOWN, AUTODEPLOY)
        ctx.notes.append("AutoDeploy backend" + (f": {int(pages):,} pages (line {ctx.line_of('autodeploy_pages')})"
                                                 + (f" x {ctx.block} tokens = {int(pages) * ctx.block:,} tokens"
                                                    if ctx.block else "") if pages else "")
                         + "; its caches' memory is not in the C++ pool line (a placeholder with head_dim=0), and "
                         "free_gpu_memory_fraction does not size them: AutoDeploy's free_mem_ratio does")
    elif pool.self_pool is not None:
        pred = Prediction(None, Verdict.UNKNOWN, _encoder_decoder(ctx, budget, pool))
    elif (not budget.capped and pred.verdict != Verdict.MATCH and pool.gib and budget.lo is not None
            and budget.mid is not None and budget.smallest is not None and budget.smallest.cpp
            and pool.gib < 0.8 * budget.lo):
        # a C++ pool far below the fraction's budget, and no cap in the log: probably capped
        findings.append(F.pool_below_budget(pool.gib, budget.mid, ctx.fraction, budget.smallest.mid))
        # the fraction itself is unknown when the log does not state it: a lower one is as likely as a cap
        share = pool.gib / budget.smallest.mid
        why = (f"a fraction of about {share:.2f} instead of the assumed {ctx.fraction:g} (the log does not state it), "
               "or a cap the log does not show, sized it" if ctx.fraction_assumed
               else "a cap the log does not show sized it")
        pred = Prediction(None, Verdict.UNKNOWN, f"the pool ({pool.gib:.2f} GiB) is far below the fraction's "
                                                 f"budget: {why}")
    formula = _formula(ctx, budget, cell, pool, pred)
    if pred.verdict == Verdict.MATCH:
        text = f"({budget.smallest.text}) x {ctx.fraction:g}" if budget.smallest else "the available KV memory"
        if budget.capped:
            text = f"min({text}, the configured cap)"
        # the worked formula; the verdict raises TOKENS_* from the formula's verdict (kvaudit.verdict, rule 6)
        formula = dataclasses.replace(formula, check_text=f"{text} -> floor(/ {cell.bytes:,} B) rounded up to "
                                                          f"blocks of {ctx.block}")

    ledgers = tuple(rank_ledger(i, ctx.facts[r], ctx.fraction, pool.finals.get(r), ctx.multimodal_gib,
                                (ctx.facts[r].encoder_decoder_pair() or (None, None))[0])
                    for i, r in enumerate(sorted(ctx.facts)))
    pair_text = (f"the self-attention cache holds {pool.self_pool.tokens:,} tokens and the cross-attention cache "
                 f"{pool.tokens:,}") if pool.self_pool is not None and pool.tokens else None
    findings += rank_and_failure_findings(startup, ctx.facts, budget.frees, ctx.fraction, cell.bytes, pool.tokens,
                                          opts.thresholds, pair_text)
    lacks = None if pool.tokens is not None else (
        "KV pool line ('Allocated ... for max tokens in paged KV cache (N)')"
        + (" after the profiling pass" if pool.temporary else ""))
    _notes(ctx, budget, pool, cell)

    geom = ctx.geom
    cpp = budget.smallest.cpp if budget.smallest else ctx.first("peak_gib") is None
    return Audit(
        lacks=lacks,
        engine=ENGINE,
        **startup_identity(startup, opts.source, startups_total),
        model=ModelSummary(geom.architecture if geom else _model_name(startup.model_path),
                           ("mla" if geom.is_mla else "mha") if geom else "unknown",
                           geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
                           (None if geom.is_mla else math.ceil((geom.num_kv_heads or 1) / ctx.tp)) if geom else None,
                           geom.head_dim if geom else None,
                           ctx.kv_dtype if (geom or opts.kv_cache_dtype) else None,
                           ctx.kv_elt if (geom or opts.kv_cache_dtype) else None, ctx.tp,
                           geom.source if geom else None, ctx.tp_at_least, ctx.tp_source),
        formula=formula,
        ranks=ledgers,
        findings=tuple(sorted(findings, key=lambda f: -f.severity.rank)),
        speculative=None,
        # two or more attention windows: VSWA, whose per-window split the support table marks not modelled (rule 7
        # then keeps every model judgement off the pool); otherwise the verdict derives the kinds from the model
        # AutoDeploy: its caches are its own (the pool line is a placeholder), which the support table marks not
        # modelled, so the coverage every output shows says so
        pool_kinds=("backend_managed",) if ctx.autodeploy else
        (("mla" if geom is not None and geom.is_mla else "dense"), "swa") if len(ctx.windows) > 1 else (),
        hicache_host_gb=None,
        notes=tuple(ctx.notes + ([f"bytes per token: {cell.description}"] if cell.description else [])
                    + (["the KV dtype is assumed (pass --kv-cache-dtype)"]
                       if ctx.kv_assumed and cell.source == "config" else [])),
        engine_display="TensorRT-LLM",
        formula_text=("AutoDeploy: pages = what its resize_kv_cache transform fits in free_mem_ratio x the memory "
                      "free after a forward pass (not modelled)" if ctx.autodeploy else
                      ("KV = available x fraction" if cpp else "KV = (total - peak + temporary KV) x fraction")
                      + ";  tokens = ceil(floor(KV / bytes per token) / block) x block"),
        formula_rows=((FormulaRow("free_mem_ratio (AutoDeploy)", None, "", "not in the log"),
                       FormulaRow("free_gpu_memory_fraction", None if ctx.fraction_assumed else ctx.fraction, "",
                                  ctx.fraction_source)) if ctx.autodeploy else (
            FormulaRow("device total memory", formula.pre_load_free_gib, "GiB", "the card"),
            FormulaRow("available (free after the engine and buffers)" if cpp
                       else "free after profiling (total - peak + temporary KV)", formula.post_load_free_gib, "GiB",
                       "what the fraction applies to"),
            FormulaRow("free_gpu_memory_fraction", ctx.fraction, "", ctx.fraction_source),
            FormulaRow("headroom = (1 - fraction) x free", formula.reserve_gib, "GiB", "left outside the KV cache"),
            FormulaRow("available KV cache memory", formula.rest_gib, "GiB", "the KV budget"),
        )),
        pre_load_label="total",
    )


def _formula(ctx: Context, b: Budget, cell: Cell, pool: Pool, pred: Prediction) -> Formula:
    total = ctx.first("total_gib") or ctx.first("cpp_total_gib")
    s = b.smallest
    unused = ctx.autodeploy and ctx.fraction_assumed  # AutoDeploy: no default of the fraction is assumed
    return Formula(
        mem_fraction_static=None if unused else ctx.fraction,
        mem_fraction_static_source=ctx.fraction_source,
        pre_load_free_gib=total,
        pre_load_free_source="device total memory" if total else None,
        post_load_free_gib=round(s.mid, 3) if s else None,
        reserve_gib=round((1 - ctx.fraction) * s.mid, 4) if s else None,
        rest_gib=b.available_logged if b.available_logged is not None else (
            round(b.mid, 3) if b.mid is not None else None),
        bytes_per_token=cell.bytes,
        bytes_per_token_source=cell.source,
        predicted_tokens=pred.interval,
        logged_tokens=pool.tokens,
        verdict=pred.verdict,
        verdict_reason=pred.reason,
        rule=b.rule,
        effective_mem_fraction_static=pred.effective_fraction,
        page_size=ctx.block,
        max_total_tokens_cap=next((c.tokens for c in ctx.caps if c.kind == "max_tokens"), None),
        speculative_headroom_tokens=None,
        kv_bytes_per_token_logged=round(cell.from_pool_line, 1) if cell.from_pool_line else None,
        # the budget is fraction x free unless the log states it; the cell divides the KV heads by TP
        check_inputs=(("mem_fraction_static",) if b.available_logged is None and not ctx.autodeploy else ())
        + (("attention_tp_size",) if (cell.source or "").startswith("config") else ()),
    )


def _notes(ctx: Context, b: Budget, pool: Pool, cell: Cell) -> None:
    notes, block, logged = ctx.notes, ctx.block, pool.tokens
    if len(ctx.windows) > 1:
        notes.append("variable sliding-window attention: the pool is split per window size ("
                     + "; ".join(f"window {w:,}: " + (", ".join(x for x in (
                         f"{tokens:,} max tokens" if tokens is not None else "",
                         f"{blocks:,} primary blocks" if blocks is not None else "") if x) or "its pool not printed")
                         for w, (tokens, blocks) in sorted(ctx.windows.items()))
                     + "); the split itself is not modelled, so the count is not checked")
    peak_line = min((rr.lines["peak_gib"] for rr in ctx.facts.values() if "peak_gib" in rr.lines), default=None)
    final = pool.smallest
    writeback = [c for c in ctx.caps if c.kind == "both_set" and final is not None and c.line < final.line
                 and (peak_line is None or c.line > peak_line)]
    est = ctx.first("estimated_tokens")
    # the free and total memory of the same warning line as the cap it names (the profiling cache's line and the
    # final one each carry their own); the last such line before the pool, which is the one that sized it
    from kvaudit.parse.trtllm import Reading

    on_line = {(r.line, r.key): r.value for r in ctx.startup.of(Reading)
               if r.key in ("both_free_gib", "both_total_gib")}
    boths = [c for c in ctx.caps if c.kind == "both_set" and (c.line, "both_free_gib") in on_line
             and (final is None or c.line < final.line)]
    both = boths[-1] if boths else None
    free = on_line.get((both.line, "both_free_gib")) if both else None
    total = on_line.get((both.line, "both_total_gib")) if both else None
    if both is not None and free is not None and total is not None:
        notes.append(f"line {both.line}: both the fraction and max_tokens were set; {free:.2f} GiB of {total:.2f} GiB "
                     f"was free there, so the fraction allowed {both.fraction or ctx.fraction:g} x {free:.2f} = "
                     f"{(both.fraction or ctx.fraction) * free:.2f} GiB against max_tokens {both.tokens:,}; the "
                     "smaller of the two sized the cache")
    if writeback and logged and block:
        n = writeback[-1].tokens or 0
        who = ("the estimate wrote max_tokens={n:,} back" if peak_line is not None else
               "max_tokens={n:,} was set (written back by the profiling estimate, or by the user: the log has no "
               "profiling peak line to tell)").format(n=n)
        notes.append(f"{who} (line {writeback[-1].line}); the C++ pool rounds "
                     f"it up to whole blocks: ceil({n:,} / {block}) x {block} = {round_up(n, block):,}"
                     + (" = the pool" if round_up(n, block) == logged else f", but the pool has {logged:,}"))
    elif est is not None:
        notes.append(f"the engine estimated {int(est):,} tokens")
    cap, cap_fraction = ctx.first("torch_cap_gib"), ctx.first("torch_cap_fraction")
    if cap is not None and cap_fraction:
        # _adjust_torch_mem_fraction: cap = free + torch-reserved - 32 MiB after the pool, as a fraction of the total
        notes.append(f"after the pool PyTorch's allocator was capped at {cap:.2f} GiB ({cap_fraction:.4f} of "
                     f"{cap / cap_fraction:.2f} GiB: what was free plus what torch held, less 32 MiB; "
                     "_adjust_torch_mem_fraction): near it torch releases its cached blocks, and an allocation past "
                     "it fails with OOM")
    if ctx.fraction_assumed and b.smallest is not None:
        # only where a budget was computed with it: a log with no free-memory figure (a failure, an excerpt) uses
        # no fraction, and its formula row already says the default's value
        notes.append("free_gpu_memory_fraction is not in the log: the default 0.9 is assumed")
    if ctx.tp_at_least:
        notes.append(f"TP size at least {ctx.tp}: {ctx.tp_source}")
    world = ctx.first("mpi_size")
    if world:
        notes.append(f"MPI size {int(world)} (line {ctx.line_of('mpi_size')}): the ranks are TP x PP = {int(world)}, "
                     f"so the TP size is at most {int(world)}; the lines do not say how they split")
    cut = ctx.startup.of(WindowNote)
    if cut:
        # _validate_and_adjust_attention_windows (resource_manager.py): a window longer than its pool can hold for
        # one sequence is cut to get_max_atten_window_upper_bound, which for beam width 1 and no sink tokens is
        # the pool's blocks x tokens per block, i.e. the whole pool; max_seq_len follows it
        w = cut[-1]
        whole = ""
        if len(ctx.windows) <= 1 and logged and block and w.bound == logged:
            whole = f" = the whole pool ({logged // block:,} blocks x {block}): one request may fill it"
        elif len(ctx.windows) <= 1 and logged and w.bound > logged:
            whole = f", more than the pool's {logged:,} tokens"
        seq = ctx.first("max_seq_len_adjusted")
        notes.append(f"the attention window {w.window:,} was cut to {w.bound:,} tokens (line {w.line}){whole}"
                     + (f"; max_seq_len became {int(seq):,}: a longer request is refused" if seq else
                        ": a sequence cannot attend beyond it"))
    seq_cut = ctx.first("seq_cut")
    if seq_cut is not None and not cut:
        # trtGptModelInflightBatching.cpp (0.1x C++ runtime): the engine's maxAttentionWindow / maxSequenceLen did not
        # fit one sequence in the pool, so both became the longest that does (calculateMaxAttentionWindow: the output
        # blocks first, the prompt in what is left), and maxInputLen one less when it was longer
        inp = ctx.first("input_cut")
        notes.append(f"the runtime cut maxAttentionWindow and maxSequenceLen to {int(seq_cut):,} tokens (line "
                     f"{ctx.line_of('seq_cut')}): the engine's length "
                     "did not fit one sequence in the KV pool" + (f" of {logged:,} tokens" if logged else "")
                     + (f"; maxInputLen became {int(inp):,} (line {ctx.line_of('input_cut')}): a longer prompt cannot "
                        "be served" if inp is not None else ": a longer sequence cannot be served"))
    blocks = ctx.first("primary_blocks")
    if block is None and blocks and b.mid is not None:
        fits = _block_sizes(b, int(blocks), cell.bytes if cell.source == "config" else None)
        if len(fits) == 1:
            # calculateMaxNumBlocks: blocks = ceil(floor(KV / bytes per token) / tokens per block)
            assumed = " the assumed" if ctx.fraction_assumed else ""
            notes.append(f"{int(blocks):,} primary blocks of about {b.mid / blocks * 1024:.2f} MiB each: with{assumed} "
                         f"fraction {ctx.fraction:g} and {cell.bytes:,} B/token that is {fits[0]} tokens per block "
                         f"({int(blocks) * fits[0]:,} tokens), the only power of two that fits; the log states "
                         "neither the block size nor the token count, so the pool is not checked")
        else:
            assumed = f" if the assumed fraction {ctx.fraction:g} applied" if ctx.fraction_assumed else ""
            notes.append(f"{int(blocks):,} primary blocks of about {b.mid / blocks * 1024:.2f} MiB each{assumed} (the "
                         "tokens per block and the model config would give the token count)")
    secondary = ctx.first("secondary_blocks")
    if secondary:
        # KVCacheManager::calculateMaxNumBlocks (C++) and resource_manager.py calculate_max_num_blocks: the
        # secondary pool is host_cache_size (kv_cache_host_memory_bytes) / bytes per token / tokens per block, the
        # offload tier in host RAM; the free-memory fraction sizes the primary pool only
        notes.append(f"{int(secondary):,} secondary blocks (line {ctx.line_of('secondary_blocks')}) are the "
                     "host-memory offload tier, sized by the host cache setting (kv_cache_host_memory_bytes), "
                     "not by the fraction: CPU RAM, no part of the GPU's KV pool"
                     + (f" ({secondary / blocks:.2f} x the primary pool's size in blocks)" if blocks else ""))


def _encoder_decoder(ctx: Context, b: Budget, pool: Pool) -> str:
    """Why an encoder-decoder pool is not checked, with the arithmetic the log does allow."""
    own, cross = pool.self_pool, pool.smallest
    assert own is not None and cross is not None
    said = ctx.first("cross_fraction")
    text = (f"an encoder-decoder model: two KV caches, self-attention ({own.tokens:,} tokens, {own.gib or 0:.2f} GiB, "
            f"line {own.line}) and cross-attention ({cross.tokens:,} tokens, {cross.gib or 0:.2f} GiB, line "
            f"{cross.line}), "
            "split by crossKvCacheFraction")
    if said is not None:
        return text + f" ({said:g}); the bytes per token of each cache are not in the log"
    avail = ctx.first("cpp_available_gib")
    if avail and cross.gib and avail > LOG_HALF_ULP and cross.gib > LOG_HALF_ULP:
        lo = (cross.gib - LOG_HALF_ULP) / (avail + LOG_HALF_ULP) / ctx.fraction
        hi = (cross.gib + LOG_HALF_ULP) / (avail - LOG_HALF_ULP) / ctx.fraction
        text += (f", which the log does not state; the cross cache is {cross.gib / avail:.2f} of the {avail:.2f} GiB "
                 f"available at the last sizing line, i.e. fraction {ctx.fraction:g} x a crossKvCacheFraction "
                 f"between {lo:.2f} and {min(hi, 1.0):.2f} (both numbers are rounded to 0.01 GiB)")
    return text


def _block_sizes(b: Budget, blocks: int, cell: int | None) -> list[int]:
    """The powers of two that give ``blocks`` from the budget interval at ``cell`` bytes per token."""
    if cell is None or b.lo is None or b.hi is None:
        return []
    return [t for t in (4, 8, 16, 32, 64, 128, 256, 512)
            if math.ceil(math.floor(b.lo * GIB / cell) / t) <= blocks <= math.ceil(math.floor(b.hi * GIB / cell) / t)]


def _model_name(path: str | None) -> str | None:
    """``.../models--openai--gpt-oss-120b/snapshots/<rev>`` -> ``openai/gpt-oss-120b``."""
    if not path:
        return None
    for part in path.split("/"):
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/")
    return path
