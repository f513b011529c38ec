"""Regular expressions compiled when first used, not at import.

The four grammars hold about 160 patterns; compiling them all took ~100 ms of every start-up, while a log of
one engine reaches few of the others' (each is guarded by a cheap substring test). A :class:`LazyPattern`
behaves as the compiled pattern; the first call compiles it (a race between two threads compiles twice and
keeps either: the results are equal). A match's ``m.re`` is the compiled pattern, never the LazyPattern: tell
which pattern matched by which search returned the match, not by ``m.re is PATTERN``.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable


class LazyPattern:
    """The pattern, compiled by the first ``search``/``match``/``fullmatch`` (or :meth:`compiled`), which then
    binds the compiled pattern's own methods in their place: a grammar's per-line searches call ``re`` directly,
    with no Python frame of this class in between (issue 40: a host's lines cross ~900 of them)."""

    __slots__ = ("_source", "_flags", "_compiled", "search", "match", "fullmatch")

    search: Callable[..., re.Match[str] | None]
    match: Callable[..., re.Match[str] | None]
    fullmatch: Callable[..., re.Match[str] | None]

    def __init__(self, source: str, flags: int = 0) -> None:
        self._source = source
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None
        self.search = partial(self._first, "search")
        self.match = partial(self._first, "match")
        self.fullmatch = partial(self._first, "fullmatch")

    def compiled(self) -> re.Pattern[str]:
        rx = self._compiled
        if rx is None:
            rx = self._compiled = re.compile(self._source, self._flags)
            self.search, self.match, self.fullmatch = rx.search, rx.match, rx.fullmatch
        return rx

    def _first(self, method: str, *args: Any) -> re.Match[str] | None:
        return getattr(self.compiled(), method)(*args)  # type: ignore[no-any-return]

    @property
    def pattern(self) -> str:
        return self._source

    def __getattr__(self, name: str) -> Any:  # finditer, findall, sub, split, groupindex...
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"lazy({self._source!r})"


def lazy(source: str, flags: int = 0) -> LazyPattern:
    """``re.compile(source, flags)``, compiled on first use."""
    return LazyPattern(source, flags)
