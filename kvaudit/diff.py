"""``kvaudit diff A B``: two startups side by side, and which terms of the engine's formula moved the KV token
count (issue 25). Pure: two audits in, a :class:`Diff` out; the CLI reads the startups and the reports print it.

The attribution reruns the formula one term at a time, from A's values to B's, in a fixed order; each step's
change in tokens is that term's share. For a formula of SGLang's shape (``rest = post - (1 - f) x T``) the
terms are T (free before the weights), the *load* (``T - post``: the weights and whatever else was allocated
before the pool), the fraction f and the bytes per token, since

    tokens = (f x T - load) x 2**30 / bytes_per_token

vLLM's formula has the same shape when its log states the total (the load is then the budget's other items:
weights, activation peak, non-torch memory); otherwise, and for the other engines, the audit's KV budget
(``rest``) and the bytes per token are the terms. What the steps do
not account for (the log's own rounding of each GiB figure to 0.01, page rounding, a cap, a speculative headroom,
a state pool) is the remainder, said as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvaudit.reconcile.interface import Audit
from kvaudit.units import GIB


@dataclass(frozen=True)
class Term:
    key: str
    label: str
    a: float | None
    b: float | None
    unit: str = "GiB"

    @property
    def change(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a


@dataclass(frozen=True)
class Share:
    """One term's share of the change in KV tokens."""

    key: str
    tokens: int
    says: str


@dataclass(frozen=True)
class Diff:
    a_label: str
    b_label: str
    a_engine: str
    b_engine: str
    tokens_a: int | None
    tokens_b: int | None
    terms: tuple[Term, ...]  # the formula's inputs
    ledger: tuple[Term, ...]  # the first rank's ledger, item by item
    shares: tuple[Share, ...]
    remainder: int | None  # the change the steps do not account for (rounding, caps)
    notes: tuple[str, ...]

    @property
    def tokens_change(self) -> int | None:
        return None if self.tokens_a is None or self.tokens_b is None else self.tokens_b - self.tokens_a


def _tokens(rest_gib: float, bpt: float) -> float:
    return rest_gib * GIB / bpt


def _formula_terms(a: Audit, b: Audit) -> tuple[Term, ...]:
    fa, fb = a.formula, b.formula
    rows = [
        ("pre_load_free_gib", a.pre_load_label if a.pre_load_label == b.pre_load_label else "T / total",
         fa.pre_load_free_gib, fb.pre_load_free_gib, "GiB"),
        ("post_load_free_gib", "free after the weights", fa.post_load_free_gib, fb.post_load_free_gib, "GiB"),
        ("mem_fraction_static", "memory fraction", fa.mem_fraction_static, fb.mem_fraction_static, ""),
        ("reserve_gib", "reserve", fa.reserve_gib, fb.reserve_gib, "GiB"),
        ("rest_gib", "KV budget (rest)", fa.rest_gib, fb.rest_gib, "GiB"),
        ("bytes_per_token", "bytes per token", fa.bytes_per_token, fb.bytes_per_token, "B"),
        ("logged_tokens", "KV tokens", fa.logged_tokens, fb.logged_tokens, "tokens"),
    ]
    return tuple(Term(k, label, x, y, unit) for k, label, x, y, unit in rows if x is not None or y is not None)


def _ledger_terms(a: Audit, b: Audit) -> tuple[Term, ...]:
    if not a.ranks or not b.ranks:
        return ()
    ra, rb = a.ranks[0], b.ranks[0]
    out = [Term("weights", "weights", ra.weights_gib, rb.weights_gib),
           Term("kv_cache", "KV cache", ra.kv_gib, rb.kv_gib)]
    seen = {"weights", "kv_cache"}
    items_a = {i.key: i for i in ra.items}
    items_b = {i.key: i for i in rb.items}
    for key in list(items_a) + [k for k in items_b if k not in items_a]:
        if key in seen:
            continue
        seen.add(key)
        ia, ib = items_a.get(key), items_b.get(key)
        out.append(Term(key, (ia or ib).label, ia.gib if ia else None, ib.gib if ib else None))
    out += [Term("free_at_end", "free at the end of startup", ra.free_at_end_gib, rb.free_at_end_gib),
            Term("unexplained", "unexplained", ra.unexplained_gib, rb.unexplained_gib)]
    return tuple(t for t in out if t.a is not None or t.b is not None)


def _weights_phrase(ledger: tuple[Term, ...], label: str) -> str:
    w = next((t for t in ledger if t.key == "weights"), None)
    if w is None or w.change is None or abs(w.change) < 0.005:
        return ""
    return f" (the weights on {label}: {w.change:+.2f} GiB)"


def _shares_fraction_shape(a: Audit, b: Audit, ledger: tuple[Term, ...], rank: str) -> list[Share] | None:
    """``tokens = (f x T - load) x 2**30 / bytes_per_token`` with ``load = f x T - rest``: SGLang's formula
    exactly (there load = T - post), and vLLM's when the log states the total (load = the budget's other items)."""
    fa, fb = a.formula, b.formula
    vals = [fa.pre_load_free_gib, fa.mem_fraction_static, fa.rest_gib, fa.bytes_per_token,
            fb.pre_load_free_gib, fb.mem_fraction_static, fb.rest_gib, fb.bytes_per_token]
    if any(v is None for v in vals) or not fa.bytes_per_token or not fb.bytes_per_token:
        return None
    t_a, f_a, bpt_a = fa.pre_load_free_gib, fa.mem_fraction_static, fa.bytes_per_token
    t_b, f_b, bpt_b = fb.pre_load_free_gib, fb.mem_fraction_static, fb.bytes_per_token

    # SGLang's load is T - post; the identity f x T - rest holds for it as for any fraction of a total
    load_a = f_a * t_a - fa.rest_gib
    load_b = f_b * t_b - fb.rest_gib
    words = a.budget_other_label
    what_t = a.pre_load_label or "T"

    def tok(t: float, load: float, f: float, bpt: float) -> float:
        return _tokens(f * t - load, bpt)

    steps = [
        ("pre_load_free_gib", (t_b, load_a, f_a, bpt_a), t_b - t_a,
         lambda d: f"{what_t} {d:+.2f} GiB"),
        ("load", (t_b, load_b, f_a, bpt_a), load_b - load_a,
         lambda d: f"{words} took {abs(d):.2f} GiB {'more' if d > 0 else 'less'}{_weights_phrase(ledger, rank)}"),
        ("mem_fraction_static", (t_b, load_b, f_b, bpt_a), f_b - f_a,
         lambda d: f"the memory fraction {f_a:g} -> {f_b:g}"),
        ("bytes_per_token", (t_b, load_b, f_b, bpt_b), bpt_b - bpt_a,
         lambda d: f"bytes per token {bpt_a:,} -> {bpt_b:,}"),
    ]
    out, prev = [], tok(t_a, load_a, f_a, bpt_a)
    for key, args, delta, say in steps:
        now = tok(*args)
        if abs(delta) > 1e-9:
            out.append(Share(key, round(now - prev), say(delta)))
        prev = now
    return out


def _shares_budget(a: Audit, b: Audit) -> list[Share] | None:
    fa, fb = a.formula, b.formula
    if None in (fa.rest_gib, fb.rest_gib) or not fa.bytes_per_token or not fb.bytes_per_token:
        return None
    out = []
    base = _tokens(fa.rest_gib, fa.bytes_per_token)
    step = _tokens(fb.rest_gib, fa.bytes_per_token)
    if abs(fb.rest_gib - fa.rest_gib) > 1e-9:
        d = fb.rest_gib - fa.rest_gib
        out.append(Share("rest_gib", round(step - base), f"the KV budget {d:+.2f} GiB"))
    if fb.bytes_per_token != fa.bytes_per_token:
        out.append(Share("bytes_per_token", round(_tokens(fb.rest_gib, fb.bytes_per_token) - step),
                         f"bytes per token {fa.bytes_per_token:,} -> {fb.bytes_per_token:,}"))
    return out


def diff(a: Audit, b: Audit, a_label: str, b_label: str) -> Diff:
    notes: list[str] = []
    if a.engine != b.engine:
        notes.append(f"{a.engine_display} against {b.engine_display}: their formulas differ; only the terms they "
                     "share are compared")
    if a.model.architecture != b.model.architecture:
        notes.append(f"different models ({a.model.architecture} / {b.model.architecture})")
    ledger = _ledger_terms(a, b)
    rank = a.ranks[0].label or "TP0" if a.ranks else "TP0"
    shares = None
    if a.engine == b.engine:
        shares = _shares_fraction_shape(a, b, ledger, rank)
        if shares is None:
            shares = _shares_budget(a, b)
    ta, tb = a.formula.logged_tokens, b.formula.logged_tokens
    remainder = None
    if shares is None:
        notes.append("the token change is not attributed: the logs do not give both formulas' inputs")
        shares = []
    elif ta is not None and tb is not None:
        remainder = (tb - ta) - sum(s.tokens for s in shares)
    return Diff(a_label, b_label, a.engine, b.engine, ta, tb, _formula_terms(a, b), ledger, tuple(shares),
                remainder, tuple(notes))


# --- rendering ------------------------------------------------------------------------------------------------


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("tokens", "B"):
        return f"{int(round(v)):,}"
    if unit == "":
        return f"{v:g}"
    return f"{v:.2f}"


def _chg(t: Term) -> str:
    c = t.change
    if c is None:
        return "-"
    if t.unit in ("tokens", "B"):
        return f"{int(round(c)):+,}"
    if t.unit == "":
        return f"{c:+g}"
    return f"{c:+.2f}"


def render_text(d: Diff) -> str:
    from kvaudit.report.text import table

    L = [f"A = {d.a_label}", f"B = {d.b_label}"]
    if d.tokens_change is not None:
        L.append(f"KV tokens {d.tokens_a:,} -> {d.tokens_b:,} ({d.tokens_change:+,})")
    L += ["", "The formula"]
    L += table(("term", "A", "B", "change", "unit"),
               [(t.label, _num(t.a, t.unit), _num(t.b, t.unit), _chg(t), t.unit) for t in d.terms], left=2)
    if d.ledger:
        L += ["", "The first GPU's ledger (GiB)"]
        L += table(("item", "A", "B", "change"),
                   [(t.label, _num(t.a, t.unit), _num(t.b, t.unit), _chg(t)) for t in d.ledger], left=2)
    if d.shares or d.remainder:
        L += ["", "Why the tokens changed (the formula rerun one term at a time, in this order)"]
        L += [f"  {s.says}: {s.tokens:+,} tokens" for s in d.shares]
        if d.remainder:
            L.append(f"  the rest (the log's numbers are rounded to 0.01 GiB; page rounding, caps, what the formula "
                     f"adds after the budget): {d.remainder:+,} tokens")
    for n in d.notes:
        L.append(f"note: {n}")
    return "\n".join(L) + "\n"


def as_dict(d: Diff) -> dict[str, Any]:
    def term(t: Term) -> dict[str, Any]:
        return {"key": t.key, "label": t.label, "a": t.a, "b": t.b, "change": t.change, "unit": t.unit}

    return {"schema_version": 1, "a": d.a_label, "b": d.b_label, "engines": [d.a_engine, d.b_engine],
            "tokens": {"a": d.tokens_a, "b": d.tokens_b, "change": d.tokens_change},
            "formula": [term(t) for t in d.terms], "ledger": [term(t) for t in d.ledger],
            "shares": [{"key": s.key, "tokens": s.tokens, "says": s.says} for s in d.shares],
            "remainder_tokens": d.remainder, "notes": list(d.notes)}


def audit_of_record(row: Any) -> Audit:
    """A startup as the history recorded it (``history.startups``): its formula's terms, no ledger. ``kvaudit diff
    HOST@RUN`` compares those (which term moved the tokens); the GiB-by-GiB ledger needs the logs."""
    from kvaudit.engines import by_name
    from kvaudit.reconcile.interface import Formula, ModelSummary, Verdict

    rest = (row.post_gib - row.reserve_gib) if None not in (row.post_gib, row.reserve_gib) else None
    formula = Formula(row.fraction, "history", row.t_gib, "history", row.post_gib, row.reserve_gib,
                      round(rest, 4) if rest is not None else None, row.bytes_per_token, "history", None,
                      row.tokens, Verdict.UNKNOWN, "recorded by the history: not re-audited", page_size=row.page_size)
    try:
        display = by_name(row.engine).display
    except KeyError:
        display = row.engine
    model = ModelSummary(row.model_key, "unknown", None, None, None, None, None, None, row.tp, "history")
    return Audit(row.engine, f"{row.host} in run {row.run_id}", 1, 1, 0, 0, row.version or "", (), model, formula,
                 (), (), None, None, engine_display=display,
                 budget_other_label="the weights and what else was loaded before the pool")
