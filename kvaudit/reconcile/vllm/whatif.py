"""vLLM what-if: another gpu_memory_utilization moves the budget by (new - old) x total, one for one; another KV
dtype rescales bytes per token. A total recovered from the CUDA-graph note carries its rounding interval into the
answer; a grouped pool (Mamba hybrid, sliding window) is recounted by its own rule (``cell.py``); what the log does
not give is named, one by one.

Whether it starts comes first, in vLLM's words: a budget <= 0 raises "No available memory for the cache blocks"
(V0 worker.py raise_if_cache_size_invalid; V1 0.9.1+ v1/core/kv_cache_utils.py check_enough_kv_cache_memory), and a
uniform pool below one max_model_len request raises "The model's max seq len (M) is larger than the maximum number of
tokens that can be stored in KV cache" (V0 0.2.7+) or "To serve at least one request with the models's max seq len"
(V1, the same function). A startup that failed never measured its end: its headroom is no baseline."""

from __future__ import annotations

import math

from kvaudit.model_config import element_bytes
from kvaudit.parse.interface import Startup
from kvaudit.reconcile.interface import Audit, AuditOptions, TokenInterval, WhatIf, failures
from kvaudit.units import GIB, LOG_HALF_ULP

#: the whatif row for what this engine keeps out of the KV cache
RESERVE_LABEL = "headroom (1 - utilization) x total"


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    from kvaudit.reconcile.vllm.audit import bytes_per_token, kv_budgets, logged_pool
    from kvaudit.reconcile.vllm.context import build_context

    f0 = base.formula
    changes = {k: getattr(new_opts, k) for k in ("mem_fraction_static", "kv_cache_dtype", "tp_size", "context_length")
               if getattr(new_opts, k) is not None and getattr(new_opts, k) != getattr(opts, k)}
    ctx = build_context(startup, opts)
    kv = kv_budgets(ctx)
    T_lo, T_hi = (kv.T, kv.T) if kv.T is not None else (kv.T_note_range or (None, None))
    u0, K = f0.mem_fraction_static, f0.rest_gib
    missing = [what for what, v in (
        ("the card's total memory (no line states it, and no CUDA-graph note gives it)", T_lo),
        ("the gpu_memory_utilization the startup used (--log-fraction)", u0),
        ("the available KV cache memory ('Available KV cache memory' line)", K)) if v is None]
    cells, _ = bytes_per_token(ctx, kv, logged_pool(ctx))
    grouped = cells.pool is not None or cells.swa is not None
    if not f0.bytes_per_token and not grouped:
        missing.append("bytes per token: neither the model's config.json (--model-config) nor a KV size line "
                       "gives what one token costs, so no token count follows")
    if missing:
        return WhatIf(changes, f0.logged_tokens, None, K, None, f0.reserve_gib, None, None, None, None, None,
                      "unknown", tuple(f"the log lacks {m}" for m in missing), reserve_label=RESERVE_LABEL)
    assert T_lo is not None and T_hi is not None and u0 is not None and K is not None
    explanation: list[str] = []
    u1 = new_opts.mem_fraction_static or u0
    cell = f0.bytes_per_token or 0
    scale = 1.0
    if new_opts.kv_cache_dtype and opts.model_geometry is not None:
        new_elt = element_bytes(new_opts.kv_cache_dtype) or 2
        old_elt = base.model.kv_dtype_bytes or 2
        scale = old_elt / new_elt
        cell = int(cell * new_elt / old_elt)
        explanation.append(f"KV element {old_elt:g} -> {new_elt:g} B: {f0.bytes_per_token:,} -> {cell:,} B/token")
    d_lo, d_hi = sorted(((u1 - u0) * T_lo, (u1 - u0) * T_hi))
    kv_lo, kv_hi = K + d_lo, K + d_hi
    if T_lo != T_hi:
        explanation.append(f"the card's total is known only as {T_lo:.1f}..{T_hi:.1f} GiB (the CUDA-graph note's "
                           "rounding): every figure below carries that interval")
    tokens, why_not = _tokens(base, cells, ctx, (kv_lo - LOG_HALF_ULP) * scale, (kv_hi + LOG_HALF_ULP) * scale, cell)
    explanation.extend(why_not)
    graphs = max((l.item("graphs_target_decode").gib or 0 for l in base.ranks  # type: ignore[union-attr]
                  if l.item("graphs_target_decode")), default=0.0)
    r0, r1 = T_lo * (1 - u0), T_lo * (1 - u1)
    h0, h1 = r0 - graphs, r1 - graphs
    risk = "oom" if h1 < 0 else ("low" if h1 < opts.thresholds.low_headroom_gib else "ok")
    reason = None
    failed = failures(base.findings)
    # the utilization at which the budget turns positive: K + (u - u0) x total > 0
    need = u0 - K / T_hi if T_hi else None
    # the max seq len check: V0 from 0.2.7 (0.2.0-0.2.6 start and leave long prompts waiting), every V1; skipped
    # only for a log certainly older
    old = ctx.era.hi is not None and ctx.era.hi < (0, 2, 7)
    mml = _mml(ctx) if cells.pool is None and cells.swa is None and not old else None
    if kv_lo <= 0:
        reason = (f"the KV budget would be {kv_lo:.2f}" + (f"..{kv_hi:.2f}" if kv_hi != kv_lo else "") + " GiB: vLLM "
                  + ("will" if kv_hi <= 0 else "may") + " not start (\"No available memory for the cache blocks\")"
                  + (f"; it needs --gpu-memory-utilization above {need:.3f}" if need is not None and need < 1 else ""))
        risk = "oom"
    elif mml and tokens is not None and tokens.low < mml:
        reason = (f"the pool would hold {tokens.low:,}" + (f"..{tokens.high:,}" if tokens.high != tokens.low else "")
                  + f" tokens, fewer than one request of max_model_len {mml:,}: vLLM "
                  + ("will" if tokens.high < mml else "may") + " not start (\"the model's max seq len is larger than "
                  "the maximum number of tokens that can be stored in KV cache\"; V1: \"To serve at least one "
                  "request with the models's max seq len\"); lower --max-model-len to fit it")
        risk = "oom"
    elif failed:
        reason = (f"the KV budget would be {kv_lo:.2f} GiB, above zero, so vLLM's budget check would pass; whether "
                  "the rest of the startup fits cannot be told: this startup failed before it was measured")
        risk = "unknown"
    if failed:
        h0 = h1 = None  # type: ignore[assignment]
    explanation.append(f"the budget moves by ({u1} - {u0}) x total = {d_lo:+.2f}" + (
        f"..{d_hi:+.2f}" if d_hi != d_lo else "") + f" GiB; CUDA graphs captured beyond any estimate ({graphs:.2f} "
        "GiB) live in the (1 - util) headroom" + (" (headroom figures use the smallest total)" if T_lo != T_hi else ""))
    # --kv-cache-memory-bytes (0.10.2+) fixes the KV cache per worker and skips the profiling budget: the same
    # pool next time, whatever the profile measures (config/cache.py kv_cache_memory_bytes)
    pin = f"--kv-cache-memory-bytes {int(kv_lo * GIB)}" if kv_lo > 0 and risk == "ok" else None
    return WhatIf(changes, f0.logged_tokens, tokens, K, round(max(kv_lo, 0), 2),
                  round(r0, 2), round(r1, 2), round(graphs, 3), round(graphs, 3),
                  None if h0 is None else round(h0, 2), None if h1 is None else round(h1, 2), risk,
                  tuple(([reason] if reason else []) + explanation), pin, reserve_label=RESERVE_LABEL, reason=reason)


def _tokens(base: Audit, cells, ctx, kv_lo: float, kv_hi: float, cell: int
            ) -> tuple[TokenInterval | None, tuple[str, ...]]:
    """The token count at KV kv_lo..kv_hi GiB, by the rule that reproduced this startup's count: uniform
    ``floor(KV / (cell x block)) x block``; a grouped pool its blocks by the era's count (``cell.py``). Beside it,
    why no count was given, when that needs saying."""
    f0 = base.formula
    if kv_hi <= 0:
        return TokenInterval(0, 0), ()
    if cells.pool is None and cells.swa is None:
        bs = f0.page_size or 16
        lo, hi = (math.floor(max(0.0, k) * GIB / (cell * bs)) * bs for k in (kv_lo, kv_hi))
        return TokenInterval(lo, hi), ()
    if f0.verdict.value != "match":
        return None, ("the grouped pool's count was not reproduced on this startup, so it is not rerun",)
    return _grouped_tokens(base, cells, ctx, kv_lo, kv_hi), ()


def _grouped_tokens(base: Audit, cells, ctx, kv_lo: float, kv_hi: float) -> TokenInterval | None:
    """A grouped pool's count at kv_lo..kv_hi GiB, by the era's rule that reproduced this startup."""
    reason = base.formula.verdict_reason or ""
    from kvaudit.reconcile.vllm.formula import batched_tokens, mamba_state_pages
    from kvaudit.reconcile.vllm.audit import _speculative_tokens

    pool = cells.pool or cells.swa
    lo_b, hi_b = pool.blocks(max(0.0, kv_lo) * GIB), pool.blocks(kv_hi * GIB)
    if "to 0.20.0" in reason:
        return TokenInterval(pool.tokens_by_blocks(lo_b), pool.tokens_by_blocks(hi_b))
    mml = next((int(s) for s in [_mml(ctx)] if s), None)
    if mml is None:
        return None
    if cells.swa is not None:
        mnbt = next((v for v, how in batched_tokens(ctx) if not how or how in " ".join(base.notes)), None)
        if mnbt is None:
            return None
        return TokenInterval(cells.swa.tokens_by_concurrency(lo_b, mml, mnbt),
                             cells.swa.tokens_by_concurrency(hi_b, mml, mnbt))
    states = mamba_state_pages(ctx, _speculative_tokens(ctx.args))
    pages = next((p for p, mode, _ in states if f"({mode} mode)" in reason), None)
    if pages is None:
        return None
    return TokenInterval(cells.pool.tokens_by_concurrency(lo_b, mml, pages),
                         cells.pool.tokens_by_concurrency(hi_b, mml, pages))


def _mml(ctx) -> int | None:
    from kvaudit.parse.vllm import Concurrency
    from kvaudit.reconcile.values import as_int

    return next((c.max_model_len for c in reversed(ctx.startup.of(Concurrency))), None) or as_int(
        ctx.args.get("max_model_len"))
