"""What every engine parser hands to the reconciler: startups made of frozen events."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar

from kvaudit.parse.lines import Line
from kvaudit.parse.patterns import lazy
from kvaudit.record import Record, record
from kvaudit.versions import VersionRange


@dataclass(frozen=True, order=True)
class Rank:
    """One process of the server, as its log prefix names it.

    ``sort_key`` orders ranks the way the engine numbers them (PP stage, then TP rank); ``label`` is the tag
    as printed (``TP3``, ``DP0 TP0 EP0``, ``PP1 TP0``, ``rank=2``), empty for a single-GPU server that prints
    no tag.
    """

    sort_key: tuple[int, ...]
    label: str = field(compare=False)

    @property
    def display(self) -> str:
        return self.label or "TP0"

    @staticmethod
    @lru_cache(maxsize=4096)  # a host's lines repeat a few tags (TP0..TP7) on every line: parse each once
    def from_tags(tags: str) -> "Rank":
        tags = " ".join(tags.split())
        found: dict[str, int] = {k: int(v) for k, v in re.findall(r"([A-Za-z_]+)=?(\d+)", tags)}
        pp = found.get("PP", 0)
        tp = found.get("TP", found.get("rank", found.get("gpu_id", 0)))
        dp = found.get("DP", 0)
        return Rank((pp, tp, dp), tags)


SINGLE_RANK = Rank((0, 0, 0), "")


def numbered_rank(match: "re.Match[str] | None") -> Rank:
    """``rank N`` from the first group a rank-tag pattern matched (engines that number ranks with one integer:
    TensorRT-LLM's ``[RANK N]``, TurboMind's ``[TM][INFO][N]``); the single rank when nothing matched."""
    if match is None:
        return SINGLE_RANK
    n = int(next(g for g in match.groups() if g is not None))
    return Rank((0, n, 0), f"rank {n}")


@record
class Event(Record):
    """A parsed log line. ``line`` is its 1-based number in the input, ``text`` the cleaned line."""

    line: int
    text: str = field(repr=False)


@record
class RankEvent(Event):
    """An event one process printed: ``rank`` from its log prefix, ``role`` the target or a draft worker."""

    rank: Rank = SINGLE_RANK
    role: str = "target"  # "target" or "draft" (speculative-decoding draft worker)


@record
class Failure(RankEvent):
    """A line that says the startup failed or ran out of memory. ``kind`` is the engine's own vocabulary (its
    parser documents it); ``message`` the error as quoted (:func:`quote`); ``numbers`` what the line states."""

    kind: str = ""
    message: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


_OOM_TRIED = lazy(r"Tried to allocate (\d+(?:\.\d+)?) (GiB|MiB|KiB)")
_OOM_FREE = lazy(r"of which (\d+(?:\.\d+)?) (GiB|MiB|KiB) (?:is )?free")
_OOM_TOTAL = lazy(r"total capacity of (\d+(?:\.\d+)?) (GiB|MiB)")
_UNIT_GIB = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024 ** 2}


def oom_numbers(text: str) -> dict[str, float]:
    """What a PyTorch CUDA out-of-memory message states (GiB): ``tried_gib`` (the allocation that failed),
    ``free_gib`` (free on the device then), ``capacity_gib``. Same wording in every engine (torch's allocator)."""
    out: dict[str, float] = {}
    for key, rx in (("tried_gib", _OOM_TRIED), ("free_gib", _OOM_FREE), ("capacity_gib", _OOM_TOTAL)):
        m = rx.search(text)
        if m:
            out[key] = float(m.group(1)) * _UNIT_GIB[m.group(2)]
    return out


#: ``fleet`` parses hosts' logs in threads. CPython 3.11's AST constructor keeps its recursion depth in shared
#: state ("SystemError: AST constructor recursion depth mismatch" when two threads parse at once, fixed in
#: 3.12; Debian 12 ships 3.11), and ``warnings.catch_warnings`` swaps process-wide filters: both under one lock
_LITERAL_LOCK = threading.Lock()


#: the literals most printed values are (a number, a plain quoted string, None/True/False): read without the
#: compiler, to the same value (a ServerArgs line holds ~200; compiling each was a tenth of a host's parse)
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+(?:[eE][-+]?[0-9]+)?)?")
_CONSTANTS = {"None": None, "True": True, "False": False}


def literal(text: str) -> Any:
    """``ast.literal_eval`` of a value a log printed, with the compiler's warnings silenced (a hostile or cut
    log holds ``'\\R'``-style escapes: Python 3.12 would print a SyntaxWarning on kvaudit's stderr)."""
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    number = _NUMBER.fullmatch(text)
    if number is not None:
        return float(text) if number.group(1) else int(text)
    q = text[:1]
    if (q in ("'", '"') and len(text) >= 2 and text[-1] == q and q not in text[1:-1] and "\\" not in text
            and text[1:-1].isprintable()):
        return text[1:-1]
    import ast
    import warnings

    with _LITERAL_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.literal_eval(text)


#: a quoted literal opens with a quote after a delimiter (``text='``, ``: "``, ``('``), not an apostrophe in a word
_OPENER = re.compile(r"""(?:^|(?<=[\s=:(\[{,]))['"]""")


def mask_quoted(text: str) -> str:
    """``text`` with the inside of every quoted literal (a repr's or JSON's string: a prompt, a path, a value)
    replaced by ``x``, positions kept. What a line *quotes* is data the engine was handed, never the engine
    speaking: a grammar that still matches the masked line matched the engine's own words. A literal closes at
    its quote followed by a delimiter or the end (``it's`` inside a prompt does not close it); one cut short by
    the end of the line runs to the end."""
    if "'" not in text and '"' not in text:
        return text  # nothing quoted (most lines): no search for an opener
    out: list[str] = []
    at = 0
    while True:
        m = _OPENER.search(text, at)
        if m is None:
            out.append(text[at:])
            return "".join(out)
        q, start = m.group(0), m.end()
        i = start
        while True:
            i = text.find(q, i)
            if i < 0:
                i = len(text)
                break
            if text[i - 1] != "\\" and (i + 1 == len(text) or text[i + 1] in " \t,)]}:;."):
                break
            i += 1
        out.append(text[at:start] + "x" * (i - start))
        at = i  # the closing quote itself is copied by the next round (it opens nothing: no delimiter before it)
        if at >= len(text):
            return "".join(out)
        out.append(text[at])
        at += 1


def event_kind(e: Event) -> tuple[str, str]:
    """What a line said, for telling whether its masked copy says the same: the event's class and its kind or key."""
    return type(e).__name__, str(getattr(e, "kind", "") or getattr(e, "key", ""))


def unquoted(line: Line, events: Sequence[E], parse_events: Callable[[Line], Sequence[Event]]) -> list[E]:
    """The events of ``line`` that its grammar still finds once the quoted literals are masked: a request log's
    prompt (or any logger's quoted value) that holds engine-looking text (``server_args=...``, ``Load weight
    end ...``) never becomes a startup line, whatever prefix the line carries. Fields are read from the real
    line; only the decision is taken on the masked one."""
    if not events:
        return []
    masked = mask_quoted(line.text)
    if masked == line.text:
        return list(events)
    said = {event_kind(e) for e in parse_events(Line(line.number, masked))}
    return [e for e in events if event_kind(e) in said]


#: an error quoted from a log is kept whole up to this many characters (a hostile log bounds it, not a reader)
MAX_QUOTE = 1000


def quote(message: str) -> str:
    """A quoted error, whole when it fits; else cut at the last sentence or word boundary, marked as cut."""
    message = message.strip()
    if len(message) <= MAX_QUOTE:
        return message
    cut = message[:MAX_QUOTE]
    at = max(cut.rfind(". "), cut.rfind("; "))
    if at < MAX_QUOTE // 2:
        at = cut.rfind(" ")
    return cut[: at + 1 if at > 0 else MAX_QUOTE].rstrip() + " [...]"


E = TypeVar("E", bound=Event)


@record
class OwnPrefix(Record):
    """What an engine's logger writes before every message (a time and rank tag, a level and ``file.py:N``), and
    which of its lines it prints without one, so that those are read in a prefixed log all the same: ``bare``
    the lines close to one of its prefixed lines (a dump's continuation lines, a benchmark's table, a
    wrapper's checkpoint path), ``anywhere`` those that may stand anywhere (a traceback's exception, the
    kernel's ``Killed``: Python and the shell print them, not the engine's logger)."""

    pattern: re.Pattern[str]
    bare: Callable[[Event], bool]
    anywhere: Callable[[Event], bool]
    #: how far into a line the prefix may end (after a journal or container runtime's own prefix)
    within: int = 200


#: a bare continuation line is the engine's only this close to one of its prefixed lines
BARE_REACH = 64


def anchored(parsed: Sequence[tuple[Line, Sequence[Event]]], prefix: OwnPrefix
             ) -> tuple[list[list[Event]], list[int]]:
    """Each line's events as the engine's own, and the numbers of the lines that were not read.

    A log whose engine lines carry the engine's log prefix is the engine's logger speaking: a line there with
    the engine's words but without the prefix (another program's output in the same unit, an echo, a forged
    line) is not a memory line. A log where no line carries it (an excerpt pasted without prefixes) is read as
    it is: nothing tells its lines apart. Lines the engine itself prints bare are kept when one of its
    prefixed lines is close by (a dump's header line is often not among the lines selected)."""
    has = [prefix.pattern.search(line.text, 0, prefix.within) is not None for line, _ in parsed]
    if not any(h and any(not (prefix.bare(e) or prefix.anywhere(e)) for e in evs) for h, (_, evs) in zip(has, parsed)):
        return [list(evs) for _, evs in parsed], []
    from bisect import bisect_left

    marks = [line.number for h, (line, _) in zip(has, parsed) if h]
    out: list[list[Event]] = []
    dropped: list[int] = []
    for h, (line, evs) in zip(has, parsed):
        if h:
            out.append(list(evs))
            continue
        i = bisect_left(marks, line.number)
        near = any(0 <= j < len(marks) and abs(marks[j] - line.number) <= BARE_REACH for j in (i - 1, i))
        kept = [e for e in evs if prefix.anywhere(e) or (near and prefix.bare(e))]
        if len(kept) < len(evs):
            dropped.append(line.number)
        out.append(kept)
    return out, dropped


def with_unprefixed(startups: list[Startup], dropped: Sequence[int]) -> list[Startup]:
    """Each startup with the lines :func:`anchored` did not read inside its span (or after it, before the next)."""
    if not dropped or not startups:
        return startups
    out = []
    for i, s in enumerate(startups):
        end = startups[i + 1].first_line if i + 1 < len(startups) else None
        begin = s.first_line if i else 0
        mine = tuple(n for n in dropped if n >= begin and (end is None or n < end))
        out.append(replace(s, unprefixed=mine) if mine else s)
    return out


@record
class Startup(Record):
    """One start of the server, from its first line to the next start (or the end of input)."""

    engine: str
    index: int  # 1-based, in input order
    first_line: int
    last_line: int
    server_args: Mapping[str, Any] | None
    events: tuple[Event, ...]
    era: VersionRange
    model_path: str | None = None  # where the model (and its config.json) lives, as the engine's args say
    #: lines with the engine's words that were not read because they lack its log prefix (:func:`anchored`)
    unprefixed: tuple[int, ...] = ()
    #: what was set aside as lines a request could have written, in or before this startup, said in its audit's
    #: notes (:mod:`kvaudit.parse.request_time`)
    set_aside: tuple[str, ...] = ()
    #: the numbers of the lines inside this startup's span that were set aside (named in ``set_aside``)
    aside_lines: tuple[int, ...] = ()
    #: the line the server printed once its startup was over and it served (kvaudit.parse.request_time.SERVING),
    #: where the log has one: memory lines after it are the running server's, not this startup's
    serving_line: int | None = None

    def of(self, kind: type[E]) -> tuple[E, ...]:
        """The events of ``kind`` (and its subclasses), in order; each kind's scan kept (an audit asks ~60 times)."""
        found = self._of.get(kind)
        if found is None:
            found = self._of[kind] = tuple(e for e in self.events if isinstance(e, kind))
        return found  # type: ignore[return-value]

    @cached_property
    def _of(self) -> dict[type, tuple[Event, ...]]:
        return {}

    def ranks(self) -> list[Rank]:
        return sorted({e.rank for e in self.events if isinstance(e, RankEvent)})


class EngineParser(Protocol):
    """A log grammar. ``anchors`` are byte strings at least one of which every line it reads contains;
    ``markers`` are strings only this engine's startup lines contain (to tell the engine from a log's head)."""

    name: str
    anchors: tuple[bytes, ...]
    markers: tuple[str, ...]
    #: what the engine's request log lines carry (``--log-requests``): a prompt may hold text that looks like a
    #: startup line, so a line with one of these is never read, by any grammar
    request_markers: tuple[str, ...]

    def parse(self, lines: Iterable[Line]) -> list[Startup]: ...
