"""``kvaudit explain``: from a log (file or stream) to audits. Orchestration only; no formatting."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import BinaryIO

from kvaudit.engines import ENGINES, RECOGNISED_ONLY, Engine, all_anchors
from kvaudit.parse.interface import Startup
from kvaudit.parse.memory_lines import is_memory_line, uninterpreted
from kvaudit.parse.patterns import lazy
from kvaudit.parse.request_time import ANCHORS as SERVING_ANCHORS, SERVING, set_aside
from kvaudit.parse.lines import (FLOOD_KEEP, InputError, Line, ScanStats, bounded_lines, pipe_descriptor,
                                 read_pipe_head, scan_fast, scan_pipe)
from kvaudit.platforms import ANCHORS as PLATFORM_ANCHORS, Platform, detect
from kvaudit.reconcile.interface import Audit, AuditOptions, WhatIf
from kvaudit.verdict import unread
from kvaudit.record import record

#: the platform words as text (kvaudit.platforms): lines whose join holds none of them name no platform
_PLATFORM_WORDS = tuple(a.decode() for a in PLATFORM_ANCHORS)


class NoStartupError(InputError):
    """The input is text but holds no startup of any engine kvaudit can audit."""


@record
class ParsedLog:
    engine: Engine
    startups: tuple[Startup, ...]
    stats: ScanStats
    #: a unified-memory platform the lines name (kvaudit.platforms), None when they name none
    platform: Platform | None = None
    #: the selected lines (after :func:`_sane`): those that state an amount of memory and that no grammar read are
    #: listed with the audit (kvaudit.parse.memory_lines.uninterpreted; only the unread lines of the startup's span
    #: are tested for memory words, a fleet's host at a time)
    lines: tuple[Line, ...] = ()


#: how much of a seekable input's head tells which engine wrote it
HEAD_BYTES = 1 << 20


def read_log(stream: BinaryIO) -> ParsedLog:
    """Select the memory lines and parse them. When the head of a seekable input shows exactly one engine's
    startup lines, only that engine's anchors are scanned for (fewer strings: a faster scan of a big log);
    otherwise, or when that finds no startup, all engines' anchors are. A pipe: see :func:`_read_pipe`."""
    fd = pipe_descriptor(stream)
    if fd is not None:
        return _read_pipe(fd)
    engine = _engine_from_head(stream)
    if engine is not None:
        start = stream.tell()
        stats = ScanStats()
        try:
            # the engine's grammar and formula are imported while the scanner reads the file (a big log: ~30 ms
            # of imports hidden behind its scan on a second core)
            lines = scan_fast(stream, scan_anchors(engine), stats, while_scanning=engine.preload)
            return parse_lines(bounded_lines(lines, stats), stats)
        except NoStartupError:
            stream.seek(start)
    stats = ScanStats()
    return parse_lines(bounded_lines(scan_fast(stream, all_anchors(), stats), stats), stats)


def scan_anchors(engine: Engine | None) -> tuple[bytes, ...]:
    """The strings a log whose head names ``engine`` is scanned for: that engine's, the platforms' and the
    serving lines' (every engine's when the head names none or several). The scanner adds the transport's
    (``lines.with_transport``)."""
    return engine.words.anchors + PLATFORM_ANCHORS + SERVING_ANCHORS if engine is not None else all_anchors()


def _read_pipe(fd: int) -> ParsedLog:
    """A pipe, read once: its head tells the engine as a file's does, and the scanner reads the rest itself. A file
    whose engine-anchored scan finds no startup is scanned again with every engine's anchors; a pipe cannot be read
    again, so then the error says so and asks for the file (looking for the other engines' words as well would
    double the scan: 30 more strings)."""
    head, at_end = read_pipe_head(fd)
    engine = _engine_of(head.decode("utf-8", "replace"))
    stats = ScanStats()
    lines = bounded_lines(scan_pipe(fd, head, at_end, scan_anchors(engine), stats), stats)
    try:
        return parse_lines(lines, stats)
    except NoStartupError as exc:
        if engine is None:
            raise
        raise NoStartupError(
            f"{exc}; the piped log begins as {engine.display}'s, so only {engine.display}'s lines were looked for: "
            "if another engine's startup follows, pass the log as a file (a file is read again with every engine's "
            "anchors)") from None


def _engine_of(head: str) -> Engine | None:
    hits = [e for e in ENGINES if any(m in head for m in e.words.markers)]
    return hits[0] if len(hits) == 1 else None


def _engine_from_head(stream: BinaryIO) -> Engine | None:
    try:
        if not stream.seekable():
            return None
        start = stream.tell()
        head = stream.read(HEAD_BYTES).decode("utf-8", "replace")
        stream.seek(start)
    except (OSError, ValueError, AttributeError):
        return None
    return _engine_of(head)


#: a number no engine prints in a memory line (a 19-digit nanosecond timestamp is the longest real one): a line
#: holding one is hostile or corrupt, and its numbers would overflow the arithmetic. Only a number standing on its
#: own counts: digits inside an identifier (a Hugging Face snapshot hash such as ``...1e950...``, a UUID, a run
#: id) are never parsed as a number, so they never make a line be skipped; a unit may follow (``1e999GB``)
_ABSURD_NUMBER = re.compile(r"(?<![\w.])(?:\d{25,}|\d+(?:\.\d+)?[eE]\+?\d{3,})(?![0-9a-fA-F_-])")
#: what every absurd number holds (25 digits in a row, or a 3-digit exponent): two searches with a cheap start
#: that rule most hosts' lines out before the full pattern (which tries every digit) runs
_ABSURD_EXPONENT = re.compile(r"[eE]\+?\d{3}")
_ABSURD_DIGITS = re.compile(r"\d{25}")


#: request payloads in the OpenAI shape, whatever engine logs them (each grammar adds its own markers)
GENERIC_REQUEST_MARKERS = ("'messages':", '"messages":')


def request_markers() -> tuple[str, ...]:
    return GENERIC_REQUEST_MARKERS + tuple(m for e in ENGINES for m in e.words.request_markers)


def parse_lines(lines: list[Line], stats: ScanStats | None = None) -> ParsedLog:
    """The startups in the selected lines, by the grammar of the engine that wrote them. When the lines carry the
    markers of exactly one engine (:func:`_engine_of`), that engine's grammar reads them alone (one grammar instead
    of every one: a fleet parses each host's lines); when it finds no startup there, or the markers name no engine
    or several, every grammar reads them, and a mixed log is told as before."""
    stats = stats or ScanStats()
    if len(lines) > 2 * FLOOD_KEEP:  # lines that did not come through read_log's scan (check, kube): the same bound
        lines = bounded_lines(lines, stats)
    lines = _sane(lines, stats)
    text = "\n".join(ln.text for ln in lines)  # no marker spans a line's end
    found: list[tuple[Engine, list[Startup]]] = []
    known = _engine_of(text)
    if known is not None:
        startups = known.parser.parse(lines)
        if startups:
            found.append((known, startups))
    if not found:
        for engine in ENGINES:
            if engine is known:
                continue  # read above, with no startup found
            startups = engine.parser.parse(lines)
            if startups:
                found.append((engine, startups))
    if len(found) > 1:
        # a stray line that one grammar also accepts must not hide the other: the engine with clearly more
        # memory lines wins; comparable evidence for two engines is a mixed log
        counts = sorted(((sum(len(s.events) for s in st), e, st) for e, st in found), key=lambda x: -x[0])
        if counts[0][0] >= 4 * counts[1][0]:
            found = [(counts[0][1], counts[0][2])]
        else:
            names = " and ".join(e.display for e, _ in found)
            raise NoStartupError(f"the input mixes {names} startup lines; split it per server (--source file:...)")
    if not found:
        head = stats.first_bytes.decode("utf-8", "replace")
        foreign = [name for name, markers in RECOGNISED_ONLY.items()
                   if any(m in head for m in markers) or any(m in text for m in markers)]
        if foreign:
            raise NoStartupError(
                f"this looks like {'an' if foreign[0][0] in 'AEILMNORSX' else 'a'} {foreign[0]} log; kvaudit reads "
                f"{engine_names()} logs in this version")
        what = (f"{stats.lines_read:,} lines read from a pipe" if stats.bytes_unknown
                else f"{stats.bytes_read:,} bytes read")
        if stats.overlong_lines:
            what += f", {stats.overlong_lines} line(s) over 1 MiB skipped"
        if stats.absurd_lines:
            what += f", {stats.absurd_lines} line(s) with an absurd number skipped"
        if stats.flooded_lines:
            what += f", {stats.flooded_lines:,} memory line(s) in the middle of a flood skipped"
        memory = [ln for ln in lines if is_memory_line(ln.text)]
        if memory:  # said, never passed over: which lines state memory in shapes no grammar reads (issue 33)
            first = memory[0]
            many = len(memory) != 1
            what += (f"; {len(memory):,} line{'s' if many else ''} state{'' if many else 's'} memory in shapes kvaudit "
                     f"does not read, e.g. line {first.number}: {first.text.strip()[:160]!r}")
        raise NoStartupError(f"no {engine_names(' or ')} startup lines found ({what})")
    engine, startups = found[0]
    startups = set_aside(engine.name, startups, lines)  # what a request could have written (issue 39)
    # no platform word spans a line's end: one search of the joined lines rules most hosts' lines out at once
    platform = detect(ln.text for ln in lines) if any(w in text for w in _PLATFORM_WORDS) else None
    return ParsedLog(engine, tuple(startups), stats, platform, tuple(lines))


#: what a server that failed after it began serving prints, in any engine's log: an exception, an error-level
#: line, out of memory, a fatal signal (an engine's own error tag, TensorRT-LLM's "[E]", is not needed: its
#: errors carry the exception too)
_SERVING_FAILURE = lazy(r"Traceback \(most recent call last\)|\bERROR\b|\w(?:Error|Exception): |out of memory|"
                        r"OutOfMemory|Segmentation fault|Fatal Python error|core dumped")


def _failed_while_serving(log: ParsedLog, startup: Startup) -> str | None:
    """A note where the server failed after it began serving (before the next startup, if any): its startup is
    audited as it was, and the failure is not taken for the startup's (that would call a good start failed), but
    it is said: an operator reading the audit of a dead server must not take it for a live one."""
    end = min((s.first_line for s in log.startups if s.first_line > startup.last_line), default=None)
    serving = SERVING.get(log.engine.name)
    served = startup.serving_line
    for ln in log.lines:
        if ln.number <= (served or startup.last_line) or (end is not None and ln.number >= end):
            continue
        if served is None:
            if serving is not None and serving.search(ln.text):
                served = ln.number
            continue
        if _SERVING_FAILURE.search(ln.text):
            return (f"line {ln.number}: the server failed after it began serving (line {served}): "
                    f"{ln.text.strip()[:160].rstrip('.')}; not a failure of the startup audited here")
    return None


def _sane(lines: list[Line], stats: ScanStats) -> list[Line]:
    """The lines without an absurd number or a request's payload (counted in ``stats``). Both are looked for in
    the lines joined first (neither spans a line's end): most hosts' lines hold neither, and one search over
    the text is cheaper than one per line."""
    markers = request_markers()
    text = "\n".join(ln.text for ln in lines)
    absurd = (_ABSURD_EXPONENT.search(text) or _ABSURD_DIGITS.search(text)) and _ABSURD_NUMBER.search(text)
    if not absurd and not any(m in text for m in markers):
        return lines
    sane = [ln for ln in lines if not _ABSURD_NUMBER.search(ln.text) and not any(m in ln.text for m in markers)]
    stats.absurd_lines += len(lines) - len(sane)
    return sane


def engine_names(last: str = " and ") -> str:
    names = [e.display for e in ENGINES]
    return ", ".join(names[:-1]) + last + names[-1] if len(names) > 1 else names[0]


def select(log: ParsedLog, startup: int | None) -> list[Startup]:
    """``startup``: 1-based index, negative counts from the end, None = the latest."""
    n = len(log.startups)
    if startup is None:
        return [log.startups[-1]]
    idx = startup - 1 if startup > 0 else n + startup
    if startup == 0 or not 0 <= idx < n:
        raise InputError(f"--startup {startup}: the input holds {n} startup(s) (use 1..{n}, or -1 for the latest)")
    return [log.startups[idx]]


def audit(log: ParsedLog, opts: AuditOptions, startup: int | None = None, all_startups: bool = False) -> list[Audit]:
    chosen = list(log.startups) if all_startups else select(log, startup)
    opts = with_platform(opts, log)
    return [with_input_notes(log.engine.audit(s, opts, len(log.startups)), log, s) for s in chosen]


def with_platform(opts: AuditOptions, log: ParsedLog) -> AuditOptions:
    """The platform the user or a reading named, else the one the log's own lines name."""
    return opts if opts.platform is not None or log.platform is None else replace(opts, platform=log.platform)


def with_input_notes(a: Audit, log: ParsedLog, startup: Startup) -> Audit:
    """What the reading of the input skipped, said in the audit (a skipped line may have held a reading), and
    the memory lines of the startup that no grammar read (listed, never ignored: kvaudit.verdict.unread)."""
    aside = set(startup.aside_lines)  # named in the notes already (kvaudit.parse.request_time)
    # the startup's span only: uninterpreted() tests these (not its events' lines) for memory words. The first
    # startup's runs from the input's first line: a memory line before the first line its grammar read (an HPU
    # worker's weights and budget lines before its block line, corpus vllm_c084) is listed, never dropped
    # (a line before it that names the platform was read, by kvaudit.platforms: not listed)
    begin = 1 if startup.first_line == min(s.first_line for s in log.startups) else startup.first_line
    span = [ln for ln in log.lines
            if begin <= ln.number <= startup.last_line and ln.number not in aside
            and (ln.number >= startup.first_line or detect([ln.text]) is None)]
    serving = startup.serving_line
    # the startup's own memory lines are listed with it (rule 9); those a serving server printed later (a sleep,
    # a reload, or text a request wrote) are counted in a note, never taken for what its startup lacks
    a = unread(a, *uninterpreted([ln for ln in span if serving is None or ln.number <= serving], startup,
                                 begin=begin))
    notes = list(startup.set_aside)
    if serving is not None:
        later, n_later = uninterpreted([ln for ln in span if ln.number > serving], startup)
        if n_later:
            shown = ", ".join(str(n) for n, _ in later[:5]) + (f" and {n_later - 5:,} more" if n_later > 5 else "")
            notes.append(f"{n_later:,} memory line{'s' if n_later != 1 else ''} after the server began serving "
                         f"(line {serving}) {'were' if n_later != 1 else 'was'} not read as its startup's (line"
                         f"{'s' if n_later != 1 else ''} {shown}): the running server's, or text a request wrote")
    if (failed := _failed_while_serving(log, startup)) is not None:
        notes.append(failed)
    if log.stats.absurd_lines:
        notes.append(f"{log.stats.absurd_lines} line(s) skipped: they hold a number no engine prints (25+ digits, or "
                     "a 3-digit exponent)")
    if log.stats.flooded_lines:
        notes.append(f"{log.stats.flooded_lines:,} memory line(s) skipped: the input holds more than "
                     f"{2 * FLOOD_KEEP:,}, so only the first and the last {FLOOD_KEEP:,} were read (a startup logs a "
                     "few hundred; a flood of them is not a server starting)")
    if (dropped := log.stats.dropped_bytes_note()) is not None:
        notes.append(dropped)
    return replace(a, notes=a.notes + tuple(notes)) if notes else a


def what_if(log: ParsedLog, opts: AuditOptions, new_opts: AuditOptions,
            startup: int | None = None) -> tuple[Audit, WhatIf]:
    (s,) = select(log, startup)
    opts = with_platform(opts, log)
    base = log.engine.audit(s, opts, len(log.startups))
    return base, log.engine.whatif(s, opts, base, replace(new_opts, source=opts.source))
