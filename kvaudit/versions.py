"""Engine version ranges, as inferred from the shapes of log lines.

A startup log rarely names the engine's version, but almost every release changed the text of at least one
memory line. Each shape narrows the range; the intersection is the era the log comes from.
"""

from __future__ import annotations

import re

from kvaudit.record import record

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    parts = []
    for piece in text.strip().lstrip("v").split("."):
        digits = re.match(r"\d+", piece)  # "0rc3" is 0 (a release candidate of 1.1.0), not 3
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break
    if not parts:
        raise ValueError(f"not a version: {text!r}")
    return tuple(parts)


def format_version(v: Version) -> str:
    return ".".join(str(p) for p in v)


@record
class VersionRange:
    """Inclusive [lo, hi]; ``hi=None`` means 'this release or any later one'."""

    lo: Version
    hi: Version | None
    evidence: tuple[str, ...] = ()

    def intersect(self, other: "VersionRange") -> "VersionRange | None":
        lo = max(self.lo, other.lo)
        if self.hi is None:
            hi = other.hi
        elif other.hi is None:
            hi = self.hi
        else:
            hi = min(self.hi, other.hi)
        if hi is not None and lo > hi:
            return None
        return VersionRange(lo, hi, self.evidence + other.evidence)

    def overlaps(self, lo: Version, hi: Version | None) -> bool:
        return self.intersect(VersionRange(lo, hi)) is not None

    def within(self, lo: Version, hi: Version | None) -> bool:
        """True when every version of this range lies inside [lo, hi]."""
        if self.lo < lo:
            return False
        if hi is None:
            return True
        return self.hi is not None and self.hi <= hi

    def __str__(self) -> str:
        if self.hi is None:
            return f">={format_version(self.lo)}"
        if self.hi == self.lo:
            return format_version(self.lo)
        return f"{format_version(self.lo)}..{format_version(self.hi)}"


def clue(lo: Version, hi: Version | None, why: str) -> VersionRange:
    """The range one line's shape admits, with the line's description as its evidence."""
    return VersionRange(lo, hi, (why,))


def narrow(ranges: list[VersionRange], start: VersionRange) -> VersionRange:
    """Intersect the ranges in order; a clue that contradicts the ones before it is skipped, not fatal
    (logs are hand-edited, builds from main mix eras)."""
    current = start
    for r in ranges:
        nxt = current.intersect(r)
        if nxt is not None:
            current = nxt
    return current


def resolve(ranges: list[VersionRange], start: VersionRange) -> VersionRange:
    """The era every line admits when they agree; when they disagree (a hardware plugin's V0-looking line in a
    V1 log, a build from main), the newest evidence wins: a version banner first, then the clues in order of
    their lowest version, newest first, each skipped if it contradicts what is already established. A skipped
    clue is kept in the evidence as "ignored", so the range printed never hides a line that disagreed."""
    banners = [r for r in ranges if any(e.startswith("version banner") for e in r.evidence)]
    rest = sorted((r for r in ranges if r not in banners), key=lambda r: r.lo, reverse=True)
    current = start
    ignored: list[str] = []
    for r in banners + rest:
        nxt = current.intersect(r)
        if nxt is None:
            ignored.extend(f"ignored: {e} (contradicts newer evidence)" for e in r.evidence)
        else:
            current = nxt
    return VersionRange(current.lo, current.hi, current.evidence + tuple(dict.fromkeys(ignored)))
