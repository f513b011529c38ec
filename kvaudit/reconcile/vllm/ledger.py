"""The per-GPU ledger for vLLM: every GiB of the card's total, by what the worker's lines say it holds.

Inside the budget (total x util): weights (or, 0.29+, weights + non-torch as "consumed"), weights held by
another process (0.32+), the activation peak (0.29+: the printed peak less the graph estimate it holds),
non-torch memory, the CUDA-graph estimate (0.20+), the KV cache. Outside it: the (1 - util) headroom, less
CUDA graphs captured beyond any estimate. ``unexplained`` is what is left of the total.
"""

from __future__ import annotations

from kvaudit.reconcile.interface import LedgerItem, RankLedger
from kvaudit.reconcile.vllm.context import Context
from kvaudit.reconcile.vllm.facts import RankFacts, graph_estimate
from kvaudit.units import LOG_HALF_ULP


def rank_ledger(i: int, rr: RankFacts, ctx: Context, applied: bool, peers: list[RankFacts],
                total: float | None) -> RankLedger:
    r, lines = rr.r, rr.lines
    items: list[LedgerItem] = []
    T = r.get("total_gib")  # this worker's own total: a total recovered from a note is too rough for a ledger

    def add(key: str, label: str, gib: float | None, source: str = "log", in_reserve: bool = False,
            line_key: str | None = None) -> None:
        if gib is not None:
            items.append(LedgerItem(key, label, round(gib, 4), source, in_reserve=in_reserve,
                                    line=lines.get(line_key) if line_key else None))

    est = graph_estimate(rr, T or total, peers) if applied else None
    if "peak_torch_gib" in r and r.get("weights_gib") is not None and r["weights_gib"] <= r["peak_torch_gib"]:
        add("weights", "weights", r["weights_gib"], line_key="weights_gib")
        add("activation_peak", "activation peak (torch peak less weights)", r["peak_torch_gib"] - r["weights_gib"],
            "derived", line_key="peak_torch_gib")
    elif "peak_torch_gib" in r:
        add("torch_peak", "torch peak (weights + activations)", r["peak_torch_gib"], line_key="peak_torch_gib")
    elif "consumed_gib" in r:
        w = r.get("weights_gib")
        if w is not None and w <= r["consumed_gib"]:
            add("weights", "weights", w, line_key="weights_gib")
            add("non_torch", "non-torch memory (consumed less weights)", r["consumed_gib"] - w, "derived",
                line_key="consumed_gib")
        else:
            add("weights", "weights + non-torch memory (consumed)", r["consumed_gib"], line_key="consumed_gib")
    else:
        add("weights", "weights", r.get("weights_gib"), line_key="weights_gib")
    add("weights_external", "weights held outside this process", r.get("external_weights_gib"),
        line_key="external_weights_gib")
    printed = r.get("activation_printed_gib")
    if printed is not None and est is not None and ("consumed_gib" in r or printed >= est.gib):
        add("activation_peak", "activation peak (printed peak less the graph estimate it holds)", printed - est.gib,
            "derived", line_key="activation_printed_gib")
    elif printed is not None:
        add("activation_peak", "activation peak", printed, line_key="activation_printed_gib")
    elif "peak_torch_gib" not in r:
        add("activation_peak", "activation peak", r.get("activation_gib"), line_key="activation_gib")
    if "peak_torch_gib" not in r and "consumed_gib" not in r:
        add("non_torch", "non-torch memory (CUDA context, NCCL, other)", r.get("non_torch_gib"),
            line_key="non_torch_gib")
    elif "peak_torch_gib" in r:
        add("non_torch", "non-torch memory", r.get("non_torch_gib"), line_key="non_torch_gib")
    if est is not None:
        add("graphs_target_estimate", "CUDA graph estimate (reserved in the budget)" if est.gib >= 0 else
            "CUDA graph estimate (negative: memory released while measured, reserves nothing)", est.gib,
            "log" if est.source == "log" else "derived")
    add("kv_cache", "KV cache", r.get("kv_gib"), line_key="kv_gib")
    captured = r.get("graph_gib")
    if captured is not None and captured < 0:
        captured = None  # capture_model's free-before minus free-after: memory released, not a size
    reserved = max(0.0, est.gib) if est is not None else None  # a negative estimate reserved nothing
    beyond = captured if reserved is None else (max(0.0, captured - reserved) if captured is not None else None)
    if beyond:
        add("graphs_target_decode", "CUDA graphs (captured after the KV cache" +
            (", beyond the estimate)" if est is not None else ")"), beyond, in_reserve=True, line_key="graph_gib")
    unexplained = tol = None
    if T is not None and ctx.util is not None:
        head = T * (1 - ctx.util) - (beyond or 0.0)
        items.append(LedgerItem("headroom", "headroom ((1 - util) x total, outside the budget, less graphs)",
                                round(head, 3), "model", in_reserve=True))
        if any(it.key == "kv_cache" for it in items):
            unexplained = round(T - sum(it.gib for it in items if it.gib is not None), 3)
            tol = round(LOG_HALF_ULP * (len(items) + 1), 3)
    weights = [it.gib for it in items if it.key in ("weights", "weights_external") and it.gib is not None]
    return RankLedger(
        rank=i, label=rr.rank.display, pre_load_free_gib=T,
        weights_gib=sum(weights) if weights else None, kv_gib=r.get("kv_gib"),
        free_after_weights_gib=None, free_after_pool_gib=None, free_at_end_gib=None, free_at_end_source=None,
        end_is_final=False, items=tuple(items), unexplained_gib=unexplained, unexplained_tolerance_gib=tol,
        logged=tuple(sorted(r.items())),
    )
