"""TensorRT-LLM (issue #13): the grammar on every prefix shape, the formula on the public samples and on
fixtures written from the format strings (fixtures/trtllm_classes/). Expected numbers are worked by hand here."""

from __future__ import annotations

import io
import math

import pytest

from kvaudit.explain import NoStartupError, audit, read_log
from kvaudit.model_config import load_config
from kvaudit.parse.lines import Line
from kvaudit.parse.trtllm import Cap, KVAllocation, Reading, parse_line, rank_of
from kvaudit.reconcile.interface import AuditOptions, Verdict
from tests.conftest import CONFIGS, ROOT, SAMPLES, cli

CLASSES = ROOT / "fixtures" / "trtllm_classes"
GIB = 2**30
LLAMA31 = load_config(CONFIGS / "llama31-8b.json")


def run(path, geom=None, **opts):
    with open(path, "rb") as fh:
        log = read_log(fh)
    assert log.engine.name == "trtllm"
    (a,) = audit(log, AuditOptions(model_geometry=geom, **opts))
    return a


def codes(a):
    return {f.code: f for f in a.findings}


def item(ledger, key):
    it = ledger.item(key)
    return it.gib if it else None


# --- grammar ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line,rank", [
    ("[12/20/2025-04:21:51] [TRT-LLM] [I] Estimated max memory in KV cache : 5.95 GiB", ""),
    ("[12/20/2025-04:21:51] [TRT-LLM] [RANK 3] [I] Estimated max memory in KV cache : 5.95 GiB", "rank 3"),
    ("[TRT-LLM] [MPI_Rank 1] [I] Estimated max memory in KV cache : 5.95 GiB", "rank 1"),
    ("[03/01/2026-10:00:00] [TRT-LLM] [I] [batchmgr][RANK 2] Estimated max memory in KV cache : 5.95 GiB", "rank 2"),
    ("[TensorRT-LLM][INFO][5] Estimated max memory in KV cache : 5.95 GiB", "rank 5"),
    ("I0410 12:00:00.123456 1 model_instance_state.cc:812] [TensorRT-LLM][INFO] Estimated max memory in KV cache"
     " : 5.95 GiB", ""),
    ("2025-06-01T12:00:00.123Z  INFO worker: [TRT-LLM] [I] Estimated max memory in KV cache : 5.95 GiB", ""),
    ("Estimated max memory in KV cache : 5.95 GiB", ""),  # prefix stripped by the user
])
def test_every_prefix_shape(line, rank):
    (e,), _ = parse_line(Line(1, line))
    assert isinstance(e, Reading) and (e.key, e.value) == ("estimated_kv_gib", 5.95)
    assert rank_of(line).label == rank


def test_the_peak_line_in_its_four_shapes():
    base = ("Peak memory during memory usage profiling (torch + non-torch): 113.65 GiB, available KV cache memory "
            "when calculating max tokens: 5.95 GiB")
    shapes = {
        base: {"peak_gib": 113.65, "available_gib": 5.95},
        base + ", fraction is set 0.9, kv size is 73728": {"fraction": 0.9, "bytes_per_token": 73728},
        base + ", fraction is set 0.9, kv size is 73728. device total memory 119.70 GiB, , tmp kv_mem 0.56 GiB":
            {"total_gib": 119.70, "tmp_kv_gib": 0.56},
        base + (", fraction is set 0.9, kv size per token is 163840 bytes/token + 4096 bytes fixed cost. device "
                "total memory 139.80 GiB, temporary kv cache memory during profiling 1.25 GiB"):
            {"bytes_per_token": 163840, "fixed_cost_bytes": 4096, "total_gib": 139.80, "tmp_kv_gib": 1.25},
    }
    for text, expected in shapes.items():
        events, clues = parse_line(Line(1, "[TRT-LLM] [I] " + text))
        got = {e.key: e.value for e in events}
        assert got.items() >= expected.items(), text
    _, clues = parse_line(Line(1, base + ", fraction is set 0.9, kv size per token is 163840 bytes/token. device total "
                                         "memory 139.80 GiB, temporary kv cache memory during profiling 1.25 GiB"))
    assert clues and clues[0].lo >= (1, 2, 0)


def test_caps_and_pool_lines():
    ev = lambda t: parse_line(Line(1, t))[0]  # noqa: E731
    (c,) = ev("[TRT-LLM] [I] max_tokens=200000 is provided. It limits max memory to 24.41 GiB. New max_memory is set "
              "to 24.41 GiB")
    assert isinstance(c, Cap) and (c.kind, c.tokens, c.result_gib) == ("max_tokens", 200000, 24.41)
    (c,) = ev("[TRT-LLM] [I] max_tokens=200000 is provided, max_memory is set to 24.41 GiB")
    assert (c.tokens, c.result_gib) == (200000, 24.41)
    (c,) = ev("[TRT-LLM] [I] max_gpu_total_bytes=20.00 GiB is provided. New max memory is 20.00 GiB")
    assert (c.kind, c.limit_gib, c.result_gib) == ("max_gpu_total_bytes", 20.0, 20.0)
    (c,) = ev("[TensorRT-LLM][WARNING] Both freeGpuMemoryFraction (aka kv_cache_free_gpu_mem_fraction) and maxTokens "
              "(aka max_tokens_in_paged_kv_cache) are set (to 0.900000 and 100000, respectively). The smaller value "
              "will be used.")
    assert (c.kind, c.fraction, c.tokens) == ("both_set", 0.9, 100000)
    (a,) = ev("[TensorRT-LLM][INFO] [MemUsageChange] Allocated 63.44 GiB for max tokens in paged KV cache (259840).")
    assert isinstance(a, KVAllocation) and (a.gib, a.tokens) == (63.44, 259840)
    (r,) = ev("[TRT-LLM] [I] KV cache manager v2 device quota set to 40.0GiB")
    assert (r.key, r.value) == ("quota_gib", 40.0)
    (r,) = ev("[TRT-LLM] [I] Reserving 2.00 GiB for the multimodal encoder cache while estimating KV cache capacity.")
    assert (r.key, r.value) == ("multimodal_gib", 2.0)
    (r,) = ev("[TensorRT-LLM][INFO] [MemUsageChange] Allocated 43.29 MB GPU memory for runtime buffers.")
    assert (r.key, round(r.value * 1024, 2)) == ("buffers_gib", 43.29)  # KB/MB/GB are base 1024


def test_a_trtllm_log_is_never_read_as_sglang_or_vllm():
    for p in sorted(SAMPLES.glob("trtllm_*.log")):
        with open(p, "rb") as fh:
            assert read_log(fh).engine.name == "trtllm", p.name


def test_a_log_mixing_trtllm_and_vllm_is_refused():
    mixed = (SAMPLES / "trtllm_003.log").read_bytes() + (SAMPLES / "vllm_016.log").read_bytes()
    with pytest.raises(NoStartupError, match="mixes"):
        read_log(io.BytesIO(mixed))


def test_another_engines_oom_line_is_not_a_trtllm_startup():
    text = (SAMPLES / "vllm_013.log").read_bytes() + b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert read_log(io.BytesIO(text)).engine.name == "vllm"


# --- the complete 1.1.0rc3 sample ---------------------------------------------------------------------------------


def test_complete_sample_matches_to_the_token():
    """(119.70 - 113.65 + 0.56) x 0.9 = 5.949 GiB; each of the three logged values +-0.005 GiB gives
    5.9355..5.9625 GiB; / 73,728 B, then up to whole 32-token blocks: 86,464..86,848, and the pool is 86,720."""
    a = run(SAMPLES / "trtllm_001.log")
    f = a.formula
    fr = 0.8999999761581421
    lo = math.ceil(math.floor((119.70 - 113.65 + 0.56 - 0.015) * fr * GIB / 73728) / 32) * 32
    hi = math.ceil(math.floor((119.70 - 113.65 + 0.56 + 0.015) * fr * GIB / 73728) / 32) * 32
    assert (f.predicted_tokens.low, f.predicted_tokens.high) == (lo, hi)
    assert f.logged_tokens == 86720 and lo <= 86720 <= hi and f.verdict == Verdict.MATCH
    assert a.engine == "trtllm" and a.engine_version == "1.1.0"
    c = codes(a)
    assert "TOKENS_MATCH" in c and "BUDGET_RECONCILES" in c
    assert any("86,711" in n and "86,720 = the pool" in n for n in a.notes)
    ledger = a.ranks[0]
    assert item(ledger, "weights") == 63.52 and item(ledger, "activation_peak") == 0.85
    assert item(ledger, "outside_torch") == pytest.approx(49.28 - 0.56)
    assert item(ledger, "kv_cache") == 5.95
    assert abs(ledger.unexplained_gib) <= ledger.unexplained_tolerance_gib


def test_every_fact_of_the_complete_sample_is_in_the_json():
    d = cli("explain", SAMPLES / "trtllm_001.log", "-f", "json").json()
    assert d["engine"] == "trtllm"
    logged = d["ranks"][0]["logged"]
    for key, value in {"total_gib": 119.70, "peak_gib": 113.65, "available_gib": 5.95, "tmp_kv_gib": 0.56,
                       "bytes_per_token": 73728, "weights_gib": 63.32, "weights_in_torch_gib": 63.52,
                       "weights_outside_torch_gib": 49.78, "activation_gib": 0.85, "outside_torch_gib": 49.28,
                       "estimated_kv_gib": 5.95, "tokens_per_block": 32, "kv_pool_gib": 5.95,
                       "kv_pool_tokens": 86720}.items():
        assert logged[key] == value, key
    assert d["formula"]["mem_fraction_static"] == 0.8999999761581421 and d["formula"]["page_size"] == 32


# --- fixtures ---------------------------------------------------------------------------------------------------


def test_pytorch_backend_2026_shape():
    """(79.19 - 19.17 + 0.50) x 0.9 = 54.468 GiB = 446,201 tokens of 131,072 B -> 13,944 blocks of 32."""
    a = run(CLASSES / "pytorch-1.2-llama31-8b-h100.log", LLAMA31)
    assert a.formula.logged_tokens == math.ceil(math.floor(60.52 * 0.8999999761581421 * GIB / 131072) / 32) * 32
    assert a.formula.verdict == Verdict.MATCH and a.formula.bytes_per_token_source.startswith("log")
    assert "GEOMETRY_MISMATCH" not in codes(a)  # the config's 131,072 B agrees with the logged size
    ledger = a.ranks[0]
    assert item(ledger, "headroom") == pytest.approx(60.52 - 54.47, abs=0.01)
    assert abs(ledger.unexplained_gib) <= ledger.unexplained_tolerance_gib


def test_configured_max_tokens_is_a_cap():
    a = run(CLASSES / "max-tokens-cap-1.2.log")
    c = codes(a)["TOKENS_CAPPED"]
    assert c.fields["max_tokens"] == 200000 and c.fields["budget_gib"] > 54
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 200000
    assert a.formula.max_total_tokens_cap == 200000


def test_multimodal_reservation_comes_off_the_budget():
    a = run(CLASSES / "multimodal-reserve-1.2.log")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 429824
    assert any("after the fraction" in n for n in a.notes)
    assert item(a.ranks[0], "multimodal_encoder") == 2.0


def test_kv_manager_v2_quota():
    a = run(CLASSES / "kv-manager-v2-2026.log")
    assert any("quota 40.00 GiB" in n for n in a.notes)
    assert a.engine_version == "1.3.0"


def test_cpp_runtime_ranks_take_the_smallest_budget():
    """Rank 1 had 68.20 GiB available (rank 0: 70.48): 68.20 x 0.9 = 61.38 GiB; with Llama-3.1-8B at TP2
    (4 KV heads per rank, bf16: 65,536 B/token) that is 1,005,649 tokens -> 1,005,696 in blocks of 64."""
    a = run(CLASSES / "cpp-tp2-ranks-0.17.log", LLAMA31)
    assert a.model.attention_tp_size == 2 and a.model.attention_tp_size_at_least
    assert a.formula.bytes_per_token == 65536 and a.formula.verdict == Verdict.MATCH
    assert a.formula.logged_tokens == math.ceil(math.floor(68.20 * 0.9 * GIB / 65536) / 64) * 64
    c = codes(a)
    assert c["RANK_IMBALANCE"].fields["min_rank"] == "rank 1"
    assert "68.20" in c["BUDGET_RECONCILES"].message and "default fraction" in c["BUDGET_RECONCILES"].message
    assert a.formula.mem_fraction_static_source.startswith("default")
    ledger = a.ranks[0]
    assert item(ledger, "weights") == pytest.approx(7672 / 1024, abs=1e-4) and item(ledger, "decoder") == 1.28


def test_cpp_sample_checked_with_the_model_config():
    """trtllm_003: Llama-3.1-8B with FP8 KV (65,536 B/token): 17.83 x 0.9 = 16.047 GiB -> 8,219 blocks of 32."""
    a = run(SAMPLES / "trtllm_003.log", LLAMA31, kv_cache_dtype="fp8")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 8219 * 32


def test_pool_far_below_the_fraction_is_a_probable_cap():
    a = run(SAMPLES / "trtllm_004.log")
    c = codes(a)["TOKENS_CAPPED"]
    assert c.fields["probable"] and c.fields["effective_fraction"] == pytest.approx(29.95 / 74.87, abs=1e-3)
    assert a.formula.verdict == Verdict.UNKNOWN and a.engine_version == ">=0.17.0"


def test_sequence_too_long_for_the_pool():
    """trtllm_006: 29,184 tokens < beam 1 x 128 x 272 = 34,816; 956,301,312 B / 29,184 = 32,768 B/token."""
    a = run(SAMPLES / "trtllm_006.log")
    c = codes(a)
    f = c["NOT_ENOUGH_MEMORY"]
    assert f.fields["tokens_needed"] == 34816 and f.fields["extra_gib"] == pytest.approx(5632 * 32768 / GIB, abs=1e-3)
    assert f.fields["max_sequence_length_that_fits"] == 29184
    assert c["STARTUP_FAILED"].severity.value == "error"
    assert cli("explain", SAMPLES / "trtllm_006.log").code == 3


def test_executor_oom_table():
    a = run(CLASSES / "executor-oom-1.2.log")
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert (f.fields["component"], f.fields["free_gib"], f.fields["total_gib"]) == ("Model", 12.78, 15.44)
    assert "STARTUP_FAILED" in codes(a)


def test_the_estimate_write_back_is_checked_against_the_pool():
    a = run(SAMPLES / "trtllm_009.log")
    assert any("860,308" in n and "860,320 = the pool" in n for n in a.notes)
    assert a.formula.mem_fraction_static == 0.800000011920929


def test_stripped_prefixes_are_read():
    a = run(SAMPLES / "trtllm_014.log")
    ledger = a.ranks[0]
    assert a.formula.logged_tokens == 395776
    assert item(ledger, "weights") == pytest.approx(875 / 1024, abs=1e-4) and item(ledger, "decoder") == 5.76


def test_no_pool_line_says_what_is_missing():
    a = run(SAMPLES / "trtllm_010.log")
    assert "no 'Allocated" in a.formula.verdict_reason
    assert any("631 primary blocks" in n for n in a.notes)


@pytest.mark.parametrize("name", [p.name for p in sorted(SAMPLES.glob("trtllm_*.log"))])
def test_every_sample_reads(name):
    r = cli("explain", SAMPLES / name, "-f", "json")
    assert r.code in (0, 1, 3), r.stdout
    assert r.json()["engine"] == "trtllm"


# --- whatif -----------------------------------------------------------------------------------------------------


def test_whatif_fraction_dtype_and_max_tokens():
    d = cli("whatif", SAMPLES / "trtllm_001.log", "--free-gpu-memory-fraction", "0.95", "-f", "json").json()["whatif"]
    expected = math.ceil(math.floor(6.61 * 0.95 * GIB / 73728) / 32) * 32
    assert d["tokens_after"]["low"] == expected
    d = cli("whatif", SAMPLES / "trtllm_001.log", "--max-tokens", "50000", "-f", "json").json()["whatif"]
    assert d["tokens_after"]["low"] == 50016 and d["changes"] == {"max_tokens": 50000}  # 1,563 blocks of 32
    r = cli("whatif", SAMPLES / "vllm_016.log", "--max-tokens", "50000")
    assert r.code == 2
    # TensorRT-LLM's own words; the pin is the token count the C++ pool would allocate, offered for an ok answer
    # only (0.95 leaves 0.33 GiB: LOW HEADROOM, nothing to pin; ux-audit item 27)
    d = cli("whatif", SAMPLES / "trtllm_001.log", "--free-gpu-memory-fraction", "0.95", "-f", "json").json()["whatif"]
    assert d["changes"] == {"free_gpu_memory_fraction": 0.95} and d["risk"] == "low" and d["pin"] is None
    d = cli("whatif", SAMPLES / "trtllm_001.log", "--free-gpu-memory-fraction", "0.8", "-f", "json").json()["whatif"]
    ok = math.ceil(math.floor(6.61 * 0.8 * GIB / 73728) / 32) * 32
    assert d["risk"] == "ok" and f"max_tokens={ok}" in d["pin"]
    r = cli("whatif", SAMPLES / "trtllm_001.log", "--gpu-memory-utilization", "0.95")
    assert r.code == 2 and "use --free-gpu-memory-fraction" in r.stderr


def test_variable_sliding_window_pool_is_reported_per_window():
    a = run(CLASSES / "vswa-cpp-gemma3.log")
    assert a.formula.verdict == Verdict.UNKNOWN and "calculateWindowSizeToShare" in a.formula.verdict_reason
    note = next(n for n in a.notes if n.startswith("variable sliding-window"))
    assert "window 1,024: 1,233,920 max tokens, 38,560 primary blocks" in note
    assert dict(a.ranks[0].logged)["allotted_primary_gib"] == pytest.approx(48513495859 / GIB)
    assert "BUDGET_RECONCILES" in codes(a)  # 50.20 x 0.9 = 45.18 = the pool


def test_speculative_decoding_with_only_a_config_is_not_checked():
    text = ("[TRT-LLM] [I] ATTENTION RUNTIME FEATURES:  AttentionRuntimeFeatures(chunked_prefill=False, "
            "cache_reuse=True, has_speculative_draft_tokens=True, chunk_size=8192)\n"
            + (SAMPLES / "trtllm_003.log").read_text())
    (a,) = audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=LLAMA31, kv_cache_dtype="fp8"))
    assert a.formula.verdict == Verdict.UNKNOWN and "draft model" in a.formula.verdict_reason
