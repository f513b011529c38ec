"""TurboMind's default tokens per block (cache_block_seq_len) by release, and a block line that an assumed block
length does not fit.

Upstream: v0.1.0-v0.2.6 ``lmdeploy/turbomind/deploy/target_model/base.py`` ``TurbomindModelConfig.
cache_block_seq_len = 128`` (the converted workspace's config.ini; ``LlamaTritonModel.cc`` falls back to 128 too);
v0.3.0 made it 64 (``lmdeploy/messages.py`` ``TurbomindEngineConfig.cache_block_seq_len = 64``). v0.1.0's
``SequenceManager`` sizes a block as 2 x layers x heads x block_seq_len x head_dim x bits / 8 and ``BlockManager``
prints it in whole MiB.

The lines are an InternLM camp note's ``lmdeploy serve gradio ./workspace`` (lmdeploy 0.1.0 by its pip line,
internlm-chat-7b converted to a workspace, an A100 slice of 20,470 MiB): 2 x 32 x 32 x 128 x 128 x 2 B = 64 MiB, the
block line's 64 MB, at 128 tokens per block; at 64 it would be 32 MiB. A check made with the wrong era's default raised
a GEOMETRY_MISMATCH against the engine's own line. fixtures/configs/internlm-chat-7b.json is hand-written from
internlm/internlm-chat-7b's config (32 layers, 32 heads of 128, hidden 4096, float16), which the note's own converter
output agrees with (w_qkv of 3 x 4096, layers 0-31)."""

from __future__ import annotations

import io

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import FIXTURES

INTERNLM7 = FIXTURES / "configs" / "internlm-chat-7b.json"

CAMP = """model_source: workspace
WARNING: Can not find tokenizer.json. It may take long time to initialize the tokenizer.
[TM][WARNING] [LlamaTritonModel] `max_context_token_num` = 2056.
[TM][WARNING] [LlamaTritonModel] `num_tokens_per_iter` is not set, default to `max_context_token_num` (2056).
[WARNING] gemm_config.in is not found; using default GEMM algo
[TM][INFO] NCCL group_id = 0
[TM][INFO] [BlockManager] block_size = 64 MB
[TM][INFO] [BlockManager] max_block_count = 159
[TM][INFO] [BlockManager] chunk_size = 1
[TM][INFO] LlamaBatch<T>::Start()
"""

#: the same block lines under a 0.3-0.5 engine config that states 64 tokens per block
STATED_64 = ("2024-04-01 10:00:00,000 - lmdeploy - INFO - input backend=turbomind, backend_config=TurbomindEngineConfig("
             "model_name='internlm-chat-7b', model_format=None, tp=1, session_len=None, max_batch_size=128, "
             "cache_max_entry_count=0.8, cache_block_seq_len=64, quant_policy=0, rope_scaling_factor=0.0, "
             "use_logn_attn=False, download_dir=None, revision=None, max_prefill_token_num=8192, "
             "num_tokens_per_iter=0, max_prefill_iters=1)\n")


def run(text: str, config=None):
    geom = load_config(config) if config else None
    a = audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=geom))[-1]
    return a, {f.code for f in a.findings if not f.ignored}


def test_an_era_over_v0_3_names_both_defaults():
    """The lines say 0.1-0.7 (whole MiB): 159 blocks are 20,352 tokens at 0.1-0.2's 128 or 10,176 at 64."""
    a, codes = run(CAMP)
    assert a.formula.logged_tokens is None and a.formula.verdict.value == "unknown"
    assert "at the default before 0.3.0, 128, 20,352" in a.formula.verdict_reason
    assert "at the default of 0.3.0+, 64, 10,176 tokens" in a.formula.verdict_reason


def test_the_block_line_tells_the_pre_0_3_default_and_no_mismatch_is_raised():
    a, codes = run(CAMP, INTERNLM7)
    assert "GEOMETRY_MISMATCH" not in codes
    assert a.formula.page_size == 128 and a.formula.logged_tokens == 159 * 128
    assert a.formula.bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert any("is 128 tokens per block for this model" in n for n in a.notes)


def test_a_stated_block_length_still_makes_a_mismatch():
    """cache_block_seq_len=64 stated: the model's block is 32 MiB, not the line's 64 MB, and nothing is assumed."""
    a, codes = run(STATED_64 + CAMP, INTERNLM7)
    assert a.formula.page_size == 64
    assert "GEOMETRY_MISMATCH" in codes


def test_an_assumed_block_length_that_fits_no_default_is_not_a_mismatch():
    """A 96 MB block (set by a user to 192 tokens, say): neither default fits; the block length is not in the log,
    so nothing is judged, and the note says why."""
    a, codes = run(CAMP.replace("block_size = 64 MB", "block_size = 96 MB"), INTERNLM7)
    assert "GEOMETRY_MISMATCH" not in codes
    assert any("the log does not state cache_block_seq_len, so no mismatch is judged" in n for n in a.notes)
