"""docs/findings.md lists every code kvaudit can emit, with its severity, and every threshold."""

from __future__ import annotations

import re

from kvaudit.reconcile.findings import CODES
from kvaudit.reconcile.interface import Thresholds
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "findings.md").read_text()


def test_every_code_documented_with_its_severity():
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| (\w+) \|", DOC, re.M))
    assert set(rows) == set(CODES)
    for code, sev in CODES.items():
        assert rows[code] == sev.value, code


def test_every_threshold_documented_with_its_default():
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([\d.]+) \|", DOC, re.M))
    t = Thresholds()
    assert set(rows) == set(Thresholds.names())
    for name in Thresholds.names():
        assert float(rows[name]) == getattr(t, name)


def test_emitted_codes_are_registered():
    src = (ROOT / "kvaudit" / "reconcile" / "findings.py").read_text()
    used = set(re.findall(r'_f\(\s*"([A-Z_]+)"', src)) | set(re.findall(r'"([A-Z_]{6,})" if', src))
    live = (ROOT / "kvaudit" / "reconcile" / "live.py").read_text()
    used |= set(re.findall(r'Finding\(\s*"([A-Z_]+)"', live))
    assert used and used <= set(CODES), used - set(CODES)
