"""SGLang builds that print their own KV budget ('The available memory for KV cache is X GB'), and matches that
hold only through slack spanning two eras' speculative rules.

The budget line is the engine's ``rest`` (profile_max_num_token: ``available - total x (1 - mfs)``), printed by the
Ascend image cann8.3.rc2-a3-release20260106 (corpus sglang_c075..c079; no release wheel 0.5.6.post2-0.5.10 prints
it). The engine reads T and the free memory at other moments than the printed 'Load weight begin/end' lines (T at the
end of init_torch_distributed, the free memory inside profile_max_num_token, both the minimum over ranks), so the
budget it divides can lie a few hundredths of a GiB off post - (1 - mfs) x T: the count is predicted from the printed
budget, and a budget further off than the measured drift is not checked. The era rules (model_runner.py
init_memory_pool 0.4.4-0.5.6: EAGLE headroom; model_runner_kv_cache_mixin.py 0.5.7: none) are read in the
0.5.6.post2 and 0.5.7 wheels. Oracle: floor(rest x 2^30 / cell), written out."""

from __future__ import annotations

import math

from kvaudit.reconcile.interface import Verdict
from tests.corpus_run import audit_entry
from tests.reconcile.test_sglang_draft_post import CELL, GIB, LLAMA, run  # Llama-3-8B: 131,072 B a token


def _log(budget: float, n: int, draft_budget: float | None = None) -> bytes:
    """One rank of a 0.5.6 build: T 80.00, the weights leave 40.00, mfs 0.8, page 1 (post - 0.2 x T = 24.00),
    the engine's own budget printed before the pool; an EAGLE draft with its own budget line after the pool."""
    kv = n * CELL / 2 / GIB
    spec = ", speculative_algorithm='EAGLE', speculative_num_steps=1, speculative_eagle_topk=1, " \
        "speculative_num_draft_tokens=2" if draft_budget is not None else ""
    out = ("SGLang Version 0.5.6\n"
           f"[2026-01-07 06:57:58] server_args=ServerArgs(model_path='m', mem_fraction_static=0.8, tp_size=1, "
           f"page_size=1, max_running_requests=8{spec})\n"
           "[2026-01-07 06:58:10 TP0] Load weight begin. avail mem=80.00 GB\n"
           "[2026-01-07 06:59:28 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
           "avail mem=40.00 GB, mem usage=40.00 GB.\n"
           f"[2026-01-07 06:59:28 TP0] The available memory for KV cache is {budget:.2f} GB.\n"
           f"[2026-01-07 06:59:29 TP0] KV Cache is allocated. #tokens: {n}, K size: {kv:.2f} GB, V size: {kv:.2f} GB\n"
           f"[2026-01-07 06:59:29 TP0] Memory pool end. avail mem={40.0 - 2 * kv:.2f} GB\n")
    if draft_budget is not None:
        out += ("[2026-01-07 07:00:01 TP0] Load weight begin. avail mem=15.00 GB\n"
                "[2026-01-07 07:00:01 TP0] Load weight end. type=LlamaForCausalLMEagle, dtype=torch.bfloat16, "
                "avail mem=14.00 GB, mem usage=1.00 GB.\n"
                f"[2026-01-07 07:00:01 TP0] The available memory for KV cache is {draft_budget:.2f} GB.\n"
                f"[2026-01-07 07:00:01 TP0] KV Cache is allocated. #tokens: {n}, K size: 0.10 GB, V size: 0.10 GB\n"
                "[2026-01-07 07:00:01 TP0] Memory pool end. avail mem=13.80 GB\n")
    out += (f"[2026-01-07 07:00:27 TP0] max_total_num_tokens={n}, chunked_prefill_size=8192, "
            "max_prefill_tokens=16384, max_running_requests=8, context_len=8192, available_gpu_mem=5.00 GB\n")
    return out.encode()


def test_the_engines_own_budget_is_divided():
    """24.02 GiB printed, 24.00 from the printed readings (0.009 GiB apart at the nearest): 196,771 tokens is the
    printed budget divided and lies above every count the readings' formula allows (at most 196,657)."""
    n = math.floor(24.02 * GIB / CELL)
    assert n > math.floor(24.006 * GIB / CELL)
    f = run(_log(24.02, n), model_geometry=LLAMA).formula
    assert f.verdict == Verdict.MATCH, f.verdict_reason
    assert f.check_text is not None and "the engine's own budget 24.02 GiB" in f.check_text


def test_a_budget_off_the_formula_is_not_checked():
    """23.90 GiB printed against 24.00 from the readings: the division fits, the budget does not: unknown."""
    n = math.floor(23.90 * GIB / CELL)
    f = run(_log(23.90, n), model_geometry=LLAMA).formula
    assert f.verdict == Verdict.UNKNOWN
    assert "0.089 GiB off post - (1 - mfs) x T" in f.verdict_reason


def test_the_drafts_budget_line_is_the_drafts():
    """An EAGLE draft sized after the target's pool prints its own (smaller) budget: it is not the target's."""
    h = 8 * (1 * 1) + 8 * 2 + 100  # the 0.5.6 headroom
    n = math.floor(24.02 * GIB / CELL) + h
    a = run(_log(24.02, n, draft_budget=12.50), model_geometry=LLAMA)
    assert a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason
    assert "24.02" in (a.formula.check_text or "") and "12.50" not in (a.formula.check_text or "")


def test_ascend_image_follows_the_headroom_rule_on_its_own_budget():
    """sglang_c075 (Qwen3-30B-A3B EAGLE3, TP2): on the engine's 36.69 GiB and the config's 49,152 B only the
    0.4.4-0.5.6 headroom rule (1,444 tokens) holds 802,944; from the printed readings (36.678) kvaudit said
    TOKENS_MISMATCH 1,664 over."""
    a = audit_entry("sglang_c075", {"config": "qwen3-30b-a3b.json"})
    f = a.formula
    assert f.verdict == Verdict.MATCH and "0.4.4-0.5.6" in (f.rule or ""), f.verdict_reason
    assert (f.predicted_tokens.low, f.predicted_tokens.high) == (802816, 802944)
    assert f.speculative_headroom_tokens == 1444


def test_same_image_same_rule_where_the_readings_pointed_at_the_other_era():
    """sglang_c077 (Qwen3-32B TP8, headroom 388): the printed readings' budget (35.788) fit the 0.5.7 rule; the
    engine's own (35.77) fits the headroom rule alone, as its sibling c075."""
    f = audit_entry("sglang_c077", {"config": "qwen3-32b.json"}).formula
    assert f.verdict == Verdict.MATCH and "0.4.4-0.5.6" in (f.rule or ""), f.verdict_reason


def test_a_count_that_fits_two_eras_rules_is_not_a_match():
    """sglang_c078 without the config: the KV line's cell slack widens both rules past their 388-token
    difference; the count lies in both: unknown. With the config only the headroom rule holds it."""
    f = audit_entry("sglang_c078", {}).formula
    assert f.verdict == Verdict.UNKNOWN
    assert "fits both" in f.verdict_reason and "0.5.7-0.5.13" in f.verdict_reason \
        and "0.4.4-0.5.6" in f.verdict_reason
    g = audit_entry("sglang_c078", {"config": "qwen3-32b.json"}).formula
    assert g.verdict == Verdict.MATCH and "0.4.4-0.5.6" in (g.rule or ""), g.verdict_reason


def test_a_kv_line_larger_than_the_engines_budget_is_not_the_cell():
    """sglang_c080 (DeepSeek-V3.2 on the Ascend A3 image of 2026-01-13): 'KV size: 5.52 GB' for 68,864 tokens
    beside a printed budget of 5.03 GB, which holds at most 62,987 tokens at the line's 85,909 B: the line counts
    bytes the division did not price. Without the config the count is not checked (was TOKENS_MISMATCH 5,888
    more); with it the NSA cell (576 x 2 + 132 B) x 61 = 78,324 B divides the budget to 68,864..68,992."""
    f = audit_entry("sglang_c080", {}).formula
    assert f.verdict == Verdict.UNKNOWN and "exceed the engine's own budget of 5.03 GiB" in f.verdict_reason
    a = audit_entry("sglang_c080", {"config": "deepseek-v3.2.json"})
    g = a.formula
    assert g.verdict == Verdict.MATCH and g.bytes_per_token == 78324, g.verdict_reason
    assert (g.predicted_tokens.low, g.predicted_tokens.high) == (68864, 68992)
    assert not any(x.code == "GEOMETRY_MISMATCH" for x in a.findings)


def test_the_eagle_headroom_is_not_a_line_over_the_budget():
    """sglang_c075: the pool's 802,944 tokens at 49,150 B are 36.76 GiB beside a 36.69 GiB budget, the 1,444
    tokens of 0.4.4-0.5.6's headroom: the KV line still gives the cell."""
    f = audit_entry("sglang_c075", {}).formula
    assert f.bytes_per_token_source == "kv_line" and f.verdict == Verdict.MATCH, f.verdict_reason
