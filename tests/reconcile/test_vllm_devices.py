"""Three vLLM classes found by the harvest of corpus vllm_c082..c084, each held to the vLLM code it comes from:

- a grouped pool proven by the "Add N padding layers" warning (``v1/core/kv_cache_utils.py``
  ``_get_kv_cache_groups_uniform_page_size``, read in the 0.11.0 and 0.11.1 wheels: it pads only when the model has
  two or more layer types), whose tokens / max_model_len is not its concurrency (vllm_c082, Kimi-Linear);
- V0's "# %s blocks" line with the platform's device name "rocm" (``executor/executor_base.py``,
  ``platforms/rocm.py``), whose swap count was taken for the CPU backend's pool (vllm_c083);
- an accelerator kvaudit has no budget model for (the HPU fork's ``hpu_worker.py``), where blocks x CUDA's 16 was
  printed as the pool, and the memory lines before the first line read fell outside the startup (vllm_c084).
"""

from __future__ import annotations

import io

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.parse.lines import Line
from kvaudit.parse.vllm import Blocks, Setting, parse_line
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.verdict import judge
from tests.conftest import ROOT

CONFIGS = ROOT / "fixtures" / "configs"
CORPUS = ROOT / "fixtures" / "corpus"


def run(text: str, config: str | None = None):
    geom = load_config(CONFIGS / config) if config else None
    return audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=geom))[-1]


def codes(a) -> set[str]:
    return {f.code for f in a.findings}


def corpus(name: str) -> str:
    return (CORPUS / f"{name}.log").read_text()


def events(text: str):
    return parse_line(Line(1, text)).events


# ---------------------------------------------------------------------------------------------------------------
# 1. a grouped pool, proven by the padding warning

KV = "(EngineCore_DP0 pid=1) INFO 11-06 10:51:48 [kv_cache_utils.py:{n}] {msg}"
PAD = "(EngineCore_DP0 pid=1) WARNING 11-06 10:51:48 [kv_cache_utils.py:979] Add 1 padding layers, may waste at " \
      "most 5.00% KV cache memory"


def _pool(padding: bool) -> str:
    lines = ["(Worker_TP0 pid=2) INFO 11-06 10:51:48 [gpu_worker.py:349] Available KV cache memory: 2.30 GiB"]
    if padding:
        lines.append(PAD)
    lines += [KV.format(n=1229, msg="GPU KV cache size: 75,840 tokens"),
              KV.format(n=1234, msg="Maximum concurrency for 120,000 tokens per request: 2.48x")]
    return "\n".join(lines) + "\n"


def test_a_padded_pool_is_grouped_so_its_concurrency_is_not_tokens_over_the_length():
    # 0.11: tokens = num_blocks // groups x block, concurrency = num_blocks / per-request blocks of every group
    a = run(_pool(padding=True))
    assert "CONCURRENCY_MISMATCH" not in codes(a)
    assert a.formula.verdict == Verdict.UNKNOWN and "a grouped pool (line 2" in a.formula.verdict_reason
    assert any("the pool is grouped (line 2)" in n for n in a.notes)
    assert not any(n.startswith("block size 16 is vLLM's CUDA default") for n in a.notes)


def test_without_the_warning_the_same_ratio_is_still_a_concurrency_mismatch():
    a = run(_pool(padding=False))
    assert "CONCURRENCY_MISMATCH" in codes(a)  # 75,840 / 120,000 = 0.63x against 2.48x


def test_a_uniform_config_is_not_held_against_a_pool_the_warning_shows_grouped():
    # a config read as one layer type (an MLA + linear-attention hybrid kvaudit does not read, a drafter's layers)
    # must not yield a mismatch or a geometry finding against a grouped pool
    a = run(_pool(padding=True), config="qwen3-1.7b.json")
    assert not {"TOKENS_MISMATCH", "GEOMETRY_MISMATCH", "CONCURRENCY_MISMATCH"} & codes(a)
    assert a.formula.verdict == Verdict.UNKNOWN and "two or more layer types" in a.formula.verdict_reason
    plain = run(_pool(padding=False), config="qwen3-1.7b.json")  # the control: the config is used as before
    assert "two or more layer types" not in plain.formula.verdict_reason


def test_the_kimi_linear_excerpt_is_unchecked_without_a_concurrency_finding():
    a = run(corpus("vllm_c082"))
    assert a.formula.logged_tokens == 75840 and "CONCURRENCY_MISMATCH" not in codes(a)
    assert judge(a).status == "unchecked"


# ---------------------------------------------------------------------------------------------------------------
# 2. V0's block line on ROCm

ROCM = "INFO 06-05 13:03:17 [executor_base.py:112] # rocm blocks: 37011, # CPU blocks: 7281"


def test_the_rocm_block_line_is_a_gpu_pool_and_its_swap_count_stays_a_swap_count():
    (b,) = [e for e in events(ROCM) if isinstance(e, Blocks)]
    assert (b.gpu_blocks, b.cpu_blocks, b.device) == (37011, 7281, "rocm")


def test_a_swap_count_after_an_unknown_device_word_is_never_the_cpu_backends_pool():
    # a device name this grammar lacks: its line is not read, and "# CPU blocks: N" after ", # " is not a pool
    assert not [e for e in events("INFO 06-05 13:03:17 [executor_base.py:112] # gaudi9 blocks: 5, # CPU blocks: 7")
                if isinstance(e, Blocks)]
    (b,) = [e for e in events("INFO 10-01 10:00:00 cpu_executor.py:205] # CPU blocks: 9362") if isinstance(e, Blocks)]
    assert b.device == "cpu"  # the CPU backend's own line (0.4-0.6) is still its pool


def test_the_rocm_startup_matches_to_the_block():
    a = run(corpus("vllm_c083"), config="opt-125m.json")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 37011 * 16
    assert "CPU backend" not in (a.formula.rule or "") and "TOKENS_MISMATCH" not in codes(a)
    assert "TOKENS_MATCH" in {f.code for f in judge(a).findings}


# ---------------------------------------------------------------------------------------------------------------
# 3. an accelerator without a model: the HPU fork

HPU_BUDGET = ("INFO 08-02 17:37:54 hpu_worker.py:158] Free device memory: 79.16 GiB, 39.58 GiB usable "
              "(gpu_memory_utilization=0.5), 15.83 GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.4), "
              "23.75 GiB reserved for KV cache")


def test_the_hpu_budget_line_names_the_device():
    assert [(e.key, e.value) for e in events(HPU_BUDGET) if isinstance(e, Setting)] == [("device", "hpu")]


def test_an_hpu_pool_is_read_and_nothing_is_judged():
    a = run(corpus("vllm_c084"))
    assert a.formula.verdict == Verdict.UNKNOWN and "no model of this device's KV budget" in a.formula.verdict_reason
    assert a.formula.logged_tokens is None  # 1,519 x 16 would be CUDA's block, not the HPU's
    assert not codes(a) - {"STARTUP_FAILED", "NOT_ENOUGH_MEMORY", "INCOMPLETE_LOG"}
    assert judge(a).status == "unchecked"
    # the coverage every output shows agrees: an HPU's budget rule is a platform the support table does not model
    assert a.coverage is not None and a.coverage.level == "not" and "HPU" in a.coverage.limits[0]
    # the weights and profiling lines stand before the first line read: listed, never dropped
    assert {3, 5, 6} <= {n for n, _ in a.uninterpreted}


def test_an_hpu_block_line_alone_gives_no_count():
    text = "INFO 08-02 17:37:54 hpu_executor.py:85] # HPU blocks: 1519, # CPU blocks: 0\n"
    a = run(text)
    assert a.formula.verdict == Verdict.UNKNOWN and a.formula.logged_tokens is None
    cuda = run("INFO 08-02 17:37:54 executor_base.py:85] # cuda blocks: 1519, # CPU blocks: 0\n")
    assert cuda.formula.logged_tokens == 1519 * 16  # the control: a CUDA pool is still counted


def test_a_memory_line_before_the_first_line_read_is_listed():
    text = ("INFO 01-01 00:00:00 some_runner.py:1] Loading model weights took in total 3.00 GiB of device memory\n"
            "INFO 01-01 00:00:01 [gpu_worker.py:349] Available KV cache memory: 2.30 GiB\n"
            "INFO 01-01 00:00:01 [kv_cache_utils.py:1229] GPU KV cache size: 75,840 tokens\n")
    a = run(text)
    assert 1 in {n for n, _ in a.uninterpreted}
