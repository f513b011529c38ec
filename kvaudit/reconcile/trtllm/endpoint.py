"""TensorRT-LLM audited from ``trtllm-serve``'s own ``/metrics`` when the startup log is not available.

Upstream: ``serve/openai_server.py`` serves ``/metrics`` as JSON, the executor's iteration statistics
(``enable_iter_perf_stats``), each with ``kvCacheStats`` (``maxNumBlocks``, ``tokensPerBlock``,
``usedNumBlocks``, ``freeNumBlocks``); ``/prometheus/metrics`` carries request latencies only, no pool size.
What it establishes: the pool, ``maxNumBlocks x tokensPerBlock`` tokens. What it cannot: the profiled
budget (peak memory, the fraction's base), weights, activations.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvaudit.parse.metrics import json_document
from kvaudit.reconcile.interface import (Audit, AuditOptions, Formula, FormulaRow, LedgerItem, ModelSummary,
                                         RankLedger, Verdict)
from kvaudit.reconcile.values import as_int


#: the documents asked: the iteration stats (JSON) and the Prometheus page (request metrics only: kept in the
#: record of what the server answers, it sizes nothing)
PATHS = (("/metrics",), ("/prometheus/metrics",))


def _kv_stats(body: str | None) -> dict[str, Any] | None:
    doc = json_document(body)
    if doc is None:
        return None
    stats = doc if isinstance(doc, list) else [doc]
    for it in reversed(stats):  # the latest iteration first
        kv = it.get("kvCacheStats") if isinstance(it, dict) else None
        if isinstance(kv, dict) and as_int(kv.get("maxNumBlocks")) is not None:
            return kv
    return None


def audit_endpoint(documents: Mapping[str, str], url: str, opts: AuditOptions) -> Audit | None:
    kv = _kv_stats(documents.get("/metrics"))
    if kv is None:
        return None
    blocks, per_block = as_int(kv.get("maxNumBlocks")), as_int(kv.get("tokensPerBlock"))
    tokens = blocks * per_block if blocks is not None and per_block else None
    reason = (f"{blocks:,} blocks x {per_block} tokens = {tokens:,} tokens; the budget that sized them (peak "
              "memory, free_gpu_memory_fraction) is in the startup log only" if tokens is not None
              else "kvCacheStats carries no tokensPerBlock")
    logged = tuple((k, float(v)) for k, v in kv.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    ledger = RankLedger(rank=0, label="rank 0", pre_load_free_gib=None, weights_gib=None, kv_gib=None,
                        free_after_weights_gib=None, free_after_pool_gib=None, free_at_end_gib=None,
                        free_at_end_source=None, end_is_final=False,
                        items=(LedgerItem("kv_cache", "KV cache (size not reported)", None, "endpoint"),),
                        unexplained_gib=None, unexplained_tolerance_gib=None,
                        unmodelled=("/metrics gives block counts only",), logged=logged)
    formula = Formula(None, None, None, None, None, None, None, None, None, None, tokens, Verdict.UNKNOWN, reason,
                      rule="live endpoint: tokens = maxNumBlocks x tokensPerBlock", page_size=per_block)
    return Audit(
        engine="trtllm", source=f"{url}/metrics", startup_index=1, startups_total=1, first_line=0, last_line=0,
        engine_version="unknown", version_evidence=(), model=ModelSummary(None, "unknown", None, None, None, None,
                                                                           None, None, None, None),
        formula=formula, ranks=(ledger,), findings=(), speculative=None, hicache_host_gb=None,
        notes=(f"source: the live server's {url}/metrics iteration statistics (no startup log)",
               "not visible from this source: the profiled budget, weights, activations, other ranks"),
        engine_display="TensorRT-LLM (live endpoint)", formula_text="tokens = maxNumBlocks x tokensPerBlock",
        formula_rows=(FormulaRow("maxNumBlocks", float(blocks) if blocks is not None else None, "", "kvCacheStats"),
                      FormulaRow("tokensPerBlock", float(per_block) if per_block else None, "", "kvCacheStats")),
        from_endpoint=True,
    )
