"""One contract every engine keeps (issue 20): registered in one line, its grammar anchored on its own log
prefix, its reconcile pure and complete, its what-if's "now" the audit's. Parametrised over ``ENGINES``, so a
new engine is held to it by being registered."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace

import pytest

from kvaudit.engines import ENGINES
from kvaudit.explain import read_log
from kvaudit.parse.interface import OwnPrefix
from kvaudit.reconcile.interface import Verdict
from tests.conftest import ROOT
from tests.corpus_run import CORPUS, options

LOGS = json.loads((CORPUS / "corpus.json").read_text())["logs"]
DOCUMENTED = set(re.findall(r"^\| `([A-Z_]+)` \|", (ROOT / "docs" / "findings.md").read_text(), re.M))


def _logs_of(engine: str) -> list[str]:
    return sorted(name for name, entry in LOGS.items() if entry["engine"] == engine)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_registration(engine):
    p = engine.parser
    assert p.name == engine.name and engine.display
    assert p.anchors and all(isinstance(a, bytes) and a for a in p.anchors)
    assert p.markers and all(isinstance(m, str) and m for m in p.markers)
    assert (engine.endpoint is None) == (not engine.endpoint_paths)
    grammar = sys.modules[type(p).__module__]
    assert isinstance(getattr(grammar, "OWN_PREFIX", None), OwnPrefix), "each grammar names its log prefix"
    assert len(_logs_of(engine.name)) >= 10, "the corpus holds at least ten real startups of every engine"


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_every_corpus_audit_keeps_the_contract(engine):
    for name in _logs_of(engine.name):
        with open(CORPUS / f"{name}.log", "rb") as fh:
            log = read_log(fh)
        assert log.engine.name == engine.name, name
        opts = options(LOGS[name])
        s = log.startups[-1]
        a = engine.audit(s, opts, len(log.startups))
        # pure: the same startup and options give the same audit
        assert engine.audit(s, opts, len(log.startups)) == a, name
        assert a.engine == engine.name and a.engine_display and a.formula_text and a.formula_rows, name
        ranks = [f.severity.rank for f in a.findings]
        assert ranks == sorted(ranks, reverse=True), f"{name}: findings ordered by severity"
        assert {f.code for f in a.findings} <= DOCUMENTED, f"{name}: every code in docs/findings.md"
        f = a.formula
        # rule 3: every input the formula used says where it came from
        for value, source in ((f.mem_fraction_static, f.mem_fraction_static_source),
                              (f.pre_load_free_gib, f.pre_load_free_source),
                              (f.bytes_per_token, f.bytes_per_token_source)):
            assert value is None or source, f"{name}: {value} has no source"
        if f.verdict == Verdict.MATCH:
            assert f.logged_tokens is not None and f.predicted_tokens is not None, name
        # what-if with nothing changed: its "now" is the audit's count, its "after" the same pool
        w = engine.whatif(s, opts, a, replace(opts))
        assert w.tokens_before == f.logged_tokens, name


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_no_engine_raises_the_verdict_s_findings(engine):
    """Issue 33: an engine states what it read, derived and assumed (the formula's verdict, its worked text);
    the pool check's findings are the verdict's (rule 6). No module of an engine's formula package raises
    TOKENS_MATCH, TOKENS_EXPLAINED, TOKENS_MISMATCH or INCOMPLETE_LOG (an engine says what its log lacks in
    ``Audit.lacks``), and its reconcile output, before the verdict settles it, holds none of them."""
    import importlib
    import inspect
    from pathlib import Path

    from kvaudit.verdict import TOKEN_CODES

    package = Path(importlib.import_module(engine.formula).__file__).parent
    for module in package.glob("*.py"):
        text = module.read_text()
        for call in ("tokens_match(", "tokens_mismatch(", "tokens_match_text(", "incomplete_log("):
            assert f"F.{call}" not in text, f"{module.name} raises {call[:-1]}: the verdict's to raise"
        for code in TOKEN_CODES:
            assert f'"{code}"' not in text, f"{module.name} builds {code}"
    for name in _logs_of(engine.name)[:15]:
        with open(CORPUS / f"{name}.log", "rb") as fh:
            log = read_log(fh)
        raw = engine.reconcile(log.startups[-1], options(LOGS[name]), len(log.startups))
        assert not {f.code for f in raw.findings} & {*TOKEN_CODES, "INCOMPLETE_LOG"}, name
    assert inspect.isfunction(engine.reconcile)
