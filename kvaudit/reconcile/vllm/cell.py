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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvaudit.model_config import ModelGeometry


def cell_size(geom: ModelGeometry, tp: int, elt: float, pp: int = 1, split_v: bool = False) -> tuple[int, str]:
    layers = math.ceil(geom.num_layers / max(1, pp))
    if geom.is_mla:
        d = geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
        return int(layers * d * elt), f"MLA {d} x {layers} layers x {elt:g} B (no V)"
    h = max(1, (geom.num_kv_heads or 1) // max(1, tp))
    hd = geom.head_dim or 0
    vhd = (geom.v_head_dim or hd) if split_v else hd
    return int(layers * h * (hd + vhd) * elt), f"K+V {h} head(s) x ({hd} + {vhd}) x {layers} layers x {elt:g} B"


@dataclass(frozen=True)
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
