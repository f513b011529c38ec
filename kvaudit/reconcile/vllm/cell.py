"""Bytes per token per GPU, for uniform pools and for hybrid (attention + Mamba/GDN) pools.

Uniform (V0 ``CacheEngine.get_cache_block_size``; V1 ``AttentionSpec.page_size_bytes`` over all layers,
``v1/kv_cache_interface.py``): MLA keeps one latent vector (no V); MHA/GQA keeps K and V of
max(1, kv_heads // tp) heads; from about 0.14 V may have its own head dim.

Hybrid (V1 0.10+, ``v1/core/kv_cache_utils.py::_get_kv_cache_groups_uniform_page_size`` and
``get_kv_cache_config_from_groups``): the attention block size is raised until an attention page is at least a
Mamba page ("Setting attention block size to N tokens"), the Mamba page is padded to the same size ("Padding
mamba page size by X%"), layers are grouped by type into groups of ``group_size`` layers (the smaller type's
count, or the larger's when it is under 1.5x the smaller), and ``num_blocks = available // page // group_size``.
Every group takes a page per block, so one token slot costs ``attention bytes per token per layer x group_size
x groups``.

Sliding-window hybrids (Gemma-3, Gemma-4; ``SlidingWindowPool``): the same grouping, with the sliding layers'
groups holding only a window per request; see ``SlidingWindowPool``.
"""

from __future__ import annotations

import math

from kvaudit.model_config import ModelGeometry
from kvaudit.record import record


def cell_size(geom: ModelGeometry, tp: int, elt: float, pp: int = 1, split_v: bool = False) -> tuple[int, str]:
    layers = math.ceil(geom.num_layers / max(1, pp))
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        return int(layers * d * elt), f"MLA {d} x {layers} layers x {elt:g} B (no V)"
    h = max(1, (geom.num_kv_heads or 1) // max(1, tp))
    hd = geom.head_dim or 0
    vhd = (geom.v_head_dim or hd) if split_v else hd
    return int(layers * h * (hd + vhd) * elt), f"K+V {h} head(s) x ({hd} + {vhd}) x {layers} layers x {elt:g} B"


@record
class HybridPool:
    """The group layout of a hybrid pool on one GPU."""

    attention_token_bytes: int  # K+V of one token in one attention layer on this GPU
    block_size: int  # tokens per block (the unified attention block)
    full_layers: int
    other_layers: int  # Mamba/GDN (linear attention) layers
    group_size: int
    groups: int
    other_groups: int

    @property
    def page_bytes(self) -> int:
        return self.attention_token_bytes * self.block_size

    @property
    def bytes_per_token(self) -> int:
        """What one token slot costs across every group: the pool's bytes / token count (0.10-0.20 count)."""
        return self.attention_token_bytes * self.group_size * self.groups

    def blocks(self, available_bytes: float) -> int:
        return max(0, int(available_bytes // self.page_bytes // self.group_size))

    def tokens_by_blocks(self, blocks: int) -> int:
        """0.10-0.20: ``num_blocks // len(groups) * min_block_size``."""
        return blocks // self.groups * self.block_size

    def tokens_by_concurrency(self, blocks: int, max_model_len: int, state_pages: int) -> int:
        """0.21+: ``int(max_concurrency x max_model_len)``, with ``max_concurrency = num_blocks /
        cdiv(max memory per request, page)``: the full-attention group needs cdiv(max_model_len, block) pages per
        request, each Mamba group ``state_pages`` (1, more with speculative decoding or prefix caching)."""
        per_request = math.ceil(max_model_len / self.block_size) + self.other_groups * state_pages
        return int(blocks / per_request * max_model_len)

    def describe(self) -> str:
        return (f"hybrid: {self.attention_token_bytes:,} B/token per attention layer x block {self.block_size} = "
                f"{self.page_bytes:,} B pages; {self.full_layers} attention + {self.other_layers} Mamba layers in "
                f"{self.groups} groups of {self.group_size}: {self.bytes_per_token:,} B per token slot")


def hybrid_pool(geom: ModelGeometry, tp: int, elt: float, block_size: int) -> HybridPool | None:
    """The layout for a Mamba-hybrid config (``linear_attention_layers``), None for any other model."""
    if not geom.is_mamba_hybrid or geom.is_mla:
        return None
    other = geom.linear_attention_layers or 0
    full = geom.full_attention_layers or max(0, geom.num_layers - other)
    if full <= 0 or other <= 0:
        return None
    h = max(1, (geom.num_kv_heads or 1) // max(1, tp))
    per_layer = int(2 * h * (geom.head_dim or 0) * elt)
    small, large = min(full, other), max(full, other)
    group = large if large < small * 1.5 else small
    full_groups, other_groups = math.ceil(full / group), math.ceil(other / group)
    return HybridPool(per_layer, block_size, full, other, group, full_groups + other_groups, other_groups)


#: the architectures whose sliding-window layout is read in vLLM's model code (``models/gemma3.py``,
#: ``models/gemma4.py``, 0.20.0 and 0.22.0 wheels); any other sliding-window model is not modelled here
SLIDING_WINDOW_ARCHS = ("Gemma3", "Gemma4")


@record
class SlidingWindowPool:
    """A sliding-window hybrid's pool on one GPU (vLLM V1 hybrid KV cache manager).

    * each layer's page is ``block x kv_heads x (head + v_head) x element`` (``AttentionSpec.page_size_bytes``);
      ``kv_cache_utils.unify_kv_cache_spec_page_size`` raises the block of the layers with the smaller page by
      the ratio of the pages, so every page is the largest one (Gemma-4 fp8: sliding 16 heads x 256 x block 16
      = 131,072 B; full 4 heads x 512 x block 16 = 65,536 B, so the full layers' block becomes 32);
    * ``_get_kv_cache_groups_uniform_page_size``: groups of ``group_size`` layers (the smaller type's count,
      or the larger's when under 1.5x the smaller), the last group of a type padded ("Add N padding layers");
    * ``get_kv_cache_config_from_groups``: ``num_blocks = available // page // group_size``;
    * the logged count: to 0.20.0 ``num_blocks // len(groups) x min(block)``; from 0.20.1
      ``int(max_concurrency x max_model_len)`` (``_report_kv_cache_config``), with ``max_concurrency =
      num_blocks / sum over groups of the blocks one request may hold`` (``get_max_concurrency_for_kv_cache_config``):
      a full group ``cdiv(max_model_len, its block)``, a sliding group
      ``SlidingWindowSpec.max_admission_blocks_per_request = cdiv(min(window - 1 + max_num_batched_tokens,
      max_model_len), its block) + 1``.
    """

    full_token_bytes: int  # K+V of one token in one full-attention layer on this GPU
    swa_token_bytes: int
    full_block: int  # tokens per block after the page unification
    swa_block: int
    sliding_window: int
    full_layers: int
    swa_layers: int
    group_size: int
    full_groups: int
    swa_groups: int

    @property
    def page_bytes(self) -> int:
        return self.full_token_bytes * self.full_block

    @property
    def groups(self) -> int:
        return self.full_groups + self.swa_groups

    @property
    def padding_layers(self) -> int:
        return self.group_size * self.groups - self.full_layers - self.swa_layers

    @property
    def bytes_per_token(self) -> int:
        """What one block costs across the groups, per token of the smaller block (the 0.20.0 count's unit)."""
        return self.page_bytes * self.group_size // min(self.full_block, self.swa_block)

    def blocks(self, available_bytes: float) -> int:
        return max(0, int(available_bytes // self.page_bytes // self.group_size))

    def tokens_by_blocks(self, blocks: int) -> int:
        """To 0.20.0: ``num_blocks // len(groups) x min_block_size``."""
        return blocks // self.groups * min(self.full_block, self.swa_block)

    def swa_blocks_per_request(self, max_model_len: int, batched_tokens: int) -> int:
        """``SlidingWindowSpec.max_admission_blocks_per_request`` (0.20.0-0.22.0 wheels read)."""
        return math.ceil(min(self.sliding_window - 1 + batched_tokens, max_model_len) / self.swa_block) + 1

    def blocks_per_request(self, max_model_len: int, batched_tokens: int) -> int:
        return (self.full_groups * math.ceil(max_model_len / self.full_block)
                + self.swa_groups * self.swa_blocks_per_request(max_model_len, batched_tokens))

    def tokens_by_concurrency(self, blocks: int, max_model_len: int, batched_tokens: int) -> int:
        """From 0.20.1: ``int(num_blocks / blocks per request x max_model_len)``."""
        return int(blocks / self.blocks_per_request(max_model_len, batched_tokens) * max_model_len)

    def describe(self) -> str:
        pad = f" ({self.padding_layers} padding)" if self.padding_layers else ""
        return (f"sliding-window hybrid: {self.page_bytes:,} B pages (full layers {self.full_token_bytes:,} B/token x "
                f"block {self.full_block}, sliding {self.swa_token_bytes:,} B/token x block {self.swa_block}); "
                f"{self.full_layers} full + {self.swa_layers} sliding (window {self.sliding_window}) layers in "
                f"{self.groups} groups of {self.group_size}{pad}")


def sliding_window_unmodelled(geom: ModelGeometry) -> str | None:
    """Why a sliding-window hybrid's pool is not modelled here, None when it is (or the model is not one)."""
    if not geom.is_hybrid_swa or geom.is_mamba_hybrid or geom.is_mla:
        return None
    arch = geom.architecture or ""
    if not arch.startswith(SLIDING_WINDOW_ARCHS):
        return (f"{arch or 'this model'}: a sliding-window hybrid whose layout vLLM builds in its own model code; "
                "only Gemma-3 and Gemma-4 are modelled here")
    if not geom.sliding_window:
        return "the model config gives no sliding_window, which sizes the sliding layers' groups"
    if geom.num_kv_shared_layers:
        return (f"{geom.num_kv_shared_layers} layers reuse an earlier layer's KV (num_kv_shared_layers): their "
                "grouping is not modelled here")
    return None


def sliding_window_pool(geom: ModelGeometry, tp: int, elt: float, block_size: int) -> SlidingWindowPool | None:
    """The layout for a Gemma-3/Gemma-4 config, None for any other model or one ``sliding_window_unmodelled``
    names. Gemma-4 (``models/gemma4.py``, 0.20-0.22): the full layers use ``global_head_dim`` and, when
    ``attention_k_eq_v``, ``num_global_key_value_heads`` (K is stored twice: the V slot holds it)."""
    if not geom.is_hybrid_swa or sliding_window_unmodelled(geom) is not None:
        return None
    full_n, swa_n = geom.full_attention_layers or 0, geom.sliding_window_layers or 0
    hd = geom.head_dim or 0
    full_heads = geom.num_kv_heads or 1
    full_hd = hd
    if (geom.architecture or "").startswith("Gemma4"):
        full_hd = geom.full_head_dim or hd
        if geom.attention_k_eq_v and geom.full_kv_heads:
            full_heads = geom.full_kv_heads
    full_tok = int(2 * max(1, full_heads // max(1, tp)) * full_hd * elt)
    swa_tok = int(2 * max(1, (geom.num_kv_heads or 1) // max(1, tp)) * hd * elt)
    if full_tok <= 0 or swa_tok <= 0:
        return None
    big = max(full_tok, swa_tok)
    if big % full_tok or big % swa_tok:
        return None  # unify_kv_cache_spec_page_size raises NotImplementedError: the engine would not start
    full_block, swa_block = block_size * (big // full_tok), block_size * (big // swa_tok)
    small, large = min(full_n, swa_n), max(full_n, swa_n)
    group = large if large < small * 1.5 else small
    return SlidingWindowPool(full_tok, swa_tok, full_block, swa_block, geom.sliding_window or 0, full_n, swa_n, group,
                             math.ceil(full_n / group), math.ceil(swa_n / group))
