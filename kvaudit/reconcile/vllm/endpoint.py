"""vLLM audited from its own ``/metrics`` when the startup log is not available.

Upstream: ``v1/metrics/loggers.py`` (``vllm:cache_config_info``, an info gauge of value 1 whose labels are the
engine's ``CacheConfig`` fields, strings: ``num_gpu_blocks``, ``block_size``, ``cache_dtype``,
``gpu_memory_utilization``, ``kv_cache_memory_bytes``, ``kv_cache_size_tokens`` in 0.29+, ...), one per
engine (DP rank, label ``engine``); ``/version`` (``entrypoints/openai/api_server.py``) gives the release.

What it establishes: the pool (``num_gpu_blocks x block_size`` tokens, and with the model's config the KV
bytes per rank, exactly: blocks x bytes per block). What it cannot: the budget's terms (weights, activation
peak, non-torch memory, CUDA graphs), the card's total, the TP size (not among the labels: ``--tp-size`` or
assumed 1). For hybrid (Mamba) models vLLM reports the attention ``block_size`` of 16 whatever the real one
(an upstream bug): tokens are not derived from it then.
"""

from __future__ import annotations

from typing import Mapping

from kvaudit.model_config import element_bytes
from kvaudit.parse.metrics import Sample, json_document, samples
from kvaudit.reconcile.interface import (Audit, AuditOptions, Formula, FormulaRow, LedgerItem, ModelSummary,
                                         RankLedger, TokenInterval, Verdict)
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.reconcile.vllm.cell import cell_size
from kvaudit.units import GIB

INFO_METRIC = "vllm:cache_config_info"
#: the documents read: the release, and the Prometheus page with the cache config
PATHS = (("/version",), ("/metrics",))


def cache_configs(documents: Mapping[str, str]) -> list[Sample]:
    return [s for s in samples(documents.get("/metrics"), (INFO_METRIC,)) if s.name == INFO_METRIC]


def audit_endpoint(documents: Mapping[str, str], url: str, opts: AuditOptions) -> Audit | None:
    configs = cache_configs(documents)
    if not configs:
        return None
    version = _version(documents.get("/version"))
    labels = configs[0].labels
    # a count past 2**53 is no reading (a 4,000-digit label made float() overflow: exit 70 from data)
    blocks, block = _count(labels.get("num_gpu_blocks")), _count(labels.get("block_size"))
    util = opts.mem_fraction_static or as_float(labels.get("gpu_memory_utilization"))
    stated_tokens = _count(labels.get("kv_cache_size_tokens"))
    geom = opts.model_geometry
    hybrid = bool(geom is not None and geom.is_mamba_hybrid)
    tp = opts.tp_size or 1
    dtype = labels.get("cache_dtype") or "auto"
    elt = element_bytes(dtype) if dtype != "auto" else (
        (2 if geom.dtype_bytes == 4 else geom.dtype_bytes) if geom is not None else None)
    cell = None
    if geom is not None and elt:
        cell = cell_size(geom, tp, elt)

    notes = [
        f"source: the live server's {url}/metrics (no startup log): the pool as the engine reports it now",
        "not visible from this source: weights, activation peak, non-torch memory and CUDA graphs (the "
        "utilisation budget's terms), the card's total, the TP size" + ("" if opts.tp_size else
                                                                         " (assumed 1: give --tp-size)"),
    ]
    tokens = None
    verdict, reason = Verdict.UNKNOWN, ""
    predicted = None
    if blocks is not None and block and not hybrid:
        tokens = blocks * block
        predicted = TokenInterval(tokens, tokens)
        if stated_tokens is not None:
            if stated_tokens == tokens:
                verdict = Verdict.MATCH
                reason = f"{blocks:,} blocks x {block} tokens = {tokens:,} tokens, as kv_cache_size_tokens says"
            else:
                verdict = Verdict.MISMATCH
                reason = (f"{blocks:,} blocks x {block} tokens = {tokens:,}, but kv_cache_size_tokens says "
                          f"{stated_tokens:,}")
        else:
            reason = (f"{blocks:,} blocks x {block} tokens = {tokens:,} tokens; the budget that sized them is not "
                      "in /metrics (the startup log has it)")
    elif hybrid:
        reason = ("a hybrid (Mamba) model: vLLM's /metrics reports block_size 16 whatever the real attention "
                  "block (upstream bug), so tokens are not derived from it")
        notes.append(reason)
    else:
        reason = "vllm:cache_config_info carries no num_gpu_blocks/block_size"
    kv_gib = blocks * block * cell[0] / GIB if (cell and blocks is not None and block and not hybrid) else None
    engines = sorted({s.labels.get("engine", "0") for s in configs})
    ledgers = tuple(
        RankLedger(rank=i, label=f"engine {e}" if len(engines) > 1 else "TP0", pre_load_free_gib=None,
                   weights_gib=None, kv_gib=kv_gib, free_after_weights_gib=None, free_after_pool_gib=None,
                   free_at_end_gib=None, free_at_end_source=None, end_is_final=False,
                   items=(LedgerItem("kv_cache", "KV cache (blocks x bytes per block)", kv_gib, "model"),),
                   unexplained_gib=None, unexplained_tolerance_gib=None,
                   unmodelled=("/metrics gives the pool only: weights, activations, non-torch memory and "
                               "graphs are in the startup log",),
                   logged=tuple((k, float(v)) for k, v in ((k, as_float(labels.get(k))) for k in
                                ("num_gpu_blocks", "block_size", "gpu_memory_utilization", "kv_cache_size_tokens"))
                                if v is not None))
        for i, e in enumerate(engines))
    formula = Formula(
        mem_fraction_static=util, mem_fraction_static_source="metrics" if util else None,
        pre_load_free_gib=None, pre_load_free_source=None, post_load_free_gib=None, reserve_gib=None,
        rest_gib=None, bytes_per_token=cell[0] if cell else None, bytes_per_token_source="config" if cell else None,
        predicted_tokens=predicted if verdict != Verdict.UNKNOWN else None,
        logged_tokens=stated_tokens if stated_tokens is not None else tokens, verdict=verdict,
        verdict_reason=reason, rule="live endpoint: tokens = num_gpu_blocks x block_size", page_size=block,
    )
    rows = (
        FormulaRow("num_gpu_blocks", float(blocks) if blocks is not None else None, "", "cache_config_info"),
        FormulaRow("block_size (tokens)", float(block) if block else None, "", "cache_config_info"),
        FormulaRow("gpu_memory_utilization", util, "", "cache_config_info"),
        FormulaRow("KV cache per rank = blocks x block x bytes per token", kv_gib, "GiB",
                   cell[1] if cell else "needs the model's config.json (--model-config)"),
    )
    model = ModelSummary(
        geom.architecture if geom else None, ("mla" if geom.is_mla else "mha") if geom else "unknown",
        geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
        (None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // tp)) if geom else None,
        geom.head_dim if geom else None, dtype, elt, tp, geom.source if geom else None,
        attention_tp_size_source="--tp-size" if opts.tp_size else "assumed 1 (not in /metrics)",
    )
    return Audit(
        engine="vllm", source=f"{url}/metrics", startup_index=1, startups_total=1, first_line=0, last_line=0,
        engine_version=version or "unknown", version_evidence=(f"/version {version}",) if version else (),
        model=model, formula=formula, ranks=ledgers, findings=(), speculative=None, hicache_host_gb=None,
        notes=tuple(notes), engine_display="vLLM (live endpoint)",
        formula_text="tokens = num_gpu_blocks x block_size;  KV bytes = tokens x bytes per token",
        formula_rows=rows, pre_load_label="free before loading", from_endpoint=True,
    )


def _version(body: str | None) -> str | None:
    doc = json_document(body)
    v = doc.get("version") if isinstance(doc, dict) else None
    return v if isinstance(v, str) else None


def _count(v: object) -> int | None:
    """A label's whole number when it is one a server could hold (0 <= n < 2**53), else None."""
    n = as_int(v)
    return n if n is not None and 0 <= n < 1 << 53 else None
