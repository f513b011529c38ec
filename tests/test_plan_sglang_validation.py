"""kvaudit plan for SGLang on real startups (issue 36): an unquantized 16-bit checkpoint's weights per rank are the
checkpoint's bytes plus SGLang's FP32 rotary cache and a flat residue (model_loader/loader.py allocates every
parameter at the checkpoint's own shape; layers/rotary_embedding.py keeps cos_sin_cache in FP32 on CUDA), not the
engines' shared "+ 2 %"; a quantized checkpoint keeps the shared assumption."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import CONFIGS, FIXTURES, cli

BENCH = FIXTURES.parent / "bench"
GIB = 2**30


def _model(tmp_path: Path, config: Path, total_size: int) -> str:
    d = tmp_path / config.stem
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(config.read_text())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total_size},
                                                                 "weight_map": {}}))
    return str(d)


def _terms(*args: str) -> dict:
    r = cli("plan", *args, "-f", "json")
    assert r.code in (0, 1), r.stderr
    return {t["key"]: t for t in json.loads(r.stdout)["terms"]}


def _case(case_id: str) -> tuple[dict, dict]:
    val = json.loads((BENCH / "plan_validation.json").read_text())
    case = next(c for c in val["cases"] if c["id"] == case_id)
    return case, val["checkpoints"][case["model"]]


def test_an_unquantized_checkpoints_weights_are_its_bytes_and_the_fp32_rotary_cache(tmp_path):
    """Qwen3-VL-32B on one H100 at 0.95 (StevenWang-CY/sglang-attention-reproducibility, a validation case): the
    log's 'Load weight end ... mem usage=62.29 GB' is inside the weights term, which is the checkpoint's 62.13 GiB
    plus at most 262,144 positions x 128 x 4 B (0.125 GiB) of rotary cache and the 0.5 GiB residue, and the KV
    budget it leads to holds the logged 12.26 GiB near its middle (it was -4.9 % with the shared + 2 %)."""
    case, ckpt = _case("stevenwang-sglang-qwen3-vl-32b-h100-0.95")
    model = _model(tmp_path, BENCH / "plan_configs" / ckpt["config"], ckpt["bytes"])
    t = _terms(model, "--engine", case["engine"], "--gpu", "h100", "--tp", "1", "--fraction", "0.95",
               "--kv-dtype", "fp8_e5m2", "--context-length", str(case["max_model_len"]))
    w, rest = t["weights_gib"], t["rest_gib"]
    assert round(w["low"], 2) == 62.13 and round(w["high"] - w["low"], 3) == 0.625  # 0.125 rotary + 0.5 residue
    assert w["low"] <= 62.29 <= w["high"] and "rotary" in w["basis"]
    assert rest["low"] <= case["logged_kv_gib"] <= rest["high"]
    assert abs((rest["low"] + rest["high"]) / 2 - case["logged_kv_gib"]) / case["logged_kv_gib"] < 0.02


def test_the_calibration_startups_load_within_the_term(tmp_path):
    """The corpus' SGLang startups of unquantized checkpoints whose bytes are known (calibration, not validation):
    Llama-3.1-8B's 'mem usage=15.02 GB' at TP 1 (sglang_c048; 16,060,522,496 B = 14.96 GiB, and 131,072 positions x
    128 x 4 B = 0.0625 GiB of rotary cache: the residue is nil) is inside the weights term."""
    model = _model(tmp_path, CONFIGS / "llama31-8b.json", 16_060_522_496)
    w = _terms(model, "--engine", "sglang==0.5.9", "--gpu", "h200", "--tp", "1", "--fraction", "0.85")["weights_gib"]
    assert w["low"] <= 15.02 <= w["high"] + 0.005  # the log's two decimals
    assert w["high"] - w["low"] < 0.6


def test_a_quantized_checkpoint_keeps_the_shared_assumption(tmp_path):
    """Qwen3-235B-A22B-FP8 (its config's quantization_config: fp8 in 128 x 128 blocks): SGLang's fp8 method re-lays
    out its weights after loading, so the plan keeps the shared checkpoint + 0.5 GiB + 2 %, and the validation
    case (vLLM #21348, 4 x H100 at 0.93) stays inside it."""
    case, ckpt = _case("vllm-21348-sglang-qwen3-235b-fp8-4xh100")
    model = _model(tmp_path, BENCH / "plan_configs" / ckpt["config"], ckpt["bytes"])
    t = _terms(model, "--engine", case["engine"], "--gpu", "h100", "--tp", "4", "--fraction", "0.93")
    w, rest = t["weights_gib"], t["rest_gib"]
    even = ckpt["bytes"] / 4 / GIB
    assert abs(w["high"] - (even * 1.02 + 0.5)) < 0.01 and "rotary" not in w["basis"]
    assert rest["low"] <= case["logged_kv_gib"] <= rest["high"]


def test_an_amd_card_at_tp8_takes_rccls_offset_from_t(tmp_path):
    """Qwen3-30B-A3B-Thinking on 8 MI300X at TP 8 (michael-amd/sglang-ci @b869aab, a validation case): on ROCm the
    distributed init takes 2.95-3.37 GB a rank ('Init torch distributed ends. mem usage='), so T (the least 'Load
    weight begin. avail mem=' 188.09 GB) is 3.4-3.9 GiB under the card's 191.98; with the CUDA offset (0.75-1.75 GiB)
    the plan missed the logged 128.64 GiB (+1.3 %, 129.42-131.34); with the ROCm range set on the corpus' sglang_c055
    (another model on that host) it holds it near the middle."""
    case, ckpt = _case("amd-sglang-qwen3-30b-a3b-thinking-mi300x-tp8")
    model = _model(tmp_path, BENCH / "plan_configs" / ckpt["config"], ckpt["bytes"])
    t = _terms(model, "--engine", case["engine"], "--gpu", "mi300x", "--tp", "8", "--fraction", str(case["fraction"]),
               "--page-size", "1")
    T, rest = t["t_gib"], t["rest_gib"]
    assert T["low"] <= 188.09 <= T["high"] and "RCCL" in T["basis"]
    assert rest["low"] <= case["logged_kv_gib"] <= rest["high"]
    assert abs((rest["low"] + rest["high"]) / 2 - case["logged_kv_gib"]) / case["logged_kv_gib"] < 0.005


def test_an_nvidia_card_keeps_the_cuda_offset(tmp_path):
    """The ROCm range is an AMD card's at TP 8 only: the same model on 8 H200s keeps 0.75-1.75 GiB."""
    _, ckpt = _case("amd-sglang-qwen3-30b-a3b-thinking-mi300x-tp8")
    model = _model(tmp_path, BENCH / "plan_configs" / ckpt["config"], ckpt["bytes"])
    T = _terms(model, "--engine", "sglang==0.5.6.post2", "--gpu", "h200", "--tp", "8", "--fraction", "0.8")["t_gib"]
    assert round(143771 / 1024 - T["high"], 2) == 0.75 and round(143771 / 1024 - T["low"], 2) == 1.75


def test_the_rocm_offset_holds_its_calibration_startup():
    """T_OFFSET_ROCM_GIB is set on the corpus' sglang_c055 (Llama-4-Maverick, 8x MI300X, v0.5.6.post2 image; not a
    validation case): the group's least 'Load weight begin. avail mem=' is 188.10 GB of the card's 196,592 MiB, and
    SGLang's T is that or up to 0.5 GiB above it on ROCm (docs/how-it-works.md): the whole offset is in the range."""
    import re

    from kvaudit.plan.cards import card
    from kvaudit.reconcile.sglang.planner import T_OFFSET_ROCM_GIB, t_offset

    text = (FIXTURES / "corpus" / "sglang_c055.log").read_text()
    least = min(float(v) for v in re.findall(r"Load weight begin\. avail mem=([0-9.]+) GB", text))
    total = card("mi300x").total_mib / 1024
    assert least == 188.10 and card("mi300x").name == "AMD Instinct MI300X"
    lo, hi = t_offset(8, on_rocm=True)
    assert (lo, hi) == T_OFFSET_ROCM_GIB and lo <= total - least - 0.5 and total - least <= hi
    assert t_offset(4, on_rocm=True) == t_offset(4)  # fewer ranks on ROCm: not seen, the CUDA range and a note


def test_deepseeks_mtp_layer_is_not_counted_without_a_draft(tmp_path):
    """DeepSeek-V3-0324 at TP 4 on MI300X (the PD prefill server, michael-amd/sglang-ci @41b7feb, a validation case):
    SGLang's load_weights skips model.layers.61 (the MTP layer) without a draft, so the log loaded 158.02 GB of a
    checkpoint whose bytes / 4 are 160.32 GiB. With the layer counted the plan's budget (3.26-8.08 GiB) missed the
    logged 9.36; without it the weights hold the logged load and the budget holds the pool."""
    case, ckpt = _case("amd-sglang-deepseek-v3-0324-pd-prefill-mi300x-tp4")
    model = _model(tmp_path, BENCH / "plan_configs" / ckpt["config"], ckpt["bytes"])
    t = _terms(model, "--engine", case["engine"], "--gpu", "mi300x", "--tp", "4", "--fraction", "0.88",
               "--page-size", "1")
    w, rest = t["weights_gib"], t["rest_gib"]
    assert w["low"] <= 158.02 <= w["high"] and w["low"] < ckpt["bytes"] / 4 / GIB - 3.4 and "MTP" in w["basis"]
    mtp = ckpt["bytes"] / 4 / GIB * 1.02 + 0.5 - w["high"]  # what the shared term's top lost
    assert 3.4 < mtp < 3.7
    assert rest["low"] <= case["logged_kv_gib"] <= rest["high"]
    assert abs((rest["low"] + rest["high"]) / 2 - case["logged_kv_gib"]) / case["logged_kv_gib"] < 0.02
