"""The human views, against golden files a human reviewed (`make golden` rewrites them)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import KIMI_CONFIG, KIMI_LOG, SAMPLES, cli


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
