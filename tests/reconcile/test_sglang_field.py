"""Field test of December 2026: real SGLang startup logs kvaudit had not seen (fixtures/corpus/sglang_c046..),
each class of wrong answer they exposed held to the truth read from SGLang's code at that release."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import Audit, AuditOptions
from kvaudit.verdict import judge

CORPUS = Path(__file__).resolve().parent.parent.parent / "fixtures" / "corpus"


def _audit(name: str) -> Audit:
    with open(CORPUS / f"{name}.log", "rb") as fh:
        return audit(read_log(fh), AuditOptions(source=name))[-1]


def _codes(a: Audit) -> dict:
    return {f.code: f for f in a.findings if not f.ignored}


@pytest.mark.parametrize("name", ["sglang_c048", "sglang_c049"])
def test_a_pool_the_cap_sized_is_not_told_to_raise_the_fraction(name):
    """The SGLang docs' CI servers run with --max-total-tokens 20480 and 100+ GiB idle. The pool is
    min(profiled, max_total_tokens) (model_runner.py / pool_configurator.py), so a larger fraction cannot grow it:
    the advice is the cap, and the match says the cap bound rather than that the fraction gives 20,480."""
    a = _audit(name)
    j = judge(a)
    codes = {f.code: f for f in j.findings}
    unused = codes["UNUSED_MEMORY"]
    assert "--max-total-tokens 20,480" in unused.fields["advice"]
    assert "--mem-fraction-static" not in unused.fields["advice"]
    assert a.formula.verdict.value == "match" and "cap" in a.formula.verdict_reason
    assert "the cap bound" in codes["TOKENS_MATCH"].message
    # the fraction's own budget, before the cap, is said: far above 20,480
    assert "budget alone would allow a pool of up to" in codes["TOKENS_CAPPED"].message
    assert a.formula.predicted_tokens.low == a.formula.predicted_tokens.high == 20480


@pytest.mark.parametrize("name", ["sglang_c047", "sglang_c052"])
def test_an_nsa_fp8_pool_is_not_checked_against_its_kv_line_without_the_config(name):
    """GLM-5-FP8 on MI355X (0.5.9-era main): NSATokenToKVPool stores 656-byte FP8 rows (+ 132 B of indexer) per
    layer while get_cell_size_per_token divides the budget by 576 + 132. The KV line's 61,463 B per token is the
    pool's, not the budget's; judging the pool by it gave a 330,880-token TOKENS_MISMATCH that implied a fraction
    of 0.9748. Without the config the split is unknown: not checked, and said why."""
    a = _audit(name)
    codes = _codes(a)
    assert "TOKENS_MISMATCH" not in codes and "TOKENS_MATCH" not in codes
    assert a.formula.verdict.value == "unknown"
    assert "NSA" in a.formula.verdict_reason and "--model-config" in a.formula.verdict_reason
    assert a.formula.effective_mem_fraction_static is None
    assert "STARTUP_FAILED" in codes


def test_an_mla_pool_without_an_indexer_is_still_checked_from_its_kv_line():
    """The NSA rule is gated on the pool kind: Kimi-K2.5 (plain MLA, bf16) on the same machine and build is
    checked from its KV line and matches (2,454,421 tokens)."""
    a = _audit("sglang_c046")
    assert a.formula.verdict.value == "match" and a.formula.logged_tokens == 2454421


def test_scheduler_summaries_alone_bound_the_tp_size_by_their_rank_tags():
    """The SGLang k8s guide's leader log: eight 'TPn ... max_total_num_tokens=' lines and one graph line. The
    summaries' tags (TP0..TP7) bound the TP size at 8; only the ranks with memory lines were counted before (2)."""
    a = _audit("sglang_c050")
    assert a.model.attention_tp_size == 8 and a.model.attention_tp_size_at_least
    assert a.formula.verdict.value == "unknown" and not [f for f in a.findings if not f.ignored]


def test_the_aiter_scaling_is_in_the_advice_to_raise_the_fraction():
    """Grok 2.5 on MI355X, SGLang 0.5.6.post2, aiter at a 131,072 context: SGLang multiplies any
    --mem-fraction-static by 0.85 (server_args.py), so the effective 0.96 that would use the idle 68.59 GiB cannot
    be reached by passing 0.96 (it runs as 0.816), nor by any value. The advice says so instead."""
    a = _audit("sglang_c053")
    advice = {f.code: f for f in judge(a).findings}["UNUSED_MEMORY"].fields["advice"]
    assert "--mem-fraction-static 0.96 would use it" not in advice
    assert "0.85" in advice and "aiter" in advice and "no value reaches" in advice
