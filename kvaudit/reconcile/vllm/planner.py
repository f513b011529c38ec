"""kvaudit plan for vLLM: the KV pool of a deployment that does not exist yet, by vLLM's own budget (formula.py)::

    available_kv = total x gpu_memory_utilization - (weights + activation peak + non-torch) [- CUDA graph estimate]
    blocks = floor(available_kv / (block_size x bytes per token)),  tokens = blocks x block_size

(V0 ``worker/worker.py::determine_num_available_blocks`` 0.6.5-0.10, V1
``v1/worker/gpu_worker.py::determine_available_memory`` 0.9.1+; the graph estimate from 0.20, when
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` became the default). The total is the card's as CUDA reports it; the
weights are the checkpoint's per rank (or what the history's startups logged for this model); what the budget holds
besides the weights and the pool comes from the history's startups of this model at this number of ranks, else
from what the release's profile run does (``profile_run``): the activation peak as max(the dummy batch's forward,
the sampler over the vocabulary), by the batch the release sets for the card (V1 from 0.8, V0 before), non-torch
memory by release and ranks, the graph estimate from 0.20 (assumed). The bytes per token are vLLM's own
``cell_size``; the utilisation is --fraction or the release's default.

It starts when (``v1/core/kv_cache_utils.py::check_enough_kv_cache_memory``) the pool holds one request of
max_model_len tokens, and (``gpu_worker.py::init_device``) the free memory at start is at least total x util; before
0.20 the CUDA graphs captured after the KV cache (``compile_or_warm_up_model``) must also fit outside the budget.
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

#: What the budget holds besides the weights and the pool, when no startup of the model is in the history, is
#: modelled from what the release's profile run does (``profile_run``: one dummy batch of max_num_batched_tokens
#: through the model, then the sampler over min(max_num_seqs, max_num_batched_tokens) rows of logits):
#:   activation peak = max(forward, sampler)
#:   forward = max_num_batched_tokens x (3 x MLP width per rank + 3 x hidden) x the dtype's bytes
#:     (the gate/up output, the activation's output and a few hidden-sized buffers live at once; read against
#:     vllm_c014/c015: 0.92 GiB more peak for 9,000 more tokens of Llama-3.1-8B = 109.8 KB a token)
#:   sampler = rows x vocab_size x SAMPLER_BYTES. PyTorch's top-k/top-p (topk_topp_sampler.forward_native: the
#:     bf16 logits, their float32 copy, the sort's values and int64 indices, the softmax and its masks) about
#:     39 B an element: calibrated on llm-d's 0.11.0 Llama-3.1-8B (4.76 GiB) and Qwen3-32B (5.64 GiB) at 1,024
#:     rows, 41 B in V0 0.6.5 (vllm_c010), up to 48 B in V0 0.7.3 (vllm_c006). FlashInfer's (forward_cuda, V1's
#:     default when FlashInfer is installed: top_k_top_p_sampling_from_logits, no sort) holds the bf16 logits,
#:     their float32 copy, the masked logits and the probabilities: 8-16 B an element, read in the code. Which
#:     one runs is an installation fact (--sampler); not known, the range spans both.
#:   From 0.17 the native path sorts no more for 8 rows or more (v1/sample/ops/topk_topp_triton.py, new in
#:     0.17.0, absent from 0.16.0's wheel: apply_top_k_top_p_triton masks the float32 logits in place with a
#:     per-SM buffer): it holds the bf16 logits, their float32 copy (sampler.py: logits.to(torch.float32)), the
#:     float32 probabilities and random_sample's float32 exponential draw: 10-16 B an element, read in the code;
#:     FlashInfer's sampler became opt-in (VLLM_USE_FLASHINFER_SAMPLER=1) in the same releases. So from 0.17 both
#:     paths hold 8-16 B and the sampler need not be known. Which path runs unsaid: FLASHINFER_OPT_IN_SINCE.
#: These are the calibration set's (bench/plan_cases.json, the corpus); bench/plan_validation.json never set them.
FORWARD_WIDTHS = 3  # x (MLP width per rank + hidden), per token
TRITON_SAMPLER = "native, Triton top-k/top-p (0.17+)"
SAMPLER_BYTES = {"v0": (39.0, 48.0), "native": (37.0, 41.0), "flashinfer": (8.0, 16.0), TRITON_SAMPLER: (10.0, 16.0)}
TRITON_SAMPLER_SINCE = (0, 17, 0)
#: which sampler runs when --sampler is not given: 0.8-0.11 use FlashInfer's whenever the flashinfer package (0.2.3+) is
#: installed (v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: VLLM_USE_FLASHINFER_SAMPLER None means on,
#: read in 0.10.1.1 and 0.11.0), an installation fact; from 0.12.0 FlashInfer's is opt-in ("Users must opt in
#: explicitly via VLLM_USE_FLASHINFER_SAMPLER=1", read in 0.12.0, 0.13.0, 0.14.0, 0.15.0, 0.16.0 and 0.19.0), so the
#: native path runs: PyTorch's sort before 0.17, the Triton top-k/top-p from 0.17
FLASHINFER_OPT_IN_SINCE = (0, 12, 0)
#: without the model's sizes (a config.json of the KV fields only): the ranges the corpus' startups span
ACTIVATION_GIB = (0.2, 6.5)
#: non-torch memory (NCCL and custom all-reduce buffers, cuBLAS workspaces) by release and ranks: 0.6.5 counted
#: the CUDA context too (vllm_c010: 1.79 GiB at TP 1, 3.58 at TP 2); from 0.7, 0.03-0.35 GiB at TP 1 (vllm_c006,
#: c014, vllm_016, llm-d's 0.13-0.14) and 0.2-0.55 at TP 2-4 (vllm_c007, llm-d's 0.54-0.55). LMCache-style
#: connectors hold more (vllm_c013: 7.33 GiB) and are not modelled.
NON_TORCH_GIB = {("0.6", 1): (1.0, 2.0), ("0.6", 2): (2.0, 4.0), ("0.7+", 1): (0.03, 0.4), ("0.7+", 2): (0.15, 0.8)}
#: from 0.17.0 the default optimization level (O2) fuses the all-reduce with the RMS norm when TP > 1 on SM 9.0 or
#: 10.x with PP 1 and DP 1 (config/vllm.py enable_allreduce_rms_fusion, read in 0.17.0 and 0.19.0; 0.16.0's O2 has it
#: off), through FlashInfer's all-reduce workspace. Under 0.19.0 on H100s a rank's non-torch memory is then 2.07 GiB
#: at TP 2 and 2.13 at TP 4 against 0.25 at TP 1 and 0.07 at PP 2 and 4 (the calibration set's Llama-3.1-8B runs of
#: llm-d-planner's sweep); 0.11.0's TP 2 had 0.54. What the ~2 GiB are made of (the workspace, NCCL's buffers for the
#: fused path) was not sized from the code: 0.19+ takes the calibration range, 0.17-0.18 (no startup) the union.
FUSED_ALLREDUCE_SINCE = (0, 17, 0)
FUSED_ALLREDUCE_MEASURED = (0, 19, 0)
NON_TORCH_FUSED_GIB = (1.9, 2.4)
GRAPH_ESTIMATE_GIB = (0.05, 2.0)
#: what is in use before vLLM compares the free memory with total x util: the CUDA context and torch's own
CONTEXT_GIB = (0.25, 0.6)
#: V1 warms the sampler up AFTER the KV cache is allocated and after the CUDA graphs are captured
#: (v1/worker/gpu_worker.py compile_or_warm_up_model, read in 0.8.5 and 0.19.0: "Warm up sampler and preallocate
#: memory buffer for logits ... called after `capture_model` on purpose"): a dummy forward of
#: min(max_num_seqs, max_num_batched_tokens) tokens, then gpu_model_runner._dummy_sampler_run over that many rows of
#: logits (read in 0.19.0: no empty_cache between the two). It is outside total x util. The profile run ran the same
#: _dummy_sampler_run over the same rows inside the budget, and memory_profiling (utils/mem_utils.py) empties the
#: cache after it, so its peak is free device memory again once the KV cache is sized; capture_model ends with
#: empty_cache too. The warm-up's eager forward leaves its freed blocks reserved in PyTorch's cache, and the caching
#: allocator never splits a request across segments, so each vocabulary-sized float32 tensor of the sampler that no
#: cached block holds takes a new segment. How much of the peak the forward's cached blocks take is not sized (the
#: 0.19.0 gpt-oss-20b logs: 1.62-1.78 GiB reserved but unallocated when the sampler's 786 MiB draw failed). So:
#:   no       the warm-up does not fit even in the whole freed peak plus the room outside (optimistic ends);
#:   at risk  the central estimate of the room outside the budget, the peak not counted ((1 - util) x total - the
#:            CUDA context [- the graphs before 0.20], each range's middle), cannot hold the whole warm-up at its
#:            high end: part of it must then come from the freed peak, whose reuse fragmentation decides. A
#:            threshold stated, not a bound derived;
#:   a note   only the pessimistic end of that room does not hold the whole warm-up.
#: 0.8.0-0.8.4 were not read. The threshold is the whole warm-up, not its largest single tensor (the previous rule):
#: in llm-d-planner's 0.19.0 sweep on H100s at 0.95 (logs at d3121e05) gpt-oss-20b ran out of memory here at TP 1
#: and TP 2 with 1.62-1.78 GiB reserved but unallocated, while the central room (2.50 GiB) held its largest tensor
#: (0.77) but not its warm-up (up to 3.07). The same rule calls started startups of that sweep at risk too (Gemma-2's
#: 256,000-word vocabulary at 0.95; Qwen3-14B under 0.15-0.16's sorting sampler): each needed the freed peak and
#: came through, which is what `at risk` says; no rule on these terms separates them (docs/plan.md).
SAMPLER_WARMUP_SINCE = (0, 8, 5)
#: bytes a logit of the warm-up's largest single tensor: the float32 logits (sampler.py logits.to(torch.float32)),
#: the probabilities and random_sample's exponential draw (torch.empty_like(probs), the 786 MiB request that failed
#: in the 0.19.0 gpt-oss-20b logs: 1,024 x 201,088 x 4 B) are 4 B; before 0.17 PyTorch's top-k/top-p sorts the
#: logits (topk_topp_sampler.apply_top_k_top_p: logits.sort) and its int64 indices are 8 B
LARGEST_LOGIT_BYTES = {"float32": 4, "sort": 8}
#: what loads with the weights beyond the checkpoint's bytes per rank (vLLM): llm-d's 0.11.0 startups loaded
#: 0.01-0.08 GiB more than the checkpoint per rank (Llama-3.1-8B 14.99 for 14.96, Qwen3-32B 61.03 for 61.02 at
#: TP 1 and 30.59 for 30.51 at TP 2)
VLLM_WEIGHT_EXTRA = (0.0, 0.15)  # GiB, plus up to 0.5 % of the weights
VLLM_WEIGHT_SHARE = 0.005
#: an MXFP4 checkpoint's experts (gpt-oss) are re-laid out at load, padded per kernel backend
#: (model_executor/layers/quantization/mxfp4.py ``Mxfp4MoEMethod.create_weights``, read in 0.10.1.1 and 0.11.0):
#: Marlin (a card below SM 9.0, where FP4 has no native support) pads each rank's expert width to a multiple of 128
#: and the hidden size to 256; the SM 9.0+ backends pad the width to 64 (Triton; its swizzle, in the triton_kernels
#: package, was not read), 128 (FlashInfer on SM 9.0 with VLLM_USE_FLASHINFER_MOE_MXFP4_BF16, both sizes) or 256
#: (FlashInfer on SM 10.0, both sizes). (multiple of the width, multiple of hidden) per backend:
MXFP4_PAD = {"marlin": (128, 256), "triton": (64, 1), "flashinfer-sm90": (128, 128), "flashinfer-sm100": (256, 256)}
MXFP4_BLOCK = 32  # values per u8 scale; 4-bit values, two a byte
#: the compute capability of the cards plan names (NVIDIA's CUDA GPU table), for the MXFP4 backend
CARD_CAPABILITY = {"a100": 8.0, "a10": 8.6, "a10g": 8.6, "a40": 8.6, "l4": 8.9, "l40s": 8.9, "rtx-4090": 8.9,
                   "rtx 4090": 8.9, "h100": 9.0, "h200": 9.0, "h20": 9.0, "b200": 10.0, "rtx-5090": 12.0,
                   "rtx 5090": 12.0, "rtx-pro-6000": 12.0, "rtx pro 6000": 12.0}


#: the newest vLLM release kvaudit models (its minor series): parse/vllm.py reads log shapes up to 0.33's "Auto-fit
#: ... available KV cache memory"; a later release is refused by name rather than planned by 0.33's rules
NEWEST_MODELLED = (0, 33)

def plan(inp: PlanInput, history: Any = None) -> Plan:
    version = shared.release(inp, (0, 6, 5), "kvaudit plan sizes vLLM 0.6.5+ (0.6.4 and earlier budget the torch "
                             "peak and count other processes)", newest=NEWEST_MODELLED,
                             newest_basis="the newest whose log lines it reads: 0.33's 'Auto-fit' line")
    era = VersionRange(version, version)
    geom = inp.geometry
    given_cell = shared.replayed_or_config(inp)
    notes: list[str] = []
    total = shared.cuda_total(inp, history, "vLLM")
    default = default_utilization(era)[0]
    util = shared.fraction(inp, "gpu_memory_utilization", None if default is None else (
        default, f"vLLM {inp.version}'s default (vllm/config/cache.py CacheConfig.gpu_memory_utilization)"))
    weights = _weights(inp, history)
    besides = _besides(inp, history, version, total)
    u = util.lo
    requested = Interval(total.lo * u, total.hi * u)
    available = requested - Interval(weights.lo, weights.hi) - Interval(besides.lo, besides.hi)
    if given_cell is not None:
        cell, how, cell_kind = given_cell, "the replayed startup's own", GIVEN
    else:
        assert geom is not None
        cell, how = cell_size(geom, inp.tp, kv_element(inp), inp.pp, split_v=version >= (0, 14, 0))
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
    # check_enough_kv_cache_memory (v1/core/kv_cache_utils.py; V0 worker.py raise_if_cache_size_invalid): a budget
    # <= 0 is "No available memory for the cache blocks", a pool below max_model_len the max seq len error
    starts, why = shared.pool_starts(available, lo, hi, length, "vLLM raises ValueError: not enough KV cache "
                                     "memory for one request of max_model_len", context_fatal=True,
                                     empty_error="vLLM raises ValueError: No available memory for the cache blocks")
    ctx_lo, ctx_hi = CONTEXT_GIB
    headroom = Interval(total.lo * (1 - u), total.hi * (1 - u))
    if starts != "no" and headroom.hi < ctx_lo:
        starts, why = "no", (f"the free memory at start (total less the CUDA context, {ctx_lo}-{ctx_hi} GiB) is below "
                             "total x utilisation: vLLM raises ValueError (Free memory on device ... is less than "
                             "desired GPU memory utilization)")
    elif starts == "yes" and headroom.lo < ctx_hi:
        starts, why = "at risk", "total x utilisation leaves less than a CUDA context's memory outside the budget"
    elif version < (0, 20, 0) and starts != "no":
        # before 0.20 the CUDA graphs are captured after the KV cache is allocated, outside total x util
        # (gpu_worker.compile_or_warm_up_model): what is left outside must hold the context and the graphs
        g_lo, g_hi = GRAPH_ESTIMATE_GIB
        if headroom.hi < ctx_lo + g_lo:
            starts, why = "no", (f"{headroom.hi:.2f} GiB outside total x utilisation cannot hold the CUDA context and "
                                 "the CUDA graphs, which vLLM before 0.20 captures after the KV cache (out of memory "
                                 "in graph capture; --enforce-eager or a lower utilisation)")
        elif starts == "yes" and headroom.lo < ctx_hi + g_hi:
            starts, why = "at risk", (f"{headroom.lo:.2f} GiB outside total x utilisation must hold the CUDA context "
                                      f"({ctx_lo}-{ctx_hi} GiB) and the CUDA graphs ({g_lo}-{g_hi} GiB, assumed), "
                                      "which vLLM before 0.20 captures after the KV cache")
    warm = sampler_warmup(inp, version, total.mid) if geom is not None else None
    if warm is not None and starts != "no":
        w_lo, w_hi, w_words, largest, l_words = warm
        act = activation(inp, version, total.mid)
        a_hi = act[1] if act is not None else besides.hi
        g_lo, g_hi = GRAPH_ESTIMATE_GIB if version < (0, 20, 0) else (0.0, 0.0)
        graphs = f", the CUDA graphs ({g_lo}-{g_hi} GiB, assumed; captured after the KV cache before 0.20)" \
            if version < (0, 20, 0) else ""
        # the room outside total x util, less the context and (before 0.20) the graphs, the profile's freed peak
        # not counted; low, central (each range's middle) and high
        fresh = Interval(headroom.lo - ctx_hi - g_hi, headroom.hi - ctx_lo - g_lo)
        central = headroom.mid - (ctx_lo + ctx_hi) / 2 - (g_lo + g_hi) / 2
        out.append(Term("post_kv_gib", "after the KV cache, outside total x util: the sampler warm-up", w_lo, w_hi,
                        "GiB", ASSUMED if inp.sampler is None else FORMULA,
                        f"{w_words}; gpu_worker.compile_or_warm_up_model runs it after the KV cache and the graphs"))
        out.append(Term("post_kv_fresh_gib", "outside total x util when the warm-up starts, the freed peak not counted",
                        fresh.lo, fresh.hi, "GiB", ASSUMED,
                        f"(1 - util) x total less the CUDA context ({ctx_lo}-{ctx_hi} GiB){graphs}; central "
                        f"{central:.2f} GiB (each range's middle); the warm-up's largest tensor {largest:.2f} GiB "
                        f"({l_words})"))
        if fresh.hi + a_hi < w_lo:
            starts, why = "no", (f"the sampler warm-up after the KV cache ({w_lo:.2f}-{w_hi:.2f} GiB: {w_words}) does "
                                 f"not fit in the {headroom.hi:.2f} GiB outside total x utilisation less the CUDA "
                                 f"context{graphs}, even with the profile run's {a_hi:.2f} GiB peak freed: CUDA out of "
                                 "memory warming up the sampler (lower --max-num-seqs or the utilisation)")
        elif starts == "yes" and central < w_hi:
            starts, why = "at risk", (
                f"the sampler warm-up vLLM runs after the KV cache (up to {w_hi:.2f} GiB: {w_words}) does not fit in "
                f"the central estimate of the room outside the budget, {central:.2f} GiB ({headroom.mid:.2f} GiB "
                f"outside total x utilisation less the CUDA context{graphs}, each range's middle): the rest must come "
                "from the profile run's freed peak (the same sampler over the same rows), which the warm-up's eager "
                f"forward's cached blocks share, and a tensor no free block holds (the largest {largest:.2f} GiB: "
                f"{l_words}) needs a new segment, so fragmentation decides (gpt-oss-20b at 0.95 under 0.19.0 ran out "
                "of memory here); lower --max-num-seqs or the utilisation")
        elif fresh.lo < w_hi:
            notes.append(f"the sampler warm-up vLLM runs after the KV cache ({w_lo:.2f}-{w_hi:.2f} GiB) fits in the "
                         f"{fresh.lo:.2f} GiB outside the budget at the pessimistic end only with the profile run's "
                         f"freed peak (the same sampler over the same rows); the central estimate ({central:.2f} GiB) "
                         f"holds it whole. What the warm-up's eager forward keeps cached "
                         "there (fragmentation) is not sized by the plan (llm-d-planner's gpt-oss-20b at 0.95 under "
                         "0.19.0 ran out of memory here with 1.6-1.8 GiB reserved but unallocated); a lower "
                         "--max-num-seqs or utilisation widens the room")
    need = (length or block) * cell / GIB
    smallest = math.ceil((weights.hi + besides.hi + need) / total.lo * 1000) / 1000
    outside = ctx_hi + (GRAPH_ESTIMATE_GIB[1] if version < (0, 20, 0) else 0.0)  # graphs after the KV cache
    largest_fraction: float | None = math.floor((1 - outside / total.lo) * 1000) / 1000
    if weights.lo + besides.lo >= total.hi:
        # the weights and what vLLM holds beside them exceed the card: no utilisation (up to 1.0) gives a budget,
        # so that is all the reason says, and no fraction is offered
        starts, why = "no", (f"the weights and what vLLM holds beside them ({weights.lo + besides.lo:.2f} GiB or more) "
                             f"exceed the card's {total.hi:.2f} GiB: no gpu_memory_utilization gives a KV budget "
                             "(vLLM raises ValueError: No available memory for the cache blocks); more GPUs (--tp) "
                             "or a smaller checkpoint")
        largest_fraction = None
    kv_lo, kv_hi = lo * cell / GIB, hi * cell / GIB
    return Plan(inp, tuple(out), lo, hi, round(kv_lo, 3), round(kv_hi, 3),
                shared.concurrency(lo, hi, length, inp.max_running_requests), None, starts, why,
                smallest if smallest < 1 else None, largest_fraction,
                "vLLM: total x util - (weights + activation peak + non-torch"
                + (" + CUDA graph estimate)" if version >= (0, 20, 0) else ")")
                + f"; floor(KV / ({block} x bytes per token)) x {block}",
                tuple(notes), block_size=block,
                largest_fraction_reason="the largest that leaves the CUDA context outside the budget (vLLM's "
                                        "free-memory check at start)" + (", and the CUDA graphs captured after the "
                                                                         "KV cache" if version < (0, 20, 0) else ""))


def kv_element(inp: PlanInput) -> float:
    """The KV element size: a float32 config served with --dtype auto runs in 16 bits (vLLM's
    config._get_and_verify_dtype downcasts float32 to bfloat16/float16), so its cache is 2 B an element."""
    if inp.kv_dtype == "auto" and inp.geometry is not None and inp.geometry.dtype_bytes == 4:
        return 2.0
    return shared.kv_element(inp)


def _weights(inp: PlanInput, history: Any) -> Term:
    """vLLM's "Model loading took": the history's, else the checkpoint's bytes per rank (a tied lm_head is loaded
    once: a checkpoint that stores it too loads one embedding fewer) plus a little (VLLM_WEIGHT_EXTRA)."""
    obs = calibrate.logged_weights(history, inp)
    if obs is not None or not inp.weight_bytes:
        return shared.weights(inp, history, logged=True)
    ranks = inp.tp * inp.pp
    even = inp.weight_bytes / ranks / GIB
    lo, words = even, ""
    sz = inp.sizes
    if sz is not None and sz.tie_word_embeddings and sz.vocab_size and sz.hidden_size and inp.geometry is not None:
        tied = sz.vocab_size * sz.hidden_size * inp.geometry.dtype_bytes / ranks / GIB
        lo, words = even - tied, f"; a tied lm_head the checkpoint may store too: down to {even - tied:.2f}"
    if inp.geometry is not None and inp.geometry.dtype_bytes == 4:  # a float32 config, served in 16 bits
        lo, words = lo / 2, words + ("; a float32 config is served in 16 bits (--dtype auto): a float32 checkpoint "
                                     f"loads at half its bytes, down to {lo / 2:.2f}")
    hi = even * (1 + VLLM_WEIGHT_SHARE) + VLLM_WEIGHT_EXTRA[1]
    pad = mxfp4_padding(inp)
    if pad is not None:
        p_lo, p_hi, p_words = pad
        lo, hi, words = lo + p_lo, hi + p_hi, words + "; " + p_words
    if inp.pp > 1 and sz is not None and sz.vocab_size and sz.hidden_size and inp.geometry is not None:
        hi += sz.vocab_size * sz.hidden_size * inp.geometry.dtype_bytes / inp.tp / GIB  # the first/last stage
        words += "; pipeline stages are uneven by an embedding"
    return Term("weights_gib", "weights per rank (what loading took)", lo, hi, "GiB", ASSUMED,
                f"{inp.weight_bytes:,} bytes ({inp.weight_source}) / {ranks} ranks = {even:.2f} GiB (formula), plus "
                f"up to {VLLM_WEIGHT_EXTRA[1]} GiB + {VLLM_WEIGHT_SHARE:.1%} loaded with them (assumed){words}")


def _capability(card: str | None) -> float | None:
    name = (card or "").lower()
    for key in sorted(CARD_CAPABILITY, key=len, reverse=True):
        if key in name:
            return CARD_CAPABILITY[key]
    return None


def mxfp4_padding(inp: PlanInput) -> tuple[float, float, str] | None:
    """What vLLM's MXFP4 experts take per rank beyond the checkpoint's bytes (GiB, low and high): their width per
    rank and the hidden size padded to the backend's multiples (MXFP4_PAD), 4-bit values and one u8 scale per 32.
    None unless the checkpoint is MXFP4 with its experts' sizes in the config."""
    sz = inp.sizes
    if sz is None or sz.quant_method != "mxfp4":
        return None
    width = sz.moe_intermediate_size or sz.intermediate_size
    hidden, experts, layers = sz.hidden_size, sz.num_experts, sz.num_layers
    if not (width and hidden and experts and layers):
        return None

    def expert_bytes(w: int, h: int) -> float:  # gate_up (2w x h) and down (h x w), values and scales
        return 3 * w * h * (0.5 + 1 / MXFP4_BLOCK)

    per_rank = width / inp.tp
    plain = expert_bytes(width, hidden) / inp.tp

    def padded(backend: str) -> float:
        mw, mh = MXFP4_PAD[backend]
        w = math.ceil(per_rank / mw) * mw
        h = math.ceil(hidden / mh) * mh
        return (expert_bytes(w, h) - plain) * experts * layers / inp.pp / GIB

    cap = _capability(inp.card)
    if cap is not None and cap < 9.0:
        backends = ["marlin"]
    elif cap is not None and cap < 10.0:
        backends = ["triton", "flashinfer-sm90", "marlin"]  # Marlin without triton_kernels or torch 2.8
    elif cap is not None:
        backends = ["triton", "flashinfer-sm100", "marlin"]
    else:
        backends = list(MXFP4_PAD)
    amounts = {b: padded(b) for b in backends}
    lo, hi = min(amounts.values()), max(amounts.values())
    which = ", ".join(f"{b} {v:.2f}" for b, v in amounts.items())
    return lo, hi, (f"MXFP4 experts padded at load by the kernel backend ({which} GiB; vLLM mxfp4.py "
                    "create_weights; card " + (f"SM {cap:g}" if cap is not None else "not known") + ")")


def profile_batch(inp: PlanInput, version: tuple[int, ...], total_gib: float) -> tuple[int, int, int, int, str]:
    """The dummy batch the release's profile run pushes (tokens low/high, sampler rows low/high, and where the
    defaults come from), as ``vllm serve`` sets them (the OpenAI server's usage context)."""
    length = inp.context_length or (inp.geometry.max_position_embeddings if inp.geometry is not None else None) \
        or 2048
    name = (inp.card or "").lower()
    if version < (0, 8, 0):
        # V0 (config.py SchedulerConfig.__post_init__, engine/arg_utils.py): chunked prefill on by default past
        # 32K (no sliding window); then 2048 tokens a step, else max(max_model_len, 2048); 256 sequences
        chunked = length > 32768 and not (inp.geometry is not None and inp.geometry.sliding_window_layers)
        tokens = inp.max_num_batched_tokens or (2048 if chunked else max(length, 2048))
        rows = min(inp.max_running_requests or 256, tokens)
        return tokens, tokens, rows, rows, (f"V0: {tokens:,} tokens (" + ("chunked prefill past 32K" if chunked else
                                            "max(max_model_len, 2048)") + f"), {rows:,} sequences")
    # V1 (engine/arg_utils.py _set_default_args): 8192 tokens and 1024 sequences on a card of 70 GiB or more, else
    # 2048 and 256 (read in 0.8.5 and 0.11.0); from 0.9 an A100 keeps the small defaults (PR #17885)
    big_lo = big_hi = False
    if version < (0, 9, 0) and total_gib >= 70:
        big_lo = big_hi = True
    elif total_gib >= 70:
        if name:
            big_lo = big_hi = "a100" not in name
        else:  # an unnamed card of that size may be an A100
            big_lo, big_hi = False, True
    t_lo, t_hi = (8192 if big_lo else 2048), (8192 if big_hi else 2048)
    s_lo, s_hi = (1024 if big_lo else 256), (1024 if big_hi else 256)
    if inp.max_num_batched_tokens:
        t_lo = t_hi = inp.max_num_batched_tokens
    if inp.max_running_requests:
        s_lo = s_hi = inp.max_running_requests
    s_lo, s_hi = min(s_lo, t_lo), min(s_hi, t_hi)
    where = "given" if inp.max_num_batched_tokens and inp.max_running_requests else (
        ("the defaults for a card of 70 GiB or more" + (", not an A100" if version >= (0, 9, 0) else "")) if big_lo else
        "the defaults for this card" if big_lo == big_hi else "the defaults: an unnamed card of 70 GiB or more may "
        "be an A100 (2048 and 256) or not (8192 and 1024)")
    t_words = f"{t_lo:,}" if t_lo == t_hi else f"{t_lo:,}-{t_hi:,}"
    s_words = f"{s_lo:,}" if s_lo == s_hi else f"{s_lo:,}-{s_hi:,}"
    return t_lo, t_hi, s_lo, s_hi, f"V1: {t_words} tokens, {s_words} sampler rows ({where})"


def activation(inp: PlanInput, version: tuple[int, ...], total_gib: float) -> tuple[float, float, str] | None:
    """The profile run's torch peak above the weights: max(forward, sampler), each from the model's sizes."""
    sz, geom = inp.sizes, inp.geometry
    if sz is None or geom is None or not sz.vocab_size or not sz.hidden_size:
        return None
    width = (sz.moe_intermediate_size * sz.experts_per_token if sz.moe_intermediate_size and sz.experts_per_token
             else sz.intermediate_size)
    if not width:
        return None
    t_lo, t_hi, r_lo, r_hi, batch = profile_batch(inp, version, total_gib)
    elt = 2.0 if geom.dtype_bytes == 4 else geom.dtype_bytes  # float32 configs run in 16 bits
    per_token = FORWARD_WIDTHS * (width / inp.tp + sz.hidden_size) * elt
    b_lo, b_hi, kind = sampler_bytes(inp, version)
    fwd = (t_lo * per_token / GIB * 0.8, t_hi * per_token / GIB * 1.25)
    smp = (r_lo * sz.vocab_size * b_lo / GIB, r_hi * sz.vocab_size * b_hi / GIB)
    lo, hi = max(fwd[0], smp[0]), max(fwd[1], smp[1])
    return lo, hi, (f"activation peak {lo:.2f}-{hi:.2f} GiB = max(forward {fwd[0]:.2f}-{fwd[1]:.2f}: tokens x "
                    f"{FORWARD_WIDTHS} x (MLP {width:,}/{inp.tp} + hidden {sz.hidden_size:,}) x {elt:g} B, +-25 %; "
                    f"sampler {smp[0]:.2f}-{smp[1]:.2f}: rows x vocab {sz.vocab_size:,} x {b_lo:g}-{b_hi:g} B, {kind}) "
                    f"[{batch}]")


def sampler_bytes(inp: PlanInput, version: tuple[int, ...]) -> tuple[float, float, str]:
    """Bytes the release's sampler holds per logit (rows x vocabulary), low and high, and which sampler."""
    if version < (0, 8, 0):  # V0 uses FlashInfer's sampler only when VLLM_USE_FLASHINFER_SAMPLER=1
        kind = "flashinfer" if inp.sampler == "flashinfer" else "v0"
        b_lo, b_hi = SAMPLER_BYTES[kind]
    elif version >= TRITON_SAMPLER_SINCE and inp.sampler != "flashinfer":
        triton = SAMPLER_BYTES[TRITON_SAMPLER]
        if inp.sampler:
            kind, (b_lo, b_hi) = TRITON_SAMPLER, triton
        else:  # either path: 8-16 B
            kind, b_lo, b_hi = "native (Triton top-k/top-p) or flashinfer", SAMPLER_BYTES["flashinfer"][0], triton[1]
    elif inp.sampler:
        kind, (b_lo, b_hi) = inp.sampler, SAMPLER_BYTES[inp.sampler]
    elif version >= FLASHINFER_OPT_IN_SINCE:  # FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1
        kind, (b_lo, b_hi) = "native (FlashInfer's is opt-in from 0.12)", SAMPLER_BYTES["native"]
    else:
        kind, b_lo, b_hi = "flashinfer or native: not known", SAMPLER_BYTES["flashinfer"][0], SAMPLER_BYTES["native"][1]
    return b_lo, b_hi, kind


def sampler_warmup(inp: PlanInput, version: tuple[int, ...],
                   total_gib: float) -> tuple[float, float, str, float, str] | None:
    """What V1's sampler warm-up takes after the KV cache is allocated (GiB, low and high): rows x vocabulary x the
    sampler's bytes a logit (SAMPLER_WARMUP_SINCE), and its largest single tensor (GiB, high; LARGEST_LOGIT_BYTES).
    None before it, or without the vocabulary size."""
    sz = inp.sizes
    vocab = (sz.vocab_size if sz is not None else None) or inp.vocab_size
    if version < SAMPLER_WARMUP_SINCE or not vocab:
        return None
    _, _, r_lo, r_hi, batch = profile_batch(inp, version, total_gib)
    b_lo, b_hi, kind = sampler_bytes(inp, version)
    lo, hi = r_lo * vocab * b_lo / GIB, r_hi * vocab * b_hi / GIB
    rows = f"{r_lo:,}" if r_lo == r_hi else f"{r_lo:,}-{r_hi:,}"
    sort = version < TRITON_SAMPLER_SINCE and inp.sampler != "flashinfer"
    elt = LARGEST_LOGIT_BYTES["sort"] if sort else LARGEST_LOGIT_BYTES["float32"]
    largest = r_hi * vocab * elt / GIB
    l_words = (f"{rows} x {vocab:,} x {elt} B: " + ("the top-k/top-p sort's int64 indices" if sort else
                                                     "the float32 logits, probabilities or random_sample's draw"))
    return lo, hi, (f"sampler warm-up {lo:.2f}-{hi:.2f} GiB: min(max_num_seqs, max_num_batched_tokens) = {rows} rows "
                    f"x vocab {vocab:,} x {b_lo:g}-{b_hi:g} B ({kind}) [{batch}]"), largest, l_words


def non_torch(inp: PlanInput, version: tuple[int, ...]) -> tuple[float, float]:
    era = "0.6" if version < (0, 7, 0) else "0.7+"
    base = NON_TORCH_GIB[(era, 1 if inp.tp * inp.pp == 1 else 2)]
    fused = fused_allreduce(inp, version)
    if fused is None or fused is False:
        return base
    lo = NON_TORCH_FUSED_GIB[0] if fused is True and version >= FUSED_ALLREDUCE_MEASURED else base[0]
    return lo, NON_TORCH_FUSED_GIB[1]


def fused_allreduce(inp: PlanInput, version: tuple[int, ...]) -> bool | None:
    """Whether vLLM fuses the all-reduce with the RMS norm (FUSED_ALLREDUCE_SINCE): True or False, or None when the
    card's compute capability is not known (a card given by its memory only)."""
    if version < FUSED_ALLREDUCE_SINCE or inp.tp < 2 or inp.pp > 1:
        return False
    cap = _capability(inp.card)
    if cap is None:
        return None
    return cap == 9.0 or 10.0 <= cap < 11.0


def _besides(inp: PlanInput, history: Any, version: tuple[int, ...], total: Term) -> Term:
    """What the budget holds besides the weights and the pool: the history's, else the profile run's model."""
    label = "activation peak + non-torch" + (" + CUDA graph estimate" if version >= (0, 20, 0) else "")
    obs = calibrate.budget_besides_weights(history, inp)
    if obs is not None:
        return Term("besides_gib", label, max(0.0, obs.lo), obs.hi, "GiB", CALIBRATED, obs.basis)
    act = activation(inp, version, total.mid)
    nt = non_torch(inp, version)
    if act is None:
        a_lo, a_hi, words = *ACTIVATION_GIB, (f"activation peak {ACTIVATION_GIB[0]}-{ACTIVATION_GIB[1]} GiB (the "
                                              "corpus' range: the config gives no hidden, MLP or vocabulary size)")
    else:
        a_lo, a_hi, words = act
    parts = [(a_lo, a_hi), nt]
    fused = fused_allreduce(inp, version)
    why = ("TP > 1 with the all-reduce + RMS norm fusion (0.17+ on SM 9.0/10.x)" if fused else
           "TP > 1, the all-reduce fusion not known (the card's compute capability is not)" if fused is None else
           "one rank" if inp.tp * inp.pp == 1 else "several ranks")
    words += f", non-torch {nt[0]}-{nt[1]} GiB ({why})"
    if version >= (0, 20, 0):
        parts.append(GRAPH_ESTIMATE_GIB)
        words += f", CUDA graph estimate {GRAPH_ESTIMATE_GIB[0]}-{GRAPH_ESTIMATE_GIB[1]} GiB (assumed)"
    return Term("besides_gib", label, sum(p[0] for p in parts), sum(p[1] for p in parts), "GiB", ASSUMED,
                words + "; no startup of this model in the history")
