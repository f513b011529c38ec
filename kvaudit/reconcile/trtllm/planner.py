"""kvaudit plan for TensorRT-LLM's PyTorch backend (0.19+): the KV pool of a deployment that does not exist yet.

``_torch/pyexecutor/_util.py::KvCacheCreator.configure_kv_cache_capacity`` (earlier ``estimate_max_tokens``)::

    available_kv = (total - peak + temporary KV) x free_gpu_memory_fraction
    tokens = ceil(floor(available_kv / bytes per token) / tokens_per_block) x tokens_per_block

The fraction multiplies what the profiling run leaves free, not the total. ``peak - temporary KV`` is what stays
in use besides the pool: the weights, the profiling run's activations, CUDA graphs warmed up at the temporary
size, NCCL and cuBLAS workspaces, the CUDA context. The history's startups of this model give it (total - free
after profiling); else the weights per rank (the checkpoint) plus an assumed range for the rest.
``free_gpu_memory_fraction`` defaults to 0.9 (``kDefaultGpuMemFraction``; ``KvCacheConfig``), tokens_per_block
to 32; --max-total-tokens is ``KvCacheConfig.max_tokens`` (the smaller wins).
"""

from __future__ import annotations

import math
from typing import Any

from kvaudit.planning import calibrate
from kvaudit.planning import terms as shared
from kvaudit.planning.model import ASSUMED, CALIBRATED, FORMULA, GIVEN, Plan, PlanInput, Term
from kvaudit.planning.terms import weakest
from kvaudit.reconcile.trtllm.cell import cell_size
from kvaudit.units import GIB, Interval

DEFAULT_FRACTION = 0.9  # cpp/include/tensorrt_llm/executor/executor.h kDefaultGpuMemFraction; KvCacheConfig
DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block
#: besides the weights, what the profiling run leaves in use (activations, CUDA graphs, NCCL, cuBLAS, the CUDA
#: context), when no startup of the model says: assumed, wide (docs/plan.md, "TensorRT-LLM")
PROFILING_REST_GIB = (0.8, 6.0)


def estimate_undercount(inp: PlanInput, cell: float) -> tuple[int, float] | None:
    """(the estimate's bytes per token, pool bytes / those) when the KV size estimate counts fewer bytes a token than
    the pool holds, else None. The estimate (``_util.py KvCacheCreator._get_cache_size_per_token``, later
    ``KVCacheManager.get_cache_size_per_token``) counts ``head_dim x num_key_value_heads // tp_size`` per layer; the
    pool (``KVCacheManager.__init__``) holds ``ceil(num_kv_heads / tp_size)`` heads per rank: when TP exceeds the KV
    heads they are replicated and the estimate is short by TP / KV heads. MLA and attention DP count no TP split."""
    geom = inp.geometry
    if geom is None or geom.is_mla or inp.dp_attention > 1 or not geom.num_kv_heads or not geom.head_dim:
        return None
    if inp.bytes_per_token is not None or inp.tp <= 1:
        return None
    elt = shared.kv_element(inp)
    est = int(2 * geom.num_layers * (geom.head_dim * geom.num_kv_heads // inp.tp) * elt)
    if est <= 0 or est >= cell:
        return None
    return est, cell / est


#: the newest TensorRT-LLM release kvaudit models (its minor series): parse/trtllm.py's newest log shape is 1.2's;
#: a later release is refused by name rather than planned by 1.2's rules
NEWEST_MODELLED = (1, 2)

def plan(inp: PlanInput, history: Any = None) -> Plan:
    shared.release(inp, (0, 19, 0), "kvaudit plan sizes the PyTorch backend (0.19+); a TensorRT engine's activation "
                   "buffers are the built engine's own", caps=True, newest=NEWEST_MODELLED,
                   newest_basis="the newest whose log lines it reads, parse/trtllm.py")
    geom = inp.geometry
    given_cell = shared.replayed_or_config(inp)
    notes: list[str] = []
    total = shared.cuda_total(inp, history, "TensorRT-LLM")
    frac = shared.fraction(inp, "free_gpu_memory_fraction", (DEFAULT_FRACTION, "TensorRT-LLM's default "
                                                             "(kDefaultGpuMemFraction, KvCacheConfig)"))
    used_obs = calibrate.weight_memory(history, inp)  # total - free after profiling
    out: list[Term] = [total, frac]
    if used_obs is not None:
        used = Term("profiling_used_gib", "in use after profiling (weights, activations, graphs, NCCL)",
                    used_obs.lo, used_obs.hi, "GiB", CALIBRATED, used_obs.basis)
        out.append(used)
    else:
        weights = shared.weights(inp, history)
        rest = Term("profiling_rest_gib", "besides the weights: activations, CUDA graphs, NCCL, the CUDA context",
                    *PROFILING_REST_GIB, "GiB", ASSUMED, "assumed: no startup of this model in the history")
        used = shared.sum_terms("profiling_used_gib", "in use after profiling", [weights, rest], "weights + the rest")
        out += [weights, rest, used]
    free = shared.interval(total) - shared.interval(used)
    out.append(Term("post_load_free_gib", "free after profiling (total - peak + temporary KV)", free.lo, free.hi,
                    "GiB", weakest(total.kind, used.kind), "formula"))
    available = free.scale(frac.lo)
    if given_cell is not None:
        cell, how, cell_kind = given_cell, "the replayed startup's own", GIVEN
    else:
        assert geom is not None
        cell, how = cell_size(geom, inp.tp, shared.kv_element(inp))
        how, cell_kind = f"KVCacheManager.get_cache_bytes_per_token: {how}", FORMULA
    out.append(Term("bytes_per_token", "KV bytes per token per rank", cell, cell, "B", cell_kind, how))
    if inp.max_total_tokens:
        cap = inp.max_total_tokens * cell / GIB
        available = Interval(min(available.lo, cap), min(available.hi, cap))
        out.append(Term("max_tokens_gib", "max_tokens x bytes per token (the smaller wins)", cap, cap, "GiB", GIVEN,
                        "--max-total-tokens"))
    out.append(Term("rest_gib", "KV budget (free x fraction)", available.lo, available.hi, "GiB",
                    weakest(total.kind, used.kind), "formula"))
    if geom is not None and (geom.is_hybrid_swa or geom.is_mamba_hybrid):
        notes.append("a hybrid model (sliding-window or state-space layers): the split of the pool by window is not "
                     "modelled by plan; the tokens are the full-attention cell's")
    block = inp.page_size or DEFAULT_TOKENS_PER_BLOCK
    lo = math.ceil(math.floor(max(0.0, available.lo) * GIB / cell) / block) * block
    hi = math.ceil(math.floor(max(0.0, available.hi) * GIB / cell) / block) * block
    starts, why = shared.pool_starts(available, lo, hi, inp.context_length, "the KV cache manager gets no blocks",
                                     context_fatal=False)
    under = estimate_undercount(inp, cell)
    if under is not None and starts != "no":
        est_cell, ratio = under
        out.append(Term("estimate_bytes_per_token", "KV bytes per token the size estimate counts (per rank)", est_cell,
                        est_cell, "B", FORMULA, f"head_dim x KV heads // TP: {ratio:.2f}x fewer than the pool holds"))
        if inp.fraction is None:
            need = Interval(available.lo * ratio, available.hi * ratio)
            if need.hi > free.lo:
                starts, why = "at risk", (
                    f"TP {inp.tp} replicates the model's {geom.num_kv_heads if geom else '?'} KV heads, and the size "
                    f"estimate counts head_dim x KV heads // TP ({est_cell:,} B a token, _util.py "
                    f"_get_cache_size_per_token / KVCacheManager.get_cache_size_per_token) where the pool holds "
                    f"ceil(KV heads / TP) heads ({cell:,} B): its max_tokens asks for {ratio:.2f} x the budget, "
                    f"{need.lo:.1f}-{need.hi:.1f} GiB against {free.lo:.1f}-{free.hi:.1f} GiB free. Only a "
                    "free_gpu_memory_fraction that is set caps the final pool at fraction x free memory "
                    "(resource_manager.py calculate_max_num_blocks); unset (None: a kv_cache_config from "
                    "--extra_llm_api_options without it, which replaces trtllm-serve's 0.9) the KV cache fails "
                    "to be created (insufficient GPU memory); give --fraction (free_gpu_memory_fraction)")
        else:
            notes.append(f"TP {inp.tp} replicates the KV heads: the size estimate counts {est_cell:,} B a token "
                         f"where the pool holds {cell:,} B, so its 'Estimated max tokens' is {ratio:.2f} x the pool; "
                         "the free_gpu_memory_fraction that is set caps the pool (calculate_max_num_blocks)")
    smallest = None
    if inp.context_length and free.lo > 0:
        smallest = math.ceil(inp.context_length * cell / GIB / free.lo * 1000) / 1000
    return Plan(inp, tuple(out), lo, hi, round(lo * cell / GIB, 3), round(hi * cell / GIB, 3),
                shared.concurrency(lo, hi, inp.context_length, inp.max_running_requests), None, starts, why,
                smallest if smallest is not None and smallest < 1 else None, None,
                f"TensorRT-LLM (PyTorch): (total - peak + temporary KV) x fraction; ceil(floor(KV / bytes per token) / "
                f"{block}) x {block}", tuple(notes), block_size=block)
