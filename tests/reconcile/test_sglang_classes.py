"""Issue #8's classes of SGLang logs, one test each, on fixtures written from the reference's line formats
(fixtures/sglang_classes/) and on the public samples named in the issue (fixtures/samples/)."""

from __future__ import annotations

import math

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.reconcile.sglang.cell import cell_size, pad_rows, stage_layers
from kvaudit.versions import VersionRange
from tests.conftest import CONFIGS, ROOT as REPO, cli

CLASSES = REPO / "fixtures" / "sglang_classes"
SAMPLES = REPO / "fixtures" / "samples"
GIB = 2**30


def run(path, **opts):
    with open(path, "rb") as fh:
        audits = audit(read_log(fh), AuditOptions(**opts), all_startups=True)
    return audits


def codes(a):
    return {f.code: f for f in a.findings}


# --- failures must never read as success -----------------------------------------------------------------


@pytest.mark.parametrize("name,detail", [
    ("warmup-error-after-summary", "Initialization failed"),
    ("killed-after-summary", "Killed"),
    ("cuda-error-after-summary", "no kernel image is available"),
    ("scheduler-exception-after-summary", "hit an exception"),
])
def test_failure_after_the_scheduler_summary_is_a_failed_startup(name, detail):
    (a,) = run(CLASSES / f"{name}.log")
    failed = codes(a)["STARTUP_FAILED"]
    assert failed.severity.value == "error" and failed.fields["after_summary"] is True
    assert detail in failed.fields["detail"]
    assert a.formula.logged_tokens == 442000  # the pool was sized before it failed


def test_failed_startup_exits_3():
    assert cli("explain", CLASSES / "killed-after-summary.log").code == 3


def test_no_kv_memory_names_the_smallest_fraction():
    (a,) = run(CLASSES / "no-kv-memory-0.5.14.log")
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    # 1 - post/T = 1 - 17.50/78.50 (the engine's own 'minimum viable' says 0.7771 from unrounded numbers)
    assert f.fields["minimum_mem_fraction_static"] == pytest.approx(1 - 17.50 / 78.50, abs=1e-4)
    assert f.fields["suggested"] == 0.787 and "above 0.778" in f.message  # 3 decimals, rounded up (ux audit item 20)
    assert "STARTUP_FAILED" in codes(a)


def test_negative_profiled_count_gives_the_effective_fraction():
    (a,) = run(CLASSES / "negative-profiled-0.5.10.log", model_geometry=load_config(CONFIGS / "llama31-8b.json"))
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    # -40960 tokens x 131072 B = -5 GiB of budget: 1 - (15 - (-5)) / 40 = 0.5, the fraction it ran with
    assert f.fields["profiled"] == -40960
    assert f.fields["effective_mem_fraction_static"] == pytest.approx(0.5, abs=2e-4)
    assert a.formula.effective_mem_fraction_static == f.fields["effective_mem_fraction_static"]
    assert f.fields["minimum_mem_fraction_static"] == pytest.approx(1 - 15 / 40, abs=1e-4)
    assert "-40,960" in f.message


# --- pools of today's models -----------------------------------------------------------------------------


def test_mamba_state_pool_is_its_own_item_and_counts_in_the_budget():
    (a,) = run(CLASSES / "mamba-hybrid-qwen3-next-0.5.9.log",
               model_geometry=load_config(REPO / "fixtures" / "configs" / "qwen3-next-80b-a3b.json"))
    # oracle: rest = 54 - 0.15 x 94 - 4.00 x 412/413 (the state pool's line sizes 413 slots, padding slot 0
    # included; the budget was charged for max_mamba_cache_size = 412) ; 12 full-attention layers x 2 heads x
    # (256+256) x 2 B
    cell = 2 * (256 + 256) * 12 * 2
    share = 412 / 413
    lo = math.floor(((54.00 - 0.005) - 0.15 * (94.00 + 0.005) - (4.00 * share + 0.01)) * GIB / cell)
    hi = math.floor(((54.00 + 0.005) - 0.15 * (94.00 - 0.005) - (4.00 * share - 0.01)) * GIB / cell)
    assert a.formula.bytes_per_token == cell
    assert a.formula.verdict == Verdict.MATCH
    assert (a.formula.predicted_tokens.low, a.formula.predicted_tokens.high) == (lo, hi)
    r = a.ranks[0]
    assert r.item("state_pool").gib == 4.00 and r.kv_gib == pytest.approx(35.90, abs=0.01)
    assert a.formula.state_pool_gib == pytest.approx(4.00 * share, abs=0.001)  # the budget's charge


def test_mamba_sample_fraction_includes_the_state():
    """sglang_013 (Qwen3.5 hybrid): the fraction solved from the startup includes the state pool as the budget was
    charged for it: 7.42 GiB x 82/83 (its 83rd slot is the padding slot), which gives 0.849, the round 0.85 within
    the rounding of the logged figures."""
    (a,) = run(SAMPLES / "sglang_013.log")
    assert a.formula.mem_fraction_static == pytest.approx(0.849, abs=0.002)
    r = a.ranks[0]
    assert r.kv_gib == 8.30 and r.item("state_pool").gib == pytest.approx(7.42)


def test_swa_pool_is_the_whole_pool_on_every_rank():
    (a,) = run(CLASSES / "swa-hybrid-named-0.5.17.log")
    tp0, tp1 = a.ranks
    assert tp0.item("kv_cache").gib == 26.37 and tp0.item("kv_cache_swa").gib == 21.10
    assert tp0.kv_gib == pytest.approx(47.47) and tp1.kv_gib == 47.47  # TP1 logged only the summary
    # bytes per full-attention token: the whole pool / (full size + padding)
    assert a.formula.bytes_per_token == pytest.approx(47.47 * GIB / 1_474_818, rel=1e-3)


def test_swa_sample_every_rank_holds_the_pool():
    (a,) = run(SAMPLES / "sglang_021.log")
    assert {r.kv_gib for r in a.ranks} == {77.63}
    assert a.formula.bytes_per_token == pytest.approx(77.63 * GIB / 1_496_959, rel=1e-3)


def test_padding_rows_by_era_and_page_size():
    assert pad_rows(VersionRange((0, 4, 0), (0, 4, 4)), 64) == (1, 1)
    assert pad_rows(VersionRange((0, 5, 9), (0, 5, 9)), 64) == (64, 64)
    assert pad_rows(VersionRange((0, 4, 4), (0, 5, 8)), 16) == (1, 16)  # straddles 0.4.5: both allowed
    assert pad_rows(VersionRange((0, 5, 0), None), None)[1] >= 64  # page size not stated


def test_no_geometry_mismatch_from_an_unstated_page_size():
    """DeepSeek-V3 with a page size of 64 and no server_args: 64 padding rows are within what the log allows."""
    cell = 70_272
    tokens = 100_032
    size = (tokens + 64) * cell / GIB
    log = (f"[2026-03-01 10:00:00 TP0] KV Cache is allocated. #tokens: {tokens}, KV size: {size:.2f} GB\n"
           "[2026-03-01 10:00:00 TP0] Memory pool end. avail mem=10.00 GB\n")
    (a,) = audit(read_log_bytes(log), AuditOptions(model_geometry=load_config(CONFIGS / "deepseek-v3.json")))
    assert "GEOMETRY_MISMATCH" not in codes(a)


def read_log_bytes(text: str):
    import io
    return read_log(io.BytesIO(text.encode()))


def test_dp_attention_from_tags():
    (a,) = run(CLASSES / "dp-attention-tags.log")
    assert a.model.attention_tp_size == 1  # DP2 TP2: tp_rank // attn_tp == dp_rank only for attn_tp = 1
    assert "DP attention" in a.model.attention_tp_size_source


def test_tp_from_partial_tags_is_a_lower_bound():
    (a,) = run(SAMPLES / "sglang_005.log")
    assert a.model.attention_tp_size_at_least is True


def test_pipeline_stages_split_as_sglang_does():
    assert stage_layers(61, 4) == [15, 15, 16, 15]  # the remainder goes to the stages before the last
    assert stage_layers(62, 4) == [15, 16, 16, 15]
    geom = load_config(CONFIGS / "deepseek-v3.json")
    era = VersionRange((0, 5, 9), (0, 5, 9))
    assert cell_size(geom, era, 1, 2, pp=4, stage=2).profile == 576 * 16 * 2
    assert cell_size(geom, era, 1, 2, pp=4, stage=0).profile == 576 * 15 * 2


def test_mla_without_a_kv_line_books_the_pool_stage():
    (a,) = run(CLASSES / "mla-no-kv-line-0.3.log")
    r = a.ranks[0]
    assert r.item("kv_cache").gib == pytest.approx(20.62 - 18.20) and r.item("kv_cache").source == "derived"
    assert r.unexplained_gib == pytest.approx(0, abs=0.02)


def test_probable_cap_from_the_engines_budget_line():
    (a,) = run(CLASSES / "probable-cap-available-memory-line.log",
               model_geometry=load_config(CONFIGS / "llama31-8b.json"))
    f = codes(a)["TOKENS_CAPPED"]
    assert f.fields["probable"] is True and "54.09" in f.message
    assert a.formula.mem_fraction_static_source != "inferred" and "MFS_INFERRED" not in codes(a)
    assert "RESERVE_EXPLAINS_FREE" not in codes(a) and "UNUSED_MEMORY" not in codes(a)


# --- startups, ranks and honesty -------------------------------------------------------------------------


def test_free_memory_rising_starts_a_new_startup():
    audits = run(CLASSES / "two-restarts-no-server-args.log")
    assert len(audits) == 2
    assert [a.formula.logged_tokens for a in audits] == [442000, 441900]


def test_cut_target_line_never_lets_the_draft_stand_in():
    (a,) = run(CLASSES / "cut-target-line-draft-only.log")
    r = a.ranks[0]
    assert a.formula.post_load_free_gib is None  # 6.31 is the draft's reading, not the target's
    assert r.item("draft_weights").gib == 1.49 and r.weights_gib is None


def test_prediction_shown_without_a_token_count():
    text = (CLASSES / "warmup-error-after-summary.log").read_text().split("[2026-09-01 08:00:20] KV Cache")[0]
    (a,) = audit(read_log_bytes(text), AuditOptions(model_geometry=load_config(CONFIGS / "llama31-8b.json")))
    assert a.formula.predicted_tokens is not None and a.formula.logged_tokens is None
    assert "the formula gives" in a.formula.verdict_reason and "does not say" in a.formula.verdict_reason


def test_abridged_token_count_stays_approximate():
    """sglang_026's abridged '#tokens: 273K' stands in a 'VA upper bound' line: post-capture sizing's address
    space, not the pool (issue 34, item 10), so it is said as an approximate bound, never as the pool's count."""
    (a,) = run(SAMPLES / "sglang_026.log")
    assert a.formula.logged_tokens is None and a.formula.verdict == Verdict.UNKNOWN
    assert "about 273,000 tokens" in a.formula.verdict_reason


def test_assumed_kv_dtype_says_so():
    a = run(CLASSES / "two-restarts-no-server-args.log")[-1]
    assert "assumed" in (a.model.kv_dtype or "")


def test_unexplained_memory_a_candidate_too_small_to_hold_it_is_not_offered():
    """Verdict rule 2: +0.68 GiB cannot be allocator rounding (at most 0.52 GiB without a config): a warning
    that says no modelled item can hold it, never "probably allocator rounding". (sglang_107 showed it before
    its 0.57 GiB between 'Memory pool end' and the scheduler summary became a measured item.)"""
    (a,) = run(REPO / "fixtures" / "corpus" / "sglang_c043.log")
    f = codes(a)["UNEXPLAINED_MEMORY"]
    assert f.fields["unexplained_gib"] == pytest.approx(0.678) and f.severity.value == "warning"
    assert f.fields["candidates"] == [] and "no modelled item can hold 0.68 GiB" in f.message
    assert f.fields["candidates_too_small"]["allocator rounding (needs --model-config)"] < 0.68
    assert "probably" not in f.message


def test_unexplained_memory_an_unsized_item_may_cover_is_info():
    """sglang_202 (a Ling hybrid on DGX Spark, an abridged excerpt): +0.89 GiB where the attention backend's
    buffers cannot be sized (no Memory pool end line): info, naming them."""
    (a,) = run(SAMPLES / "sglang_202.log")
    f = codes(a)["UNEXPLAINED_MEMORY"]
    assert f.fields["unexplained_gib"] > 0 and f.severity.value == "info"
    assert any("attention-backend" in c for c in f.fields["candidates"])


def test_rank_imbalance_after_equal_ranks_arose_during_loading():
    log = ("[2026-03-01 10:00:00 TP0] Load weight begin. avail mem=78.50 GB\n"
           "[2026-03-01 10:00:00 TP1] Load weight begin. avail mem=78.50 GB\n"
           "[2026-03-01 10:00:20 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=60.00 GB, mem usage=18.50 GB.\n"
           "[2026-03-01 10:00:20 TP1] Load weight end. type=X, dtype=torch.bfloat16, avail mem=62.00 GB, mem usage=16.50 GB.\n")
    (a,) = audit(read_log_bytes(log), AuditOptions())
    f = codes(a)["RANK_IMBALANCE"]
    assert "arose while the weights loaded" in f.message and "another process" not in f.message


def test_unused_memory_only_when_the_end_is_final():
    (a,) = run(SAMPLES / "sglang_021.log")  # stops at the first graph capture: 22 GiB not yet spent
    assert "UNUSED_MEMORY" not in codes(a)
