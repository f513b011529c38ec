"""What kvaudit models is data (kvaudit/support/<engine>.toml), the verdict consults it, and docs/support.md is
rendered from it (issue 33, section 1). Each rule of the verdict that rests on it is held on a real log."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from kvaudit import support
from kvaudit.engines import ENGINES
from kvaudit.reconcile.interface import TokenInterval, Verdict
from kvaudit.verdict import MAX_CHECK_WIDTH, settle
from tests.conftest import FIXTURES, SAMPLES, cli
from tests.corpus_run import audit_entry

ROOT = FIXTURES.parent


def test_the_page_is_the_tables():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "support_page.py"), "--check"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("engine", [e.name for e in ENGINES])
def test_every_engine_says_what_it_models_for_every_kind(engine):
    """The contract every engine keeps: a table naming, for every pool kind, KV dtype class and platform the
    verdict can ask about, a level and the upstream code it was read from (a kind left out would be 'not
    modelled' by omission, unsaid)."""
    rows = support.table(engine)
    assert rows, f"{engine} has no support table"
    for r in rows:
        assert r.kind in support.KINDS[r.dimension] and r.level in support.LEVELS, r
        assert r.source.strip() and (r.level == "modelled" or r.note.strip()), r
    for dim in ("pool", "platform"):
        assert set(support.KINDS[dim]) <= {r.kind for r in rows if r.dimension == dim}, (engine, dim)
    assert {"16bit", "fp8"} <= {r.kind for r in rows if r.dimension == "kv_dtype"}


def test_a_release_the_table_does_not_describe_is_not_modelled():
    lvl, _ = support.level_of("sglang", "pool", "swa", support.release_range("0.4.0..0.4.8"))
    assert lvl == "not"
    assert support.level_of("sglang", "pool", "dense", support.release_range("0.5.9"))[0] == "modelled"
    assert support.level_of("sglang", "pool", "swa", support.release_range("0.5.5..0.5.12"))[0] == "partly"


def test_a_wide_interval_is_not_a_match():
    """Rule 8 on a real matching startup: the same audit with the interval two eras' rules would give together
    (the logged count inside, the interval 3.8x wide) is unknown, and says why; the narrow one stays a match."""
    entry = {"config": None}
    a = audit_entry("sglang_c006", entry)
    assert a.formula.verdict == Verdict.MATCH
    p, n = a.formula.predicted_tokens, a.formula.logged_tokens
    assert (p.high - p.low) / ((p.high + p.low) / 2) <= MAX_CHECK_WIDTH
    wide = replace(a, coverage=None, findings=tuple(f for f in a.findings if f.code != "TOKENS_MATCH"),
                   formula=replace(a.formula, predicted_tokens=TokenInterval(n // 3, n * 3 // 2)))
    got = settle(wide)
    assert got.formula.verdict == Verdict.UNKNOWN and "wide" in got.formula.verdict_reason
    assert "TOKENS_MATCH" not in {f.code for f in got.findings}


def test_unified_memory_told_only_by_the_fallback_line_gets_no_fraction_advice():
    """sglang_212 (DGX Spark, SGLang 0.5.11): no 'GB10' anywhere; SGLang's own nvidia-smi fallback line is the
    only sign. The idle memory is system RAM: no --mem-fraction-static is suggested."""
    log = SAMPLES / "sglang_212.log"
    text = log.read_text()
    assert "GB10" not in text and "Falling back to torch.cuda.mem_get_info" in text
    d = cli("explain", log, "-f", "json").json()
    assert d["platform"] and "nvidia-smi" in d["platform"]
    unused = [f for f in d["findings"] if f["code"] == "UNUSED_MEMORY"]
    assert unused and all("--mem-fraction-static" not in f["message"] for f in unused)
    assert all("system memory" in f["message"] or "no larger fraction" in f["message"] for f in unused)


def test_a_memory_line_no_grammar_reads_is_listed():
    """vllm_206: vLLM's 'Checkpoint size: 48.07 GiB. Available RAM: 60.94 GiB.' (weight_utils.py) is no line the
    grammar reads: it is listed with its number, in JSON and text."""
    log = SAMPLES / "vllm_206.log"
    d = cli("explain", log, "-f", "json").json()
    listed = {u["line"]: u["text"] for u in d["uninterpreted_lines"]}
    (n,) = [n for n, t in listed.items() if "Available RAM: 60.94 GiB" in t]
    assert log.read_text().splitlines()[n - 1].endswith(listed[n].strip()[-40:])
    assert f"line {n}: " in cli("explain", log).stdout


def test_a_log_with_memory_lines_but_no_startup_names_them(tmp_path):
    log = tmp_path / "excerpt.log"
    log.write_text("[2026-05-06 09:15:41] Memory profiling: spare_gpu_memory=17.94 GB, total_device_memory=138.17 "
                   "GB\n[2026-05-06 09:15:42] something else\n")
    r = cli("explain", log)
    assert r.code == 2 and "1 line states memory" in r.stderr and "line 1:" in r.stderr, r.stderr


def test_not_modelled_judges_nothing():
    """Rule 7 on a real startup: the same sglang_c006 audit declared an encoder-decoder pool (not modelled in the
    table) keeps what the log states but no pool verdict, no geometry or reserve finding, and says why."""
    a = audit_entry("sglang_c006", {"config": None})
    got = settle(replace(a, coverage=None, pool_kinds=("encoder_decoder",)))
    assert got.formula.verdict == Verdict.UNKNOWN and got.formula.verdict_reason.startswith("not modelled here")
    codes = {f.code for f in got.findings}
    assert not codes & {"TOKENS_MATCH", "TOKENS_MISMATCH", "GEOMETRY_MISMATCH", "RESERVE_EXPLAINS_FREE"}
    assert any(n.startswith("not modelled here") for n in got.notes)
    assert got.coverage.level == "not"


def test_a_cause_the_log_rules_out_is_not_offered():
    """Rule 10 on a real startup (sglang_c002: Gemma-4 12B, multimodal, 130 tokens short of the formula). SGLang
    0.5.18+ prints 'Reserving X GB of the KV budget' whenever it takes the multimodal reservation, between the
    weights' end and the pool. Read as a 0.5.18+ startup: the log covers that span and has no such line, so the
    reservation is not offered; the same startup without its pool lines (an excerpt that stops at the scheduler's
    summary) does not cover the span, and leaves it open."""
    import io
    from dataclasses import replace as rep

    from kvaudit.explain import read_log
    from kvaudit.parse.sglang import KVAlloc, PoolEnd, WeightEnd
    from kvaudit.reconcile.interface import AuditOptions
    from kvaudit.reconcile.sglang import audit as sg
    from kvaudit.reconcile.sglang.context import build_context
    from kvaudit.versions import VersionRange

    data = (FIXTURES / "corpus" / "sglang_c002.log").read_bytes()
    assert b"Reserving" not in data

    def causes(startup) -> str:
        ctx = build_context(startup, AuditOptions())
        ctx = rep(ctx, era=VersionRange((0, 5, 18), None))
        free, fraction = sg.free_memory(ctx), sg.fraction_of(ctx, AuditOptions())
        cells, _ = sg.bytes_per_token(ctx, AuditOptions())
        state = sg.state_pool(ctx)
        budget = sg.PoolBudget(cells.iv, state)
        cap, _ = sg.cap_of(ctx, cells, budget)
        return sg.verdict_of(ctx, AuditOptions(), free, fraction, cells, state, cap).reason

    whole = read_log(io.BytesIO(data)).startups[-1]
    assert whole.of(WeightEnd)
    said = causes(whole)
    assert "fewer" in said and "multimodal runtime reservation" not in said, said
    cut = rep(whole, events=tuple(e for e in whole.events if not isinstance(e, (KVAlloc, PoolEnd))))
    assert "multimodal runtime reservation" in causes(cut)
