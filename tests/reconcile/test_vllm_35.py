"""Issue 35: vLLM fidelity on real 2026 startups (fixtures/corpus vllm_c016..c022, entries in corpus.json):
sliding-window groups, one counting era per verdict, readings that are not sizes, lines and tags
that were not read."""

from __future__ import annotations

import io
import json

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.reconcile.vllm.cell import sliding_window_pool
from kvaudit.units import GIB
from kvaudit.verdict import judge
from tests.conftest import ROOT
from tests.corpus_run import CORPUS, audit_entry

ENTRIES = json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))["logs"]
CONFIGS = ROOT / "fixtures" / "configs"


def entry(name):
    return audit_entry(name, ENTRIES[name])


def codes(a):
    return {f.code: f for f in a.findings if not f.ignored}


def text_audit(text: str, **opts):
    return audit(read_log(io.BytesIO(text.encode())), AuditOptions(**opts))[-1]


# 1. sliding-window models -------------------------------------------------------------------------------------


def test_gemma4_sliding_window_groups_reproduce_the_logged_count():
    """vllm_c016 (0.22.1rc1, Gemma-4 31B fp8): 127,120 tokens exactly, not GEOMETRY_MISMATCH against its config."""
    a = entry("vllm_c016")
    assert a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason
    assert "GEOMETRY_MISMATCH" not in codes(a)
    p = a.formula.predicted_tokens
    assert p.low <= 127_120 <= p.high and p.high - p.low < 100
    assert "1,221 blocks per request" in a.formula.verdict_reason
    assert a.model.attention == "sliding-window"


def test_gemma4_layout_follows_the_release_code():
    """models/gemma4.py: full layers 4 KV heads x 512 (k_eq_v), so unify_kv_cache_spec_page_size doubles their
    block; groups of 10; SlidingWindowSpec.max_admission_blocks_per_request with the 2048 default."""
    geom = load_config(CONFIGS / "gemma-4-31b-it.json")
    pool = sliding_window_pool(geom, 1, 1.0, 16)
    assert pool is not None
    assert (pool.page_bytes, pool.full_block, pool.swa_block) == (131_072, 32, 16)
    assert (pool.group_size, pool.full_groups, pool.swa_groups, pool.padding_layers) == (10, 1, 5, 0)
    blocks = 18_947  # 23.13 GiB // 131,072 // 10 lies in 18,944..18,952
    assert pool.blocks(23.13 * GIB) in range(18_944, 18_953)
    assert pool.tokens_by_concurrency(blocks, 8192, 2048) == 127_120
    assert pool.tokens_by_concurrency(blocks, 8192, 8192) == 55_020  # the 70 GiB+ default would not give it
    assert pool.tokens_by_blocks(blocks) == 50_512  # nor the 0.20.0 count (// 6 groups x 16)


def test_a_sliding_window_model_not_modelled_is_never_a_mismatch():
    """A sliding-window config kvaudit has no vLLM layout for (here the Gemma-4 config renamed to another
    architecture) is UNKNOWN, 'not modelled here', never GEOMETRY_MISMATCH or TOKENS_MISMATCH."""
    raw = json.loads((CONFIGS / "gemma-4-31b-it.json").read_text(encoding="utf-8"))
    raw["architectures"] = ["MiMoV2FlashForCausalLM"]
    from kvaudit.model_config import geometry_from_dict

    geom = geometry_from_dict(raw, "renamed")
    log = (CORPUS / "vllm_c016.log").read_text(encoding="utf-8")
    a = text_audit(log, model_geometry=geom)
    assert a.formula.verdict == Verdict.UNKNOWN and "not modelled here" in a.formula.verdict_reason
    assert not {"GEOMETRY_MISMATCH", "TOKENS_MISMATCH"} & set(codes(a))


# 2. one era's rule per verdict ---------------------------------------------------------------------------------


def test_align_mode_holds_two_state_pages_and_one_era_is_checked():
    """vllm_c017: 'Mamba cache mode is set to align' -> 2 state pages per Mamba group: 3,274 blocks / 77 x 262,144
    = 11,146,226 exactly; the count is not a multiple of 3728, so the 0.20.0 rule is not united with it."""
    a = entry("vllm_c017")
    assert a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason
    p = a.formula.predicted_tokens
    assert p.low <= 11_146_226 <= p.high and p.high - p.low < 5_000
    assert not p.contains(11_598_100) and not p.contains(3_049_504)
    assert "align mode" in a.formula.verdict_reason
    assert any("not a multiple of the 3728-token block" in n for n in a.notes)


def test_a_prerelease_of_the_boundary_keeps_the_old_rule_possible():
    """vllm_c020 is 0.20.1.dev0 and counts blocks // groups x block (585,168 = 501 x 1168): a dev build of the
    boundary release is not taken for the release."""
    from kvaudit.explain import select
    from kvaudit.reconcile.vllm.context import build_context
    from kvaudit.reconcile.vllm.formula import count_eras

    s = select(read_log(io.BytesIO((CORPUS / "vllm_c020.log").read_bytes())), None)[-1]
    ctx = build_context(s, AuditOptions())
    old, new, _ = count_eras(ctx, 585_168, 1168)
    assert old and new


# 3. readings that are not sizes --------------------------------------------------------------------------------


def test_a_negative_graph_estimate_is_memory_released_not_a_size():
    """vllm_c020: 'Estimated CUDA graph memory: -0.07 GiB total' (GB10): no GRAPH_ESTIMATE_LOW ('1.32 GiB more
    than the -0.07 GiB estimate'), and the note says why."""
    a = entry("vllm_c020")
    assert not {"GRAPH_ESTIMATE_LOW", "GRAPH_ESTIMATE_HIGH"} & set(codes(a))
    assert any("-0.07 GiB is negative" in n and "released" in n for n in a.notes)
    graphs = [it for r in a.ranks for it in r.items if it.key == "graphs_target_decode"]
    assert graphs and graphs[0].gib == 1.25  # the whole capture, not 1.25 + 0.07


def test_a_total_recovered_from_the_note_carries_its_interval():
    """vllm_c016: 0.25 GiB / (0.72 - 0.7179) is 114.0..124.4 GiB, not '119.0'; the graph finding says 'at least'."""
    a = entry("vllm_c016")
    assert any("114.0..124.4 GiB" in n for n in a.notes)
    low = codes(a)["GRAPH_ESTIMATE_LOW"]
    assert "at least 31.91 GiB" in low.message and low.severity.name == "INFO"


def test_an_unknown_headroom_is_bounded_from_weights_and_kv_before_it_warns():
    """vllm_c017 states no total: (1 - 0.85) / 0.85 x (21.86 + 65.48 + 0.04) = 15.42 GiB of headroom at least, so
    the 1.72 GiB the capture took beyond its estimate is information, not a warning."""
    low = codes(entry("vllm_c017"))["GRAPH_ESTIMATE_LOW"]
    assert low.severity.name == "INFO" and "at least 15.42 GiB" in low.message


# 4. lines and tags not read ------------------------------------------------------------------------------------


def test_vllm_ascend_current_kv_memory_and_graph_terms_are_read():
    """vllm_c018: 'Current KV cache memory: 5.15 GiB.' is the budget; the graph estimate adds it up."""
    a = entry("vllm_c018")
    assert a.ranks[-1].kv_gib == 5.15
    assert "BUDGET_RECONCILES" in codes(a) and "BUDGET_MISMATCH" not in codes(a)
    assert codes(a)["KV_MEMORY_SUGGESTED"].fields["fit_bytes"] == 5_428_230_144


def test_a_negative_kv_cache_memory_suggestion_is_read_and_explained():
    """vllm_c019: `--kv-cache-memory=-1160530022` is the graph double count (vllm#57936)."""
    f = codes(entry("vllm_c019"))["KV_MEMORY_SUGGESTED"]
    assert f.fields["fit_bytes"] == -1_160_530_022 and f.fields["agrees"]
    assert "counted twice" in f.message


def test_a_worker_tag_on_any_line_names_a_rank():
    """vllm_c019: Worker_TP2 appears only on a TileLang line: TP at least 3, not 1."""
    a = entry("vllm_c019")
    assert a.model.attention_tp_size == 3 and a.model.attention_tp_size_at_least


def test_the_draft_named_inside_speculative_config_is_not_the_model():
    """vllm_c022: model='/models/drafter' inside SpeculativeConfig(...) is the DFlash draft."""
    a = entry("vllm_c022")
    assert a.model.architecture == "/models/target"
    assert a.speculative == "dflash (draft /models/drafter, 15 speculative tokens)"


def test_a_drafter_or_padding_the_config_does_not_explain_leaves_the_pool_unchecked():
    """vllm_c020: the DFlash drafter's layers join the groups ('Add 6 padding layers ... 60.00%'): the target's
    config alone would predict 3.2 M tokens; the count is not checked, never a mismatch."""
    a = entry("vllm_c020")
    assert a.formula.verdict == Verdict.UNKNOWN and "drafter" in a.formula.verdict_reason
    assert "TOKENS_MISMATCH" not in codes(a)


def test_an_engine_core_error_line_cut_short_is_a_failure():
    """vllm_c002's 'EngineCore failed to start.' line as an excerpt that ends mid-word."""
    lines = (CORPUS / "vllm_c002.log").read_text(encoding="utf-8").splitlines()
    cut = "\n".join(lines[:5] + [lines[5][:lines[5].index("EngineCore failed") + 14]])
    assert cut.endswith("EngineCore fai")
    a = text_audit(cut)
    assert "STARTUP_FAILED" in codes(a) and judge(a).status == "error"


# 6. whatif honesty ---------------------------------------------------------------------------------------------


def test_whatif_names_what_the_log_lacks_one_by_one():
    """vllm_c018 states the total, the utilisation and the KV memory: what it lacks is bytes per token."""
    from tests.conftest import cli

    d = cli("whatif", CORPUS / "vllm_c018.log", "--gpu-memory-utilization", "0.9", "-f", "json").json()["whatif"]
    assert d["risk"] == "unknown" and d["tokens_after"] is None
    said = " ".join(d["explanation"])
    assert "bytes per token" in said and "total" not in said and "utilization" not in said


def test_whatif_recounts_a_sliding_window_pool_and_carries_the_total_interval():
    """vllm_c016 at 0.8: the budget moves by 0.08 x (114.0..124.4 GiB), the pool is recounted by the 0.20.1+ rule
    (1,221 blocks per request), and the total's interval is said."""
    from tests.conftest import cli

    d = cli("whatif", CORPUS / "vllm_c016.log", "--model-config", CONFIGS / "gemma-4-31b-it.json",
            "--gpu-memory-utilization", "0.8", "-f", "json").json()["whatif"]
    geom = load_config(CONFIGS / "gemma-4-31b-it.json")
    pool = sliding_window_pool(geom, 1, 1.0, 16)
    assert pool is not None
    lo = pool.tokens_by_concurrency(pool.blocks((23.13 - 0.005 + 0.08 * 114.0) * GIB), 8192, 2048)
    assert d["tokens_after"]["low"] in range(lo - 200, lo + 200)
    assert d["tokens_after"]["high"] - d["tokens_after"]["low"] > 1_000  # the interval is not hidden
    assert any("114.0..124.4 GiB" in x for x in d["explanation"])


# 7. JSON honesty -----------------------------------------------------------------------------------------------


def test_the_default_block_size_is_not_labelled_as_read_from_the_log():
    """vllm_c016 states no block size: the JSON input says "default", of kind "assumed"."""
    from tests.conftest import cli

    d = cli("explain", CORPUS / "vllm_c016.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    page = next(i for i in a["inputs"] if i["name"] == "page_size")
    assert (page["value"], page["source"], page["kind"]) == (16, "default", "assumed")
    d = cli("explain", CORPUS / "vllm_c017.log", "-f", "json").json()  # the hybrid layout line states 3728
    a = d["audits"][0] if "audits" in d else d
    page = next(i for i in a["inputs"] if i["name"] == "page_size")
    assert (page["value"], page["kind"]) == (3728, "log")


# 5. unified memory ---------------------------------------------------------------------------------------------


def test_unified_memory_page_cache_charged_as_non_torch_is_said_with_the_pin():
    """No public GB10 startup with the per-term line was found (the threads quote only the result: a KV cache cut
    from 40+ GiB to 9.5 GiB, eugr/spark-vllm-docker#286); this is the 0.10.2-0.27 summary line's real shape
    (fixtures/vllm_classes/negative-available-0.25.log) with GB10 numbers of that size."""
    log = (
        "(APIServer pid=1) INFO 06-07 13:18:43 [utils.py:299] device_name=NVIDIA_GB10\n"
        "(EngineCore pid=42) INFO 06-07 13:19:25 [gpu_model_runner.py:4960] Model loading took 48.50 GiB memory "
        "and 10.401122 seconds\n"
        "(EngineCore pid=42) INFO 06-07 13:20:46 [gpu_worker.py:460] Available KV cache memory: 9.50 GiB\n"
        "(EngineCore pid=42) INFO 06-07 13:20:46 [gpu_worker.py:612] Free memory on device (110.0/121.69 GiB) on "
        "startup. Desired GPU memory utilization is (0.8, 97.35 GiB). Actual usage is 48.5 GiB for weight, 2.1 GiB "
        "for peak activation, 37.25 GiB for non-torch memory, and 1.69 GiB for CUDAGraph memory. Current kv cache "
        "memory in use is 9.5 GiB.\n")
    a = text_audit(log)
    f = codes(a)["NON_TORCH_HIGH"]
    assert "unified memory" in f.message and "page cache" in f.message
    assert f.fields["kv_cache_memory_bytes"] == int((9.5 + 37.25 - 2.0) * 2**30)
    plain = text_audit(log.replace("device_name=NVIDIA_GB10", "device_name=NVIDIA_H100"))
    assert "page cache" not in codes(plain)["NON_TORCH_HIGH"].message


def test_the_padding_warning_is_said_where_it_explains_a_small_pool():
    """vllm_c020: 'Add 6 padding layers, may waste at most 60.00% KV cache memory' is named in the notes."""
    a = entry("vllm_c020")
    assert any("6 padding layers, up to 60.00%" in n for n in a.notes)


def test_debug_memory_lines_give_the_total_and_the_budget():
    """vllm_c028 (a 0.2x build at DEBUG): 'total_memory=119.63GiB' and 'Requested memory: 0.850000 (util),
    101.69 GiB' give the card's total, so the budget reconciles: 101.69 - (51.54 + 1.72 + 0.09 + 3.73) = 44.61."""
    a = entry("vllm_c028")
    assert a.formula.pre_load_free_gib == 119.63
    assert "BUDGET_RECONCILES" in codes(a) and a.formula.verdict == Verdict.MATCH


def test_prefix_caching_off_means_one_state_page():
    """vllm_c031: enable_prefix_caching=False, so mamba_cache_mode stays 'none' (1 state page): 8,388,608."""
    a = entry("vllm_c031")
    assert a.formula.verdict == Verdict.MATCH and "(none mode)" in a.formula.verdict_reason
    assert not any("not stated" in n for n in a.notes)


def test_gemma4_bf16_and_nvfp4_follow_the_same_layout():
    """vllm_c023 (bf16, 61,711) and vllm_c024 (nvfp4, 221,754): the page scales with the element, the groups do
    not."""
    for name, tokens in (("vllm_c023", 61_711), ("vllm_c024", 221_754)):
        a = entry(name)
        assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == tokens


def test_the_0_20_0_count_is_modelled_per_release():
    """vLLM 0.20.0 counts num_blocks // len(groups) x min block: Gemma-4 26B-A4B (fixtures/configs
    gemma-4-26b-a4b-it.json) gives 192,368 (vllm_c033) and 177,440 (fixtures/samples vllm_206) exactly, with the
    same layout that 0.22 counts by concurrency."""
    geom = load_config(CONFIGS / "gemma-4-26b-a4b-it.json")
    a = entry("vllm_c033")
    assert a.formula.verdict == Verdict.MATCH and "to 0.20.0" in a.formula.verdict_reason
    assert "CONCURRENCY_MISMATCH" not in codes(a)
    b = audit(read_log(io.BytesIO((ROOT / "fixtures" / "samples" / "vllm_206.log").read_bytes())),
              AuditOptions(model_geometry=geom))[-1]
    assert b.formula.verdict == Verdict.MATCH and b.formula.logged_tokens == 177_440
    assert "to 0.20.0" in b.formula.verdict_reason


# StartupPlan (v1/worker/startup_plan.py, VLLM_ENABLE_STARTUP_PLAN=1) --------------------------------------------
# No public log with these lines was found: each is written from the 0.26.0 wheel's format string, with numbers
# that agree with the real log it is put into (vllm_c002, 0.26: 'reserved 49.0 GiB memory for KV Cache as specified
# by kv_cache_memory_bytes config'; vllm_c012: a profiled start). The saved path is one a public run printed.

PLAN_APPLIED = ("(EngineCore pid=83) INFO 07-26 12:29:34 [startup_plan.py:153] Applying persisted startup plan "
                "(fingerprint faaa0e6a718763db): kv_cache_memory_bytes=52613349376 (49.00 GiB), recorded free-memory "
                "baseline 93.50 GiB, current 93.88 GiB. Memory profiling will be skipped.")
PLAN_NOT_APPLIED = ("(Worker_TP0 pid=223) INFO 08-22 04:42:01 [startup_plan.py:123] Startup plan not applied: current "
                    "free memory (30.27 GiB) is below the recorded baseline (30.61 GiB); falling back to full memory "
                    "profiling.")
PLAN_SAVED = ("(Worker_TP0 pid=223) INFO 08-22 04:42:13 [startup_plan.py:189] Saved startup plan to "
              "/cache/vllm/startup_plan/startup_plan_faaa0e6a718763db.json")


def _insert(name: str, after: str, line: str) -> str:
    lines = (CORPUS / f"{name}.log").read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, x in enumerate(lines) if after in x)
    return "".join(lines[:at] + [line + "\n"] + lines[at:])


def test_an_applied_startup_plan_is_named_not_the_flag():
    """An applied plan sets kv_cache_memory_bytes from a file; the next line says 'as specified by
    kv_cache_memory_bytes config', but no flag was passed: the report names the plan and its baseline."""
    a = text_audit(_insert("vllm_c002", "as specified by kv_cache_memory_bytes", PLAN_APPLIED))
    notes = " ".join(a.notes)
    assert "a persisted startup plan (VLLM_ENABLE_STARTUP_PLAN=1, line 5), not --kv-cache-memory-bytes" in notes
    assert "recorded with 93.50 GiB free; 93.88 GiB free at this start" in notes
    assert "fixed the KV cache at 49.0 GiB" in notes
    assert not any(n.startswith("--kv-cache-memory-bytes fixed") for n in a.notes)


def test_a_plan_not_applied_says_what_the_free_memory_lacked_and_a_saved_one_is_said():
    text = _insert("vllm_c012", "Free memory on device (30.27/31.4 GiB)", PLAN_NOT_APPLIED)
    text = _insert_text(text, "Free memory on device (30.5/31.4 GiB)", PLAN_SAVED)
    a = text_audit(text)
    notes = " ".join(a.notes)
    assert "was not applied (line 2): 30.27 GiB was free at the start, 0.34 GiB less than the 30.61 GiB" in notes
    assert "saved as a startup plan (line 5)" in notes
    assert not any(line == 2 for line, _ in a.uninterpreted)  # a memory line, read


def _insert_text(text: str, after: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    at = next(i for i, x in enumerate(lines) if after in x)
    return "".join(lines[:at] + [line + "\n"] + lines[at:])


# 5. unified memory ------------------------------------------------------------------------------------------------


def test_a_gb10_startup_is_recognised_checked_and_never_told_to_raise_the_fraction():
    """vllm_c042 (0.20.0, Gemma-4 26B-A4B bf16 on DGX Spark; entry in new-vllm.json): the fused-MoE config path
    names NVIDIA_GB10, so the platform is unified memory; the sliding-window count is modelled for 0.20.0 and
    matches (177,440); vLLM's own 'increase --gpu-memory-utilization to 0.8141' note is not repeated as advice,
    and no finding or note tells the operator to raise the fraction (on GB10 that memory is the host's)."""
    import re

    geom = load_config(CONFIGS / "gemma-4-26b-a4b-it.json")
    a = audit(read_log(io.BytesIO((CORPUS / "vllm_c042.log").read_bytes())), AuditOptions(model_geometry=geom))[-1]
    assert a.platform is not None and "GB10" in str(a.platform)
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 177_440
    raise_it = re.compile(r"(rais|increas|higher|more).{0,60}(gpu[-_ ]memory[-_ ]utilization|fraction)", re.I)
    said = [f.message for f in a.findings] + list(a.notes) + [judge(a).headline]
    assert not [s for s in said if raise_it.search(s)], said
    assert any("unified memory" in n for n in a.notes)


def test_on_unified_memory_a_failure_is_not_told_to_raise_the_fraction():
    """vllm_c015 (0.6.4: max seq len 29,000 > 23,648 tokens) audited as on a GB10 (the platform as `check` reads it
    from the host): '--max-model-len 23,648 fits' stays, 'or gpu_memory_utilization 0.9278 (+0.65 GiB)' does not,
    and the finding says why; on a discrete card the fraction is still offered."""
    from kvaudit.platforms import Platform

    def nem(opts):
        a = audit(read_log(io.BytesIO((CORPUS / "vllm_c015.log").read_bytes())), opts)[-1]
        return next(f for f in a.findings if f.code == "NOT_ENOUGH_MEMORY")

    card = nem(AuditOptions())
    assert "or gpu_memory_utilization 0.9278 (+0.65 GiB)" in card.message  # 0.92774.. rounded up: 0.9277 falls short
    spark = nem(AuditOptions(platform=Platform("DGX Spark (NVIDIA GB10)", True)))
    assert "--max-model-len 23,648 fits" in spark.message
    assert "0.9278" not in spark.message and "utilization_that_fits" not in spark.fields
    assert "not a higher gpu_memory_utilization: on unified memory that memory is the host's" in spark.message
