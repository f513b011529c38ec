"""The human views, against golden files a human reviewed (`make golden` rewrites them)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, SAMPLES, cli


@pytest.fixture
def kimi_here(tmp_path, monkeypatch) -> str:
    """The Kimi log as the relative path `KIMI_LOG`: the text wraps at the width, so a golden view must not depend
    on how long the checkout's path is (CI checks out under another directory than a developer's)."""
    shutil.copyfile(KIMI_LOG, tmp_path / "KIMI_LOG")
    monkeypatch.chdir(tmp_path)
    return "KIMI_LOG"


def test_kimi_text_view(golden, kimi_here):
    r = cli("explain", kimi_here, "-m", KIMI_CONFIG)
    assert r.code == 0, r.stderr
    golden("kimi-explain.txt", r.stdout)


def test_kimi_markdown_view(golden, kimi_here):
    r = cli("explain", kimi_here, "-m", KIMI_CONFIG, "-f", "markdown")
    assert r.code == 0, r.stderr
    golden("kimi-explain.md", r.stdout)


def test_whatif_view(golden, kimi_here):
    r = cli("whatif", kimi_here, "-m", KIMI_CONFIG, "--mem-fraction-static", "0.92")
    assert r.code == 1, r.stderr  # low headroom: a warning
    golden("kimi-whatif-0.92.txt", r.stdout)


def test_ranks_that_agree_share_a_row():
    out = cli("explain", KIMI_LOG, "-m", KIMI_CONFIG).stdout
    assert "TP1-2,4,6-7" in out and "TP3,5" in out


def test_text_answers_in_plain_sentences():
    out = cli("explain", SAMPLES / "sglang_006.log").stdout
    assert "In short" in out and "the pool looks capped" in out


def test_nothing_looks_wrong_only_when_a_check_held():
    """An unchecked pool is never a clean bill: the text says what could not be checked and what to pass."""
    unchecked = cli("explain", SAMPLES / "sglang_021.log").stdout
    assert "Nothing looks wrong" not in unchecked
    assert "could not be checked" in unchecked and "--mem-fraction-static" in unchecked
    checked = cli("explain", SAMPLES / "sglang_029.log").stdout
    assert "TOKENS_MATCH" in checked or "exactly what SGLang's formula gives" in checked


def test_a_cell_read_off_the_kv_line_is_one_figure():
    """sglang_013's K 4.15 + V 4.15 GB over 580,364 tokens is 15,356 B a token at one padding row: the formula's
    figure and the KV line's are the same number (they were 15,354 and 15,356), and the text says how far the
    line's rounding and padding reach."""
    r = cli("explain", SAMPLES / "sglang_013.log", "-f", "json")
    formula = r.json()["formula"]
    assert formula["bytes_per_token_source"] == "kv_line"
    assert formula["bytes_per_token"] == 15356 and formula["kv_line_bytes_per_token"] == 15356.0
    text = cli("explain", SAMPLES / "sglang_013.log").stdout
    assert "15,356   kv_line +-21" in text and "15,354" not in text


@pytest.mark.parametrize("log", sorted((SAMPLES.parent / "corpus").glob("*.log")) + sorted(SAMPLES.glob("*.log")),
                         ids=lambda p: p.stem)
def test_every_kv_line_cell_is_printed_once(log):
    for audit in _audits(cli("explain", log, "-f", "json", "--all-startups")):
        formula = audit.get("formula") or {}
        if (formula.get("bytes_per_token_source") or "").startswith("kv_line") and formula.get(
                "kv_line_bytes_per_token"):
            assert abs(formula["bytes_per_token"] - formula["kv_line_bytes_per_token"]) <= 0.5


def _audits(r):
    if not r.stdout.strip():
        return []
    doc = r.json()
    return doc if isinstance(doc, list) else doc.get("audits", [doc])


def test_ranks_named_by_pid_fold_into_one_short_row_label():
    """vllm_c063 (a V0 driver and six workers whose pids name no rank): one row for the seven equal ranks,
    labelled short enough that the table keeps its columns on an 80-column page."""
    from kvaudit.report.view import fold_labels

    assert fold_labels(("TP0", "TP1", "TP2", "TP4")) == "TP0-2,4"
    pids = ("TP0", *(f"pid {p}" for p in (13105, 13106, 13108, 13109, 13110, 13111)))
    assert fold_labels(pids) == "TP0 +6 more"
    r = cli("explain", FIXTURES / "corpus" / "vllm_c063.log", "--color", "never")
    table = r.stdout.split("Per GPU (GiB)\n", 1)[1].splitlines()
    assert table[0].split()[:3] == ["GPU", "weights", "KV"] and table[1].startswith("  TP0 +6 more ")
