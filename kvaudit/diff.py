"""``kvaudit diff A B``: two startups side by side, and which terms of the engine's formula moved the KV token
count (issue 25). Pure: two audits in, a :class:`Diff` out; the CLI reads the startups and the reports print it.

The attribution reruns the formula one term at a time, from A's values to B's, in a fixed order; each step's
change in tokens is that term's share. For a formula of SGLang's shape (``rest = post - (1 - f) x T``) the
terms are T (free before the weights), the *load* (``T - post``: the weights and whatever else was allocated
before the pool), the fraction f and the bytes per token, since

    tokens = (f x T - load) x 2**30 / bytes_per_token

vLLM's formula has the same shape when its log states the total (the load is then the budget's other items:
weights, activation peak, non-torch memory); otherwise, and for the other engines, the audit's KV budget
(``rest``) and the bytes per token are the terms. What the steps do not account for is the remainder. Within
the log's own rounding (each GiB figure printed to 0.01, a page) it is said to be rounding; beyond it, it is
what the engine takes after the budget when the audit names such an item (a cap, a speculative headroom, a
state pool), and otherwise it is said plainly: the pool does not follow the formula (issue 38, item 2).

The first line of the report says what changed, by how much and why: the share that moved the tokens most, in
the words of the setting behind it (``kv_cache_dtype fp8_e4m3 -> nvfp4``, ``mem_fraction_static 0.9 -> 0.92``).

``HOST@RUN`` startups come from the fleet's history file, which is input like any other (issue 39, item 7): it
is read here read-only, one row at a time, with SQLite's value length bounded (a 300 MB row is refused, never
loaded), and a row whose terms no startup could have (1 byte per token, a 5 TiB budget) is refused with the
reason, never attributed.
"""

from __future__ import annotations

import math
import re
import sqlite3
import stat
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

from kvaudit.errors import KvauditError
from kvaudit.reconcile.interface import Audit
from kvaudit.status import Status
from kvaudit.units import GIB
from kvaudit.record import record


class DiffError(KvauditError):
    """A startup the diff cannot compare (exit 2: the input)."""


#: each engine's fraction, as its own CLI spells it (the setting named on the first line)
FRACTION_NAME = {"sglang": "mem_fraction_static", "vllm": "gpu_memory_utilization",
                 "trtllm": "free_gpu_memory_fraction", "lmdeploy": "cache_max_entry_count"}

#: the log prints each GiB figure to 0.01: T and post each +-0.005, so the budget is known to +-0.01 GiB a side
LOG_ROUNDING_GIB = 0.01


@record
class Term:
    key: str
    label: str
    a: float | None
    b: float | None
    unit: str = "GiB"

    @property
    def change(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a


@record
class Share:
    """One term's share of the change in KV tokens: ``says`` in full, ``cause`` in the setting's own words (the
    first line's)."""

    key: str
    tokens: int
    says: str
    cause: str = ""
    #: a difference inside the two readings' own rounding (ux audit item 12): shown, never named as a cause
    within_rounding: bool = False


@record
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
    remainder: int | None  # the change the steps do not account for
    notes: tuple[str, ...]
    rounding_tokens: int | None = None  # what the logs' rounding can move the two counts by, together
    remainder_kind: str | None = None  # rounding | after_budget | off_formula
    after_budget: tuple[str, ...] = ()  # what the audits say the engine takes after the budget (caps, headroom)
    #: a side whose start failed ("B", its error finding's first clause): the headline says so, not "no pool size"
    failed: tuple[tuple[str, str], ...] = ()

    @property
    def tokens_change(self) -> int | None:
        return None if self.tokens_a is None or self.tokens_b is None else self.tokens_b - self.tokens_a


def _tokens(rest_gib: float, bpt: float) -> float:
    return rest_gib * GIB / bpt


def _formula_terms(a: Audit, b: Audit) -> tuple[Term, ...]:
    fa, fb = a.formula, b.formula
    fraction = FRACTION_NAME.get(a.engine, "memory fraction") if a.engine == b.engine else "memory fraction"
    rows: list[tuple[str, str, float | None, float | None, str]] = [
        ("pre_load_free_gib", a.pre_load_label if a.pre_load_label == b.pre_load_label else "T / total",
         fa.pre_load_free_gib, fb.pre_load_free_gib, "GiB"),
        ("post_load_free_gib", "free after the weights", fa.post_load_free_gib, fb.post_load_free_gib, "GiB"),
        ("mem_fraction_static", fraction, fa.mem_fraction_static, fb.mem_fraction_static, ""),
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
        label = ia.label if ia is not None else ib.label if ib is not None else key
        out.append(Term(key, label, ia.gib if ia else None, ib.gib if ib else None))
    out += [Term("free_at_end", "free at the end of startup", ra.free_at_end_gib, rb.free_at_end_gib),
            Term("unexplained", "unexplained", ra.unexplained_gib, rb.unexplained_gib)]
    return tuple(t for t in out if t.a is not None or t.b is not None)


def _weights(ledger: tuple[Term, ...]) -> Term | None:
    w = next((t for t in ledger if t.key == "weights"), None)
    if w is None or w.change is None or abs(w.change) < 0.005:
        return None
    return w


def _weights_phrase(ledger: tuple[Term, ...], label: str) -> str:
    w = _weights(ledger)
    return "" if w is None or w.change is None else f" (the weights on {label}: {w.change:+.2f} GiB)"


#: torch's dtype names as the engines' --kv-cache-dtype spells them
_DTYPE_WORDS = {"float8_e4m3fn": "fp8_e4m3", "float8_e4m3fnuz": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
                "bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "uint8": "uint8"}


def dtype_words(dtype: str) -> str:
    bare = dtype.removeprefix("torch.")
    return _DTYPE_WORDS.get(bare, bare)


def cell_settings(a: Audit, b: Audit) -> list[str]:
    """The settings that moved the bytes per token, in the engines' own words: the KV cache's dtype, the attention
    TP size (heads per rank), the model. Only what both audits state is compared: a side that does not say is
    not a change."""
    ma, mb = a.model, b.model
    out = []
    if ma.kv_dtype and mb.kv_dtype and ma.kv_dtype != mb.kv_dtype:
        out.append(f"kv_cache_dtype {dtype_words(ma.kv_dtype)} -> {dtype_words(mb.kv_dtype)}")
    if ma.attention_tp_size and mb.attention_tp_size and ma.attention_tp_size != mb.attention_tp_size:
        out.append(f"attention TP {ma.attention_tp_size} -> {mb.attention_tp_size}")
    if ma.architecture and mb.architecture and ma.architecture != mb.architecture:
        out.append(f"the model {ma.architecture} -> {mb.architecture}")
    else:
        geometry = [f"{what} {x} -> {y}" for what, x, y in (("layers", ma.layers, mb.layers),
                                                             ("KV heads per rank", ma.kv_heads_per_rank,
                                                              mb.kv_heads_per_rank),
                                                             ("head_dim", ma.head_dim, mb.head_dim))
                    if x and y and x != y]
        out += geometry
    return out


def _cell_cause(a: Audit, b: Audit, bpt_a: float, bpt_b: float) -> str:
    cells = f"bytes per token {bpt_a:,.0f} -> {bpt_b:,.0f}"
    moved = cell_settings(a, b)
    return f"{', '.join(moved)} ({cells})" if moved else cells


def _cell_range(a: Audit) -> tuple[float, float] | None:
    """The bytes per token the audit's reading allows: the KV line's interval, or the config's exact figure."""
    f = a.formula
    if f.bytes_per_token_range is not None:
        return f.bytes_per_token_range
    return (float(f.bytes_per_token), float(f.bytes_per_token)) if f.bytes_per_token else None


def cells_agree(a: Audit, b: Audit) -> bool:
    """Do the two readings of the bytes per token overlap (the same cell read two ways, e.g. config.json's 70,272
    and the KV line's 70,244 +-34)? Then their difference is rounding, not a change of setting."""
    ra, rb = _cell_range(a), _cell_range(b)
    if ra is None or rb is None or cell_settings(a, b):
        return False
    return ra[0] - 0.5 <= rb[1] and rb[0] - 0.5 <= ra[1]


def _cell_share(a: Audit, b: Audit, tokens: int, bpt_a: float, bpt_b: float) -> Share:
    if cells_agree(a, b):
        ra, rb = _cell_range(a), _cell_range(b)
        assert ra is not None and rb is not None

        def span(r: tuple[float, float]) -> str:
            return f"{r[0]:,.0f}" if round(r[0]) == round(r[1]) else f"{r[0]:,.0f}..{r[1]:,.0f}"

        return Share("bytes_per_token", tokens, f"bytes per token {bpt_a:,} -> {bpt_b:,}: the same cell read two "
                     f"ways (A {span(ra)}, B {span(rb)}), inside the readings' rounding: not a change", "",
                     within_rounding=True)
    return Share("bytes_per_token", tokens, f"bytes per token {bpt_a:,} -> {bpt_b:,}", _cell_cause(a, b, bpt_a, bpt_b))


def _fraction_cause(engine: str, f_a: float, f_b: float) -> str:
    return f"{FRACTION_NAME.get(engine, 'the memory fraction')} {f_a:g} -> {f_b:g}"


def _shares_fraction_shape(a: Audit, b: Audit, ledger: tuple[Term, ...], rank: str) -> list[Share] | None:
    """``tokens = (f x T - load) x 2**30 / bytes_per_token`` with ``load = f x T - rest``: SGLang's formula
    exactly (there load = T - post), and vLLM's when the log states the total (load = the budget's other items)."""
    fa, fb = a.formula, b.formula
    t_a, f_a, r_a, bpt_a = fa.pre_load_free_gib, fa.mem_fraction_static, fa.rest_gib, fa.bytes_per_token
    t_b, f_b, r_b, bpt_b = fb.pre_load_free_gib, fb.mem_fraction_static, fb.rest_gib, fb.bytes_per_token
    if t_a is None or f_a is None or r_a is None or not bpt_a or t_b is None or f_b is None or r_b is None \
            or not bpt_b:
        return None

    # SGLang's load is T - post; the identity f x T - rest holds for it as for any fraction of a total
    load_a = f_a * t_a - r_a
    load_b = f_b * t_b - r_b
    words = a.budget_other_label
    what_t = a.pre_load_label or "T"
    w = _weights(ledger)

    def tok(t: float, load: float, f: float, bpt: float) -> float:
        return _tokens(f * t - load, bpt)

    def load_cause(d: float) -> str:
        if w is not None and w.a is not None and w.b is not None:
            return f"the weights {w.a:.2f} -> {w.b:.2f} GiB on {rank}"
        return f"{words} {d:+.2f} GiB"

    Step = tuple[str, tuple[float, float, float, float], float, Callable[[float], str], Callable[[float], str]]
    steps: list[Step] = [
        ("pre_load_free_gib", (t_b, load_a, f_a, bpt_a), t_b - t_a,
         lambda d: f"{what_t} {d:+.2f} GiB", lambda d: f"{what_t} {t_a:.2f} -> {t_b:.2f} GiB"),
        ("load", (t_b, load_b, f_a, bpt_a), load_b - load_a,
         lambda d: f"{words} took {abs(d):.2f} GiB {'more' if d > 0 else 'less'}{_weights_phrase(ledger, rank)}",
         load_cause),
        ("mem_fraction_static", (t_b, load_b, f_b, bpt_a), f_b - f_a,
         lambda d: _fraction_cause(a.engine, f_a, f_b), lambda d: _fraction_cause(a.engine, f_a, f_b)),
        ("bytes_per_token", (t_b, load_b, f_b, bpt_b), bpt_b - bpt_a,
         lambda d: f"bytes per token {bpt_a:,} -> {bpt_b:,}", lambda d: _cell_cause(a, b, bpt_a, bpt_b)),
    ]
    out, prev = [], tok(t_a, load_a, f_a, bpt_a)
    for key, args, delta, say, cause in steps:
        now = tok(*args)
        if abs(delta) > 1e-9:
            out.append(_cell_share(a, b, round(now - prev), bpt_a, bpt_b) if key == "bytes_per_token"
                       else Share(key, round(now - prev), say(delta), cause(delta)))
        prev = now
    return out


def _shares_budget(a: Audit, b: Audit) -> list[Share] | None:
    fa, fb = a.formula, b.formula
    r_a, r_b, bpt_a, bpt_b = fa.rest_gib, fb.rest_gib, fa.bytes_per_token, fb.bytes_per_token
    if r_a is None or r_b is None or not bpt_a or not bpt_b:
        return None
    out = []
    base = _tokens(r_a, bpt_a)
    step = _tokens(r_b, bpt_a)
    if abs(r_b - r_a) > 1e-9:
        out.append(Share("rest_gib", round(step - base), f"the KV budget {r_b - r_a:+.2f} GiB",
                         f"the KV budget {r_a:.2f} -> {r_b:.2f} GiB"))
    if bpt_b != bpt_a:
        out.append(_cell_share(a, b, round(_tokens(r_b, bpt_b) - step), bpt_a, bpt_b))
    return out


def _rounding(a: Audit) -> int | None:
    """How far the log's rounding alone can move the count the formula gives for ``a``: the width of the audit's
    own predicted interval (it models the rounding of every figure it reads), else 0.01 GiB of budget; plus a
    page (the pool is a whole number of pages)."""
    f = a.formula
    page = f.page_size or 1
    if f.predicted_tokens is not None:
        return f.predicted_tokens.high - f.predicted_tokens.low + page
    if f.bytes_per_token:
        return math.ceil(2 * LOG_ROUNDING_GIB * GIB / f.bytes_per_token) + page
    return None


def _after_budget(a: Audit, side: str) -> list[str]:
    """What the audit says the engine takes after the budget, which the formula's terms do not carry."""
    f, out = a.formula, []
    if f.max_total_tokens_cap:
        out.append(f"{side}'s cap of {f.max_total_tokens_cap:,} tokens")
    if f.probable_cap:
        out.append(f"{side}: {f.probable_cap}")
    if f.speculative_headroom_tokens:
        out.append(f"{side}'s speculative headroom ({f.speculative_headroom_tokens:,} tokens)")
    if f.state_pool_gib:
        out.append(f"{side}'s state pool ({f.state_pool_gib:.2f} GiB)")
    return out


def diff(a: Audit, b: Audit, a_label: str, b_label: str) -> Diff:
    notes: list[str] = []
    if a.engine != b.engine:
        # ux audit item 13: SGLang's mem_fraction_static is of the free memory before the weights, vLLM's
        # gpu_memory_utilization of the card's total, TensorRT-LLM's free_gpu_memory_fraction of what is free after
        # profiling, LMDeploy's cache_max_entry_count of what is free after the weights; "reserve" and "headroom"
        # differ as much. Side by side the rows would read as changes of one quantity: refused, with the reason
        raise DiffError(
            f"A is {a.engine_display or a.engine} and B is {b.engine_display or b.engine}: their fractions, reserves "
            "and budgets are different quantities (docs/diff.md, 'Two engines'), so a diff would compare numbers "
            "that do not mean the same thing; run kvaudit explain on each instead")
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
    remainder = kind = rounding = None
    after = tuple(_after_budget(a, "A") + _after_budget(b, "B"))
    if shares is None:
        notes.append("the token change is not attributed: the logs do not give both formulas' inputs")
        shares = []
    elif ta is not None and tb is not None:
        remainder = (tb - ta) - sum(s.tokens for s in shares)
        ra, rb = _rounding(a), _rounding(b)
        rounding = ra + rb if ra is not None and rb is not None else None
        if rounding is not None and abs(remainder) <= rounding:
            kind = "rounding"
        elif after:
            kind = "after_budget"
        else:
            kind = "off_formula"
    failed = tuple((side, _failure(x)) for side, x in (("A", a), ("B", b)) if _failure(x))
    return Diff(a_label, b_label, a.engine, b.engine, ta, tb, _formula_terms(a, b), ledger, tuple(shares),
                remainder, tuple(notes), rounding, kind, after, failed)


def _failure(a: Audit) -> str:
    """The start's failure as its error finding says it (its code and first clause), or ""."""
    from kvaudit.verdict import FAILURE_CODES

    f = next((f for f in a.findings if f.code in FAILURE_CODES and not f.ignored), None)
    return "" if f is None else f"{f.code}: {f.message.split('; ')[0]}"


# --- what the remainder is, in words -----------------------------------------------------------------------------


def remainder_words(d: Diff) -> str:
    """The remainder's line: rounding only when the logs' rounding can account for it."""
    if d.remainder_kind == "rounding":
        return (f"the logs' rounding (GiB figures printed to 0.01, whole pages): up to {d.rounding_tokens:,} "
                "tokens here")
    if d.remainder_kind == "after_budget":
        return f"what the engine takes after the budget: {'; '.join(d.after_budget)}"
    beyond = f", beyond the logs' rounding of up to {d.rounding_tokens:,}" if d.rounding_tokens is not None else ""
    return f"the pool does not follow the formula: its terms do not account for these tokens{beyond}"


def _remainder_cause(d: Diff) -> str:
    if d.remainder_kind == "after_budget":
        return f"what the engine takes after the budget ({'; '.join(d.after_budget)})"
    return "the pool does not follow the formula"


def headline(d: Diff, width: int = 80) -> str:
    """The first line: what changed, by how much, and why (the settings that moved the tokens, largest first),
    within ``width`` cells: the causes are shortened, then dropped, before the change itself."""
    ta, tb, chg = d.tokens_a, d.tokens_b, d.tokens_change
    if ta is None or tb is None or chg is None:
        failed = dict(d.failed)
        if any(failed.get(s) for s, t in (("A", ta), ("B", tb)) if t is None):
            # a start that failed has no pool to compare: say that, with its cause, not that its log lacks a size
            side = next(s for s, t in (("A", ta), ("B", tb)) if t is None and failed.get(s))
            return _cut(f"KV tokens not compared: {side}'s start failed ({failed[side]})", width)
        missing = " and ".join(s for s, t in (("A", ta), ("B", tb)) if t is None)
        return _cut(f"KV tokens not compared: {missing} logs no pool size", width)
    pct = f", {100 * chg / ta:+.1f} %" if ta else ""
    what = f"KV tokens {ta:,} -> {tb:,} ({chg:+,}{pct})" if chg else f"KV tokens unchanged: {ta:,}"
    # the causes, largest first: each share, and the remainder when it is more than rounding
    causes: list[tuple[int, str, str]] = [(s.tokens, s.cause or s.says, s.says) for s in d.shares
                                          if s.tokens and not s.within_rounding and (d.rounding_tokens is None
                                                           or abs(s.tokens) > d.rounding_tokens
                                                           or len(d.shares) == 1)]
    if d.remainder and d.remainder_kind in ("after_budget", "off_formula"):
        causes.append((d.remainder, _remainder_cause(d), _remainder_cause(d)))
    causes.sort(key=lambda c: -abs(c[0]))
    if not causes:
        if chg and d.remainder_kind == "rounding":
            return _cut(f"{what}: the logs' rounding only", width)
        return _cut(what, width)
    one = len(causes) == 1

    def said(c: tuple[int, str, str], short: bool, amount: bool) -> str:
        text = re.sub(r" \(.*\)$", "", c[1]).split(", ")[0] if short else c[1]
        return f"{text} ({c[0]:+,})" if amount and not one else text

    bare = f"KV tokens {ta:,} -> {tb:,} ({chg:+,})" if chg else what
    candidates = []
    for short in (False, True):
        for n in range(len(causes), 0, -1):
            more = f"; {len(causes) - n} more below" if n < len(causes) else ""
            candidates.append(f"{what}: {'; '.join(said(c, short, True) for c in causes[:n])}{more}")
    candidates += [f"{what}: {said(causes[0], True, False)}", f"{bare}: {said(causes[0], True, False)}"]
    return next((c for c in candidates if len(c) <= width), _cut(candidates[-1], width))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(1, width - 3)] + "..."


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


def _fit(label: str, room: int) -> str:
    """A ledger label within ``room`` cells: its detail (what follows `` (`` or ``: ``) dropped first, then cut."""
    if len(label) <= room:
        return label
    short = re.split(r" \(|: ", label, maxsplit=1)[0]
    return short if len(short) <= room else short[:max(1, room - 3)] + "..."


def _columns(header: tuple[str, ...], body: list[tuple[str, ...]], width: int) -> list[str]:
    """A table whose first column (the names) takes what the numbers leave of ``width``; numbers right-aligned."""
    from kvaudit.report.text import table

    numbers = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)][1:]
    room = max(12, width - 2 - sum(w + 2 for w in numbers))
    return table(header, [(_fit(r[0], room), *r[1:]) for r in body], left=1)


def _wrapped(text: str, width: int, indent: str = "", hang: str = "  ") -> list[str]:
    return textwrap.wrap(text, max(20, width), initial_indent=indent, subsequent_indent=indent + hang,
                         break_on_hyphens=False) or [indent]


def _label(prefix: str, label: str, width: int) -> str:
    """``A = path``: a path too long for the line keeps its start and its end (the file's name)."""
    room = width - len(prefix)
    if len(label) <= room or room < 12:
        return prefix + label
    keep = room - 3
    return f"{prefix}{label[:keep // 3]}...{label[len(label) - (keep - keep // 3):]}"


def _unit_label(t: Term) -> str:
    return f"{t.label}, {t.unit}" if t.unit in ("GiB", "B") else t.label


def render_text(d: Diff, width: int = 80) -> str:
    L = [headline(d, width), _label("A = ", d.a_label, width), _label("B = ", d.b_label, width), "", "The formula"]
    L += _columns(("term", "A", "B", "change"),
                  [(_unit_label(t), _num(t.a, t.unit), _num(t.b, t.unit), _chg(t)) for t in d.terms], width)
    if d.ledger:
        L += ["", "The first GPU's ledger, GiB"]
        L += _columns(("item", "A", "B", "change"),
                      [(t.label, _num(t.a, t.unit), _num(t.b, t.unit), _chg(t)) for t in d.ledger], width)
    if d.shares or d.remainder:
        L += ["", "Why the tokens changed (the formula rerun one term at a time, in this order)"]
        rows = [(f"{s.tokens:+,} tokens", s.says) for s in d.shares]
        if d.remainder:
            rows.append((f"{d.remainder:+,} tokens", f"the rest: {remainder_words(d)}"))
        w = max(len(r[0]) for r in rows)
        for amount, says in rows:
            L += _wrapped(f"{amount:>{w}}  {says}", width, "  ", " " * (w + 2))
    for n in d.notes:
        L += _wrapped(f"note: {n}", width)
    return "\n".join(L) + "\n"


def as_dict(d: Diff) -> dict[str, Any]:
    def term(t: Term) -> dict[str, Any]:
        return {"key": t.key, "label": t.label, "a": t.a, "b": t.b, "change": t.change, "unit": t.unit}

    return {"schema_version": 1, "headline": headline(d, 10_000), "a": d.a_label, "b": d.b_label,
            "engines": [d.a_engine, d.b_engine],
            "tokens": {"a": d.tokens_a, "b": d.tokens_b, "change": d.tokens_change},
            "formula": [term(t) for t in d.terms], "ledger": [term(t) for t in d.ledger],
            "shares": [{"key": s.key, "tokens": s.tokens, "says": s.says, "cause": s.cause} for s in d.shares],
            "remainder_tokens": d.remainder, "remainder_kind": d.remainder_kind,
            "rounding_tokens": d.rounding_tokens, "after_budget": list(d.after_budget), "notes": list(d.notes)}


# --- startups the history recorded (kvaudit diff HOST@RUN --history FILE) ----------------------------------------

#: the longest value diff lets SQLite read from a history (its per-connection SQLITE_LIMIT_LENGTH): a longer one is
#: refused inside SQLite, never loaded (issue 39, item 7: a 300 MB row cost 2.6 GB); a row kvaudit writes holds
#: values of a few hundred bytes
HISTORY_VALUE_BYTES = 1 << 20
#: the columns diff reads, and what each may hold (a row outside these bounds is not a startup kvaudit recorded)
RECORD_COLUMNS = ("run_id", "host", "startup_id", "engine", "version", "tp", "fraction", "t_gib", "post_gib",
                  "reserve_gib", "rest_gib", "bytes_per_token", "tokens", "page_size", "model_key")
#: no card holds a TiB; a budget, T or free figure beyond is not a reading
MAX_GIB = 1024.0
#: the smallest KV cell of a model an engine serves: one layer's K and V for one 64-wide head at 4 bits; a row
#: claiming less (1 byte per token) would turn a 10 GiB budget into eleven billion tokens
MIN_BYTES_PER_TOKEN = 64
#: the largest: 126 layers x 2 x 128 heads x 256 x 2 B is 16 MiB; beyond is not a model
MAX_BYTES_PER_TOKEN = 1 << 24
#: a pool cannot hold more tokens than its budget fits; the logs' rounding and a page are within this
OVER_BUDGET_FACTOR = 1.25


@record
class Recorded:
    """One startup as the history recorded it (``startups`` table): the formula's terms, no ledger."""

    run_id: int
    host: str
    startup_id: str | None
    engine: str
    version: str | None
    tp: int | None
    fraction: float | None
    t_gib: float | None
    post_gib: float | None
    reserve_gib: float | None
    rest_gib: float | None
    bytes_per_token: int | None
    tokens: int | None
    page_size: int | None
    model_key: str | None


def implausible(r: Recorded) -> str | None:
    """Why the row's terms are not a startup's (None: they could be). Bounds, not a model: each is far outside any
    real startup, so a real one is never refused."""
    if r.fraction is not None and not 0 < r.fraction <= 1:
        return f"a memory fraction of {r.fraction:g}"
    for name, v in (("free before loading", r.t_gib), ("free after the weights", r.post_gib),
                    ("reserve", r.reserve_gib), ("KV budget", r.rest_gib)):
        if v is not None and not -MAX_GIB <= v <= MAX_GIB:
            return f"a {name} of {v:,.6g} GiB (no card holds {MAX_GIB:,.0f} GiB)"
    bpt = r.bytes_per_token
    if bpt is not None and not MIN_BYTES_PER_TOKEN <= bpt <= MAX_BYTES_PER_TOKEN:
        return (f"{bpt:,} bytes per token (a model's KV cell is {MIN_BYTES_PER_TOKEN} B to "
                f"{MAX_BYTES_PER_TOKEN:,} B)")
    if r.tokens is not None and not 0 <= r.tokens <= 1 << 40:
        return f"{r.tokens:,} KV tokens"
    if r.tp is not None and not 1 <= r.tp <= 1 << 16:
        return f"a TP size of {r.tp:,}"
    if r.page_size is not None and not 1 <= r.page_size <= 1 << 20:
        return f"a page of {r.page_size:,} tokens"
    rest = _record_rest(r)
    if rest is not None and bpt and r.tokens is not None:
        fits = max(0.0, rest + 2 * LOG_ROUNDING_GIB) * GIB / bpt
        if r.tokens > OVER_BUDGET_FACTOR * fits + (r.page_size or 1):
            return (f"{r.tokens:,} KV tokens in a budget of {rest:.2f} GiB at {bpt:,} B per token, which holds "
                    f"{int(fits):,}")
    return None


def _record_rest(r: Recorded) -> float | None:
    if r.rest_gib is not None:
        return r.rest_gib
    if r.post_gib is not None and r.reserve_gib is not None:
        return r.post_gib - r.reserve_gib
    return None


def _record(row: dict[str, Any]) -> Recorded | None:
    from kvaudit.fleet.history import clean_row

    c: dict[str, Any] | None = clean_row(row)
    if c is None or not c.get("engine") or not c.get("host") or not isinstance(c.get("run_id"), int):
        return None
    values: dict[str, Any] = {k: c.get(k) for k in RECORD_COLUMNS}
    return Recorded(**values)


def _open_history(path: str) -> sqlite3.Connection:
    """The history file opened read-only (diff writes nothing): a regular file, SQLite's value length bounded."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise DiffError(f"history {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DiffError(f"history {path}: not a regular file")
    try:
        db = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DiffError(f"history {path}: {exc}") from None
    if hasattr(db, "setlimit"):  # Python 3.11+: the bound is SQLite's own, per connection
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, HISTORY_VALUE_BYTES)  # type: ignore[attr-defined]
    return db


def _history_rows(path: str, host: str, up_to_run: int | None) -> Iterator[Recorded]:
    """``host``'s rows, latest run first, read one at a time with SQLite's value length bounded, from a file opened
    read-only (diff writes nothing). A row too large or not of kvaudit's types stops the read with the reason."""
    db = _open_history(path)
    try:
        have = {r[1] for r in db.execute("PRAGMA table_info(startups)")}
        if not have:
            raise DiffError(f"history {path}: no startups recorded (not a kvaudit fleet --history file, or one "
                            "from before kvaudit recorded startups)")
        columns = ", ".join(c if c in have else f"NULL AS {c}" for c in RECORD_COLUMNS)
        # Python 3.10 has no setlimit: SQLite measures each value (it reads it once), Python never copies it
        sizes = " + ".join(f"COALESCE(length({c}), 0)" for c in RECORD_COLUMNS if c in have)
        where, args = ("host = ?", [host]) if up_to_run is None else ("host = ? AND run_id <= ?", [host, up_to_run])
        ids = db.execute(f"SELECT rowid, run_id FROM startups WHERE {where} ORDER BY run_id DESC", args)
        for rowid, run_id in ids:
            too_big = f"history {path}: the row of {host!r} at run {run_id} holds a value of more than " \
                      f"{HISTORY_VALUE_BYTES >> 20} MiB: not a row kvaudit writes (refused)"
            try:
                if not hasattr(db, "setlimit") and db.execute(f"SELECT {sizes} FROM startups WHERE rowid = ?",
                                                              (rowid,)).fetchone()[0] > HISTORY_VALUE_BYTES:
                    raise DiffError(too_big)
                values = db.execute(f"SELECT {columns} FROM startups WHERE rowid = ?", (rowid,)).fetchone()
            except sqlite3.DataError:  # SQLITE_TOOBIG: the value was not read
                raise DiffError(too_big) from None
            record = _record(dict(zip(RECORD_COLUMNS, values)))
            if record is None:
                raise DiffError(f"history {path}: the row of {host!r} at run {run_id} does not hold the types "
                                "kvaudit writes (refused)")
            yield record
    except sqlite3.Error as exc:
        raise DiffError(f"history {path}: {exc}") from None
    finally:
        db.close()


def _believed(path: str, r: Recorded) -> Recorded:
    why = implausible(r)
    if why is not None:
        raise DiffError(f"history {path}: {r.host}@{r.run_id} records {why}: not a startup's terms (refused as "
                        "implausible)")
    return r


def recorded_at(path: str, host: str, run_id: int) -> Recorded:
    """The startup ``host`` ran at ``run_id``: that run's row, or the latest before it (a run the host was down in
    recorded none)."""
    for r in _history_rows(path, host, run_id):
        return _believed(path, r)
    status = _status_at(path, host, run_id)
    kind = Status.of(status)
    if status is not None and kind in (Status.ERROR, Status.FAILED):
        # the run is in the history, its host was not audited or its start failed: say that, as history shows it
        why = "its start failed" if kind is Status.ERROR else "it could not be audited"
        raise DiffError(f"history {path}: {host}@{run_id} has no pool to compare: {why} (status {status} in that "
                        "run; kvaudit history shows it)")
    raise DiffError(f"history {path}: no startup of {host!r} recorded at or before run {run_id}")


def _status_at(path: str, host: str, run_id: int) -> str | None:
    """The host's status in that run, as the history recorded it (None: no such row, or no readable history)."""
    try:
        db = _open_history(path)
        try:
            row = db.execute("SELECT status FROM hosts WHERE host = ? AND run_id = ?", (host, run_id)).fetchone()
        finally:
            db.close()
    except (sqlite3.Error, DiffError):
        return None
    return row[0] if row and isinstance(row[0], str) else None


def recorded_last_two(path: str, host: str) -> tuple[Recorded, Recorded]:
    """``host``'s last two startups (a host audited every night without a restart is one startup: its rows share
    a startup id), older first."""
    found: list[Recorded] = []
    keys: set[Any] = set()
    for r in _history_rows(path, host, None):
        key = r.startup_id or ("run", r.run_id)
        if key in keys:
            continue
        keys.add(key)
        found.append(_believed(path, r))
        if len(found) == 2:
            return found[1], found[0]
    raise DiffError(f"history {path}: {len(found)} startup(s) of {host!r} recorded; a diff needs two "
                    "(HOST@RUN HOST@RUN compares two runs of one startup)")


def audit_of_record(row: Recorded) -> Audit:
    """A startup as the history recorded it: its formula's terms, no ledger. ``kvaudit diff HOST@RUN`` compares
    those (which term moved the tokens); the GiB-by-GiB ledger needs the logs."""
    from kvaudit.engines import by_name
    from kvaudit.reconcile.interface import Formula, ModelSummary, Verdict

    rest = _record_rest(row)
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
