"""Reading raw log input into the few lines that matter.

A server's journal is mostly decode-batch and HTTP lines; the memory story is a few dozen lines per startup.
Only lines that contain one of the engines' anchor strings are kept, streaming, so memory stays flat in the
size of the input. :func:`scan_fast` hands that selection to ripgrep (``pip install 'kvaudit[fast]'``), else
``grep -F`` (one multi-pattern pass at disk speed), and falls back to :func:`scan`, pure Python (one
``bytes.find`` pass per anchor: fine for pastes, ~10x slower on gigabytes). All three yield the same lines;
tests hold them to it.

Cleaning, per surviving line: bytes are decoded as UTF-8 (bad bytes replaced), a JSON record (journald's,
docker's json-file) unwrapped to its message, ANSI colour codes removed,
and a line holding carriage returns (tqdm progress bars redraw with ``\\r``) is split into its segments,
each a candidate line of its own. Outer prefixes (journalctl's ``Feb 25 10:16:41 host unit[pid]:``,
docker's timestamps, box borders) are left in place: the engine grammars search for their own prefix and
message anywhere in the line, outside quoted values (``parse.interface.unquoted``).
"""

from __future__ import annotations

from kvaudit.errors import KvauditError
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from collections import deque
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, cast

from kvaudit.textsafe import printable
from kvaudit.record import record

BLOCK_SIZE = 8 << 20
#: a line longer than this is skipped (counted, never parsed): no engine prints one, a corrupt file might
MAX_LINE_BYTES = 1 << 20
#: look for NUL bytes in this much of the head of the input to call it binary
BINARY_PROBE_BYTES = 64 << 10
#: a head holding NUL bytes is still a text log (a writer's hole: a crashed writer, a log truncated while another
#: process kept appending at its old offset, leaves one run of NULs, e.g. 12,618 bytes in the middle of AMD's
#: sglang-ci Qwen3-30B server log) when the NULs come in at most this many runs, ...
MAX_NUL_RUNS = 8
#: ... the rest of the head is at least half of it and at least this many bytes, ...
MIN_TEXT_BYTES = 1 << 10
#: ... holds a line break per this many bytes on average (a log's lines are short) ...
MAX_MEAN_LINE_BYTES = 4 << 10
#: ... and at most this share of it is other control bytes (tab, line ends, form feed and ESC are a log's own).
#: UTF-16 (a NUL every other byte), an ELF or a journal file (NUL runs everywhere), compressed data (control
#: bytes everywhere) fail one of these and are refused as binary
MAX_STRAY_CONTROL_SHARE = 0.01
_NUL_RUN = re.compile(rb"\x00+")
_STRAY_CONTROL = re.compile(rb"[\x01-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f]")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


class InputError(KvauditError):
    """The input cannot be read as a log at all (empty, binary, unreadable)."""


@record
class Line:
    number: int  # 1-based line number in the input
    text: str


@dataclass
class ScanStats:
    """Filled in while :func:`scan` runs; complete once its iterator is exhausted."""

    bytes_read: int = 0
    lines_read: int = 0
    lines_kept: int = 0
    overlong_lines: int = 0
    absurd_lines: int = 0  # lines dropped for a number no engine prints (parse_lines)
    flooded_lines: int = 0  # selected lines skipped between the first and the last FLOOD_KEEP (bounded_lines)
    saw_nul: bool = False
    #: the NUL runs of a text head read as text (:func:`check_head`): (byte offset, length, line number)
    nul_runs: tuple[tuple[int, int, int], ...] = ()
    #: other control bytes (not tab, line ends, form feed, ESC) in such a head: dropped with the NULs
    stray_control_bytes: int = 0
    first_bytes: bytes = field(default=b"", repr=False)
    #: the scanner read the rest of a pipe itself (scan_pipe): bytes_read counts only the head
    bytes_unknown: bool = False

    def dropped_bytes_note(self) -> str | None:
        """What was dropped from a text head with NUL runs, and where (None when nothing was)."""
        if not self.nul_runs:
            return None
        total = sum(n for _, n, _ in self.nul_runs)
        where = "; ".join(f"{n:,} from byte {off:,} (line {line:,})" for off, n, line in self.nul_runs)
        runs = "one run" if len(self.nul_runs) == 1 else f"{len(self.nul_runs)} runs"
        stray = (f", and {self.stray_control_bytes:,} other control byte(s)," if self.stray_control_bytes else "")
        return (f"{total:,} NUL byte(s) in {runs} ({where}){stray} dropped from the first "
                f"{BINARY_PROBE_BYTES >> 10} KiB: a writer's hole in a text log (a crashed or truncated writer), "
                "the rest read as text")


#: the keys that hold the program's own line in a JSON record: journald's (``journalctl -o json``) and the
#: docker json-file driver's (``/var/lib/docker/containers/*/*-json.log``)
_JSON_MESSAGE_KEYS = ("MESSAGE", "log")
#: selected whatever the engines' anchors: ``journalctl -o json`` writes a message holding control bytes (an
#: ANSI-coloured line) as an array of byte values, none of the engines' words visible until it is decoded
TRANSPORT_ANCHORS: tuple[bytes, ...] = (b'"MESSAGE":[',)


#: selected lines kept per input: the first and the last this many. A startup selects tens to a few hundred lines
#: (a TP8 server's ranks included); a host or file that streams anchor lines without end ("KV Cache is allocated"
#: 300,000 times) would make the parse cost grow with it. The middle of such a flood is counted and skipped
FLOOD_KEEP = 10_000


def bounded_lines(lines: Iterable[Line], stats: ScanStats) -> list[Line]:
    """The first and last :data:`FLOOD_KEEP` of ``lines``, holding no more than that many at once."""
    head: list[Line] = []
    tail: deque[Line] = deque(maxlen=FLOOD_KEEP)
    beyond = 0
    for ln in lines:
        if len(head) < FLOOD_KEEP:
            head.append(ln)
        else:
            tail.append(ln)
            beyond += 1
    stats.flooded_lines += max(0, beyond - FLOOD_KEEP)
    return head + list(tail)


def unwrap_json(raw: str) -> str:
    """A JSON record's message (``{"MESSAGE": "...", ...}``), else ``raw`` as it is. The grammars read the
    program's line, not the record's quoting of it (a quoted value is data to them; see
    ``parse.interface.mask_quoted``). journald writes a message with control bytes as an array of byte values."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}") and any(f'"{k}"' in s for k in _JSON_MESSAGE_KEYS)):
        return raw
    try:
        record = json.loads(s)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(record, dict):
        return raw
    for key in _JSON_MESSAGE_KEYS:
        value = record.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
            return bytes(value).decode("utf-8", "replace")
    return raw


def clean(raw: str) -> list[str]:
    """A JSON record unwrapped to its message, ANSI codes out, CR-joined progress-bar redraws split apart, every
    other control character dropped (a log line is data: it never reaches a terminal able to act on it),
    trailing blanks dropped."""
    if raw.lstrip().startswith("{"):
        raw = unwrap_json(raw)
    if "\n" in raw:
        raw = raw.replace("\n", "\r")  # a message holding newlines (docker's json-file keeps the line's own)
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    parts = raw.split("\r") if "\r" in raw else [raw]
    return [printable(p).rstrip() for p in parts if p.strip()]


def with_transport(anchors: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The anchors plus journald's JSON form of a message with control bytes (an array of byte values holds
    none of the engines' words until :func:`unwrap_json` decodes it)."""
    return anchors + tuple(a for a in TRANSPORT_ANCHORS if a not in anchors)


def scan(stream: BinaryIO, anchors: tuple[bytes, ...], stats: ScanStats | None = None) -> Iterator[Line]:
    """Yield the cleaned lines of ``stream`` that contain at least one anchor (of a flood, the first and last
    :data:`FLOOD_KEEP`).

    Raises :class:`InputError` for input that is empty or binary.
    """
    stats = stats if stats is not None else ScanStats()
    yield from _kept(_scan_raw(stream, with_transport(anchors), stats), stats)


def _scan_raw(stream: BinaryIO, anchors: tuple[bytes, ...], stats: ScanStats) -> Iterator[tuple[int, bytes]]:
    carry = b""
    line_base = 1  # line number of the first line in the current buffer
    skipping = False  # inside an overlong line, dropping bytes until its newline
    first = True
    while True:
        block = stream.read(BLOCK_SIZE)
        if first:
            first = False
            if not block:
                raise InputError("the input is empty")
            check_head(block[:BINARY_PROBE_BYTES], stats)
        if not block:
            break
        stats.bytes_read += len(block)
        if skipping:
            nl = block.find(b"\n")
            if nl < 0:
                continue
            block = block[nl + 1 :]
            line_base += 1
            skipping = False
        buf = carry + block if carry else block
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            if len(carry) > MAX_LINE_BYTES:
                stats.overlong_lines += 1
                carry = b""
                skipping = True
            continue
        body, carry = buf[: cut + 1], buf[cut + 1 :]
        yield from _select(body, line_base, anchors, stats)
        n = body.count(b"\n")
        stats.lines_read += n
        line_base += n
        if len(carry) > MAX_LINE_BYTES:
            stats.overlong_lines += 1
            carry = b""
            skipping = True
    if carry and not skipping:
        stats.lines_read += 1
        yield from _select(carry + b"\n", line_base, anchors, stats)


def _select(body: bytes, line_base: int, anchors: tuple[bytes, ...], stats: ScanStats) -> Iterator[tuple[int, bytes]]:
    """The selected lines of ``body`` as (line number, raw bytes), in order (an overlong one counted, not kept)."""
    starts: set[int] = set()
    for anchor in anchors:
        pos = body.find(anchor)
        while pos >= 0:
            start = body.rfind(b"\n", 0, pos) + 1
            end = body.find(b"\n", pos)
            starts.add(start)
            pos = body.find(anchor, end)
            if pos < 0:
                break
    if not starts:
        return
    prev_start, prev_line = 0, line_base
    for start in sorted(starts):
        end = body.find(b"\n", start)
        raw = body[start:end]
        number = prev_line + body.count(b"\n", prev_start, start)
        prev_start, prev_line = start, number
        if len(raw) > MAX_LINE_BYTES:
            stats.overlong_lines += 1
            continue
        yield number, raw


def _kept(pairs: Iterable[tuple[int, bytes]], stats: ScanStats) -> Iterator[Line]:
    """The cleaned lines of the first and last :data:`FLOOD_KEEP` selected raw lines; the middle of a flood is only
    counted. Only what is kept is decoded and cleaned: a log of a million short anchor lines costs what finding
    them costs, not what parsing them would."""
    head = 0
    tail: deque[tuple[int, bytes]] = deque(maxlen=FLOOD_KEEP)
    beyond = 0
    for number, raw in pairs:
        if head < FLOOD_KEEP:
            head += 1
            yield from _cleaned(number, raw, stats)
        else:
            tail.append((number, raw))
            beyond += 1
    stats.flooded_lines += max(0, beyond - FLOOD_KEEP)
    for number, raw in tail:
        yield from _cleaned(number, raw, stats)


def _cleaned(number: int, raw: bytes, stats: ScanStats) -> Iterator[Line]:
    for text in clean(raw.decode("utf-8", "replace")):
        stats.lines_kept += 1
        yield Line(number, text)


def _ripgrep() -> str | None:
    """ripgrep beside this Python (``pip install 'kvaudit[fast]'`` puts it there), else on PATH."""
    beside = Path(sys.executable).with_name("rg")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("rg")


def scanner() -> list[str] | None:
    """The command that selects the anchor lines, the fastest on the machine: ripgrep (about twice grep's speed
    on a 1 GiB log, the same lines byte for byte: tests/parse/test_scanners.py), then grep; None for the
    pure-Python scanner. ``KVAUDIT_SCANNER=rg|grep|python`` chooses one (the tests and the bench compare them);
    ``KVAUDIT_NO_GREP=1`` means python. Both read standard input and print ``NUM:line`` for every line holding
    one of the fixed strings that follow as ``-e A -e B ...``."""
    choice = os.environ.get("KVAUDIT_SCANNER", "").strip().lower()
    if os.environ.get("KVAUDIT_NO_GREP") or choice == "python":
        return None
    if choice in ("", "rg"):
        rg = _ripgrep()
        if rg is not None:
            # no config file (RIPGREP_CONFIG_PATH could add any flag), every byte as it is (no BOM sniffing,
            # no transcoding of UTF-16), standard input only
            # "-": read standard input, never search a directory (the patterns follow as -e options)
            return [rg, "--no-config", "--encoding", "none", "-a", "-n", "-F", "--no-heading", "--color", "never",
                    "-"]
    grep = shutil.which("grep")
    return [grep, "-a", "-n", "-F"] if grep else None


def scan_fast(stream: BinaryIO, anchors: tuple[bytes, ...], stats: ScanStats | None = None,
              while_scanning: Callable[[], object] | None = None) -> Iterator[Line]:
    """Like :func:`scan`, with ripgrep or grep (:func:`scanner`) selecting the lines when one exists.
    ``while_scanning`` is called once the scanner runs, before its first line is read: work the caller needs next
    (a grammar's import) done on this core while the scanner reads a big file on another."""
    anchors = with_transport(anchors)
    stats = stats if stats is not None else ScanStats()
    base = scanner()
    if base is None:
        yield from scan(stream, anchors, stats)
        return
    origin = _regular_file_offset(stream)
    head = stream.read(BINARY_PROBE_BYTES)
    check_head(head, stats)
    feeder = None
    if origin is not None:
        stream.seek(origin)
        stats.bytes_read = os.fstat(stream.fileno()).st_size - origin
        proc = _start_scanner(base, anchors, stream)
    else:
        proc = _start_scanner(base, anchors, subprocess.PIPE)
        feeder = threading.Thread(target=_feed, args=(proc, head, stream, stats), daemon=True)
        feeder.start()
    assert proc.stdout is not None
    last = 0

    def selected() -> Iterator[tuple[int, bytes]]:
        nonlocal last
        for number, body in _grep_output(cast(BinaryIO, proc.stdout), stats):
            last = stats.lines_read = number
            yield number, body

    try:
        if while_scanning is not None:
            while_scanning()  # inside the try: an import that fails still ends the scanner below
        yield from _kept(selected(), stats)
    except BaseException:
        proc.kill()  # nobody reads the rest (an error, Ctrl-C, the reader stopped): not a whole file's scan to wait for
        raise
    finally:
        proc.stdout.close()
        err = proc.stderr.read(4096) if proc.stderr else b""
        code = proc.wait()
        if feeder is not None:
            feeder.join(timeout=5)
    if _out_of_memory(code, err):
        # a line longer than grep may hold (its memory is capped): grep stops there. A file is read again by
        # the pure-Python scanner, which skips overlong lines in bounded memory; a pipe cannot be read again.
        if origin is None:
            raise InputError(PIPE_LINE_TOO_LONG)
        stream.seek(origin)
        stats.bytes_read = stats.lines_read = 0
        for line in scan(stream, anchors, stats):
            if line.number > last:
                yield line
        return
    _check_exit(base, code, err)


PIPE_LINE_TOO_LONG = (f"the piped input has a line far over {MAX_LINE_BYTES >> 20} MiB; save it to a file and pass "
                      "the file (its overlong lines are then skipped)")


BINARY_INPUT = ("the input is binary, not a text log (for a journal file use "
                "'journalctl --file FILE -o cat -a | kvaudit explain -')")


def check_head(head: bytes, stats: ScanStats) -> None:
    """The input's first bytes: not empty, not binary. A head with NUL bytes is binary unless it is a text log
    with a few holes (the bounds above); then its NUL runs are recorded for the note, and the cleaning drops
    them (and any other control byte) from the lines like every control character."""
    if not head:
        raise InputError("the input is empty")
    stats.first_bytes = head[:4096]
    probe = head[:BINARY_PROBE_BYTES]
    if b"\x00" not in probe:
        return
    stats.saw_nul = True
    runs = []
    for m in _NUL_RUN.finditer(probe):
        runs.append(m)
        if len(runs) > MAX_NUL_RUNS:
            raise InputError(BINARY_INPUT)
    text = len(probe) - sum(m.end() - m.start() for m in runs)
    stray = len(_STRAY_CONTROL.findall(probe))
    if (text < MIN_TEXT_BYTES or 2 * text < len(probe) or probe.count(b"\n") * MAX_MEAN_LINE_BYTES < text
            or stray > MAX_STRAY_CONTROL_SHARE * text):
        raise InputError(BINARY_INPUT)
    stats.nul_runs = tuple((m.start(), m.end() - m.start(), probe.count(b"\n", 0, m.start()) + 1) for m in runs)
    stats.stray_control_bytes = stray


def _start_scanner(base: list[str], anchors: tuple[bytes, ...], stdin) -> subprocess.Popen:
    cmd = list(base)
    for a in anchors:
        cmd += ["-e", os.fsdecode(a)]  # round-trips any byte (a non-ASCII anchor reaches grep as its own bytes)
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, LC_ALL="C"), preexec_fn=_limit_grep_memory)


def _out_of_memory(code: int, err: bytes) -> bool:
    """grep says "memory exhausted"; ripgrep says "memory allocation of N bytes failed" and aborts."""
    return (code > 1 and b"memory" in err.lower()) or code < 0


def _check_exit(base: list[str], code: int, err: bytes) -> None:
    if code > 1:
        name = os.path.basename(base[0])
        raise InputError(f"{name} failed: {err.decode('utf-8', 'replace').strip() or f'exit status {code}'}")


#: grep's address space: far more than it needs for lines up to MAX_LINE_BYTES, far less than a 3 GB line
GREP_MEMORY = 256 << 20


def _limit_grep_memory() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = GREP_MEMORY if hard == resource.RLIM_INFINITY else min(GREP_MEMORY, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass


def _grep_output(out: BinaryIO, stats: ScanStats) -> Iterator[tuple[int, bytes]]:
    """``NUM:line`` records from grep, read in bounded pieces: a line over MAX_LINE_BYTES is counted and
    skipped without ever being held whole."""
    limit = MAX_LINE_BYTES + 32
    while True:
        raw = out.readline(limit)
        if not raw:
            return
        if not raw.endswith(b"\n") and len(raw) >= limit:
            stats.overlong_lines += 1
            while raw and not raw.endswith(b"\n"):
                raw = out.readline(limit)
            continue
        num, _, body = raw.partition(b":")
        body = body.rstrip(b"\n")
        if len(body) > MAX_LINE_BYTES:
            stats.overlong_lines += 1
            continue
        yield int(num), body


def _regular_file_offset(stream: BinaryIO) -> int | None:
    """Where ``stream`` stands, when it is a seekable regular file that grep can read directly."""
    try:
        if stat.S_ISREG(os.fstat(stream.fileno()).st_mode) and stream.seekable():
            return stream.tell()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both OSError and ValueError
        return None
    return None


def _feed(proc: subprocess.Popen, head: bytes, stream: BinaryIO, stats: ScanStats) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(head)
        stats.bytes_read += len(head)
        while True:
            block = stream.read(BLOCK_SIZE)
            if not block:
                break
            stats.bytes_read += len(block)
            proc.stdin.write(block)
    except (BrokenPipeError, OSError, ValueError):
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


# --- a pipe, read by the scanner itself ----------------------------------------------------------------------
# A pipe cannot be read twice, and every byte copied through Python costs (issue 23: 5.0 s for 1 GiB against
# 3.7 s for cat | grep). So its head is read here, by the descriptor (never through a buffer that could hold bytes
# the scanner would then miss), up to a line's end; the head tells the engine, as a file's does; and the rest of
# the pipe is the scanner's own standard input: the scanner reads it, not Python.

#: the head of a pipe read before the scan (the engine is told from it); then on to the end of its last line
PIPE_HEAD_BYTES = 1 << 20
PIPE_HEAD_LINE_MAX = 64 << 10


def pipe_descriptor(stream: BinaryIO) -> int | None:
    """The descriptor of ``stream`` when it is an unread pipe or socket the scanner can take over (a scanner is
    installed); None otherwise (a file, a terminal, an in-memory stream: read as before)."""
    import io

    if scanner() is None or not isinstance(stream, (io.BufferedReader, io.FileIO)):
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


def read_pipe_head(fd: int) -> tuple[bytes, bool]:
    """The head of the pipe, ending at a line's end (or at the end of the input: then True)."""
    parts: list[bytes] = []
    size = 0
    while size < PIPE_HEAD_BYTES:
        block = os.read(fd, min(BLOCK_SIZE, PIPE_HEAD_BYTES - size))
        if not block:
            return b"".join(parts), True
        parts.append(block)
        size += len(block)
    head = b"".join(parts)
    if head.endswith(b"\n"):
        return head, False
    tail = bytearray()  # one byte at a time: what is read past the line's end would be lost to the scanner
    while len(tail) < PIPE_HEAD_LINE_MAX:
        b = os.read(fd, 1)
        if not b:
            return head + bytes(tail), True
        tail += b
        if b == b"\n":
            return head + bytes(tail), False
    return head + bytes(tail), False  # a line over 64 KiB straddles: its two pieces are scanned apart


def scan_pipe(fd: int, head: bytes, at_end: bool, anchors: tuple[bytes, ...],
              stats: ScanStats | None = None) -> Iterator[Line]:
    """The lines of a pipe whose head was read (:func:`read_pipe_head`): the head through the scanner, then the
    rest of the pipe as the scanner's own standard input, its line numbers counted on from the head's."""
    anchors = with_transport(anchors)
    stats = stats if stats is not None else ScanStats()
    check_head(head, stats)
    base = scanner() or []
    stats.bytes_read = len(head)
    offset = head.count(b"\n")

    def run(stdin, feed: bytes | None) -> Iterator[tuple[int, bytes]]:
        proc = _start_scanner(base, anchors, stdin)
        feeder = None
        if feed is not None:
            feeder = threading.Thread(target=_write_all, args=(proc, feed), daemon=True)
            feeder.start()
        try:
            yield from _grep_output(proc.stdout, stats)  # type: ignore[arg-type]
        finally:
            proc.stdout.close()  # type: ignore[union-attr]
            err = proc.stderr.read(4096) if proc.stderr else b""
            code = proc.wait()
            if feeder is not None:
                feeder.join(timeout=5)
        if _out_of_memory(code, err):
            raise InputError(PIPE_LINE_TOO_LONG)
        _check_exit(base, code, err)

    def selected() -> Iterator[tuple[int, bytes]]:
        for number, body in run(subprocess.PIPE, head):
            stats.lines_read = number
            yield number, body
        if at_end:
            stats.lines_read = max(stats.lines_read, offset + (0 if head.endswith(b"\n") else 1))
            return
        stats.bytes_unknown = True  # the scanner read the rest: how much, only it knows
        for number, body in run(fd, None):
            stats.lines_read = offset + number
            yield offset + number, body

    yield from _kept(selected(), stats)


def _write_all(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)  # type: ignore[union-attr]
    except (BrokenPipeError, OSError, ValueError):
        pass
    finally:
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
