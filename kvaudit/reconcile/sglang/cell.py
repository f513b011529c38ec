"""Bytes per token (SGLang's ``cell_size``) per era, from the model's config or from the KV line.

Upstream: ``ModelRunner.profile_max_num_token`` (0.3.0-0.5.6), ``get_cell_size_per_token`` (0.5.7-0.5.10),
``srt/model_executor/pool_configurator.py`` (0.5.11+). docs/how-it-works.md, section "Bytes per token".
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvaudit.model_config import DTYPE_BYTES, ModelGeometry
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding
from kvaudit.reconcile.sglang.pool import components, kv_gib, kv_parts
from kvaudit.record import Record, record
from kvaudit.units import GIB, LOG_HALF_ULP, MIB, Interval
from kvaudit.versions import VersionRange

if TYPE_CHECKING:
    from kvaudit.reconcile.sglang.context import Context

# The PyTorch caching allocator serves large tensors from segments rounded up to 2 MiB
# (c10/cuda/CUDACachingAllocator.cpp, kLargeBuffer / kRoundLarge); SGLang's pools are one tensor per layer.
ALLOC_ROUND = 2 * MIB

@record
class CellSize(Record):
    profile: int  # what profile_max_num_token divides by (before any draft inflation)
    pool: int  # bytes per token the pool tensors really hold
    buffers: tuple[int, ...]  # per-layer tensor bytes per token (for allocator rounding)
    description: str
    #: FP4: the packed values alone. MHATokenToKVPool.get_kv_size_bytes (mem_cache/memory_pool.py) counts only
    #: k_buffer/v_buffer up to 0.5.14 and adds k/v_scale_buffer from 0.5.16 (forks differ): the KV line may
    #: state either
    pool_without_scales: int | None = None


def element_bytes(dtype: str | None) -> float | None:
    if not dtype:
        return None
    key = dtype.replace("torch.", "").lower()
    return DTYPE_BYTES.get(key)


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers on each pipeline stage as SGLang splits them (``srt/distributed/utils.py::get_pp_indices``, taken
    from vLLM; 0.4.7+ sizes each stage's pool by its own ``end_layer - start_layer``): ``layers // pp`` each, and
    the remainder one apiece to the stages before the last, counting back from the second-to-last.
    ``SGLANG_PP_LAYER_PARTITION`` overrides this; the log does not show it."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def cell_size(geom: ModelGeometry, era: VersionRange, attn_tp: int, kv_elt: float, pp: int = 1,
              stage: int | None = None) -> CellSize:
    """SGLang's ``cell_size`` (bytes per token per rank), per era. Reference: docs/how-it-works.md
    section "Bytes per token"; upstream ``get_cell_size_per_token`` / ``pool_configurator.py``. With pipeline
    parallelism, ``stage`` picks one stage's layers; without it, the largest stage."""
    layers = geom.num_layers
    if geom.is_mamba_hybrid and geom.full_attention_layers:
        layers = geom.full_attention_layers  # 0.5.2+: only full-attention layers hold a KV cache
    if pp > 1:
        split = stage_layers(layers, pp)
        layers = split[stage] if stage is not None and 0 <= stage < pp else max(split)
    new_mha = era.lo >= (0, 5, 7)  # H*(hd+vhd)*L*elt from 0.5.7; H*hd*L*2*elt before
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        if kv_elt == 0.5:
            profile = (d * layers) // 2 + (d // 16) * layers
            pool_d = profile // layers
        else:
            profile = int(d * layers * kv_elt)
            pool_d = int(d * kv_elt)
            if geom.index_head_dim and kv_elt == 1 and era.lo >= (0, 5, 9):
                pool_d = geom.kv_lora_rank + geom.kv_lora_rank // 128 * 4 + geom.qk_rope_head_dim * 2  # type: ignore
                if era.lo >= (0, 5, 17):
                    profile = pool_d * layers
        extra = 0
        if geom.index_head_dim and not era.hi or (geom.index_head_dim and era.hi and era.hi >= (0, 5, 4)):
            ihd = geom.index_head_dim
            extra = (ihd + ihd // 128 * 4) * layers
        desc = f"MLA ({geom.kv_lora_rank} + {geom.qk_rope_head_dim}) x {layers} layers x {kv_elt:g} B"
        if extra:
            desc += f" + indexer {extra // layers} B x {layers}"
        return CellSize(profile + extra, pool_d * layers + extra, tuple([pool_d + extra // layers] * layers), desc)
    kv_heads = geom.num_kv_heads or 1
    h = max(1, kv_heads // max(1, attn_tp))
    hd = geom.head_dim or 0
    vhd = geom.v_head_dim or hd
    k_bytes = h * hd * kv_elt
    v_bytes = h * vhd * kv_elt
    if kv_elt == 0.5:
        base = h * (hd + vhd) * layers
        profile = base // 2 + (h * hd * layers * 2) // 16
    elif new_mha:
        profile = int(h * (hd + vhd) * layers * kv_elt)
    else:
        profile = int(h * hd * layers * 2 * kv_elt)
    heads_note = f"{kv_heads} KV heads / attention-TP {attn_tp}" if attn_tp > 1 else f"{kv_heads} KV heads"
    if kv_heads < attn_tp:
        heads_note += " (replicated: 1 per rank)"
    desc = f"MHA/GQA {h} head(s) ({heads_note}) x ({hd} + {vhd}) x {layers} layers x {kv_elt:g} B"
    if kv_elt == 0.5:
        # FP4 (float4_e2m1fn_x2, 0.5.x): two values a byte plus one scale byte per 16 elements of K and of V
        # (pool_configurator.py _compute_cell_size "kv_scale_buffer", scale_block_size 16; MHATokenToKVPool's
        # k/v_scale_buffer): the pool holds the scales too, and the KV line's K/V sizes include them
        scale = h * hd // 16
        desc += f" + scales 2 x {scale} B x {layers} layers (1 B per 16 elements)"
        buffers = tuple([int(k_bytes)] * layers + [int(v_bytes)] * layers + [scale] * (2 * layers))
        return CellSize(profile, profile, buffers, desc, int((k_bytes + v_bytes) * layers))
    buffers = tuple([int(k_bytes)] * layers + [int(v_bytes)] * layers)
    return CellSize(profile, int((k_bytes + v_bytes) * layers), buffers, desc)


def rounding_bytes(buffers: tuple[int, ...], rows: int) -> int:
    total = 0
    for per_token in buffers:
        b = per_token * rows
        total += -(-b // ALLOC_ROUND) * ALLOC_ROUND - b
    return total




def config_cell(ctx: Context, stage: int | None = None) -> tuple[CellSize | None, str | None]:
    geom: ModelGeometry | None = ctx.opts.model_geometry
    if geom is None or ctx.kv_elt is None:
        return None, None
    if geom.incomplete:
        # a config kvaudit reads incompletely proves nothing about the pool: no cell, no geometry finding
        return None, f"{geom.incomplete}; bytes per token from the KV lines"
    if geom.is_hybrid_swa and _one_full_pool(ctx):
        # the config is a sliding-window hybrid, the log shows one plain pool: SGLang did not treat it as one
        # (configs/model_config.py::is_hybrid_swa_model keeps an allow-list: Gemma-2/3 are not in it, 0.5.x;
        # --disable-hybrid-swa-memory does the same): every layer holds every token
        if geom.full_kv_heads or geom.full_head_dim or geom.swa_kv_heads or geom.swa_head_dim:
            return None, ("a sliding-window hybrid given one full-length pool, with layers of two shapes: not "
                          "modelled; bytes per token from the KV lines")
        note = (f"{geom.architecture or 'the model'} is a sliding-window hybrid by its config "
                f"({geom.full_attention_layers} full + {geom.sliding_window_layers} sliding layers), but SGLang gave "
                "it one full-length pool (no SWA pool in the log): the architecture is outside is_hybrid_swa_model's "
                "allow-list (configs/model_config.py), or --disable-hybrid-swa-memory was set, so every layer holds "
                "every token; from 0.5.16 a text_config with is_hybrid_swa: true opts a model in")
        flat = replace(geom, full_attention_layers=None, sliding_window_layers=None)
        return cell_size(flat, ctx.era, ctx.attn_tp, ctx.kv_elt, ctx.pp, stage), note
    if geom.is_hybrid_swa:
        ratio = ctx.args.get("swa_full_tokens_ratio")
        if ctx.era.lo >= (0, 5, 9) and isinstance(ratio, (int, float)) and not isinstance(ratio, bool) \
                and ctx.pp == 1 and geom.kv_lora_rank is None:
            return swa_cell(geom, ctx.attn_tp, ctx.kv_elt, float(ratio)), None
        why = ("SGLang before 0.5.9 splits a per-layer profile" if ctx.era.lo < (0, 5, 9)
               else "the log has no swa_full_tokens_ratio" if not isinstance(ratio, (int, float)) else
               "the split under pipeline parallelism or MLA is not modelled")
        return None, (f"hybrid sliding-window model: the full/SWA token split is not modelled here ({why}); "
                      "bytes per token are the whole pool's (both kinds of layers) per full-attention token, "
                      "from the KV lines")
    return cell_size(geom, ctx.era, ctx.attn_tp, ctx.kv_elt, ctx.pp, stage), None


def swa_pool_unused(ctx: Context) -> Finding | None:
    """SWA_POOL_UNUSED: the config is a sliding-window hybrid, the log one plain pool (sgl-project/sglang#39308's
    Spark2_5ForCausalLM: 73,728 B per token on all 36 layers instead of 18,432 B on the 9 full ones plus the SWA
    pool). What to set follows the release: drop --disable-hybrid-swa-memory when the log's server_args set it;
    else the architecture is outside ``is_hybrid_swa_model``'s allow-list (configs/model_config.py), which from
    0.5.13 also admits a text config with ``is_hybrid_swa: true`` and a ``hybrid_layer_pattern`` (1 = sliding,
    0 = full; ``get_hybrid_layer_ids``' fallback)."""
    geom: ModelGeometry | None = ctx.opts.model_geometry
    if (geom is None or geom.incomplete or ctx.kv_elt is None or not geom.is_hybrid_swa or not _one_full_pool(ctx)
            or geom.full_kv_heads or geom.full_head_dim or geom.swa_kv_heads or geom.swa_head_dim):
        return None
    flat = cell_size(replace(geom, full_attention_layers=None, sliding_window_layers=None), ctx.era, ctx.attn_tp,
                     ctx.kv_elt, ctx.pp)
    full_layers = geom.full_attention_layers or 0
    full = cell_size(replace(geom, num_layers=full_layers, full_attention_layers=None, sliding_window_layers=None),
                     ctx.era, ctx.attn_tp, ctx.kv_elt, ctx.pp)
    if not full.pool or not flat.pool:
        return None
    if ctx.args.get("disable_hybrid_swa_memory") is True:
        advice = "the log's server_args set disable_hybrid_swa_memory: drop --disable-hybrid-swa-memory"
    elif ctx.era.lo >= (0, 5, 13):
        advice = ("the architecture is outside SGLang's is_hybrid_swa_model allow-list (configs/model_config.py): "
                  "set is_hybrid_swa: true and hybrid_layer_pattern (one entry a layer, 1 = sliding, 0 = full) in "
                  "the model's text config to opt it in (SGLang 0.5.13+)")
    else:
        advice = ("the architecture is outside SGLang's is_hybrid_swa_model allow-list (configs/model_config.py), "
                  "or --disable-hybrid-swa-memory was set; from SGLang 0.5.13 a text config with is_hybrid_swa: "
                  "true and hybrid_layer_pattern (1 = sliding, 0 = full) opts a model in")
    return F.swa_pool_unused(geom.architecture or "the model", full_layers, geom.sliding_window_layers or 0,
                             flat.pool, full.pool, advice)


def _one_full_pool(ctx: Context) -> bool:
    """Every rank logged one unnamed KV pool and nothing of an SWA pool (no SWAKVPool summary, no sliding-window
    split line): SGLang did not size this model as a sliding-window hybrid."""
    from kvaudit.parse.sglang import SlidingWindowSplit

    if ctx.startup.of(SlidingWindowSplit):
        return False
    ranks = [rf for rf in ctx.facts.values() if rf.kv]
    return bool(ranks) and all(len(rf.kv) == 1 and not rf.kv[0].label and rf.swa_summary is None for rf in ranks) \
        and not any(rf.swa_summary is not None for rf in ctx.facts.values())


def swa_cell(geom: ModelGeometry, attn_tp: int, kv_elt: float, ratio: float) -> CellSize:
    """Bytes one full-attention token costs a sliding-window hybrid (SGLang 0.5.9+; 0.5.11+
    ``HybridSWAPoolConfigurator``, srt/model_executor/pool_configurator.py): ``F x n_full + r x S x n_swa``, F and
    S the per-layer bytes of a full and a sliding layer (K and V: the pool allocates V even where the config shares
    K and V, ``attention_k_eq_v``), r = ``swa_full_tokens_ratio``. The budget divides by it; the SWA pool then holds
    ``floor(full tokens x r)`` tokens (both page-aligned)."""
    def per_layer(heads: int | None, hd: int | None, vhd: int | None) -> float:
        h = max(1, (heads or 1) // attn_tp)
        return h * ((hd or 0) + (vhd or hd or 0)) * kv_elt

    full_hd = geom.full_head_dim or geom.head_dim
    full = per_layer(geom.full_kv_heads or geom.num_kv_heads, full_hd, geom.full_head_dim or geom.v_head_dim or full_hd)
    swa_hd = geom.swa_head_dim or geom.head_dim
    swa = per_layer(geom.swa_kv_heads or geom.num_kv_heads, swa_hd, geom.swa_v_head_dim or geom.v_head_dim or swa_hd)
    nf, ns = geom.full_attention_layers or 0, geom.sliding_window_layers or 0
    profile = full * nf + ratio * swa * ns
    desc = (f"sliding-window hybrid: full {full:,.0f} B x {nf} layers + swa_full_tokens_ratio {ratio:g} x SWA "
            f"{swa:,.0f} B x {ns} layers")
    return CellSize(int(round(profile)), int(round(profile)), (), desc)


#: the largest page size a server whose log does not state it may have run with (FlashMLA and TRT-LLM MLA
#: backends force 64; some use 128)
MAX_UNSTATED_PAGE = 128


def pad_rows(era: VersionRange, page_size: int | None) -> tuple[int, int]:
    """Extra rows the pool allocates beyond #tokens ("padded slot 0"), as the range the log allows:
    ``page_size`` from 0.4.5 on, 1 in 0.4.4 and before (``memory_pool.py``: ``size + page_size`` /
    ``size + 1``). An era that straddles 0.4.5, or a page size the log does not state, widens the range
    instead of guessing."""
    if era.hi is not None and era.hi < (0, 4, 5):
        return 1, 1
    page = (page_size, page_size) if page_size else (1, MAX_UNSTATED_PAGE)
    if era.lo >= (0, 4, 5):
        return page
    return min(1, page[0]), max(1, page[1])


#: architectures SGLang sizes with the NSA (DeepSeek sparse attention) pool: ``configs/model_config.py``
#: ``is_deepseek_nsa`` (with ``index_topk`` in the config; GlmMoeDsaForCausalLM from 0.5.9)
NSA_ARCHITECTURES = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")


def nsa_fp8_line_not_budget(ctx: Context) -> str | None:
    """Why the KV line of an NSA pool with an FP8 cache does not give the bytes the budget divides by, or None.
    ``NSATokenToKVPool`` stores each FP8 row as ``kv_lora_rank + kv_lora_rank // 128 * 4 + qk_rope_head_dim * 2``
    bytes (656 for DeepSeek-V3.2 and GLM-5: the scales and a 16-bit rope part), and its KV line counts those rows
    and the indexer's; ``get_cell_size_per_token`` (0.5.7-0.5.16) divides the budget by ``kv_lora_rank +
    qk_rope_head_dim`` (576) plus the indexer. Without the config the line's figure is the larger of the two and
    the split is not in the log; from 0.5.17 the profile counts the stored row (cell.py ``cell_size``).
    The model is known to be NSA from its architecture, or from the engine's own NSA lines (parse.sglang
    ``NsaModel``: printed only on the ``is_deepseek_nsa`` path), never from --nsa-*-backend alone, which a user
    may set for any model."""
    if ctx.kv_elt != 1 or (ctx.era.lo >= (0, 5, 17)):
        return None
    from kvaudit.parse.sglang import NsaModel, WeightEnd

    arch = next((e.model_type for e in ctx.startup.of(WeightEnd) if e.model_type in NSA_ARCHITECTURES), None)
    said = ctx.startup.of(NsaModel)
    if arch is None and not said:
        return None
    kept = nsa_fp8_row_is_budget(ctx, said)
    if kept is not None:
        note = (f"NSA pool with an FP8 KV cache: {kept} (model_runner_kv_cache_mixin.py calculate_mla_kv_cache_dim), "
                "so the KV line's bytes per token are the ones the budget divides by")
        if note not in ctx.notes:
            ctx.notes.append(note)
        return None
    why = arch or f"the engine's line {said[0].line}: NSA backends set"
    return (f"NSA (DeepSeek sparse attention) pool with an FP8 KV cache ({why}): its KV line counts rows "
            "of kv_lora_rank + scales + a 16-bit rope part (656 B a layer for DeepSeek-V3.2 and GLM-5) and the "
            "indexer, while SGLang before 0.5.17 divides the budget by kv_lora_rank + qk_rope_head_dim (576 B) "
            "and the indexer: the line's bytes per token are not the budget's, and the log does not give the "
            "split; pass --model-config (the model's config.json) to check the pool")


#: server_args values only AMD's builds take: the aiter and wave attention backends
_ROCM_BACKENDS = ("aiter", "wave")


def rocm_evidence(ctx: Context) -> str | None:
    """What in the startup shows an AMD ROCm build: its server_args (an AMD-only backend or KV dtype), else one of
    SGLang's HIP-only lines (parse/sglang.py RocmSign: server_args.py's, quantization/awq.py's import warning,
    custom_all_reduce.py's aiter all-reduce). None: nothing does (a ROCm server on the triton backend at TP 1 from
    0.5.8 on, with a checkpoint that is not AWQ, prints none of them)."""
    for key in ("attention_backend", "decode_attention_backend", "prefill_attention_backend"):
        value = ctx.args.get(key)
        if isinstance(value, str) and value in _ROCM_BACKENDS:
            return f"{key}='{value}'"
    for key, value in sorted(ctx.args.items()):
        if "aiter" in key and value is True:
            return f"{key}=True"
    dtype = ctx.args.get("kv_cache_dtype")
    if isinstance(dtype, str) and "fnuz" in dtype:
        return f"kv_cache_dtype='{dtype}'"
    from kvaudit.parse.sglang import RocmSign

    signs = ctx.startup.of(RocmSign)
    if signs:
        return f"line {signs[0].line}: {_rocm_sign_source(signs[0].text)}"
    return None


def _rocm_sign_source(text: str) -> str:
    """Which of SGLang's HIP-only lines (parse/sglang.py RocmSign) a sign is, in words."""
    if "fused_marlin_moe" in text:
        # quantization/awq.py: at import on HIP 0.4.10-0.5.7 (every start), in AWQConfig.__init__ 0.5.8-0.5.20
        return "quantization/awq.py's HIP-only warning"
    if "AiterCustomAllreduce" in text:
        # distributed/device_communicators/custom_all_reduce.py dispatch_custom_allreduce, 0.5.7+
        return "custom_all_reduce.py's AMD all-reduce"
    return "server_args.py says so"



def nsa_fp8_row_is_budget(ctx: Context, said: tuple | list) -> str | None:
    """Where SGLang keeps the NSA FP8 row at kv_lora_rank + qk_rope_head_dim (the budget's 576 B a layer), the
    KV line's bytes are the budget's: model_runner_kv_cache_mixin.py ``calculate_mla_kv_cache_dim`` returns the
    plain MLA dim for an NSA ``trtllm`` prefill or decode backend (0.5.9+) and, on HIP, for a ``tilelang`` one
    (0.5.10+: "nope(512 fp8) + rope(64 fp8) layout, without extra per-block scales"); 0.5.8 stores 656-byte rows
    for every backend. The backends come from the engine's ``Set NSA backends ...`` line, else server_args; ROCm
    from the signs ``rocm_evidence`` reads. Returns why, or None."""
    backends = {b for e in said for b in getattr(e, "backends", ())}
    for key in ("nsa_prefill_backend", "nsa_decode_backend"):
        value = ctx.args.get(key)
        if isinstance(value, str):
            backends.add(value)
    if ctx.era.lo >= (0, 5, 9) and "trtllm" in backends:
        return "the NSA trtllm backend keeps the 576-byte row (0.5.9+)"
    if ctx.era.lo >= (0, 5, 10) and "tilelang" in backends:
        sign = rocm_evidence(ctx)
        if sign is not None:
            return f"ROCm ({sign}) with the NSA tilelang backend keeps the 576-byte row (0.5.10+)"
    return None


def kv_line_cell(ctx: Context, tokens: int | None) -> tuple[Interval | None, float | None]:
    """Bytes per token implied by the target KV line(s): size / (tokens + padding rows), as an interval.
    For a sliding-window hybrid the size is the whole pool (both kinds of layers) and the tokens are the full-
    attention pool's: the bytes the pool spends per full-attention token, which is what the budget divides by."""
    size, parts = None, 0
    for rf in sorted(ctx.facts.values(), key=lambda r: r.rank):
        comps = components(rf)
        if any(c.backed for c in comps):
            return None, None  # rounded up per buffer to the VMM granularity: no cell from it
        if kv_gib(comps) is not None:
            size, parts = kv_gib(comps), kv_parts(comps)
            break
    if size is None or not tokens:
        return None, None
    pad_lo, pad_hi = pad_rows(ctx.era, ctx.page_size if ctx.page_size_known else None)
    total = Interval(size - parts * LOG_HALF_ULP, size + parts * LOG_HALF_ULP)
    if total.lo <= 0:  # a size that rounds to 0.00 bounds nothing below: no usable bytes per token
        return None, None
    cell = Interval(total.lo * GIB / (tokens + pad_hi), total.hi * GIB / (tokens + pad_lo))
    likely = min(max(ctx.page_size, pad_lo), pad_hi)  # the stated page size, else 1
    return cell, size * GIB / (tokens + likely)
