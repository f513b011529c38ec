"""``kvaudit explain``: from a log (file or stream) to audits. Orchestration only; no formatting."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import BinaryIO

from kvaudit.engines import ENGINES, RECOGNISED_ONLY, Engine, all_anchors
from kvaudit.parse.interface import Startup
from kvaudit.parse.lines import InputError, Line, ScanStats, scan_fast
from kvaudit.reconcile.interface import Audit, AuditOptions, WhatIf


class NoStartupError(InputError):
    """The input is text but holds no startup of any engine kvaudit can audit."""


@dataclass(frozen=True)
class ParsedLog:
    engine: Engine
    startups: tuple[Startup, ...]
    stats: ScanStats


def read_log(stream: BinaryIO) -> ParsedLog:
    stats = ScanStats()
    lines = list(scan_fast(stream, all_anchors(), stats))
    return parse_lines(lines, stats)


def parse_lines(lines: list[Line], stats: ScanStats | None = None) -> ParsedLog:
    stats = stats or ScanStats()
    found: list[tuple[Engine, list[Startup]]] = []
    for engine in ENGINES:
        startups = engine.parser.parse(lines)
        if startups:
            found.append((engine, startups))
    foreign = [name for name, markers in RECOGNISED_ONLY.items()
               if sum(1 for ln in lines if any(m in ln.text for m in markers)) >= 1]
    if len(found) > 1:
        names = " and ".join(e.display for e, _ in found)
        raise NoStartupError(f"the input mixes {names} startup lines; split it per server")
    if not found:
        if foreign:
            raise NoStartupError(
                f"this looks like a {foreign[0]} log; kvaudit explain reads SGLang logs in this version")
        what = f"{stats.bytes_read:,} bytes read"
        if stats.overlong_lines:
            what += f", {stats.overlong_lines} line(s) over 1 MiB skipped"
        raise NoStartupError(f"no SGLang startup lines found ({what})")
    engine, startups = found[0]
    return ParsedLog(engine, tuple(startups), stats)


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
    return [log.engine.reconcile(s, opts, len(log.startups)) for s in chosen]


def what_if(log: ParsedLog, opts: AuditOptions, new_opts: AuditOptions, startup: int | None = None) -> tuple[Audit, WhatIf]:
    (s,) = select(log, startup)
    base = log.engine.reconcile(s, opts, len(log.startups))
    return base, log.engine.whatif(s, opts, base, replace(new_opts, source=opts.source))
