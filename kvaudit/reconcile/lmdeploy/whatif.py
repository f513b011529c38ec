"""LMDeploy what-if: another cache_max_entry_count, quant_policy, session_len or TP size on the same free memory.

The free memory after the weights is what the ratio applies to; the log states it only in some eras (TurboMind's
0.13-0.14 SeqMgr line and 0.15+ object cache line, the PyTorch engine's DEBUG line). Elsewhere the pool bounds it:
``blocks x block bytes / ratio`` (to one block): the what-if says it rests on that.
"""

from __future__ import annotations

import math

from kvaudit.parse.interface import Startup
from kvaudit.reconcile.interface import Audit, AuditOptions, TokenInterval, WhatIf, failures
from kvaudit.reconcile.lmdeploy.settings import policy_of
from kvaudit.units import GIB

RESERVE_LABEL = "left free: (1 - cache_max_entry_count) x free"


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    f0 = base.formula
    # the changes in LMDeploy's own words: its settings' names, quant_policy as the number it takes
    words = {"mem_fraction_static": "cache_max_entry_count", "kv_cache_dtype": "quant_policy",
             "context_length": "session_len", "tp_size": "tp_size"}
    changes = {words[k]: (policy_of(v) if k == "kv_cache_dtype" else v) for k, v in
               ((k, getattr(new_opts, k, None)) for k in words) if v is not None and v != getattr(opts, k, None)}
    ratio0 = f0.mem_fraction_static or 0.8
    ratio1 = new_opts.mem_fraction_static or ratio0
    per_token = f0.bytes_per_token or f0.kv_bytes_per_token_logged
    block = f0.page_size or 64
    kv0 = base.ranks[0].kv_gib if base.ranks else None
    free = f0.post_load_free_gib
    explanation: list[str] = []
    assumed = False
    if free is None and kv0 is not None and ratio0 < 1:
        free = kv0 / ratio0
        assumed = (f0.mem_fraction_static_source or "").startswith("default")
        if assumed:
            # every figure below is the pool divided by a ratio the log does not state: another ratio gives another
            # free memory, so the answer is only as good as that assumption, and no block count is pinned on it
            explanation.append(f"this answer rests on the assumed cache_max_entry_count {ratio0:g} (LMDeploy's "
                               "default; the log does not state it): --log-fraction gives the one the server ran with")
        explanation.append(f"free after the weights not in the log: {kv0:.2f} GiB / {ratio0:g} = {free:.2f} GiB "
                           "implied by the pool (to one block)")
    if free is None or not per_token or ratio1 >= 1:
        if ratio1 >= 1:
            lacks: tuple[str, ...] = ("cache_max_entry_count >= 1 is a block count: the pool is that many blocks",)
        else:
            lacks = tuple(
                ([] if free is not None else [
                    "the log lacks the free memory after the weights, and the pool's bytes that would imply it: "
                    f"its {f0.logged_tokens:,} tokens are in the log, but not the exact bytes of a block (a "
                    "whole-MiB block line is cut: pass --model-config)"] if f0.logged_tokens else [
                    "the log lacks the free memory after the weights, and the pool that would imply it (TurboMind's "
                    "'[BlockManager] max_block_count' with its block size, or the PyTorch engine's num_gpu_blocks)"])
                + ([] if per_token else [
                    "the log lacks the bytes per token (a block line with the tokens per block; or pass "
                    "--model-config)"]))
        return WhatIf(changes, f0.logged_tokens, None, kv0, None, None, None, None, None, None, None, "unknown",
                      lacks, reserve_label=RESERVE_LABEL)
    cell = float(per_token)
    qp = policy_of(new_opts.kv_cache_dtype)
    elt, d = base.model.kv_dtype_bytes, base.model.head_dim
    if qp is not None and not (elt and d):
        return WhatIf(changes, f0.logged_tokens, None, kv0, None, None, None, None, None, None, None, "unknown",
                      ("another quant_policy needs the head size: pass --model-config (config.json)",),
                      reserve_label=RESERVE_LABEL)
    if qp is not None and elt and d:
        old = _per_elem(elt, d)
        new = _per_elem({0: 2.0, 8: 1.0, 4: 0.5}[qp], d)
        cell = cell * new / old
        explanation.append(f"quant_policy {qp}: {per_token:,.0f} -> {cell:,.0f} B/token (data and scales per head)")
    if new_opts.tp_size and base.model.attention_tp_size and new_opts.tp_size != base.model.attention_tp_size:
        cell = cell * base.model.attention_tp_size / new_opts.tp_size
        explanation.append(f"TP {base.model.attention_tp_size} -> {new_opts.tp_size}: bytes per token per GPU scale "
                           "with the KV heads each rank holds; the free memory is assumed unchanged (approximate: "
                           "the weights per GPU change too)")
    budget = free * ratio1
    blocks = math.floor(budget * GIB / (cell * block))
    tokens = blocks * block
    left = free - budget
    explanation.append(f"KV = {free:.2f} GiB free x {ratio1:g} = {budget:.2f} GiB -> {blocks:,} blocks of {block} "
                       f"tokens; {left:.2f} GiB stays free for activations")
    said = next((r.source for r in base.formula_rows if r.quantity == "tokens per block"), "")
    if said.startswith("default"):
        explanation.append(f"the tokens per block are not in the log: {block} (the default) is assumed, so the token "
                           "count is as good as that assumption; the block count is not")
    session = new_opts.context_length
    if session and session > tokens:
        explanation.append(f"session_len {session:,} is more than the {tokens:,} tokens the pool would hold: "
                           "one request could not reach it")
    risk = "low" if left < opts.thresholds.low_headroom_gib else "ok"
    before: float | None = free * (1 - ratio0)
    reason = None
    if failures(base.findings):
        # a startup that failed measured no end: what it left free is no baseline, and whether the rest fits is
        # not known
        before, risk = None, "unknown"
        reason = ("the pool would be sized as above, but whether the rest of the startup fits cannot be told: this "
                  "startup failed before it was measured")
        explanation.insert(0, reason)
    # cache_max_entry_count >= 1 is an absolute block count in TurboMind <=0.14 (0.15+ takes fractions only; the
    # PyTorch engine's num_gpu_blocks does the same)
    pin = f"--cache-max-entry-count {blocks} (TurboMind <=0.14; PyTorch engine: num_gpu_blocks={blocks})"
    return WhatIf(changes, f0.logged_tokens, TokenInterval(tokens, tokens), kv0, round(budget, 2),
                  None if before is None else round(before, 2), round(left, 2), None, None,
                  None if before is None else round(before, 2),
                  round(left, 2), risk, tuple(explanation),
                  pin if blocks > 0 and risk == "ok" and not assumed else None, reserve_label=RESERVE_LABEL,
                  reason=reason)


def _per_elem(elt: float, head_dim: int) -> float:
    """Bytes per head and token: the data, plus a 16-bit scale and zero when quantised."""
    return head_dim * elt + (4 if elt < 2 else 0)
