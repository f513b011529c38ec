"""Findings drawn from the ledgers and from the failure lines of a startup."""

from __future__ import annotations

import re

from dataclasses import replace
from typing import Any

from kvaudit.parse.sglang import AiterFractionKept, Failure, KVDtype, OtherPool, WeightEnd
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding, Formula, RankLedger, Thresholds
from kvaudit.reconcile.sglang.context import Context, context_length_of
from kvaudit.reconcile.sglang.formula import EAGLE_FAMILY
from kvaudit.reconcile.values import as_float
from kvaudit.units import GIB, Interval

def ledger_findings(ctx: Context, ledgers: tuple[RankLedger, ...], formula: Formula, reserve: Interval | None,
                     th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    # rank imbalance: the formula sizes every rank by the smallest T and post
    # (docs/findings.md: a spread above rank_imbalance_gib and rank_imbalance_fraction x T, T the largest
    # pre-load free memory; without T, the largest reading compared stands in for it)
    worst = None
    t_values = [l.pre_load_free_gib for l in ledgers if l.pre_load_free_gib is not None]
    t_spread = (max(t_values) - min(t_values)) if len(t_values) >= 2 else None
    for what, attr in (("free memory before the weights (T)", "pre_load_free_gib"),
                       ("free memory after the weights", "free_after_weights_gib")):
        vals = [(l.label, getattr(l, attr)) for l in ledgers if getattr(l, attr) is not None]
        if len(vals) < 2:
            continue
        lo, hi = min(vals, key=lambda x: x[1]), max(vals, key=lambda x: x[1])
        spread = hi[1] - lo[1]
        t_ref = max(t_values) if t_values else hi[1]
        if spread > max(th.rank_imbalance_gib, th.rank_imbalance_fraction * t_ref) and (
                worst is None or spread > worst[3]):
            worst = (what, lo, hi, spread)
    if worst is not None:
        limit = max(th.rank_imbalance_gib, th.rank_imbalance_fraction * max(t_values)) if t_values else None
        equal_before = t_spread if (worst[0].startswith("free memory after") and t_spread is not None
                                    and limit is not None and t_spread <= limit) else None
        out.append(F.rank_imbalance(*worst, formula.bytes_per_token, equal_before))

    # does the static reserve explain the memory free after the pool?
    if reserve is not None and formula.mem_fraction_static_source != "inferred" and not formula.probable_cap:
        explained = []
        for l in ledgers:
            if l.free_after_pool_gib is None or l.free_after_weights_gib is None or l.kv_gib is None:
                continue
            req = item_gib(l, "request_table")
            rnd = item_gib(l, "allocator_rounding")
            pools = sum(it.gib or 0 for it in l.items
                        if it.key in ("kv_cache", "kv_cache_swa", "state_pool", "budget_reserve")
                        or it.key.startswith("pool_"))
            expected = l.free_after_weights_gib - pools - req - rnd
            tol = th.reserve_tolerance_gib + (0.0 if l.item("allocator_rounding") else 0.08)
            if abs(l.free_after_pool_gib - expected) <= tol:
                explained.append(l)
        if explained:
            l = min(explained, key=lambda x: x.free_after_pool_gib or 0)
            out.append(F.reserve_explains_free(l, reserve.mid, formula, item_gib(l, "request_table"),
                                               item_gib(l, "allocator_rounding") if l.item("allocator_rounding")
                                               else None, [x.label for x in explained], len(ledgers),
                                               max(x.free_after_pool_gib or 0 for x in explained)))

    off = [l for l in ledgers if l.unexplained_gib is not None
           and abs(l.unexplained_gib) > th.unexplained_gib + (l.unexplained_tolerance_gib or 0)]
    if off:
        # memory missing (positive) that an item the ledger could not size may hold: info, naming it
        covered = all((l.unexplained_gib or 0) > 0 and l.unmodelled for l in off)
        f = F.unexplained(off, covered)
        if (ctx.spec_algo or "").upper() in EAGLE_FAMILY:
            # NEXTN/EAGLE drafts keep bf16 copies of the target's embed_tokens/lm_head until after the KV pool is
            # sized (sgl-project/sglang#36452): memory freed later, that shows as more free than accounted
            f = replace(f, fields={**f.fields, "freed_candidates": [
                "the draft's bf16 embed_tokens/lm_head copies, released after the KV pool was sized"]})
        out.append(f)

    # memory idle at the end of startup: only when the end reading is final (graphs and draft are in the
    # log); memory an excerpt stops before spending is not idle
    # nor after a fatal failure: a start that died never ran with that memory idle (its STARTUP_FAILED says what
    # happened), and advice to raise the fraction would contradict it
    failed = any(f.kind in FATAL for f in ctx.startup.of(Failure))
    for l in ([] if failed else ledgers):
        t = l.pre_load_free_gib
        idle = l.free_at_end_gib if l.end_is_final else None
        if t and idle is not None and idle >= max(th.unused_min_gib, th.unused_fraction * t):
            # memory given back *after* the pool was sized (the loader's buffers collected during CUDA-graph
            # capture: "mem usage=-5.29 GB") was not free when the budget was measured; a larger fraction cannot
            # reach it, only freeing it before the measurement can (gc before sizing: sgl-project/sglang#36583)
            late = -sum(it.gib for it in l.items if it.key.startswith("freed_") and it.gib is not None)
            reachable = max(0.0, idle - late)
            extra = int(reachable * GIB / formula.bytes_per_token) if formula.bytes_per_token else None
            hicache = as_float(ctx.args.get("hicache_ratio")) if ctx.args.get("enable_hierarchical_cache") else None
            out.append(_aiter_scaled_advice(ctx, F.unused_memory(l, idle, t, formula, extra, l.end_is_final,
                                                                 hicache, late)))
            break
    low = [l for l in ledgers if l.end_is_final and l.free_at_end_gib is not None
           and l.free_at_end_gib < th.low_headroom_gib]
    if low:
        out.append(F.low_headroom(min(low, key=lambda x: x.free_at_end_gib or 0), th.low_headroom_gib))
    return out


def concurrency_findings(ctx: Context, tokens: int | None, context_len: int | None) -> list[Finding]:
    """--max-running-requests above what the engine applied (its own warning line, the scheduler summary, or the
    state pool's cap rerun): concurrency lowered without the operator asking."""
    from kvaudit.parse.sglang import RequestsReduced
    from kvaudit.reconcile.sglang.ledger import applied_requests
    from kvaudit.reconcile.values import as_int

    said = ctx.startup.of(RequestsReduced)
    if said:
        r = said[0]
        return [F.concurrency_lowered(r.requested, r.applied, "the engine's own warning: the KV cache capacity",
                                      r.line)]
    requested = as_int(ctx.args.get("max_running_requests"))
    if not requested:
        return []
    dp = as_int(ctx.args.get("dp_size")) or 1
    per_worker = requested // dp if ctx.args.get("enable_dp_attention") is True else requested
    applied, how = applied_requests(ctx, tokens, context_len)
    if applied is None or applied >= per_worker:
        return []
    line = ctx.summary.line if ctx.summary is not None and ctx.summary.max_running_requests else None
    return [F.concurrency_lowered(per_worker, applied, how, line)]


def item_gib(l: RankLedger, key: str) -> float:
    it = l.item(key)
    return (it.gib or 0.0) if it else 0.0


#: failure kinds that end a startup wherever they appear, before or after the scheduler summary
FATAL = ("traceback", "exception", "oom", "pool_too_small", "not_enough_memory", "no_kv_memory", "unbalanced",
         "warmup", "cuda_error", "killed", "child_failed", "watchdog", "port_in_use")
#: failures that start a chain: what follows them (the warmup request timing out, the HTTP server's shutdown
#: raising CancelledError, a child's SIGQUIT) is their consequence, not the cause
_PRECURSORS = ("watchdog", "port_in_use")
#: kinds whose message says more than "Traceback (most recent call last)"
_TELLING = ("exception", "oom", "not_enough_memory", "no_kv_memory", "warmup", "cuda_error", "killed",
            "pool_too_small", "unbalanced", "watchdog", "port_in_use")


def oom_finding(ctx: Context, formula: Formula | None) -> Finding | None:
    """A CUDA out-of-memory with its arithmetic (torch's message states what was asked and what was free). After
    the KV pool it is the reserve that ran short (graphs, attention workspaces, the draft): a fraction lower by
    (asked - free) / T would have left the room; before the pool, the weights themselves did not fit."""
    from kvaudit.parse.sglang import PoolEnd

    oom = next((f for f in ctx.startup.of(Failure) if f.kind == "oom" and "tried_gib" in f.numbers), None)
    if oom is None:
        return None
    tried, free = oom.numbers["tried_gib"], oom.numbers.get("free_gib")
    pool_end = min((e.line for e in ctx.startup.of(PoolEnd)), default=None)
    after_pool = pool_end is not None and pool_end < oom.line
    numbers: dict[str, Any] = {"tried_gib": round(tried, 4)}
    said = f"it asked for {tried:.2f} GiB"
    if free is not None:
        numbers["free_gib"] = round(free, 4)
        said += f" with {free:.2f} GiB free"
    stage = ("after the KV pool was allocated (CUDA graphs, attention workspaces, the draft come out of the static "
             "reserve)" if after_pool else "before the KV pool was sized (loading the weights)")
    hint = ""
    mfs = formula.mem_fraction_static if formula else None
    T = formula.pre_load_free_gib if formula else None
    if after_pool and free is not None and mfs is not None and T:
        short = max(0.0, tried - free)
        fits = mfs - short / T
        numbers.update(shortfall_gib=round(short, 4), fitting_mem_fraction_static=round(fits, 4))
        hint = (f"; the reserve was {short:.2f} GiB short: --mem-fraction-static {fits:.3f} or lower (mfs - short / "
                f"T = {mfs:g} - {short:.2f} / {T:.2f}) leaves that much more for it, less cuda-graph batch sizes "
                "(--cuda-graph-max-bs) need less")
    elif not after_pool:
        quant = ctx.args.get("quantization")
        if isinstance(quant, str) and quant not in ("", "None", "none"):
            # the checkpoint is already quantized: "use a quantized one" would send on-call the wrong way; a layer
            # the build creates unquantized (e.g. MoE experts through quantization/unquant.py) takes full size
            step = "the weights did not fit (more GPUs or a smaller checkpoint)"
            hint = (f"; a lower --mem-fraction-static does not help here: {step}; the checkpoint is already quantized "
                    f"({quant}): if it should fit, check that this build applies that quantization to every layer "
                    "(one created unquantized takes its full-precision size)")
        else:
            step = "the weights do not fit (more GPUs, or a smaller or quantized checkpoint)"
            hint = f"; a lower --mem-fraction-static does not help here: {step}"
        numbers = {**numbers, "next_step": step}
    return F.not_enough_memory(f"CUDA out of memory {stage}: {said}{hint}", oom.line, numbers)


def failure_findings(ctx: Context, shortfall: dict[str, float] | None = None,
                     formula: Formula | None = None) -> list[Finding]:
    """Error findings for the failure lines. A failure after the scheduler summary (a warmup error, a CUDA
    error, a killed process) is as much a failed startup as one before it. ``shortfall`` carries what the
    formula says about a memory error (the smallest viable fraction, what the engine's own count implies)."""
    out: list[Finding] = []
    failures = ctx.startup.of(Failure)
    memory = [f for f in failures if f.kind in ("not_enough_memory", "no_kv_memory", "host_memory")]
    for kind in dict.fromkeys(f.kind for f in memory):
        first = next(f for f in memory if f.kind == kind)
        message = first.message
        printed = first.numbers.get("mem_fraction_static")
        if kind == "not_enough_memory" and printed is not None and printed <= 0:
            # c064: 'mem_fraction_static=-0.107' with no --mem-fraction-static given. server_args.py's default is
            # round((gpu_mem - reserved_mem) / gpu_mem, 3) (0.5.3), the reserve growing with chunked prefill, the
            # CUDA-graph batch sizes and DP attention (cuda_graph_max_bs x dp_size x 4.5 MB): raising it cannot help
            message += (f"; a fraction of {printed:g} is SGLang's own default gone below zero (server_args.py: "
                        "(GPU capacity - reserved) / GPU capacity, the reserve growing with chunked prefill, "
                        "CUDA-graph batch sizes and DP attention), not one a user passes: set --mem-fraction-static "
                        "explicitly")
        out.append(F.not_enough_memory(message, first.line, first.numbers,
                                       shortfall if kind != "host_memory" else None))
    if not memory and shortfall and shortfall.get("profiled") is not None:
        out.append(F.not_enough_memory(f"profiled value {int(shortfall['profiled'])}",
                                       int(shortfall.get("line", 0)), {}, shortfall))
    if not memory:
        oom = oom_finding(ctx, formula)
        if oom is not None:
            out.append(oom)
    unbalanced = [f for f in failures if f.kind == "unbalanced"]
    if unbalanced:
        out.append(F.engine_unbalanced(unbalanced[0].line, unbalanced[0].numbers))
    fatal = [f for f in failures if f.kind in FATAL]
    if fatal:
        first = fatal[0]
        # the quote is the exception itself: the memory error's own line, else the last exception the traceback
        # ends with (the root cause, printed after the frames), else the first telling line
        memory_kinds = ("not_enough_memory", "no_kv_memory", "pool_too_small", "oom")
        raised = [f for f in fatal if f.kind in ("exception", "cuda_error")]
        # a hung scheduler or a port already taken starts a chain: the exceptions after it are its consequences
        # (c058: the watchdog at line 796, the warmup's 1,800-s read timeout and the shutdown's CancelledError
        # 25 minutes later); an exception raised before it is still the root cause
        precursor = next((f for f in fatal if f.kind in _PRECURSORS), None)
        if precursor is not None:
            raised = [f for f in raised if f.line < precursor.line] or [precursor]
        telling = (next((f for f in fatal if f.kind in memory_kinds), None) or (raised[-1] if raised else None)
                   or next((f for f in fatal if f.kind in _TELLING), first))
        # "Initialization failed. warmup error: Traceback ..." names the stage; the exception names the cause
        stage = next((f for f in fatal if f.kind in ("warmup", "exception") and "Traceback" in f.message
                      and f.line <= telling.line and f is not telling), None)
        detail = telling.message
        if stage is not None:
            detail = stage.message.split("Traceback", 1)[0].rstrip(" :") + ": " + telling.message
        after = ctx.summary.line if ctx.summary is not None and ctx.summary.line < first.line else None
        out.append(F.startup_failed(telling.line, detail + _unquantized_layer(ctx, telling.message)
                                    + _dsv4_store_dtype(ctx, telling),
                                    after_summary_line=after))
    return out


def _dsv4_store_dtype(ctx: Context, failure: Failure) -> str:
    """DeepSeek-V4's KV pool on ROCm with an fp8 KV cache: ``DeepSeekV4SingleKVPool.create_buffer``
    (mem_cache/deepseek_v4_memory_pool.py, 0.5.12 and the launch builds) asserts ``self.store_dtype == torch.uint8``,
    and ``KVCache.__init__`` (mem_cache/memory_pool.py) stores as uint8 only float8_e5m2 and float8_e4m3fn; ROCm's
    fp8 is float8_e4m3fnuz, which stays itself, so the pool's creation fails the assertion (sglang#25118). The
    pool line before it shows the sizing succeeded: a configuration or build failure, not memory."""
    if not failure.message.startswith("AssertionError"):
        return ""
    if "store_dtype" not in failure.message and failure.message.strip() != "AssertionError":
        return ""
    v4 = any(e.kind == "DeepSeekV4TokenToKVPool" for e in ctx.startup.of(OtherPool)) or any(
        (e.model_type or "").startswith("DeepseekV4") for e in ctx.startup.of(WeightEnd))
    fnuz = next((e.dtype for e in ctx.startup.of(KVDtype) if "fnuz" in e.dtype), None)
    if not v4 or fnuz is None:
        return ""
    return (f"; a configuration failure, not memory: this ROCm build's KV dtype {fnuz} fails DeepSeek-V4's "
            "assertion that its KV pool stores torch.uint8 (DeepSeekV4SingleKVPool.create_buffer; SGLang stores as "
            "uint8 only float8_e4m3fn/float8_e5m2), after the pool's sizing succeeded; no memory setting changes it")


# tensor names only a quantized checkpoint has (AWQ/GPTQ qweight/qzeros/scales/g_idx, FP8 weight_scale)
_QUANT_TENSOR = re.compile(r"KeyError: '([\w.]+(?:qweight|qzeros|g_idx|weight_scale(?:_inv)?|_scales?))'")


def _unquantized_layer(ctx: Context, message: str) -> str:
    """A KeyError on a quantized tensor's name while loading a quantized checkpoint: the model built no such
    parameter because the layer was created unquantized (models/*.py load_weights looks the checkpoint's name up
    in params_dict). The same build fault as an MoE created through quantization/unquant.py running out of memory
    (corpus sglang_c009); not a memory problem, and no fraction helps."""
    m = _QUANT_TENSOR.search(message)
    quant = ctx.args.get("quantization")
    if m is None or not isinstance(quant, str) or quant in ("", "None", "none"):
        return ""
    return (f"; the {quant} checkpoint has the quantized tensor '{m.group(1)}' but the model built no parameter for "
            "it: that layer was created without the checkpoint's quantization (this build does not apply it there), "
            "a build or model-support problem, not memory")


#: SGLang multiplies mem_fraction_static by this with the aiter backend and a context above 8,192 tokens
AITER_SCALE = 0.85


def _aiter_scaled_advice(ctx: Context, f: Finding) -> Finding:
    """UNUSED_MEMORY's advice names the effective fraction. With the aiter backend and a context above 8,192,
    SGLang multiplies *any* --mem-fraction-static by 0.85 (ModelRunner 0.4.9-0.5.4; ServerArgs post-processing
    0.5.5+, server_args.py ``_handle_attention_backend_compatibility``; attention_hook.py 0.5.19+ unless
    SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION, which logs that it kept the value): passing the effective target
    would land at 0.85 of it. The advice says what to pass, or that the backend's scaling caps the fraction."""
    advice = f.fields.get("advice")
    m = re.match(r"--mem-fraction-static (\d+\.\d+) would use it", advice or "")
    ctx_len = context_length_of(ctx)
    if (m is None or str(ctx.args.get("attention_backend")) != "aiter" or not ctx_len or ctx_len <= 8192
            or ctx.startup.of(AiterFractionKept) or not ctx.era.overlaps((0, 4, 9), None)):
        return f
    target = float(m.group(1))
    scaled = (f"SGLang multiplies --mem-fraction-static by {AITER_SCALE:g} with the aiter backend at a context of "
              f"{ctx_len:,} (> 8,192)")
    need = target / AITER_SCALE
    if need <= 0.99:
        advice = (f"--mem-fraction-static {need:.2f} would use it ({scaled}: {need:.2f} runs as {target:.2f}) and "
                  "keep ~2 GiB free")
    else:
        advice = (f"{scaled}, so no value reaches the {target:.2f} that would use it (1.0 runs as "
                  f"{AITER_SCALE:g}); a context of at most 8,192, another attention backend, or from SGLang 0.5.19 "
                  "SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION=1 lifts the scaling")
    return replace(f, fields={**f.fields, "advice": advice})
