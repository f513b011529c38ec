"""kvaudit plan's reports: text, JSON (keys as explain's where they mean the same), Markdown."""

from __future__ import annotations

import json
from typing import Any

from kvaudit.planning.model import Plan, Term


def _span(lo: float, hi: float, fmt: str, unit: str = "") -> str:
    """A range as a person reads it: ``1.20-3.40 GiB``, and with a negative end ``-26.94 to -22.81 GiB`` (never
    ``-26.94--22.81``)."""
    sep = " to " if lo < 0 or hi < 0 else "-"
    return f"{lo:{fmt}}{sep}{hi:{fmt}}{unit}"


def _range(t: Term) -> str:
    if t.unit == "B":
        return f"{t.lo:,.0f} B" if t.exact else _span(t.lo, t.hi, ",.0f", " B")
    if t.unit == "":
        return f"{t.lo:g}"
    return f"{t.lo:.2f} GiB" if abs(t.hi - t.lo) < 0.005 else _span(t.lo, t.hi, ".2f", " GiB")


def _tokens(p: Plan) -> str:
    return f"{p.tokens_low:,}" if p.tokens_low == p.tokens_high else f"{p.tokens_low:,}-{p.tokens_high:,}"


def _title(p: Plan) -> str:
    i = p.input
    card = i.card or f"a {i.gpu_total_mib / 1024:.2f} GiB card"
    par = f"TP {i.tp}" + (f" x PP {i.pp}" if i.pp > 1 else "") + (f", DP-attention {i.dp_attention}"
                                                                  if i.dp_attention > 1 else "")
    arch = i.geometry.architecture if i.geometry is not None else None
    return f"{i.engine} {i.version} on {card}, {par}, {arch or 'model'} ({i.model_key})"


def render_text(p: Plan, color: bool = False, width: int = 80) -> str:
    """The plan within ``width`` columns (the terminal's, as every text report takes it)."""
    from kvaudit.report.text import wrap

    L = wrap(f"plan: {_title(p)}", "", width) + [""]
    shown = p.terms + ((p.left_after_graphs,) if p.left_after_graphs else ())
    label_w = min(max(len(t.label) for t in shown), max(16, width - 34))
    for t in shown:
        row = f"  {t.label:<{label_w}}  {_range(t):>17}  {t.kind}"
        if len(row) <= width:
            L.append(row)
        else:  # the label on its own line(s), the figures under it
            L += wrap(t.label, "  ", width) + [f"  {'':<{label_w}}  {_range(t):>17}  {t.kind}"[:width]]
        if t.basis not in ("formula", "T - weights", "--fraction"):
            L += wrap(t.basis, " " * 6, width)
    L.append("")
    for name, value in outcome(p):
        L += wrap(f"{name}: {value}", "  ", width)
    for n in p.notes:
        L += wrap(f"note: {n}", "  ", width)
    return "\n".join(L) + "\n"


def outcome(p: Plan) -> list[tuple[str, str]]:
    """What the plan concludes, as (name, value) lines the text and Markdown views both print."""
    kv = (f"{p.kv_gib_low:.2f} GiB" if abs(p.kv_gib_high - p.kv_gib_low) < 0.005 else
          _span(p.kv_gib_low, p.kv_gib_high, ".2f", " GiB"))
    # the KV budget printed above is the same quantity (kv_gib is it rounded to 3 decimals): print it as it was
    # printed there, so one quantity never has two upper bounds (ux-audit2 item 20: 14.18-14.19 and 14.18-14.20,
    # the second rounded twice: 14.1946 -> 14.195 -> 14.20)
    budget = next((t for t in p.terms if t.key == "rest_gib" and t.unit == "GiB"), None)
    if budget is not None and abs(budget.lo - p.kv_gib_low) <= 0.0006 and abs(budget.hi - p.kv_gib_high) <= 0.0006:
        kv = _range(budget)
    # a configuration the engine refuses before it sizes anything has no pool: no "0 tokens" as if it had one
    out = ([("KV tokens", p.rule)] if p.rule.startswith("not sized") else
           [("KV tokens", f"{_tokens(p)} ({kv} per rank; {p.rule})")])
    if p.concurrency is not None:
        c = p.concurrency
        # the engine's own max_model_len when --context-length was not given (vLLM: max_position_embeddings)
        ctx = p.input.context_length or (p.input.geometry.max_position_embeddings if p.input.geometry else None)
        out.append((f"concurrent {ctx:,}-token requests" if ctx else "concurrent full-context requests",
                    f"{c[0]:,}" if c[0] == c[1] else f"{c[0]:,}-{c[1]:,}"))
    out.append(("starts", f"{p.starts} ({p.starts_reason})"))
    if p.smallest_fraction is not None:
        out.append(("smallest fraction whose pool holds one full-context request", f"{p.smallest_fraction:g}"))
    if p.largest_fraction is not None:
        out.append((f"largest fraction ({p.largest_fraction_reason})", f"{p.largest_fraction:g}"))
    return out


def as_dict(p: Plan) -> dict[str, Any]:
    i = p.input
    t = {x.key: x for x in p.terms}

    def mid(key: str) -> float | None:
        return round(t[key].mid, 3) if key in t else None

    return {
        "schema": "kvaudit.plan/1",
        "engine": i.engine, "engine_version": i.version,
        "gpu": {"name": i.card, "total_mib": i.gpu_total_mib},
        "parallel": {"tp": i.tp, "pp": i.pp, "dp_attention": i.dp_attention},
        "model": {"key": i.model_key, "architecture": i.geometry.architecture if i.geometry is not None else None,
                  "source": i.geometry.source if i.geometry is not None else None,
                  "weight_bytes": i.weight_bytes, "weight_source": i.weight_source},
        "draft": None if i.draft is None else {
            "algorithm": i.draft.algorithm, "layers": i.draft.layers, "architecture": i.draft.geometry.architecture,
            "weight_bytes": i.draft.weight_bytes, "weight_source": i.draft.weight_source},
        "formula": {
            "mem_fraction_static": t["mem_fraction_static"].lo if "mem_fraction_static" in t else i.fraction,
            "pre_load_free_gib": mid("t_gib"),
            "post_load_free_gib": mid("post_load_free_gib"),
            "reserve_gib": mid("reserve_gib"),
            "rest_gib": mid("rest_gib"),
            "bytes_per_token": int(t["bytes_per_token"].lo) if "bytes_per_token" in t else None,
            "predicted_tokens": {"low": p.tokens_low, "high": p.tokens_high},
            "page_size": p.block_size,
            "max_total_tokens_cap": i.max_total_tokens,
            "rule": p.rule,
        },
        "terms": [{"key": x.key, "label": x.label, "low": round(x.lo, 4), "high": round(x.hi, 4), "unit": x.unit,
                   "kind": x.kind, "basis": x.basis}
                  for x in p.terms + ((p.left_after_graphs,) if p.left_after_graphs else ())],
        "kv_gib": {"low": p.kv_gib_low, "high": p.kv_gib_high},
        "context_length": i.context_length,
        "concurrency": {"low": p.concurrency[0], "high": p.concurrency[1]} if p.concurrency else None,
        "starts": p.starts, "starts_reason": p.starts_reason,
        "smallest_fraction": p.smallest_fraction, "largest_fraction": p.largest_fraction,
        "notes": list(p.notes),
    }


def render_json(p: Plan) -> str:
    return json.dumps(as_dict(p), indent=2) + "\n"


def render_markdown(p: Plan) -> str:
    from kvaudit.textsafe import md_cell as cell

    L = [f"## plan: {cell(_title(p))}", "", "| term | value | kind | basis |", "|---|---|---|---|"]
    for t in p.terms + ((p.left_after_graphs,) if p.left_after_graphs else ()):
        L.append(f"| {cell(t.label)} | {_range(t)} | {t.kind} | {cell(t.basis)} |")
    L.append("")
    L += [f"**{cell(name)}**: {cell(value)}  " for name, value in outcome(p)]
    for n in p.notes:
        L.append(f"- {cell(n)}")
    return "\n".join(L) + "\n"


def render_validation(result: dict[str, Any], fmt: str) -> str:
    """``plan --validate``'s report (kvaudit.plan.validate.validate_history): JSON as it is, or its text."""
    if fmt == "json":
        return json.dumps(result, indent=2) + "\n"
    L = [f"plan --validate {result['source']}: {result['startups']} startups, each predicted from the others"
         + (f" ({result['t_given']} from logs: their own T given, the rest predicted)" if result["t_given"] else "")]
    for key, label in (("family_seen", "family seen"), ("family_not_seen", "family not seen")):
        s = result[key]
        if not s["startups"]:
            L.append(f"  {label}: no startups")
            continue
        L.append(f"  {label}: {s['startups']} startups; token error median {s['median_abs_error']:.3%}, p95 "
                 f"{s['p95_abs_error']:.3%}, mean {s['mean_abs_error']:.3%}; interval held {s['interval_held']:.0%}")
    L.append(f"  not predictable: {result['not_predictable']} (no startup or checkpoint gives their weights)")
    for c in result["cases"]:
        if c["predicted_tokens"] is not None:
            p = c["predicted_tokens"]
            L.append(f"    {c['startup']}: logged {c['logged_tokens']:,}, predicted {p['low']:,}-{p['high']:,} "
                     f"({c['error']:+.3%}{', held' if c['held'] else ', outside'})")
    return "\n".join(L) + "\n"
