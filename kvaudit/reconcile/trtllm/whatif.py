"""TensorRT-LLM what-if: another free_gpu_memory_fraction, KV dtype or max_tokens on the same profiled numbers.

Whether it starts comes first: the C++ runtime refuses a pool that cannot hold one max_seq_len sequence
("maxTokensInPagedKvCache (N) must be large enough to process at least 1 sequence to completion", beam width 1:
whole blocks of max_seq_len), as trtllm_c004 shows; the PyTorch backend's resource_manager.py
_validate_and_adjust_attention_windows instead cuts the window and max_seq_len to the pool (trtllm_c013's "Adjusted
max_seq_len"). max_seq_len is the log's ``max_seq_len=`` line or ``--context-length``; without either, a smaller pool
is not called ok."""

from __future__ import annotations

import math

from kvaudit.parse.interface import Startup
from kvaudit.parse.trtllm import WindowNote
from kvaudit.reconcile.interface import Audit, AuditOptions, TokenInterval, WhatIf, failures
from kvaudit.reconcile.trtllm.context import build_context
from kvaudit.reconcile.trtllm.budget import round_up
from kvaudit.reconcile.trtllm.context import DEFAULT_FRACTION, element_bytes
from kvaudit.units import GIB


#: the whatif row for what this engine keeps out of the KV cache
RESERVE_LABEL = "left free: (1 - fraction) x free"


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    """Another free_gpu_memory_fraction scales the KV budget with what was free after profiling; another KV
    dtype rescales bytes per token; a max_tokens caps the pool."""
    f0 = base.formula
    changes = {k: getattr(new_opts, k) for k in ("mem_fraction_static", "kv_cache_dtype", "max_tokens")
               if getattr(new_opts, k, None) is not None and getattr(new_opts, k) != getattr(opts, k, None)}
    if "backend_managed" in base.pool_kinds:  # AutoDeploy's own caches (audit.AUTODEPLOY)
        return WhatIf(changes, f0.logged_tokens, None, f0.rest_gib, None, f0.reserve_gib, None, None, None, None,
                      None, "unknown", ("the AutoDeploy backend sizes its own caches by free_mem_ratio, which "
                                        "kvaudit does not model",), reserve_label=RESERVE_LABEL)
    free = f0.post_load_free_gib
    if free is None or not f0.bytes_per_token or not f0.page_size:
        return WhatIf(changes, f0.logged_tokens, None, f0.rest_gib, None, f0.reserve_gib, None, None, None, None, None,
                      "unknown", ("the log lacks the profiling peak (or the C++ available memory), bytes per token "
                                  "or the tokens per block",), reserve_label=RESERVE_LABEL)
    if "encoder-decoder" in (f0.verdict_reason or ""):
        return WhatIf(changes, f0.logged_tokens, None, f0.rest_gib, None, f0.reserve_gib, None, None, None, None,
                      None, "unknown", ("an encoder-decoder model: the self- and cross-attention caches split the "
                                        "budget by crossKvCacheFraction, which the log does not state",),
                      reserve_label=RESERVE_LABEL)
    f_old = f0.mem_fraction_static or DEFAULT_FRACTION
    f_new = new_opts.mem_fraction_static or f_old
    cell = f0.bytes_per_token
    explanation: list[str] = []
    # "now" is the pool the log allocated ("Allocated X GiB for max tokens in paged KV cache (N)"), as explain's
    # ledger shows it, not the fraction's budget when something smaller sized the pool
    pools = [r.kv_gib for r in base.ranks if r.kv_gib is not None]
    pool_now = min(pools) if pools else f0.rest_gib
    budget_now = free * f_old
    cap_tokens = getattr(new_opts, "max_tokens", None)
    if cap_tokens is None and pool_now is not None and f0.logged_tokens and pool_now < 0.9 * budget_now:
        # a cap the log does not show (max_tokens, max_attention_window x batch) sized the pool: it holds next time
        cap_tokens = f0.logged_tokens
        explanation.append(f"the pool ({pool_now:.2f} GiB, {f0.logged_tokens:,} tokens) is below the fraction's "
                           f"{budget_now:.2f} GiB: a cap the log does not show sized it, and it still applies")
    if new_opts.kv_cache_dtype:
        new_elt = element_bytes(new_opts.kv_cache_dtype) or 2
        old_elt = base.model.kv_dtype_bytes or 2
        cell = int(cell * new_elt / old_elt)
        explanation.append(f"KV element {old_elt:g} -> {new_elt:g} B: {f0.bytes_per_token:,} -> {cell:,} B/token")
    kv1 = free * f_new
    tokens = round_up(math.floor(kv1 * GIB / cell), f0.page_size)
    explanation.append(f"KV budget = {free:.2f} GiB free after profiling x {f_new:g} = {kv1:.2f} GiB")
    if cap_tokens is not None and cap_tokens < tokens:
        explanation.append(f"max_tokens {cap_tokens:,} caps the {tokens:,} tokens the fraction allows")
        tokens = round_up(cap_tokens, f0.page_size)
        kv1 = tokens * cell / GIB
    r0, r1 = free - (pool_now if pool_now is not None else budget_now), free - kv1
    risk = "oom" if r1 < 0 else ("low" if r1 < opts.thresholds.low_headroom_gib else "ok")
    explanation.append(f"the pool would be {kv1:.2f} GiB ({tokens:,} tokens); {r1:.2f} GiB of the {free:.2f} GiB "
                       "stays free")
    reason = None
    ctx = build_context(startup, opts)
    seq_log = ctx.first("max_seq_len")
    seq = new_opts.context_length or (int(seq_log) if seq_log else None)
    if new_opts.context_length:
        changes["max_seq_len"] = new_opts.context_length
    one = math.ceil(seq / f0.page_size) * f0.page_size if seq else None
    cuts = bool(startup.of(WindowNote)) or ctx.first("max_seq_len_adjusted") is not None
    if tokens <= 0:
        reason = (f"the pool would hold no token ({kv1:.2f} GiB): TensorRT-LLM will not start "
                  "(\"maxTokensInPagedKvCache must be large enough to process at least 1 sequence\")")
        risk = "oom"
    elif one is not None and tokens < one:
        if cuts:
            # it starts: the window and max_seq_len follow the pool, as they did at this startup
            explanation.append(f"the pool would hold {tokens:,} tokens, fewer than max_seq_len {seq:,}: this backend "
                               f"cuts the attention window and max_seq_len to the pool (as this log's 'Adjusted' "
                               "lines show): a longer request is refused")
        else:
            reason = (f"the pool would hold {tokens:,} tokens, fewer than one max_seq_len {seq:,} sequence "
                      f"({one:,} in blocks of {f0.page_size}): TensorRT-LLM will not start (\"maxTokensInPagedKvCache "
                      "must be large enough to process at least 1 sequence\"); --context-length gives another "
                      "max_seq_len")
            risk = "oom"
    elif one is None and f0.logged_tokens and tokens < f0.logged_tokens and risk == "ok":
        reason = (f"the pool would shrink to {tokens:,} tokens, and the log does not state max_seq_len: the C++ "
                  "runtime refuses a pool that cannot hold one sequence (\"maxTokensInPagedKvCache must be large "
                  "enough to process at least 1 sequence\"): pass the server's max_seq_len as --context-length to "
                  "check it")
        risk = "unknown"
    h0: float | None = round(r0, 2)
    if failures(base.findings):
        h0 = None  # a startup that failed measured no end: no baseline for a headroom
        if risk in ("ok", "low"):
            risk = "unknown"
            reason = reason or ("the pool would be sized, but whether the rest of the startup fits cannot be told: "
                                "this startup failed before it was measured")
    # KvCacheConfig(max_tokens=N) caps the pool at N whatever the profiling measures (the fraction still applies
    # when it allows fewer); max_gpu_total_bytes does the same in bytes (Jul 2025+); offered for an ok answer only
    pin = (f"kv_cache_config max_tokens={tokens} (or max_gpu_total_bytes={int(tokens * cell)})"
           if tokens > 0 and risk == "ok" else None)
    return WhatIf(changes, f0.logged_tokens, TokenInterval(tokens, tokens), pool_now, round(kv1, 2), h0,
                  round(r1, 2), 0.0, 0.0, h0, round(r1, 2), risk, tuple(([reason] if reason else []) + explanation),
                  pin, reserve_label=RESERVE_LABEL, reason=reason)
