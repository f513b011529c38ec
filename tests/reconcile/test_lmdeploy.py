"""LMDeploy: each era's grammar and formula, from the format strings of the release's code (InternLM/lmdeploy:
BlockManager.cc, SequenceManager.cc, turbomind.cc, LlamaBatch.cc, pytorch/engine/executor/base.py,
cache_engine.py); the numbers are worked by hand in each test's docstring."""

from __future__ import annotations

import io
import json

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.reconcile.lmdeploy.cell import pytorch_block, turbomind_block
from kvaudit.verdict import judge
from kvaudit.versions import VersionRange
from tests.conftest import FIXTURES, cli, cli_process

LLAMA70 = FIXTURES / "configs" / "llama31-70b.json"
QWEN7 = FIXTURES / "configs" / "qwen2.5-7b.json"


def run(text: str, **opts):
    a = audit(read_log(io.BytesIO(text.encode())), AuditOptions(**opts))[-1]
    return a, {f.code for f in a.findings if not f.ignored}, judge(a)


def test_turbomind_block_layout_per_era():
    """gpt-oss-20b, quant_policy 4 (block::Layout, 0.4+): 24 x 8 x 2 x 64 x (64 x 4 / 8 + 2 x 16 / 8) = 884,736 B,
    the 0.844 MB of samples/lmdeploy_001; before 0.4 quant_policy 4 was int8 without scales: 2 x 24 x 8 x 64 x 64 x
    8 / 8 = 1,572,864 B; a range over both is not determined."""
    new = VersionRange((0, 8, 0), (0, 12, 99))
    assert turbomind_block(24, 8, 64, 1, 64, 4, new).bytes == 884_736
    assert turbomind_block(24, 8, 64, 1, 64, 4, VersionRange((0, 2, 0), (0, 3, 99))).bytes == 1_572_864
    assert turbomind_block(24, 8, 64, 1, 64, 4, VersionRange((0, 2, 0), (0, 8, 0))).bytes is None
    # unquantised: the same in every era; shared-KV MLA (head_dim 576) holds one copy from 0.13
    assert turbomind_block(80, 8, 128, 2, 64, 0, VersionRange((0, 1, 0), None)).bytes == 10 * 2**20
    assert turbomind_block(61, 1, 576, 1, 64, 0, VersionRange((0, 13, 0), None)).bytes == 61 * 64 * 576 * 2
    # CacheEngine.get_cache_block_size: int8 keeps a 16-bit scale and zero per head and token
    assert pytorch_block(28, 4, 128, 1, 64, 8).bytes == 2 * 28 * 64 * 4 * (128 + 4)


def test_the_block_line_checks_the_config_and_names_an_unstated_quant_policy():
    """Qwen2.5-7B (28 layers, 4 KV heads of 128) at quant_policy 8: 28 x 4 x 2 x 64 x (128 + 4) = 1,892,352 B =
    1.805 MiB. The log does not state the policy: the block line says which one it was (rule 3: an assumed value
    does not make a mismatch); 16-bit would be 3.500 MiB."""
    log = ("cache_block_seq_len = 64\n[TM][INFO] [BlockManager] block_size = 1.805 MB\n"
           "[TM][INFO] [BlockManager] max_block_count = 2000\n[TM][INFO] [BlockManager] chunk_size = 2000\n")
    a, codes, j = run(log, model_geometry=load_config(QWEN7))
    assert "GEOMETRY_MISMATCH" not in codes
    assert a.formula.bytes_per_token == 1_892_352 // 64 and a.formula.logged_tokens == 128_000
    assert any("quant_policy 8" in n for n in a.notes)
    assert a.ranks[0].kv_gib == pytest.approx(2000 * 1_892_352 / 2**30, abs=1e-4)
    # stated as 0 by the engine config, the same line is a real mismatch
    a, codes, _ = run("2025-01-01 10:00:00,000 - lmdeploy - INFO - async_engine.py:1 - updated backend_config="
                      "TurbomindEngineConfig(tp=1, cache_max_entry_count=0.8, cache_block_seq_len=64, quant_policy=0)"
                      "\n" + log, model_geometry=load_config(QWEN7))
    assert "GEOMETRY_MISMATCH" in codes


def test_a_block_count_above_one_is_checked_exactly():
    """TurboMind <=0.14: cache_max_entry_count >= 1 is the block count (BlockManager: max_block_count_ =
    block_count)."""
    head = ("2024-11-07 12:04:20,426 - lmdeploy - INFO - async_engine.py:142 - input backend=turbomind, backend_config="
            "TurbomindEngineConfig(tp=2, session_len=8192, cache_max_entry_count=500, cache_block_seq_len=64, "
            "quant_policy=0)\n")
    a, codes, j = run(head + "[TM][INFO] [BlockManager] block_size = 10.000 MB\n"
                      "[TM][INFO] [BlockManager] max_block_count = 500\n", model_geometry=load_config(LLAMA70))
    assert a.formula.verdict == Verdict.MATCH and "TOKENS_MATCH" in codes and j.status == "ok"
    a, codes, j = run(head + "[TM][INFO] [BlockManager] block_size = 10.000 MB\n"
                      "[TM][INFO] [BlockManager] max_block_count = 480\n", model_geometry=load_config(LLAMA70))
    assert a.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes and j.status == "warning"


def test_linear_state_models_take_the_state_out_first():
    """0.13-0.14 SequenceManager: (target - linear) / block = (65,536.00 - 1,024.00) MiB / 10 MiB = 6,451.2 ->
    6,451 blocks (the block manager truncates the double)."""
    log = ("[TM][INFO][0318.21:44:04.970123][SequenceManager.cc:118] [SeqMgr] Adjusting block_count: free_before "
           "81920.00 MB, linear 1024.00 MB, target 65536.00 MB\n"
           "[TM][INFO][0318.21:44:04.970200][SequenceManager.cc:131] [SeqMgr] Adjusted block_count to 6451\n"
           "[TM][INFO][0318.21:44:04.970300][BlockManager.cc:33] block_size = 10.000 MB\n"
           "[TM][INFO][0318.21:44:04.970400][BlockManager.cc:34] max_block_count = {n}\n")
    a, codes, j = run(log.format(n=6451))
    assert a.engine_version == "0.13.0..0.14.99"
    assert a.formula.verdict == Verdict.MATCH and j.status == "ok"
    assert a.formula.post_load_free_gib == pytest.approx(80.0)
    assert a.ranks[0].item("linear_state").gib == pytest.approx(1.0)
    a, codes, j = run(log.format(n=6000))
    assert a.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes


def test_linear_state_lines_under_the_old_prefix_are_0_12_3():
    """The [SeqMgr] lines arrived in v0.12.3 (#4434), whose TurboMind still prints "[TM][INFO] " and
    "[BlockManager] block_size = X.XXX MB": the two clues meet at 0.12.3, neither is set aside, and the formula is
    the same as 0.13-0.14's: (16,384.00 - 1,024.00) MiB / 10 MiB = 1,536 blocks."""
    log = ("[TM][INFO] [SeqMgr] Adjusting block_count: free_before 20480.00 MB, linear 1024.00 MB, target 16384.00 MB\n"
           "[TM][INFO] [SeqMgr] Adjusted block_count to 1536\n"
           "[TM][INFO] [BlockManager] block_size = 10.000 MB\n"
           "[TM][INFO] [BlockManager] max_block_count = {n}\n")
    a, codes, j = run(log.format(n=1536))
    assert a.engine_version == "0.12.3..0.12.99"
    assert not any("contradicts" in e for e in a.version_evidence)
    assert a.formula.verdict == Verdict.MATCH and j.status == "ok"
    a, codes, j = run(log.format(n=1400))
    assert a.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes


def test_the_object_cache_is_bytes_and_is_checked_as_such():
    """0.15+: budget = floor(free x ratio): 81,920.00 MiB x 0.800 = 65,536.00 MiB; no token count to check."""
    ok, codes, j = run("[TM][INFO][0801.10:00:00.000001][turbomind.cc:303] Object cache budget: 65536.00 MB from free "
                       "81920.00 MB and ratio 0.800\n")
    assert ok.engine_version == ">=0.15.0" and "BUDGET_RECONCILES" in codes and j.status == "ok"
    assert ok.formula.verdict == Verdict.UNKNOWN and ok.formula.logged_tokens is None
    assert "no token count" in ok.formula.verdict_reason
    assert ok.ranks[0].item("kv_cache").gib == pytest.approx(64.0)
    bad, codes, j = run("[TM][INFO][0801.10:00:00.000001][turbomind.cc:303] Object cache budget: 60000.00 MB from "
                        "free 81920.00 MB and ratio 0.800\n")
    assert "BUDGET_MISMATCH" in codes and j.status == "warning"


def test_pytorch_engine_formula_from_its_debug_lines():
    """update_configs: int((free - runtime) x ratio / block): (60,000 - 2,000) MiB x 0.8 / (2 x 28 x 64 x 4 x 128 x 2
    = 3,670,016 B) = 13,257.1 -> 13,257 blocks (+-1 for the MiB cut); 848,448 tokens."""
    log = ("2025-05-01 10:00:00,123 - lmdeploy - INFO - async_engine.py:283 - updated backend_config=PytorchEngineConfig("
           "dtype='auto', tp=1, session_len=None, max_batch_size=128, cache_max_entry_count=0.8, block_size=64, "
           "num_gpu_blocks=0, quant_policy=0)\n"
           "2025-05-01 10:00:01,000 - lmdeploy - DEBUG - base.py:171 - minimal free gpu memory: 60000 mb\n"
           "2025-05-01 10:00:01,001 - lmdeploy - DEBUG - base.py:186 - estimated max runtime memory: 2000 mb\n"
           "2025-05-01 10:00:02,000 - lmdeploy - INFO - base.py:196 - Building CacheEngine with config: \n"
           "CacheConfig(max_batches=128, block_size=64, num_cpu_blocks=0, num_gpu_blocks={n}, window_size=-1, "
           "cache_max_entry_count=0.8, max_prefill_token_num=8192).\n")
    a, codes, j = run(log.format(n=13257), model_geometry=load_config(QWEN7))
    assert a.engine_display == "LMDeploy (PyTorch engine)"
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 848_448 and j.status == "ok"
    assert a.ranks[0].item("runtime_estimate").gib == pytest.approx(2000 / 1024, abs=1e-3)
    a, codes, j = run(log.format(n=12000), model_geometry=load_config(QWEN7))
    assert "TOKENS_MISMATCH" in codes


def test_failures_are_errors_quoted():
    a, codes, j = run("2025-05-01 10:00:00,123 - lmdeploy - INFO - async_engine.py:283 - updated backend_config="
                      "PytorchEngineConfig(tp=1, cache_max_entry_count=0.8, block_size=64)\n"
                      "RuntimeError: No enough gpu memory for kv cache.\n")
    assert j.status == "error" and "NOT_ENOUGH_MEMORY" in codes
    assert j.headline.startswith("ERROR startup failed: ") and "No enough gpu memory for kv cache" in j.headline


def test_a_default_log_level_says_how_to_get_the_lines():
    """A WARNING-level TurboMind log holds only the model config: the block from it, and the flag that shows more."""
    log = "".join(f"{k} = {v}\n" for k, v in (("tensor_para_size", 2), ("kv_head_num", 8), ("num_layer", 60),
                                                ("size_per_head", 128), ("cache_max_entry_count", 0.8),
                                                ("cache_block_seq_len", 64), ("quant_policy", 0)))
    a, codes, j = run(log)
    assert "INCOMPLETE_LOG" in codes and j.status == "unchecked"
    assert a.formula.bytes_per_token == 60 * 4 * 2 * 128 * 2
    msg = next(f.message for f in a.findings if f.code == "INCOMPLETE_LOG")
    assert "--log-level INFO" in msg


def test_ranks_of_one_start_are_not_restarts():
    """TurboMind <=0.12 prints the block manager once per TP rank, untagged: two at TP2 are one start; a third opens
    the next start."""
    cfg = ("2024-11-07 12:04:20,426 - lmdeploy - INFO - async_engine.py:142 - input backend=turbomind, backend_config="
           "TurbomindEngineConfig(tp=2, cache_max_entry_count=0.8, cache_block_seq_len=64, quant_policy=0)\n")
    pool = "[TM][INFO] [BlockManager] block_size = 10.000 MB\n[TM][INFO] [BlockManager] max_block_count = 3000\n"
    log = read_log(io.BytesIO((cfg + pool + pool + cfg + pool + pool).encode()))
    assert len(log.startups) == 2


def test_cli_explain_json_and_whatif(tmp_path):
    p = tmp_path / "lm.log"
    p.write_text("[TM][INFO] [BlockManager] block_size = 9.000 MB\n[TM][INFO] [BlockManager] max_block_count = 863\n")
    d = cli("explain", p, "-f", "json").json()
    # the block length is not in these lines: the token count is said as a conditional, never as the pool's size
    assert d["engine"] == "lmdeploy" and d["formula"]["logged_tokens"] is None and d["status"] == "unchecked"
    assert "at the default 64, 55,232 tokens" in d["formula"]["verdict_reason"]
    w = cli("whatif", p, "--cache-max-entry-count", "0.9", "-f", "json")
    doc = json.loads(w.stdout)
    assert doc["whatif"]["changes"] == {"cache_max_entry_count": 0.9}
    # 863 x 9 MiB / 0.8 x 0.9 / 9 MiB = 970.875 -> 970 blocks
    assert doc["whatif"]["tokens_after"]["low"] == 970 * 64
    # the free memory rests on the assumed ratio 0.8 (the lines do not state it): said first, and no block count is
    # pinned on it (ux-audit item 27)
    assert doc["whatif"]["pin"] is None
    assert "rests on the assumed cache_max_entry_count 0.8" in doc["whatif"]["explanation"][0]
    r = cli_process("whatif", p, "--mem-fraction-static", "0.9")
    assert r.code == 2 and "--cache-max-entry-count" in r.stderr
    r = cli_process("whatif", p, "--quant-policy", "3")
    assert r.code == 2 and "0 (none), 8 (int8) or 4 (int4)" in r.stderr


def test_live_endpoint_reads_the_settings_only():
    from kvaudit.engines import audit_endpoint

    page = ('# HELP lmdeploy:backend_config_info information of backend_config\n# TYPE lmdeploy:backend_config_info '
            'gauge\nlmdeploy:backend_config_info{cache_max_entry_count="0.8",session_len="32768",'
            'cache_block_seq_len="64",tp="2",quant_policy="0"} 1.0\n# HELP lmdeploy:gpu_cache_usage_perc x\n'
            '# TYPE lmdeploy:gpu_cache_usage_perc gauge\nlmdeploy:gpu_cache_usage_perc{model_name="m",engine="0"} 0.25\n')
    a = audit_endpoint({"/metrics": page}, "http://h:23333", AuditOptions())
    assert a is not None and a.engine == "lmdeploy" and a.from_endpoint
    assert a.formula.mem_fraction_static == 0.8 and a.formula.page_size == 64 and a.model.attention_tp_size == 2
    assert a.formula.verdict == Verdict.UNKNOWN and any("25.0 %" in n for n in a.notes)


def test_other_engines_reprs_and_keys_are_not_lmdeploy_lines():
    """vLLM's CacheConfig repr, a stray 'session_len' or a model key alone never make an LMDeploy startup."""
    from kvaudit.parse.lines import Line
    from kvaudit.parse.lmdeploy import LMDeployParser, parse_line

    vllm = ("INFO 06-01 10:00:00 [config.py:1] cache_config=CacheConfig(block_size=16, gpu_memory_utilization=0.9, "
            "swap_space=4, num_gpu_blocks=2048, num_cpu_blocks=512, window_size=-1)")
    assert parse_line(Line(1, vllm))[0] == []
    lines = [Line(1, "session_len = 4096"), Line(2, "the request's session_len exceeded"), Line(3, "num_layer = 32")]
    assert LMDeployParser().parse(lines) == []


def test_the_host_blocks_confirm_the_block_size_and_the_prefill_note_is_the_engines():
    """CacheConfig's num_cpu_blocks is int(4 GiB / block bytes) at the engine's default host memory: for Qwen2.5-7B
    (28 layers, 4 KV heads of 128, 16-bit) a block is 3,670,016 B and 4 GiB holds 1,170 of them. Its
    max_prefill_token_num is the setting, not the engine lowering it (that is the WARNING line)."""
    log = ("2024-09-05 08:38:32,712 - lmdeploy - INFO - build CacheEngine with config:CacheConfig(max_batches=128, "
           "block_size=64, num_cpu_blocks={cpu}, num_gpu_blocks=1000, window_size=-1, cache_max_entry_count=0.8, "
           "max_prefill_token_num=4096, enable_prefix_caching=False)\n")
    a, codes, _ = run(log.format(cpu=1170), model_geometry=load_config(QWEN7))
    assert a.engine_version == "0.6.0..0.6.1"
    assert any("3,670,016 B agrees" in n for n in a.notes) and not any("lowered" in n for n in a.notes)
    a, codes, _ = run(log.format(cpu=2340), model_geometry=load_config(QWEN7))
    assert any("does not" in n for n in a.notes) and "GEOMETRY_MISMATCH" not in codes  # an assumption: said only
    a, _, _ = run("2024-09-05 08:38:30,000 - lmdeploy - WARNING - device<0> No enough memory. update "
                  "max_prefill_token_num=2048\n" + log.format(cpu=1170), model_geometry=load_config(QWEN7))
    assert any("lowered max_prefill_token_num to 2,048" in n for n in a.notes)


def test_whatif_names_lmdeploys_settings_in_its_own_words(tmp_path):
    """--quant-policy and --session-len are LMDeploy's words, and the what-if says them so (not kv_cache_dtype):
    Qwen2.5-7B's 16-bit block of 3.500 MiB becomes (128 + 4) / 256 of it at int8."""
    p = tmp_path / "lm.log"
    p.write_text("cache_block_seq_len = 64\n[TM][INFO] [BlockManager] block_size = 3.500 MB\n"
                 "[TM][INFO] [BlockManager] max_block_count = 1000\n")
    doc = json.loads(cli("whatif", p, "-m", QWEN7, "--quant-policy", "8", "--session-len", "200000", "-f",
                         "json").stdout)
    assert doc["whatif"]["changes"] == {"quant_policy": 8, "session_len": 200000}
    assert doc["whatif"]["tokens_after"]["low"] > 64_000 * 1.9  # about twice the 64,000 tokens


@pytest.mark.parametrize("text", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "2025-01-01 10:00:00,000 - lmdeploy - ERROR - [engine.py] torch.OutOfMemoryError: CUDA out of memory.",
])
def test_an_out_of_memory_message_is_quoted_whole(text):
    """The message after the logger's last bracket, or the whole line where it has none (it lost its first
    character: 'orch.OutOfMemoryError')."""
    from kvaudit.parse.lmdeploy import parse_line
    from kvaudit.parse.lines import Line

    events, _ = parse_line(Line(1, text))
    (failure,) = events
    assert failure.message.startswith("torch.OutOfMemoryError"), failure.message
