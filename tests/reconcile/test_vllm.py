"""vLLM's budget per era, with the reference's worked numbers as oracles (section 1.4)."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import NoStartupError, audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import CONFIGS, SAMPLES, cli

LLAMA3 = load_config(CONFIGS / "llama3-8b.json")

V1_0101 = """(APIServer pid=387) INFO 09-21 21:38:12 [api_server.py:1805] vLLM API server version 0.10.1
(APIServer pid=387) INFO 09-21 21:38:12 [utils.py:326] non-default args: {'model': '/models/Meta-Llama-3-8B', 'max_model_len': 131072}
(EngineCore_0 pid=454) INFO 09-21 21:38:24 [gpu_model_runner.py:1975] Model loading took 14.9889 GiB and 126.264947 seconds
(EngineCore_0 pid=454) INFO 09-21 21:38:30 [gpu_worker.py:276] Available KV cache memory: 85.79 GiB
(EngineCore_0 pid=454) INFO 09-21 21:38:31 [kv_cache_utils.py:849] GPU KV cache size: 702,800 tokens
(EngineCore_0 pid=454) INFO 09-21 21:38:31 [kv_cache_utils.py:853] Maximum concurrency for 131,072 tokens per request: 5.36x
(EngineCore_0 pid=454) INFO 09-21 21:38:35 [gpu_model_runner.py:2708] Graph capturing finished in 4 secs, took 0.52 GiB
"""


def run(text: str, geom=LLAMA3, **kw):
    (a,) = audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=geom, **kw))
    return a


def test_v1_reference_example():
    """Llama-3-8B bf16: 131,072 B/token; 85.79 GiB / 2 MiB blocks = 43,925 blocks = 702,800 tokens; 5.36x."""
    a = run(V1_0101)
    f = a.formula
    assert a.engine == "vllm" and a.engine_version == "0.10.1"
    assert f.bytes_per_token == 131072 and f.page_size == 16
    assert f.predicted_tokens.low <= 702800 <= f.predicted_tokens.high
    assert f.verdict.value == "match"
    assert "CONCURRENCY_MISMATCH" not in {x.code for x in a.findings}
    assert a.ranks[0].item("graphs_target_decode").gib == 0.52


def test_v1_tokens_that_do_not_fit_the_memory():
    a = run(V1_0101.replace("702,800 tokens", "650,000 tokens").replace("5.36x", "4.96x"))
    assert a.formula.verdict.value == "mismatch"
    assert "TOKENS_MISMATCH" in {x.code for x in a.findings}


V0_TWO_INSTANCES = """INFO 04-12 08:21:19 [worker.py:267] Memory profiling takes 17.59 seconds
INFO 04-12 08:21:19 [worker.py:267] the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB
INFO 04-12 08:21:19 [worker.py:267] model weights take 14.99GiB; non_torch_memory takes 58.01GiB; PyTorch activation peak memory takes 1.26GiB; the rest of the memory reserved for KV Cache is -2.99GiB.
ERROR 04-12 08:21:20 [engine.py:400] No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
"""


def test_a_concurrent_startup_counted_as_non_torch_memory():
    a = run(V0_TWO_INSTANCES)
    codes = {x.code: x for x in a.findings}
    assert codes["NON_TORCH_HIGH"].fields["non_torch_gib"] == 58.01
    assert codes["NOT_ENOUGH_MEMORY"].severity.value == "error"
    assert "STARTUP_FAILED" in codes and "BUDGET_RECONCILES" in codes  # 71.27 - 14.99 - 58.01 - 1.26 = -2.99


def test_graph_estimate_far_above_the_capture():
    text = V1_0101.replace("Graph capturing finished in 4 secs, took 0.52 GiB",
                           "Estimated CUDA graph memory: 3.10 GiB total").replace("vLLM API server version 0.10.1",
                                                                                  "vLLM API server version 0.21.0")
    text += ("(EngineCore pid=454) INFO 09-21 21:38:36 [gpu_model_runner.py:6200] CUDA graph pool memory: 0.52 GiB "
             "(actual), 3.10 GiB (estimated), difference: 2.58 GiB (496.2%).\n")
    a = run(text)
    g = next(x for x in a.findings if x.code == "GRAPH_ESTIMATE_HIGH")
    assert (g.fields["estimate_gib"], g.fields["actual_gib"]) == (3.10, 0.52)
    assert "20,0" in g.message or "tokens" in g.message


def test_workers_that_disagree():
    text = ("(Worker_TP0 pid=147) INFO 05-14 00:04:17 [gpu_worker.py:460] Available KV cache memory: 15.72 GiB\n"
            "(Worker_TP1 pid=148) INFO 05-14 00:04:17 [gpu_worker.py:460] Available KV cache memory: 12.10 GiB\n"
            "(EngineCore_DP0 pid=100) INFO 05-14 00:04:18 [kv_cache_utils.py:1000] GPU KV cache size: 198,272 tokens\n")
    a = run(text, geom=None)
    ri = next(x for x in a.findings if x.code == "RANK_IMBALANCE")
    assert ri.fields["min_rank"] == "TP1" and ri.fields["spread_gib"] == pytest.approx(3.62)
    assert a.formula.rest_gib == 12.10  # the engine uses the smallest


def test_a_log_mixing_two_engines_is_refused():
    mixed = (SAMPLES / "sglang_029.log").read_bytes() + (SAMPLES / "vllm_016.log").read_bytes()
    with pytest.raises(NoStartupError, match="mixes SGLang and vLLM"):
        read_log(io.BytesIO(mixed))


def test_whatif_utilisation_on_vllm():
    d = cli("whatif", SAMPLES / "vllm_016.log", "--gpu-memory-utilization", "0.95", "-f", "json").json()["whatif"]
    gain = 0.05 * 79.19 * 2**30 / (524291 * 16)
    assert (d["tokens_after"]["low"] - d["tokens_before"]) / 16 == pytest.approx(gain, rel=0.01)
    assert d["reserve_gib_after"] == pytest.approx(0.05 * 79.19, abs=0.01)
    # issue 20, rule 6: vLLM's own words, and the absolute setting that pins the answer (the pool's bytes)
    assert d["changes"] == {"gpu_memory_utilization": 0.95}
    bytes_ = int(d["pin"].split()[-1])
    assert d["pin"].startswith("--kv-cache-memory-bytes ") and bytes_ // (524291 * 16) * 16 >= d["tokens_after"]["low"] - 16
    r = cli("whatif", SAMPLES / "vllm_016.log", "--mem-fraction-static", "0.95")
    assert r.code == 2 and "use --gpu-memory-utilization" in r.stderr


def test_kv_cache_memory_bytes_fixes_the_size():
    text = V1_0101.replace(
        "Available KV cache memory: 85.79 GiB",
        "Initial free memory 139.81 GiB, reserved 85.79GiB memory for KV Cache as specified by kv_cache_memory_bytes "
        "config and skipped memory profiling. This does not respect the gpu_memory_utilization config.")
    a = run(text)
    assert a.formula.rest_gib == 85.79 and a.formula.verdict.value == "match"
    assert any("kv-cache-memory-bytes" in n for n in a.notes)
    assert "BUDGET_RECONCILES" not in {x.code for x in a.findings}
