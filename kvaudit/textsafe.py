"""Text from hosts and files is data: it must never drive a terminal, a Markdown table or a spreadsheet.

``printable`` drops C0 and C1 control characters (keeping tab), the carriers of terminal escape sequences
(ESC, CSI, OSC, BEL, DEL...); it is applied where such text enters kvaudit (log lines, a host's name and
error output, config fields, file names in messages). ``md_cell`` escapes a Markdown table cell;
``csv_cell`` neutralises spreadsheet formulas (a cell starting with ``=``, ``+``, ``-``, ``@``)."""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(s: str) -> str:
    return _CONTROL.sub("", s) if _CONTROL.search(s) else s


def md_cell(s: str) -> str:
    """A Markdown table cell: no control characters, no HTML (without ``<`` no tag can open), ``|`` escaped,
    one line."""
    return printable(s.replace("\n", " ")).replace("<", "&lt;").replace("|", "\\|")


def csv_cell(v: object) -> object:
    """A CSV cell a spreadsheet shows as text, never evaluates (OWASP: prefix a quote to =, +, -, @, tab, CR)."""
    if isinstance(v, str):
        v = printable(v)
        if v[:1] in ("=", "+", "-", "@", "\t", "\r"):
            return "'" + v
    return v
