"""Markdown: the same content as the text view, as tables a ticket or a wiki page renders."""

from __future__ import annotations

from typing import Any

from kvaudit.reconcile.interface import Audit
from kvaudit.report.text import format_value, logged_tokens_text
from kvaudit.report.view import column_help, columns, not_reached, origin, rows, summary_sentences, version_text
from kvaudit.textsafe import md_cell
from kvaudit.verdict import judge


def _esc(s: str) -> str:
    return md_cell(s)


def render_one(a: Audit, extra: tuple = (), partial: tuple[str, ...] = ()) -> str:
    f = a.formula
    L = [f"**{_esc(judge(a, extra, partial).whole)}**", "", f"## kvaudit: {_esc(a.source)}", "",
         f"{a.engine_display or a.engine} {version_text(a.engine_version)}, {origin(a)}; "
         f"model {_esc(a.model.architecture or 'unknown')}"
         + (f"; speculative {a.speculative}" if a.speculative else ""), "",
         "### Formula", "", "| quantity | value | source |", "|---|---:|---|"]

    if not_reached(a):
        L[-4:] = ["### Formula", "", "Not reached: the startup failed before the KV pool was sized (the cause is "
                  "under Findings)."]
    pred = f"{f.predicted_tokens.low:,}..{f.predicted_tokens.high:,}" if f.predicted_tokens else "–"
    formula_rows = [(r.quantity, format_value(r, "–"), r.source) for r in a.formula_rows] + [
        ("bytes per token", f"{f.bytes_per_token:,}" if f.bytes_per_token else "–", f.bytes_per_token_source or ""),
        ("predicted tokens", pred, f.rule or ""),
        ("logged tokens", logged_tokens_text(f, "–"), ""),
    ]
    if not not_reached(a):
        for name, val, src in formula_rows:
            L.append(f"| {_esc(name)} | {val} | {_esc(src)} |")
        L += ["", f"**Verdict: {f.verdict.value}** — {_esc(f.verdict_reason)}"]
    L += ["", "### Per GPU (GiB)", "",
          "| " + " | ".join(columns(a)) + " |", "|" + "---|" + "---:|" * (len(columns(a)) - 1)]
    for r in rows(a):
        L.append("| " + " | ".join((_esc(r.label),) + r.cells) + " |")
    L += ["", "; ".join(f"*{k}*: {v}" for k, v in column_help(a).items()), ""]
    if a.findings:
        L += ["### Findings", "", "| severity | code | message |", "|---|---|---|"]
        for fi in a.findings:
            L.append(f"| {fi.severity.value}{' (ignored)' if fi.ignored else ''} | `{fi.code}` | {_esc(fi.message)} |")
        L.append("")
    L += ["### In short", ""] + [f"- {_esc(s)}" for s in summary_sentences(a)]
    if a.notes:
        L += ["", "### Notes", ""] + [f"- {_esc(n)}" for n in a.notes]
    if a.uninterpreted:
        L += ["", "### Not interpreted", "", "Memory lines of this startup kvaudit does not read:", ""]
        L += [f"- line {n}: `{_esc(t.strip()).replace('`', chr(39))}`" for n, t in a.uninterpreted]
    return "\n".join(L) + "\n"


def render(audits: list[Audit], **_: Any) -> str:
    return "\n".join(render_one(a) for a in audits)
