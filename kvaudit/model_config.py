"""Model geometry from a Hugging Face ``config.json``: what sizes the KV cache.

Engine-neutral: the fields are read here, and each engine's formula module turns them into its own bytes
per token. Multimodal configs nest the language model under ``text_config`` (Kimi-K2.5, Qwen-VL, Gemma 3,
Llama 4, ...); ``llm_config`` and ``language_config`` are read the same way. The Qwen omni family nests it two
levels down, ``thinker_config.text_config`` (Qwen2.5-Omni, Qwen3-Omni, Qwen3-ASR): vLLM reads the same sub-config,
``ModelConfig.hf_text_config = get_hf_text_config(hf_config)`` = ``config.get_text_config()``, which those config
classes override to ``self.thinker_config.get_text_config()`` (vLLM ``transformers_utils/configs/qwen3_asr.py``
``Qwen3ASRConfig``; transformers ``Qwen2_5OmniConfig``, ``Qwen3OmniMoeConfig``). Only these keys are descended:
an ``audio_config``/``vision_config`` encoder or a ``talker_config`` (a second decoder vLLM's engine does not run)
is never taken for the language model.
"""

from __future__ import annotations

from kvaudit.errors import KvauditError
import json
import math
from pathlib import Path
from typing import Any

from kvaudit.textsafe import printable
from kvaudit.record import record

#: refuse to read a config.json larger than this: a real one is a few KB
MAX_CONFIG_BYTES = 4 << 20

_NESTED_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")
#: how deep the language model may sit: thinker_config.text_config is two levels (the omni family)
_NESTED_DEPTH = 2

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "auto": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "mxfp8": 1,
    "float8_e4m3fnuz": 1, "uint8": 1, "int8": 1,
    # SGLang's FP4 KV (fp4_e2m1 / torch.float4_e2m1fn_x2): 0.5 B per value here; its one uint8 scale per 16
    # elements is added by reconcile/sglang/cell.py (get_cell_size_per_token: cell // 2 + n*k*layers*2 // 16)
    "fp4_e2m1": 0.5, "float4_e2m1fn_x2": 0.5, "fp4": 0.5,
    # NVFP4 (vLLM 0.2x --kv-cache-dtype nvfp4): 4-bit values and one fp8 (e4m3) scale per 16 of them
    "nvfp4": 0.5 + 1 / 16,
}


def element_bytes(name: object) -> float | None:
    """Bytes per KV element for a dtype name as the engines spell it (``torch.bfloat16``, ``fp8_e5m2``,
    ``fp8_ds_mla``: every fp8/float8 variant is one byte), None when unknown."""
    if not isinstance(name, str) or not name:
        return None
    key = name.replace("torch.", "").lower()
    if key.startswith("fp8") or key.startswith("float8"):
        return 1
    return DTYPE_BYTES.get(key)


class ConfigError(KvauditError):
    """The model config cannot be read or does not describe an attention model."""


@record
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
    #: sliding-window hybrids whose two kinds of layer differ (Gemma-4: ``num_global_key_value_heads``,
    #: ``global_head_dim`` for the full layers; MiMo: ``swa_num_key_value_heads``, ``swa_head_dim``,
    #: ``swa_v_head_dim`` for the sliding ones); None: as the model's own heads and head_dim
    full_kv_heads: int | None = None
    full_head_dim: int | None = None
    swa_kv_heads: int | None = None
    swa_head_dim: int | None = None
    swa_v_head_dim: int | None = None
    #: keys the config left out that kvaudit took from the model family's defaults (transformers' config class)
    defaults_used: tuple[str, ...] = ()
    #: why the geometry is known to be incomplete (a sliding-window family whose split the config does not give):
    #: bytes per token from it are not judged against the log (no geometry finding; "not modelled" instead)
    incomplete: str | None = None
    #: the window of the sliding layers (tokens), Gemma-4's ``attention_k_eq_v`` (its full layers keep
    #: ``num_global_key_value_heads`` only when set, vLLM ``models/gemma4.py``) and the layers that reuse an earlier
    #: layer's KV (``num_kv_shared_layers``): what vLLM's sliding-window groups are sized from
    sliding_window: int | None = None
    attention_k_eq_v: bool | None = None
    num_kv_shared_layers: int | None = None

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
    except UnicodeDecodeError as exc:  # Python's codec words ("can't decode byte 0xcd") say nothing to an operator
        raise ConfigError(f"model config {p} is not a UTF-8 text file (the byte at offset {exc.start:,} is not "
                          "UTF-8); a config.json is JSON text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    return geometry_from_text(text, str(p))


#: the largest value each dimension may take: far above any real model, small enough that nothing sized by it
#: (per-layer buffers, products of dimensions) can exhaust memory. A config past them is refused, not trusted.
BOUNDS = {"layers": 4096, "heads": 65536, "dim": 1 << 20, "other": 1 << 40}
_BOUND_OF = {
    "num_hidden_layers": "layers", "n_layer": "layers", "num_layers": "layers", "full_attention_interval": "layers",
    "sliding_window_pattern": "layers", "num_nextn_predict_layers": "layers",
    "num_attention_heads": "heads", "n_head": "heads", "num_key_value_heads": "heads", "num_query_groups": "heads",
    "n_head_kv": "heads", "multi_query_group_num": "heads",
    "hidden_size": "dim", "n_embd": "dim", "head_dim": "dim", "kv_channels": "dim", "v_head_dim": "dim",
    "kv_lora_rank": "dim", "qk_rope_head_dim": "dim", "index_head_dim": "dim",
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a config may hold")


def geometry_from_text(text: str, source: str) -> ModelGeometry:
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model config {source} is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # NaN / Infinity
        raise ConfigError(f"model config {source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"model config {source} is nested too deeply to be a config.json") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"model config {source} is not a JSON object")
    return geometry_from_dict(raw, source)


def _int(d: dict[str, Any], *keys: str, source: str = "") -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"model config {source}: {k} is {v}")
        if isinstance(v, (int, float)) and v >= 0:
            bound = BOUNDS[_BOUND_OF.get(k, "other")]
            if v > bound:
                raise ConfigError(f"model config {source}: {k} = {_short(v)} is beyond any real model (at most "
                                  f"{bound:,}); refusing to size a KV cache from it")
            return int(v)
    return None


def _short(v: float) -> str:
    text = str(v)
    return text if len(text) <= 24 else text[:10] + f"...({len(text)} digits)"


#: what a text config leaves out because its transformers class defaults it, per ``model_type``: read by SGLang
#: from the same class (``AutoConfig``), so the KV geometry it logs follows them.
#: gemma3_text: transformers ``models/gemma3/configuration_gemma3.py::Gemma3TextConfig`` (4.50+): 8 heads, 4 KV
#: heads, head_dim 256, 26 layers, sliding_window 4096, every 6th layer global (``sliding_window_pattern`` 6;
#: ``layer_types`` from 4.53 derive from it: layer i slides unless (i + 1) % 6 == 0).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26,
                    "sliding_window": 4096, "sliding_window_pattern": 6},
}
#: sliding-window hybrids in SGLang (``HybridSWAPoolConfigurator``: Gemma-2/3/4, Command-R 2 (cohere2), MiMo,
#: GPT-OSS): a config of these families that does not give the layer split is read incompletely
_SWA_FAMILIES = ("gemma2", "gemma3", "gemma4", "cohere2", "mimo", "gpt_oss")


def _is_text_model(d: dict[str, Any]) -> bool:
    return "num_hidden_layers" in d or str(d.get("model_type")) in _FAMILY_DEFAULTS


def _text_config(raw: dict[str, Any], depth: int = 0) -> list[dict[str, Any]]:
    """The path from the config down to the language model's sub-config (``[raw]`` when it is flat): the first
    text key (``_NESTED_KEYS``, in order) that holds a model, else one that holds another text key that does
    (``thinker_config`` -> ``text_config``), at most ``_NESTED_DEPTH`` levels down. A sub-config under any other
    key (an audio or vision encoder, a talker) is never entered."""
    if depth >= _NESTED_DEPTH:
        return [raw]
    for key in _NESTED_KEYS:
        inner = raw.get(key)
        if isinstance(inner, dict) and _is_text_model(inner):
            return [raw, inner]
    for key in _NESTED_KEYS:
        inner = raw.get(key)
        if isinstance(inner, dict):
            deeper = _text_config(inner, depth + 1)
            if len(deeper) > 1:
                return [raw, *deeper]
    return [raw]


def geometry_from_dict(raw: dict[str, Any], source: str) -> ModelGeometry:
    outer = raw
    chain = _text_config(raw)
    cfg = chain[-1]
    # settings a nested model leaves to the config around it (Qwen3-ASR states its dtype on thinker_config), the
    # nearest first
    around = chain[-2::-1]
    family = _FAMILY_DEFAULTS.get(str(cfg.get("model_type")), {})
    filled = tuple(k for k in family if k not in cfg)
    if filled:
        cfg = {**family, **cfg}
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", source=source)
    if not layers:
        raise ConfigError(f"model config {source} has no num_hidden_layers")
    heads = _int(cfg, "num_attention_heads", "n_head", source=source)
    kv_heads = _int(cfg, "num_key_value_heads", "num_query_groups", "n_head_kv", "multi_query_group_num", source=source)
    if kv_heads is None:
        kv_heads = heads
    hidden = _int(cfg, "hidden_size", "n_embd", source=source)
    head_dim = _int(cfg, "head_dim", "kv_channels", source=source)
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    v_head_dim = _int(cfg, "v_head_dim", source=source)
    kv_lora = _int(cfg, "kv_lora_rank", source=source)
    rope = _int(cfg, "qk_rope_head_dim", source=source)
    if kv_lora is None and head_dim is None:
        raise ConfigError(f"model config {source} gives neither head_dim (or hidden_size/heads) nor kv_lora_rank")

    full = swa = linear = None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = [str(t) for t in layer_types]
        full = sum(1 for t in kinds if t in ("full_attention", "attention", "global"))
        swa = sum(1 for t in kinds if "sliding" in t or t == "local")
        linear = sum(1 for t in kinds if "linear" in t or "mamba" in t)
    elif _int(cfg, "full_attention_interval", source=source):
        every = _int(cfg, "full_attention_interval", source=source) or 1
        full = layers // every
        linear = layers - full
    elif _int(cfg, "sliding_window_pattern", source=source) and cfg.get("sliding_window"):
        every = _int(cfg, "sliding_window_pattern", source=source) or 1
        full = layers // every
        swa = layers - full
    elif str(cfg.get("model_type")) == "gemma2" and cfg.get("sliding_window"):
        # transformers Gemma2 (and SGLang's gemma2.py): even layers slide, odd layers are global
        full = layers // 2
        swa = layers - full
    incomplete = None
    family_name = str(cfg.get("model_type") or outer.get("model_type") or "")
    if cfg.get("sliding_window") and not swa and family_name.startswith(_SWA_FAMILIES):
        incomplete = (f"{family_name} config with sliding_window but no layer split kvaudit can read "
                      "(layer_types / sliding_window_pattern): its sliding-window pools are not modelled")

    quant = outer.get("quantization_config") or next(
        (c["quantization_config"] for c in chain[:0:-1] if c.get("quantization_config")), None) or {}
    kv_algo = quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None
    archs = outer.get("architectures") or cfg.get("architectures") or [None]
    if not isinstance(archs, list) or not archs:
        raise ConfigError(f"model config {source}: architectures must be a list of class names, not "
                          f"{type(archs).__name__}")
    arch = archs[0]
    return ModelGeometry(
        source=source,
        architecture=printable(arch)[:200] if isinstance(arch, str) else None,
        model_type=printable(cfg["model_type"])[:200] if isinstance(cfg.get("model_type"), str) else None,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        index_head_dim=_int(cfg, "index_head_dim", source=source),
        torch_dtype=printable(str(next((c.get("torch_dtype") or c.get("dtype") for c in (cfg, *around)
                                        if c.get("torch_dtype") or c.get("dtype")), "")))[:64] or None,
        kv_cache_quant_algo=str(kv_algo) if kv_algo else None,
        num_nextn_predict_layers=_int(cfg, "num_nextn_predict_layers", source=source),
        full_attention_layers=full or None,
        sliding_window_layers=swa or None,
        linear_attention_layers=linear or None,
        max_position_embeddings=_int(cfg, "max_position_embeddings", source=source),
        multimodal=cfg is not outer or any(k in outer for k in ("vision_config", "audio_config")),
        full_kv_heads=_int(cfg, "num_global_key_value_heads", source=source),
        full_head_dim=_int(cfg, "global_head_dim", source=source),
        swa_kv_heads=_int(cfg, "swa_num_key_value_heads", source=source),
        swa_head_dim=_int(cfg, "swa_head_dim", source=source),
        swa_v_head_dim=_int(cfg, "swa_v_head_dim", source=source),
        defaults_used=filled,
        incomplete=incomplete,
        sliding_window=_int(cfg, "sliding_window", source=source),
        attention_k_eq_v=cfg["attention_k_eq_v"] if isinstance(cfg.get("attention_k_eq_v"), bool) else None,
        num_kv_shared_layers=_int(cfg, "num_kv_shared_layers", source=source),
    )
