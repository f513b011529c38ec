"""The corpus (fixtures/corpus/): every real log held to the truth established for it from the engine's code at
its release (corpus.json), and the verdict's rules (docs/findings.md) checked on every corpus and sample log in
every format."""

from __future__ import annotations

import itertools

import json
import re

import pytest

from kvaudit.reconcile.interface import Severity, Verdict
from kvaudit.textsafe import md_cell
from kvaudit.verdict import TRACEBACK_HEADER, judge
from tests.conftest import SAMPLES, cli
from tests.corpus_run import CORPUS, ROOT, audit_entry

DOC = json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))
ENTRIES = DOC["logs"]
FAILURE = re.compile(r"Traceback \(most recent call last\)|OutOfMemoryError|CUDA out of memory|^Killed|CUDA Error|"
                     r"Not enough memory|No available memory for the cache blocks|Executor creation failed", re.M)


def test_every_corpus_log_has_an_entry_and_the_index_is_current():
    logs = {p.stem for p in CORPUS.glob("*.log")}
    assert logs == set(ENTRIES), (logs ^ set(ENTRIES))
    import importlib.util

    spec = importlib.util.spec_from_file_location("corpus_script", ROOT / "scripts" / "corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    assert (CORPUS / "INDEX.md").read_text(encoding="utf-8") == mod.index_text(), \
        "fixtures/corpus/INDEX.md is stale: run python scripts/corpus.py --index"
    for name, e in ENTRIES.items():
        assert e["source"].startswith("https://github.com/"), name
        for key in ("date", "version", "model", "gpu", "flags", "key_numbers", "truth", "expect"):
            assert e.get(key), (name, key)


def test_every_key_number_is_verbatim_in_its_log():
    """The INDEX quotes numbers from the log: each backticked quote must appear in the file as written."""
    for name, e in ENTRIES.items():
        text = (CORPUS / f"{name}.log").read_text(encoding="utf-8")
        for quote in re.findall(r"`([^`]+)`", e["key_numbers"]):
            assert quote in text, (name, quote)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_corpus_log_reads_to_its_truth(name):
    e = ENTRIES[name]
    x = e["expect"]
    a = audit_entry(name, e)
    j = judge(a)
    codes = {f.code for f in a.findings if not f.ignored}
    assert a.engine == x["engine"]
    assert j.status == x["status"], j.headline
    assert a.formula.verdict.value == x["verdict"], a.formula.verdict_reason
    if "logged_tokens" in x:
        assert a.formula.logged_tokens == x["logged_tokens"]
    for code in x.get("must", []):
        assert code in codes, (code, codes, j.headline)
    for code in x.get("must_not", []):
        assert code not in codes, (code, j.headline)
    if "headline" in x:
        assert x["headline"] in j.headline, j.headline
    if "engine_version" in x:
        assert a.engine_version == x["engine_version"]
    if "notes_contain" in x:
        assert any(x["notes_contain"] in n for n in a.notes), a.notes
    for key, want in x.get("ledger", {}).items():  # "TP0.request_table": 0.04 (GiB, +-0.005)
        label, item = key.split(".", 1)
        r = next(r for r in a.ranks if r.label == label)
        got = getattr(r, item) if hasattr(r, item) else (r.item(item).gib if r.item(item) else None)
        assert got is not None and abs(got - want) <= 0.005, (key, got, want)


ALL_LOGS = sorted(CORPUS.glob("*.log")) + sorted(SAMPLES.glob("*.log"))


@pytest.mark.parametrize("path", ALL_LOGS, ids=[p.name for p in ALL_LOGS])
def test_the_verdicts_rules_hold_in_every_format(path):
    """Rules 1-5 of docs/findings.md on the real report, in every format: one headline first, no two accounts
    of the same GiB, no geometry check beside a match from the same cell, a failure quoted as its exception,
    a mismatch always a finding, "Nothing looks wrong" only after a check held."""
    j = cli("explain", path, "-f", "json")
    assert j.code in (0, 1, 3), j.stderr
    doc = j.json()
    audits = doc.get("audits", [doc])
    a = audits[-1]
    head = a["headline"]
    assert head and "\n" not in head
    assert head.split()[0] in ("OK", "UNCHECKED", "WARNING", "ERROR")
    text = cli("explain", path, "--color", "never")
    md = cli("explain", path, "-f", "markdown")
    # the text report's headline is one line of at most 80 cells; what did not fit stands under it, indented
    lines = text.stdout.splitlines()
    shown = [lines[0]] + [x for x in itertools.takewhile(lambda x: x.startswith("  "), lines[1:])]
    assert len(lines[0]) <= 80 and head.startswith(lines[0])

    def words(t: str) -> str:  # a word longer than a line (a path) is cut where the line ends
        return "".join(t.replace(";", "").split())

    said = words(" ".join(shown))  # the same headline; a long one cut after 3 lines with " ..." (JSON's is whole)
    assert said == words(head) or (len(shown) == 3 and said.endswith("...") and words(head).startswith(said[:-3]))
    assert md.stdout.splitlines()[0].strip("*") == md_cell(head)  # the same headline, escaped for Markdown
    codes = [f["code"] for f in a["findings"] if not f["ignored"]]
    # rule 1: one account per GiB
    if "UNUSED_MEMORY" in codes:
        assert "not wasted" not in text.stdout and "not wasted" not in md.stdout
    # rule 2: a cause offered for unexplained memory can hold it
    for f in a["findings"]:
        if f["code"] == "UNEXPLAINED_MEMORY":
            for c, size in f["fields"].get("candidates_too_small", {}).items():
                assert c not in f["fields"]["candidates"] and size < abs(f["fields"]["unexplained_gib"])
    # rule 3: no geometry check beside a match from the same cell
    assert not ("GEOMETRY_MISMATCH" in codes and "TOKENS_MATCH" in codes)
    # rule 4: a formula that does not hold is a finding
    if a["formula"]["verdict"] == Verdict.MISMATCH.value:
        assert {"TOKENS_MISMATCH", "LIVE_POOL_MISMATCH", "BUDGET_MISMATCH", "NOT_ENOUGH_MEMORY",
                "ASSUMPTION_CONTRADICTED"} & set(codes)
    # rule 5: a failed startup says so first, quoting the exception
    raw = path.read_text(errors="replace")
    errors = [f for f in a["findings"] if f["severity"] == Severity.ERROR.value]
    failed_later = any("the server failed after it began serving" in n for n in a.get("notes", ()))
    if FAILURE.search(raw) and not failed_later:  # a failure while serving is said in a note, not as the start's
        assert errors, "the log shows a failure; no error finding"
    if errors:
        assert head.startswith("ERROR") and TRACEBACK_HEADER not in head
    if a["status"] == "unchecked":
        assert "Nothing looks wrong" not in text.stdout
