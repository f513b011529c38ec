"""The terminal view: formula, per-GPU table, findings, and what an expert would say about them."""

from __future__ import annotations

import math
import textwrap
from typing import Any, Sequence

from kvaudit.reconcile.interface import Audit, Formula, FormulaRow, Severity, WhatIf
from kvaudit.report.view import (column_help, columns, not_reached, origin, rows, summary_sentences, token_span,
                                 version_text)
from kvaudit.verdict import judge, unchecked_reason

_COLOURS = {Severity.ERROR: "31", Severity.WARNING: "33", Severity.INFO: "36"}
#: the headline coloured by status
STATUS_COLOURS = {"error": "1;31", "failed": "1;31", "warning": "1;33", "partial": "1;33", "ok": "1;32",
                  "unchecked": "1"}
#: the most lines a report's headline takes on the terminal (its whole text is in the JSON, its cause under Findings)
HEADLINE_LINES = 3
#: the width when nothing says another (no terminal, no $COLUMNS), as gpustat, nvitop and kubectl take it
WIDTH = 80


def colour(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def logged_tokens_text(f: Formula, dash: str) -> str:
    """The logged token count, marked ``~`` when the log gives it only abridged ("273K")."""
    if f.logged_tokens is None:
        return dash
    return ("~" if f.logged_tokens_approximate else "") + f"{f.logged_tokens:,}"


def format_value(row: FormulaRow, dash: str = "-") -> str:
    if row.value is None:
        return dash
    if row.unit == "GiB":
        return f"{row.value:.2f} GiB"
    # a count (blocks, tokens) with the separators the rest of the report uses: "1,740", not "1740"
    return f"{int(row.value):,}" if float(row.value).is_integer() and abs(row.value) >= 1000 else f"{row.value:g}"


def cell_len(text: str) -> int:
    """Terminal cells ``text`` takes: one per character of printable ASCII, else as rich measures them
    (``rich.cells``: a CJK or emoji character is two, a control character none). Importing rich.cells is a third
    of a bare Python start (issue 40), and most reports are ASCII."""
    if text.isascii() and text.isprintable():
        return len(text)
    from rich.cells import cell_len as cells

    return cells(text)


def table(header: tuple[str, ...], body: Sequence[tuple[str, ...]], indent: str = "  ", left: int = 1) -> list[str]:
    """Plain-text table: the first ``left`` columns left-aligned (names), the rest right-aligned (numbers).
    Widths are terminal cells as rich measures them (``rich.cells``: a CJK or emoji character is two cells), so a
    host named in another script keeps the columns straight. Not ``rich.table``: importing it costs ~86 ms of
    every start (issue 23), and these tables need no borders."""
    widths = [max(cell_len(h), *(cell_len(r[i]) for r in body)) if body else cell_len(h)
              for i, h in enumerate(header)]

    def pad(c: str, w: int, to_left: bool) -> str:
        gap = " " * max(0, w - cell_len(c))
        return c + gap if to_left else gap + c

    def line(cells) -> str:
        return indent + "  ".join(pad(c, w, i < left) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header)] + [line(r) for r in body]


def fit_columns(header: tuple[str, ...], body: Sequence[tuple[str, ...]], width: int, drop: Sequence[str] = (),
                indent: str = "  ", left: int = 1) -> tuple[list[str], tuple[str, ...]]:
    """:func:`table` within ``width`` cells, and the columns it kept: columns with no value in any row go first,
    then those named in ``drop``, in that order (the least telling first), until a row fits; the first column is
    never dropped. A dropped column that holds a value is said by :func:`not_shown`, under the table."""
    cols = list(range(len(header)))

    def lines() -> list[str]:
        return table(tuple(header[i] for i in cols), [tuple(r[i] for i in cols) for r in body], indent, left)

    empty = [i for i in cols[1:] if body and all(r[i] in _EMPTY for r in body)]
    for i in empty + [header.index(d) for d in drop if d in header]:
        if max(cell_len(x) for x in lines()) <= width:
            break
        if i in cols:
            cols.remove(i)
    return lines(), tuple(header[i] for i in cols)


_EMPTY = ("-", "", "\u2013")


def not_shown(header: tuple[str, ...], body: Sequence[tuple[str, ...]], kept: Sequence[str],
              indent: str = "  ", width: int = WIDTH, row_name: str = "") -> tuple[list[str], tuple[str, ...]]:
    """The values of the columns :func:`fit_columns` left out, as lines under the table ("not shown at this width:
    draft 2.31; other 0.11"), so that a row still adds up: the value most rows have, then each other row's (named
    by its first cell, "11.20 on TP3,5"); and the columns it names. Nothing when no dropped column held a value."""
    parts, names = [], []
    for i, name in enumerate(header):
        if name in kept or all(r[i] in _EMPTY for r in body):
            continue
        names.append(name)
        shown = [r[i] for r in body]
        most = max(shown, key=shown.count)  # the value most rows have, then each other row's own
        parts.append(f"{name} {most}" + "".join(f", {r[i]} on {row_name}{r[0]}" for r in body if r[i] != most))
    return (wrap("not shown at this width: " + "; ".join(parts), indent, width) if parts else []), tuple(names)


def headline(text: str, width: int = WIDTH, max_lines: int = 0) -> list[str]:
    """The headline on one line of at most ``width`` cells; what does not fit goes under it, indented. The cut is
    at the last clause that fits ('; '), else at the last word outside parentheses whose line does not end on a
    bare label ("ERROR startup failed: ValueError:" keeps the start of the message on its line). ``max_lines``: at
    most that many lines, the last ending in "..." (the verdict's headline is whole, for JSON and alerts; a
    report that prints the findings whole keeps its own opening short)."""
    if cell_len(text) <= width:
        return [text]
    room = text[:width + 1]
    depth, ok = 0, []  # the spaces outside brackets, not right after a label's colon
    for i, ch in enumerate(room):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0 and i > width // 3 and room[i - 1] != ":" and i <= width:
            ok.append(i)
    clause = [i for i in ok if room[i - 1] == ";"]
    cut = clause[-1] if clause else ok[-1] if ok else room.rfind(" ", 0, width)
    if cut <= 0:
        cut = width
    first, rest = text[:cut].rstrip(" ;"), text[cut:].lstrip(" ;")
    return capped([first] + (wrap(rest, "  ", width) if rest else []), max_lines, width)


def capped(lines: list[str], max_lines: int, width: int = WIDTH) -> list[str]:
    """``lines`` (wrapped text) in at most ``max_lines`` lines (0: all), the last ending in "..." when cut."""
    if not max_lines or len(lines) <= max_lines:
        return lines
    last = lines[max_lines - 1]
    while cell_len(last) + 4 > width and " " in last.strip():  # room for " ...": drop words from the end
        last = last.rstrip().rsplit(" ", 1)[0]
    return lines[:max_lines - 1] + [last + " ..."]


def wrap(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    # break_on_hyphens=False: a host name, a path or a fingerprint is never split at a hyphen
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


def render_one(a: Audit, color: bool = False, legend: bool = True, extra: tuple = (),
               partial: tuple[str, ...] = (), width: int = WIDTH, with_headline: bool = True) -> str:
    """One audit; its first line is the verdict's headline (``extra``/``partial``: a checked host's live
    findings and what could not be read, which the headline weighs too)."""
    m = a.model
    L: list[str] = []
    engine = a.engine_display or a.engine
    if with_headline:  # a checked host's report prints its own (the same judgement with the live findings)
        j = judge(a, extra, partial)
        head = headline(j.whole, width, HEADLINE_LINES)
        L.append(colour(head[0], STATUS_COLOURS.get(j.status.value, "1"), color))
        L.extend(head[1:])
    said = f"{a.source}: {engine} {version_text(a.engine_version)}, {origin(a)}"
    L.extend(colour(x, "1", color) for x in wrap(said, "", width))
    model = [m.architecture or "model unknown", m.attention.upper() if m.attention != "unknown" else None,
             f"{m.layers} layers" if m.layers else None,
             f"KV {m.kv_dtype} ({m.kv_dtype_bytes:g} B)" if m.kv_dtype and m.kv_dtype_bytes else None,
             (f"attention TP {'at least ' if m.attention_tp_size_at_least else ''}{m.attention_tp_size}"
              + (" (assumed)" if (m.attention_tp_size_source or "").startswith("assumed") else ""))
             if m.attention_tp_size else None,
             f"speculative {a.speculative}" if a.speculative else None,
             (f"on {a.platform}" if a.platform_kind == "cpu" else
              f"on {a.platform} (unified memory)" if "(" not in a.platform else  # a sentence: not two brackets
              f"unified memory, on {a.platform}") if a.platform else None]
    L.extend(wrap(", ".join(x for x in model if x), "  ", width))
    L.append("")
    if not_reached(a):
        # a failed startup shows its cause first, not an empty formula table
        L.extend(wrap(colour("Formula", "1", color) + "  not reached: the startup failed before the KV pool "
                      "was sized (the cause is under Findings)", "", width))
    else:
        L.extend(_formula_lines(a, color, width))
    L.append("")
    L.append(colour("Per GPU (GiB)", "1", color))
    grid = [(r.label,) + r.cells for r in rows(a)]
    lines, kept = fit_columns(columns(a), grid, width, drop=("other", "free@pool", "draft", "graphs"))
    L.extend(lines)
    folded, named = not_shown(columns(a), grid, kept, "  ", width)  # a dropped column's values: each row adds up
    L.extend(folded)
    if legend:  # once per report, wrapped to the page: the columns shown, in the table or in the line under it
        L.extend(wrap("; ".join(f"{k}: {v}" for k, v in column_help(a).items() if k in kept or k in named),
                      "  ", width))
    L.append("")
    if a.findings:
        L.append(colour("Findings", "1", color))
        for fi in a.findings:
            head_ = colour(f"{fi.severity.value:<7}", _COLOURS[fi.severity], color) + f" {fi.code}" + (
                " (ignored: acknowledged with --ignore)" if fi.ignored else "")
            L.append("  " + head_)
            L.extend(wrap(fi.message, "    ", width))
        L.append("")
    L.append(colour("In short", "1", color))
    for s in summary_sentences(a):
        L.extend(wrap(s, "  ", width))
    if a.notes:
        L.append("")
        L.append(colour("Notes", "1", color))
        for n in a.notes:
            L.extend(wrap("- " + n, "  ", width))
    if a.uninterpreted:
        L.append("")
        heading = wrap("Not interpreted (memory lines of this startup kvaudit does not read)", "", width)
        L.extend([colour("Not interpreted", "1", color) + heading[0][len("Not interpreted"):]] + heading[1:])
        for number, said in a.uninterpreted:
            L.extend(wrap(f"line {number}: {said.strip()}", "  ", width))
    return "\n".join(L) + "\n"


def _formula_lines(a: Audit, color: bool, width: int = WIDTH) -> list[str]:
    f = a.formula
    one = "Formula  " + a.formula_text
    L = ([colour("Formula", "1", color) + "  " + a.formula_text] if len(one) <= width
         else [colour("Formula", "1", color)] + wrap(a.formula_text, "  ", width))
    p = f.predicted_tokens
    pred = token_span(p)
    head = [(r.quantity, format_value(r), r.source) for r in a.formula_rows]
    body = head + [
        ("bytes per token (per GPU)", f"{f.bytes_per_token:,}" if f.bytes_per_token else "-",
         _cell_source(f)),
        ("predicted tokens", pred, f.rule or ""),
        ("logged tokens", logged_tokens_text(f, "-"), ""),
    ]
    L.extend(_formula_table(body, width))
    verdict = f.verdict.value.upper()
    vcol = {"MATCH": "32", "EXPLAINED": "36", "MISMATCH": "33", "UNKNOWN": "2"}[verdict]
    L.extend(wrap(colour(verdict, vcol, color) + ": " + unchecked_reason(f.verdict_reason), "  ", width))
    return L


def _formula_table(body: Sequence[tuple[str, str, str]], width: int) -> list[str]:
    """The formula's rows as three aligned columns, quantity, value (right-aligned) and source, within ``width``
    cells. The sources stand right of the values, wrapped in their column, or every one under its row: one layout
    for the whole table (never ragged), the one that takes the fewest lines; a quantity longer than its column
    wraps in it."""
    val_w = max(cell_len(v) for _, v, _ in body)
    natural = max(cell_len(n) for n, _, _ in body)
    longest_word = max((cell_len(w) for _, _, src in body for w in src.split()), default=0)

    def lay(name_w: int, beside: bool) -> list[str] | None:
        src_w = width - (2 + name_w + 2 + val_w + 3)
        if beside and src_w < max(12, longest_word):
            return None
        out: list[str] = []
        for name, val, src in body:
            names = textwrap.wrap(name, name_w, subsequent_indent="  ", break_on_hyphens=False) or [""]
            srcs = textwrap.wrap(src, src_w, break_on_hyphens=False) if beside and src else []
            for i in range(max(len(names), len(srcs))):
                n = names[i] if i < len(names) else ""
                v = val if i == 0 else ""
                s = srcs[i] if i < len(srcs) else ""
                line = "  " + n + " " * (name_w - cell_len(n)) + "  " + " " * (val_w - cell_len(v)) + v
                out.append((line + "   " + s) if s else line.rstrip())
            if src and not beside:
                out.extend(wrap(src, "      ", width))
        return out

    top = max(12, min(natural, 40))
    tries = [lay(w, True) for w in range(top, 11, -1)]
    tries.append(lay(max(12, min(natural, width - 2 - 2 - val_w)), False))  # sources under: names take the room
    fit = [t for t in tries if t is not None]
    return min(fit, key=len)  # the first of the shortest: the widest quantity column, sources beside


def _cell_source(f: Formula) -> str:
    """Where bytes per token came from; a figure read off the KV line carries the range the line's rounding and
    the pool's padding rows leave, so that the one number shown is not taken for an exact one."""
    source = f.bytes_per_token_source or ""
    span = f.bytes_per_token_range
    if source.startswith("kv_line") and span is not None and f.bytes_per_token:
        spread = max(f.bytes_per_token - math.ceil(span[0]), math.floor(span[1]) - f.bytes_per_token)
        if spread >= 1:
            return f"{source} +-{spread:,}"
    return source


def render(audits: list[Audit], color: bool = False, width: int = WIDTH, **_: Any) -> str:
    return "\n".join(render_one(a, color, legend=i == 0, width=width) for i, a in enumerate(audits))


def render_whatif(a: Audit, w: WhatIf, color: bool = False, width: int = WIDTH) -> str:
    L = [colour(x, "1", color) for x in headline(
        f"What if {', '.join(f'{k}={v}' for k, v in w.changes.items()) or 'nothing changed'}"
        f"  ({a.source}, startup {a.startup_index})", width)]

    def g(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    if not w.computed:
        # no figure to put in the table: say so, and why, instead of a table of dashes
        L.extend(wrap(colour("unknown", "2", color) + ": nothing could be computed for this change: the "
                      "what-if needs what the log lacks.", "  ", width))
        for e in w.explanation:
            L.extend(wrap("- " + e, "  ", width))
        return "\n".join(L) + "\n"
    after = token_span(w.tokens_after)
    rows_ = [
        ("KV tokens", f"{w.tokens_before:,}" if w.tokens_before else "-", after),
        ("KV cache per GPU (GiB)", g(w.kv_gib_before), g(w.kv_gib_after)),
        (f"{w.reserve_label} (GiB)", g(w.reserve_gib_before), g(w.reserve_gib_after)),
        ("graphs, draft, tables from the reserve (GiB)", g(w.reserve_needs_gib_before), g(w.reserve_needs_gib_after)),
        ("left for activations (GiB)", g(w.headroom_gib_before), g(w.headroom_gib_after)),
    ]
    L.extend(table(("", "now", "what if"), rows_))
    risk = {"ok": ("ok", "32"), "low": ("LOW HEADROOM", "33"), "oom": ("OUT OF MEMORY", "31"),
            "unknown": ("unknown", "2")}[w.risk]
    after_txt = g(w.headroom_gib_after)
    h0, h1 = w.headroom_gib_before, w.headroom_gib_after
    # the wording follows the direction: a headroom that grows is never "would fall"
    if h0 is not None and h1 is not None and h1 >= h0:
        low = (f"activation headroom would rise from {g(h0)} to {after_txt} GiB, but stay low: long prefills may "
               "run out of memory at runtime.")
    else:
        low = (f"activation headroom would fall from {g(h0)} to {after_txt} GiB: long prefills may run out of "
               "memory at runtime.")
    verdicts = {
        "ok": f"the reserve still covers what this startup's graphs and draft took, leaving {after_txt} GiB "
              "for activations.",
        "low": low,
        "oom": "the reserve would not even cover what this startup's graphs and draft took: expect an OOM at "
               "startup or under load.",
        "unknown": "the log lacks the readings needed to judge the reserve.",
    }
    # a reason that is not the reserve (a KV budget <= 0, a pool below one request, a startup that never
    # finished) is the verdict itself, said once
    L.extend(wrap(colour(risk[0], risk[1], color) + ": " + (w.reason or verdicts[w.risk]), "  ", width))
    for e in w.explanation:
        if e != w.reason:
            L.extend(wrap("- " + e, "  ", width))
    if w.pin:
        L.extend(wrap(f"To pin this answer whatever the free memory is next time: {w.pin}.", "  ", width))
    return "\n".join(L) + "\n"
