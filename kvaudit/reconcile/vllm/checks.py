"""vLLM findings: whether each worker's budget adds up, what failed and what would have fit, graph estimates
that cost KV memory, imbalance between workers, headroom. Codes and severities are in ``findings.CODES``."""

from __future__ import annotations

import math
from dataclasses import replace

from kvaudit.parse.vllm import Blocks, Concurrency, Failure, KVTokens, Setting
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding, RankLedger, Severity, Thresholds
from kvaudit.reconcile.values import as_int
from kvaudit.reconcile.vllm.context import Context
from kvaudit.reconcile.vllm.facts import graph_estimate
from kvaudit.reconcile.vllm.formula import BUDGET_TOLERANCE_GIB, Budget
from kvaudit.units import GIB, LOG_HALF_ULP

#: failures that mean there was no room for the KV cache (each quoted once, in NOT_ENOUGH_MEMORY)
MEMORY_FAILURES = ("no_kv_memory", "kv_needed", "max_len", "free_memory", "mamba_blocks")
FATAL = MEMORY_FAILURES + ("engine_failed", "oom", "profiling")


def budget_findings(budgets: list[Budget]) -> list[Finding]:
    if not budgets:
        return []
    bad = [b for b in budgets if abs(b.residual) > BUDGET_TOLERANCE_GIB]
    ranks = [b.rank for b in budgets]
    if bad:
        worst = max(bad, key=lambda b: abs(b.residual))
        return [F.budget_mismatch(worst.rank, worst.residual, BUDGET_TOLERANCE_GIB, [b.rank for b in bad])]
    shown = budgets[0]
    return [F.budget_reconciles(shown.sentence(), ranks, shown.note)]


def graph_findings(ctx: Context, applied: bool, total: float | None, cell: int | None,
                   low_headroom_gib: float = 1.0, total_range: tuple[float, float] | None = None) -> list[Finding]:
    """The CUDA-graph estimate against what the capture took, both ways: reserved and never used
    (GRAPH_ESTIMATE_HIGH), or too little, so the rest of the capture comes out of the (1 - util) headroom after
    the KV pool is allocated (GRAPH_ESTIMATE_LOW: the estimate is measured with a minimal KV cache, vllm#57475)."""
    if not applied:
        return []
    peers = list(ctx.facts.values())
    for rr in peers:
        est, act = graph_estimate(rr, rr.r.get("total_gib") or total, peers), rr.r.get("graph_gib")
        if (est is not None and est.gib < 0) or (act is not None and act < 0):
            # capture_model / profile_cudagraph_memory measure free-before minus free-after
            # (v1/worker/gpu_model_runner.py, 0.18+): a negative reading is memory released during the capture
            # (common on unified memory, where the page cache moves), not a size: neither side is compared
            neg = ", ".join(f"{name} {v:.2f} GiB" for name, v in (("estimate", est.gib if est else None),
                                                                   ("capture", act)) if v is not None and v < 0)
            note = (f"{rr.rank.display}: the CUDA-graph {neg} is negative: memory was released while it was "
                    "measured (free before minus free after), not a size; the estimate is not compared")
            if note not in ctx.notes:
                ctx.notes.append(note)
            return []
        if est is not None and act is not None and est.gib > 1.5 * act + 0.25:
            return [F.graph_estimate_high(rr.rank.display, est.gib, act, cell, ctx.block_size, est.source)]
        if est is not None and act is not None and act > est.gib + 2 * LOG_HALF_ULP * 2:
            util = rr.r.get("util") or ctx.util
            if rr.r.get("total_gib"):
                return [F.graph_estimate_low(rr.rank.display, est.gib, act, (1 - util) * rr.r["total_gib"]
                                             if util else None, low_headroom_gib)]
            return [_graph_low_bounded(rr, ctx, est.gib, act, util, total_range, low_headroom_gib)]
    return []


def _graph_low_bounded(rr, ctx: Context, est: float, act: float, util: float | None,
                       total_range: tuple[float, float] | None, threshold: float) -> Finding:
    """GRAPH_ESTIMATE_LOW when no line states the card's total: the headroom is only bounded, from below, by
    the total the CUDA-graph note allows (its rounding interval), or by the budget the log's own lines fill
    (total x util >= weights + KV + estimate, so (1 - util) x total >= (1 - util) / util x that); it warns
    only when even that leaves too little, and says "at least"."""
    bounds: list[tuple[float, str]] = []
    if util and total_range is not None:
        bounds.append(((1 - util) * total_range[0],
                       f"the total the CUDA-graph note allows ({total_range[0]:.1f}+ GiB)"))
    w, kv = rr.r.get("weights_gib") or rr.r.get("consumed_gib"), rr.r.get("kv_gib")
    if util and 0 < util < 1 and w is not None and kv is not None:
        used = w + kv + max(0.0, est)
        bounds.append(((1 - util) / util * used, f"the budget's own weights + KV + estimate ({used:.2f} GiB = "
                                                  f"at most {util:g} x total)"))
    f = F.graph_estimate_low(rr.rank.display, est, act, None, threshold)
    if not bounds:
        return f
    head, why = max(bounds, key=lambda b: b[0])
    left = head - (act - est)
    if left < threshold:
        return replace(f, message=f.message.replace(
            "(1 - util) headroom", f"(1 - util) headroom, at least {head:.2f} GiB (from {why}; the log states no "
                                   f"total), leaving at least {left:.2f} GiB"))
    return replace(f, severity=Severity.INFO, message=(
        f"{rr.rank.display}: the CUDA graphs took {act:.2f} GiB, {act - est:.2f} GiB more than the {est:.2f} GiB "
        f"estimate taken out of the KV budget (it is measured with a minimal KV cache); that comes out of the "
        f"(1 - util) headroom, which is at least {head:.2f} GiB (from {why}; the log states no total), leaving at "
        f"least {left:.2f} GiB"), fields={**f.fields, "headroom_at_least_gib": round(head, 3),
                                          "headroom_left_at_least_gib": round(left, 3)})


SPARE_GIB = 150 / 1024  # gpu_worker.py redundancy_buffer_memory = 150 * (1 << 20), kept out of both suggestions


def suggestion_findings(ctx: Context, applied: bool, total: float | None,
                        budgets: list[Budget] | None = None) -> list[Finding]:
    """The suggestion line's two ``--kv-cache-memory`` values (0.10.2+), for the worker whose value is smallest,
    recomputed from that line's own parts (0.27+ "consumed", before it weights + non-torch)."""
    peers = list(ctx.facts.values())
    rows = [rr for rr in peers if "suggest_fit_bytes" in rr.r and "suggest_full_bytes" in rr.r
            and "requested_gib" in rr.r and ("activation_printed_gib" in rr.r or "activation_gib" in rr.r)
            and "graph_gib" in rr.r]
    if not rows:
        return []
    rr = min(rows, key=lambda f: f.r["suggest_fit_bytes"])
    r = rr.r
    if "consumed_gib" in r:
        terms = [("consumed", r["consumed_gib"])]
    elif "weights_gib" in r and "non_torch_gib" in r:
        terms = [("weights", r["weights_gib"]), ("non-torch", r["non_torch_gib"])]
    else:
        return []
    # vllm-ascend's "Actual usage: ... for peak activation" (its worker.py) is the plain peak: the same sum
    peak = ("peak activation as printed", r["activation_printed_gib"]) if "activation_printed_gib" in r else (
        "peak activation", r["activation_gib"])
    terms += [peak, ("graphs captured", r["graph_gib"])]
    recomputed = r["requested_gib"] - sum(v for _, v in terms) - SPARE_GIB
    fit = r["suggest_fit_bytes"] / GIB
    agrees = abs(recomputed - fit) <= LOG_HALF_ULP * (len(terms) + 2)
    est = graph_estimate(rr, r.get("total_gib") or total, peers) if applied else None
    if any(b.rank == rr.rank.display and "excludes the graph estimate" in b.note for b in budgets or []):
        est = None  # the budget adds up with the printed peak outside the estimate: no double count to report
    full = min(int(f.r["suggest_full_bytes"]) for f in rows)  # the card with the least free memory
    return [F.kv_memory_suggested(rr.rank.display, int(r["suggest_fit_bytes"]), full,
                                  r["requested_gib"], terms, recomputed, agrees, est.gib if est else None, len(rows))]


def failure_findings(ctx: Context, K: float | None, T: float | None, cell: int | None,
                     logged: int | None, fixed_kv: float | None = None) -> list[Finding]:
    """NOT_ENOUGH_MEMORY with what would have fit, and STARTUP_FAILED for any fatal line (before or after the
    pool was sized). An error quoted in NOT_ENOUGH_MEMORY is not quoted again in STARTUP_FAILED."""
    out: list[Finding] = []
    failures = ctx.startup.of(Failure)
    quoted: set[int] = set()
    negative_at = None
    mem = next((f for f in failures if f.kind in MEMORY_FAILURES), None)
    util = ctx.util
    if mem is not None:
        fit = _what_fits(mem.kind, mem.numbers, util, T, K, cell, _unified(ctx), _need(ctx, cell), ctx.cpu)
        cause, extra = _graph_estimate_cause(ctx, mem.kind, K)
        out.append(F.not_enough_memory(mem.message + fit[0] + cause, mem.line, {**mem.numbers, **fit[1], **extra}))
        quoted.add(mem.line)
    elif fixed_kv is not None and any(f.kind == "oom" for f in failures):
        oom = next(f for f in failures if f.kind == "oom")
        free = oom.numbers.get("free_gib")
        fits = (f" -> at most {free:.2f} GiB was free when it failed; --kv-cache-memory-bytes must leave room for "
                "activations and graphs below that") if free is not None else ""
        out.append(F.not_enough_memory(f"--kv-cache-memory-bytes asked for {fixed_kv} GiB of KV cache: "
                                       f"{oom.message}{fits}", oom.line, {"kv_cache_memory_gib": fixed_kv,
                                                                          **oom.numbers}))
        quoted.add(oom.line)
    elif K is not None and K <= 0:
        fit = _what_fits("no_kv_memory", {}, util, T, K, cell, _unified(ctx), _need(ctx, cell), ctx.cpu)
        # the line that printed the negative budget (the smallest worker's), not line 0
        at = min((rr.lines["kv_gib"] for rr in ctx.facts.values() if rr.r.get("kv_gib") == K
                  and "kv_gib" in rr.lines), default=0)
        out.append(F.not_enough_memory(
            f"available KV cache memory is {K} GiB: weights, activations and non-torch memory exceed total x "
            f"gpu_memory_utilization, so no block fits and the startup failed, whether or not the log shows the "
            f"error vLLM raises for it ({NO_MEMORY_WHERE}): ValueError: {NO_MEMORY_ERROR}{fit[0]}", at,
            {"kv_gib": K, **fit[1]}))
        negative_at = at
    elif (short := _v0_pool_below_max_len(ctx, K, T, cell)) is not None:
        out.append(F.not_enough_memory(*short))
    fatal = [f for f in failures if f.kind in FATAL]
    if logged is None:
        # before the pool was sized an exception ends the startup; after it, an exception is a request's, unless
        # one of the fatal lines above says the engine died
        raised = [f for f in failures if f.kind == "exception"]
        causes = [f for f in raised if not f.numbers.get("generic")] or raised
        if causes and not fatal:
            fatal = [causes[-1]]
        elif causes and fatal and fatal[-1].kind == "engine_failed":
            fatal = fatal[:-1] + [causes[-1]] if causes[-1].line < fatal[-1].line else fatal
    if fatal and fatal[-1].numbers.get("wrapper"):
        # a V0 worker's "Error executing method X" / "Exception in worker ... while processing method X" only
        # announces the traceback that follows it: its cause is that traceback's exception, or a fatal line
        # another worker printed before it
        causes = [f for f in failures if (f.kind in FATAL or f.kind == "exception") and not f.numbers.get("generic")]
        if causes:
            fatal = fatal[:-1] + [causes[-1]]
    if fatal:
        last = fatal[-1]
        if last.line in quoted:
            detail = "the error quoted in NOT_ENOUGH_MEMORY"
        elif negative_at is not None and last.kind == "engine_failed" and last.line > negative_at:
            # a budget <= 0 raises "No available memory for the cache blocks" (v1/core/kv_cache_utils.py
            # check_enough_kv_cache_memory): the generic engine-core line that follows is that error's, not another
            detail = (f"the error quoted in NOT_ENOUGH_MEMORY (a budget <= 0 stops the engine), then: "
                      f"{last.message}")
        else:
            detail = last.message
        after = None
        if logged is not None:
            detail += " (after the KV pool was sized)"
        out.append(F.startup_failed(last.line, detail, after))
    return out


#: the error every release raises for a pool of no block, before any max-seq-len check (quoted, not paraphrased)
NO_MEMORY_ERROR = ("'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                   "initializing the engine.'")
NO_MEMORY_WHERE = ("V0 engine/llm_engine.py _init_cache, worker/worker.py raise_if_cache_size_invalid; V1 "
                   "v1/core/kv_cache_utils.py check_enough_kv_cache_memory")
#: the CPU backend's own wording (worker/cpu_worker.py _validate_num_cpu_blocks, 0.8.4)
NO_MEMORY_ERROR_CPU = ("'No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE` when "
                       "initializing the engine.'")


def _v0_pool_below_max_len(ctx: Context, K: float | None = None, T: float | None = None,
                           cell: int | None = None) -> tuple[str, int, dict[str, float]] | None:
    """V0 stops when its pool cannot hold one request. A pool of no block first: ``if num_gpu_blocks <= 0: raise
    ValueError("No available memory for the cache blocks. ...")`` (engine/llm_engine.py _init_cache, read in the
    0.2.6, 0.2.7 and 0.3.0 wheels; worker/worker.py raise_if_cache_size_invalid 0.4-0.10, read in 0.6.3,
    0.6.4.post1 and 0.7.3; worker/cpu_worker.py _validate_num_cpu_blocks on the CPU backend, 0.8.4), where
    --max-model-len can fix nothing. Else ``max_seq_len = block_size * num_gpu_blocks`` then ``raise
    ValueError("The model's max seq len (M) is larger than the maximum number of tokens that can be stored in KV
    cache (N) ...")`` (llm_engine.py from 0.2.7, not in the 0.2.0-0.2.6 wheels; raise_if_cache_size_invalid
    0.4-0.10). A log cut before the error still shows a failed start; an era that may be before 0.2.7 raises
    nothing for a short pool. V0 is told by its block line's CPU blocks (V1 prints tokens, or GPU blocks alone);
    the model length by the banner's ``max_seq_len=`` or the args' ``max_model_len``."""
    if ctx.startup.of(KVTokens):
        return None
    blocks = [b for b in ctx.startup.of(Blocks) if b.cpu_blocks is not None]
    max_len = as_int(ctx.args.get("max_model_len")) or as_int(ctx.args.get("max_seq_len"))
    if not blocks:
        return None
    b = min(blocks, key=lambda e: e.gpu_blocks)
    cpu = ctx.cpu
    if b.gpu_blocks <= 0 and (ctx.era.hi is None or ctx.era.hi >= (0, 2, 6)):
        fit = _what_fits("no_kv_memory", {}, ctx.util, T, K, cell, _unified(ctx), _need(ctx, cell), cpu)
        return (f"No available memory for the cache blocks: the pool has {b.gpu_blocks:,} "
                f"{'CPU-backend' if cpu else 'GPU'} blocks, so the startup failed, whether or not the log shows the "
                "error vLLM raises for it before any max-seq-len check "
                f"({'worker/cpu_worker.py _validate_num_cpu_blocks' if cpu else NO_MEMORY_WHERE}): ValueError: "
                f"{NO_MEMORY_ERROR_CPU if cpu else NO_MEMORY_ERROR}{fit[0]}", b.line,
                {"gpu_blocks": float(b.gpu_blocks), **({"max_model_len": float(max_len)} if max_len else {}),
                 **fit[1]})
    if not max_len or ctx.era.lo < (0, 2, 7):  # 0.2.0-0.2.6 start and leave long prompts waiting
        return None
    pool = b.gpu_blocks * ctx.block_size
    if pool >= max_len:
        return None
    block = (f"{ctx.block_size}, the default block size (the log does not state it)"
             if ctx.block_source.startswith("default") else str(ctx.block_size))
    fit = _what_fits("max_len", {"max_model_len": float(max_len), "max_tokens": float(pool)}, ctx.util, T, K, cell,
                     _unified(ctx), None, cpu)
    return (f"the pool holds {pool:,} tokens ({b.gpu_blocks:,} {'CPU-backend' if cpu else 'GPU'} blocks x {block}), "
            f"fewer than the model's max seq len {max_len:,}: this release raises ValueError here (the max seq len is "
            "larger than the maximum number of tokens that can be stored in KV cache), so the startup failed, "
            f"whether or not the log shows the error{fit[0]}", b.line,
            {"max_model_len": float(max_len), "max_tokens": float(pool), **fit[1]})


def _need(ctx: Context, cell: int | None) -> float | None:
    """The KV budget (GiB) one request of max_model_len needs: whole blocks of it (V0 raise_if_cache_size_invalid:
    max_model_len <= block_size x num_gpu_blocks; V1 check_enough_kv_cache_memory: the spec's
    max_memory_usage_bytes, cdiv(max_model_len, block) pages). None when the log lacks the length or the cell."""
    mml = next((c.max_model_len for c in reversed(ctx.startup.of(Concurrency))), None) or as_int(
        ctx.args.get("max_model_len")) or as_int(ctx.args.get("max_seq_len"))
    if not mml or not cell or ctx.hybrid is not None or grouped_line(ctx) is not None:
        return None
    return math.ceil(mml / ctx.block_size) * ctx.block_size * cell / GIB


def _graph_estimate_cause(ctx: Context, kind: str, K: float | None) -> tuple[str, dict[str, float]]:
    """0.18+ takes its CUDA-graph memory estimate out of the KV budget before sizing the cache
    (v1/worker/gpu_worker.py determine_available_memory): an estimate as large as what was left is the cause of
    "No available memory for the cache blocks", and raising the utilisation is not the only fix."""
    if kind != "no_kv_memory":
        return "", {}
    est = max((rr.r["graph_estimate_gib"] for rr in ctx.facts.values() if "graph_estimate_gib" in rr.r), default=None)
    if est is None:
        return "", {}
    return (f"; the CUDA-graph memory estimate of {est:.2f} GiB is taken out of the budget before the cache (0.18+): "
            "the likely reason none was left (the log does not give the budget to confirm it). "
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (the estimate off; graphs are then paid "
            "from the headroom), fewer capture sizes (--max-cudagraph-capture-size / -cc.cudagraph_capture_sizes) "
            "or --enforce-eager give it back", {"graph_estimate_gib": est})


def _unified(ctx: Context) -> bool:
    return ctx.opts.platform is not None and bool(getattr(ctx.opts.platform, "unified_memory", False))


#: what replaces "a higher gpu_memory_utilization" on unified memory (GB10, Jetson): the fraction there applies to
#: the system memory the OS and every other program share, so raising it takes memory from the host itself
UNIFIED_NO_RAISE = ("; not a higher gpu_memory_utilization: on unified memory that memory is the host's (drop the "
                    "page cache before the start, or stop other programs, to raise what is free)")


#: a settings fraction as advice: four decimals, rounded the safe way (vLLM compares the fraction itself, so a
#: value rounded to the nearest can land on the wrong side of the bound it names)
def _at_least(u: float) -> float:
    return math.ceil(round(u * 1e4, 6)) / 1e4


def _at_most(u: float) -> float:
    return math.floor(round(u * 1e4, 6)) / 1e4


#: the CPU backend's budget (platforms/cpu.py: VLLM_CPU_KVCACHE_SPACE GiB, 4 by default in 0.4-0.11; 0.14 a share of
#: free memory): gpu_memory_utilization, which the engine's own message names, does not size it
CPU_NO_RAISE = ("; not gpu_memory_utilization, which does not size the CPU backend's pool: a larger "
                "VLLM_CPU_KVCACHE_SPACE (GiB, a whole number) is its KV budget")


def _cpu_space(need: float | None, K: float | None) -> tuple[str, dict[str, float]]:
    """The VLLM_CPU_KVCACHE_SPACE that holds one max_model_len request (the env var is read with int(): whole GiB)."""
    if need is None:
        return "", {}
    gib = max(1, math.ceil(need - 1e-9))
    if K is not None and gib <= K:
        return "", {}
    return f" -> VLLM_CPU_KVCACHE_SPACE={gib} holds one max_model_len request ({need:.2f} GiB)", {
        "cpu_kvcache_space_gib_that_fits": float(gib)}


def _what_fits(kind: str, nums: dict[str, float], util: float | None, T: float | None, K: float | None,
               cell: int | None, unified: bool = False, need: float | None = None,
               cpu: bool = False) -> tuple[str, dict[str, float]]:
    """The setting that would have fit, as a clause for the message and as fields. On unified memory a larger
    fraction is never the advice (it would take the host's memory): the clause says so instead; on the CPU backend
    the budget is VLLM_CPU_KVCACHE_SPACE, never a fraction. ``need``: the budget (GiB) one max_model_len request
    takes, when the log gives the length and the config the cell."""
    # on these platforms a fraction is never the advice: only the length advice (kv_needed, max_len) is kept from
    # the device rule, and a pool of no block gets the platform's own clause alone
    if cpu and kind in ("kv_needed", "max_len", "no_kv_memory"):
        text, fields = _what_fits(kind, nums, None, None, K, cell) if kind != "no_kv_memory" else ("", {})
        if kind == "kv_needed" and need is None and nums.get("needed_gib"):
            need = nums["needed_gib"] + LOG_HALF_ULP
        elif kind == "max_len" and need is None and cell and nums.get("max_model_len"):
            need = nums["max_model_len"] * cell / GIB
        space, more = _cpu_space(need, K)
        if space:
            text = (text + " or" + space[3:]) if text else space
        return (text or " ->") + CPU_NO_RAISE.lstrip(";" if not text else ""), {**fields, **more}
    if unified and kind in ("kv_needed", "max_len", "no_kv_memory"):
        text, fields = _what_fits(kind, nums, None, None, K, cell) if kind != "no_kv_memory" else ("", {})
        return (text or " ->") + UNIFIED_NO_RAISE.lstrip(";" if not text else ""), fields
    if kind == "kv_needed":
        clauses, fields = [], {}
        est = nums.get("estimated_max_model_len")
        if est:
            clauses.append(f"--max-model-len {int(est):,} fits (the engine's own estimate)")
            fields["max_model_len_that_fits"] = est
        short = nums.get("needed_gib", 0) - nums.get("available_gib", 0)
        if util is not None and T and short > 0:
            # both figures are printed to 0.01 GiB (format_gib): the shortfall may be up to 0.01 GiB more
            u = _at_least(util + (short + 2 * LOG_HALF_ULP) / T)
            clauses.append(f"or gpu_memory_utilization {u:.4f} (+{short:.2f} GiB)")
            fields["utilization_that_fits"] = u
        return (" -> " + " ".join(clauses) if clauses else "", fields)
    if kind == "max_len":
        m, have = nums.get("max_model_len"), nums.get("max_tokens")
        clauses, fields = [], {}
        if have:
            clauses.append(f"--max-model-len {int(have):,} fits")
            # worker.py initialize_cache -> raise_if_cache_size_invalid (V0, 0.7.3 read): raised once the block
            # count is known (the count is the message's number), so the report must not say the formula was
            # never reached
            fields.update(max_model_len_that_fits=have, pool_sized=1.0)
        if m and have and cell and util is not None and T:
            extra = (m - have) * cell / GIB
            u = _at_least(util + extra / T)
            clauses.append(f"or gpu_memory_utilization {u:.4f} (+{extra:.2f} GiB)")
            fields["utilization_that_fits"] = u
        return (" -> " + " ".join(clauses) if clauses else "", fields)
    if kind == "mamba_blocks":
        # the engine's own bound: one Mamba block per decode sequence. A larger fraction is the other way out, but
        # how many blocks it buys depends on the page layout, which this message does not give
        have = nums.get("mamba_blocks")
        if have:
            # raised after the pool was sized: the report must not say the formula was never reached
            return (f" -> --max-num-seqs {int(have):,} fits (the pool's {int(have):,} blocks, the engine's own bound)",
                    {"max_num_seqs_that_fits": have, "pool_sized": 1.0})
        return "", {}
    if kind == "free_memory":
        free, total = nums.get("free_gib"), nums.get("total_gib")
        if free is not None and total:
            # gpu_worker.py init_device (0.9-0.10) / v1/worker/utils.py request_memory (0.11+): the start fails
            # when free < total x util; both are printed to 0.01 GiB, so the fraction that surely fits is the
            # smallest free over the largest total, rounded down (67.24/79.25 is 0.84845: 0.8485 may not fit)
            u = _at_most((free - LOG_HALF_ULP) / (total + LOG_HALF_ULP))
            return (f" -> at most gpu_memory_utilization {u:.4f} fits what was free ({free:.2f} of {total:.2f} GiB; "
                    "another process holds the rest)", {"utilization_that_fits": u})
        return "", {}
    if kind == "no_kv_memory" and K is not None and util is not None and T:
        if need is not None:
            # a positive budget is not enough: the pool must then hold one max_model_len request, or the next check
            # stops the start (V0 raise_if_cache_size_invalid's max seq len, V1 check_enough_kv_cache_memory).
            # The budget is printed to 0.01 GiB: up to 0.005 more short
            u = _at_least(util + (need - K + LOG_HALF_ULP) / T)
            if u <= 1.0:
                return (f" -> gpu_memory_utilization {u:.4f} (+{need - K:.2f} GiB: a budget of {need:.2f} GiB holds "
                        "one max_model_len request)", {"minimum_utilization": u, "utilization_that_fits": u})
            return (f" -> even gpu_memory_utilization 1.0 leaves {K + (1 - util) * T:.2f} GiB, short of the "
                    f"{need:.2f} GiB one max_model_len request needs: a smaller --max-model-len, fewer weights per GPU "
                    "(--tensor-parallel-size) or a larger card", {})
        if K <= 0:
            u = _at_least(util + (LOG_HALF_ULP - K) / T)
            return (f" -> gpu_memory_utilization above {u:.4f} (+{-K:.2f} GiB) leaves a positive budget, and the pool "
                    "must then hold one max_model_len request (more than that; the log lacks the length or the model "
                    "config to say how much)", {"minimum_utilization": u})
    if kind == "no_kv_memory" or (K is not None and K <= 0):
        # the log lacks the total, the fraction or the budget, so by how much is unknown; the direction is the
        # engine's own ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`") or
        # fewer weights per GPU. Never a --max-model-len: no length fits a pool of no block
        gap = (f"the budget is {-K:.2f} GiB short of zero" if K is not None and K <= 0 else
               "more memory for the KV cache")
        lacks = "the total" if K is not None else "the total and the KV budget"
        return (f" -> {gap}: raise gpu_memory_utilization (the engine's own advice; the log lacks {lacks} to say by "
                "how much) or spread the weights over more GPUs (--tensor-parallel-size)", {})
    return "", {}


def rank_findings(ctx: Context, ledgers: tuple[RankLedger, ...], T: float | None, cell: int | None,
                  th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    unified = ctx.opts.platform is not None and getattr(ctx.opts.platform, "unified_memory", False)
    for rr in ctx.facts.values():
        nt, tot = rr.r.get("non_torch_gib"), rr.r.get("total_gib") or T
        if nt is not None and tot and nt > max(2.0, 0.05 * tot):
            f = F.non_torch_high(rr.rank.display, nt, tot)
            out.append(_unified_non_torch(f, rr, nt) if unified else f)
            break
    kv_by_rank = {rr.rank.display: rr.r["kv_gib"] for rr in ctx.facts.values() if "kv_gib" in rr.r}
    if len(kv_by_rank) >= 2:
        lo = min(kv_by_rank.items(), key=lambda x: x[1])
        hi = max(kv_by_rank.items(), key=lambda x: x[1])
        if hi[1] - lo[1] > max(th.rank_imbalance_gib, th.rank_imbalance_fraction * (T or hi[1])):
            out.append(F.rank_imbalance("available KV cache memory", lo, hi, hi[1] - lo[1], cell))
    return out


#: what non-torch memory holds on a discrete card (CUDA context, NCCL, cuBLAS workspaces): the cap the DGX Spark
#: community applies to non_torch_increase (eugr/spark-vllm-docker#286), and kvaudit's line between the two
UNIFIED_NON_TORCH_GIB = 2.0


def _unified_non_torch(f: Finding, rr, nt: float) -> Finding:
    """On unified memory (GB10, Jetson) vLLM's profiler reads the system's available memory
    (``utils/mem_utils.py`` MemorySnapshot: ``psutil.virtual_memory().available`` when ``is_integrated_gpu``, read in
    the 0.22.0 wheel), so the page cache of the checkpoint just read
    and the compiler's transient heap during ``profile_run`` are charged as non-torch memory and taken from the KV
    budget; they are gone once the server runs. Say so, and give the ``--kv-cache-memory-bytes`` (0.10.2+) that
    sizes the pool without that charge."""
    kv = rr.r.get("kv_gib")
    extra = nt - UNIFIED_NON_TORCH_GIB
    pin = ""
    fields = dict(f.fields)
    if kv is not None and extra > 0:
        want = int((kv + extra) * 2**30)
        pin = (f"; --kv-cache-memory-bytes {want} ({kv:.2f} + {extra:.2f} GiB: the pool without the charge beyond "
               f"{UNIFIED_NON_TORCH_GIB:g} GiB) sizes it from the profile's other terms, or drop the page cache "
               "(sync; echo 3 > /proc/sys/vm/drop_caches) before the start")
        fields["kv_cache_memory_bytes"] = want
    return replace(f, message=(
        f"{rr.rank.display}: non-torch memory {nt:.2f} GiB was counted against the KV budget on unified memory, "
        "where the profiler reads the system's available memory: the page cache (the checkpoint just read) and the "
        f"compiler's heap during profiling count as non-torch and leave the KV cache smaller{pin}"), fields=fields)


def headroom_findings(ctx: Context, ledgers: tuple[RankLedger, ...], T: float | None, th: Thresholds) -> list[Finding]:
    if T is None or ctx.util is None:
        return []
    graphs = [it.gib for l in ledgers for it in l.items if it.key == "graphs_target_decode" and it.gib is not None]
    beyond = max(graphs) if graphs else None  # None: the log gives no capture size (not "0 GiB of graphs")
    head = T * (1 - ctx.util) - (beyond or 0.0)
    if head < th.low_headroom_gib:
        return [F.vllm_low_headroom(head, ctx.util, T, beyond, th.low_headroom_gib)]
    return []


def grouped_line(ctx: Context) -> int | None:
    """The line of the first "Add N padding layers, may waste at most X% KV cache memory" warning, None when the log
    has none. ``v1/core/kv_cache_utils.py::_get_kv_cache_groups_uniform_page_size`` (V1 0.10+, read in the 0.11.0
    wheel) pads only when the model has two or more layer types (its group size is the smallest type's layer count,
    so a single type never pads): the warning proves a grouped pool (Mamba/linear-attention or sliding-window
    hybrid), whose per-request blocks and one-request need are not a uniform pool's, whatever the config says."""
    return next((e.line for e in ctx.startup.of(Setting) if e.key == "padding_layers"), None)


def concurrency_findings(ctx: Context, logged: int | None, hybrid: bool) -> list[Finding]:
    conc = ctx.startup.of(Concurrency)
    if not conc or not logged or hybrid:  # hybrid pools count Mamba pages per request: the ratio differs
        return []
    c = conc[-1]
    implied = logged / c.max_model_len if c.max_model_len else None
    if implied is not None and abs(implied - c.factor) > 0.006 + implied * 0.001:
        return [F.concurrency_mismatch(logged, c.max_model_len, c.factor, implied)]
    return []
