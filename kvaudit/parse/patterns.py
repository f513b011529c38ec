"""Regular expressions compiled when first used, not at import.

The four grammars hold about 160 patterns; compiling them all took ~100 ms of every start-up, while a log of
one engine reaches few of the others' (each is guarded by a cheap substring test). A :class:`LazyPattern`
behaves as the compiled pattern; the first call compiles it (a race between two threads compiles twice and
keeps either: the results are equal). A match's ``m.re`` is the compiled pattern, never the LazyPattern: tell
which pattern matched by which search returned the match, not by ``m.re is PATTERN``.
"""

from __future__ import annotations

import re
from typing import Any


class LazyPattern:
    __slots__ = ("_source", "_flags", "_compiled")

    def __init__(self, source: str, flags: int = 0) -> None:
        self._source = source
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    def compiled(self) -> re.Pattern[str]:
        rx = self._compiled
        if rx is None:
            rx = self._compiled = re.compile(self._source, self._flags)
        return rx

    @property
    def pattern(self) -> str:
        return self._source

    def search(self, *args: Any) -> re.Match[str] | None:
        return self.compiled().search(*args)

    def match(self, *args: Any) -> re.Match[str] | None:
        return self.compiled().match(*args)

    def fullmatch(self, *args: Any) -> re.Match[str] | None:
        return self.compiled().fullmatch(*args)

    def __getattr__(self, name: str) -> Any:  # finditer, findall, sub, split, groupindex...
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"lazy({self._source!r})"


def lazy(source: str, flags: int = 0) -> LazyPattern:
    """``re.compile(source, flags)``, compiled on first use."""
    return LazyPattern(source, flags)
