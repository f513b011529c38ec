"""Issue 18's classes (SGLang 0.5.10+ pools and platforms) on the real samples it names (fixtures/samples, copies
of the public logs described in fixtures/samples/INDEX.md), each held to what the release's code gives."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions, Verdict
from tests.conftest import CONFIGS, ROOT

SAMPLES = ROOT / "fixtures" / "samples"
CORPUS = ROOT / "fixtures" / "corpus"
GEMMA4 = CONFIGS / "gemma-4-31b-it.json"


def run(name_or_text, **opts):
    if isinstance(name_or_text, str) and "\n" in name_or_text:
        data = name_or_text.encode()
    else:
        data = (SAMPLES / name_or_text).read_bytes()
    return audit(read_log(io.BytesIO(data)), AuditOptions(**opts), all_startups=True)


def codes(a):
    return {f.code: f for f in a.findings if not f.ignored}


def test_a_capture_that_frees_memory_is_not_a_restart():
    """sglang_206: 'Capture cuda graph end ... mem usage=-5.29 GB' is the loader's garbage collected, not a new
    start: one startup, and it matches (10.00 - 0.1 x 22.91 = 7.71 GiB / 40,911 B)."""
    audits = run("sglang_206.log")
    assert len(audits) == 1
    (a,) = audits
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 202093
    r = a.ranks[0]
    freed = [i for i in r.items if i.key.startswith("freed_")]
    assert freed and freed[0].gib == pytest.approx(-5.29) and not any(
        i.key.startswith("graphs_") and (i.gib or 0) < 0 for i in r.items)


def test_a_hash_in_a_model_path_is_not_an_absurd_number():
    """sglang_216: the snapshot hash '...f751885ef69' holds '1e950'; server_args must still be read (mfs 0.85),
    and then the pool matches: 20.54 - 0.15 x 31.49 = 15.82 GiB."""
    (a,) = run("sglang_216.log")
    assert a.formula.mem_fraction_static == 0.85 and a.formula.mem_fraction_static_source == "server_args"
    assert a.formula.verdict == Verdict.MATCH
    assert not any("absurd" in n or "no engine prints" in n for n in a.notes)


def test_a_standalone_absurd_number_still_drops_its_line():
    log = ("[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=1e999 GB\n"
           "[2026-01-01 10:00:00 TP0] Load weight end. type=X, avail mem=60.00 GB, mem usage=10.00 GB.\n"
           "[2026-01-01 10:00:00 TP0] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB\n")
    (a,) = run(log)
    assert a.formula.pre_load_free_gib != float("inf") and any("no engine prints" in n for n in a.notes)


def test_mamba_request_table_follows_the_state_pool():
    """sglang_202 (Ling hybrid, 117 state slots, 262,144 context): the request table is at most
    117 // 3 + 1 = 40 rows x 262,148 x 4 B (0.04 GiB), not 4,096 rows (2.34 GiB); the ledger is then positive
    (the attention backend's buffers the excerpt does not itemise), never a negative warning."""
    (a,) = run("sglang_202.log")
    r = a.ranks[0]
    table = r.item("request_table")
    assert table is not None and table.gib == pytest.approx(40 * 262148 * 4 / 2**30, abs=0.002)
    assert "state pool" in table.label
    assert r.unexplained_gib is not None and r.unexplained_gib > 0
    f = codes(a)["UNEXPLAINED_MEMORY"]
    assert f.severity.value == "info"


def test_a_lowered_concurrency_is_a_finding():
    """--max-running-requests 64 on a hybrid whose 117 state slots allow 117 // 5 = 23 with the extra buffer."""
    text = (SAMPLES / "sglang_202.log").read_text().replace(
        "[2026-10-10 11:54:06] Load weight begin.",
        "[2026-10-10 11:54:05] server_args=ServerArgs(model_path='/m', mem_fraction_static=0.8, "
        "max_running_requests=64, mamba_radix_cache_strategy='extra_buffer', page_size=64)\n"
        "[2026-10-10 11:54:06] Load weight begin.")
    (a,) = run(text)
    f = codes(a)["CONCURRENCY_LOWERED"]
    assert f.fields["requested"] == 64 and f.fields["applied"] == 23 and "117 slots // ratio 5" in f.message


def test_the_engines_own_reduced_warning_is_a_finding():
    # printed while the scheduler starts, before the server serves ("fired up": lines after it are a request's)
    text = (SAMPLES / "sglang_202.log").read_text().replace("[2026-10-10 11:59:52] INFO:     Uvicorn", (
        "[2026-10-10 11:59:50] max_running_requests was reduced from the requested 128 to 39 (per dp worker) due "
        "to the available KV cache capacity.\n[2026-10-10 11:59:52] INFO:     Uvicorn"))
    (a,) = run(text)
    f = codes(a)["CONCURRENCY_LOWERED"]
    assert (f.fields["requested"], f.fields["applied"]) == (128, 39)


def test_a_draft_loaded_before_the_target_pool_has_only_its_own_lines():
    """sglang_219 begins at the MTP draft's 'Load weight end' (0.5.14+ loads it before sizing the pool): the
    draft is its own KV (0.65 + 0.65) and the drop from the target's pool end to its own (18.17 -> 16.75), never
    the target's pool stage (47.58 -> 18.17)."""
    (a,) = run("sglang_219.log")
    r = a.ranks[0]
    draft = sum(i.gib or 0 for i in r.items if i.key.startswith("draft"))
    assert r.item("draft_kv_cache").gib == pytest.approx(1.30)
    assert r.item("draft_pool_overhead").gib == pytest.approx(18.17 - 16.75 - 1.30, abs=0.001)
    assert draft < 2.0


def test_a_logged_budget_reservation_is_an_item():
    """sglang_219: 'Reserving 0.10 GB of the KV budget for post-sizing multimodal allocations' is an item."""
    (a,) = run("sglang_219.log")
    item = a.ranks[0].item("budget_reserve")
    assert item is not None and item.gib == pytest.approx(0.10) and "multimodal" in item.label


def test_gemma4_sliding_window_cell_from_the_config():
    """sglang_216 with the Gemma-4 config: full 2 x (512 + 512) x 1 B x 10 + 0.8 x 8 x (256 + 256) x 1 B x 50 =
    184,320 B per full token (HybridSWAPoolConfigurator, 0.5.11), no GEOMETRY_MISMATCH, and a match."""
    geom = load_config(GEMMA4)
    assert geom.is_hybrid_swa and (geom.full_attention_layers, geom.sliding_window_layers) == (10, 50)
    (a,) = run("sglang_216.log", model_geometry=geom)
    assert a.formula.bytes_per_token == 184320 and a.formula.bytes_per_token_source == "config"
    assert "GEOMETRY_MISMATCH" not in codes(a) and a.formula.verdict == Verdict.MATCH


def test_gemma4_bf16_cell_and_an_honest_mismatch():
    """sglang_204 (0.5.12 + patches, ratio 0.1, bf16): 81,920 B per full token from the config; the pool is about
    0.07 GiB short of the formula: an honest mismatch whose direction is right (a *larger* reserve, never a
    smaller one). The multimodal runtime reservation is 0.5.18+ (mm_runtime_reservation_gb): not offered for a
    0.5.10-0.5.12 log."""
    (a,) = run("sglang_204.log", model_geometry=load_config(GEMMA4))
    assert a.formula.bytes_per_token == 81920 and "GEOMETRY_MISMATCH" not in codes(a)
    f = codes(a)["TOKENS_MISMATCH"]
    assert "larger reserve" in f.message and "smaller reserve" not in f.message
    assert "multimodal runtime reservation" not in f.message


def test_the_state_pools_padding_slot_is_not_charged_to_the_kv_budget():
    """MambaPool allocates max_mamba_cache_size + 1 slots (slot 0 pads) and logs their size; the budget was charged
    for max_mamba_cache_size slots only. corpus sglang_c008 (Qwen3.5-27B, 40 slots, 5.88 GiB logged): the KV
    budget is 12.26 - 5.88 x 40/41 = 6.52 GiB, not 6.38, so the prediction is above 425,000 tokens."""
    (a,) = run(CORPUS / "sglang_c008.log")
    assert a.formula.predicted_tokens.low >= 425_000
    assert a.ranks[0].item("state_pool").gib == pytest.approx(5.88)  # the ledger books what was allocated


def test_a_cuda_oom_after_the_pool_is_not_enough_memory_with_its_arithmetic():
    """torch's message states what was asked (384 MiB) and what was free (120 MiB): the reserve was 0.26 GiB short;
    0.9 - 0.26 / 78.50 = 0.897 would have left it. The headline quotes the exception, with what it asked for."""
    (a,) = audit(read_log(io.BytesIO((ROOT / "fixtures" / "sglang_classes" / "oom-graph-capture-0.5.log")
                                     .read_bytes())), AuditOptions())
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert f.fields["tried_gib"] == pytest.approx(0.375) and f.fields["free_gib"] == pytest.approx(120 / 1024, abs=1e-4)
    assert f.fields["shortfall_gib"] == pytest.approx(0.375 - 120 / 1024, abs=1e-4)
    assert f.fields["fitting_mem_fraction_static"] == pytest.approx(0.9 - (0.375 - 120 / 1024) / 78.50, abs=1e-4)
    from kvaudit.verdict import judge

    assert judge(a).headline == ("ERROR startup failed: Scheduler hit an exception: torch.OutOfMemoryError: CUDA out "
                                 "of memory. Tried to allocate 384.00 MiB (line 8)")


def test_a_unified_memory_platform_is_named_and_gets_no_fraction_advice():
    """sglang_219's FlashInfer cache path names sm121 (GB10, DGX Spark): the report names the platform and says
    what T is there; an UNUSED_MEMORY there advises no fraction of system memory."""
    (a,) = run("sglang_219.log")
    assert a.platform == "DGX Spark (NVIDIA GB10)" and any("unified memory" in n for n in a.notes)
    text = (SAMPLES / "sglang_210.log").read_text() + "[2026-02-09 10:00:00] device_name=NVIDIA_GB10\n"
    (b,) = run(text)
    f = codes(b)["UNUSED_MEMORY"]
    assert "--mem-fraction-static" not in f.message and "shares system memory" in f.message
    (c,) = run("sglang_210.log")
    assert "--mem-fraction-static 0.93" in codes(c)["UNUSED_MEMORY"].message and c.platform is None
