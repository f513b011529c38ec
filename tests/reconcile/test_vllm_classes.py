"""Issue #9's vLLM line shapes and classes, one test each, on fixtures written from the format strings in the
reference (fixtures/vllm_classes/) and on the public samples (fixtures/samples/). The expected numbers are worked
out here by hand from the formula, not read back from the code under test."""

from __future__ import annotations

import io
import math

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.parse.lines import Line
from kvaudit.parse.vllm import rank_of
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.versions import VersionRange, resolve
from tests.conftest import CONFIGS, ROOT, SAMPLES, cli

CLASSES = ROOT / "fixtures" / "vllm_classes"
GIB = 2**30
LLAMA3 = load_config(CONFIGS / "llama3-8b.json")
LLAMA31 = load_config(CONFIGS / "llama31-8b.json")


def run(path, geom=None, **opts):
    with open(path, "rb") as fh:
        (a,) = audit(read_log(fh), AuditOptions(model_geometry=geom, **opts))
    return a


def codes(a):
    return {f.code: f for f in a.findings}


def item(ledger, key):
    it = ledger.item(key)
    return it.gib if it else None


# --- 0.29+ "consumed" shape and the graph-estimate double count -------------------------------------------


def test_consumed_shape_counts_the_graph_estimate_once():
    """0.31, TP2: 71.27 - (8.10 consumed + 1.82 printed peak) = 61.35. The printed peak holds the 0.62 GiB
    estimate, so adding the estimate (or the 0.41 GiB captured) again would be 0.62 GiB short."""
    a = run(CLASSES / "consumed-0.31-tp2.log", LLAMA31)
    c = codes(a)
    assert "BUDGET_RECONCILES" in c and "BUDGET_MISMATCH" not in c
    assert c["BUDGET_RECONCILES"].fields["ranks"] == ["TP0", "TP1"]
    tp0 = next(r for r in a.ranks if r.label == "TP0")
    assert item(tp0, "activation_peak") == pytest.approx(1.82 - 0.62)  # the transient peak
    assert item(tp0, "graphs_target_estimate") == 0.62
    assert item(tp0, "non_torch") == pytest.approx(8.10 - 7.49)
    assert tp0.item("graphs_target_decode") is None  # the 0.41 GiB capture lives inside the estimate
    assert abs(tp0.unexplained_gib) <= tp0.unexplained_tolerance_gib
    # the pool is the smaller worker's: floor(61.33 GiB / 1 MiB) blocks x 16 (Llama-3.1-8B at TP2: 65,536 B/token)
    assert a.formula.rest_gib == 61.33 and a.formula.bytes_per_token == 65536
    assert a.formula.logged_tokens == math.floor(61.33 * 1024) * 16
    assert a.formula.verdict == Verdict.MATCH
    assert a.engine_version == "0.31.0" and a.model.attention_tp_size == 2
    assert not a.model.attention_tp_size_at_least


def test_graph_estimate_from_the_equivalence_note_names_the_unused_memory():
    """(0.90 - 0.86) x 79.19 = 3.1676 GiB reserved; 0.48 GiB captured; 2.6876 GiB never used =
    floor(2.6876 GiB / 2 MiB) blocks x 16 tokens."""
    a = run(CLASSES / "graph-estimate-high-0.33.log", LLAMA3)
    g = codes(a)["GRAPH_ESTIMATE_HIGH"]
    assert g.fields["estimate_gib"] == pytest.approx(0.04 * 79.19, abs=1e-4)
    assert g.fields["unused_gib"] == pytest.approx(0.04 * 79.19 - 0.48, abs=1e-3)
    assert g.fields["tokens_lost"] == int((0.04 * 79.19 - 0.48) * GIB / (131072 * 16)) * 16
    assert g.fields["estimate_source"] == "equivalence"
    assert "never used" in g.message and f"{g.fields['tokens_lost']:,} tokens" in g.message
    ledger = a.ranks[0]
    assert item(ledger, "activation_peak") == pytest.approx(4.83 - 0.04 * 79.19, abs=1e-3)
    assert abs(ledger.unexplained_gib) <= ledger.unexplained_tolerance_gib
    assert a.formula.verdict == Verdict.MATCH


def test_graph_pool_line_within_reason_is_not_a_finding():
    a = run(CLASSES / "consumed-0.31-tp2.log", LLAMA31)
    assert "GRAPH_ESTIMATE_HIGH" not in codes(a)  # 0.62 estimated vs 0.41 captured


# --- device word, host pool, process tags, externally held weights, auto-fit ------------------------------


def test_xpu_pool_line():
    a = run(CLASSES / "xpu-0.31.log", LLAMA3)
    assert a.formula.logged_tokens == 120000 and a.formula.verdict == Verdict.MATCH  # 7,500 blocks x 16
    assert any("XPU KV cache size" in e for e in a.version_evidence)
    assert a.formula.mem_fraction_static == 0.85 and a.formula.mem_fraction_static_source == "engine args"


def test_gpu_plus_host_count_is_not_checked_against_the_gpu_budget():
    a = run(CLASSES / "gpu-plus-host-0.33.log", LLAMA3)
    assert a.formula.verdict == Verdict.UNKNOWN and "host" in a.formula.verdict_reason
    assert "TOKENS_MISMATCH" not in codes(a)
    assert any("917,504" in n and "64.0 GiB on the host" in n for n in a.notes)


def test_mainprocess_tag_is_the_single_process():
    a = run(CLASSES / "mainprocess-0.31.log", LLAMA3)
    assert [r.label for r in a.ranks] == ["TP0"]
    assert a.model.attention_tp_size == 1 and a.model.attention_tp_size_source.startswith("engine args")
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == math.floor(53.05 * 512) * 16


def test_externally_held_weights():
    """0.32+: of 71.27 GiB, 14.96 held by a weight daemon; 56.31 - (0.55 + 1.40) = 54.36."""
    a = run(CLASSES / "external-weights-0.32.log", LLAMA3)
    c = codes(a)
    assert "BUDGET_RECONCILES" in c and "externally held weights 14.96" in c["BUDGET_RECONCILES"].message
    ledger = a.ranks[0]
    assert item(ledger, "weights_external") == 14.96
    assert abs(ledger.unexplained_gib) <= ledger.unexplained_tolerance_gib
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == math.floor(54.36 * 512) * 16


def test_auto_fit_note():
    a = run(CLASSES / "graph-estimate-high-0.33.log", LLAMA3)
    assert any(n.startswith("max_model_len auto-fit: 8,192 -> 8,192") for n in a.notes)


# --- V0 comma record, hardware plugins ----------------------------------------------------------------------


def test_v0_comma_separated_record():
    """191.98 x 0.98 - (86.79 + 6.07) = 95.28; Llama-3.1-70B bf16 KV 327,680 B/token: 19,513 blocks."""
    a = run(CLASSES / "v0-comma-record-mi300x.log", load_config(CONFIGS / "llama31-70b.json"))
    c = codes(a)
    assert "BUDGET_RECONCILES" in c and a.formula.mem_fraction_static == 0.98
    assert a.formula.logged_tokens == 19513 * 16 and a.formula.verdict == Verdict.MATCH
    assert a.engine_version == "0.6.4..0.6.5"
    ledger = a.ranks[0]
    assert item(ledger, "weights") == 67.6979 and item(ledger, "activation_peak") == pytest.approx(86.79 - 67.6979)
    assert abs(ledger.unexplained_gib) <= ledger.unexplained_tolerance_gib


def test_ascend_plugin_terms_go_into_the_ledger():
    """61.28 x 0.9 = 55.15 - (14.96 + 1.20 + 0.87) = 38.12: nothing unexplained, no graph term."""
    a = run(CLASSES / "ascend-plugin.log", LLAMA3)
    ledger = a.ranks[0]
    assert (item(ledger, "activation_peak"), item(ledger, "non_torch")) == (1.20, 0.87)
    assert abs(ledger.unexplained_gib) <= ledger.unexplained_tolerance_gib
    assert "BUDGET_RECONCILES" in codes(a)


# --- era ------------------------------------------------------------------------------------------------------


def test_a_plugin_v0_line_does_not_drag_the_era_back():
    a = run(CLASSES / "era-plugin-v0-line-in-v1-log.log", LLAMA3)
    assert a.engine_version == ">=0.12.0"
    assert any(e.startswith("ignored: 0.6.4") for e in a.version_evidence)


def test_resolve_prefers_the_banner_then_the_newest_clue():
    old = VersionRange((0, 6, 4), (0, 6, 4), ("old shape",))
    new = VersionRange((0, 9, 1), None, ("new shape",))
    banner = VersionRange((0, 10, 1), (0, 10, 1), ("version banner v0.10.1",))
    assert str(resolve([old, new], VersionRange((0, 2, 0), None))) == ">=0.9.1"
    r = resolve([old, new, banner], VersionRange((0, 2, 0), None))
    assert str(r) == "0.10.1" and "ignored: old shape (contradicts newer evidence)" in r.evidence


# --- TP, DP and per-rank budgets ------------------------------------------------------------------------------


@pytest.mark.parametrize("tag,label", [
    ("(Worker_TP3 pid=150)", "TP3"),
    ("(Worker_PP1_TP0 pid=151)", "PP1 TP0"),
    ("(Worker_DP1_TP0_EP1 pid=152)", "DP1 TP0"),
    ("(VllmWorker TP2 pid=153)", "TP2"),
    ("(VllmWorker rank=2 pid=154)", "TP2"),
    ("(MainProcess pid=4242)", ""),
    ("(EngineCore_DP0 pid=100)", ""),
    ("(Worker pid=99)", ""),
    ("(VllmWorkerProcess pid=6921)", "pid 6921"),
])
def test_process_tags(tag, label):
    assert rank_of(f"{tag} INFO 05-14 00:04:17 [gpu_worker.py:460] Available KV cache memory: 1.0 GiB").label == label


def test_tp_from_tags_is_at_least():
    a = run(SAMPLES / "vllm_020.log")
    assert a.model.attention_tp_size == 4 and a.model.attention_tp_size_at_least
    assert "TP3" in a.model.attention_tp_size_source
    assert "attention TP at least 4" in cli("explain", SAMPLES / "vllm_020.log").stdout


def test_v0_driver_plus_workers_is_at_least_four():
    """vllm_008: three VllmWorkerProcess pids and the driver's untagged lines (the server was TP4)."""
    a = run(SAMPLES / "vllm_008.log")
    assert a.model.attention_tp_size == 4 and a.model.attention_tp_size_at_least
    assert "driver" in a.model.attention_tp_size_source


def test_one_worker_of_four_is_an_upper_bound_not_a_mismatch():
    """TP4, only TP0's 15.72 GiB is in the excerpt: it holds up to 515,264 tokens; the pool's 498,064 means
    another worker had about 15.20 GiB. Consistent, not a mismatch."""
    a = run(CLASSES / "one-worker-of-four.log", LLAMA31)
    assert a.formula.verdict == Verdict.UNKNOWN
    assert "upper bound" in a.formula.verdict_reason and "1 of 4" in a.formula.verdict_reason
    assert "TP0" in a.formula.verdict_reason and "15.20 GiB" in a.formula.verdict_reason
    assert "TOKENS_MISMATCH" not in codes(a)


def test_one_worker_of_four_above_its_budget_is_a_mismatch():
    text = (CLASSES / "one-worker-of-four.log").read_text().replace("498,064", "516,000")
    (a,) = audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=LLAMA31))
    assert a.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes(a)


def test_tp_not_established_is_not_a_geometry_mismatch():
    """Only Worker_TP0 is tagged (TP at least 1); Llama-3.1-8B at TP1 would need 131,072 B/token, more than the
    pool holds. At TP2 the config fits: the TP size is not established, so this is not GEOMETRY_MISMATCH."""
    text = ("(Worker_TP0 pid=121) INFO 11-02 10:01:03 [gpu_worker.py:460] Available KV cache memory: 61.33 GiB\n"
            "(EngineCore pid=90) INFO 11-02 10:01:04 [kv_cache_utils.py:1733] GPU KV cache size: 1,004,816 tokens\n")
    (a,) = audit(read_log(io.BytesIO(text.encode())), AuditOptions(model_geometry=LLAMA31))
    assert "GEOMETRY_MISMATCH" not in codes(a)
    assert a.formula.verdict == Verdict.UNKNOWN and "TP 2" in a.formula.verdict_reason


# --- hybrid pools ---------------------------------------------------------------------------------------------


def _hybrid_blocks(K: float) -> int:
    """Qwen3-Next-80B at TP4: 1 KV head x 256 x 2 (K, V) x 2 B = 1,024 B per token per attention layer; block
    272 -> 278,528 B pages; 12 attention + 36 GDN layers -> 4 groups of 12; blocks = bytes // page // 12."""
    return int(K * GIB) // (272 * 1024) // 12


def test_hybrid_pool_to_0_20():
    a = run(CLASSES / "hybrid-qwen3-next-0.15-tp4.log", load_config(CONFIGS / "qwen3-next-80b-a3b.json"))
    assert a.formula.page_size == 272 and a.model.attention == "hybrid"
    assert a.formula.logged_tokens == _hybrid_blocks(60.0) // 4 * 272
    assert a.formula.verdict == Verdict.MATCH
    assert a.formula.bytes_per_token == 1024 * 12 * 4
    assert "CONCURRENCY_MISMATCH" not in codes(a)
    assert any("attention block size 272" in n and "1.49%" in n for n in a.notes)


def test_hybrid_pool_from_0_21_counts_concurrency():
    """0.21+: int(blocks / (cdiv(262,144, 272) + 3 Mamba groups x 1 page) x 262,144)."""
    a = run(CLASSES / "hybrid-qwen3-next-0.25-tp4.log", load_config(CONFIGS / "qwen3-next-80b-a3b.json"))
    assert a.formula.logged_tokens == int(_hybrid_blocks(60.0) / (math.ceil(262144 / 272) + 3) * 262144)
    assert a.formula.verdict == Verdict.MATCH


def test_hybrid_layout_without_config_says_what_is_missing():
    a = run(SAMPLES / "vllm_104.log")
    assert a.formula.page_size == 544
    assert any("attention block size 544" in n and "2.64%" in n for n in a.notes)
    assert a.model.attention_tp_size == 8 and a.model.attention_tp_size_at_least


# --- failures: what would have fit --------------------------------------------------------------------------


def test_kv_needed_names_the_length_and_the_utilisation_that_fit():
    a = run(CLASSES / "kv-needed-0.31.log", LLAMA3)
    c = codes(a)
    f = c["NOT_ENOUGH_MEMORY"]
    assert f.fields["max_model_len_that_fits"] == 174480
    # the shortfall 2.70 GiB may be 2.71 (both figures printed to 0.01): 0.9 + 2.71 / 47.41 = 0.95716, rounded up
    assert f.fields["utilization_that_fits"] == 0.9572
    assert "ValueError: To serve at least one request" in f.message and "for more details." in f.message
    assert c["STARTUP_FAILED"].severity.value == "error"
    assert cli("explain", CLASSES / "kv-needed-0.31.log").code == 3


def test_negative_budget_names_the_utilisation_that_fits():
    a = run(CLASSES / "negative-available-0.25.log", LLAMA3)
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert f.fields["minimum_utilization"] == 0.9228  # 0.9 + 0.535 / 23.56 = 0.92271 (-0.53 printed), rounded up
    assert "BUDGET_RECONCILES" in codes(a)  # 21.2 - 14.99 - 0.57 - 6.17 = -0.53


def test_free_memory_below_the_request_names_the_utilisation_that_fits():
    a = run(CLASSES / "free-memory-xpu.log")
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    # free < total x util fails: 10.195 / 23.905 = 0.42648 (both printed to 0.01), rounded down; 10.2 / 23.9 is
    # 0.42678, whose nearest 0.4268 x 23.9 = 10.2005 GiB is more than was free
    assert f.fields["utilization_that_fits"] == 0.4264
    assert f.message.split(": ", 1)[1].startswith("ValueError: Free memory on device xpu:0")


def test_kv_cache_memory_bytes_that_does_not_fit():
    a = run(CLASSES / "kv-cache-memory-bytes-oom-0.14.log", LLAMA3)
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert f.fields["kv_cache_memory_gib"] == 70.0 and f.fields["free_gib"] == 63.95
    assert "STARTUP_FAILED" in codes(a)


def test_an_error_is_quoted_once_whole():
    out = " ".join(cli("explain", CLASSES / "kv-needed-0.31.log").stdout.split())  # undo the wrapping
    assert out.count("Based on the available memory") == 1
    assert "for more details." in out


# --- honesty ----------------------------------------------------------------------------------------------------


def test_in_budget_terms_are_not_called_outside_the_budget():
    out = " ".join(cli("explain", SAMPLES / "vllm_004.log").stdout.split())
    short = out.split("In short", 1)[1]
    assert "outside the budget" not in short
    assert "activation peak, non-torch memory and headroom" in short


def test_assumed_kv_dtype_says_assumed():
    a = run(SAMPLES / "vllm_013.log")
    assert "assumed" in a.model.kv_dtype
    b = run(CLASSES / "mainprocess-0.31.log", LLAMA3)  # the banner says kv_cache_dtype=auto, dtype bf16
    assert "assumed" not in b.model.kv_dtype


def test_a_log_with_nothing_checked_is_not_a_clean_bill():
    out = " ".join(cli("explain", SAMPLES / "vllm_006.log").stdout.split())
    assert "Nothing looks wrong" not in out and "not a clean bill of health" in out


@pytest.mark.parametrize("name", ["vllm_104", "vllm_106", "vllm_107", "vllm_110"])
def test_recent_samples_say_what_is_missing(name):
    a = run(SAMPLES / f"{name}.log")
    assert a.formula.verdict == Verdict.UNKNOWN
    reason = a.formula.verdict_reason
    assert "lacks" in reason or "--model-config" in reason
    assert "TOKENS_MISMATCH" not in codes(a)


def test_parse_line_keeps_its_number():
    from kvaudit.parse.vllm import parse_line

    p = parse_line(Line(7, "(Worker_TP1 pid=2) INFO 01-01 00:00:00 [x.py:1] Available KV cache memory: 3.5 GiB"))
    (e,) = p.events
    assert e.line == 7 and e.rank.label == "TP1" and e.value == 3.5


def test_a_graph_estimate_below_the_capture_is_a_headroom_risk():
    """issue 19, item 3, the other way: the estimate (measured with a minimal KV cache) reserved 0.36 GiB and the
    capture took 0.46 (vllm#57475 crashed at capture at 0.98). The 0.10 GiB more comes out of the (1 - util)
    headroom, which this log does not size (no card total): a warning, with what fixes it. The estimate above
    the capture is the other finding, and the two never come together."""
    a = run(CLASSES / "graph-estimate-low-0.29.log", LLAMA3)
    found = codes(a)
    g = found["GRAPH_ESTIMATE_LOW"]
    assert g.fields["over_gib"] == pytest.approx(0.10, abs=1e-6) and g.severity.name == "WARNING"
    assert "--gpu-memory-utilization" in g.message and "GRAPH_ESTIMATE_HIGH" not in found
    assert "GRAPH_ESTIMATE_LOW" not in codes(run(CLASSES / "graph-estimate-high-0.33.log", LLAMA3))


def test_a_redacted_pid_still_names_the_rank():
    """A host-name redactor took the "pi" of "pid" for a host (noonghunna/club-3090#1339 posts such lines:
    ``(Worker_TP0 <HOST>d=111)``). The tags still name TP0 and TP1: two ranks with their own budgets, not one
    rank whose later line overwrites the earlier."""
    a = run(CLASSES / "redacted-pid-0.29.log", LLAMA3)
    assert [r.label for r in a.ranks] == ["TP0", "TP1"]
    assert [r.kv_gib for r in a.ranks] == [11.05, 11.02]
    assert a.model.attention_tp_size == 2


def test_the_fraction_that_fits_what_was_free_is_rounded_down():
    """vllm_c056 (0.9.2, kvcached issue 110): 67.24 of 79.25 GiB free; 67.24 / 79.25 = 0.84845, and the nearest
    0.8485 x 79.25 = 67.244 GiB is more than the 67.24 free (gpu_worker.py init_device raises when free < total x
    util): the advice is the largest fraction that surely fits, 67.235 / 79.255 rounded down."""
    a = run(ROOT / "fixtures" / "corpus" / "vllm_c056.log")
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert f.fields["utilization_that_fits"] == 0.8483
    assert 0.8483 * 79.255 <= 67.235
    assert "at most gpu_memory_utilization 0.8483 fits" in f.message


def test_a_max_seq_len_error_came_after_the_pool_was_counted():
    """vllm_c055 (V0 0.7.x, vllm#13061): worker.py initialize_cache raises 'max seq len (131072) is larger than the
    maximum number of tokens that can be stored in KV cache (81536)' with the block count already known (81,536 =
    5,096 blocks x 16): the report must not say the startup failed before the KV pool was sized."""
    a = run(ROOT / "fixtures" / "corpus" / "vllm_c055.log")
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert f.fields["max_model_len_that_fits"] == 81536 and f.fields["pool_sized"]
    assert "before the KV pool was sized" not in cli("explain", ROOT / "fixtures" / "corpus" / "vllm_c055.log").stdout


@pytest.mark.parametrize("name, said", [("vllm_c055", "81,536 tokens, line 1"), ("vllm_c054", "939 Mamba blocks, line 1")])
def test_an_error_that_names_the_pool_is_not_called_silent(name, said):
    """vllm_c055 (V0's max-seq-len check) and vllm_c054 (0.20+'s Mamba-blocks check) name the pool's size in the
    error: 'the log lacks the KV token or block count' was not true; the reason says where the figure stands."""
    a = run(ROOT / "fixtures" / "corpus" / f"{name}.log")
    assert f"only the error names the pool: {said}" in a.formula.verdict_reason


def test_the_default_block_size_is_noted_only_where_it_was_used():
    """vllm_c043 (0.10.1, a -2.14 GiB budget) and vllm_c049 (a pinned 4.25 GiB, failed before a pool line) size no
    pool: 'block size 16 is vLLM's CUDA default' claimed a use that did not happen. vllm_c042 (a budget and a
    logged pool, checked to the token) keeps it."""
    note = "block size 16 is vLLM's CUDA default"
    for name in ("vllm_c043", "vllm_c049"):
        assert not any(note in n for n in run(ROOT / "fixtures" / "corpus" / f"{name}.log").notes), name
    a = run(ROOT / "fixtures" / "corpus" / "vllm_c042.log", load_config(CONFIGS / "gemma-4-26b-a4b-it.json"))
    assert any(note in n for n in a.notes)
