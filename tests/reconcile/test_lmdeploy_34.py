"""Issue 34, item 11 (LMDeploy) on real corpus startups (provenance in fixtures/corpus/corpus.json)."""

from __future__ import annotations

import io

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions, Verdict
from tests.conftest import ROOT

CORPUS = ROOT / "fixtures" / "corpus"
RAISE = "--log-level INFO"


def run(name: str):
    with open(CORPUS / f"{name}.log", "rb") as fh:
        return audit(read_log(io.BytesIO(fh.read())), AuditOptions())[-1]


def said(a) -> str:
    return " ".join([a.formula.verdict_reason] + [f.message for f in a.findings])


def test_a_log_already_at_info_is_not_told_to_raise_the_level():
    """lmdeploy_c006 (--log-level INFO in its command) and c013 (INFO lines): the excerpt ends before the block
    manager's lines; what is missing is the rest of the log, not a level."""
    for name in ("lmdeploy_c006", "lmdeploy_c013"):
        a = run(name)
        assert a.formula.verdict == Verdict.UNKNOWN
        assert RAISE not in said(a) and "already at INFO" in said(a), name


def test_a_log_at_the_default_level_is_told_to_raise_it():
    """lmdeploy_c008: only WARNING lines (the default level hides the INFO sizing lines)."""
    assert RAISE in said(run("lmdeploy_c008"))


def test_bytes_per_token_follow_from_the_block_line_and_its_stated_length():
    """lmdeploy_c003: 0.844 MiB blocks of 64 tokens (both in the log): 13,824..13,832 B per token."""
    f = run("lmdeploy_c003").formula
    assert f.bytes_per_token is not None and 13824 <= f.bytes_per_token <= 13832
    assert "tokens per block" in (f.bytes_per_token_source or "")


def test_a_fallback_to_the_pytorch_engine_is_an_lmdeploy_startup():
    """lmdeploy_c014 (lmdeploy#2208): only archs.py's WARNING that TurboMind does not support the model. The log
    is LMDeploy's, the engine is the PyTorch one, and at the default level the sizing lines are hidden."""
    a = run("lmdeploy_c014")
    assert a.engine == "lmdeploy" and a.engine_display == "LMDeploy (PyTorch engine)"
    assert RAISE in said(a)


def test_max_cached_tokens_is_the_pool_and_an_info_log_is_not_told_to_raise_its_level():
    """lmdeploy_c016 (lmdeploy#4367, 0.12.x): '[TM][INFO] max cached tokens: 42880' is the pool's capacity
    (engine.cc); the log is at INFO, so what it lacks is the rest of the startup, not a level."""
    a = run("lmdeploy_c016")
    assert a.formula.logged_tokens == 42880 and "42,880 tokens ('max cached tokens')" in a.formula.verdict_reason
    assert RAISE not in said(a) and "already at INFO" in said(a)
    b = run("lmdeploy_c015")  # lmdeploy#4366: WARNING lines only, at the default level
    assert RAISE in said(b)


def test_a_whole_mib_block_line_gives_no_bytes_per_token_figure():
    """lmdeploy_c018 (lmdeploy#2408, 0.4.2-0.5.3): '[BlockManager] block_size = 2 MB' is ``block_size_ >> 20``,
    cut, so the block is anywhere in [2, 3) MiB; bytes per token are 32,768..49,151, not the midpoint 40,960."""
    f = run("lmdeploy_c018").formula
    assert f.bytes_per_token is None and f.bytes_per_token_source is None
    assert f.logged_tokens == 10683 * 64
    assert f.verdict == Verdict.UNKNOWN


def test_the_turbomind_config_fields_narrow_the_release():
    """lmdeploy_c018: TurbomindEngineConfig(model_name=..., enable_prefix_caching=...) without cache_chunk_size
    is 0.4.2-0.5.3 (lmdeploy/messages.py per tag), so the ratio applied to the free memory (0.2.2+), not the card's
    total: the reason says so instead of 'the log's era spans both'."""
    a = run("lmdeploy_c018")
    assert a.engine_version == "0.4.2..0.5.3"
    assert "spans both" not in a.formula.verdict_reason
    assert "free memory after" in a.formula.verdict_reason


def test_whatif_with_nothing_to_compute_says_so_and_exits_1():
    """lmdeploy_c008 (a WARNING-level log: no pool, no free memory): the what-if has no figure to show. It says
    what the log lacks in one plain line, prints no table of dashes, and exits 1 (WARNINGS: no answer is not
    'the change leaves the headroom', docs/exit-codes.md), in text and JSON alike."""
    from tests.conftest import cli

    r = cli("whatif", CORPUS / "lmdeploy_c008.log", "--cache-max-entry-count", "0.5")
    assert r.code == 1, r.stdout
    assert "nothing could be computed" in r.stdout and "KV tokens" not in r.stdout
    assert "free memory after the weights" in r.stdout and " or the bytes per token" not in r.stdout
    j = cli("whatif", CORPUS / "lmdeploy_c008.log", "--cache-max-entry-count", "0.5", "-f", "json")
    assert j.code == 1 and j.json()["whatif"]["risk"] == "unknown"


def test_whatif_on_a_cut_block_line_names_what_it_lacks():
    """lmdeploy_c018: the pool's tokens are in the log, its bytes are not (2 MB, cut): said, exit 1."""
    from tests.conftest import cli

    r = cli("whatif", CORPUS / "lmdeploy_c018.log", "--cache-max-entry-count", "0.5")
    assert r.code == 1 and "683,712 tokens are in the log" in r.stdout
