"""Bytes per token per GPU: the log's own ``kv size`` first (it includes a draft model's layers), else the
model config (``KVCacheManager.get_cache_bytes_per_token``), else derived from the pool line (not independent)."""

from __future__ import annotations

import math

from kvaudit.model_config import ModelGeometry
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding
from kvaudit.reconcile.trtllm.context import Context
from kvaudit.reconcile.trtllm.facts import Pool
from kvaudit.units import GIB, LOG_HALF_ULP
from kvaudit.record import record

# element sizes a KV cache is stored in (fp8/int8, fp4, bf16/fp16, fp32), tried when the dtype was assumed
ELEMENT_NAMES = {1.0: "fp8 or int8", 0.5: "fp4", 2.0: "16-bit", 4.0: "fp32"}


def cell_size(geom: ModelGeometry, tp: int, elt: float) -> tuple[int, str]:
    """kv_factor x sum over layers of ceil(kv_heads / tp) x head_dim x element bytes; MLA keeps one 576-wide
    latent (kv_factor 1, one head)."""
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        return int(geom.num_layers * d * elt), f"MLA {d} x {geom.num_layers} layers x {elt:g} B (K only)"
    h = math.ceil((geom.num_kv_heads or 1) / max(1, tp))
    hd = geom.head_dim or 0
    return int(2 * geom.num_layers * h * hd * elt), f"K+V {h} head(s) x {hd} x {geom.num_layers} layers x {elt:g} B"


@record
class Cell:
    bytes: int | None
    source: str | None  # config | log (kv size per token) | kv_line
    description: str | None
    from_pool_line: float | None  # pool GiB / pool tokens, for reference
    implied_elt: float | None = None  # the KV element size the pool line implies, when the dtype was assumed
    findings: tuple[Finding, ...] = ()  # what the step found (a config whose geometry the log's kv size refutes)


def bytes_per_token(ctx: Context, pool: Pool) -> Cell:
    """The cell and its findings (returned, not appended to a list the caller hands in: issue 33)."""
    findings: list[Finding] = []
    cell = desc = source = None
    if ctx.geom is not None:
        cell, desc = cell_size(ctx.geom, ctx.tp, ctx.kv_elt)
        source = "config"
    logged = ctx.first("bytes_per_token")
    if logged is not None:
        if cell is not None and abs(cell - logged) > 0.002 * logged:
            findings.append(F.geometry_mismatch(cell, logged, ctx.geom.source if ctx.geom else "config"))
        cell, source, desc = int(logged), "log (kv size per token)", None
        fixed = ctx.first("fixed_cost_bytes")
        if fixed:
            ctx.notes.append(f"the engine adds a fixed cost of {int(fixed):,} bytes to the per-token size (2026 "
                             "builds); it is not in the token arithmetic here")
    from_line = None
    implied = None
    if pool.gib and pool.tokens:
        from_line = pool.gib * GIB / pool.tokens
        if cell is None:
            cell, source = int(round(from_line)), "kv_line"
        elif source == "config" and ctx.kv_assumed and ctx.geom is not None:
            # the pool line states GiB and tokens: a KV dtype that was only assumed gives way to the one they imply
            lo, hi = (pool.gib - LOG_HALF_ULP) * GIB / pool.tokens, (pool.gib + LOG_HALF_ULP) * GIB / pool.tokens
            if lo <= cell <= hi:
                implied = ctx.kv_elt  # the pool line agrees with the assumed element size: it is no longer a guess
                ctx.notes.append(f"the KV dtype was not stated; the pool line ({pool.gib:.2f} GiB for "
                                 f"{pool.tokens:,} tokens, {from_line:,.0f} B/token) agrees with "
                                 f"{ctx.kv_elt:g}-byte elements")
            else:
                for elt in ELEMENT_NAMES:
                    c, d = cell_size(ctx.geom, ctx.tp, elt)
                    if lo <= c <= hi:
                        cell, desc, implied = c, d, elt
                        ctx.notes.append(
                            f"the KV dtype was not stated: the pool line ({pool.gib:.2f} GiB for {pool.tokens:,} "
                            f"tokens, {from_line:,.0f} B/token) implies {elt:g}-byte elements ({ELEMENT_NAMES[elt]} KV "
                            f"cache), not the model dtype's {ctx.kv_elt:g} B")
                        break
    return Cell(cell, source, desc, from_line, implied, tuple(findings))
