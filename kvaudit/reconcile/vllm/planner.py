"""kvaudit plan for vLLM: the KV pool of a deployment that does not exist yet, by vLLM's own budget (formula.py)::

    available_kv = total x gpu_memory_utilization - (weights + activation peak + non-torch) [- CUDA graph estimate]
    blocks = floor(available_kv / (block_size x bytes per token)),  tokens = blocks x block_size

(V0 ``worker/worker.py::determine_num_available_blocks`` 0.6.5-0.10, V1
``v1/worker/gpu_worker.py::determine_available_memory`` 0.9.1+; the graph estimate from 0.20, when
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` became the default). The total is the card's as CUDA reports it; the
weights are the checkpoint's per rank (or what the history's startups logged for this model); what the budget holds
besides the weights and the pool (the activation peak of the profiling run, non-torch memory, the graph estimate)
comes from the history's startups of this model, else is assumed with the ranges the corpus' startups span. The
bytes per token are vLLM's own ``cell_size``; the utilisation is --fraction or the release's default.

It starts when (``v1/core/kv_cache_utils.py::check_enough_kv_cache_memory``) the pool holds one request of
max_model_len tokens, and (``gpu_worker.py::init_device``) the free memory at start is at least total x util.
"""

from __future__ import annotations

import math
from typing import Any

from kvaudit.planning import calibrate
from kvaudit.planning import terms as shared
from kvaudit.planning.model import ASSUMED, CALIBRATED, FORMULA, GIVEN, Plan, PlanInput, Term
from kvaudit.planning.terms import weakest
from kvaudit.reconcile.vllm.cell import cell_size
from kvaudit.reconcile.vllm.context import DEFAULT_BLOCK, default_utilization
from kvaudit.units import GIB, Interval
from kvaudit.versions import VersionRange

#: the ranges the corpus' and the samples' vLLM startups span (docs/plan.md, "vLLM"): the activation peak of the
#: profiling run 0.24-6.30 GiB, non-torch memory 0.09-1.79 GiB on one GPU (vllm_c010) and up to 7.33 GiB on two
#: (vllm_c013: custom all-reduce and NCCL buffers), the CUDA-graph estimate 0.10-1.69 GiB
ACTIVATION_GIB = (0.2, 6.5)
NON_TORCH_GIB = {1: (0.05, 2.0), 2: (0.1, 7.5)}  # one rank, several
GRAPH_ESTIMATE_GIB = (0.05, 2.0)
#: what is in use before vLLM compares the free memory with total x util: the CUDA context and torch's own
CONTEXT_GIB = (0.25, 0.6)


def plan(inp: PlanInput, history: Any = None) -> Plan:
    version = shared.release(inp, (0, 6, 5), "kvaudit plan sizes vLLM 0.6.5+ (0.6.4 and earlier budget the torch "
                             "peak and count other processes)")
    era = VersionRange(version, version)
    geom = inp.geometry
    given_cell = shared.replayed_or_config(inp)
    notes: list[str] = []
    total = shared.cuda_total(inp, history, "vLLM")
    default = default_utilization(era)[0]
    util = shared.fraction(inp, "gpu_memory_utilization", None if default is None else (
        default, f"vLLM {inp.version}'s default (vllm/config/cache.py CacheConfig.gpu_memory_utilization)"))
    weights = shared.weights(inp, history, logged=True)
    besides = _besides(inp, history, version)
    u = util.lo
    requested = Interval(total.lo * u, total.hi * u)
    available = requested - Interval(weights.lo, weights.hi) - Interval(besides.lo, besides.hi)
    if given_cell is not None:
        cell, how, cell_kind = given_cell, "the replayed startup's own", GIVEN
    else:
        assert geom is not None
        cell, how = cell_size(geom, inp.tp, shared.kv_element(inp), inp.pp, split_v=version >= (0, 14, 0))
        how, cell_kind = f"vLLM {inp.version} cell_size: {how}", FORMULA
    if geom is not None and (geom.is_hybrid_swa or geom.is_mamba_hybrid):
        notes.append("a hybrid model (sliding-window or state-space layers): vLLM's grouped pool is not modelled by "
                     "plan; the tokens are the attention cell's")
    block = inp.page_size or DEFAULT_BLOCK
    lo, hi = shared.blocks_to_tokens(available, cell, block)
    if version >= (0, 21, 0):
        notes.append("vLLM 0.21+ reports int(max concurrency x max_model_len), within a block of the blocks' tokens")
    length = inp.context_length or (geom.max_position_embeddings if geom is not None else None)
    if inp.context_length is None and length:
        notes.append(f"max_model_len {length:,}: the model's max_position_embeddings (vLLM's default; give "
                     "--context-length for --max-model-len)")
    out = [total, util,
           Term("requested_gib", "budget (total x utilisation)", requested.lo, requested.hi, "GiB",
                weakest(total.kind, util.kind), "formula"),
           weights, besides,
           Term("bytes_per_token", "KV bytes per token per rank (cell)", cell, cell, "B", cell_kind, how),
           Term("rest_gib", "available KV cache memory", available.lo, available.hi, "GiB",
                weakest(total.kind, weights.kind, besides.kind), "formula: budget - weights - the rest it holds")]
    starts, why = shared.pool_starts(available, lo, hi, length, "vLLM raises ValueError: not enough KV cache "
                                     "memory for one request of max_model_len", context_fatal=True)
    ctx_lo, ctx_hi = CONTEXT_GIB
    headroom = Interval(total.lo * (1 - u), total.hi * (1 - u))
    if starts != "no" and headroom.hi < ctx_lo:
        starts, why = "no", (f"the free memory at start (total less the CUDA context, {ctx_lo}-{ctx_hi} GiB) is below "
                             "total x utilisation: vLLM raises ValueError (Free memory on device ... is less than "
                             "desired GPU memory utilization)")
    elif starts == "yes" and headroom.lo < ctx_hi:
        starts, why = "at risk", "total x utilisation leaves less than a CUDA context's memory outside the budget"
    need = (length or block) * cell / GIB
    smallest = math.ceil((weights.hi + besides.hi + need) / total.lo * 1000) / 1000
    largest = math.floor((1 - ctx_hi / total.lo) * 1000) / 1000
    kv_lo, kv_hi = lo * cell / GIB, hi * cell / GIB
    return Plan(inp, tuple(out), lo, hi, round(kv_lo, 3), round(kv_hi, 3),
                shared.concurrency(lo, hi, length, inp.max_running_requests), None, starts, why,
                smallest if smallest < 1 else None, largest,
                "vLLM: total x util - (weights + activation peak + non-torch"
                + (" + CUDA graph estimate)" if version >= (0, 20, 0) else ")")
                + f"; floor(KV / ({block} x bytes per token)) x {block}",
                tuple(notes), block_size=block,
                largest_fraction_reason="the largest that leaves the CUDA context outside the budget (vLLM's "
                                        "free-memory check at start)")


def _besides(inp: PlanInput, history: Any, version: tuple[int, ...]) -> Term:
    """What the budget holds besides the weights and the pool: the history's, else the corpus' ranges."""
    label = "activation peak + non-torch" + (" + CUDA graph estimate" if version >= (0, 20, 0) else "")
    obs = calibrate.budget_besides_weights(history, inp)
    if obs is not None:
        return Term("besides_gib", label, max(0.0, obs.lo), obs.hi, "GiB", CALIBRATED, obs.basis)
    parts = [ACTIVATION_GIB, NON_TORCH_GIB[1 if inp.tp * inp.pp == 1 else 2]]
    words = (f"activation peak {ACTIVATION_GIB[0]}-{ACTIVATION_GIB[1]} GiB, non-torch {parts[1][0]}-{parts[1][1]} GiB "
             f"({'one rank' if inp.tp * inp.pp == 1 else 'several ranks: NCCL and custom all-reduce buffers'})")
    if version >= (0, 20, 0):
        parts.append(GRAPH_ESTIMATE_GIB)
        words += f", CUDA graph estimate {GRAPH_ESTIMATE_GIB[0]}-{GRAPH_ESTIMATE_GIB[1]} GiB"
    return Term("besides_gib", label, sum(p[0] for p in parts), sum(p[1] for p in parts), "GiB", ASSUMED,
                words + ": the ranges the corpus' vLLM startups span; no startup of this model in the history")
