"""What the human-readable reports share: the per-GPU table (ranks that agree folded into one row) and the
plain-language summary. Only arranges numbers the reconciler produced."""

from __future__ import annotations

import re

from kvaudit.reconcile.interface import Audit, Finding, RankLedger, Severity, Verdict
from kvaudit.verdict import FAILURE_CODES, brief, checked, unchecked_reason
from kvaudit.record import record

COLUMNS = ("GPU", "T", "weights", "KV", "graphs", "draft", "other", "free@pool", "free@end", "unexpl.")
#: the hybrid models' state pool gets its own column, after KV, when any rank has one
STATE_COLUMN = "state"
#: what went before T (CUDA context, NCCL, other processes), a column before T when the card's total is given
BEFORE_T_COLUMN = "before T"
COLUMN_HELP = {
    "T": "the memory the ledger accounts for",
    "other": "request table, allocator rounding, activations, non-torch, headroom",
    "graphs": "target CUDA graphs + attention-backend buffers",
    "draft": "draft model: weights, KV, graphs",
    "state": "a hybrid model's Mamba/conv state pool (same budget as the KV cache)",
    "free@pool": "free after the KV pool was allocated",
    "free@end": "free at the end of startup",
    "unexpl.": "T minus every item minus free@end",
}


def _sum(r: RankLedger, pred) -> float | None:
    vals = [i.gib for i in r.items if pred(i.key) and i.gib is not None]
    return sum(vals) if vals else None


def _group(key: str) -> str:
    if key in ("weights", "torch_peak", "weights_external"):
        return "weights"
    if key in ("kv_cache", "kv_cache_swa", "kv_cache_self") or key.startswith("pool_"):
        return "kv"
    if key == "state_pool":
        return "state"
    if key.startswith("graphs_target") or key == "attention_backend":
        return "graphs"
    if key.startswith("draft") or key.startswith("graphs_draft"):
        return "draft"
    if key == "before_t":
        return "before_t"
    return "other"


def has_state(a: Audit) -> bool:
    return any(i.key == "state_pool" for r in a.ranks for i in r.items)


def has_before_t(a: Audit) -> bool:
    """A rank itemises what went before T (``--gpu-memory-gib`` gave the card's total: total - T)."""
    return any(i.key == "before_t" and i.gib is not None for r in a.ranks for i in r.items)


def columns(a: Audit) -> tuple[str, ...]:
    """The per-GPU table's columns for this audit: the state column only where a state pool exists; "before T"
    before T where the card's total was given (what ``--gpu-memory-gib`` is for)."""
    cols = COLUMNS[:4] + (STATE_COLUMN,) + COLUMNS[4:] if has_state(a) else COLUMNS
    return cols[:1] + (BEFORE_T_COLUMN,) + cols[1:] if has_before_t(a) else cols


def version_text(v: str) -> str:
    """An engine version as the log allows it, in words: "0.6.5..0.10.99" (kvaudit's bounds, ".99" standing for any
    patch release) is "0.6.5 to 0.10.x", ">=0.9.1" is "0.9.1 or later", "A..A" is "A"; an exact one as it is."""
    def bound(x: str) -> str:
        return x[:-3] + ".x" if x.endswith(".99") else x

    if v.startswith(">="):
        return f"{v[2:]} or later"
    low, dots, high = v.partition("..")
    if not dots:
        return v
    return bound(low) if low == high else f"{bound(low)} to {bound(high)}"


def origin(a: Audit) -> str:
    """Where in the input the numbers come from, for the reports' heading."""
    if a.from_endpoint:
        return "live numbers (no startup log)"
    return f"startup {a.startup_index} of {a.startups_total} (lines {a.first_line}-{a.last_line})"


def column_help(a: Audit) -> dict[str, str]:
    """The per-GPU table's legend for this audit: T said in the engine's own terms, the state column only
    where there is one."""
    t = ("free before the weights (what the fraction applies to)" if a.engine == "sglang" else
         "the card's total")
    out = {k: v for k, v in COLUMN_HELP.items() if k != STATE_COLUMN or has_state(a)}
    if has_before_t(a):
        out = {BEFORE_T_COLUMN: "the card's total (--gpu-memory-gib) minus T: CUDA context, NCCL, other processes",
               **out}
    out["T"] = t
    return out


def rank_cells(r: RankLedger, with_state: bool = False) -> tuple[float | None, ...]:
    """T, weights, KV, graphs, draft, other, free@pool, free@end, unexplained; the state pool after KV when
    ``with_state``."""
    state = (_sum(r, lambda k: _group(k) == "state"),) if with_state else ()
    return (
        r.pre_load_free_gib,
        r.weights_gib if r.weights_gib is not None else _sum(r, lambda k: _group(k) == "weights"),
        _sum(r, lambda k: _group(k) == "kv"),
        *state,
        _sum(r, lambda k: _group(k) == "graphs"),
        _sum(r, lambda k: _group(k) == "draft"),
        _sum(r, lambda k: _group(k) == "other"),
        r.free_after_pool_gib,
        r.free_at_end_gib,
        r.unexplained_gib,
    )


def token_span(iv) -> str:
    """A predicted token interval as the reports print it: one number when both ends agree ("A..A" is one)."""
    return "-" if not iv else f"{iv.low:,}" if iv.low == iv.high else f"{iv.low:,}..{iv.high:,}"


def fmt(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    if signed and round(v, 2) == 0:
        return "+0.00"  # not "-0.00": a rounding's sign says nothing
    return f"{v:+.2f}" if signed else f"{v:.2f}"


@record
class Row:
    ranks: tuple[str, ...]
    cells: tuple[str, ...]

    @property
    def label(self) -> str:
        return fold_labels(self.ranks)


def fold_labels(labels: tuple[str, ...]) -> str:
    if len(labels) == 1:
        return labels[0]
    if all(l.startswith("TP") and l[2:].isdigit() for l in labels):
        nums = sorted(int(l[2:]) for l in labels)
        parts, start, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:  # type: ignore[list-item]
            if n is not None and n == prev + 1:
                prev = n
                continue
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            if n is not None:
                start = prev = n
        return "TP" + ",".join(parts)
    joined = ",".join(labels)
    # ranks named by their pids (a V0 driver and its workers) do not fold into a range: a long row of them
    # would push the table's columns off the page; the JSON keeps every rank
    return joined if len(joined) <= 24 else f"{labels[0]} +{len(labels) - 1} more"


def rows(audit: Audit) -> list[Row]:
    """Ranks whose printed numbers are all equal share one row, in rank order of their first member."""
    groups: dict[tuple[str, ...], list[str]] = {}
    state = has_state(audit)
    before = has_before_t(audit)
    for r in audit.ranks:
        vals = rank_cells(r, state)
        cells = tuple(fmt(v, signed=(i == len(vals) - 1)) for i, v in enumerate(vals))
        if before:
            cells = (fmt(_sum(r, lambda k: k == "before_t")),) + cells
        groups.setdefault(cells, []).append(r.label)
    return [Row(tuple(labels), cells) for cells, labels in groups.items()]


def not_reached(a: Audit) -> bool:
    """The startup failed before its formula had a single input: the report leads with the cause instead of
    an empty formula table."""
    f = a.formula
    failed = any(fi.code in FAILURE_CODES and not fi.ignored for fi in a.findings)
    empty = all(v is None for v in (f.pre_load_free_gib, f.post_load_free_gib, f.rest_gib, f.predicted_tokens,
                                    f.logged_tokens, f.bytes_per_token))
    sized = any(fi.fields.get("pool_sized") for fi in a.findings)  # it failed after the pool was sized
    return failed and empty and not sized and not any(r.value is not None for r in a.formula_rows if r.unit == "GiB")


def _failed_before_pool(a: Audit) -> Finding | None:
    """The failure that ended a startup before any KV pool existed (NOT_ENOUGH_MEMORY first, else
    STARTUP_FAILED), or None: a count was logged, the pool was sized (``pool_sized``), or nothing failed."""
    if a.formula.logged_tokens is not None or a.formula.verdict != Verdict.UNKNOWN:
        return None
    failed = [fi for fi in a.findings if fi.code in FAILURE_CODES]
    if not failed or any(fi.fields.get("pool_sized") for fi in failed) or any(
            "after the KV pool" in fi.message for fi in failed):
        return None
    memory = next((fi for fi in failed if fi.code == "NOT_ENOUGH_MEMORY"), None)
    # a failure of another kind may come after a pool an excerpt does not show: only the engine's own word
    # (the audit's "no pool to check") or a memory failure, which stops the sizing, says no pool existed
    if memory is None and not (a.formula.verdict_reason or "").startswith("no pool to check"):
        return None
    return memory or failed[0]


_ENGINE_ADVICE = re.compile(r"((?:Please )?[Tt]ry (?:increasing|decreasing|to increase|to decrease|lowering|reducing)"
                            r"[^.;]*)")


def _next_step(fi: Finding) -> str | None:
    """What to do next, as the failure's own message gives it: kvaudit's clause after ' -> ' (the setting that
    would have fit), the fraction SGLang's formula needs, else the engine's own 'Try increasing ...'."""
    msg = fi.message
    if " -> " in msg:
        return msg.split(" -> ", 1)[1].rstrip(". ")
    if isinstance(fi.fields.get("next_step"), str):  # the engine's reconciler says it (the setting that would fit)
        return str(fi.fields["next_step"])
    m = _ENGINE_ADVICE.search(msg)
    return m.group(1).rstrip(". ") + " (the engine's own advice)" if m else None


def summary_sentences(a: Audit) -> list[str]:
    """A few plain sentences: where the memory went, whether the pool size is right, what is wrong."""
    out: list[str] = []
    f = a.formula
    ranks = [r for r in a.ranks if r.pre_load_free_gib is not None]
    if ranks:
        # the rank with the tightest end, among those whose ledger adds up (an unexplained figure means every
        # item and the end were read) before those with gaps: the sentence is a sum, and a sum needs its terms
        r = min(ranks, key=lambda x: (x.unexplained_gib is None,
                                      x.free_at_end_gib if x.free_at_end_gib is not None else 1e9))
        parts = []
        others = [i.label.split(" (")[0] for i in r.items if _group(i.key) == "other" and i.gib is not None]
        other_name = (" and ".join(others) if len(others) <= 2 else ", ".join(others[:-1]) + " and " + others[-1]) \
            if others else "other items"
        names: tuple[str, ...] = ("weights", "the KV cache", "CUDA graphs", "the draft model", other_name)
        if has_state(a):
            names = names[:2] + ("the state pool",) + names[2:]
        unread: list[str] = []
        listed = 0.0
        for name, v in zip(names, rank_cells(r, has_state(a))[1:len(names) + 1]):
            if v is not None:
                listed += v
                if name == other_name and round(v, 2) == 0:
                    continue  # "request table 0.00" says nothing; the sum is the same without it
                parts.append(f"{name} {v:.2f}"
                             + (f" ({f.logged_tokens:,} tokens)" if name == "the KV cache" and f.logged_tokens else ""))
            elif name == "the KV cache":
                unread.append(name)
        s = (f"On {r.label}, of the {r.pre_load_free_gib:.2f} GiB {a.pre_load_label}: "
             + (", ".join(parts) if parts else "nothing allocated yet"))
        if r.free_at_end_gib is not None:
            s += f"; {r.free_at_end_gib:.2f} GiB was free at the end"
            if not r.end_is_final and r.free_at_end_source:
                s += f" of what the log shows ({r.free_at_end_source})"
        else:
            unread.append("the free memory at the end")
        if r.unexplained_gib is None:
            # no unexplained figure: a term of the sum is missing; say how much the listed items leave and which
            # terms the log does not give, so the sentence still adds up to T
            rest = (r.pre_load_free_gib or 0.0) - listed - (r.free_at_end_gib or 0.0)
            s += (f"; the other {rest:.2f} GiB is not broken down: the log gives no figure for "
                  + (", ".join(unread[:-1]) + " or " + unread[-1] if len(unread) > 1 else
                     unread[0] if unread else "every item"))
        if r.unexplained_gib is not None:
            tol = r.unexplained_tolerance_gib or 0
            un = fmt(r.unexplained_gib, True)
            s += (f", and {un} GiB is unexplained (within rounding, +-{tol:.2f})"
                  if abs(r.unexplained_gib) <= tol + 0.01 else f", and {un} GiB is unexplained")
        out.append(s + ".")
    engine = a.engine_display or a.engine
    if f.verdict == Verdict.MATCH:
        out.append(f"The KV pool size is exactly what {engine}'s formula gives for these numbers ({f.verdict_reason}).")
    elif f.verdict == Verdict.EXPLAINED:
        out.append(f"The KV pool size differs from the plain formula, for a known reason: {f.verdict_reason}.")
    elif f.verdict == Verdict.MISMATCH:
        # the reason once: where a finding above says it (TOKENS_MISMATCH carries the same sentence), point to it
        said = next((fi for fi in a.findings if fi.severity != Severity.INFO and not fi.ignored
                     and fi.message.rstrip(".").startswith(f.verdict_reason.rstrip(".")[:80])), None)
        out.append(f"The KV pool size does not follow from the formula ({said.code}, under Needs attention)."
                   if said is not None else f"The KV pool size does not follow from the formula: {f.verdict_reason}.")
    elif (died := _failed_before_pool(a)) is not None:
        # no pool existed: "not checked: the log lacks the count" would blame the log (ux audit item 36)
        step = _next_step(died)
        out.append("No KV pool was in place: the startup failed before it, so there is no pool size to check"
                   + (f". Next step: {step}" if step else " (the failure is under Needs attention)") + ".")
    else:
        out.append(f"The pool size was not checked: {unchecked_reason(f.verdict_reason)}.")
    for fi in a.findings:
        if fi.code == "RESERVE_EXPLAINS_FREE":
            out.append(fi.message)
    problems = [fi for fi in a.findings if fi.severity != Severity.INFO and not fi.ignored]
    if problems:
        out.append("Needs attention: " + " ".join(f"[{p.code}] {brief(p.message)}." for p in problems))
    elif not any(fi.code == "RESERVE_EXPLAINS_FREE" for fi in a.findings):
        # "nothing looks wrong" only when a check ran and held; otherwise say that nothing was checked
        if checked(a):  # the verdict's own test (kvaudit.verdict.judge): OK only when a check held
            out.append("Nothing looks wrong in what this source shows (Notes say what it cannot see)."
                       if a.from_endpoint else "Nothing looks wrong.")
        else:
            out.append("No problem was found, but the pool size could not be checked (above), so this is not "
                       "a clean bill of health.")
    return out
