"""The per-GPU ledger for TensorRT-LLM: every GiB of the card's total by what the rank's lines say it holds.

PyTorch backend: weights (inside torch), the profiled activation peak, memory outside torch (NCCL, CUDA
graphs, the CUDA context, other processes; less the temporary KV it held), a multimodal reservation, the KV
cache, and what the fraction left free. C++ runtime: the engine, execution context, runtime buffers, decoder,
the rest of what was used before KV sizing (derived: not itemised by the log), the KV cache, what is left.
"""

from __future__ import annotations

from kvaudit.parse.trtllm import KVAllocation
from kvaudit.reconcile.interface import LedgerItem, RankLedger
from kvaudit.reconcile.trtllm.facts import RankFacts
from kvaudit.units import GIB, LOG_HALF_ULP


def rank_ledger(i: int, rr: RankFacts, fraction: float, final: KVAllocation | None, mm: float,
                self_pool: KVAllocation | None = None) -> RankLedger:
    """``self_pool``: an encoder-decoder model's self-attention cache, allocated before the cross-attention one
    (``final``) was sized, so it is inside that sizing's "used" memory."""
    r = rr.r
    items: list[LedgerItem] = []

    def add(key: str, label: str, gib: float | None, source: str = "log", in_reserve: bool = False,
            line_key: str | None = None) -> None:
        if gib is not None:
            items.append(LedgerItem(key, label, round(gib, 4), source, in_reserve=in_reserve,
                                    line=rr.lines.get(line_key) if line_key else None))

    kv = final.gib if final and final.gib else (r["old_kv_bytes"] / GIB if "old_kv_bytes" in r else None)
    T = r.get("total_gib") or r.get("cpp_total_gib")
    if "peak_gib" in r:  # PyTorch backend
        weights = r.get("weights_in_torch_gib", r.get("weights_gib"))
        add("weights", "weights (inside torch, after loading)", weights, line_key="weights_in_torch_gib")
        add("activation_peak", "activation peak (inside torch, profiled)", r.get("activation_gib"),
            line_key="activation_gib")
        outside = r.get("outside_torch_gib")
        if outside is not None:
            tmp = r.get("tmp_kv_gib", 0.0)
            add("outside_torch", "outside torch (NCCL, CUDA graphs, CUDA context, other processes; after profiling, "
                "less the temporary KV)", outside - tmp, "derived", line_key="outside_torch_gib")
        elif weights is not None and r.get("activation_gib") is not None:
            add("outside_torch", "outside torch (peak - torch peak)", r["peak_gib"] - weights - r["activation_gib"],
                "derived", line_key="peak_gib")
        elif weights is None and r.get("activation_gib") is None:  # only the peak line: its parts are not itemised
            add("profiling_peak", "used at the profiling peak, less the temporary KV (weights, activations, outside "
                "torch; not itemised)", r["peak_gib"] - r.get("tmp_kv_gib", 0.0), "derived", line_key="peak_gib")
        add("multimodal_encoder", "multimodal encoder cache (reserved)", mm or None, line_key="multimodal_gib")
        add("kv_cache", "KV cache", kv)
        if T is not None:
            free = T - r["peak_gib"] + r.get("tmp_kv_gib", 0.0)
            left = free - (kv if kv is not None else fraction * free) - mm
            add("headroom", "headroom (free after profiling, less the KV cache: (1 - fraction) x free when no cap "
                "applies)", left, "derived" if kv is not None else "model", in_reserve=True)
    else:  # C++ runtime
        if "engine_gib" in r:
            add("weights", "engine (weights)", r["engine_gib"], line_key="engine_gib")
        elif "trt_managed_gib" in r:  # no engine-size line: TensorRT's tracker says what it holds (the engine)
            add("weights", "engine (what TensorRT holds after the execution context: the deserialized engine)",
                r["trt_managed_gib"], line_key="trt_managed_gib")
        else:
            add("weights", "weights", r.get("weights_gib"), line_key="weights_gib")
        add("activation_peak", "execution context (activations, fixed at build)", r.get("context_gib"),
            line_key="context_gib")
        add("runtime_buffers", "runtime buffers", r.get("buffers_gib"), line_key="buffers_gib")
        add("decoder", "decoder", r.get("decoder_gib"), line_key="decoder_gib")
        A = r.get("cpp_available_gib")
        own = self_pool.gib if self_pool is not None and self_pool.gib else None
        if T is not None and A is not None:
            logged_before = sum(it.gib for it in items if it.gib is not None) + (own or 0.0)
            add("before_kv_other", "other memory before KV sizing (CUDA context, TensorRT workspace, other processes; "
                "not itemised)", (T - A) - logged_before, "derived", line_key="cpp_available_gib")
        if own is not None:
            add("kv_cache_self", "self-attention KV cache (encoder-decoder: sized first)", own)
        add("kv_cache", "cross-attention KV cache" if own is not None else "KV cache", kv)
        if A is not None:
            add("headroom", "headroom (available less the KV cache: (1 - fraction) x available when no cap applies)",
                A - (kv if kv is not None else fraction * A), "derived" if kv is not None else "model",
                in_reserve=True)
    unexplained = tol = None
    if T is not None and any(it.key == "kv_cache" for it in items) and any(it.key == "headroom" for it in items):
        unexplained = round(T - sum(it.gib for it in items if it.gib is not None), 3)
        tol = round(LOG_HALF_ULP * (len(items) + 1), 3)
    weights_gib = next((it.gib for it in items if it.key == "weights"), None)
    if kv is not None and self_pool is not None and self_pool.gib:
        kv = kv + self_pool.gib  # the GPU holds both caches
    return RankLedger(rank=i, label=rr.rank.display, pre_load_free_gib=T, weights_gib=weights_gib, kv_gib=kv,
                      free_after_weights_gib=None, free_after_pool_gib=None, free_at_end_gib=None,
                      free_at_end_source=None, end_is_final=False, items=tuple(items), unexplained_gib=unexplained,
                      unexplained_tolerance_gib=tol,
                      # a pool line that states no GiB (the C++ runtime's token-only lines) records none, not 0.0
                      logged=tuple(sorted({**r, **({"kv_pool_tokens": final.tokens} if final else {}),
                                           **({"kv_pool_gib": final.gib} if final and final.gib is not None
                                              else {})}.items())))
