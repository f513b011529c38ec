"""SGLang audited from its own ``/server_info`` when the startup log is not available.

Upstream: ``srt/managers/scheduler.py::Scheduler.get_internal_state`` (``memory_usage``: ``weight`` =
``model_runner.weight_load_mem_usage``, ``kvcache`` = ``token_to_kv_pool.mem_usage``, ``token_capacity`` =
``max_total_num_tokens``; from 0.4.9; ``graph``/``cuda_graph`` and ``startup_available`` in later releases),
served by ``srt/entrypoints/http_server.py`` at ``/server_info`` (``/get_server_info`` before the rename), one
``internal_states[]`` entry per DP group, from its attention-TP rank 0. GiB (``/ (1 << 30)``), rounded by
``round(x, 2)`` (some builds 3 decimals): each value stands for +-0.005 GiB.

What the endpoint establishes, and what it cannot:
* the pool: ``kvcache`` GiB holds ``(token_capacity + page_size)`` rows of the per-rank cell (the pool's
  padding rows), so tokens x bytes per token = KV bytes is rerun exactly, to the rounding;
* the budget: SGLang's ``rest = post - (1 - mfs) x T`` with ``post ~= T - weight`` gives
  ``weight + kvcache ~= mfs x T``: with ``startup_available`` (T) the difference is what else the budget paid
  for (another pool, memory taken between T and the weights); without it T is only estimated;
* not visible: the other ranks of a DP group (per-rank imbalance), free memory after the weights or at the end
  of startup, the static reserve's items. The ledger says so instead of guessing.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from kvaudit.parse.metrics import json_document
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import (Audit, AuditOptions, Finding, Formula, FormulaRow, LedgerItem,
                                         ModelSummary, RankLedger, TokenInterval, Verdict)
from kvaudit.reconcile.sglang.cell import cell_size, element_bytes
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.units import GIB
from kvaudit.versions import VersionRange, parse_version

#: the document read, at the paths it has been served at (newest first)
PATHS = (("/server_info", "/get_server_info"),)
#: the half-width of a value rounded to 2 decimals (3-decimal builds fall inside it)
HALF_ULP = 0.005
#: the fields of /server_info that are state, not server arguments
_NOT_ARGS = ("internal_states", "version", "last_gen_throughput", "memory_usage")


def server_info(body: str | None) -> dict[str, Any] | None:
    """The parsed document when it is SGLang's (it has ``internal_states`` or the server arguments)."""
    doc = json_document(body)
    if not isinstance(doc, dict) or not ("internal_states" in doc or "mem_fraction_static" in doc):
        return None
    return doc


def audit_endpoint(documents: Mapping[str, str], url: str, opts: AuditOptions) -> Audit | None:
    """The audit of a live SGLang server from its documents (path -> body), None when they are not SGLang's."""
    doc = next((d for d in (server_info(documents.get(p)) for p in PATHS[0]) if d is not None), None)
    if doc is None:
        return None
    args = {k: v for k, v in doc.items() if k not in _NOT_ARGS}
    states = [s for s in doc.get("internal_states") or [] if isinstance(s, dict)]
    usages: list[dict[str, Any]] = [u if isinstance(u := s.get("memory_usage"), dict) else {} for s in states]
    version = doc.get("version") if isinstance(doc.get("version"), str) else None
    era = _era(version)
    mfs = opts.mem_fraction_static or as_float(args.get("mem_fraction_static"))
    page = as_int(args.get("page_size")) or 1
    tp, dp = as_int(args.get("tp_size")) or 1, as_int(args.get("dp_size")) or 1
    attn_tp = max(1, tp // dp if args.get("enable_dp_attention") and dp > 1 else tp)
    kv_dtype, kv_elt = _kv_dtype(args, opts)
    geom = opts.model_geometry
    cell = None
    if geom is not None and kv_elt:
        cell = cell_size(geom, era, attn_tp, kv_elt)

    notes = [
        f"source: the live server's {url}/server_info (no startup log): numbers as the server reports them now",
        "not visible from this source: the other ranks of each DP group (only attention-TP rank 0 reports, so "
        "per-rank imbalance cannot be seen), free memory after the weights and at the end of startup, and the "
        "static reserve's items",
        "SGLang rounds these figures to 2 decimals: each stands for +-0.005 GiB",
    ]
    findings: list[Finding] = []
    ledgers: list[RankLedger] = []
    for i, u in enumerate(usages):
        ledgers.append(_ledger(i, dp, u))
    first = usages[0] if usages else {}
    weight, kv = as_float(first.get("weight")), as_float(first.get("kvcache"))
    tokens = as_int(first.get("token_capacity"))
    T = as_float(first.get("startup_available"))

    predicted = None
    verdict, reason = Verdict.UNKNOWN, ""
    implied = None
    if kv is not None and tokens:
        implied = kv * GIB / (tokens + page)
    if cell is not None and kv is not None and tokens is not None:
        lo = math.floor((kv - HALF_ULP) * GIB / cell.pool) - page
        hi = math.floor((kv + HALF_ULP) * GIB / cell.pool) - page
        predicted = TokenInterval(max(0, lo), max(0, hi))
        if predicted.contains(tokens):
            verdict = Verdict.MATCH
            reason = (f"{tokens:,} tokens lie in {predicted.low:,}..{predicted.high:,}: the {kv:.2f} GiB pool "
                      f"over {cell.pool:,} B per token ({cell.description}), less {page} padding row(s)")
        else:
            verdict = Verdict.MISMATCH
            # a capacity of 0 tokens implies no bytes per token (implied is None): the server reports a pool it
            # cannot hold a token in
            reason = (f"{tokens:,} tokens do not fit the {kv:.2f} GiB pool at {cell.pool:,} B per token "
                      f"({predicted.low:,}..{predicted.high:,}); " + (
                          f"the pool implies {implied:,.0f} B per token: another KV dtype, TP split, or model than "
                          "the config says" if implied is not None else
                          "the server reports no token capacity for a pool of that size"))
    else:
        missing = [m for m, ok in (("the model's config.json (--model-config)", geom is not None),
                                   ("the KV dtype", kv_elt is not None),
                                   ("memory_usage in /server_info (SGLang 0.4.9+)", kv is not None and bool(tokens)))
                   if not ok]
        reason = "cannot rerun tokens x bytes per token = KV bytes: missing " + ", ".join(missing)

    budget_rows: list[FormulaRow] = []
    reserve = rest = None
    if mfs and weight is not None and kv is not None:
        if T is not None:
            reserve = (1 - mfs) * T
            other = mfs * T - weight - kv
            budget_rows.append(FormulaRow("mfs x T - weight - kvcache (else in the budget)", other, "GiB",
                                          "another pool (Mamba state, draft KV) or memory taken between T and "
                                          "the weights; +-0.01 from the rounding"))
            if other < -3 * HALF_ULP * (1 + mfs):
                findings.append(F.live_budget_exceeded(-other, mfs, T))
        else:
            t_est = (weight + kv) / mfs
            budget_rows.append(FormulaRow("T estimated = (weight + kvcache) / mfs", t_est, "GiB",
                                          "an estimate: assumes the budget paid for nothing else"))
            notes.append(f"T is not reported by this server version (startup_available, later releases): "
                         f"estimated {t_est:.2f} GiB from weight + kvcache = mfs x T")
    check_text = None
    if verdict == Verdict.MATCH and tokens is not None and predicted is not None and cell is not None:
        # the worked formula: kvaudit.verdict raises TOKENS_MATCH from it (rule 6)
        check_text = (f"the {kv:.2f} GiB pool over {cell.pool:,} B per token ({cell.description}), less {page} "
                      "padding row(s)")
    elif verdict == Verdict.MISMATCH and tokens is not None:
        findings.append(F.live_pool_mismatch(tokens, predicted, implied, cell.pool if cell else None))

    formula = Formula(
        mem_fraction_static=mfs, mem_fraction_static_source="cli" if opts.mem_fraction_static else
        ("server_info" if mfs else None),
        pre_load_free_gib=T, pre_load_free_source="server_info startup_available" if T is not None else None,
        post_load_free_gib=None, reserve_gib=reserve, rest_gib=rest,
        bytes_per_token=cell.pool if cell else None, bytes_per_token_source="config" if cell else None,
        predicted_tokens=predicted, logged_tokens=tokens, verdict=verdict, verdict_reason=reason,
        rule="live endpoint: kvcache = (tokens + page) x bytes per token", page_size=page,
        kv_bytes_per_token_logged=round(implied, 1) if implied else None, check_text=check_text,
    )
    rows = (
        FormulaRow("weight (rank 0 of DP group 0)", weight, "GiB", "server_info memory_usage"),
        FormulaRow("kvcache", kv, "GiB", "server_info memory_usage"),
        FormulaRow("token_capacity", float(tokens) if tokens is not None else None, "", "server_info"),
        FormulaRow("T (startup_available)", T, "GiB", "server_info" if T is not None else "not reported"),
        FormulaRow("mem_fraction_static", mfs, "", formula.mem_fraction_static_source or ""),
    ) + tuple(budget_rows)
    model = ModelSummary(
        geom.architecture if geom else None, ("mla" if geom.is_mla else "mha") if geom else "unknown",
        geom.num_layers if geom else None, geom.num_kv_heads if geom else None,
        (None if geom.is_mla else max(1, (geom.num_kv_heads or 1) // attn_tp)) if geom else None,
        geom.head_dim if geom else None, kv_dtype, kv_elt, attn_tp, geom.source if geom else None,
        attention_tp_size_source="server_info tp_size/dp_size",
    )
    return Audit(
        engine="sglang", source=f"{url}/server_info", startup_index=1, startups_total=1, first_line=0,
        last_line=0, engine_version=version or "unknown",
        version_evidence=(f"server_info version {version}",) if version else (),
        model=model, formula=formula, ranks=tuple(ledgers), findings=tuple(findings),
        speculative=args.get("speculative_algorithm") if isinstance(args.get("speculative_algorithm"), str) else None,
        hicache_host_gb=None, notes=tuple(notes), engine_display="SGLang (live endpoint)",
        formula_text="kvcache = (token_capacity + page) x bytes per token;  weight + kvcache ~= mfs x T",
        formula_rows=rows, pre_load_label="free before loading (startup_available)", from_endpoint=True,
    )


def _era(version: str | None) -> VersionRange:
    if version:
        try:
            v = parse_version(version)[:3]
            return VersionRange(v, v, (f"server_info version {version}",))
        except ValueError:
            pass
    return VersionRange((0, 4, 9), None, ("memory_usage in /server_info (0.4.9+)",))


def _kv_dtype(args: dict[str, Any], opts: AuditOptions) -> tuple[str | None, float | None]:
    want = opts.kv_cache_dtype or args.get("kv_cache_dtype")
    if isinstance(want, str) and want != "auto" and element_bytes(want):
        return want, element_bytes(want)
    geom = opts.model_geometry
    if geom is not None and geom.kv_cache_quant_algo and geom.kv_cache_quant_algo.upper() == "FP8":
        return "fp8_e4m3 (checkpoint kv_cache_quant_algo)", 1
    dtype = args.get("dtype")
    if isinstance(dtype, str) and dtype != "auto" and element_bytes(dtype):
        elt = element_bytes(dtype)
        return f"auto ({dtype})", 2 if elt == 4 else elt
    if geom is not None and geom.torch_dtype:
        return f"auto ({geom.torch_dtype})", 2 if geom.dtype_bytes == 4 else geom.dtype_bytes
    return None, None


def _ledger(i: int, dp: int, u: dict[str, Any]) -> RankLedger:
    weight, kv = as_float(u.get("weight")), as_float(u.get("kvcache"))
    T = as_float(u.get("startup_available"))
    items = [LedgerItem("weights", "weights", weight, "endpoint"),
             LedgerItem("kv_cache", "KV cache", kv, "endpoint")]
    graph = u.get("graph", u.get("cuda_graph"))
    if isinstance(graph, dict):
        for phase, g in graph.items():
            if as_float(g) is not None:
                items.append(LedgerItem(f"graphs_target_{phase}", f"CUDA graphs ({phase})", as_float(g), "endpoint",
                                        True))
    elif as_float(graph) is not None:
        items.append(LedgerItem("graphs_target_decode", "CUDA graphs", as_float(graph), "endpoint", True))
    label = f"DP{i} TP0" if dp > 1 else "TP0"
    logged = tuple((k, float(v)) for k, v in u.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v))
    return RankLedger(
        rank=i, label=label, pre_load_free_gib=T, weights_gib=weight, kv_gib=kv, free_after_weights_gib=None,
        free_after_pool_gib=None, free_at_end_gib=None, free_at_end_source=None, end_is_final=False,
        items=tuple(items), unexplained_gib=None, unexplained_tolerance_gib=None,
        unmodelled=("the endpoint reports weights, KV cache and graphs only: activations, the request table, "
                    "NCCL and the draft model are not in it",),
        logged=logged,
    )
