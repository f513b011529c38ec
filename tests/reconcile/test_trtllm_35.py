"""Issue 35, TensorRT-LLM: whatif's "now" is the pool explain shows, and a cap the log does not show still holds
(fixtures/samples trtllm_004: 'Allocated 29.95 GiB for max tokens in paged KV cache (1121536)' under a 67.38 GiB
budget); an encoder-decoder startup is not rerun (corpus trtllm_c009)."""

from __future__ import annotations

from tests.conftest import ROOT, cli

SAMPLES = ROOT / "fixtures" / "samples"
CORPUS = ROOT / "fixtures" / "corpus"


def test_whatif_now_is_the_pool_and_the_unseen_cap_still_holds():
    d = cli("whatif", SAMPLES / "trtllm_004.log", "--free-gpu-memory-fraction", "0.5", "-f", "json").json()["whatif"]
    assert d["kv_gib_before"] == 29.95  # explain's pool, not the 67.38 GiB budget
    assert d["tokens_after"]["low"] == d["tokens_after"]["high"] == 1_121_536  # fewer GiB, never more tokens
    assert d["kv_gib_after"] <= 37.44 and "cap" in " ".join(d["explanation"])


def test_whatif_more_fraction_never_lowers_a_capped_pool():
    d = cli("whatif", SAMPLES / "trtllm_004.log", "--free-gpu-memory-fraction", "0.95", "-f", "json").json()["whatif"]
    assert d["tokens_after"]["low"] == 1_121_536


def test_whatif_does_not_rerun_an_encoder_decoder_split():
    d = cli("whatif", CORPUS / "trtllm_c009.log", "--free-gpu-memory-fraction", "0.5", "-f", "json").json()["whatif"]
    assert d["risk"] == "unknown" and d["tokens_after"] is None
    assert "crossKvCacheFraction" in " ".join(d["explanation"])


def test_a_pool_never_sized_in_gib_records_no_gib():
    """trtllm_103 ('Using 10718 tokens in paged KV cache.'): logged.kv_pool_gib is absent, not 0.0."""
    d = cli("explain", SAMPLES / "trtllm_103.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    logged = a["ranks"][0]["logged"]
    assert logged["kv_pool_tokens"] == 10718 and "kv_pool_gib" not in logged
