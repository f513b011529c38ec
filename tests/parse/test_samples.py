"""Every SGLang log users posted (fixtures/samples, described in INDEX.md) is read without error, with its
numbers checked: tokens, per-rank free memory, and bytes per token against the model config where INDEX
names one. Numbers below are copied from INDEX.md's 'key numbers' column, not from kvaudit's output."""

from __future__ import annotations

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import CONFIGS, SAMPLES

# file: tokens, {rank: free after weights}, {rank: free after pool}, (config, tp, expected B/token K+V per rank)
SAMPLES_EXPECTED = {
    "sglang_001": (834615, {"TP0": 131.08}, {"TP0": 14.61}, None),
    "sglang_003": (1106304, {}, {"TP0": 12.05}, ("qwen3-30b-a3b", 2, 49152)),
    "sglang_005": (2090351, {}, {"TP3": 12.68, "TP2": 12.45, "TP1": 12.45}, None),
    "sglang_006": (10000, {"TP0": 33.80}, {"TP0": 33.08, "TP1": 30.11}, ("deepseek-v3", 2, 70272)),
    "sglang_008": (161488, {"DP2 TP2": 31.87, "DP0 TP0": 31.96, "DP3 TP3": 31.87}, {"DP1 TP1": 21.23, "DP5 TP5": 21.23},
                   ("deepseek-v3", 8, 70272)),
    "sglang_012": (None, {}, {"TP1": 3.05, "TP2": 3.05, "TP0": 3.10, "TP3": 3.29}, None),
    "sglang_013": (580364, {"TP0": 19.08, "TP1": 19.08}, {"TP0": 4.02, "TP1": 4.02}, None),
    "sglang_017": (605665, {"TP0": 77.69}, {"TP0": 12.17}, None),
    "sglang_021": (1496958, {}, {"TP2": 22.56, "TP0": 22.59, "TP1": 22.56, "TP3": 22.71}, None),
    "sglang_025": (None, {"rank=3": 6.10, "rank=1": 5.59, "rank=0": 5.64, "rank=2": 5.59}, {}, None),
    "sglang_026": (None, {}, {}, None),  # 273K is a post-capture VA upper bound, not the pool (issue 34, item 10)
    "sglang_029": (105531, {"TP0": 8.37}, {"TP0": 1.68}, ("qwen2.5-7b", 1, 57344)),
    "sglang_031": (None, {}, {}, None),
    "sglang_034": (42632, {"TP0": 13.47}, {}, ("qwen3-32b", 2, 131072)),
    "sglang_035": (None, {"TP1": 20.62, "TP2": 20.62, "TP0": 20.91}, {"TP1": 18.20, "TP0": 18.48, "TP7": 18.48},
                   ("deepseek-v2", 8, None)),
}


def _audit(name: str, config=None, tp=None):
    with open(SAMPLES / f"{name}.log", "rb") as fh:
        log = read_log(fh)
    geom = load_config(CONFIGS / f"{config}.json") if config else None
    (a,) = audit(log, AuditOptions(source=name, model_geometry=geom, tp_size=tp))
    return a


@pytest.mark.parametrize("name", sorted(SAMPLES_EXPECTED))
def test_sample_numbers(name):
    tokens, post, pool_end, cfg = SAMPLES_EXPECTED[name]
    a = _audit(name, *(cfg[:2] if cfg else ()))
    assert a.engine == "sglang"
    assert a.formula.logged_tokens == tokens
    by_label = {r.label: r for r in a.ranks}
    for rank, v in post.items():
        assert by_label[rank].free_after_weights_gib == v
    for rank, v in pool_end.items():
        assert by_label[rank].free_after_pool_gib == v


@pytest.mark.parametrize("name", sorted(n for n, e in SAMPLES_EXPECTED.items() if e[3] and e[3][2]))
def test_sample_bytes_per_token_matches_config(name):
    tokens, _, _, (config, tp, expected) = SAMPLES_EXPECTED[name]
    a = _audit(name, config, tp)
    assert a.formula.bytes_per_token_source == "config"
    assert a.formula.bytes_per_token == expected
    # the KV line agrees with the config within its 2-decimal rounding
    assert not [f for f in a.findings if f.code == "GEOMETRY_MISMATCH"]
    assert a.formula.kv_bytes_per_token_logged == pytest.approx(expected, rel=0.01)


def test_sglang_029_reconciles():
    """INDEX: T 22.76, post 8.37, mfs 0.88 (server_args), Qwen2.5-7B geometry -> 105,531 inside the interval."""
    a = _audit("sglang_029", "qwen2.5-7b")
    f = a.formula
    assert (f.pre_load_free_gib, f.post_load_free_gib, f.mem_fraction_static) == (22.76, 8.37, 0.88)
    assert f.mem_fraction_static_source == "server_args"
    assert f.bytes_per_token == 57344
    assert f.predicted_tokens.low <= 105531 <= f.predicted_tokens.high
    assert f.predicted_tokens.high - f.predicted_tokens.low < 300  # the rounding of two logged values, no more
    assert f.verdict.value == "match"
    assert a.engine_version == "0.4.2..0.4.3"
    codes = {x.code for x in a.findings}
    assert {"TOKENS_MATCH", "RESERVE_EXPLAINS_FREE"} <= codes
    assert a.ranks[0].unexplained_gib == pytest.approx(0, abs=0.03)


def test_sglang_034_draft_lines_told_apart():
    a = _audit("sglang_034", "qwen3-32b", 2)
    tp0 = a.ranks[0]
    assert tp0.item("draft_weights").gib == 1.49
    assert tp0.item("draft_kv_cache").gib == 0.06
    assert tp0.kv_gib == 5.20  # the target's K 2.60 + V 2.60, not the draft's 0.03 + 0.03
    tp1 = a.ranks[1]
    assert tp1.kv_gib is None and tp1.item("draft_kv_cache").gib == 0.06  # TP1's target lines were cut


def test_sglang_025_failed_startup_and_imbalance():
    a = _audit("sglang_025")
    codes = {x.code: x for x in a.findings}
    assert codes["STARTUP_FAILED"].severity.value == "error"
    assert "Initialization failed" in codes["STARTUP_FAILED"].fields["detail"]
    # 0.51 GiB after loading is under the documented threshold (1 % of T 78.81 = 0.79 GiB)
    assert "RANK_IMBALANCE" not in codes


def test_sglang_006_capped_pool_is_not_read_as_a_fraction():
    """The thread ran --max-total-tokens 10000 (not in the excerpt): a round pool of 0.65 GiB with 33 GiB free.
    It is reported as a probable cap: no fraction inferred from it, no advice to raise one, no idle-memory
    warning for an excerpt that stops before the graphs."""
    a = _audit("sglang_006", "deepseek-v3", 2)
    codes = {f.code: f for f in a.findings}
    assert codes["TOKENS_CAPPED"].fields["probable"] is True
    assert a.formula.mem_fraction_static is None and a.formula.probable_cap
    assert not {"MFS_INFERRED", "UNUSED_MEMORY", "RESERVE_EXPLAINS_FREE"} & set(codes)


# vLLM: numbers from INDEX.md's key-numbers column
VLLM_EXPECTED = {
    # file: (tokens, {reading: value} on the first rank, GPU blocks)
    "vllm_001": (22096, {"weights_gib": 67.7229}, 1381),
    "vllm_004": (None, {"total_gib": 79.22, "util": 0.90, "requested_gib": 71.29, "weights_gib": 14.96,
                        "non_torch_gib": 1.79, "activation_gib": 1.26, "kv_gib": 53.29}, None),
    "vllm_006": (158656, {"weights_gib": 14.9889}, None),
    "vllm_008": (160624, {"weights_gib": 6.1138}, 10039),
    "vllm_010": (20128, {"weights_gib": 10.89, "non_torch_gib": 0.12, "activation_gib": 1.03, "kv_gib": 1.23}, 1258),
    "vllm_012": (1767200, {"weights_gib": 3.76, "kv_gib": 60.67}, None),
    "vllm_013": (31232, {"weights_gib": 14.9888, "total_gib": 23.58, "kv_gib": 3.81, "non_torch_gib": 0.35}, 1952),
    "vllm_016": (115056, {"total_gib": 79.19, "util": 0.90, "requested_gib": 71.27, "weights_gib": 12.55,
                          "non_torch_gib": 0.16, "activation_gib": 2.38, "kv_gib": 56.18}, 7191),
    "vllm_019": (None, {"total_gib": 139.72, "util": 1.00, "weights_gib": 39.66, "non_torch_gib": 2.53,
                        "activation_gib": 0.24, "kv_gib": 97.29}, None),
    "vllm_020": (None, {"kv_gib": 15.72}, None),
}


@pytest.mark.parametrize("name", sorted(VLLM_EXPECTED))
def test_vllm_sample_numbers(name):
    from kvaudit.parse.vllm import Blocks, Reading

    tokens, readings, blocks = VLLM_EXPECTED[name]
    with open(SAMPLES / f"{name}.log", "rb") as fh:
        log = read_log(fh)
    assert log.engine.name == "vllm"
    s = log.startups[-1]
    (a,) = audit(log, AuditOptions(source=name))
    assert a.engine == "vllm" and a.formula.logged_tokens == tokens
    got: dict[str, float] = {}
    for e in s.of(Reading):
        got.setdefault(e.key, e.value)
    for k, v in readings.items():
        assert got[k] == v, (k, got.get(k))
    if blocks is not None:
        assert min(b.gpu_blocks for b in s.of(Blocks)) == blocks
    if {"requested_gib", "kv_gib", "weights_gib"} <= set(readings) or name == "vllm_013":
        assert "BUDGET_RECONCILES" in {f.code for f in a.findings}


def test_vllm_013_tokens_follow_from_the_budget_with_the_config():
    """0.6.4: 23.58 x 0.90 - (17.06 + 0.35) = 3.81 GiB; Llama-3.1-8B: 131,072 B/token, blocks of 16 -> 1952 blocks."""
    a = _audit_v("vllm_013", "llama31-8b")
    f = a.formula
    assert f.bytes_per_token == 131072 and f.verdict.value == "match"
    assert f.predicted_tokens.low <= 31232 <= f.predicted_tokens.high
    assert f.mem_fraction_static == 0.90 and f.pre_load_free_gib == 23.58


def test_vllm_016_bytes_per_token_from_the_blocks():
    """No config: 56.18 GiB / (7191 blocks x 16) = 524,291 B/token, a 32-layer, 32-KV-head 7B model (524,288)."""
    a = _audit_v("vllm_016", None)
    assert a.formula.bytes_per_token_source == "kv_line"
    assert abs(a.formula.bytes_per_token - 524288) < 100
    assert abs(a.ranks[0].unexplained_gib) <= a.ranks[0].unexplained_tolerance_gib


def test_vllm_019_full_utilisation_leaves_no_headroom():
    a = _audit_v("vllm_019", None)
    assert "LOW_HEADROOM" in {f.code for f in a.findings}


def _audit_v(name, config):
    with open(SAMPLES / f"{name}.log", "rb") as fh:
        log = read_log(fh)
    geom = load_config(CONFIGS / f"{config}.json") if config else None
    (a,) = audit(log, AuditOptions(source=name, model_geometry=geom))
    return a
