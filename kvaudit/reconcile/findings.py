"""Finding constructors: one stable code each, a severity, a message that carries the numbers, and the
numbers again as fields. The list of codes is documented in docs/findings.md (a test keeps the two in step).
"""

from __future__ import annotations

import math

from typing import Any

from kvaudit.reconcile.interface import Finding, Formula, RankLedger, Severity, TokenInterval, Verdict
from kvaudit.units import GB_DECIMAL, GIB

INFO, WARNING, ERROR = Severity.INFO, Severity.WARNING, Severity.ERROR

#: every code this module can emit, with its severity (the docs table is checked against this)
CODES: dict[str, Severity] = {
    "TOKENS_MATCH": INFO,
    "TOKENS_MISMATCH": WARNING,
    "TOKENS_EXPLAINED": INFO,
    "TOKENS_CAPPED": INFO,
    "CONCURRENCY_LOWERED": WARNING,
    "ASSUMPTION_CONTRADICTED": INFO,  # raised by kvaudit.verdict (rule 3) in place of a TOKENS_MISMATCH
    "RESERVE_EXPLAINS_FREE": INFO,
    "UNUSED_MEMORY": WARNING,
    "LOW_HEADROOM": WARNING,
    "RANK_IMBALANCE": WARNING,
    "UNEXPLAINED_MEMORY": WARNING,
    "GEOMETRY_MISMATCH": WARNING,
    "MFS_INFERRED": INFO,
    "HICACHE_HOST_MEMORY": INFO,
    "INCOMPLETE_LOG": INFO,
    "NOT_ENOUGH_MEMORY": ERROR,
    "STARTUP_FAILED": ERROR,
    # vLLM's budget (reconcile/vllm/)
    "BUDGET_RECONCILES": INFO,
    "BUDGET_MISMATCH": WARNING,
    "NON_TORCH_HIGH": WARNING,
    "GRAPH_ESTIMATE_HIGH": WARNING,
    "CONCURRENCY_MISMATCH": INFO,
    "KV_MEMORY_SUGGESTED": INFO,
    "GRAPH_ESTIMATE_LOW": WARNING,
    "SMALL_KV_BUDGET": WARNING,
    # LMDeploy (reconcile/lmdeploy/)
    "SESSION_EXCEEDS_POOL": WARNING,
    # SGLang: a sliding-window hybrid sized as one full-length pool (reconcile/sglang/cell.py)
    "SWA_POOL_UNUSED": WARNING,
    # TensorRT-LLM (reconcile/trtllm.py) uses the shared codes above
    # live readings (kvaudit check; raised in reconcile/live.py)
    "FOREIGN_PROCESS": WARNING,
    "OCCUPIED_AT_STARTUP": WARNING,
    "GPU_COUNT_MISMATCH": WARNING,
    "IDLE_GPUS": INFO,
    "MEMORY_DRIFT": INFO,
    "UNATTRIBUTED_GPU_MEMORY": INFO,
    "ORPHANED_ENGINE_PROCESS": WARNING,  # INFO when the orphans hold no GPU memory
    "IDLE_TENANT_MEMORY": WARNING,
    "UNIFIED_PAGE_CACHE": WARNING,  # INFO under a tenth of the host's memory
    "READINGS_OF_ANOTHER_START": INFO,
    # live endpoints (kvaudit check http://...)
    "LIVE_POOL_MISMATCH": WARNING,
    "LIVE_POOL_CHANGED": WARNING,
}


def about(n: int) -> str:
    """An estimate to 3 significant figures (ux audit item 20: the inputs are printed to 0.01 GiB, so the last
    digits of a token estimate are noise)."""
    digits = max(0, len(str(abs(n))) - 3)
    return f"{round(n, -digits):,}"


def fraction_up(m: float) -> str:
    """A fraction someone must exceed, to 3 decimals, rounded up so the advice still holds (T and post are printed
    to 0.01 GiB: a 4th decimal is noise)."""
    return f"{math.ceil(round(m, 6) * 1000) / 1000:.3f}"


def _f(code: str, message: str, fields: dict[str, Any], ranks: tuple[str, ...] = (),
       severity: Severity | None = None) -> Finding:
    return Finding(code, severity or CODES[code], message, fields, ranks)


def tokens_match(f: Formula, formula_text: str | None = None) -> Finding:
    assert f.predicted_tokens is not None and f.logged_tokens is not None
    p = f.predicted_tokens
    if formula_text is None:
        # every step the prediction took is printed, so the equation redone by hand lands in the interval (ux audit
        # item 8): the speculative headroom and the page rounding come after the division
        formula_text = (
            f"({f.post_load_free_gib:.2f} - (1 - {f.mem_fraction_static:g}) x {f.pre_load_free_gib:.2f}"
            + (f" - state pool {f.state_pool_gib:.2f}" if f.state_pool_gib else "") + ") GiB / "
            f"{f.bytes_per_token:,} B per token"
            + (f" + {f.speculative_headroom_tokens:,} speculative headroom" if f.speculative_headroom_tokens else "")
            + (f", rounded down to pages of {f.page_size}" if f.page_size and f.page_size > 1 else ""))
    return _f(
        "TOKENS_MATCH",
        f"KV pool of {f.logged_tokens:,} tokens is what the engine's formula gives: {formula_text} -> "
        f"{p.low:,}..{p.high:,}",
        {"logged_tokens": f.logged_tokens, "predicted_low": p.low, "predicted_high": p.high, "rule": f.rule},
    )


def tokens_mismatch(f: Formula, verdict: Verdict) -> Finding:
    code = "TOKENS_EXPLAINED" if verdict == Verdict.EXPLAINED else "TOKENS_MISMATCH"
    p = f.predicted_tokens
    return _f(code, f.verdict_reason, {
        "logged_tokens": f.logged_tokens,
        "predicted_low": p.low if p else None,
        "predicted_high": p.high if p else None,
        "effective_mem_fraction_static": f.effective_mem_fraction_static,
        "mem_fraction_static": f.mem_fraction_static,
    })


def tokens_capped(cap: int, predicted: TokenInterval | None) -> Finding:
    extra = ""
    if predicted is not None and predicted.high > cap:
        extra = f"; the fraction's budget alone would allow a pool of up to {predicted.high:,} tokens in all"
    return _f("TOKENS_CAPPED", f"KV pool capped at {cap:,} tokens by --max-total-tokens{extra}",
              {"max_total_tokens": cap, "predicted_high": predicted.high if predicted else None})


def concurrency_lowered(requested: int, applied: int, why: str, line: int | None) -> Finding:
    """The engine serves fewer requests at once than --max-running-requests asked for (SGLang
    ``resolve_max_num_reqs``: capped at tokens // 2 and, for state-pool hybrids, at the state slots // ratio)."""
    where = f" (line {line})" if line else ""
    return _f("CONCURRENCY_LOWERED",
              f"--max-running-requests {requested:,} was lowered to {applied:,} by the engine{where}: {why}; requests "
              f"beyond {applied:,} wait in the queue. Give the state pool more slots (--max-mamba-cache-size, or a "
              "larger fraction) or ask for fewer",
              {"requested": requested, "applied": applied, "why": why, "line": line})


def tokens_capped_probably(tokens: int, why: str) -> Finding:
    return _f("TOKENS_CAPPED",
              f"the KV pool of {tokens:,} tokens is probably capped (--max-total-tokens, or a PD/CI override): "
              f"{why}. The log has no server_args to confirm it; the fraction is not inferred from a capped pool",
              {"max_total_tokens": None, "logged_tokens": tokens, "probable": True, "why": why})


def reserve_explains_free(l: RankLedger, reserve: float, f: Formula, req: float, rnd: float | None,
                          ranks: list[str], total_ranks: int, most: float | None = None) -> Finding:
    """``rnd``: the allocator rounding, None when it could not be sized (no config): then it is not printed as 0.
    ``l`` is the rank with the least free; ``most`` the most any of ``ranks`` had: a figure from one rank is not
    quoted for every GPU, their range is."""
    after = [it for it in l.items if it.in_reserve and it.key not in ("request_table", "allocator_rounding")
             and it.gib is not None]
    spent = ", ".join(f"{it.label} {it.gib:.2f}" for it in after)
    where = "every GPU" if len(ranks) == total_ranks and total_ranks > 1 else (
        "the GPU" if total_ranks == 1 else f"{len(ranks)} of {total_ranks} GPUs")
    low = l.free_after_pool_gib or 0.0
    amount = f"{low:.2f}-{most:.2f}" if most is not None and f"{most:.2f}" != f"{low:.2f}" else f"{low:.2f}"
    msg = (
        f"The {amount} GiB free after the KV pool on {where} is the static reserve "
        f"(1 - {f.mem_fraction_static:g}) x T {f.pre_load_free_gib:.2f} = {reserve:.2f} GiB, less the request "
        f"table ({req:.2f})" + (f" and allocator rounding ({rnd:.2f})" if rnd is not None else "")
        + ". SGLang holds it back by design"
        + (f" for: {spent}" if spent else " for CUDA graphs and activations")
    )  # the verdict layer closes it with the end of startup: "not wasted" only when no UNUSED_MEMORY speaks of
    # the idle part (kvaudit.verdict, rule 1)
    return _f("RESERVE_EXPLAINS_FREE", msg, {
        "free_after_pool_gib": l.free_after_pool_gib, "reserve_gib": round(reserve, 4),
        "request_table_gib": req, "allocator_rounding_gib": rnd,
        "free_at_end_gib": l.free_at_end_gib, "free_at_end_is_final": l.end_is_final, "rank": l.label,
    }, tuple(ranks))


def unused_memory(l: RankLedger, idle: float, t: float, f: Formula, extra_tokens: int | None,
                  final: bool, hicache_ratio: float | None = None, freed_late: float = 0.0) -> Finding:
    """``hicache_ratio``: the hierarchical cache's host pool is that many times the device pool, so raising the
    fraction grows host RAM too: said with the advice. ``freed_late``: the part of ``idle`` that was given back
    only after the pool was sized (loader buffers collected during CUDA-graph capture); a larger fraction cannot
    reach it, so the advice and ``extra_tokens`` count only the rest."""
    reachable = max(0.0, idle - max(0.0, freed_late))
    more = (f" (room for about {about(extra_tokens)} more tokens beyond the pool's, were all of it given to the KV "
            "cache)" if extra_tokens else "")
    pool = f"a pool of {f.logged_tokens:,} tokens" if f.logged_tokens else "the KV pool"
    when = "at the end of startup" if final else "after the KV pool was allocated"
    late = ""
    if freed_late > 0.005:
        # said first: it is what decides the remedy, and the headline keeps only the start of the message
        more = (f", {min(freed_late, idle):.2f} GiB of it given back only during CUDA-graph capture (the "
                "weight loader's buffers, still referenced when the pool was sized, collected later): no fraction "
                "reaches that part, freeing it before the KV budget is measured does (gc before sizing, "
                "sgl-project/sglang#36583)")
        late = (f"; a larger fraction can reach the other {reachable:.2f} GiB (about {about(extra_tokens)} more tokens)"
                if extra_tokens else "")
    suggest = ""
    keep = 2.0  # GiB left for activation peaks after raising the fraction
    if f.max_total_tokens_cap and f.logged_tokens == f.max_total_tokens_cap:
        # the cap sized the pool (min(profiled, max_total_tokens)): a larger fraction would not grow it
        suggest = (f"; --max-total-tokens {f.max_total_tokens_cap:,} caps the pool: a larger fraction would not grow "
                   "it, raising or dropping the cap would")
    elif (f.mem_fraction_static is not None and f.mem_fraction_static_source != "inferred" and t
            and reachable > keep):
        target = min(0.98, f.mem_fraction_static + max(0.0, reachable - keep) / t)
        suggest = f"; --mem-fraction-static {target:.2f} would use it and keep ~{keep:.0f} GiB free"
        if hicache_ratio and l.kv_gib:
            grown = l.kv_gib + (target - f.mem_fraction_static) * t
            suggest += (f". With the hierarchical cache (hicache_ratio {hicache_ratio:g}) the host pool grows with "
                        f"the device pool: about {hicache_ratio * grown * GIB / GB_DECIMAL:.0f} GB of host RAM per "
                        f"rank instead of {hicache_ratio * l.kv_gib * GIB / GB_DECIMAL:.0f} GB; check the host has it")
    elif f.max_total_tokens_cap:
        suggest = f"; --max-total-tokens {f.max_total_tokens_cap:,} caps the pool"
    # the advice is the verdict layer's to give or withhold (kvaudit.verdict: not on unified memory)
    return _f("UNUSED_MEMORY",
              f"{idle:.2f} GiB of {l.label}'s {t:.2f} GiB sat idle {when} beside {pool}{more}{late}",
              {"idle_gib": idle, "pre_load_free_gib": t, "extra_tokens": extra_tokens, "at_end": final,
               "freed_after_sizing_gib": round(freed_late, 3) if freed_late > 0.005 else None,
               "advice": suggest[2:] if suggest else None}, (l.label,))


def low_headroom(l: RankLedger, threshold: float) -> Finding:
    return _f("LOW_HEADROOM",
              f"only {l.free_at_end_gib:.2f} GiB was free on {l.label} at the end of startup (below {threshold:g} GiB):"
              " activation peaks (long prefills) may run out of memory; lower --mem-fraction-static",
              {"free_at_end_gib": l.free_at_end_gib, "threshold_gib": threshold}, (l.label,))


def rank_imbalance(what: str, lo: tuple[str, float], hi: tuple[str, float], spread: float,
                   bytes_per_token: int | None, equal_before: float | None = None) -> Finding:
    """``equal_before``: the (small) spread of T when the ranks were equal before loading: the difference then
    arose while the weights loaded, not from another process."""
    cost = ""
    if bytes_per_token:
        tokens = int(spread * GIB / bytes_per_token)
        cost = f"; every rank is sized by the smallest, which costs about {tokens:,} tokens"
    if equal_before is not None:
        why = (f"the ranks were equal before loading (T within {equal_before:.2f} GiB), so the difference arose "
               "while the weights loaded (uneven shards, or extra buffers on one rank)")
    else:
        why = f"another process on {lo[0]}'s GPU?"
    return _f("RANK_IMBALANCE",
              f"{what} differs across ranks by {spread:.2f} GiB ({lo[0]} {lo[1]:.2f} vs {hi[0]} {hi[1]:.2f}): "
              f"{why}{cost}",
              {"min_rank": lo[0], "min_gib": lo[1], "max_rank": hi[0], "max_gib": hi[1],
               "spread_gib": round(spread, 3)},
              (lo[0], hi[0]))


def engine_unbalanced(line: int, numbers: dict[str, float]) -> Finding:
    detail = ""
    if numbers:
        detail = f" (min {numbers.get('min_gib')} GiB vs this rank {numbers.get('local_gib')} GiB)"
    return _f("RANK_IMBALANCE",
              f"SGLang refused to start: memory capacity is unbalanced across GPUs{detail}, line {line}; "
              "another process holds memory on some GPU",
              {"line": line, **numbers}, severity=ERROR)


def unexplained(ledgers: list[RankLedger], covered: bool = False) -> Finding:
    """``covered``: an item the ledger could not size (listed) may account for it: info, naming the candidate;
    a warning only when nothing unmodelled could."""
    worst = max(ledgers, key=lambda l: abs(l.unexplained_gib or 0))
    rest = [l.unexplained_gib or 0 for l in ledgers if l is not worst]
    # the others' own range: "(and 7 more)" beside +8.57 GiB read as 8 x 8.57 where the seven held +0.31-0.32
    where = worst.label
    if rest:
        span = f"{min(rest):+.2f}" if min(rest) == max(rest) else f"{min(rest):+.2f} to {max(rest):+.2f}"
        where += f" (and {len(rest)} more GPU{'s' if len(rest) != 1 else ''}: {span} GiB)"
    missing = f"; not modelled: {', '.join(worst.unmodelled)}" if worst.unmodelled else ""
    if covered:
        missing = f"; probably {' or '.join(worst.unmodelled)}, which the log does not let kvaudit size"
    return _f("UNEXPLAINED_MEMORY",
              f"{worst.unexplained_gib:+.2f} GiB on {where} is not accounted for by any logged or modelled item "
              f"(rounding allows +-{worst.unexplained_tolerance_gib:.2f}){missing}",
              {"unexplained_gib": worst.unexplained_gib, "tolerance_gib": worst.unexplained_tolerance_gib,
               "per_rank": {l.label: l.unexplained_gib for l in ledgers}, "unmodelled": list(worst.unmodelled),
               "covered_by_unmodelled": covered},
              tuple(l.label for l in ledgers), severity=INFO if covered else None)


def geometry_mismatch(config_cell: int, implied: float, source: str) -> Finding:
    ratio = implied / config_cell if config_cell else 0
    hint = ""
    if 0.45 < ratio < 0.55:
        hint = " (half: an fp8 KV cache, or twice the TP split?)"
    elif 1.9 < ratio < 2.1:
        hint = " (double: a 16-bit cache where fp8 was expected, or fewer TP ranks?)"
    return _f("GEOMETRY_MISMATCH",
              f"the model config ({source}) gives {config_cell:,} B/token but the KV line implies "
              f"{implied:,.0f}{hint}; using the KV line's figure",
              {"config_bytes_per_token": config_cell, "kv_line_bytes_per_token": round(implied, 1)})


def mfs_inferred(mfs: float, state_gib: float | None = None, state_logged_gib: float | None = None) -> Finding:
    """``state_gib``: the state pool's share of the budget; ``state_logged_gib``: what its line says was allocated,
    the figure the per-GPU table shows. They differ by the padding slot the reserve pays for, and the message says
    which is which (ux audit item 22)."""
    what = "weights + KV" + (f" + state pool {state_gib:.2f} GiB" if state_gib else "") + " = mfs x T"
    if state_gib and state_logged_gib is not None and f"{state_logged_gib:.2f}" != f"{state_gib:.2f}":
        what += (f"; {state_gib:.2f} is the budget's share of the logged {state_logged_gib:.2f} GiB state pool: its "
                 "padding slot comes out of the reserve")
    return _f("MFS_INFERRED",
              f"mem_fraction_static is not in the log; the numbers imply {mfs:.3f} ({what}); "
              "pass --mem-fraction-static to check the pool size against it",
              {"mem_fraction_static": mfs, "state_pool_gib": state_gib})


def hicache_host(gb: float, tokens: int | None, pool_cell: int | None, ratio: float | None,
                 pools: list[str] | None = None) -> Finding:
    """``tokens``: the device pool, when --hicache-ratio sized the host pool (None otherwise: no expected size);
    ``pools``: each host pool's line, when there are several or they state their own tokens (0.5.20+)."""
    extra = f" ({'; '.join(pools)})" if pools else ""
    fields: dict[str, Any] = {"host_gb": gb, "host_gib": round(gb * GB_DECIMAL / GIB, 2)}
    if pools:
        fields["host_pools"] = pools
    if tokens and pool_cell:
        size = int(tokens * (ratio or 2.0)) + 1
        expected = size * pool_cell / GB_DECIMAL
        fields["expected_host_gb"] = round(expected, 2)
        extra += f"; {tokens:,} tokens x ratio {ratio or 2.0:g} x {pool_cell:,} B = {expected:.2f} GB"
    return _f("HICACHE_HOST_MEMORY",
              f"hierarchical cache holds {gb:.2f} GB (decimal, = {gb * GB_DECIMAL / GIB:.2f} GiB) of host RAM per "
              f"rank, outside the GPU ledger{extra}", fields)


def incomplete_log(last_line: int, missing: str = "scheduler summary (max_total_num_tokens=...)") -> Finding:
    return _f("INCOMPLETE_LOG",
              f"no {missing} before line {last_line}: the log was cut, or the server had not finished starting",
              {"last_line": last_line})


def not_enough_memory(message: str, line: int, numbers: dict[str, Any],
                      shortfall: dict[str, float] | None = None) -> Finding:
    """``shortfall``: ``minimum_mem_fraction_static`` (1 - post/T: the smallest fraction that leaves a positive
    KV budget), and when the engine logged its own profiled count, ``effective_mem_fraction_static`` (the
    fraction that count implies) and ``formula_tokens`` (what the formula gives at the logged fraction)."""
    hint = ""
    if "suggested" in numbers:
        hint = f"; SGLang suggests --mem-fraction-static above {numbers['suggested']:.3f}"
    fields: dict[str, Any] = {"line": line, **numbers}
    if isinstance(numbers.get("suggested"), (int, float)) and numbers["suggested"] > 0:
        fields.setdefault("next_step", f"--mem-fraction-static above {numbers['suggested']:.3f}")
    sf = {k: v for k, v in (shortfall or {}).items() if k != "line"}
    if sf.get("minimum_mem_fraction_static") is not None:
        m = sf["minimum_mem_fraction_static"]
        hint += (f"; the formula needs --mem-fraction-static above {fraction_up(m)} (1 - free after weights / T) "
                 "for any KV budget at all")
        fields.setdefault("next_step", f"--mem-fraction-static above {fraction_up(m)}")
    if sf.get("effective_mem_fraction_static") is not None:
        hint += (f"; the engine's own count {int(sf['profiled']):,} implies a fraction of "
                 f"{sf['effective_mem_fraction_static']:.3f}")
        if sf.get("formula_tokens") is not None:
            gap = int(sf["profiled"]) - int(sf["formula_tokens"])
            hint += f", {gap:+,} tokens from the formula's {int(sf['formula_tokens']):,}"
    fields.update(sf)
    return _f("NOT_ENOUGH_MEMORY", f"line {line}: {message}{hint}", fields)


def startup_failed(line: int, detail: str, after_summary_line: int | None = None) -> Finding:
    when = ""
    if after_summary_line is not None:
        when = (f" after the KV pool was sized (the scheduler summary at line {after_summary_line} came first; "
                "the server never became ready)")
    return _f("STARTUP_FAILED", f"the server did not finish starting{when}: {detail} (line {line})",
              {"line": line, "detail": detail, "after_summary": after_summary_line is not None})


# --- vLLM ---------------------------------------------------------------------------------------------------


def budget_reconciles(sentence: str, ranks: list[str], note: str = "") -> Finding:
    extra = f" ({note})" if note else ""
    on = "the one rank" if len(ranks) == 1 else f"{len(ranks)} ranks"
    return _f("BUDGET_RECONCILES", f"the KV budget adds up on {on}: {sentence}{extra}",
              {"ranks": ranks})


def budget_mismatch(rank: str, residual: float, tol: float, ranks: list[str]) -> Finding:
    return _f("BUDGET_MISMATCH",
              f"on {rank} the logged terms do not add up to the KV budget: {residual:+.2f} GiB off (rounding allows "
              f"+-{tol:.2f}); another version's rule, or a term the log does not show",
              {"rank": rank, "residual_gib": round(residual, 3)}, tuple(ranks))


def live_budget_exceeded(over: float, mfs: float, t: float) -> Finding:
    """A live server's weight + kvcache exceed its own mfs x T: its numbers do not follow the formula (issue 33:
    a violation is a finding, never only a note beside "nothing looks wrong")."""
    return _f("BUDGET_MISMATCH",
              f"the live server's weight + kvcache exceed mem_fraction_static {mfs:g} x T {t:.2f} GiB by {over:.2f} "
              "GiB: its numbers do not follow SGLang's formula (another --mem-fraction-static than reported, or a "
              "pool the formula does not size)", {"over_gib": round(over, 3), "mem_fraction_static": mfs,
                                                  "pre_load_free_gib": t})


def non_torch_high(rank: str, non_torch: float, total: float) -> Finding:
    return _f("NON_TORCH_HIGH",
              f"{rank}: non-torch memory {non_torch:.2f} GiB ({non_torch / total:.0%} of {total:.2f} GiB) was counted "
              "against the KV budget; it is usually under 1 GiB (CUDA context, NCCL). Another process on the GPU, or "
              "a second vLLM starting at the same time, shows up here and shrinks (or negates) the KV memory",
              {"rank": rank, "non_torch_gib": non_torch, "total_gib": total}, (rank,))


def graph_estimate_high(rank: str, est: float, actual: float, cell: int | None, block: int,
                        source: str) -> Finding:
    """The 0.18+ profiler reserved ``est`` GiB for CUDA graphs out of the KV budget; the capture used ``actual``."""
    unused = est - actual
    tokens = None
    if cell:
        tokens = int(unused * GIB / (cell * block)) * block
    cost = f", about {tokens:,} tokens at {cell:,} B/token" if tokens is not None else ""
    where = "" if source == "log" else " (the estimate recovered from the utilisation-equivalence note)"
    return _f("GRAPH_ESTIMATE_HIGH",
              f"{rank}: {est:.2f} GiB was reserved for CUDA graphs out of the KV budget{where}, but the capture "
              f"used {actual:.2f} GiB: {unused:.2f} GiB reserved and never used{cost}. "
              "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 with a correspondingly lower --gpu-memory-utilization, "
              "or --kv-cache-memory-bytes, gives it back to the KV cache",
              {"rank": rank, "estimate_gib": est, "actual_gib": actual, "unused_gib": round(unused, 3),
               "tokens_lost": tokens, "estimate_source": source}, (rank,))


def kv_memory_suggested(rank: str, fit_bytes: int, full_bytes: int, requested: float, terms: list[tuple[str, float]],
                        recomputed: float, agrees: bool, estimate: float | None, ranks: int) -> Finding:
    """vLLM's own two ``--kv-cache-memory`` values (the suggestion line), recomputed from the same line:
    ``requested - (consumed or weights + non-torch, + printed peak + captured graphs) - 150 MiB``
    (gpu_worker.py ``redundancy_buffer_memory``). The printed peak holds the CUDA-graph estimate where one was
    applied, so the suggestion counts graphs twice (vllm#57936); ``corrected_bytes`` adds the estimate back."""
    fit, full = fit_bytes / GIB, full_bytes / GIB
    parts = " + ".join(f"{name} {v:.2f}" for name, v in terms)
    check = (f"{requested:.2f} - ({parts}) - 0.15 GiB vLLM keeps spare = {recomputed:.2f} GiB"
             + (", as printed" if agrees else f", not the {fit:.2f} GiB printed: the line's parts do not add up"))
    which = f" (the smallest of {ranks} workers: the value applies to every worker)" if ranks > 1 else ""
    corrected = None
    twice = ""
    if estimate is not None and estimate > 0:
        corrected = int(fit_bytes + estimate * GIB)
        twice = (f" The printed peak already holds the {estimate:.2f} GiB CUDA-graph estimate and the captured graphs "
                 f"are subtracted again, so graphs are counted twice: about {corrected / GIB:.2f} GiB "
                 f"(--kv-cache-memory={corrected}) stays within the same budget (vllm#57936).")
    return _f("KV_MEMORY_SUGGESTED",
              f"{rank}: vLLM suggests --kv-cache-memory={fit_bytes} ({fit:.2f} GiB) to stay within the requested "
              f"{requested:.2f} GiB, or --kv-cache-memory={full_bytes} ({full:.2f} GiB) to fill the card with the "
              f"least free memory{which}; either fixes the KV cache and skips profiling. {check}.{twice}",
              {"rank": rank, "fit_bytes": fit_bytes, "full_bytes": full_bytes, "requested_gib": requested,
               "recomputed_fit_gib": round(recomputed, 3), "agrees": agrees, "graph_estimate_gib": estimate,
               "corrected_fit_bytes": corrected}, (rank,))


def graph_estimate_low(rank: str, est: float, actual: float, headroom: float | None, threshold: float) -> Finding:
    """The capture took more than the estimate the budget reserved: the rest is paid from the (1 - util)
    headroom, after the KV pool is allocated. A warning when what is left of the headroom is under the
    threshold (an OOM at capture or under load: vllm#57475), information otherwise."""
    over = actual - est
    left = headroom - over if headroom is not None else None
    risky = left is None or left < threshold
    where = (f"; that comes out of the {headroom:.2f} GiB (1 - util) headroom after the KV pool was allocated, "
             f"leaving {left:.2f} GiB" if headroom is not None else "; that comes out of the (1 - util) headroom")
    advice = (": at this utilization a capture or a load peak can run out of memory (vllm#57475); a lower "
              "--gpu-memory-utilization leaves the room" if risky else "")
    return _f("GRAPH_ESTIMATE_LOW",
              f"{rank}: the CUDA graphs took {actual:.2f} GiB, {over:.2f} GiB more than the {est:.2f} GiB estimate "
              f"taken out of the KV budget (it is measured with a minimal KV cache){where}{advice}",
              {"rank": rank, "estimate_gib": est, "actual_gib": actual, "over_gib": round(over, 3),
               "headroom_gib": round(headroom, 3) if headroom is not None else None,
               "headroom_left_gib": round(left, 3) if left is not None else None},
              (rank,), None if risky else INFO)


def vllm_low_headroom(head: float, util: float, total: float, graphs: float | None, threshold: float) -> Finding:
    # graphs None: the log states no capture size; say so rather than print a 0 the log never said
    less = (f", less {graphs:.2f} GiB of CUDA graphs" if graphs is not None
            else "; the log gives no CUDA graph size, which would come out of it too")
    return _f("LOW_HEADROOM",
              f"only {head:.2f} GiB lies outside the budget ((1 - {util:g}) x {total:.2f} GiB{less}; below "
              f"{threshold:g} GiB): allocations after startup (sampler, NCCL growth) may OOM",
              {"headroom_gib": round(head, 3), "threshold_gib": threshold})


def concurrency_mismatch(tokens: int, max_len: int, logged: float, implied: float) -> Finding:
    return _f("CONCURRENCY_MISMATCH",
              f"{tokens:,} tokens / max_model_len {max_len:,} = {implied:.2f}x, but the log says {logged:.2f}x "
              "(hybrid or sliding-window layers, or a per-request need above max_model_len)",
              {"tokens": tokens, "max_model_len": max_len, "logged": logged, "implied": round(implied, 4)})


# --- TensorRT-LLM -------------------------------------------------------------------------------------------


def capped_by(setting: str, tokens: int | None, limit_gib: float | None, budget_gib: float | None) -> Finding:
    """A configured cap (TensorRT-LLM ``max_tokens`` / ``max_gpu_total_bytes``) below what the fraction allows."""
    what = f"{setting}={tokens:,}" if tokens is not None else setting
    limit = f" ({limit_gib:.2f} GiB)" if limit_gib is not None else ""
    budget = f", below the {budget_gib:.2f} GiB the fraction allows" if budget_gib is not None else ""
    return _f("TOKENS_CAPPED", f"KV pool capped by {what}{limit}{budget}",
              {"setting": setting, "max_tokens": tokens, "limit_gib": limit_gib, "budget_gib": budget_gib})


def pool_below_budget(pool_gib: float, budget_gib: float, fraction: float, available_gib: float) -> Finding:
    eff = pool_gib / available_gib if available_gib else None
    amounts = f"; it amounts to a fraction of {eff:.2f}" if eff is not None else ""
    return _f("TOKENS_CAPPED",
              f"the KV pool ({pool_gib:.2f} GiB) is far below what fraction {fraction:g} of the available "
              f"{available_gib:.2f} GiB allows ({budget_gib:.2f} GiB): probably capped (max_tokens / "
              f"max_tokens_in_paged_kv_cache, or a draft model's share){amounts}",
              {"probable": True, "pool_gib": pool_gib, "budget_gib": round(budget_gib, 3),
               "effective_fraction": round(eff, 4) if eff is not None else None})


def small_kv_budget(rank: str, available: float, total: float | None, tokens: int | None, threshold: float,
                    line: int | None, pool_text: str | None = None) -> Finding:
    """Almost nothing was free when the KV cache was sized: the cause is what came before it, and no fraction
    can leave the usual headroom, so LOW_HEADROOM's advice (lower the fraction) is not given beside it."""
    before = f" ({total - available:.2f} GiB of the {total:.2f} GiB card was taken before it: the engine, its " \
             "activations and runtime buffers, other processes)" if total else ""
    pool = f"; {pool_text}" if pool_text else (f"; the pool holds {tokens:,} tokens" if tokens else "")
    at = f" (line {line})" if line else ""
    return _f("SMALL_KV_BUDGET",
              f"{rank}: only {available:.2f} GiB was free when the KV cache was sized{at}{before}{pool}. Lowering "
              f"free_gpu_memory_fraction cannot leave {threshold:g} GiB of headroom out of that; what fits more is "
              "less memory taken before the cache (a smaller max_batch_size, max_num_tokens or max_seq_len at build "
              "time, or no other process on the GPU)",
              {"rank": rank, "available_gib": available, "total_gib": total, "tokens": tokens,
               "threshold_gib": threshold}, (rank,))


def session_exceeds_pool(asked: int | None, holds: int, blocks: int | None, block: int, line: int | None,
                         stated: bool, quant_policy: int | None = None) -> Finding:
    """LMDeploy: the session length is more than the KV pool holds, so one request cannot reach its context
    (TurboMind cuts ``session_len`` to the pool: ``LlamaBatch`` "No enough blocks for `session_len`")."""
    pool = f"{blocks:,} blocks x {block} tokens = {blocks * block:,} tokens" if blocks else f"{holds:,} tokens"
    if stated:
        what = (f"session_len {asked:,} is more than the KV pool holds ({pool}): the engine cut it to {holds:,}"
                if asked else f"the engine cut session_len to {holds:,}, all the KV pool holds ({pool})")
        where = f" (line {line})" if line else ""
    else:
        what, where = f"session_len {asked:,} is more than the KV pool holds ({pool})", ""
    return _f("SESSION_EXCEEDS_POOL",
              f"{what}{where}; a single request cannot reach its context. {_session_advice(quant_policy)}",
              {"session_len": asked, "pool_tokens": holds if stated else (blocks * block if blocks else holds),
               "truncated_to": holds if stated else None, "line": line})


def _session_advice(quant_policy: int | None) -> str:
    """Only a quant_policy that shrinks the KV bytes of the one the startup used (ux audit item 7: never advise
    int8 to a cache that is already int4). TurboMind: 0 = 16-bit, 8 = int8 (1 B), 4 = int4 (0.5 B)."""
    if quant_policy == 4:  # already the smallest KV TurboMind offers
        return "Raise cache_max_entry_count or ask for a shorter --session-len"
    smaller = ("an int4 KV cache (--quant-policy 4; this one is int8)" if quant_policy == 8
               else "a quantised KV cache (--quant-policy 8 or 4)")
    return f"Raise cache_max_entry_count, use {smaller}, or ask for a shorter --session-len"


def trtllm_low_headroom(head: float, fraction: float, free: float, threshold: float) -> Finding:
    return _f("LOW_HEADROOM",
              f"only {head:.2f} GiB is left outside the KV cache ((1 - {fraction:g}) x {free:.2f} GiB free after "
              f"profiling; below {threshold:g} GiB): allocations after startup may OOM; lower "
              "free_gpu_memory_fraction", {"headroom_gib": round(head, 3), "threshold_gib": threshold})


def live_pool_mismatch(tokens: int, predicted: TokenInterval | None, implied: float | None,
                       cell: int | None) -> Finding:
    """A live server's pool bytes and token count disagree with the config's bytes per token."""
    extra = f"; the pool implies {implied:,.0f} B per token, the config {cell:,}" if implied and cell else ""
    rng = f" (the pool holds {predicted.low:,}..{predicted.high:,})" if predicted else ""
    return _f("LIVE_POOL_MISMATCH",
              f"the live server reports {tokens:,} tokens, which its own KV pool size does not give at the "
              f"config's bytes per token{rng}{extra}: another KV dtype, TP split or model than assumed",
              {"tokens": tokens, "predicted_low": predicted.low if predicted else None,
               "predicted_high": predicted.high if predicted else None, "implied_bytes_per_token": implied,
               "config_bytes_per_token": cell})


def live_pool_changed(live_tokens: int, startup_tokens: int, source: str) -> Finding:
    """The live server's pool differs from the one its startup log sized: not the same start, or resized."""
    return _f("LIVE_POOL_CHANGED",
              f"the live server reports {live_tokens:,} KV tokens but its startup log sized {startup_tokens:,}: "
              f"the log is not the running server's latest start (restarted since?), or the pool was resized "
              f"({source})", {"live_tokens": live_tokens, "startup_tokens": startup_tokens})


def swa_pool_unused(arch: str, full: int, sliding: int, flat_cell: int, full_cell: int, advice: str) -> Finding:
    """SGLang gave a sliding-window hybrid one full-length pool: every layer holds every token."""
    return _f("SWA_POOL_UNUSED",
              f"{arch} is a sliding-window hybrid by its config ({full} full + {sliding} sliding layers), but SGLang "
              f"sized it as one full-length pool: every layer holds every token, {flat_cell:,} B per token instead "
              f"of {full_cell:,} B for the full layers plus a sliding-window pool sized by --swa-full-tokens-ratio: "
              f"the sliding layers hold KV for tokens outside their window; {advice}",
              {"architecture": arch, "full_attention_layers": full, "sliding_window_layers": sliding,
               "bytes_per_token": flat_cell, "full_layer_bytes_per_token": full_cell})
