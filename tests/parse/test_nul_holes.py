"""parse.lines.check_head: a text log with a writer's hole of NUL bytes is read as text; binary input is not.

The real case: AMD's sglang-ci Qwen3-30B sanity log (fixtures/corpus/sglang_c057.log) holds one run of 12,618 NUL
bytes at byte 44,509 (line 368), left where a previous server kept writing into the truncated file."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys

import pytest

from kvaudit.parse import lines as L
from tests.conftest import FIXTURES

QWEN = FIXTURES / "corpus" / "sglang_c057.log"
ANCHORS = (b"KV Cache is allocated", b"Gracefully exiting")


def _scan(data: bytes, fast: bool, monkeypatch, scanner: str = "python"):
    monkeypatch.setenv("KVAUDIT_SCANNER", scanner)
    stats = L.ScanStats()
    reader = L.scan_fast if fast else L.scan
    return list(reader(io.BytesIO(data), ANCHORS, stats)), stats


@pytest.mark.parametrize("fast,scanner", [(False, "python"), (True, "grep")])
def test_the_qwen_log_with_its_nul_run_is_read_as_text(fast, scanner, monkeypatch):
    data = QWEN.read_bytes()
    assert data.count(b"\x00") == 12_618  # the real file, as fetched
    got, stats = _scan(data, fast, monkeypatch, scanner)
    kv = [ln for ln in got if "KV Cache is allocated" in ln.text]
    assert len(kv) == 8 and kv[0].number == 287 and "#tokens: 8653921" in kv[0].text
    hole = [ln for ln in got if ln.number == 368]  # the line the NULs run into
    assert hole and hole[0].text.startswith("[2025-12-12 09:20:26] Gracefully exiting")
    assert stats.nul_runs == ((44_509, 12_618, 368),)
    note = stats.dropped_bytes_note()
    assert note is not None and "12,618 NUL byte(s)" in note and "byte 44,509 (line 368)" in note


def test_the_qwen_log_is_audited_with_the_note():
    r = subprocess.run([sys.executable, "-m", "kvaudit", "explain", str(QWEN), "-f", "json"],
                       capture_output=True, text=True, timeout=120)
    assert "binary" not in r.stderr and r.stdout, r.stderr
    import json

    doc = json.loads(r.stdout)
    audit = doc[0] if isinstance(doc, list) else doc
    text = json.dumps(audit)
    assert "8653921" in text.replace(",", "") and "12,618 NUL byte(s)" in text


def _elf_like() -> bytes:
    return (b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + b"\x03\x00>\x00\x01\x00\x00\x00" + b"GB\n" * 10) * 400


@pytest.mark.parametrize("data,why", [
    ("text log GB\n".encode("utf-16-le") * 500, "UTF-16: a NUL every other byte"),
    (_elf_like(), "an executable: NUL runs everywhere"),
    (gzip.compress(b"".join(b"%d GB\n" % i for i in range(40_000)))[:4000] + b"\x00" * 64 + b"GB\n" * 50,
     "compressed data: control bytes everywhere"),
    (b"\x00" * 60_000 + b"KV Cache is allocated 1 GB\n" * 100, "mostly NUL"),
    (b"\x00GB\n", "a NUL with next to no text"),
    (b"x" * 3000 + b"\x00" * 10 + b"y" * 3000 + b" GB\n", "text without line breaks"),
    (b"".join(b"line %d GB\n\x00" % i for i in range(200)), "many NUL runs"),
])
@pytest.mark.parametrize("fast", [False, True])
def test_binary_input_is_still_refused(data, why, fast, monkeypatch):
    with pytest.raises(L.InputError, match="binary"):
        _scan(data, fast, monkeypatch, "grep" if fast else "python")


def test_a_text_head_without_nul_has_no_note():
    stats = L.ScanStats()
    list(L.scan(io.BytesIO(b"KV Cache is allocated 1 GB\n"), ANCHORS, stats))
    assert stats.nul_runs == () and stats.dropped_bytes_note() is None
