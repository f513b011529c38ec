"""Which free memory SGLang sizes the pool from with a speculative draft, and which draft term its cell carries.

Read in the 0.5.13-0.5.18 and 0.5.23 wheels (reconcile/sglang/formula.py): up to 0.5.13 the target's pool is
allocated inside the target worker's constructor, before the draft loads (post = the target's 'Load weight
end'); from 0.5.14 ``Scheduler.init_model_worker`` loads the target, then the draft, then ``init_memory_pools``
(post = the draft's 'Load weight end'). The synthetic logs follow the releases' format strings; the numbers are
chosen so each reading gives a different count. Oracle: floor((post - (1 - mfs) T) 2^30 / cell), written out."""

from __future__ import annotations

import io
import math

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from tests.conftest import CONFIGS, ROOT

CORPUS = ROOT / "fixtures" / "corpus"
GIB = 2**30
LLAMA = load_config(CONFIGS / "llama3-8b.json")  # 32 layers x 8 KV heads x 128: 131,072 B a token in bf16
CELL = 131072


def run(data: bytes, **opts):
    (a,) = audit(read_log(io.BytesIO(data)), AuditOptions(**opts))
    return a


def tokens(post: float, T: float, mfs: float, cell: float) -> int:
    return math.floor((post - (1 - mfs) * T) * GIB / cell)


def _log(version: str, algo: str, n: int, draft: str) -> bytes:
    """One rank: T 80, the target's weights leave 40.00, an optional draft (1.00 GB) 'before' or 'after' the
    pool, mfs 0.8."""
    kv = n * CELL / 2 / GIB
    head = (f"SGLang Version {version}\n"
            f"[2026-07-01 10:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.8, tp_size=1, "
            f"page_size=1, speculative_algorithm={algo!r}, max_running_requests=48)\n"
            "[2026-07-01 10:00:01] Load weight begin. avail mem=80.00 GB\n"
            "[2026-07-01 10:00:02] Load weight end. elapsed=1.00 s, type=LlamaForCausalLM, dtype=torch.bfloat16, "
            "avail mem=40.00 GB, mem usage=40.00 GB.\n")
    drafted = ("[2026-07-01 10:00:03] Load weight begin. avail mem=40.00 GB\n"
               "[2026-07-01 10:00:04] Load weight end. elapsed=1.00 s, type=LlamaForCausalLMEagle3, "
               "dtype=torch.bfloat16, avail mem=39.00 GB, mem usage=1.00 GB.\n")
    pool = (f"[2026-07-01 10:00:05] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {n}, "
            f"K size: {kv:.2f} GB, V size: {kv:.2f} GB\n"
            f"[2026-07-01 10:00:05] Memory pool end. avail mem={39.0 - 2 * kv:.2f} GB\n")
    tail = (f"[2026-07-01 10:00:09] max_total_num_tokens={n}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=48, context_len=8192, available_gpu_mem=5.00 GB\n")
    body = {"before": head + drafted + pool, "after": head + pool + drafted, "none": head + pool}[draft]
    return (body + tail).encode()


def test_from_0_5_14_the_pool_is_sized_after_the_drafts_weights():
    """0.5.16 EAGLE3 on a plain pool, with the config: post is the draft's 39.00, the cell x (1 + 1/32)."""
    n = tokens(39.0, 80.0, 0.8, CELL * 33 / 32)
    a = run(_log("0.5.16", "EAGLE3", n, "before"), model_geometry=LLAMA)
    f = a.formula
    assert f.post_load_free_gib == 39.0 and f.verdict == Verdict.MATCH, f.verdict_reason
    assert "draft weights loaded first" in (f.rule or "")
    assert any(r.source == "Load weight end (draft)" for r in a.formula_rows)
    assert any("init_model_worker" in n and "the log's order" in n for n in a.notes)


def test_up_to_0_5_13_the_target_pool_comes_before_the_draft():
    """0.5.13: ModelRunner.initialize allocates the target's pool before the draft worker exists; the draft's
    reading after the pool is not the post."""
    n = tokens(40.0, 80.0, 0.8, CELL)
    a = run(_log("0.5.13", "EAGLE3", n, "after"), model_geometry=LLAMA)
    assert a.formula.post_load_free_gib == 40.0 and a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason
    assert "0.5.7-0.5.13" in (a.formula.rule or "")
    assert not any("draft's 'Load weight end' reading" in n for n in a.notes)


def test_the_logs_order_decides_even_against_the_release():
    """A draft that loads after the target's pool (0.5.14's FROZEN_KV_MTP, a patched build) leaves the target's
    reading as post: the order on the rank is the evidence."""
    n = tokens(40.0, 80.0, 0.8, CELL * 33 / 32)
    a = run(_log("0.5.16", "EAGLE3", n, "after"), model_geometry=LLAMA)
    assert a.formula.post_load_free_gib == 40.0 and a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason


def test_ngram_has_no_draft_model_and_no_draft_term():
    n = tokens(40.0, 80.0, 0.8, CELL)
    a = run(_log("0.5.16", "NGRAM", n, "none"))
    f = a.formula
    assert f.post_load_free_gib == 40.0 and f.verdict == Verdict.MATCH and "NGRAM" in (f.rule or ""), f.verdict_reason


@pytest.mark.parametrize("algo,geometry,why", [
    ("DFLASH", LLAMA, "ceil(cell x (L + L_draft) / L)"),  # L_draft is the draft's config's, not in the log
    ("EAGLE3", None, "without --model-config"),  # the cell's layers are the config's
])
def test_a_draft_term_kvaudit_cannot_compute_is_said_and_not_judged(algo, geometry, why):
    """The count fits the draft's post with no term; but the engine adds one kvaudit cannot compute here:
    no prediction, verdict unknown, never a match or mismatch by guess."""
    n = tokens(39.0, 80.0, 0.8, CELL)
    a = run(_log("0.5.16", algo, n, "before"), model_geometry=geometry)
    assert a.formula.verdict == Verdict.UNKNOWN and why in a.formula.verdict_reason
    assert a.formula.predicted_tokens is None
    assert not any(f.code in ("TOKENS_MISMATCH", "TOKENS_MATCH") for f in a.findings)


def test_c072_dflash_on_a_sliding_window_hybrid():
    """sglang_c072 (0.5.16, GB10, Laguna-S-2.1 NVFP4 + DFLASH): the pool is sized from the draft's 18.98, not the
    target's 22.10, and HybridSWAPoolConfigurator adds no DFLASH term before 0.5.18:
    18.98 - 0.12 x 115.26 = 5.149 GiB over 166,610..167,912 B -> 32,889..33,218 (32,767.. with the GB10 T drift);
    the log has 32,997. The 0.5.18+ rule (the draft's own bytes per token) is said not modelled."""
    a = run((CORPUS / "sglang_c072.log").read_bytes())
    f = a.formula
    assert f.post_load_free_gib == 18.98 and f.rest_gib == pytest.approx(5.149, abs=0.001)
    assert f.verdict == Verdict.MATCH and f.predicted_tokens.low <= 32997 <= f.predicted_tokens.high
    assert "DFLASH on a sliding-window hybrid: no draft term" in (f.rule or "")
    assert "0.5.18+" in f.verdict_reason and "not modelled" in f.verdict_reason
    # the draft's pool (13.28 -> 12.49) stands between the target's pool end and the graphs: counted once
    r = a.ranks[0]
    assert r.item("attention_backend").gib == pytest.approx(12.49 - 11.81, abs=0.001)
    assert "draft pool end" in r.item("attention_backend").label


def test_c071_unexplained_memory_is_the_pool_stage_not_the_drafts_pool():
    """sglang_c071: post 46.25 (the draft's) -> 185,897 matches; the ledger no longer books the draft's 4.38 GiB
    pool as attention-backend buffers (17.73 -> 12.52): 13.35 -> 12.52 = 0.83, and -0.43 GiB remains (the pool
    stage's readings drop 28.52 for a logged 28.93 on unified memory)."""
    a = run((CORPUS / "sglang_c071.log").read_bytes())
    assert a.formula.post_load_free_gib == 46.25 and a.formula.verdict == Verdict.MATCH
    r = a.ranks[0]
    assert r.item("attention_backend").gib == pytest.approx(0.83, abs=0.001)
    assert r.unexplained_gib == pytest.approx(-0.43, abs=0.01)
    unexplained = next(f for f in a.findings if f.code == "UNEXPLAINED_MEMORY")
    assert "embed_tokens" not in unexplained.message  # an EAGLE/NEXTN draft's copies, not a DFLASH draft's
