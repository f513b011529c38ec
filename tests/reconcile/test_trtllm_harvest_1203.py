"""Two TensorRT-LLM classes from the 2026-12-03 harvest: the AutoDeploy backend and the C++ runtime's cut of the
sequence length to the pool (corpus trtllm_c037, the last test).

TensorRT-LLM's AutoDeploy backend (corpus trtllm_c036: 1.2.0rc5, Nemotron-3-Nano-30B-A3B-FP8 on a DGX Spark).

tensorrt_llm/_torch/auto_deploy/shim/ad_executor.py ``_CacheManagerWithFakePool`` (0.2x-1.2 builds): AutoDeploy
keeps its caches in its own layer-wise pools, sized by its resize_kv_cache transform from ``free_mem_ratio``, and
hands TensorRT-LLM's KVCacheManager a placeholder with head_dim=0 whose page count is AutoDeploy's. The C++ pool
line it prints ('Allocated 0.00 GiB for max tokens in paged KV cache (3958272)') states the page table's tokens,
not the caches' memory: kvaudit has no model of that sizing, so it checks nothing, assumes no default fraction and
books no 0.00 GiB KV cache."""

from __future__ import annotations

from kvaudit.parse.lines import Line
from kvaudit.parse.trtllm import Banner, Reading, parse_line
from tests.conftest import ROOT, cli

CORPUS = ROOT / "fixtures" / "corpus"
LOG = CORPUS / "trtllm_c036.log"


def _audit(*args: str) -> dict:
    d = cli("explain", LOG, "-f", "json", *args).json()
    return d["audits"][0] if "audits" in d else d


def test_the_autodeploy_lines_are_read():
    ev, _ = parse_line(Line(16, "[12/20/2025-03:35:50] [TRT-LLM] [I] Using LLM with AutoDeploy backend"))
    assert isinstance(ev[0], Banner) and ev[0].backend == "autodeploy"
    ev, _ = parse_line(Line(46, "[12/20/2025-03:40:47] [TRT-LLM AUTO-DEPLOY] [RANK 0] [I] Using fake cache manager "
                                "with head_dim=0 and num pages: 61848"))
    assert [(e.key, e.value) for e in ev if isinstance(e, Reading)] == [("autodeploy_pages", 61848.0)]


def test_an_autodeploy_pool_is_not_checked_and_no_fraction_is_assumed():
    a = _audit()
    f = a["formula"]
    assert a["status"] == "unchecked" and f["verdict"] == "unknown"
    assert "AutoDeploy" in f["verdict_reason"] and "_CacheManagerWithFakePool" in f["verdict_reason"]
    assert f["logged_tokens"] == 61848 * 64
    # free_gpu_memory_fraction does not size AutoDeploy's caches: no default 0.9 among the inputs
    assert f["mem_fraction_static"] is None
    assert "mem_fraction_static" not in {i["name"] for i in a["inputs"]}
    # the placeholder's 0.00 GiB is not the KV cache's size: the tokens only are recorded
    logged = a["ranks"][0]["logged"]
    assert logged["kv_pool_tokens"] == 3_958_272 and "kv_pool_gib" not in logged
    assert all(it["key"] != "kv_cache" for r in a["ranks"] for it in r.get("items", []))
    # the coverage every output shows agrees: the caches are AutoDeploy's, which the support table does not model
    assert a["coverage"]["level"] == "not" and "separate backend" in a["coverage"]["limits"][0]


def test_an_autodeploy_pool_is_not_rerun_at_another_fraction():
    d = cli("whatif", LOG, "--free-gpu-memory-fraction", "0.5", "-f", "json").json()["whatif"]
    assert d["risk"] == "unknown" and d["tokens_after"] is None
    assert "AutoDeploy" in " ".join(d["explanation"])


def test_the_cpp_cut_of_the_sequence_length_is_read():
    """NetEase-Media/grps_trtllm docs/scheduler.md (corpus trtllm_c037): trtGptModelInflightBatching.cpp cut
    maxAttentionWindow / maxSequenceLen to 5,185 and maxInputLen to 5,184 so that one sequence fits the 82 x 64 =
    5,248-token pool; both lines were read by no grammar before. The early PyTorch backend's resource_manager.py
    prints the same warning with a capital 'They'."""
    c = "[TensorRT-LLM][WARNING] maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit "
    ev, _ = parse_line(Line(4, c + "in kvCache. they are reduced to 5185"))
    assert [(e.key, e.value) for e in ev if isinstance(e, Reading)] == [("seq_cut", 5185.0)]
    ev, _ = parse_line(Line(4, "[TRT-LLM] [W] maxAttentionWindow and maxSequenceLen are too large for at least one "
                               "sequence to fit in kvCache. They are reduced to 4096"))
    assert [(e.key, e.value) for e in ev if isinstance(e, Reading)] == [("seq_cut", 4096.0)]
    ev, _ = parse_line(Line(5, "[TensorRT-LLM][WARNING] maxInputLen is reduced to 5184"))
    assert [(e.key, e.value) for e in ev if isinstance(e, Reading)] == [("input_cut", 5184.0)]
    d = cli("explain", CORPUS / "trtllm_c037.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    note = next(n for n in a["notes"] if "maxSequenceLen" in n)
    assert "5,185 tokens (line 4)" in note and "KV pool of 5,248 tokens" in note and "5,184 (line 5)" in note
