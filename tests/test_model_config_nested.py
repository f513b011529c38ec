"""A language model nested two levels down in its config (thinker_config.text_config: Qwen3-ASR, Qwen2.5-Omni,
Qwen3-Omni) is read as vLLM reads it, get_hf_text_config -> config.get_text_config() ->
thinker_config.get_text_config(), never from an encoder's or a talker's sub-config."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import ConfigError, geometry_from_dict, load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.reconcile.vllm.cell import cell_size
from tests.conftest import ROOT

CONFIGS = ROOT / "fixtures" / "configs"
CORPUS = ROOT / "fixtures" / "corpus"



def test_qwen3_asr_reads_the_thinkers_text_decoder():
    """vLLM: hf_text_config = config.get_text_config() = thinker_config.get_text_config() (Qwen3ASRConfig):
    28 layers x 8 KV heads x 128, bf16 from thinker_config; the 24-layer audio encoder is not the model."""
    g = load_config(CONFIGS / "qwen3-asr-1.7b.json")
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.torch_dtype) == (28, 8, 128, "bfloat16")
    assert g.multimodal and g.architecture == "Qwen3ASRForConditionalGeneration"
    assert cell_size(g, 1, 2, 1)[0] == 114_688


def test_vllm_c075_matches_with_the_nested_config():
    """0.14.0: int(avail // 65,536 // 28) blocks; 262,160 tokens = 16,385 blocks x 16 within 28.0 GiB's rounding."""
    log = (CORPUS / "vllm_c075.log").read_bytes()
    a = audit(read_log(io.BytesIO(log)), AuditOptions(model_geometry=load_config(CONFIGS / "qwen3-asr-1.7b.json")))[-1]
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 262_160


def test_an_omni_config_never_reads_its_talker_or_encoders():
    """Qwen2.5-Omni / Qwen3-Omni: the thinker's text_config is the model vLLM serves (Qwen2_5OmniConfig /
    Qwen3OmniMoeConfig.get_text_config); the talker is a second decoder with its own num_hidden_layers."""
    omni = {"architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni",
            "talker_config": {"num_hidden_layers": 24, "num_attention_heads": 12, "num_key_value_heads": 4,
                              "hidden_size": 896},
            "thinker_config": {"audio_config": {"encoder_layers": 32, "d_model": 1280, "num_hidden_layers": 32},
                               "vision_config": {"depth": 32, "hidden_size": 1280},
                               "text_config": {"num_hidden_layers": 28, "num_attention_heads": 28,
                                               "num_key_value_heads": 4, "hidden_size": 3584,
                                               "torch_dtype": "bfloat16"}}}
    g = geometry_from_dict(omni, "omni")
    assert (g.num_layers, g.num_kv_heads, g.head_dim) == (28, 4, 128)
    qwen3_omni = {"architectures": ["Qwen3OmniMoeForConditionalGeneration"],
                  "talker_config": {"text_config": {"num_hidden_layers": 20, "num_key_value_heads": 2,
                                                    "num_attention_heads": 16, "head_dim": 128}},
                  "thinker_config": {"text_config": {"num_hidden_layers": 48, "num_attention_heads": 32,
                                                     "num_key_value_heads": 4, "head_dim": 128}}}
    g = geometry_from_dict(qwen3_omni, "omni3")
    assert (g.num_layers, g.num_kv_heads) == (48, 4)


def test_an_encoder_alone_is_refused_not_taken_for_the_model():
    cfg = {"architectures": ["X"], "thinker_config": {"audio_config": {"num_hidden_layers": 32, "d_model": 1280}}}
    with pytest.raises(ConfigError, match="no num_hidden_layers"):
        geometry_from_dict(cfg, "x")
    deep = {"thinker_config": {"text_config": {"text_config": {"num_hidden_layers": 2, "head_dim": 64}}}}
    with pytest.raises(ConfigError):  # three levels: deeper than any config vLLM reads
        geometry_from_dict(deep, "deep")
