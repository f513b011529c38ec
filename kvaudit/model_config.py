"""Model geometry from a Hugging Face ``config.json``: what sizes the KV cache.

Engine-neutral: the fields are read here, and each engine's formula module turns them into its own bytes
per token. Multimodal configs nest the language model under ``text_config`` (Kimi-K2.5, Qwen-VL, Gemma 3,
Llama 4, ...); ``llm_config`` and ``language_config`` are read the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: refuse to read a config.json larger than this: a real one is a few KB
MAX_CONFIG_BYTES = 4 << 20

_NESTED_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "auto": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "mxfp8": 1,
    "float8_e4m3fnuz": 1, "uint8": 1, "int8": 1,
    "fp4_e2m1": 0.5, "float4_e2m1fn_x2": 0.5, "fp4": 0.5,
}


class ConfigError(Exception):
    """The model config cannot be read or does not describe an attention model."""


@dataclass(frozen=True)
class ModelGeometry:
    """The fields of a model config that size the KV cache (per model, before any parallel split)."""

    source: str
    architecture: str | None
    model_type: str | None
    num_layers: int
    num_attention_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    v_head_dim: int | None
    kv_lora_rank: int | None  # set -> MLA
    qk_rope_head_dim: int | None
    index_head_dim: int | None  # DeepSeek-V3.2 NSA/DSA indexer
    torch_dtype: str | None
    kv_cache_quant_algo: str | None  # "FP8" in some checkpoints' quantization_config
    num_nextn_predict_layers: int | None
    full_attention_layers: int | None  # hybrid models: layers that hold a full KV cache
    sliding_window_layers: int | None
    linear_attention_layers: int | None
    max_position_embeddings: int | None
    multimodal: bool

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None and self.qk_rope_head_dim is not None

    @property
    def is_hybrid_swa(self) -> bool:
        return bool(self.sliding_window_layers) and bool(self.full_attention_layers)

    @property
    def is_mamba_hybrid(self) -> bool:
        return bool(self.linear_attention_layers)

    @property
    def dtype_bytes(self) -> float:
        return DTYPE_BYTES.get((self.torch_dtype or "bfloat16").replace("torch.", ""), 2)


def load_config(path: str | Path) -> ModelGeometry:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ConfigError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"model config {p} is {size:,} bytes; a config.json is a few KB")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read model config {p}: {exc}") from None
    return geometry_from_text(text, str(p))


def geometry_from_text(text: str, source: str) -> ModelGeometry:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model config {source} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"model config {source} is not a JSON object")
    return geometry_from_dict(raw, source)


def _int(d: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and v >= 0:
            return int(v)
    return None


def geometry_from_dict(raw: dict[str, Any], source: str) -> ModelGeometry:
    outer = raw
    cfg = raw
    for key in _NESTED_KEYS:
        inner = raw.get(key)
        if isinstance(inner, dict) and "num_hidden_layers" in inner:
            cfg = inner
            break
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if not layers:
        raise ConfigError(f"model config {source} has no num_hidden_layers")
    heads = _int(cfg, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, "num_key_value_heads", "num_query_groups", "n_head_kv", "multi_query_group_num")
    if kv_heads is None:
        kv_heads = heads
    hidden = _int(cfg, "hidden_size", "n_embd")
    head_dim = _int(cfg, "head_dim", "kv_channels")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    v_head_dim = _int(cfg, "v_head_dim")
    kv_lora = _int(cfg, "kv_lora_rank")
    rope = _int(cfg, "qk_rope_head_dim")
    if kv_lora is None and head_dim is None:
        raise ConfigError(f"model config {source} gives neither head_dim (or hidden_size/heads) nor kv_lora_rank")

    full = swa = linear = None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = [str(t) for t in layer_types]
        full = sum(1 for t in kinds if t in ("full_attention", "attention", "global"))
        swa = sum(1 for t in kinds if "sliding" in t or t == "local")
        linear = sum(1 for t in kinds if "linear" in t or "mamba" in t)
    elif _int(cfg, "full_attention_interval"):
        every = _int(cfg, "full_attention_interval") or 1
        full = layers // every
        linear = layers - full
    elif _int(cfg, "sliding_window_pattern") and cfg.get("sliding_window"):
        every = _int(cfg, "sliding_window_pattern") or 1
        full = layers // every
        swa = layers - full

    quant = outer.get("quantization_config") or cfg.get("quantization_config") or {}
    kv_algo = quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None
    arch = (outer.get("architectures") or cfg.get("architectures") or [None])[0]
    return ModelGeometry(
        source=source,
        architecture=arch if isinstance(arch, str) else None,
        model_type=cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        index_head_dim=_int(cfg, "index_head_dim"),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or outer.get("torch_dtype") or "") or None,
        kv_cache_quant_algo=str(kv_algo) if kv_algo else None,
        num_nextn_predict_layers=_int(cfg, "num_nextn_predict_layers"),
        full_attention_layers=full or None,
        sliding_window_layers=swa or None,
        linear_attention_layers=linear or None,
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
        multimodal=cfg is not outer or any(k in outer for k in ("vision_config", "audio_config")),
    )
