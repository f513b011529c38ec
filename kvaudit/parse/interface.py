"""What every engine parser hands to the reconciler: startups made of frozen events."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, TypeVar

from kvaudit.parse.lines import Line
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
    def from_tags(tags: str) -> "Rank":
        tags = " ".join(tags.split())
        found = dict((k, int(v)) for k, v in re.findall(r"([A-Za-z_]+)=?(\d+)", tags))
        pp = found.get("PP", 0)
        tp = found.get("TP", found.get("rank", found.get("gpu_id", 0)))
        dp = found.get("DP", 0)
        return Rank((pp, tp, dp), tags)


SINGLE_RANK = Rank((0, 0, 0), "")


@dataclass(frozen=True)
class Event:
    """A parsed log line. ``line`` is its 1-based number in the input, ``text`` the cleaned line."""

    line: int
    text: str = field(repr=False)


@dataclass(frozen=True)
class RankEvent(Event):
    rank: Rank = SINGLE_RANK
    role: str = "target"  # "target" or "draft" (speculative-decoding draft worker)


@dataclass(frozen=True)
class Failure(RankEvent):
    """A line that says the startup failed or ran out of memory. ``kind`` is the engine's own vocabulary (its
    parser documents it); ``message`` the error as quoted (:func:`quote`); ``numbers`` what the line states."""

    kind: str = ""
    message: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


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


@dataclass(frozen=True)
class Startup:
    """One start of the server, from its first line to the next start (or the end of input)."""

    engine: str
    index: int  # 1-based, in input order
    first_line: int
    last_line: int
    server_args: Mapping[str, Any] | None
    events: tuple[Event, ...]
    era: VersionRange
    model_path: str | None = None  # where the model (and its config.json) lives, as the engine's args say

    def of(self, kind: type[E]) -> tuple[E, ...]:
        return tuple(e for e in self.events if isinstance(e, kind))

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
