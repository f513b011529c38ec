"""A field test of vLLM startup logs kvaudit had not seen (issue 35's field pass): each test holds the real lines
of one public log (fixtures/corpus/new-vfield.json names the source) to what vLLM's code at that release says."""

from __future__ import annotations

import io

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.verdict import judge
from tests.conftest import ROOT

CONFIGS = ROOT / "fixtures" / "configs"


def run(text: str, config: str | None = None, **opts):
    geom = load_config(CONFIGS / config) if config else None
    return audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=geom, **opts))[-1]


def codes(a):
    return {f.code: f for f in a.findings}


# vllm#23278 (gpt-oss-120b on one H100, vLLM 0.10.1): the budget went negative, then the engine core died
GPT_OSS_NEGATIVE = (
    "(EngineCore_0 pid=5839) INFO 08-20 18:04:10 [gpu_model_runner.py:2007] Model loading took 65.9651 GiB and "
    "12.799889 seconds\n"
    "(EngineCore_0 pid=5839) INFO 08-20 18:04:21 [monitor.py:34] torch.compile takes 5.55 s in total\n"
    "(EngineCore_0 pid=5839) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: -2.14 GiB\n"
    "(EngineCore_0 pid=5839) ERROR 08-20 18:04:22 [core.py:700] EngineCore failed to start.\n")


def test_a_negative_budget_is_the_cause_and_names_its_line():
    """A budget <= 0 makes check_enough_kv_cache_memory raise 'No available memory for the cache blocks'; the
    generic 'EngineCore failed to start' that follows is that failure, not a second cause. The finding names
    the line that printed the budget (it said line 0), and the headline leads with the budget."""
    a = run(GPT_OSS_NEGATIVE)
    mem = codes(a)["NOT_ENOUGH_MEMORY"]
    assert mem.fields["kv_gib"] == -2.14 and "line 3:" in mem.message
    assert str(codes(a)["STARTUP_FAILED"].fields["detail"]).startswith("the error quoted in NOT_ENOUGH_MEMORY")
    head = judge(a).headline
    assert head.startswith("ERROR startup failed: available KV cache memory is -2.14 GiB") and "(line 3)" in head


# vllm#21348 (Qwen3-235B-A22B-FP8, TP4 per the command, vLLM of July 2025): the lines as the reporter
# quoted them, one worker's budget and no process tags
QWEN3_235B_TP4 = "Available KV cache memory: 8.11 GiB\nGPU KV cache size: 178,880 tokens\n"


def test_an_assumed_tp_that_explains_the_pool_as_an_upper_bound_is_no_geometry_mismatch():
    """At TP 1 (assumed) the config gives 192,512 B/token, four times what the line implies. At TP 4 it gives
    48,128 B/token: 178,880 tokens x 48,128 B = 8.02 GiB, within the 8.11 GiB shown and 0.09 GiB below it,
    as a pool sized on another worker's smaller budget is (get_kv_cache_configs takes the minimum). The TP is
    not established: no mismatch, no match, the count unchecked."""
    a = run(QWEN3_235B_TP4, "qwen3-235b-a22b.json")
    assert "GEOMETRY_MISMATCH" not in codes(a) and "TOKENS_MISMATCH" not in codes(a)
    assert a.formula.verdict == Verdict.UNKNOWN
    assert "assumed" in a.formula.verdict_reason and "TP 4" in a.formula.verdict_reason
    assert "within the budget shown" in a.formula.verdict_reason
    # stated, the same TP gives the same upper-bound reading (the existing path)
    b = run(QWEN3_235B_TP4, "qwen3-235b-a22b.json", tp_size=4)
    assert b.formula.verdict == Verdict.UNKNOWN and "upper bound" in b.formula.verdict_reason


def test_a_pool_far_below_every_tp_fit_is_still_a_mismatch():
    """The upper-bound fit is bounded: a pool 30 % below the budget at the TP that first fits is not explained
    by an unseen worker, so a config that disagrees is still said to disagree."""
    a = run("Available KV cache memory: 8.11 GiB\nGPU KV cache size: 125,000 tokens\n", "qwen3-235b-a22b.json")
    assert "GEOMETRY_MISMATCH" in codes(a)


# vllm-project/recipes#831 (Qwen3.8-27B FP8 on one RTX PRO 6000, the qwen38 image): the error as the PR quotes it,
# wrapped over three lines
MAMBA_BLOCKS = (
    "ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (939).\n"
    "Each decode sequence requires one Mamba cache block, so CUDA graph capture cannot\n"
    "proceed. Please lower max_num_seqs to at most 939 or increase gpu_memory_utilization.\n")


def test_the_mamba_blocks_error_is_a_vllm_memory_failure_after_the_pool():
    """config/compilation.py (0.20.0+): with FULL decode graphs every sequence needs a Mamba block, and the pool
    sized 939. The log was not recognised as vLLM at all; now NOT_ENOUGH_MEMORY with the engine's own bound,
    and the report does not say the startup failed before the pool was sized."""
    from kvaudit.report.view import not_reached

    a = run(MAMBA_BLOCKS)
    assert a.engine == "vllm" and a.engine_version == ">=0.20.0"
    mem = codes(a)["NOT_ENOUGH_MEMORY"]
    assert mem.fields["max_num_seqs_that_fits"] == 939 and "--max-num-seqs 939 fits" in mem.message
    assert judge(a).headline.startswith("ERROR startup failed: ValueError:")
    assert not not_reached(a)


# club-3090#1047 (Qwen3.8-27B NVFP4 on an A6000, vLLM 0.2x): the checkpoint has no KV scales
FP8_SCALE_WARNING = (
    "(EngineCore pid=196) WARNING 08-17 20:38:37 [kv_cache.py:151] Using KV cache scaling factor 1.0 for fp8_e4m3. "
    "If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.\n"
    "(EngineCore pid=196) INFO 08-17 20:38:38 [gpu_model_runner.py:5405] Model loading took 19.75 GiB memory and "
    "6.356814 seconds\n")


def test_the_default_fp8_scale_warning_names_the_kv_dtype():
    """quantization/kv_cache.py warns so only for a quantized, non-e5m2 KV cache (0.7.3 .. 0.27.1): the KV is
    fp8, one byte, said by the log; it was shown as bfloat16, assumed."""
    a = run(FP8_SCALE_WARNING)
    assert a.model.kv_dtype == "fp8_e4m3" and a.model.kv_dtype_bytes == 1
    assert "assumed" not in (a.model.kv_dtype or "")


# tenstorrent/tt-xla#5727 (gemma-4-31B-it through the Tenstorrent vLLM plugin, July 2026): the pids elided as posted
TT_GEMMA4 = (
    "(EngineCore pid=...) WARNING ... [kv_cache_utils.py:1339] Hybrid KV cache manager is disabled for this hybrid "
    "model, This means we do not enable any optimizations for saving KV cache memory (e.g., dropping the KV cache "
    "outside the sliding window). The compute of layers like sliding window is still saved.\n"
    "\n"
    "(EngineCore pid=...) INFO ... [kv_cache_utils.py:1733] GPU KV cache size: 7,584 tokens\n"
    "(EngineCore pid=...) INFO ... [kv_cache_utils.py:1734] Maximum concurrency for 128 tokens per request: 59.25x\n")


def test_a_short_max_model_len_dates_nothing():
    """'128' prints the same with or without a thousands separator (f"{n:,}"), so it is no sign of a pre-0.11
    release: the version read 0.8.0..0.10.99 for a 2026 Gemma-4 log."""
    a = run(TT_GEMMA4)
    assert "0.10.99" not in a.engine_version


def test_sliding_layers_sized_as_full_are_not_modelled_as_a_sliding_window_pool():
    """unify_hybrid_kv_cache_specs (v1/core/kv_cache_utils.py) warns when it sizes every sliding-window layer as
    full attention: the config's sliding-window page layout is then not the pool's, so it is not used."""
    a = run(TT_GEMMA4, "gemma-4-31b-it.json")
    assert a.formula.bytes_per_token is None
    assert any("sized as full attention" in n for n in a.notes)
    with_budget = run("Available KV cache memory: 10.00 GiB\n" + TT_GEMMA4.replace("128 tokens", "4,096 tokens"),
                      "gemma-4-31b-it.json")
    assert not {"TOKENS_MISMATCH", "GEOMETRY_MISMATCH", "TOKENS_MATCH"} & set(codes(with_budget))


# vllm#26646 (Qwen3-Next-80B-A3B int4 AutoRound, TP2 with EP per the Worker_TP1_EP1 lines, vLLM 0.11)
QWEN3_NEXT_CORE_LINES = (
    "(EngineCore_DP0 pid=1007431) INFO 10-11 16:19:14 [kv_cache_utils.py:1199] GPU KV cache size: 90,048 tokens\n"
    "(EngineCore_DP0 pid=1007431) INFO 10-11 16:19:14 [kv_cache_utils.py:1204] Maximum concurrency for 215,040 "
    "tokens per request: 1.66x\n")


def test_the_engine_cores_own_lines_do_not_establish_tp_1():
    """The engine core prints the pool's size and concurrency under its own tag at every TP size (its workers
    are other processes): an excerpt of only those lines does not show one process, so TP 1 is assumed, not
    established. A worker's line under the same tag (TP 1 runs the worker in the engine core) does."""
    a = run(QWEN3_NEXT_CORE_LINES)
    assert a.model.attention_tp_size == 1 and a.model.attention_tp_size_source.startswith("assumed")
    worker = ("(EngineCore_DP0 pid=1007431) INFO 10-11 16:19:13 [gpu_worker.py:298] Available KV cache memory: "
              "2.06 GiB\n")
    b = run(worker + QWEN3_NEXT_CORE_LINES)
    assert b.model.attention_tp_size_source == "one process (no worker tags)"


# SergiioB/intel-arc-pro-b70-inference-cookbook#4 (Intel XPU, vLLM 0.2x): a pinned budget, then the engine died
XPU_PINNED = (
    "(EngineCore pid=316) INFO 08-21 18:37:44 [gpu_worker.py:492] Initial free memory 31.16 GiB, reserved 4.25 GiB "
    "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not "
    "respect the gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of "
    "KV cache memory size. If OOM'ed, check the difference of initial free memory between the current run and the "
    "previous run where kv_cache_memory_bytes is suggested and update it correspondingly.\n"
    "(EngineCore pid=316) ERROR 08-21 18:37:44 [core.py:1344] EngineCore failed to start.\n")


def test_a_pinned_budgets_formula_is_the_setting_not_total_times_util():
    """determine_available_memory skips profiling when kv_cache_memory_bytes is set: the rule shown is that
    setting, not 'total x util - (weights + ...)', which did not apply."""
    a = run(XPU_PINNED)
    assert a.formula.rest_gib == 4.25
    assert a.formula.rule.startswith("kv_cache_memory_bytes as set") and "total x util" not in a.formula.rule


def test_the_cpu_backend_aside_dates_the_kv_memory_error():
    """'(which also controls CPU memory on the CPU backend)' is in the 0.22.0 and 0.27.1 kv_cache_utils.py and
    not in 0.20.1's: a bare error line is no longer 'vLLM unknown' (vllm#44376)."""
    a = run("ValueError: To serve at least one request with the model's max seq len (30000), (6.66 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (5.44 GiB). Based on the available memory, "
            "the estimated maximum model length is 13528. Try increasing `gpu_memory_utilization` (which also "
            "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.\n")
    assert a.engine_version == ">=0.20.2"
    assert codes(a)["NOT_ENOUGH_MEMORY"].fields["max_model_len_that_fits"] == 13528


def test_a_memory_line_after_the_last_read_one_is_listed_not_ignored():
    """The startup's window ended at its last event, so a memory line after it (V0 model_runner.py's 'CUDA graphs
    can take additional 1~3 GiB memory per GPU ...', which kvaudit does not read) was dropped silently; the last
    startup now runs to the end of the input and the line is listed as not interpreted. (gpu_worker.sleep's 'Sleep
    mode freed X GiB memory, ...', this test's first example, is read since issue 33's field pass: a note.)"""
    head = ("the current vLLM instance can use total_gpu_memory (79.22GiB) x gpu_memory_utilization (0.90) = "
            "71.29GiB\n"
            "model weights take 2.32GiB; non_torch_memory takes 0.67GiB; PyTorch activation peak memory takes 1.20GiB; "
            "the rest of the memory reserved for KV Cache is 67.11GiB.\n")
    a = run(head + "INFO 01-05 10:00:00 model_runner.py:1028] CUDA graphs can take additional 1~3 GiB memory per GPU. "
                   "If you are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager "
                   "mode. You can also reduce the `max_num_seqs` as needed to decrease memory usage.\n")
    assert a.last_line == 3
    assert [n for n, _ in a.uninterpreted] == [3]
    assert "BUDGET_RECONCILES" in codes(a)
    b = run(head + "INFO 01-05 10:00:00 [gpu_worker.py:222] Sleep mode freed 70.12 GiB memory, 1.03 GiB memory is "
                   "still in use.\n")
    assert b.last_line == 3 and not b.uninterpreted
    assert any(n.startswith("sleep mode (line 3") and "70.12 GiB freed" in n for n in b.notes)


# club-3090#612 (Qwen3.6-35B-A3B NVFP4 on one RTX 5090, vLLM 0.24.0): the KV lines without the hybrid's block line
HYBRID_NO_BLOCK_LINE = (
    "(EngineCore pid=107) INFO 07-06 22:52:09 [gpu_worker.py:508] Available KV cache memory: 5.98 GiB\n"
    "(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2146] GPU KV cache size: 567,978 tokens\n"
    "(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2147] Maximum concurrency for 131,072 tokens per "
    "request: 4.33x\n")


def test_a_hybrid_pool_without_its_block_line_predicts_nothing():
    """vLLM raises a Mamba hybrid's attention block so one attention page holds a Mamba page (and logs 'Setting
    attention block size to N tokens'); without that line the block is not the default 16, so no token range is
    predicted from 16 (it showed 626,053..627,108 as if the Mamba cache mode were the only unknown)."""
    a = run(HYBRID_NO_BLOCK_LINE, "qwen3.5-35b-a3b.json", kv_cache_dtype="fp8")
    assert a.formula.verdict == Verdict.UNKNOWN and a.formula.predicted_tokens is None
    assert "attention block size is not in the log" in a.formula.verdict_reason
