"""Issue 35, TensorRT-LLM: whatif's "now" is the pool explain shows, and a cap the log does not show still holds
(fixtures/samples trtllm_004: 'Allocated 29.95 GiB for max tokens in paged KV cache (1121536)' under a 67.38 GiB
budget); an encoder-decoder startup is not rerun (corpus trtllm_c009)."""

from __future__ import annotations

from tests.conftest import ROOT, cli

SAMPLES = ROOT / "fixtures" / "samples"
CORPUS = ROOT / "fixtures" / "corpus"


def test_whatif_now_is_the_pool_and_the_unseen_cap_still_holds():
    d = cli("whatif", SAMPLES / "trtllm_004.log", "--free-gpu-memory-fraction", "0.5", "-f", "json").json()["whatif"]
    assert d["kv_gib_before"] == 29.95  # explain's pool, not the 67.38 GiB budget
    assert d["tokens_after"]["low"] == d["tokens_after"]["high"] == 1_121_536  # fewer GiB, never more tokens
    assert d["kv_gib_after"] <= 37.44 and "cap" in " ".join(d["explanation"])


def test_whatif_more_fraction_never_lowers_a_capped_pool():
    d = cli("whatif", SAMPLES / "trtllm_004.log", "--free-gpu-memory-fraction", "0.95", "-f", "json").json()["whatif"]
    assert d["tokens_after"]["low"] == 1_121_536


def test_whatif_does_not_rerun_an_encoder_decoder_split():
    d = cli("whatif", CORPUS / "trtllm_c009.log", "--free-gpu-memory-fraction", "0.5", "-f", "json").json()["whatif"]
    assert d["risk"] == "unknown" and d["tokens_after"] is None
    assert "crossKvCacheFraction" in " ".join(d["explanation"])


def test_a_pool_never_sized_in_gib_records_no_gib():
    """trtllm_103 ('Using 10718 tokens in paged KV cache.'): logged.kv_pool_gib is absent, not 0.0."""
    d = cli("explain", SAMPLES / "trtllm_103.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    logged = a["ranks"][0]["logged"]
    assert logged["kv_pool_tokens"] == 10718 and "kv_pool_gib" not in logged


def _startup(path):
    from kvaudit.explain import read_log

    with open(path, "rb") as fh:
        return read_log(fh).startups[-1]


def test_window_lines_are_read_and_the_cut_is_the_whole_pool():
    """trtllm_c013 (1.1.0rc3, gpt-oss-120b on GB10): the 'Attention window size ... exceeds upper bound',
    'Adjusted max_attention_window_vec', 'Adjusted window size ... in blocks_per_window' and 'Adjusted max_seq_len'
    lines carried none of the grammar's anchors and were never read. The cut is get_max_atten_window_upper_bound:
    2,710 blocks x 32 = 86,720, the whole pool, and max_seq_len follows it."""
    from kvaudit.parse.trtllm import Reading, WindowNote, WindowVector

    st = _startup(CORPUS / "trtllm_c013.log")
    read = {e.line for e in st.events}
    assert {73, 74, 75, 76, 106, 107, 108, 109} <= read
    assert [(w.window, w.bound) for w in st.of(WindowNote)][-2:] == [(131072, 86720), (131072, 86720)]
    assert st.of(WindowVector)[-1].windows == (86720,)
    assert [e.value for e in st.of(Reading) if e.key == "max_seq_len_adjusted"] == [8224, 86720]
    d = cli("explain", CORPUS / "trtllm_c013.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    notes = " ".join(a["notes"])
    assert "cut to 86,720 tokens" in notes and "the whole pool (2,710 blocks x 32)" in notes
    assert "max_seq_len became 86,720" in notes
    assert a["formula"]["verdict"] == "match"  # one window: the pool is still checked


def test_several_windows_are_vswa_and_not_checked():
    """A window vector with two distinct windows (resource_manager.py's format string; no real VSWA log of the
    PyTorch backend was found) is variable sliding-window attention: its per-window split is not modelled, so the
    count is neither matched nor mismatched, and the report says why."""
    text = (CORPUS / "trtllm_c013.log").read_text(encoding="utf-8").replace(
        "Adjusted max_attention_window_vec to [86720]", "Adjusted max_attention_window_vec to [128, 86720]")
    import io

    from kvaudit.explain import audit, read_log
    from kvaudit.reconcile.interface import AuditOptions

    a = audit(read_log(io.BytesIO(text.encode())), AuditOptions())[-1]
    assert a.formula.verdict.value == "unknown"
    assert "variable sliding-window" in a.formula.verdict_reason
    assert not {"TOKENS_MATCH", "TOKENS_MISMATCH"} & {f.code for f in a.findings}
    note = next(n for n in a.notes if n.startswith("variable sliding-window"))
    assert "window 128: its pool not printed" in note and "not modelled" in note
    # rule 7: the support table marks VSWA not modelled, so no model judgement rests on the pool
    assert a.pool_kinds == ("dense", "swa") and a.coverage is not None and a.coverage.level == "not"


def test_a_pool_below_an_assumed_fraction_names_a_lower_fraction_too():
    """trtllm_c015 (0.17 engine): 29.95 GiB of 74.87 available is 0.40 of it; the log states no fraction, so a lower
    fraction is as likely as a cap the log does not show, and the report says both."""
    d = cli("explain", CORPUS / "trtllm_c015.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    why = a["formula"]["verdict_reason"]
    assert "a fraction of about 0.40 instead of the assumed 0.9" in why and "or a cap" in why


def test_a_failing_rank_tag_counts_for_the_tp_size():
    """trtllm_c019 (1.0rc, Qwen3-235B at TP8): the only tagged line is rank 1's error; TP is at least 2, not an
    assumed 1."""
    d = cli("explain", CORPUS / "trtllm_c019.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    assert any("TP size at least 2" in n for n in a["notes"])


def test_the_oom_tables_component_rows_are_read():
    """trtllm_c019: the rows under 'Previously created components and free GPU memory before/after creation (GiB):'
    carry no unit of their own and were neither read nor listed; what each component took is now in the finding."""
    d = cli("explain", CORPUS / "trtllm_c019.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    nem = next(f for f in a["findings"] if f["code"] == "NOT_ENOUGH_MEMORY")
    assert "before it: Model 28.85 GiB, Sampler 0.00 GiB, Initial KV cache 0.37 GiB, Drafter 0.00 GiB" in nem["message"]


def test_the_torch_memory_cap_line_is_read():
    """trtllm_c013: 'Setting PyTorch memory fraction to 0.5983721838660735 (71.62367630004883 GiB)' was listed as not
    interpreted; py_executor_creator.py _adjust_torch_mem_fraction caps torch at free + reserved - 32 MiB, and the
    two numbers give the device total (71.62 / 0.5984 = 119.70, the peak line's total)."""
    d = cli("explain", CORPUS / "trtllm_c013.log", "-f", "json").json()
    a = d["audits"][0] if "audits" in d else d
    assert not any("Setting PyTorch memory fraction" in u["text"] for u in a.get("uninterpreted_lines") or [])
    assert any("capped at 71.62 GiB (0.5984 of 119.70 GiB" in n for n in a["notes"])
