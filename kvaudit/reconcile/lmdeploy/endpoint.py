"""LMDeploy audited from its own ``/metrics`` when the startup log is not available.

Upstream (``lmdeploy/metrics/loggers.py``, 0.10+ with ``--enable-metrics``): ``lmdeploy:backend_config`` (a
prometheus ``Info``: the sample ``lmdeploy:backend_config_info`` of value 1 whose labels are the engine config's
fields, strings) and ``lmdeploy:gpu_cache_usage_perc`` (the share of the KV blocks in use). What it establishes: the
settings (cache_max_entry_count, session_len, the block size, quant_policy, tp) and how full the pool is. What it
cannot: the pool's size (no block count is exported), the free memory the ratio applied to, the weights.
"""

from __future__ import annotations

from typing import Mapping

from kvaudit.parse.metrics import first, samples
from kvaudit.reconcile.interface import (Audit, AuditOptions, Formula, FormulaRow, LedgerItem, ModelSummary,
                                         RankLedger, Verdict)
from kvaudit.reconcile.values import as_float, as_int

INFO_METRIC = "lmdeploy:backend_config_info"
USAGE_METRIC = "lmdeploy:gpu_cache_usage_perc"
PATHS = (("/metrics",),)


def audit_endpoint(documents: Mapping[str, str], url: str, opts: AuditOptions) -> Audit | None:
    found = samples(documents.get("/metrics"), ("lmdeploy:backend_config", INFO_METRIC, USAGE_METRIC))
    info, usage = first(found, INFO_METRIC), first(found, USAGE_METRIC)
    if info is None and usage is None:
        return None
    labels = info.labels if info is not None else {}
    ratio = as_float(labels.get("cache_max_entry_count"))
    block = as_int(labels.get("cache_block_seq_len")) or as_int(labels.get("block_size"))
    tp = as_int(labels.get("tp"))
    session = as_int(labels.get("session_len"))
    reason = ("LMDeploy's /metrics exports its settings and how full the KV pool is, not the pool's size: the block "
              "count is in the startup log only")
    notes = [f"source: the live server's {url}/metrics (no startup log)",
             "not visible from this source: the pool's size, the free memory the ratio applied to, the weights"]
    if usage is not None:
        notes.append(f"KV blocks in use now: {usage.value * 100 if usage.value <= 1 else usage.value:.1f} %")
    if session:
        notes.append(f"session_len {session:,}")
    formula = Formula(ratio, "endpoint (lmdeploy:backend_config)" if ratio is not None else None, None, None, None,
                      None, None, None, None, None, None, Verdict.UNKNOWN, reason,
                      rule="live endpoint: settings only", page_size=block)
    ledger = RankLedger(rank=0, label="TP0", pre_load_free_gib=None, weights_gib=None, kv_gib=None,
                        free_after_weights_gib=None, free_after_pool_gib=None, free_at_end_gib=None,
                        free_at_end_source=None, end_is_final=False,
                        items=(LedgerItem("kv_cache", "KV cache (size not reported)", None, "endpoint"),),
                        unexplained_gib=None, unexplained_tolerance_gib=None,
                        unmodelled=("/metrics gives no block count",),
                        logged=tuple((k, v) for k, v in (("cache_max_entry_count", ratio),
                                                         ("gpu_cache_usage", usage.value if usage else None))
                                     if v is not None))
    return Audit(
        engine="lmdeploy", source=f"{url}/metrics", startup_index=1, startups_total=1, first_line=0, last_line=0,
        engine_version="unknown", version_evidence=(),
        model=ModelSummary(None, "unknown", None, None, None, None, None, None, tp, None,
                           attention_tp_size_source="endpoint" if tp else None),
        formula=formula, ranks=(ledger,), findings=(), speculative=None, hicache_host_gb=None, notes=tuple(notes),
        engine_display="LMDeploy (live endpoint)", formula_text="blocks = floor(free x cache_max_entry_count / block)",
        formula_rows=(FormulaRow("cache_max_entry_count", ratio, "", "lmdeploy:backend_config"),
                      FormulaRow("tokens per block", float(block) if block else None, "", "lmdeploy:backend_config")),
        from_endpoint=True,
    )
