"""Issue 34, item 8: the first "In short" sentence is a sum (of T: the items, the free memory at the end, the
unexplained rest) and must add up, on every real corpus log (provenance in fixtures/corpus/corpus.json)."""

from __future__ import annotations

import json
import re

import pytest

from kvaudit.report.view import summary_sentences
from tests.corpus_run import CORPUS, audit_entry

ENTRIES = json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))["logs"]
HEAD = re.compile(r"On (.+?), of the (\d+\.\d\d) GiB [^:]*: (.*)\.$", re.S)
FIGURE = re.compile(r"(?<![\d.])(-?\d+\.\d\d)\b")


def terms(sentence: str) -> tuple[float, list[float]]:
    """T and every figure the sentence adds up to it (bracketed remarks, which quote lines and tolerances, out)."""
    m = HEAD.match(sentence)
    assert m, sentence
    body = re.sub(r"\([^()]*\)", "", m.group(3))
    body = body.replace(" GiB was free at the end", "").replace(" GiB is unexplained", "")
    body = re.sub(r"; the other (-?\d+\.\d\d) GiB is not broken down:.*", r", \1", body)
    return float(m.group(2)), [float(x) for x in FIGURE.findall(body)]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_the_in_short_sum_adds_up(name):
    a = audit_entry(name, ENTRIES[name])
    first = summary_sentences(a)[0]
    if not first.startswith("On "):
        return  # no ledger to sum: nothing is claimed
    t, figures = terms(first)
    # each figure is rounded to 0.01: the sum holds to half a hundredth per figure
    assert abs(t - sum(figures)) <= 0.005 * (len(figures) + 1) + 1e-9, (first, t, figures)


def test_a_ledger_with_gaps_says_what_it_does_not_break_down():
    """trtllm_c007 gives the total and the memory before KV sizing only: the rest is said, not dropped."""
    first = summary_sentences(audit_entry("trtllm_c007", ENTRIES["trtllm_c007"]))[0]
    assert "the other 19.70 GiB is not broken down" in first and "the KV cache" in first


def test_the_sentence_quotes_the_rank_whose_ledger_adds_up():
    """vllm_c018: TP0's lines stop before the KV cache, TP7's do not; the sum is TP7's (T = 60.96)."""
    first = summary_sentences(audit_entry("vllm_c018", ENTRIES["vllm_c018"]))[0]
    assert first.startswith("On TP7,") and "the KV cache 5.15" in first
