"""Field test of issue 33, second SGLang pass: unseen real logs (fixtures/corpus/sglang_c058..c067), each class of
wrong answer they exposed held to the truth read from SGLang's code at that release."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.parse.interface import Line
from kvaudit.parse.sglang import Failure, parse_line
from kvaudit.reconcile.interface import Audit, AuditOptions
from kvaudit.verdict import judge

CORPUS = Path(__file__).resolve().parent.parent.parent / "fixtures" / "corpus"


def _audits(name: str, every: bool = False) -> list[Audit]:
    with open(CORPUS / f"{name}.log", "rb") as fh:
        return audit(read_log(fh), AuditOptions(source=name), all_startups=every)


def _codes(a: Audit) -> dict:
    return {f.code: f for f in a.findings if not f.ignored}


@pytest.mark.parametrize("name, line", [("sglang_c058", 553), ("sglang_c056", 573)])
def test_a_scheduler_watchdog_timeout_is_the_failure_not_the_shutdowns_exceptions(name, line):
    """AMD's PD pair (v0.5.6.post2): the schedulers' watchdog fired during warmup (180 s), SGLang sent SIGQUIT; the
    warmup's read timeout and the HTTP server's CancelledError come minutes later and are its consequences."""
    (a,) = _audits(name)
    j = judge(a)
    failed = _codes(a)["STARTUP_FAILED"]
    assert j.headline.startswith("ERROR startup failed: Watchdog timeout") and "CancelledError" not in j.headline
    assert f"(line {line})" in failed.message and "180 s" in failed.message


def test_a_port_already_in_use_is_the_failure_not_the_warmups_connection_error():
    """sglang_c057: uvicorn could not bind port 30000 (a previous server held it); the warmup request's
    ConnectionError follows from it."""
    (a,) = _audits("sglang_c057")
    assert "address already in use" in judge(a).headline and "ConnectionError" not in judge(a).headline


def test_a_soft_watchdog_only_dumps_and_is_not_a_failure():
    """utils/watchdog.py (0.5.8+): with self.soft=True the watchdog logs and keeps the server running."""
    soft = parse_line(Line(1, "[2026-05-01 10:00:00 TP0] Scheduler watchdog timeout "
                              "(self.watchdog_timeout=300, self.soft=True)")).event
    hard = parse_line(Line(2, "[2026-05-01 10:00:00 TP0] Scheduler watchdog timeout "
                              "(self.watchdog_timeout=300, self.soft=False)")).event
    assert not isinstance(soft, Failure)
    assert isinstance(hard, Failure) and hard.kind == "watchdog" and hard.message.startswith("Scheduler watchdog")


def test_an_nsa_fp8_pool_on_rocm_tilelang_is_checked_from_its_kv_line():
    """sglang_c059, GLM-5.1 on MI355X (v0.5.12): calculate_mla_kv_cache_dim keeps the 576-byte row on HIP with the
    tilelang NSA backend (0.5.10+), so 182.18 GiB / 3,542,208 = 55,224 B = 78 x (576 + 132) is the budget's cell."""
    (a,) = _audits("sglang_c059")
    assert a.formula.verdict.value == "match" and a.formula.logged_tokens == 3542208
    assert any("tilelang backend keeps the 576-byte row" in n for n in a.notes)


@pytest.mark.parametrize("name", ["sglang_c047", "sglang_c052"])
def test_an_nsa_fp8_pool_storing_656_byte_rows_stays_unchecked(name):
    """0.5.8/0.5.9 on ROCm with the triton or default NSA backends store 656-byte rows: not the budget's cell."""
    a = _audits(name)[-1]
    assert a.formula.verdict.value == "unknown" and "656 B a layer" in a.formula.verdict_reason


def test_a_harness_summary_of_five_runs_is_five_startups_with_target_and_draft_pools():
    """sglang_c060: a v0.5.20 sweep log lists, per run, the target's and the MTP draft's KV lines (the same token
    count, SGLang's shared pool config) and the sorted pool ends; no weight lines, no prefixes."""
    runs = _audits("sglang_c060", every=True)
    assert [a.formula.logged_tokens for a in runs] == [11508608, 11508608, 11380928, 11253248, 11125504]
    last = runs[-1].ranks[0]
    assert last.kv_gib == pytest.approx(131.76)
    assert last.item("draft_kv_cache").gib == pytest.approx(11.98)


def test_every_rank_that_prints_counts_toward_the_tp_size():
    """sglang_c062: eight ranks (ATTN_CPn TPn) print only HiCache host lines: attention TP at least 8."""
    (a,) = _audits("sglang_c062")
    assert a.model.attention_tp_size == 8 and a.model.attention_tp_size_at_least
    assert "HICACHE_HOST_MEMORY" in _codes(a)


def test_the_drop_from_pool_end_to_the_summary_without_graphs_is_measured():
    """sglang_c066, graphs disabled: TP0's 42.35 -> 41.84 GB between 'Memory pool end' and the scheduler summary is
    the attention backend's and the scheduler's buffers, bracketed by two readings, not unexplained memory."""
    (a,) = _audits("sglang_c066")
    tp0 = a.ranks[0]
    assert tp0.item("after_pool").gib == pytest.approx(0.51)
    assert "UNEXPLAINED_MEMORY" not in _codes(a) and judge(a).status.value == "ok"


def test_a_release_range_spanning_the_aiter_rule_is_checked_under_each_rule_not_the_printed_one():
    """sglang_c068, AMD's v0.5.3 image: 0.4.9-0.5.4 scale the fraction by 0.85 after printing it, 0.5.5+ print it
    scaled; the lines alone date the log 0.5.3..0.5.8. Under the printed 0.85 the pool is 20% short, under 0.7225
    0.15%: the second rule is reported (and said), never their union."""
    (a,) = _audits("sglang_c068")
    assert a.formula.mem_fraction_static == pytest.approx(0.7225)
    assert a.formula.predicted_tokens.low == 3251019
    assert any("fits SGLang 0.4.9-0.5.4's aiter rule" in n for n in a.notes)


@pytest.mark.parametrize("name, need", [("sglang_c069", "0.34"), ("sglang_c068", "0.20")])
def test_fewer_tokens_than_one_ranks_readings_allow_is_not_judged(name, need):
    """Only TP0 prints its readings of eight ranks; SGLang sizes the pool from the minimum over all of them, which
    can only lower the budget: fewer tokens is not a mismatch, and the rank deficit that explains it is stated."""
    (a,) = _audits(name)
    assert a.formula.verdict.value == "unknown" and "TOKENS_MISMATCH" not in _codes(a)
    assert "readings of 1 of 8 ranks" in a.formula.verdict_reason and f"{need} GiB less" in a.formula.verdict_reason


def test_a_negative_fraction_in_the_engines_error_is_named_its_own_default():
    """sglang_c064 (v0.5.3, DP attention, no --mem-fraction-static): 'mem_fraction_static=-0.107' is server_args.py's
    default, (capacity - reserved) / capacity, with DP attention's reserve above the capacity: "increase" is not
    the remedy, an explicit fraction is."""
    (a,) = _audits("sglang_c064")
    f = _codes(a)["NOT_ENOUGH_MEMORY"]
    assert "SGLang's own default gone below zero" in f.message and "set --mem-fraction-static explicitly" in f.message


@pytest.mark.parametrize("text", [
    "[2025-03-09 00:57:20] Received sigquit from a child proces. It usually means the child failed.",  # sglang#3752
    "[2025-12-12 16:27:33] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",  # c058
])
def test_every_wording_of_the_child_failed_line_is_read(text):
    """engine.py's launcher handler (spelt 'proces' in early-2025 builds) and tokenizer_manager.py's handler once the
    server runs: both say a child process died."""
    ev = parse_line(Line(1, text)).event
    assert isinstance(ev, Failure) and ev.kind == "child_failed"
