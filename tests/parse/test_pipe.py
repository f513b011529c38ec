"""A piped log (issue 23, item 3): its head tells the engine as a file's does, and the scanner reads the rest of the
pipe itself. Through a real OS pipe into the real CLI, the audit is the file's, line numbers included, wherever
the head's boundary falls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.parse import lines as L
from tests.conftest import KIMI_LOG, cli_process

FILLER = b"[2026-02-25 10:20:01] Decode batch. #running-req: 12, #token: 40960, token usage: 0.26, gen throughput (token/s): 812.44, #queue-req: 0\n"


def _audit(r):
    assert r.code in (0, 1), r.stderr
    d = json.loads(r.stdout)
    d.pop("source", None)
    return d


def _log_with_padding(pad: int) -> bytes:
    """The Kimi startup after ``pad`` bytes of decode lines (so its lines fall either side of the pipe's head)."""
    n = pad // len(FILLER) + 1
    return FILLER * n + KIMI_LOG.read_bytes() + FILLER * 1000


@pytest.mark.parametrize("scanner", ["rg", "grep"])
@pytest.mark.parametrize("shift", [0, 1, 57, 300])
def test_a_pipe_gives_the_files_audit_wherever_the_head_ends(tmp_path, scanner, shift, monkeypatch):
    if scanner == "rg" and L._ripgrep() is None:
        pytest.skip("ripgrep not installed")
    monkeypatch.setenv("KVAUDIT_SCANNER", scanner)
    # the startup's first lines straddle the 1 MiB head (shift moves the boundary through a line)
    data = _log_with_padding(L.PIPE_HEAD_BYTES - 2000 - shift)
    f = tmp_path / "server.log"
    f.write_bytes(data)
    via_file = _audit(cli_process("explain", f, "-f", "json"))
    via_pipe = _audit(cli_process("explain", "-", "-f", "json", stdin=data))
    assert via_pipe == via_file
    assert via_pipe["formula"]["logged_tokens"] == 159277


def test_the_rest_of_a_pipe_is_read_by_the_scanner_not_by_python(tmp_path):
    """The descriptor after the head goes to the scanner as its standard input: the Python side reads the head only
    (strace-free check: the bytes it counts are the head's, and the scan still reaches the end of the input)."""
    if L.scanner() is None:
        pytest.skip("no scanner")
    data = _log_with_padding(3 << 20)
    r, w = os.pipe()
    feeder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb')"
                               ".read())", str(_write(tmp_path, data))], stdout=w)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as stream:
            fd = L.pipe_descriptor(stream)
            assert fd is not None
            head, at_end = L.read_pipe_head(fd)
            assert len(head) >= L.PIPE_HEAD_BYTES and head.endswith(b"\n") and not at_end
            stats = L.ScanStats()
            got = list(L.scan_pipe(fd, head, at_end, (b"KV Cache is allocated",), stats))
    finally:
        feeder.wait()
    assert stats.bytes_read == len(head) and stats.bytes_unknown
    expected = [i for i, line in enumerate(data.split(b"\n"), 1) if b"KV Cache is allocated" in line]
    assert [ln.number for ln in got] == expected and expected


def _write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "input.log"
    p.write_bytes(data)
    return p


def test_a_small_piped_log_ends_inside_its_head():
    r = cli_process("explain", "-", "-f", "json", stdin=KIMI_LOG.read_bytes())
    assert _audit(r)["formula"]["logged_tokens"] == 159277


def test_a_binary_pipe_and_an_empty_pipe_are_clear_errors():
    for data, words in ((b"\x00\x01binary" * 100, "binary"), (b"", "empty")):
        r = cli_process("explain", "-", stdin=data)
        assert r.code == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_pipe_that_begins_as_one_engine_and_holds_none_of_its_startups_says_to_pass_the_file(tmp_path):
    """Its head names SGLang (a line about its weights), the startup that follows is vLLM's: a file is scanned
    again with every engine's anchors and gives the vLLM audit; a pipe cannot be, and says to pass the file."""
    from tests.conftest import FIXTURES

    # the head (1 MiB of decode lines) shows only SGLang's words; vLLM's startup comes after it
    data = b"note: Memory pool end\n" + FILLER * 9000 + (FIXTURES / "corpus" / "vllm_c001.log").read_bytes()
    f = tmp_path / "mixed.log"
    f.write_bytes(data)
    as_file = cli_process("explain", f, "-f", "json")
    assert json.loads(as_file.stdout)["engine"] == "vllm", as_file.stderr
    r = cli_process("explain", "-", stdin=data)
    assert r.code == 2 and "pass the log as a file" in r.stderr and "SGLang" in r.stderr, r.stderr
