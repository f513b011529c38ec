"""Bytes per token from model configs (reference section 2), by pool kind and era."""

from __future__ import annotations

import json

import pytest

from kvaudit.model_config import ConfigError, geometry_from_dict, geometry_from_text, load_config
from kvaudit.reconcile.sglang import cell_size
from kvaudit.versions import VersionRange
from tests.conftest import CONFIGS, SAMPLES, cli_process

V059 = VersionRange((0, 5, 9), (0, 5, 9))
V045 = VersionRange((0, 4, 5), (0, 4, 5))
V0517 = VersionRange((0, 5, 17), None)


@pytest.mark.parametrize("config,tp,elt,era,expected", [
    ("llama31-8b", 1, 2, V059, 8 * 128 * 32 * 2 * 2),           # reference 2.1 example: 131,072
    ("deepseek-v3", 8, 2, V059, 70272),                          # MLA, no TP split
    ("kimi-k2.5", 8, 2, V059, 70272),                            # nested text_config
    ("deepseek-v3", 8, 1, V059, 35136),                          # fp8 KV
    ("deepseek-v3.2", 8, 2, V059, 70272 + 8052),                 # + NSA indexer: 78,324
    ("qwen2.5-7b", 1, 2, V045, 28 * 4 * 128 * 2 * 2),            # head_dim = hidden / heads
    ("qwen3-30b-a3b", 2, 2, V059, 48 * 2 * 128 * 2 * 2),         # 4 KV heads / TP2
    ("qwen3-32b", 8, 2, V059, 64 * 1 * 128 * 2 * 2),             # 8 KV heads / TP8
    ("qwen2-7b", 8, 2, V059, 28 * 1 * 128 * 2 * 2),              # 4 KV heads, TP8: replicated, 1 per rank
    ("qwen2-0.5b", 1, 2, V059, 24 * 2 * 64 * 2 * 2),             # head_dim 896/14 = 64
])
def test_cell_size(config, tp, elt, era, expected):
    g = load_config(CONFIGS / f"{config}.json")
    assert cell_size(g, era, tp, elt).profile == expected


def test_mha_v_head_dim_counts_from_0_5_7():
    g = geometry_from_dict({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "head_dim": 192, "v_head_dim": 128}, "x")
    assert cell_size(g, VersionRange((0, 5, 6), (0, 5, 6)), 1, 2).profile == 2 * 192 * 2 * 2 * 2
    assert cell_size(g, VersionRange((0, 5, 7), None), 1, 2).profile == 2 * (192 + 128) * 2 * 2


def test_nsa_fp8_pool_dim_656_from_0_5_9():
    g = load_config(CONFIGS / "deepseek-v3.2.json")
    c = cell_size(g, V059, 8, 1)
    assert c.pool == (656 + 132) * 61
    assert c.profile == 576 * 61 + 132 * 61  # the profiler still budgets 576 until 0.5.17
    assert cell_size(g, V0517, 8, 1).profile == (656 + 132) * 61


def test_fp4_mla():
    g = load_config(CONFIGS / "deepseek-v3.json")
    assert cell_size(g, VersionRange((0, 5, 6), None), 1, 0.5).profile == (576 * 61) // 2 + (576 // 16) * 61


def test_hybrid_layer_types():
    g = geometry_from_dict({"num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                            "head_dim": 256, "full_attention_interval": 4}, "qwen3-next")
    assert (g.full_attention_layers, g.linear_attention_layers) == (12, 36)
    assert cell_size(g, V059, 1, 2).profile == 12 * 2 * 256 * 2 * 2


@pytest.mark.parametrize("text,match", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"hidden_size": 10}', "num_hidden_layers"),
    ('{"num_hidden_layers": 2}', "head_dim"),
])
def test_bad_configs_get_a_clear_error(text, match):
    with pytest.raises(ConfigError, match=match):
        geometry_from_text(text, "cfg.json")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.json")


def test_oversized_config_is_refused(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"num_hidden_layers": 1, "pad": "x" * (5 << 20)}))
    with pytest.raises(ConfigError, match="few KB"):
        load_config(p)


# --- hostile configs: bounded, one line, exit 2 (never a traceback, never gigabytes) -------------------------


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(num_hidden_layers=300_000_000), "beyond any real model"),
    (lambda d: d.update(num_hidden_layers=10**400), "beyond any real model"),
    (lambda d: d.update(head_dim=1 << 30), "head_dim"),
    (lambda d: d.update(architectures=42), "architectures must be a list"),
    (lambda d: d.update(architectures="LlamaForCausalLM"), "architectures must be a list"),
])
def test_hostile_config_values(tmp_path, edit, message):
    import json

    d = json.loads((CONFIGS / "llama3-8b.json").read_text())
    edit(d)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    r = cli_process("explain", SAMPLES / "sglang_029.log", "-m", p)
    assert r.code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


@pytest.mark.parametrize("text,message", [
    ('{"num_hidden_layers": Infinity, "head_dim": 128}', "Infinity"),
    ('{"num_hidden_layers": NaN, "head_dim": 128}', "NaN"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_hostile_config_text(tmp_path, text, message):
    p = tmp_path / "config.json"
    p.write_text(text)
    r = cli_process("explain", SAMPLES / "sglang_029.log", "-m", p)
    assert r.code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
