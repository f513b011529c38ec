"""Issue 34's classes (SGLang 2026: unified memory, DeepSeek-V4 pools, printed versions, FP4 cells, Gemma configs,
bare exceptions, cut lines, true advice) on the real startups of fixtures/corpus (provenance in corpus.json), each
held to what the release's code gives."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.model_config import geometry_from_dict, load_config
from kvaudit.parse.lines import Line
from kvaudit.parse.sglang import WeightEnd, parse_line
from kvaudit.reconcile.interface import AuditOptions, Verdict
from kvaudit.verdict import judge
from tests.conftest import CONFIGS, ROOT

CORPUS = ROOT / "fixtures" / "corpus"
NVSMI_FALLBACK = "Failed to get GPU memory capacity from nvidia-smi"


def run(data: bytes, **opts):
    return audit(read_log(io.BytesIO(data)), AuditOptions(**opts), all_startups=True)


def corpus(name: str) -> bytes:
    return (CORPUS / f"{name}.log").read_bytes()


def without(data: bytes, *needles: str) -> bytes:
    """The same log with some of its lines dropped (never edited)."""
    return b"".join(line for line in data.splitlines(keepends=True)
                    if not any(n.encode() in line for n in needles))


def codes(a):
    return {f.code for f in a.findings if not f.ignored}


# --- item 3: DeepSeek-V4 pools -------------------------------------------------------------------------------


def test_a_deepseek_v4_excerpt_of_its_memory_lines_is_audited_not_refused():
    """sglang_c028 (sglang#24523): two engine lines and a cut third. rest = 17.94 - 138.17 x 0.1 = 4.12 (4.13
    printed, within the prints' rounding); int(4.13 GiB / 23,749.84 B) // 256 x 256 = 186,368."""
    (a,) = run(corpus("sglang_c028"))
    assert a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason
    assert a.formula.logged_tokens == 186368 and a.formula.predicted_tokens.contains(186368)
    assert a.formula.mem_fraction_static == 0.9 and a.formula.pre_load_free_gib == 138.17
    assert "rest_memory" in a.formula.verdict_reason


def test_the_deepseek_v4_division_can_fail():
    """The same two lines with another page's worth of tokens: the engine's own division does not give it."""
    text = corpus("sglang_c028").replace(b"full_token=186368", b"full_token=187392")
    (a,) = run(text)
    assert a.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes(a)


def test_a_deepseek_v4_budget_that_does_not_follow_from_the_readings_is_a_mismatch():
    text = corpus("sglang_c028").replace(b"available_bytes=4.13 GB, full_token=186368",
                                         b"available_bytes=5.13 GB, full_token=231936")
    (a,) = run(text)
    assert a.formula.verdict == Verdict.MISMATCH and "rest_memory" in a.formula.verdict_reason


def test_the_rocm_store_dtype_assertion_is_a_configuration_failure_after_a_correct_sizing():
    """sglang_c029 (sglang#25118): the pool's sizing is right to the page (529,408 = 2,068 x 256; c4 = // 4,
    c128 = // 128), then DeepSeekV4SingleKVPool asserts a uint8 store that float8_e4m3fnuz is not."""
    (a,) = run(corpus("sglang_c029"))
    j = judge(a)
    assert j.status == "error" and "configuration failure, not memory" in j.headline
    assert "ends before" not in j.headline and "AssertionError" in j.headline
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 529408
    assert "NOT_ENOUGH_MEMORY" not in codes(a)
    assert any("c4 132,352 = full // 4" in n and "c128 4,136" in n for n in a.notes)


def test_a_deepseek_v4_pool_line_alone_asks_for_the_engines_line_not_a_config():
    """sglang_c031 (sglang#32830): no budget, no division: unchecked, and the advice is what would help."""
    (a,) = run(corpus("sglang_c031"))
    reason = a.formula.verdict_reason
    assert a.formula.verdict == Verdict.UNKNOWN
    assert "DSv4 memory calculation" in reason and "--model-config" not in reason
    assert "GEOMETRY_MISMATCH" not in codes(a) and "TOKENS_MISMATCH" not in codes(a)


# --- item 4: an exception line without a message -------------------------------------------------------------


def test_a_bare_exception_line_is_the_exception():
    (a,) = run(corpus("sglang_c029"))
    failed = next(f for f in a.findings if f.code == "STARTUP_FAILED")
    assert failed.fields["line"] == 57


# --- item 6: the version the log prints wins -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["sglang_c026", "sglang_c027", "sglang_c030"])
def test_the_printed_version_wins_over_line_shapes(name):
    (a,) = run(corpus(name))
    assert a.engine_version == "0.5.11"
    (b,) = run(without(corpus(name), "SGLang Version"))
    assert b.engine_version != "0.5.11"  # the shapes alone point later (0.5.13..0.5.18)


# --- items 1 and 2: unified memory -----------------------------------------------------------------------------


@pytest.mark.parametrize("name,config,logged", [("sglang_c030", "qwen2-1.5b.json", 5519481),
                                                ("sglang_c027", "gemma-3-27b-it.json", 76384)])
def test_on_unified_memory_the_printed_T_is_widened_not_a_mismatch(name, config, logged):
    """GB10 startups: every pool is 0.03-0.06 GiB of budget below the formula from the printed numbers with the
    exact cell (SGLang's T is read before the printed 'Load weight begin'). The nvidia-smi fallback line names
    the platform; without it (a card) the same numbers are a mismatch."""
    geom = load_config(CONFIGS / config)
    (a,) = run(corpus(name), model_geometry=geom)
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == logged
    assert any("unified memory" in n for n in a.notes)
    (card,) = run(without(corpus(name), NVSMI_FALLBACK), model_geometry=geom)
    assert card.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes(card)


def test_the_unified_widening_still_fails_far_outside_it():
    """T 0.4 GiB below the sample's: the budget moves by 0.24 GiB, beyond the 0.16 x 0.6 GiB the platform allows."""
    text = corpus("sglang_c030").replace(b"Load weight begin. avail mem=111.92 GB", b"Load weight begin. avail mem=111.52 GB")
    (a,) = run(text, model_geometry=load_config(CONFIGS / "qwen2-1.5b.json"))
    assert a.formula.verdict == Verdict.MISMATCH


# --- item 9: config geometry -------------------------------------------------------------------------------------


def test_fp4_mha_cells_carry_their_scale_bytes():
    """Qwen2.5-1.5B at fp4_e2m1 (0.5.11 pool_configurator.py): 7,168 B of packed values + 896 B of scales."""
    (a,) = run(corpus("sglang_c030"), model_geometry=load_config(CONFIGS / "qwen2-1.5b.json"))
    assert a.formula.bytes_per_token == 8064 and a.formula.bytes_per_token_source == "config"
    assert "GEOMETRY_MISMATCH" not in codes(a)


def test_a_gemma3_text_config_takes_its_family_defaults():
    """A gemma-3-4b-style config leaves heads, head_dim and the pattern to transformers' Gemma3TextConfig."""
    g = geometry_from_dict({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                            "text_config": {"hidden_size": 2560, "model_type": "gemma3_text",
                                            "num_hidden_layers": 34, "sliding_window": 1024},
                            "vision_config": {}}, "gemma-3-4b")
    assert (g.num_kv_heads, g.head_dim, g.full_attention_layers, g.sliding_window_layers) == (4, 256, 5, 29)
    assert "sliding_window_pattern" in g.defaults_used and g.incomplete is None


def test_a_sliding_window_config_read_incompletely_gives_no_geometry_finding():
    """The Gemma-3 sample with a config stripped of its layer split: kvaudit cannot tell full from sliding layers,
    so it says the pools are not modelled instead of calling the model's geometry wrong."""
    import json

    raw = json.loads((CONFIGS / "gemma-3-27b-it.json").read_text())
    raw["model_type"] = "gemma3_custom"
    raw["text_config"].pop("sliding_window_pattern")
    raw["text_config"]["model_type"] = "gemma3_custom_text"
    g = geometry_from_dict(raw, "stripped")
    assert g.incomplete
    (a,) = run(corpus("sglang_c027"), model_geometry=g)
    assert "GEOMETRY_MISMATCH" not in codes(a)
    assert any("not modelled" in n for n in a.notes)


# --- item 7: a value from a cut line ---------------------------------------------------------------------------


def test_a_type_cut_by_the_end_of_an_excerpt_is_not_a_model_name():
    line = "[2026-06-08 04:18:16] Load weight end. elapsed=22.69 s, type=Q"
    assert parse_line(Line(1, line)).event is None
    whole = parse_line(Line(1, "[2026-06-08 04:18:16] Load weight end. elapsed=22.69 s, type=Qwen2ForCausalLM, "
                                "avail mem=108.66 GB, mem usage=3.26 GB.")).event
    assert isinstance(whole, WeightEnd) and whole.model_type == "Qwen2ForCausalLM"


def test_an_fp4_kv_line_without_its_scales_is_still_the_fp4_cell():
    """sglang_c032: this build's KV line counts the packed values only (3,584 B for K: get_kv_size_bytes up to
    0.5.14), the budget divides by values + scales (8,064 B). With the config: no geometry finding, a match; from
    the line alone, its x 9/8 reading is checked too (else an 11% false mismatch)."""
    data = corpus("sglang_c032")
    (a,) = run(data, model_geometry=load_config(CONFIGS / "qwen2-1.5b.json"))
    assert a.formula.verdict == Verdict.MATCH and a.formula.bytes_per_token == 8064
    assert "GEOMETRY_MISMATCH" not in codes(a) and any("without their scales" in n for n in a.notes)
    (b,) = run(data)
    assert b.formula.verdict == Verdict.MATCH and "x 9/8" in (b.formula.rule or "")


def test_a_small_pool_on_unified_memory_is_not_called_a_match():
    """sglang_c035: rest is 0.28 GiB; T's drift on unified memory spans half the pool: unknown, not a match."""
    (a,) = run(corpus("sglang_c035"), model_geometry=load_config(CONFIGS / "qwen2-1.5b.json"))
    assert a.formula.verdict == Verdict.UNKNOWN and "not checked" in a.formula.verdict_reason
    assert "TOKENS_MATCH" not in codes(a) and "TOKENS_MISMATCH" not in codes(a)


# --- item 8: advice about what is missing must be true --------------------------------------------------------


def test_a_startup_that_died_before_its_pool_is_not_asked_for_more_log():
    """sglang_c037: 'Not enough memory' before any pool: no scheduler summary will ever follow, and a config
    would not make a pool appear: the reason says the pool was never made."""
    (a,) = run(corpus("sglang_c037"))
    reason = a.formula.verdict_reason
    assert a.formula.verdict == Verdict.UNKNOWN and "failed before the KV pool was allocated" in reason
    assert "scheduler summary" not in reason and "--model-config" not in reason
    assert "NOT_ENOUGH_MEMORY" in codes(a) and "INCOMPLETE_LOG" not in codes(a)


def test_mixed_k_and_v_dtypes_are_not_a_geometry_mismatch():
    """sglang_c042: the fork's FP8 K / NVFP4 V cache logs K 7.40 GB and V 4.17 GB; the config gives one head
    size. kvaudit does not model mixed dtypes: no geometry finding, the lines' bytes per token, a match."""
    (a,) = run(corpus("sglang_c042"), model_geometry=load_config(CONFIGS / "gemma-3-27b-it.json"))
    assert "GEOMETRY_MISMATCH" not in codes(a) and any("different dtypes" in n for n in a.notes)
    assert a.formula.verdict == Verdict.MATCH


def test_memory_another_program_takes_on_unified_memory_is_still_a_mismatch():
    """sglang_c043: 7.7 GiB taken by another process while the weights loaded, 0.29 GiB of T beyond the
    platform's drift: the widening does not hide it."""
    (a,) = run(corpus("sglang_c043"), model_geometry=load_config(CONFIGS / "qwen2-1.5b.json"))
    assert a.formula.verdict == Verdict.MISMATCH and "TOKENS_MISMATCH" in codes(a)


def test_a_frozen_kv_mtp_draft_after_the_target_pool():
    """sglang_c041: the draft loads after the target's 'Memory pool end'; the target's pool matches the formula
    without any draft term, and the draft's weights are the draft's."""
    (a,) = run(corpus("sglang_c041"))
    assert a.speculative == "FROZEN_KV_MTP" and a.formula.verdict == Verdict.MATCH
    assert "draft" not in (a.formula.rule or "") or "no headroom" in (a.formula.rule or "")
    r = a.ranks[0]
    draft = [i for i in r.items if i.key.startswith("draft")]
    assert draft and abs(sum(i.gib or 0 for i in draft) - 0.17) < 0.02


# --- item 10: AMD aiter's x 0.85, read where the release applies it -----------------------------------------------

_AITER = """SGLang Version {version}
[2025-10-01 10:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static={mfs}, attention_backend='aiter', \
context_length=32768, page_size=1)
[2025-10-01 10:00:01 TP0] Load weight begin. avail mem=190.00 GB
[2025-10-01 10:00:02 TP0] Load weight end. type=M, dtype=torch.bfloat16, avail mem=150.00 GB, mem usage=40.00 GB.
[2025-10-01 10:00:03 TP0] KV Cache is allocated. #tokens: 730726, K size: 44.60 GB, V size: 44.60 GB
[2025-10-01 10:00:04 TP0] max_total_num_tokens=730726, chunked_prefill_size=8192, max_prefill_tokens=16384, \
max_running_requests=4096, context_len=32768, available_gpu_mem=50.00 GB
"""


@pytest.mark.parametrize("version,printed", [("0.5.4", "0.8"), ("0.5.11", "0.68")])
def test_aiters_reserve_is_applied_once_where_the_release_applies_it(version, printed):
    """No public aiter startup is in the corpus yet: the lines follow the releases' format strings. Up to 0.5.4
    ModelRunner scales the printed 0.8 to 0.68 (model_runner.py); from 0.5.5 ServerArgs prints 0.68 already
    (server_args.py _handle_attention_backend_compatibility). (150 - 0.32 x 190) GiB / 131,072 B = 730,726."""
    (a,) = run(_AITER.format(version=version, mfs=printed).encode())
    assert a.engine_version == version
    assert a.formula.verdict == Verdict.MATCH, a.formula.verdict_reason
    assert abs(a.formula.mem_fraction_static - 0.68) < 1e-9


_DSV4_CAPPED = """\
[2026-09-11 23:34:03] server_args={'model_path': 'm', 'mem_fraction_static': 0.95, 'max_total_tokens': 3000000, \
'page_size': 256, 'swa_full_tokens_ratio': 0.8, 'tp_size': 3, 'speculative_algorithm': 'DSPARK'}
[2026-09-11 23:34:13 TP0 EP0] Load weight begin. avail mem=111.47 GB
[2026-09-11 23:43:15 TP0 EP0] Load weight end. elapsed=541.76 s, type=DeepseekV4ForCausalLM, quant=fp8, \
avail mem=17.47 GB, mem usage=94.00 GB.
[2026-09-11 23:46:11 TP0 EP0] DSV4 memory calculation: bytes_per_full_token=1670.75, available_bytes=8.84 GB, \
c128_state_fixed=0.00 GB, swa_fixed=0.30 GB, full_token=5491200
[2026-09-11 23:46:11 TP0 EP0] Initialize DeepSeekV4TokenToKVPool with max_num_reqs=4 swa_size=13312 \
c4_size=749952 c128_size=23436 c4_state_pool_size=1664 c128_state_pool_size=0
[2026-09-11 23:46:49 TP0 EP0] max_total_num_tokens=2999808, chunked_prefill_size=1024, max_prefill_tokens=16384, \
max_running_requests=4, context_len=1048576, available_gpu_mem=7.68 GB
"""


def test_a_capped_deepseek_v4_pool_is_checked_from_the_cap():
    """0.5.20+ shapes (pool_configurator.py's format strings; the numbers of a 3 x DGX Spark DSpark startup): the
    fixed pools come off the budget (8.84 - 0.30 GiB / 1,670.75 B ~ 5.49 M full tokens), then
    --max-total-tokens rebuilds the pools from 2,999,808: c4 and c128 follow the cap, the cap-mode SWA pool is not
    judged by the ratio."""
    (a,) = run(_DSV4_CAPPED.encode())
    assert a.formula.verdict == Verdict.MATCH and a.formula.logged_tokens == 5491200
    assert any("caps the pools" in n and "2,999,808" in n for n in a.notes)
    assert any("c4 749,952 = full // 4" in n for n in a.notes)
    assert not any("is not int(" in n for n in a.notes)


_GEMMA3_ONE_POOL = """SGLang Version 0.5.11
[2026-06-10 02:10:40] server_args=ServerArgs(model_path='google/gemma-3-27b-it', mem_fraction_static=0.85, \
kv_cache_dtype='auto', page_size=1, swa_full_tokens_ratio=0.8, tp_size=1)
[2026-06-10 02:10:49] Load weight begin. avail mem=80.00 GB
[2026-06-10 02:16:37] Load weight end. elapsed=347.58 s, type=Gemma3ForConditionalGeneration, avail mem=25.00 GB, \
mem usage=55.00 GB.
[2026-06-10 02:16:40] KV Cache is allocated. #tokens: 27482, K size: 6.50 GB, V size: 6.50 GB
[2026-06-10 02:16:43] max_total_num_tokens=27482, chunked_prefill_size=8192, max_prefill_tokens=16384, \
max_running_requests=2048, context_len=131072, available_gpu_mem=10.00 GB
"""


def test_a_hybrid_outside_the_allow_list_gets_one_full_pool_not_a_geometry_finding():
    """Upstream SGLang (0.5.11-0.5.23 configs/model_config.py::is_hybrid_swa_model) does not list Gemma-3: the
    sliding-window model gets one full-length pool. No public upstream Gemma-3 startup of 0.5.9+ is in the corpus
    (c027 is a fork that adds it); the lines follow 0.5.11's format strings. 62 x 16 x (128 + 128) x 2 = 507,904 B,
    (25 - 0.15 x 80) GiB / 507,904 B = 27,482 tokens."""
    (a,) = run(_GEMMA3_ONE_POOL.encode(), model_geometry=load_config(CONFIGS / "gemma-3-27b-it.json"))
    assert "GEOMETRY_MISMATCH" not in codes(a)
    assert a.formula.bytes_per_token == 507904 and a.formula.verdict == Verdict.MATCH
    assert any("allow-list" in n for n in a.notes)


def test_a_hybrid_given_one_full_pool_is_a_finding_that_says_what_to_set():
    """The same startup (0.5.11's format strings, Gemma-3-27B's config): SWA_POOL_UNUSED says the pool is one
    full-length pool (507,904 B per token on 62 layers) against 81,920 B on the 10 full layers plus the SWA pool
    (sgl-project/sglang#39308's class), and what to set for the release (0.5.11: before the 0.5.13 opt-in)."""
    (a,) = run(_GEMMA3_ONE_POOL.encode(), model_geometry=load_config(CONFIGS / "gemma-3-27b-it.json"))
    f = next(f for f in a.findings if f.code == "SWA_POOL_UNUSED")
    assert f.fields["bytes_per_token"] == 507904 and f.fields["full_layer_bytes_per_token"] == 81920
    assert "allow-list" in f.message and "0.5.13" in f.message and "hybrid_layer_pattern" in f.message
    (b,) = run(_GEMMA3_ONE_POOL.replace("swa_full_tokens_ratio=0.8,", "swa_full_tokens_ratio=0.8, "
                                        "disable_hybrid_swa_memory=True,").encode(),
               model_geometry=load_config(CONFIGS / "gemma-3-27b-it.json"))
    g = next(f for f in b.findings if f.code == "SWA_POOL_UNUSED")
    assert "drop --disable-hybrid-swa-memory" in g.message


# --- item 10: 2026 sizing modes ------------------------------------------------------------------------------


def test_a_post_capture_upper_bound_is_not_the_pool():
    """fixtures/samples/sglang_026 (sglang#35996, real, hand-abridged): 'KV Cache VA upper bound ... #tokens:
    273K' is post-capture KV sizing's pre-capture address space (0.5.17+ memory_pool.py prints 'VA upper bound'
    when post_capture_active), not the pool: the pool is re-sized after capture (kv_pool_runtime.py
    compute_post_capture_kv_resize) from terms the log does not print. Not modelled: no pool figure from the
    bound, no mismatch, and the reason says so."""
    (a,) = run((ROOT / "fixtures" / "samples" / "sglang_026.log").read_bytes())
    assert a.formula.logged_tokens is None  # not 273,000
    assert a.formula.verdict == Verdict.UNKNOWN
    assert "post-capture KV sizing" in a.formula.verdict_reason and "273,000" in a.formula.verdict_reason
    assert "TOKENS_MISMATCH" not in codes(a) and judge(a).status == "unchecked"
    assert "273,000 tokens" not in judge(a).headline


def test_hicache_host_ram_stays_out_of_the_gpu_ledger():
    """fixtures/samples/sglang_210 (udbhav-ag/SGLang_setup@fdeaea3, real): 'Allocating 11.55 GB host memory for
    hierarchical KV cache' is host RAM: the finding books it outside the ledger, and no GPU item holds it."""
    (a,) = run((ROOT / "fixtures" / "samples" / "sglang_210.log").read_bytes())
    assert a.hicache_host_gb == 11.55 and "HICACHE_HOST_MEMORY" in codes(a)
    kv = [it.gib for r in a.ranks for it in r.items if it.key.startswith("kv_cache")]
    assert kv and all(abs(g - 11.55) > 0.01 and abs(g - 10.76) > 0.01 for g in kv)


_AITER_KEPT = ("[2025-10-01 10:00:00] attention_backend=aiter with context_len=32768 (>8192) normally scales "
               "mem_fraction_static by 0.85 to reserve non-static workspace, but SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION "
               "is set, so mem_fraction_static=0.680 is used as-is. Ensure enough memory is left for attention "
               "workspace and CUDA graphs.\n")


def test_aiters_opt_out_is_read_and_not_called_scaled():
    """0.5.19+ (attention_hook.py, PR 37242): with SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION the explicit fraction
    is kept and the engine says so; the format strings of 0.5.19 (no public aiter startup in the corpus). The
    printed 0.68 is the one used (the same pool as above) and no note claims it includes x 0.85."""
    text = _AITER.format(version="0.5.19", mfs="0.68")
    head, rest = text.split("[2025-10-01 10:00:01", 1)
    (a,) = run((head + _AITER_KEPT + "[2025-10-01 10:00:01" + rest).encode())
    assert a.formula.verdict == Verdict.MATCH and abs(a.formula.mem_fraction_static - 0.68) < 1e-9
    assert any("kept the explicit fraction 0.68" in n for n in a.notes)
    assert not any("already includes" in n for n in a.notes)


@pytest.mark.parametrize("version,tp,expected", [("0.5.17", 1, 0.992), ("0.5.18", 8, 0.969), ("0.5.23", 8, 0.969)])
def test_the_post_capture_default_fraction_is_the_releases_rule(version, tp, expected):
    """Under SGLANG_ENABLE_POST_CAPTURE_KV_SIZING the default skips the graph and activation reserve: 0.5.16-0.5.17
    keep 512 MiB + TP x PP / 8 GiB, 0.5.18+ 1536 MiB + TP x PP / 8 GiB (server_args.py, memory_hook.py from 0.5.19),
    no 10 GiB floor. On an H100's 81,559 MiB (nvidia-smi memory.total): (81,559 - 640) / 81,559 = 0.992 at TP1 in
    0.5.17, (81,559 - 2,560) / 81,559 = 0.969 at TP8 in 0.5.18+. MLA models are never post-capture sized."""
    from kvaudit.reconcile.sglang.defaults import default_fraction

    f, how = default_fraction(version, 81559, tp, 1, 1, False, False, post_capture=True)
    assert f == expected and "post-capture" in how
    assert default_fraction(version, 81559, tp, 1, 1, True, False, post_capture=True)[0] is None
    assert default_fraction("0.5.15", 81559, tp, 1, 1, False, False, post_capture=True)[0] is None


_POST_CAPTURE = """SGLang Version 0.5.17
[2026-07-01 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2-7B', mem_fraction_static=0.9, kv_cache_dtype='auto', page_size=1, tp_size=1)
[2026-07-01 10:00:01 TP0] Load weight begin. avail mem=78.00 GB
[2026-07-01 10:00:20 TP0] Load weight end. elapsed=19.00 s, type=Qwen2ForCausalLM, quant=None, avail mem=63.50 GB, mem usage=14.50 GB.
[2026-07-01 10:00:21 TP0] KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 1042958, K size: 27.85 GB, V size: 27.85 GB
[2026-07-01 10:00:21 TP0] Memory pool end. avail mem=63.14 GB
[2026-07-01 10:00:22 TP0] Capture target decode CUDA graph begin. avail mem=63.09 GB
[2026-07-01 10:00:32 TP0] Capture target decode CUDA graph end. elapsed=10.10 s, mem usage=0.60 GB, avail mem=62.49 GB.
[2026-07-01 10:00:33 TP0] Post-capture KV sizing: full_layer_tokens=1026094, swa_layer_tokens=0
[2026-07-01 10:00:33 TP0] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 1026094, KV size: 54.85 GB, avail mem=7.75 GB
[2026-07-01 10:00:34 TP0] max_total_num_tokens=1026094, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=32768, available_gpu_mem=7.75 GB
"""


def test_a_post_capture_pool_is_read_whole_and_not_judged():
    """0.5.17's format strings (no public startup of the opt-in mode was found), Qwen2-7B's config: the pool is
    the resize's 1,026,094 tokens (not the 1,042,958 of the VA upper bound), the ledger books the backed 54.85 GiB
    as the KV cache, the verdict is unknown and says why, and the backed size (each buffer rounded up to the VMM
    granularity, kv_vmm_backing.py) is not taken for a cell: no GEOMETRY_MISMATCH against 57,344 B."""
    (a,) = run(_POST_CAPTURE.encode(), model_geometry=load_config(CONFIGS / "qwen2-7b.json"))
    assert a.formula.logged_tokens == 1026094 and a.formula.verdict == Verdict.UNKNOWN
    assert "post-capture KV sizing" in a.formula.verdict_reason and "1,042,958" in a.formula.verdict_reason
    assert a.formula.bytes_per_token == 57344
    assert a.ranks[0].kv_gib == 54.85
    assert not codes(a) & {"GEOMETRY_MISMATCH", "TOKENS_MISMATCH", "UNEXPLAINED_MEMORY"}
