"""parse.lines: the block scanner and line cleaning."""

from __future__ import annotations

import io

import pytest

from kvaudit.parse import lines as L


def scan_all(data: bytes, anchors=(b"GB",), block: int | None = None, monkeypatch=None):
    stats = L.ScanStats()
    return list(L.scan(io.BytesIO(data), anchors, stats)), stats


def test_keeps_only_anchor_lines_with_their_line_numbers():
    data = b"noise 1\nKV 2 GB\nnoise 3\n\nmore 5 GB\nlast"
    got, stats = scan_all(data)
    assert [(l.number, l.text) for l in got] == [(2, "KV 2 GB"), (5, "more 5 GB")]
    assert stats.lines_read == 6


def test_line_numbers_survive_block_boundaries(monkeypatch):
    monkeypatch.setattr(L, "BLOCK_SIZE", 7)
    data = b"".join(f"line {i} {'GB' if i % 3 == 0 else 'x'}\n".encode() for i in range(1, 40))
    got, _ = scan_all(data)
    assert [l.number for l in got] == [i for i in range(1, 40) if i % 3 == 0]
    assert all(l.text == f"line {l.number} GB" for l in got)


def test_carriage_returns_split_progress_bars_and_ansi_is_removed():
    data = b"\x1b[32mCapturing 10%|\x1b[0m\rCapturing 100% 1 GB\r[2026-01-01 00:00:00 TP0] Memory pool end. avail mem=1.00 GB\r\n"
    got, _ = scan_all(data)
    assert [l.text for l in got] == ["Capturing 10%|", "Capturing 100% 1 GB",
                                     "[2026-01-01 00:00:00 TP0] Memory pool end. avail mem=1.00 GB"]
    assert {l.number for l in got} == {1}


def test_crlf_and_trailing_blanks():
    got, _ = scan_all(b"a GB  \r\n\r\nb GB\r\n")
    assert [l.text for l in got] == ["a GB", "b GB"]


def test_empty_input_is_an_input_error():
    with pytest.raises(L.InputError, match="empty"):
        scan_all(b"")


def test_binary_input_is_an_input_error():
    with pytest.raises(L.InputError, match="binary"):
        scan_all(b"LPKSHHRH\x00\x00\x00\x01" + b"GB" * 100)


def test_overlong_line_is_skipped_and_counted(monkeypatch):
    monkeypatch.setattr(L, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(L, "BLOCK_SIZE", 256)
    data = b"first GB\n" + b"x" * 5000 + b" GB\nafter GB\n"
    got, stats = scan_all(data)
    assert [(l.number, l.text) for l in got] == [(1, "first GB"), (3, "after GB")]
    assert stats.overlong_lines == 1


def test_invalid_utf8_is_replaced_not_fatal():
    got, _ = scan_all(b"caf\xe9 1 GB\n")
    assert got[0].text == "caf\ufffd 1 GB"


# --- the grep-backed scanner must select exactly what the pure-Python one does ---------------------------

import os  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.conftest import KIMI_LOG, SAMPLES  # noqa: E402

#: every engine kvaudit reads
ALL_INPUTS = [KIMI_LOG, *sorted(SAMPLES.glob("*.log"))]


def _both(data: bytes, anchors, tmp_path: Path):
    from kvaudit.engines import all_anchors

    anchors = anchors or all_anchors()
    pure = list(L.scan(io.BytesIO(data), anchors))
    piped = list(L.scan_fast(io.BytesIO(data), anchors))
    p = tmp_path / "in.log"
    p.write_bytes(data)
    with p.open("rb") as fh:
        direct = list(L.scan_fast(fh, anchors))
    return pure, piped, direct


#: the external line selectors (issue 23, item 3): each must select exactly what the pure-Python scanner does
SCANNERS = [pytest.param("grep"), pytest.param("rg", marks=pytest.mark.skipif(
    L._ripgrep() is None, reason="ripgrep not installed (make test installs it: pip's ripgrep wheel)"))]


@pytest.fixture(params=SCANNERS)
def scanner(request, monkeypatch):
    monkeypatch.setenv("KVAUDIT_SCANNER", request.param)
    assert os.path.basename(L.scanner()[0]) == request.param  # the one asked for, not a fallback
    return request.param


@pytest.mark.parametrize("path", ALL_INPUTS, ids=[p.stem for p in ALL_INPUTS])
def test_external_and_python_scanners_agree(path, tmp_path, scanner):
    pure, piped, direct = _both(path.read_bytes(), None, tmp_path)
    assert pure == piped == direct
    assert pure


def test_scanners_agree_on_awkward_bytes(tmp_path, scanner):
    # CRLF, ANSI, a carriage-return redraw, bytes that look like a UTF-16 byte-order mark (at the start of a line
    # and of the input: ripgrep would transcode without --encoding none), invalid UTF-8, no final newline
    data = (b"\xff\xfe GB first\na GB\r\n\x1b[1mb GB\x1b[0m\rc GB\n\xff\xfe GB\n\nno match\ncaf\xe9 GB\n"
            b"last GB")
    pure, piped, direct = _both(data, (b"GB",), tmp_path)
    assert pure == piped == direct
    assert [l.number for l in pure] == [1, 2, 3, 3, 4, 7, 8]


def test_without_grep_the_python_scanner_is_used(monkeypatch):
    monkeypatch.setenv("KVAUDIT_NO_GREP", "1")
    got = list(L.scan_fast(io.BytesIO(b"x GB\n"), (b"GB",)))
    assert [l.text for l in got] == ["x GB"]


def test_fast_scanner_refuses_empty_and_binary():
    with pytest.raises(L.InputError, match="empty"):
        list(L.scan_fast(io.BytesIO(b""), (b"GB",)))
    with pytest.raises(L.InputError, match="binary"):
        list(L.scan_fast(io.BytesIO(b"\x00GB\n"), (b"GB",)))


def test_a_huge_single_line_is_skipped_in_bounded_memory(tmp_path):
    """A 400 MB line holding an anchor (issue #10: a 3 GB line made grep use 3.5 GB): grep's memory is capped,
    the file is read again by the bounded scanner, the line is skipped, the rest of the log is audited."""
    from tests.conftest import SAMPLES, cli_limited

    p = tmp_path / "huge.log"
    with p.open("wb") as fh:
        fh.write((SAMPLES / "sglang_029.log").read_bytes())
        fh.write(b"x" * (200 << 20) + b" max_total_num_tokens=1, " + b"y" * (200 << 20) + b"\n")
    rc, err = cli_limited("explain", p, "-f", "json", address_space=700 << 20)
    assert rc in (0, 1), err


def test_a_flood_of_anchor_lines_keeps_the_first_and_last_and_says_how_many_it_skipped(tmp_path):
    """issue 21, item 2: a host or file streaming "KV Cache is allocated" without end made the parse cost grow
    with it (300,000 lines: about two minutes and a third of a GiB here; an SSH host's took 882 s and 868 MB).
    The first and last FLOOD_KEEP selected lines are read, the rest counted and said."""
    import time

    from kvaudit.parse.lines import FLOOD_KEEP
    from tests.conftest import FIXTURES, cli

    line = "[2026-05-25 18:04:05 TP0] KV Cache is allocated. #tokens: 238809, K size: 2.73 GB, V size: 2.73 GB\n"
    head = (FIXTURES / "corpus" / "sglang_c006.log").read_text(encoding="utf-8")
    flood = tmp_path / "flood.log"
    flood.write_text(head + line * 300_000, encoding="utf-8")
    start = time.monotonic()
    r = cli("explain", flood, "-f", "json")
    took = time.monotonic() - start
    assert r.code in (0, 1, 3) and "Traceback" not in r.stderr, r.stderr
    notes = " ".join(r.json()["notes"])
    assert "memory line(s) skipped" in notes and f"the last {FLOOD_KEEP:,}" in notes, notes
    assert took < 60, took  # was about 120 s on the development machine; bounded now (a margin for a loaded one)


def _children() -> set[int]:
    """This process's child processes (every thread's: /proc/self/task/*/children)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            pids |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("scanner", SCANNERS)
def test_work_done_while_the_scanner_reads_that_fails_ends_the_scanner(tmp_path, monkeypatch, scanner):
    """scan_fast's ``while_scanning`` (explain imports the engine's grammar there) runs once the scanner has
    started: when it raises (an import error, Ctrl-C), the scanner is ended and reaped, not left reading."""
    monkeypatch.setenv("KVAUDIT_SCANNER", scanner)
    big = tmp_path / "big.log"
    with big.open("wb") as out:
        for _ in range(400):
            out.write(KIMI_LOG.read_bytes())
    before = _children()

    def fail() -> None:
        raise KeyboardInterrupt

    with big.open("rb") as fh, pytest.raises(KeyboardInterrupt):
        list(L.scan_fast(fh, (b"KV Cache",), L.ScanStats(), while_scanning=fail))
    assert _children() <= before
