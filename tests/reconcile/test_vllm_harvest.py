"""Three vLLM bug classes found by a harvest of real logs (corpus vllm_c075..c081), each held to the vLLM code of
the releases it covers: the CPU backend's pool (V0 '# cpu blocks', VLLM_CPU_KVCACHE_SPACE), a negative budget's
clamped block count, and a pool of no block ('No available memory for the cache blocks'). The fourth, a language
model nested two levels down in its config, is tests/test_model_config_nested.py."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.parse.lines import Line
from kvaudit.parse.vllm import Blocks, Setting, parse_line
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.reconcile.vllm.formula import block_interval
from kvaudit.verdict import judge
from tests.conftest import ROOT

CONFIGS = ROOT / "fixtures" / "configs"
CORPUS = ROOT / "fixtures" / "corpus"


def run(text: str, config: str | None = None, **opts):
    geom = load_config(CONFIGS / config) if config else None
    return audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=geom, **opts))[-1]


def codes(a):
    return {f.code: f for f in a.findings}


def corpus(name: str) -> str:
    return (CORPUS / f"{name}.log").read_text()


def events(text: str):
    return parse_line(Line(1, text)).events


# ---------------------------------------------------------------------------------------------------------------
# 1. the CPU backend


@pytest.mark.parametrize("text,count,swap", [
    # executor_base.py (0.7-0.10) names the platform's device: "cpu" on the CPU backend (0.8.4 platforms/cpu.py)
    ("INFO 04-16 09:24:56 [executor_base.py:112] # cpu blocks: 9362, # CPU blocks: 0", 9362, 0),
    # executor/cpu_executor.py (0.4-0.6): "# CPU blocks: %d" alone is the CPU backend's pool
    ("INFO 10-01 10:00:00 cpu_executor.py:205] # CPU blocks: 9362", 9362, None),
])
def test_the_cpu_backends_block_line_is_its_pool(text, count, swap):
    (b,) = [e for e in events(text) if isinstance(e, Blocks)]
    assert (b.gpu_blocks, b.cpu_blocks, b.device) == (count, swap, "cpu")


def test_a_gpu_block_line_keeps_its_device_and_swap_blocks():
    (b,) = [e for e in events("INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 10, # CPU blocks: 4681")
            if isinstance(e, Blocks)]
    assert (b.gpu_blocks, b.cpu_blocks, b.device) == (10, 4681, "cuda")


@pytest.mark.parametrize("text,value,how", [
    ("WARNING 04-16 09:21:54 [cpu.py:106] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not "
     "set, using 4 by default.", 4.0, "default"),
    ("WARNING 10-01 10:00:00 cpu_executor.py:351] Environment variable VLLM_CPU_KVCACHE_SPACE (GB) for CPU backend is "
     "not set, using 4 by default.", 4.0, "default"),
    # 0.14.0 platforms/cpu.py: a share of free host memory, printed with format_gib
    ("WARNING 01-10 10:00:00 [cpu.py:157] VLLM_CPU_KVCACHE_SPACE not set. Using 12.34 GiB for KV cache.", 12.34,
     "chosen"),
])
def test_the_kv_space_warning_is_read(text, value, how):
    (s,) = [e for e in events(text) if isinstance(e, Setting)]
    assert (s.key, s.value, s.extra) == ("cpu_kvcache_space", how, value)


def test_a_v0_cpu_pool_is_checked_to_the_digit_against_the_default_space():
    """vllm_c079: int(4 GiB // (16 x 28,672 B)) = 9,362 blocks (cpu_worker.py determine_num_available_blocks), the
    budget named as VLLM_CPU_KVCACHE_SPACE's default, never INCOMPLETE_LOG."""
    a = run(corpus("vllm_c079"), "qwen2.5-1.5b-instruct.json")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 149_792
    assert a.formula.predicted_tokens.low == a.formula.predicted_tokens.high == 149_792
    assert "INCOMPLETE_LOG" not in codes(a) and "TOKENS_MATCH" in codes(a)
    assert a.platform_kind == "cpu" and a.coverage.level == "modelled"
    assert any("default of 4 GiB" in n and "not a measurement" in n for n in a.notes)
    assert a.formula.mem_fraction_static is None  # no fraction on the CPU backend


def test_a_cpu_pool_whose_space_was_set_is_read_not_judged():
    """A set VLLM_CPU_KVCACHE_SPACE is never logged: the pool is read (no INCOMPLETE_LOG), not checked, no advice."""
    text = "\n".join(line for line in corpus("vllm_c079").splitlines() if "VLLM_CPU_KVCACHE_SPACE" not in line)
    a = run(text, "qwen2.5-1.5b-instruct.json")
    assert a.formula.verdict == Verdict.UNKNOWN and "VLLM_CPU_KVCACHE_SPACE" in a.formula.verdict_reason
    assert a.formula.logged_tokens == 149_792
    assert not {"INCOMPLETE_LOG", "TOKENS_MISMATCH", "NOT_ENOUGH_MEMORY"} & set(codes(a))


def test_the_ipex_block_is_tried_when_16_does_not_give_the_pool():
    """platforms/cpu.py 0.8.4: block 128 with IPEX: int(4 GiB // (128 x 28,672 B)) = 1,170 blocks."""
    text = corpus("vllm_c079").replace("# cpu blocks: 9362", "# cpu blocks: 1170")
    a = run(text, "qwen2.5-1.5b-instruct.json")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 1170 * 128
    assert any(n.startswith("block size 128") for n in a.notes)


def test_the_cpu_backends_advice_is_its_kv_space_never_a_fraction():
    """vllm_c078's error beside a CPU-backend line: the engine's own --max-model-len estimate, and
    VLLM_CPU_KVCACHE_SPACE=5 (4.38 GiB needed; the env var is whole GiB), never a gpu_memory_utilization value."""
    warn = ("WARNING 11-18 13:43:55 [cpu.py:117] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend "
            "is not set, using 4 by default.\n")
    a = run(warn + corpus("vllm_c078"), "qwen3-0.6b.json")
    m = codes(a)["NOT_ENOUGH_MEMORY"]
    advice = m.message.split(" -> ", 1)[1]
    assert "--max-model-len 37,376 fits" in advice and "VLLM_CPU_KVCACHE_SPACE=5" in advice
    assert "gpu_memory_utilization 0." not in advice and "not gpu_memory_utilization" in advice
    assert m.fields["cpu_kvcache_space_gib_that_fits"] == 5.0 and "utilization_that_fits" not in m.fields


def test_vllm_c078_alone_gets_only_the_engines_length_estimate():
    """The one line does not name the platform: the advice is the engine's own estimate, true on any platform."""
    a = run(corpus("vllm_c078"), "qwen3-0.6b.json")
    advice = codes(a)["NOT_ENOUGH_MEMORY"].message.split(" -> ", 1)[1]
    assert advice == "--max-model-len 37,376 fits (the engine's own estimate)"


# ---------------------------------------------------------------------------------------------------------------
# 2. a negative budget: the block count is clamped at 0


def test_a_budget_at_or_below_zero_holds_no_block_never_a_negative_range():
    for K in (-1.05, -0.01):  # printed to 0.01: -0.004 may be +0.001 GiB, a block
        iv = block_interval(K, 57_344, 16)
        assert (iv.low, iv.high) == (0, 0)
    assert block_interval(4.0, 28_672, 16, exact=True).low == 149_792


def test_vllm_c076_the_clamped_pool_is_the_formula_and_the_advice_fits_a_request():
    """0.7.3 worker.py: num_gpu_blocks = max(int(-1.05 GiB // 917,504), 0) = 0, as logged: MATCH. The advice must
    leave room for one 4,096-token request (raise_if_cache_size_invalid): 0.7 + (1.05 + 0.22 + 0.005) / 8."""
    a = run(corpus("vllm_c076"), "qwen2.5-7b.json")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 0
    assert (a.formula.predicted_tokens.low, a.formula.predicted_tokens.high) == (0, 0)
    assert "TOKENS_MISMATCH" not in codes(a) and "TOKENS_MATCH" in codes(a)
    m = codes(a)["NOT_ENOUGH_MEMORY"]
    assert m.fields["utilization_that_fits"] == 0.8593
    assert "No available memory for the cache blocks" in m.message and "--max-model-len" not in m.message


def test_a_v1_negative_budget_without_the_model_length_says_positive_is_not_enough():
    """V1 (gpu_worker.py 'Available KV cache memory: -0.50 GiB', then check_enough_kv_cache_memory raises): with the
    total and the fraction but no max_model_len, the advice names the positive-budget bound and says more is
    needed."""
    text = ("(EngineCore_0 pid=1) INFO 08-20 18:04:20 [gpu_worker.py:270] Memory profiling takes 5.0 seconds\n"
            "(EngineCore_0 pid=1) DEBUG 08-20 18:04:20 [gpu_worker.py:260] Initial free memory: 79.00 GiB; Requested "
            "memory: 0.90 (util), 71.10 GiB\n"
            "(EngineCore_0 pid=1) INFO 08-20 18:04:21 [gpu_worker.py:276] Available KV cache memory: -0.50 GiB\n"
            "(EngineCore_0 pid=1) ERROR 08-20 18:04:22 [core.py:700] EngineCore failed to start.\n")
    m = codes(run(text))["NOT_ENOUGH_MEMORY"]
    assert "No available memory for the cache blocks" in m.message and "--max-model-len" not in m.message


# ---------------------------------------------------------------------------------------------------------------
# 3. a pool of no block: 'No available memory for the cache blocks', never a 0-length fix


def test_vllm_c080_quotes_the_no_memory_error_and_advises_memory_not_a_length():
    """0.2.7 llm_engine._init_cache raises 'No available memory for the cache blocks' (num_gpu_blocks <= 0) before
    its max-seq-len check: the headline quotes it, and no --max-model-len is advised (0 tokens fit no request)."""
    a = run(corpus("vllm_c080"))
    m = codes(a)["NOT_ENOUGH_MEMORY"]
    assert m.message.startswith("line 2: No available memory for the cache blocks")
    assert "--max-model-len" not in m.message and "max_model_len_that_fits" not in m.fields
    assert "raise gpu_memory_utilization" in m.message
    assert "No available memory" in judge(a).headline


def test_a_zero_pool_in_0_2_6_raises_too():
    """0.2.6 llm_engine.py has the no-memory check (not yet the max-seq-len one): a zero pool still failed."""
    text = ("INFO 01-01 10:00:00 llm_engine.py:72] Initializing an LLM engine with config: model='m', "
            "tokenizer='m', dtype=torch.float16, max_seq_len=4096, tensor_parallel_size=1, seed=0)\n"
            "INFO 01-01 10:00:05 llm_engine.py:223] # GPU blocks: 0, # CPU blocks: 512\n")
    m = codes(run(text))["NOT_ENOUGH_MEMORY"]
    assert "No available memory for the cache blocks" in m.message and "--max-model-len" not in m.message


def test_a_short_pool_of_some_blocks_keeps_the_length_advice():
    """vllm_c077 (0.6.4.post1): 1,280 tokens < 8,192: the max-seq-len error, and --max-model-len 1,280 fits."""
    a = run(corpus("vllm_c077"), "qwen2.5-72b-instruct-gptq-int4.json")
    m = codes(a)["NOT_ENOUGH_MEMORY"]
    assert "--max-model-len 1,280 fits" in m.message and "No available memory" not in m.message
