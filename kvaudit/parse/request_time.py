"""Lines a request wrote into the log, told from the engine's own startup lines (issue 39).

A request logged with a raw newline (a prompt, a model name, a header an error message quotes) puts whatever text
follows the newline on a line of its own: with the engine's log prefix, its timestamp and its words. Quoted text
and unprefixed lines are handled where the grammars read lines (:func:`kvaudit.parse.interface.unquoted`,
:func:`kvaudit.parse.interface.anchored`); this module judges what is left, a whole line that looks like the
engine's own, by where it stands, after every grammar has split the input into startups:

1. **A process starts once.** A startup line printed by a process (the journal's ``name[pid]:``) that printed an
   earlier startup line is no restart.
2. **Time does not run backwards.** A startup's opening line stamped before the last line of the startup above
   it (a restart begins after the run it replaces), or an opening line or an error stamped earlier than any line
   before it by more than :data:`BACKWARDS_S` (more than any interleaving of the engine's own processes), was
   not printed then: a copy of earlier lines (a request can print many). The first timestamp of a line counts,
   so a journal's or ``docker logs --timestamps``' own stamp (which a request cannot write) is the one compared.
3. **A restart is followed by its startup.** After a startup that came up (memory lines read, no failure), a new
   startup's opening line (``server_args``, a version banner, an engine config) must be followed by the engine's
   own startup lines (a weight load, a memory reading, a pool): an opening line with nothing after it, or only
   an error after it, is set aside.
4. **A serving server's lines are not its startup's.** Once a startup serves (:data:`SERVING`: a line the server
   prints only once its startup, warmup included, is over), a memory or failure line that follows is not part of
   that startup: it is set aside, so that a request can neither change the figures nor turn a serving host into
   "startup failed". SGLang's scheduler summary does not end its startup: its warmup (the first forward: a CUDA
   error, an out-of-memory error, the kernel's ``Killed``) follows it. A real failure while serving is said, not
   hidden: the note names the line.

Every line or startup set aside is said in the audit's notes (:attr:`Startup.set_aside`). What this cannot tell:
a whole startup forged line by line (an opening followed by its sequence, with plausible times) in a file that
carries no process id; see docs/check.md's threat model.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime
from functools import lru_cache
from typing import Sequence

from kvaudit.parse.interface import Event, Failure, RankEvent, Startup
from kvaudit.parse.lines import Line
from kvaudit.parse.vocabulary import ENGINE_WORDS

#: how far a line may run behind an earlier one: the engine's processes (API server, schedulers, TP workers)
#: write to one stream with their own buffers, and a pasted excerpt may put a section out of order. Measured on
#: the corpus and samples (117 + 54 logs, the Kimi journal capture): at most 143 s behind (a paste), 20 s in a
#: journal
BACKWARDS_S = 300.0

#: the journal's short formats: "2026-02-25T10:12:01+0000 gpu-node-07 python3[48190]: ..." (the process's pid)
JOURNAL_PID = re.compile(r"^\S+ \S+ [^\s\[\]]+\[(\d+)\]: ")

#: the lines that open a startup in each grammar (the engine's arguments, its version banner, its engine config):
#: the class names of their events, as each parser defines them
OPENING = frozenset({"ServerArgs", "Banner", "ModelPath", "EngineConfig", "Release", "Setting"})

#: lines a server prints once its startup is over and it serves, by engine: each engine's ``serving`` pattern
#: (kvaudit.parse.vocabulary: uvicorn's lines where the engine is up before uvicorn starts; SGLang starts uvicorn
#: before its warmup, so only its own ``fired up and ready to roll`` counts; vLLM's periodic stats). Lines printed
#: per request or per batch (SGLang's batch lines, TurboMind's ``[ProcessInferRequests]``) are not selected for
#: this: a long serving log would fill the scan's bound (kvaudit.parse.lines.FLOOD_KEEP) with them and push a
#: restart's lines out
SERVING = {w.name: re.compile(w.serving) for w in ENGINE_WORDS}
#: the scan's anchors for those lines (kvaudit.engines.all_anchors, explain.read_log): each printed once per start
ANCHORS: tuple[bytes, ...] = (b"fired up", b"startup complete", b"Uvicorn running")
#: how far into a line a serving line's words may stand (after a journal's and the engine's prefixes)
SERVING_WITHIN = 240

_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)")
_VLLM = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_SLASHED = re.compile(r"\[(\d\d)/(\d\d)/(\d{4})-(\d\d):(\d\d):(\d\d)\]")
#: how far into a line its first timestamp may stand (a journal's prefix, then the engine's)
_STAMP_WITHIN = 160


def _stamp(text: str) -> tuple[str, float] | None:
    """The line's first timestamp as (format, seconds), or None. vLLM's carries no year: its seconds count from
    the start of a leap year, and a turn of the year is told by a jump back of more than half a year."""
    head = text[:_STAMP_WITHIN]
    best: tuple[int, str, float] | None = None
    for name, rx in (("iso", _ISO), ("vllm", _VLLM), ("slashed", _SLASHED)):
        m = rx.search(head) if name != "slashed" or "/" in head else None
        if m is None or (best is not None and m.start() >= best[0]):
            continue
        when = _seconds(name, m.groups())
        if when is None:
            continue
        best = (m.start(), name, when)
    return (best[1], best[2]) if best else None


@lru_cache(maxsize=4096)  # a startup's lines share their seconds: each (local) time converted once
def _seconds(name: str, groups: tuple[str, ...]) -> float | None:
    g = [int(x) for x in groups]
    try:
        if name == "iso":
            return datetime(g[0], g[1], g[2], g[3], g[4], g[5]).timestamp()
        if name == "vllm":
            return datetime(2000, g[0], g[1], g[2], g[3], g[4]).timestamp()
        return datetime(g[2], g[0], g[1], g[3], g[4], g[5]).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _behind(latest: dict[str, float], stamp: tuple[str, float] | None) -> float:
    """How many seconds ``stamp`` runs behind the latest earlier line of its format (0 when it does not)."""
    if stamp is None or stamp[0] not in latest:
        return 0.0
    back = latest[stamp[0]] - stamp[1]
    if stamp[0] == "vllm" and back > 183 * 86400:
        return 0.0  # December to January: a new year, not time running backwards
    return max(back, 0.0)


def _failed(e: Event) -> bool:
    """A failure line, in any grammar (SGLang's parser has a Failure class of its own)."""
    return isinstance(e, Failure) or type(e).__name__ == "Failure"


def _came_up(s: Startup) -> bool:
    """The startup logged memory lines of its own and no failure: it came up (or was coming up)."""
    return (not any(_failed(e) for e in s.events)
            and any(isinstance(e, RankEvent) or type(e).__name__ not in OPENING for e in s.events))


def _followed(s: Startup) -> bool:
    """The startup's opening line is followed by the engine's own startup lines: an event that is neither an
    opening line nor a failure, after the first line."""
    return any(e.line > s.first_line and type(e).__name__ not in OPENING and not _failed(e)
               for e in s.events)


def _lines_said(numbers: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:5])
    more = f" and {len(numbers) - 5:,} more" if len(numbers) > 5 else ""
    return f"line{'s' if len(numbers) != 1 else ''} {shown}{more}"


def set_aside(engine: str, startups: Sequence[Startup], lines: Sequence[Line]) -> list[Startup]:
    """The startups a grammar found, less what a request could have written (the module's rules 1-4), each
    kept startup with notes on what was set aside in or before it (:attr:`Startup.set_aside`)."""
    if not startups:
        return list(startups)
    text = {ln.number: ln.text for ln in lines}
    stamps: dict[int, tuple[str, float] | None] = {}
    behind: dict[int, float] = {}
    latest: dict[str, float] = {}
    serving: list[int] = []
    serving_rx = SERVING.get(engine)
    for ln in lines:  # input order: each line against the lines before it
        st = _stamp(ln.text)
        stamps[ln.number] = st
        behind[ln.number] = _behind(latest, st)
        if st is not None and behind[ln.number] == 0.0:
            latest[st[0]] = max(latest.get(st[0], st[1]), st[1])
        if serving_rx is not None and serving_rx.search(ln.text, 0, SERVING_WITHIN) is not None:
            serving.append(ln.number)

    kept: list[Startup] = []
    pending: list[str] = []  # notes on whole startups set aside, said on the startup audited after them
    pids: set[str] = set()
    for s in startups:
        reason = None
        m = JOURNAL_PID.match(text.get(s.first_line, ""))
        pid = m.group(1) if m else None
        if kept and pid is not None and pid in pids:
            reason = (f"it is not a restart: a process that had already started printed it (pid {pid}), and a "
                      "process starts once, so the line is text a request wrote into the log")
        elif kept and (early := _before_previous(s, kept[-1], stamps)) > 0:
            reason = (f"its opening line is stamped {early:,.0f} s before the last line of the startup above it: a "
                      "restart begins after the run it replaces, so these are copies of earlier lines")
        elif kept and behind.get(s.first_line, 0.0) > BACKWARDS_S:
            reason = (f"stamped {behind[s.first_line]:,.0f} s before a line above it: the engine's lines do not "
                      "run backwards in time, so it is a copy of an earlier line")
        elif kept and not _failed(s.events[0]) and _came_up(kept[-1]) and not _followed(s):
            what = "an error" if any(_failed(e) for e in s.events) else "nothing"
            reason = (f"its opening line is followed by {what}, not by the engine's own startup lines (weights, "
                      "memory, the KV pool), after a startup that had come up: a request can print one line, a "
                      "restart prints its startup")
        elif kept and _failed(s.events[0]) and not _followed(s) and (
                _serving_in(serving, kept[-1].first_line, s.first_line)
                or (_came_up(kept[-1]) and all(stamps.get(e.line) for e in kept[-1].events))):
            # an error that a grammar takes for another run (vLLM's "KV cache is needed" with another figure): in
            # a pasted excerpt of two runs (corpus vllm_c009) it is one; in a log the engine's logger wrote (every
            # line stamped), a restart prints its own opening lines first
            reason = ("an error with no opening line before it, after a startup that had come up in a log whose "
                      "lines the engine's logger stamped: a restart prints its own startup first, a request can "
                      "print one line")
        if reason is not None:
            pending.append(f"a startup candidate at line {s.first_line} was set aside: {reason}")
            continue
        if pid is not None:
            pids.add(pid)
        s, said = _within(s, behind, serving)
        notes = tuple(pending) + said
        pending = []
        kept.append(replace(s, index=len(kept) + 1, set_aside=s.set_aside + notes) if notes or s.index != len(kept) + 1
                    else s)
    if pending and kept:  # the last candidates were set aside: said on the startup audited instead
        last = kept[-1]
        kept[-1] = replace(last, set_aside=last.set_aside + tuple(pending))
    return kept


def _before_previous(s: Startup, previous: Startup, stamps: dict[int, tuple[str, float] | None]) -> float:
    """How many seconds the opening line of ``s`` is stamped before the last stamped event of the startup above
    it, in the same format (0 when it is not, or either carries no stamp). A restart's first line comes after
    every line of the run it replaces; a copy of that run's lines carries its times."""
    mine = stamps.get(s.first_line)
    if mine is None:
        return 0.0
    theirs = [st[1] for e in previous.events if (st := stamps.get(e.line)) is not None and st[0] == mine[0]]
    if not theirs:
        return 0.0
    return max(max(theirs) - mine[1], 0.0)


def _serving_in(serving: Sequence[int], first: int, before: int) -> bool:
    return any(first <= n < before for n in serving)


def _within(s: Startup, behind: dict[int, float], serving: Sequence[int]) -> tuple[Startup, tuple[str, ...]]:
    """The startup less the errors that run backwards in time and the lines after it serves (rules 2 and 4)."""
    end = next((n for n in serving if s.first_line < n <= s.last_line), None)
    backwards: list[int] = []
    after: list[int] = []
    failed_after: list[int] = []
    events: list[Event] = []
    for e in s.events:
        if _failed(e) and e.line > s.first_line and behind.get(e.line, 0.0) > BACKWARDS_S:
            backwards.append(e.line)
        elif end is not None and e.line > end:
            (failed_after if _failed(e) else after).append(e.line)
        else:
            events.append(e)
    said: list[str] = []
    where = f"line {end}, a line the server prints once it serves"
    if failed_after:
        said.append(f"error {_lines_said(sorted(set(failed_after)))} after the startup was complete ({where}) "
                    f"{'were' if len(set(failed_after)) != 1 else 'was'} not read as the startup's: a request can "
                    "print such a line, and a failure while serving is not a failed startup (if the server did "
                    "fail, its process is gone: check the host)")
    if after:
        said.append(f"memory {_lines_said(sorted(set(after)))} after the startup was complete ({where}) "
                    f"{'were' if len(set(after)) != 1 else 'was'} not read: each of the engine's startup lines is "
                    "printed before it, so these are text a request wrote into the log")
    if backwards:
        said.append(f"error {_lines_said(sorted(set(backwards)))} {'were' if len(set(backwards)) != 1 else 'was'} not "
                    f"read: stamped more than {BACKWARDS_S:,.0f} s before a line above, so copies of earlier lines, "
                    "not the engine writing then")
    if end is not None:
        s = replace(s, serving_line=end)
    if not said:
        return s, ()
    out = replace(s, events=tuple(events), aside_lines=tuple(sorted({*failed_after, *after, *backwards})))
    if any(isinstance(getattr(e, "path", None), str) for e in s.events if e not in events):
        # a checkpoint line set aside (trtllm-serve prints it bare): the path is the one the kept lines name,
        # none when they name two (the grammar's own rule, kvaudit.parse.trtllm)
        paths = {e.path.rstrip("/") for e in events if isinstance(getattr(e, "path", None), str)}  # type: ignore[attr-defined]
        out = replace(out, model_path=paths.pop() if len(paths) == 1 else None)
    return out, tuple(said)
