"""TensorRT-LLM startups kvaudit had never seen (fixtures/corpus trtllm_c021..c026, new-trt.json), each class on
its real lines: 1.1+'s OOM table by ExecutorMemoryType stage names, the host-memory secondary pool, a lone pool
sized by kv_cache_config.max_tokens, and the ranks the C++ runtime names without rank tags."""

from __future__ import annotations

from tests.conftest import ROOT, cli

CORPUS = ROOT / "fixtures" / "corpus"


def _audit(path):
    d = cli("explain", path, "-f", "json").json()
    return d["audits"][0] if "audits" in d else d


def test_the_oom_tables_stage_names_are_read_and_memory_given_back_is_no_size():
    """trtllm_c021 (mlcommons/inference#2501, gpt-oss): from 1.1 the table prints ExecutorMemoryType values
    ('model: 274.64 / 208.12', '_no_capture_init_kv_cache: ...'); they were not read (no anchor, no row name), so
    the finding said nothing of what came before the KV cache. 'model_extra: 197.99 / 200.47' is memory released
    while it was created, not a -2.48 GiB component."""
    a = _audit(CORPUS / "trtllm_c021.log")
    nem = next(f for f in a["findings"] if f["code"] == "NOT_ENOUGH_MEMORY")
    assert "before it: model 66.52 GiB, sampler 3.78 GiB, _no_capture_init_kv_cache 1.87 GiB" in nem["message"]
    assert "_no_capture_init_extra_resources 4.41 GiB, model_extra gave back 2.48 GiB" in nem["message"]
    assert "-2.48" not in nem["message"]


def test_the_secondary_pool_is_host_memory_and_a_block_size_from_an_assumed_fraction_says_so():
    """trtllm_c023 (tensorrtllm_backend#576): 'Number of blocks in KV cache secondary pool: 10728' is the host
    offload tier (kvCacheManager.cpp calculateMaxNumBlocks: hostCacheSize / bytes per token / tokens per block), not
    GPU memory and not sized by the fraction; the primary blocks' 4.00 MiB rests on the assumed 0.9."""
    notes = _audit(CORPUS / "trtllm_c023.log")["notes"]
    assert any(n.startswith("10,728 secondary blocks") and "host-memory offload tier" in n
               and "not by the fraction" in n for n in notes), notes
    assert any("17,210 primary blocks of about 4.00 MiB each if the assumed fraction 0.9 applied" in n
               for n in notes), notes


def test_a_lone_pool_sized_by_max_tokens_is_not_called_the_servers_pool(tmp_path):
    """The NVIDIA forum's gpt-oss-20b on DGX Spark, TensorRT-LLM 1.1.0rc3 ("Initial Memory Profiling Stage",
    https://forums.developer.nvidia.com/t/tensorrt-llm-pytorch-memory-fraction-automatically-limited-to-0-14-despite-
    kv-cache-configuration/354807; its first two log lines, verbatim): resource_manager.py calculate_max_num_blocks
    prints 'max_tokens is set by kv_cache_config.max_tokens' for the profiling cache and the final pool alike
    (KvCacheCreator writes both sizes into max_tokens). The 4,128 tokens were the profiling cache (max_num_tokens
    4,096 + a block), yet the headline gave them as the pool."""
    log = tmp_path / "forum-354807.log"
    log.write_text("[12/16/2025-06:47:10] [TRT-LLM] [I] max_tokens is set by kv_cache_config.max_tokens: 4128\n"
                   "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 0.19 GiB for max tokens in paged KV cache (4128).\n")
    d = cli("explain", log, "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    assert a["formula"]["logged_tokens"] is None
    assert "4,128 tokens" not in a["headline"].split(":")[0]
    assert "does not say which" in a["formula"]["verdict_reason"]


def test_ranks_the_runtime_names_count_and_the_mpi_size_is_no_tp_size():
    """trtllm_c025 (tensorrtllm_backend#577): 'Detecting local TP group for rank 1' names a second rank of the TP
    group in untagged lines (was 'TP 1 (assumed)'); trtllm_c026 (#396): 'MPI size: 4' is TP x PP, said as a bound."""
    a = _audit(CORPUS / "trtllm_c025.log")
    assert any("TP size at least 2" in n for n in a["notes"]), a["notes"]
    b = _audit(CORPUS / "trtllm_c026.log")
    assert any(n.startswith("MPI size 4") and "at most 4" in n for n in b["notes"]), b["notes"]
    assert not any("TP size at least 4" in n for n in b["notes"])


def test_the_renamed_2026_version_banner_is_read(tmp_path):
    """'[TensorRT-LLM] TensorRT LLM version: 1.3.0rc0' (no hyphen after the 2026 rename; a public TensorRT-LLM auto
    test report for MiMoV2Flash on an H100 PCIe, 2026-03-13, its raw output's first lines and pool lines, verbatim)
    was not taken for the banner: the startup's version was 'unknown'."""
    log = tmp_path / "mimo-v2-flash.log"
    log.write_text(
        "[TensorRT-LLM] TensorRT LLM version: 1.3.0rc0\n"
        "[03/13/2026-02:56:20] [TRT-LLM] [I] Using LLM with PyTorch backend\n"
        "[TensorRT-LLM][INFO] Max KV cache blocks per sequence: 8193 [window size=262145], tokens per block=32, "
        "primary blocks=216616, secondary blocks=0, max sequence length=262145\n"
        "[TensorRT-LLM][INFO] Number of tokens per block: 32.\n"
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 59.50 GiB for max tokens in paged KV cache (6931712).\n")
    d = cli("explain", log, "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    assert a["engine_version"] == "1.3.0" and a["formula"]["logged_tokens"] == 6_931_712


def test_tritons_second_report_of_the_same_error_is_quoted_once():
    """trtllm_c024 (TensorRT-LLM ~0.5-0.6 under Triton, issue 494): backend_model.cc logs 'Failed to create
    instance: ... maxTokensInPagedKvCache must be large enough ...' (line 2) and model_lifecycle.cc logs the same
    check again as "failed to load 'tensorrt_llm' version 1: Internal: ..." (line 3): one error, quoted once, and
    the headline quotes the check, not Triton's wrapper."""
    d = _audit(CORPUS / "trtllm_c024.log")
    f = {x["code"]: x for x in d["findings"]}
    assert f["NOT_ENOUGH_MEMORY"]["message"].startswith("line 2: ERROR: Failed to create instance")
    assert f["STARTUP_FAILED"]["message"].startswith("the server did not finish starting: the error quoted in "
                                                     "NOT_ENOUGH_MEMORY")
    assert sum(x["message"].count("maxTokensInPagedKvCache") for x in d["findings"]) == 1
    assert "failed to load" not in d["headline"]


def test_a_lone_rank_0_tag_is_no_tp_size():
    """trtllm_c022 (TensorRT-LLM issue 8802, a 1.x build): its lines carry '[RANK 0]' only. 'attention TP at least
    1' and the note 'TP size at least 1' said nothing; the size is assumed, as in an untagged log."""
    d = _audit(CORPUS / "trtllm_c022.log")
    m = d["model"]
    assert m["attention_tp_size"] == 1 and m["attention_tp_size_at_least"] is False
    assert not any("at least 1" in n for n in d["notes"])
    assert "attention TP 1 (assumed)" in cli("explain", CORPUS / "trtllm_c022.log").stdout


def test_the_default_fraction_is_noted_only_where_a_budget_used_it():
    """trtllm_c019 (1.0rc, the executor's OOM table) and trtllm_c024 (Triton, a pool too small) print no free-memory
    figure, so no fraction was applied: the note 'the default 0.9 is assumed' repeated the formula row's default and
    claimed a use that did not happen. trtllm_c014 (17.83 GiB available x the default) keeps it."""
    for name in ("trtllm_c019", "trtllm_c024"):
        assert not any("default 0.9 is assumed" in n for n in _audit(CORPUS / f"{name}.log")["notes"]), name
    cfg = ROOT / "fixtures" / "configs" / "llama31-8b.json"
    d = cli("explain", CORPUS / "trtllm_c014.log", "--model-config", cfg, "-f", "json").json()
    d = d["audits"][0] if "audits" in d else d
    assert any("default 0.9 is assumed" in n for n in d["notes"])
