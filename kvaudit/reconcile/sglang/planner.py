"""kvaudit plan for SGLang: the KV pool of a deployment that does not exist yet, by SGLang's own formula.

``profile_max_num_token`` (see formula.py for the files per release)::

    rest = post - (1 - mem_fraction_static) * T      GiB
    max_total_num_tokens = floor(rest * 2**30 / cell), then the release's page rounding and --max-total-tokens

With no log there is no T and no post: T comes from the card (its nvidia-smi memory.total less what is gone before
SGLang measures), post from T less the weights per rank. Each is calibrated on the history when the fleet has
run this card (and model) before, else assumed with its range; the cell is SGLang's own ``cell_size`` on the
model's config.json, exact. The same :func:`~kvaudit.reconcile.sglang.formula.predict` the audit uses turns them
into tokens, so a plan calibrated on one startup and that startup's what-if give the same count.
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, cast

from kvaudit.parse.sglang import NEWEST_KNOWN
from kvaudit.planning import calibrate
from kvaudit.planning import terms as shared
from kvaudit.planning.model import ASSUMED, CALIBRATED, FORMULA, GIVEN, Plan, PlanInput, Term
from kvaudit.planning.terms import PlanError, weakest
from kvaudit.reconcile.interface import Thresholds
from kvaudit.reconcile.sglang.cell import CellSize, cell_size
from kvaudit.reconcile.sglang.formula import predict, rules_for
from kvaudit.units import GIB, Interval
from kvaudit.versions import VersionRange
from kvaudit.record import record

#: what is gone between the card's memory.total and SGLang's T, when no startup on this card says (GiB), by the
#: number of ranks. T is ``get_available_gpu_memory`` (``torch.cuda.mem_get_info``'s free, the minimum over the TP
#: group) taken at the end of ``ModelRunner.init_torch_distributed`` (0.4-0.5.x: after ``set_device``,
#: ``init_distributed_environment``, ``initialize_model_parallel`` (NCCL communicators, the custom all-reduce's
#: buffers: 8 MiB, 16 on ROCm, ``CustomAllreduce._MAX_CAR_SIZE``) and DP attention's groups), before any weight. So
#: it is (a) what the driver keeps out of CUDA's total (H100: memory.total 81,559 MiB, CUDA's 79.18-79.19 GiB: 0.46
#: GiB, bench/plan_cases.json's llm-d H100 runs), (b) the CUDA context and the allocator's first blocks, and (c) the
#: distributed init, which SGLang logs itself ("Init torch distributed ends. ... mem usage="): 0.00-0.09 GiB at TP 1
#: in every startup seen that prints it, 0.00-0.30 at TP 2-8 (0.01 at TP 4 and 8 in 2026, 0.30 at TP 2 over RCCL,
#: 0.00 at TP 8 on the bundled host). CALIBRATION startups that show the whole offset (none in
#: bench/plan_validation.json): TP 1 on 80 GB cards taken as H100s (the logs do not name the card) 0.84 (SGLang's CI,
#: 2025-01, T 78.81), 1.17 (2026-08, T 78.48) and 1.22 (SGLang's documentation build, T 78.43); TP 2 on 2x RTX 3090
#: 0.94-1.09 (fixtures/corpus sglang_c002, c004, c012, c016-c021); TP 8 1.58 (8x RTX PRO 6000, the bundled host).
#: Each range spans its points with about 0.1-0.2 GiB either side; it was 0.4-2.5 GiB before (docs/plan.md).
#: Not in it: 0.5.4's --enable-piecewise-cuda-graph, which sizes the custom all-reduce at 256 MiB
#: (``parallel_state.py``, that release only): 1.77-2.01 GiB at TP 8 on H200s (sglang PR #11716, T 137.29 of 140.40)
T_OFFSET_GIB = {1: (0.75, 1.35), 2: (0.75, 1.75)}

#: the same offset on an AMD Instinct card (ROCm) with more than one rank (GiB). ``initialize_model_parallel`` is the
#: same code (0.5.6.post2: PyNcclCommunicator over RCCL, the custom all-reduce's 16 MiB buffers, QuickAllReduce
#: only with ROCM_QUICK_REDUCE_QUANTIZATION set, parallel_state.py / quick_all_reduce.py), but what RCCL and the HIP
#: runtime take for it is not in SGLang's code: AMD's logs print "Init torch distributed ends. mem usage=2.95-3.37 GB"
#: at TP 8 where CUDA's print 0.00-0.30. The range is read off the one CALIBRATION startup that shows the whole
#: offset on a card kvaudit knows (fixtures/corpus sglang_c055: 8x MI300X, 0.5.6.post2 image, the group's least
#: reading 188.10 of the card's 191.98 GiB: 3.88, or 3.38 with ROCm's T up to 0.5 GiB above the printed line,
#: docs/how-it-works.md) with about 0.2 GiB either side. Read after the MI300X validation startups pointed at it
#: (docs/plan.md); TP 2-4 and one rank on ROCm are not seen and keep the CUDA range with a note.
T_OFFSET_ROCM_GIB = (3.2, 4.1)


def rocm(inp: PlanInput) -> bool:
    """AMD ROCm: a replayed startup's own sign (``inp.rocm``, what its audit read in the log's lines: plan
    --validate, a log names no card), else an AMD Instinct card by its rocm-smi name (kvaudit/plan/cards.py)."""
    return inp.rocm is not None or (inp.card or "").lower().startswith("amd ")


def _rocm_reserve_T(inp: PlanInput, era: VersionRange, T: Term, notes: list[str]) -> Interval:
    """The T the reserve takes, for a startup replayed on its own printed T on ROCm: as the audit does
    (audit.py ``_rocm_T``, ROCM_T_DRIFT_GIB for 0.4.7-0.5.20) up to ROCM_T_DRIFT_GIB above the printed 'Load weight
    begin' reading, which comes after the kernels' imports; post stays the printed T less the weights (the
    printed 'Load weight end' is not moved by it). Elsewhere T itself."""
    from kvaudit.reconcile.sglang.audit import ROCM_T_DRIFT_GIB, ROCM_T_DRIFT_RELEASES

    lo, hi = ROCM_T_DRIFT_RELEASES
    if T.kind != GIVEN or inp.rocm is None or not era.overlaps(lo, hi):
        return Interval(T.lo, T.hi)
    notes.append(f"ROCm ({inp.rocm}): the reserve takes T up to {ROCM_T_DRIFT_GIB} GiB above the replayed startup's "
                 "printed reading, as its audit does (SGLang reads T before AMD's kernels are imported)")
    return Interval(T.lo, T.hi + ROCM_T_DRIFT_GIB)


def t_offset(ranks: int, on_rocm: bool = False) -> tuple[float, float]:
    """The assumed offset for ``ranks`` = TP x PP: one rank, or more (``T_OFFSET_GIB``; ``T_OFFSET_ROCM_GIB`` on an
    AMD card at TP 8)."""
    if on_rocm and ranks >= 8:
        return T_OFFSET_ROCM_GIB
    return T_OFFSET_GIB[1] if ranks <= 1 else T_OFFSET_GIB[2]


@record
class _Settings:
    """What :func:`predict` reads of an audit's context: the release, the server args, the page size."""

    era: VersionRange
    page_size: int
    args: dict[str, Any] = field(default_factory=dict)


def plan(inp: PlanInput, history: Any = None) -> Plan:
    version = shared.release(inp, (0, 0, 0), "", caps=True, drafts=True, dp_attention=True, newest=NEWEST_KNOWN,
                             newest_basis="the newest whose log lines and rules it reads, parse/sglang.py")
    era = VersionRange(version, version)
    notes: list[str] = []
    terms: list[Term] = []

    on_rocm = rocm(inp)
    T = shared.card_memory(inp, history, "free before the weights load (T)", t_offset(inp.tp * inp.pp, on_rocm),
                           "gone before SGLang measures (driver reserve, " + ("HIP context, RCCL)" if on_rocm else
                                                                             "CUDA context, NCCL)"))
    if on_rocm and version >= (0, 5, 5):
        notes.append("on ROCm with --attention-backend aiter and a context past 8,192 tokens SGLang multiplies "
                     "mem_fraction_static by 0.85 once it is set (server_args.py, read in the 0.5.5, 0.5.6.post2 "
                     "and 0.5.9 wheels; not in 0.5.3-0.5.4): the fraction here is the one SGLang uses, so give 0.85 "
                     "x yours for that backend (its server_args line prints the product)")
    if on_rocm and T.kind == ASSUMED and inp.tp * inp.pp < 8:
        notes.append("an AMD card at fewer than 8 ranks: what RCCL and the HIP runtime take before SGLang measures T "
                     "is seen only at TP 8 (3.2-4.1 GiB); the CUDA range assumed here may be GiB too small")
    obs = calibrate.pre_load_free(history, inp) if T.kind == CALIBRATED else None
    terms.append(T)

    post_obs = calibrate.post_load_free(history, inp)
    W = shared.weights(inp, history)
    if W.kind == ASSUMED:
        W = _own_dtype_weights(inp, W)
        W = _without_mtp_layer(inp, W, notes)
    terms.append(W)
    draft = inp.draft
    spec_rule = rules_for(era, True)[0] if draft else None
    # 0.5.14+: the draft's weights are loaded before the pool is sized (post is after both); before, they load after
    # it and come out of the reserve with the draft's own KV pool
    Wd = _draft_weights(inp) if draft else None
    draft_first = Wd is not None and spec_rule is not None and spec_rule.inflate is not None
    if Wd is not None:
        terms.append(Wd)
    # post itself is an observation only where T is one of the same family: a T given (a replayed log) or taken
    # from a nearer family is another card's or release's, and post then follows from it less the weights
    if post_obs is not None and obs is not None and obs.level == 0 and post_obs.level == 0 and not draft_first:
        post = Term("post_load_free_gib", "free after the weights (post)", post_obs.lo, post_obs.hi, "GiB",
                    CALIBRATED, post_obs.basis)
    elif draft_first:
        assert Wd is not None
        post = Term("post_load_free_gib", "free after the weights and the draft's (post)", T.lo - W.hi - Wd.hi,
                    T.hi - W.lo - Wd.lo, "GiB", weakest(T.kind, W.kind, Wd.kind), "T - weights - draft weights")
    else:
        post = Term("post_load_free_gib", "free after the weights (post)", T.lo - W.hi, T.hi - W.lo, "GiB",
                    weakest(T.kind, W.kind), "T - weights")
    terms.append(post)

    F = shared.fraction(inp, "mem_fraction_static", None if inp.fraction is not None else _default(inp))
    f = F.lo
    terms.append(F)
    geom = inp.geometry
    cell_iv = None
    if inp.bytes_per_token:
        lo_b, hi_b = inp.bytes_per_token
        cell = CellSize(round((lo_b + hi_b) / 2), round((lo_b + hi_b) / 2), (), "the replayed startup's own")
        cell_iv = Interval(lo_b, hi_b)
        terms.append(Term("bytes_per_token", "KV bytes per token per rank (cell)", lo_b, hi_b, "B", GIVEN,
                          cell.description))
    elif geom is None:
        raise PlanError("the model's config.json is needed for the bytes per token")
    else:
        kv_elt = shared.kv_element(inp)
        attn_tp = max(1, inp.tp // max(1, inp.dp_attention))
        cell = cell_size(geom, era, attn_tp, kv_elt, inp.pp)
        if geom.is_hybrid_swa or geom.is_mamba_hybrid:
            notes.append("a hybrid model (sliding-window or state-space layers): its split of the pool is not modelled "
                         "by plan; the tokens are the full-attention cell's")
        terms.append(Term("bytes_per_token", "KV bytes per token per rank (cell)", cell.profile, cell.profile, "B",
                          FORMULA, f"SGLang {inp.version} cell_size: {cell.description}"))
    Ti, posti = Interval(T.lo, T.hi), Interval(post.lo, post.hi)
    Tr = _rocm_reserve_T(inp, era, T, notes)  # the T the reserve takes: Ti, or on ROCm up to the drift above it
    reserve = Tr.scale(1 - f)
    rest = posti - reserve
    terms.append(Term("reserve_gib", "reserve (1 - fraction) x T", reserve.lo, reserve.hi, "GiB",
                      weakest(T.kind, FORMULA), "formula"))
    terms.append(Term("rest_gib", "KV budget (rest = post - reserve)", rest.lo, rest.hi, "GiB",
                      weakest(post.kind, T.kind), "formula"))
    if inp.post_capture:
        if version < (0, 5, 16):
            raise PlanError(f"--post-capture-kv-sizing: SGLang {inp.version} has no post-capture KV sizing (0.5.16+)")
        notes.append("post-capture KV sizing: SGLang re-sizes the pool after the graphs are captured "
                     "(compute_post_capture_kv_resize), which plan does not model: the tokens are the budget's "
                     "before capture, by the fraction")
    if version[:3] == (0, 5, 4) and inp.tp * inp.pp > 1:
        notes.append("SGLang 0.5.4 with --enable-piecewise-cuda-graph sizes the custom all-reduce at 256 MiB "
                     "(parallel_state.py): T is then up to about 2 GiB lower at TP 8 (sglang PR #11716), which the "
                     "assumed offset does not hold")
    page = inp.page_size or 1
    if inp.page_size is None:
        notes.append("page size 1 (SGLang's default; some attention backends use 64 or more: give --page-size)")
    args = {k: v for k, v in (("max_total_tokens", inp.max_total_tokens),
                              ("max_running_requests", inp.max_running_requests)) if v is not None}
    rule = spec_rule or rules_for(era, False)[0]
    if rule.headroom:
        notes.append("SGLang 0.4.4-0.5.6 add max_running_requests x (steps x topk + draft tokens) + 100 to the "
                     "target's count (the EAGLE headroom); those settings are not plan inputs, so the tokens are the "
                     "profiled budget's and the logged count will be higher by the headroom")
        rule = rules_for(era, False)[0]
    draft_layers = draft.layers if draft else None
    target_layers = geom.num_layers if geom is not None else None
    settings = cast(Any, _Settings(era, page, args))  # predict reads era, page_size and args of an audit's Context
    pred = predict(settings, rule, Tr, posti, f, cell_iv or Interval.exact(cell.profile), None,
                   draft_layers, target_layers)
    lo, hi = max(0, pred.tokens.low), max(0, pred.tokens.high)
    kv_lo, kv_hi = lo * cell.pool / GIB, hi * cell.pool / GIB
    if draft_first and draft:
        terms.append(Term("bytes_per_token_with_draft", "cell with the draft's layers (what the budget is divided by)",
                          pred.cell.lo, pred.cell.hi, "B", FORMULA, f"{rule.name}: L_draft {draft.layers}, L_target "
                          f"{target_layers}"))
        kv_lo, kv_hi = lo * pred.cell.lo / GIB, hi * pred.cell.hi / GIB
    in_reserve = None
    if draft and not draft_first:
        in_reserve = _draft_in_reserve(inp, era, (lo, hi), Wd)
        terms.append(in_reserve)

    run_cap = inp.max_running_requests
    if draft and run_cap is None and (0, 4, 5) <= version <= (0, 5, 18):
        notes.append("max_running_requests 48: SGLang's default with a speculative draft (0.4.5-0.5.18)")
        run_cap = 48
    concurrency = shared.concurrency(lo, hi, inp.context_length, run_cap)

    held = calibrate.reserve_held(history, inp)
    left = None
    largest = None
    if held is not None:
        left = Term("left_after_graphs_gib", "left in the reserve after graphs, activations, a draft",
                    reserve.lo - held.hi, reserve.hi - held.lo, "GiB", CALIBRATED,
                    f"(1 - fraction) x T less what the reserve held: {held.lo:.2f}-{held.hi:.2f} GiB in {held.basis}")
        largest = math.floor((1 - held.hi / Ti.lo) * 1000) / 1000

    # one full-context request: the length given, else the model's own (SGLang's default context_length is the
    # config's max_position_embeddings); never one token, which made "the smallest fraction" one no request fits
    full = inp.context_length or (inp.geometry.max_position_embeddings if inp.geometry is not None else None)
    need = (full or 0) * pred.cell.hi / GIB  # the cell the budget is divided by (a draft's inflation)
    smallest = (math.ceil((1 - (posti.lo - need) / Ti.hi) * 1000) / 1000
                if full and posti.lo > need else None)
    starts, why = _starts(rest, left, hi, lo, inp.context_length)
    if starts == "yes" and left is not None:
        had = calibrate.observe(history, inp, lambda s: s["free_at_end_gib"], by_model=True)
        low = _low_headroom(left, had)
        if low:
            starts, why = "at risk", low
    if in_reserve is not None and left is None and starts != "no":
        if reserve.hi < in_reserve.lo:
            starts, why = "no", (f"the reserve ({reserve.lo:.2f}-{reserve.hi:.2f} GiB) cannot hold the draft's weights "
                                 "and KV pool, which come out of it after the pool is sized (OOM)")
        elif reserve.lo < in_reserve.hi and starts == "yes":
            starts, why = "at risk", "the reserve may not hold the draft's weights and KV pool (they come out of it)"
    if posti.hi <= 0:
        # the weights alone take what was free: no fraction gives a budget, so "increase the fraction" would mislead
        starts, why = "no", (f"NOT_ENOUGH_MEMORY: the weights leave no memory for the pool at any fraction (free "
                             f"after the weights: {_gib(posti)}): SGLang stops; more GPUs (--tp) or a smaller "
                             "checkpoint")
    elif posti.lo <= 0:
        why += ("; at the low end of the assumed terms the weights leave no memory for the pool at any fraction "
                f"(free after the weights: {_gib(posti)})")
    elif smallest is None:
        if full:
            why += f"; no fraction makes the pool hold one {full:,}-token request"
    return Plan(inp, tuple(terms), lo, hi, round(kv_lo, 3), round(kv_hi, 3), concurrency, left, starts, why,
                smallest, largest, rule.name, tuple(notes), block_size=page)


def _gib(i: Interval) -> str:
    return f"{i.lo:.2f} GiB" if abs(i.hi - i.lo) < 0.005 else (
        f"{i.lo:.2f} to {i.hi:.2f} GiB" if i.lo < 0 or i.hi < 0 else f"{i.lo:.2f}-{i.hi:.2f} GiB")


def _fp8_block(rows: int, cols: int) -> int:
    """One linear weight in DeepSeek's FP8 layout: e4m3 values plus an FP32 scale per 128 x 128 block."""
    return rows * cols + 4 * math.ceil(rows / 128) * math.ceil(cols / 128)


def _without_mtp_layer(inp: PlanInput, W: Term, notes: list[str]) -> Term:
    """The checkpoint's bytes less its multi-token-prediction layer, which SGLang does not load without a draft.

    ``DeepseekV2ForCausalLM.load_weights`` (models/deepseek_v2.py in the 0.4.6.post5 and 0.5.6.post2 wheels,
    models/deepseek_common/deepseek_weight_loader.py in 0.5.9; the releases between not read): unless it is the
    nextn (draft) model, a checkpoint tensor named ``model.layers.N`` with N >= num_hidden_layers is skipped when
    ``num_nextn_predict_layers`` > 0, and the model has no parameter for it. DeepSeek-V3's checkpoints (V3, R1,
    V3-0324, V3.1) store that layer whole: one MoE decoder layer, its own embed_tokens and shared_head.head, eh_proj
    and norms. Counted from config.json in DeepSeek's layout (the routed experts in FP8 blocks of 128 with FP32
    scales, the embedding, head and eh_proj in BF16): the experts, embedding, head and eh_proj exactly; the MLA
    projections and one shared expert as an upper bound (q_lora_rank and n_shared_experts are not read: the query
    projection is counted without its low rank). Only an FP8 or unquantized checkpoint of a DeepSeek-V3 MLA model
    at PP 1 with no draft; the layer is split over the ranks like the rest (the experts by TP, the vocabulary rows)."""
    g, sizes = inp.geometry, inp.sizes
    if (g is None or sizes is None or not g.num_nextn_predict_layers or not g.kv_lora_rank or inp.draft is not None
            or inp.pp > 1 or g.architecture != "DeepseekV3ForCausalLM" or sizes.quant_method not in (None, "fp8")
            or not (sizes.hidden_size and sizes.moe_intermediate_size and sizes.num_experts and sizes.vocab_size
                    and g.num_attention_heads and g.v_head_dim and g.qk_rope_head_dim)):
        return W
    h, mi, e, v = sizes.hidden_size, sizes.moe_intermediate_size, sizes.num_experts, sizes.vocab_size
    heads, vd, rope, kvl = g.num_attention_heads, g.v_head_dim, g.qk_rope_head_dim, g.kv_lora_rank
    fp8 = sizes.quant_method == "fp8"

    def mat(rows: int, cols: int) -> int:
        return _fp8_block(rows, cols) if fp8 else 2 * rows * cols

    experts = e * (2 * mat(mi, h) + mat(h, mi))
    exact = experts + 2 * v * h * 2 + 2 * h * h * 2 + 4 * h * 2  # + embed, head, eh_proj (BF16), enorm/hnorm/norms
    bound = (mat(heads * (vd + rope), h) + mat(kvl + rope, h) + mat(heads * 2 * vd, kvl) + mat(h, heads * vd)
             + 2 * mat(mi, h) + mat(h, mi) + e * h * 2 + e * 4)  # MLA projections, one shared expert, the router
    layers = g.num_nextn_predict_layers
    ranks = inp.tp * inp.pp
    lo, hi = layers * exact / ranks / GIB, layers * (exact + bound) / ranks / GIB
    notes.append(f"SGLang loads no multi-token-prediction layer without a draft (deepseek_v2.py load_weights): "
                 f"{lo:.2f}-{hi:.2f} GiB a rank of the checkpoint are not loaded")
    return Term(W.key, W.label, max(0.0, W.lo - hi), max(0.0, W.hi - lo), W.unit, W.kind,
                f"{W.basis}; less the {layers} MTP layer(s) SGLang skips without a draft (models/deepseek_v2.py "
                f"load_weights): {lo:.2f}-{hi:.2f} GiB a rank, counted from config.json in DeepSeek's FP8 layout")


#: the checkpoint dtypes SGLang serves as they are with ``--dtype auto`` (a float32 config is served in 16 bits)
_OWN_DTYPES = ("bfloat16", "float16")


def _own_dtype_weights(inp: PlanInput, assumed: Term) -> Term:
    """The weights per rank of an unquantized 16-bit checkpoint served in its own dtype, from SGLang's loader rather
    than the engines' shared assumption (checkpoint + up to 0.5 GiB + 2 %).

    ``DefaultModelLoader.load_model`` (model_loader/loader.py, 0.4.x-0.5.x) builds the model under
    ``set_default_torch_dtype(model_config.dtype)`` on the GPU, so every parameter is allocated at the checkpoint's
    own shape and dtype (the merged qkv and gate_up parameters are the sum of their parts) and the weights are
    copied into it; ``process_weights_after_loading`` re-lays out only quantized parameters. So nothing loaded with
    them grows with the weights; what does load is buffers: the largest is ``RotaryEmbedding``'s ``cos_sin_cache``,
    kept in FP32 on CUDA ("cache needs to be in FP32", layers/rotary_embedding.py, read in the 0.4.6 and 0.5.9
    wheels): max_position_embeddings (x the rope factor for the scaled variants) x rotary_dim x 4 B, at most
    head_dim (the rope head for MLA) for rotary_dim, twice for the sliding-window hybrids' local and global ropes.
    The rest (vocabulary padding to 64 rows, norms, allocator rounding, the CUDA context's growth) keeps the shared
    flat residue (``WEIGHT_OVERHEAD_GIB``, assumed). Calibration (the corpus, SGLang's "Load weight end ... mem
    usage" less the checkpoint's bytes and the rotary cache): Llama-3.1-8B 0.00 GiB (sglang_c048), Qwen2.5-0.5B
    0.06 (c049), Llama-2-7B 0.11 (c051). Not taken here, and left to the shared term: quantized checkpoints (their
    kernels re-lay out and pad), PP (the embedding and lm_head sit on the end stages), TP past the KV heads (their
    projections are replicated), a draft."""
    g, sizes = inp.geometry, inp.sizes
    if (g is None or sizes is None or sizes.quant_method is not None or not inp.weight_bytes or inp.pp > 1
            or (g.torch_dtype or "").replace("torch.", "") not in _OWN_DTYPES or inp.draft is not None
            or (g.num_kv_heads and inp.tp > g.num_kv_heads) or not g.max_position_embeddings):
        return assumed
    rope_dim = g.qk_rope_head_dim if g.is_mla else g.head_dim
    if not rope_dim:
        return assumed
    positions = g.max_position_embeddings * (sizes.rope_factor or 1.0)
    ropes = 2 if g.is_hybrid_swa else 1
    rotary = ropes * positions * rope_dim * 4 / GIB
    even = inp.weight_bytes / (inp.tp * inp.pp) / GIB
    residue = shared.WEIGHT_OVERHEAD_GIB
    return Term(assumed.key, assumed.label, even, even + rotary + residue, "GiB", ASSUMED,
                f"{inp.weight_bytes:,} bytes ({inp.weight_source}) / {inp.tp * inp.pp} ranks = {even:.2f} GiB "
                f"(formula: an unquantized {g.torch_dtype} checkpoint is allocated at its own shapes, SGLang "
                f"model_loader/loader.py), plus up to {rotary:.3f} GiB of FP32 rotary cache ({ropes} x "
                f"{positions:,.0f} positions x {rope_dim} x 4 B, layers/rotary_embedding.py) and {residue} GiB "
                "(assumed: vocabulary padding, norms, allocator rounding)")


def _draft_weights(inp: PlanInput) -> Term:
    """The draft's weights per rank: its checkpoint's bytes over the ranks, plus what loads with them (assumed)."""
    d = inp.draft
    assert d is not None
    if not d.weight_bytes:
        raise PlanError("--draft: the draft's weights are unknown: give its directory (its safetensors headers or "
                        "model.safetensors.index.json)")
    return shared.checkpoint_weights("draft_weights_gib", f"{d.algorithm} draft weights per rank", d.weight_bytes,
                                     d.weight_source, inp.tp * inp.pp)


def _draft_in_reserve(inp: PlanInput, era: VersionRange, tokens: tuple[int, int], weights: Term | None) -> Term:
    """To 0.5.13 the draft's weights and its own KV pool (the target's token count at the draft's cell) are taken
    after the target's pool is sized: out of the reserve."""
    d = inp.draft
    assert d is not None and weights is not None
    attn_tp = max(1, inp.tp // max(1, inp.dp_attention))
    dcell = cell_size(d.geometry, era, attn_tp, shared.kv_element(inp, d.geometry), inp.pp)
    kv_lo, kv_hi = tokens[0] * dcell.pool / GIB, tokens[1] * dcell.pool / GIB
    return Term("draft_in_reserve_gib", "the draft's weights and KV pool (out of the reserve)", weights.lo + kv_lo,
                weights.hi + kv_hi, "GiB", weights.kind,
                f"draft weights {weights.lo:.2f}-{weights.hi:.2f} GiB + the target's {tokens[0]:,}-{tokens[1]:,} "
                f"tokens x {dcell.pool:,} B (the draft's cell: {dcell.description}); graphs and activations come on "
                "top")


def _default(inp: PlanInput) -> tuple[float, str] | None:
    """SGLang's default mem_fraction_static for this release, card and layout (reconcile/sglang/defaults.py)."""
    from kvaudit.reconcile.sglang.defaults import default_fraction

    if inp.geometry is None:
        return None
    g = inp.geometry
    f, how = default_fraction(inp.version, inp.gpu_total_mib, inp.tp, inp.pp, inp.dp_attention, g.is_mla,
                              g.multimodal, inp.draft.algorithm if inp.draft else None, inp.post_capture,
                              g.architecture, inp.max_total_tokens, inp.context_length,
                              dsa=g.index_head_dim is not None)
    if f is None:
        raise PlanError(f"give --fraction (mem_fraction_static): {how}")
    return f, how + "; the release's default, as --mem-fraction-static is not given"


def _low_headroom(left: Term, had: calibrate.Observation | None) -> str | None:
    """whatif's LOW HEADROOM rule on the same terms (reconcile/sglang/whatif.py; docs/findings.md): what the reserve
    leaves for activations under low_headroom_gib, or under half of what the calibrating startups left, is a risk
    for long prefills at runtime, so a plan and a what-if of one startup say the same."""
    threshold = Thresholds().low_headroom_gib
    if left.lo < threshold:
        return (f"LOW HEADROOM: {left.lo:.2f}-{left.hi:.2f} GiB would be left for activations, under "
                f"{threshold:g} GiB: long prefills may run out of memory at runtime")
    if had is not None and left.lo < 0.5 * had.lo:
        return (f"LOW HEADROOM: activation headroom would fall from {had.lo:.2f} GiB (at the history's startup) to "
                f"{left.lo:.2f}-{left.hi:.2f} GiB, under half: long prefills may run out of memory at runtime")
    return None


def _starts(rest: Interval, left: Term | None, hi: int, lo: int, context: int | None) -> tuple[str, str]:
    """Whether it starts: SGLang raises "Not enough memory. Please try to increase --mem-fraction-static" when the
    budget is not positive (profile_max_num_token), and runs out of memory capturing graphs when the reserve
    cannot hold what it held before."""
    if rest.hi <= 0 or hi <= 0:
        return "no", "NOT_ENOUGH_MEMORY: the KV budget is not positive (SGLang stops: increase the fraction)"
    if left is not None and left.hi < 0:
        return "no", f"the reserve is {-left.hi:.2f} GiB short of what graphs and activations took before (OOM)"
    if rest.lo <= 0 or lo <= 0:
        return "at risk", "NOT_ENOUGH_MEMORY at the low end of the interval (the assumed terms decide)"
    if left is not None and left.lo < 0:
        return "at risk", "the reserve may not hold what graphs and activations took before"
    if context and hi < context:
        return "at risk", f"the pool holds fewer tokens than one {context:,}-token request"
    if left is None:
        return "yes", "the KV budget is positive; what graphs and activations take is not established (no startup)"
    return "yes", "the KV budget is positive and the reserve holds what it held before"
