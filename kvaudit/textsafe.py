"""Text from hosts and files is data: it must never drive a terminal, a Markdown table or a spreadsheet.

``printable`` drops C0 and C1 control characters (keeping tab), the carriers of terminal escape sequences
(ESC, CSI, OSC, BEL, DEL...), and invisible format characters (bidi overrides, zero-width); it is applied
where such text enters kvaudit (log lines, a host's name and error output, config fields, file names in
messages). ``md_cell`` escapes host text for Markdown; ``csv_cell`` neutralises spreadsheet formulas (a cell
starting with ``=``, ``+``, ``-``, ``@``)."""

from __future__ import annotations

import re

#: C0 and C1 controls (keeping tab), and the invisible format characters that reorder or hide text (issue 21):
#: bidi embeddings, overrides and isolates (U+202A-202E, U+2066-2069, U+200E/200F, U+061C: a host name with
#: U+202E shows its characters reversed), zero-width spaces and joiners (U+200B-200D, U+2060-2064), the BOM
#: (U+FEFF), the soft hyphen (U+00AD), and the Unicode tag characters (U+E0000-E007F: invisible, they spell
#: ASCII text a reader does not see but a model or a copy-paste does)
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u00ad\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                      "\u2066-\u2069\ufeff\U000e0000-\U000e007f]")


def printable(s: str) -> str:
    return _CONTROL.sub("", s) if _CONTROL.search(s) else s


#: Markdown's own syntax in host text: backslash, code, emphasis and link brackets; ``_`` only where it could
#: open or close emphasis (an intraword ``mem_fraction_static`` is plain text to CommonMark)
_MD_SYNTAX = re.compile(r"([\\`*\[\]]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def md_cell(s: str) -> str:
    """Host text in Markdown (a table cell, a list item): no control or invisible characters, no HTML (without
    ``<`` no tag can open), ``|`` escaped, one line, and no Markdown of its own: link brackets, emphasis and code
    markers are backslash-escaped, so ``[click](http://x)`` in a host's stderr is text in the mailed report, not
    a link."""
    text = printable(s.replace("\n", " "))
    return _MD_SYNTAX.sub(r"\\\1", text).replace("<", "&lt;").replace("|", "\\|")


def csv_cell(v: object) -> object:
    """A CSV cell a spreadsheet shows as text, never evaluates (OWASP: prefix a quote to =, +, -, @, tab, CR)."""
    if isinstance(v, str):
        v = printable(v)
        if v[:1] in ("=", "+", "-", "@", "\t", "\r"):
            return "'" + v
    return v
