"""Memory-bearing lines: any line of a startup that states an amount of memory, whichever program printed it.

The grammars read the lines they know; every other line of the startup window that carries an amount of memory
beside a memory word is listed in the report as "not interpreted" (issue 33): kvaudit never ignores a memory line
silently, and never says a log lacks a value that may stand in a line it did not read.
"""

from __future__ import annotations

import re
from typing import Iterable

from kvaudit.parse.interface import Startup
from kvaudit.parse.lines import Line

#: bytes that select the candidate lines in the scan (a line without one of them states no amount of memory)
ANCHORS: tuple[bytes, ...] = (b"GiB", b"GB", b"MiB", b"MB", b"KiB", b"bytes")

#: an amount: a number and a memory unit (the engines' "GB" is GiB; "bytes" may follow a plain integer)
_AMOUNT = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?\s*(?:GiB|GB|MiB|MB|KiB|KB|bytes)\b")
#: a word that makes an amount a statement about memory (not a download size or a file's length)
_MEMORY_WORD = re.compile(r"mem|cache|\bkv\b|pool|weight|free|avail|alloc|reserv|usage|capacity|budget|graph|"
                          r"activation|buffer|peak|torch|cuda|gpu|npu|device", re.I)
#: a progress bar's frame (tqdm: "45%|####  | 9/20 [00:41<00:12, ...]"): a reading taken while a phase runs (SGLang's
#: "Capturing batches (bs=N avail_mem=X GB)"), whose begin and end lines the grammars read; not a statement of its own
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+\s*\[")
#: at most this many lines are kept per startup (a flood of them is counted, not listed)
KEEP = 50


def is_memory_line(text: str) -> bool:
    return (_AMOUNT.search(text) is not None and _MEMORY_WORD.search(text) is not None
            and _PROGRESS.search(text) is None)


def uninterpreted(lines: Iterable[Line], startup: Startup, selected: bool = False,
                  begin: int | None = None) -> tuple[tuple[tuple[int, str], ...], int]:
    """The memory lines of the startup's window that none of its events read: up to KEEP of them (line number,
    text), and how many there were in all. ``selected``: ``lines`` are memory lines already (ParsedLog.memory).
    ``begin``: where the window starts when not at the startup's first line (the first startup's runs from the
    input's first line: a memory line before the first line a grammar read is listed, never dropped)."""
    read = {e.line for e in startup.events}
    out: list[tuple[int, str]] = []
    total = 0
    start = startup.first_line if begin is None else begin
    for ln in lines:
        if ln.number < start or ln.number > startup.last_line or ln.number in read:
            continue
        if selected or is_memory_line(ln.text):
            total += 1
            if len(out) < KEEP:
                out.append((ln.number, ln.text[:300]))
    return tuple(out), total
