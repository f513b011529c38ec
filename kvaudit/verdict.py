"""The verdict: one judgement per audit, host and fleet, decided by the same rules for every engine.

An engine's reconciler says what it read, derived and assumed (the formula, the ledgers, candidate findings,
each with its amounts). This layer then

1. settles the findings so that no two of them give the same GiB two accounts, or contradict each other
   (:func:`settle`, applied by :meth:`kvaudit.engines.Engine.audit` to every audit an engine produces, so an
   engine module cannot emit a contradiction even if it tries);
2. decides the status and writes the one-line headline every report opens with (:func:`judge`,
   :func:`judge_host`).

The rules are stated in docs/findings.md ("The verdict's rules"); each function below names the rule it keeps.
"""

from __future__ import annotations

import re
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Iterable

from kvaudit import support
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Audit, Finding, Formula, RankLedger, Severity, Verdict
from kvaudit.status import ORDER, ExitStatus, Status, exit_status, FLEET_ORDER
from kvaudit.record import record

if TYPE_CHECKING:  # host and fleet results are judged only where they exist: explain starts without them
    from kvaudit.results import HostAudit

#: findings that say "the startup failed": their message carries the cause quoted from the log
FAILURE_CODES = ("STARTUP_FAILED", "NOT_ENOUGH_MEMORY")
#: findings that say the pool does not follow the formula (rule 4: a formula violation is a finding)
VIOLATION_CODES = ("TOKENS_MISMATCH", "LIVE_POOL_MISMATCH", "BUDGET_MISMATCH", "NOT_ENOUGH_MEMORY",
                   "ASSUMPTION_CONTRADICTED")
#: sources of a formula input that are not the log's, the user's or the config's word (rule 3)
ASSUMED_PREFIXES = ("default", "assumed")


#: the findings that say a check ran: the verdict derives them from the formula (rule 6), never an engine
TOKEN_CODES = ("TOKENS_MATCH", "TOKENS_EXPLAINED", "TOKENS_MISMATCH")
#: info findings that say a check ran and its numbers held
CHECKS_THAT_HELD = ("TOKENS_MATCH", "TOKENS_EXPLAINED", "RESERVE_EXPLAINS_FREE", "BUDGET_RECONCILES")
#: findings that judge the pool against kvaudit's model of it: none is emitted where the model does not reach
#: (rule 7, the support table). Failures quoted from the log, the log's own numbers (headroom, ranks, budgets
#: that add up as logged) and live readings stay: they do not rest on the model
MODEL_JUDGEMENTS = TOKEN_CODES + ("GEOMETRY_MISMATCH", "UNEXPLAINED_MEMORY", "RESERVE_EXPLAINS_FREE",
                                  "ASSUMPTION_CONTRADICTED", "MFS_INFERRED")
#: the widest predicted interval that is still a check, relative to its middle: wider, it cannot fail (rule 8).
#: The logs' own rounding (2 decimals of GiB on T and post, whole blocks or pages) gives every corpus pool an
#: interval of 0.03-1.9 %; the union of two eras' rules is several times wider than the pool itself
MAX_CHECK_WIDTH = 0.05


@record
class Judgement:
    """What every report relays: the status, the one-line headline, the findings that count, and the exit
    status that follows from them. Decided here, for an audit (:func:`judge`) and a host (:func:`judge_host`);
    a fleet's counts and exit status come from its hosts' judgements (:func:`judge_fleet`)."""

    status: Status
    headline: str
    findings: tuple[Finding, ...]
    reason: str | None = None  # failed: the collector's reason (unreachable, auth, ...)
    #: the headline with every sentence whole (``headline`` is cut short for the terminal): what JSON carries
    whole_headline: str | None = None

    @property
    def whole(self) -> str:
        """The headline never cut inside a sentence (docs/json.md: the one line every report opens with)."""
        return self.whole_headline or self.headline

    @property
    def label(self) -> str:
        """The status as every output writes it: ``failed:<reason>`` for a host that could not be audited."""
        return f"{self.status.value}:{self.reason}" if self.status is Status.FAILED else self.status.value

    @property
    def exit_status(self) -> ExitStatus:
        return exit_status(self.status, self.reason)

    @property
    def word(self) -> str:
        """The headline's first word (OK, UNCHECKED, WARNING, ERROR, PARTIAL, FAILED)."""
        return self.status.value.upper()


@record
class FleetJudgement:
    """A fleet run's judgement: how many hosts have each status (worst first) and the run's exit status."""

    counts: dict[Status, int] = field(default_factory=dict)
    exit_status: ExitStatus = ExitStatus.OK

    @property
    def worst(self) -> Status | None:
        return next((s for s in ORDER if self.counts.get(s)), None)


# --- settling an engine's findings --------------------------------------------------------------------------


def settle(a: Audit, geometry: Any = None) -> Audit:
    """The audit with its findings made consistent (rules 1-8). Idempotent: settling twice changes nothing.
    ``geometry``: the model's config (kvaudit.model_config.ModelGeometry), which tells the pool kinds."""
    a = _within_the_model(a, geometry)
    a = _checks_that_can_fail(a)
    findings = _token_findings(list(a.findings), a.formula)
    findings = _incomplete(findings, a)
    findings = _advice_for_the_platform(findings, a.platform is not None and a.platform_kind != "cpu", a.coverage)
    findings = _one_account_per_gib(findings)
    findings = _causes_that_hold(findings, a.ranks)
    findings = _assumptions_said(findings, a.formula, a.model)
    findings = _not_a_check_of_itself(findings, a.formula)
    findings = _violations_are_findings(findings, a.formula)
    findings.sort(key=lambda f: -f.severity.rank)
    return replace(a, findings=tuple(findings))


def subject_of(a: Audit, geometry: Any = None) -> support.Subject:
    """What the audit is, for the support table: the pool kinds the engine declared (``Audit.pool_kinds``), else
    what the model's config or the audit shows; its KV dtype and platform."""
    kinds = list(a.pool_kinds)
    if not kinds:
        arch = (a.model.architecture or "") + " " + str(getattr(geometry, "architecture", "") or "")
        if "DeepseekV4" in arch or "DeepSeekV4" in arch:
            kinds.append("dsv4")
        elif geometry is not None and getattr(geometry, "is_mla", False) or a.model.attention == "mla":
            kinds.append("mla")
            if geometry is not None and getattr(geometry, "index_head_dim", None):
                kinds.append("nsa")
        else:
            kinds.append("dense")
        if geometry is not None and getattr(geometry, "is_hybrid_swa", False):
            kinds.append("swa")
        if (geometry is not None and getattr(geometry, "is_mamba_hybrid", False)) or a.formula.state_pool_gib:
            kinds.append("mamba")
    if a.speculative and "draft" not in kinds:
        kinds.append("draft")
    return support.Subject(a.engine, support.release_range(a.engine_version), tuple(dict.fromkeys(kinds)),
                           support.kv_dtype_kind(a.model.kv_dtype),
                           a.platform_kind or ("unified" if a.platform else "discrete"))


def _within_the_model(a: Audit, geometry: Any) -> Audit:
    """Rule 7. What the support table does not mark modelled is not judged: the pool's verdict is unknown ("not
    modelled here: X in release Y"), and no mismatch, geometry finding or advice rests on it. What is only partly
    modelled is said as a note."""
    if a.coverage is not None:  # settled before
        return a
    cov = support.coverage(subject_of(a, geometry))
    if cov.level == "modelled":
        return replace(a, coverage=cov)
    said = "; ".join(cov.limits)
    if cov.level == "partly":
        return replace(a, coverage=cov, notes=a.notes + (f"partly modelled here: {said}",))
    f = a.formula
    formula = f
    if f.verdict != Verdict.UNKNOWN:
        formula = replace(f, verdict=Verdict.UNKNOWN,
                          verdict_reason=f"not modelled here: {said}; the pool size is not judged")
    findings = tuple(x for x in a.findings if x.code not in MODEL_JUDGEMENTS)
    return replace(a, coverage=cov, formula=formula, findings=findings,
                   notes=a.notes + (f"not modelled here: {said}. kvaudit reports what the log states and judges "
                                    "nothing that rests on its model of the pool",))


def _checks_that_can_fail(a: Audit) -> Audit:
    """Rule 8. A predicted interval is a check only when it is narrow enough to fail: a match over an interval
    wider than MAX_CHECK_WIDTH of its middle (two eras' rules united, an input known only to a wide range) is
    not a match; the verdict is unknown, and says why."""
    f = a.formula
    p = f.predicted_tokens
    if f.verdict != Verdict.MATCH or p is None or p.high <= 0:
        return a
    width = (p.high - p.low) / ((p.high + p.low) / 2)
    if width <= MAX_CHECK_WIDTH:
        return a
    reason = (f"the predicted interval {p.low:,}..{p.high:,} is {width:.0%} wide (a check must be at most "
              f"{MAX_CHECK_WIDTH:.0%}): any pool in it would pass, so it does not check the pool"
              + (f" ({f.rule})" if f.rule else ""))
    return replace(a, formula=replace(f, verdict=Verdict.UNKNOWN, verdict_reason=reason))


def _token_findings(findings: list[Finding], formula: Formula) -> list[Finding]:
    """Rule 6. The pool check's finding follows from the formula's verdict, here, for every engine: an engine
    states its verdict and the worked formula (``Formula.check_text``); TOKENS_MATCH, TOKENS_EXPLAINED and
    TOKENS_MISMATCH are this layer's. (The finding a first settling raised is kept: settling twice changes nothing.)"""
    own = {f.code: f for f in findings if f.code in TOKEN_CODES}
    rest = [f for f in findings if f.code not in TOKEN_CODES]
    v = formula.verdict
    if v == Verdict.MATCH and formula.predicted_tokens is not None and formula.logged_tokens is not None:
        earlier = own.get("TOKENS_MATCH")
        if formula.check_text:
            made = F.tokens_match(formula, formula.check_text)
        elif earlier is not None:
            made = earlier
        elif None not in (formula.post_load_free_gib, formula.pre_load_free_gib, formula.mem_fraction_static,
                          formula.bytes_per_token):
            made = F.tokens_match(formula)
        else:
            made = F.tokens_match(formula, formula.verdict_reason)
        return [replace(made, ignored=_was_ignored(own))] + rest
    if v == Verdict.MISMATCH and any(f.code == "LIVE_POOL_MISMATCH" for f in rest):
        return rest  # a live endpoint's pool mismatch is its own finding, with the bytes per token it implies
    if v in (Verdict.MISMATCH, Verdict.EXPLAINED):
        made = F.tokens_mismatch(formula, v)
        return [replace(made, ignored=_was_ignored(own))] + rest
    return rest


def _incomplete(findings: list[Finding], a: Audit) -> list[Finding]:
    """Rule 6, its other half: a startup whose log does not reach the line that ends the pool's sizing
    (``Audit.lacks``, the engine's words for that line) is INCOMPLETE_LOG, here, for every engine; not when the
    startup failed (a failure is its own end) or when it is said already."""
    if not a.lacks or any(f.code == "INCOMPLETE_LOG" for f in findings) or any(
            f.severity == Severity.ERROR for f in findings):
        return findings
    return findings + [F.incomplete_log(a.last_line, a.lacks)]


def _was_ignored(own: dict[str, Finding]) -> bool:
    return any(f.ignored for f in own.values())


#: what idle memory is on a unified-memory device (kvaudit.platforms): the host's own RAM
UNIFIED_ADVICE = ("this device shares system memory with the host: the idle part is RAM the OS, the page cache and "
                  "other programs also draw on, so no larger fraction is suggested; size it by what the host can spare")


#: what idle memory is where kvaudit does not model the pool: no fraction can be computed for it
UNMODELLED_ADVICE = ("the pool is not modelled here, so no fraction is suggested")


def _advice_for_the_platform(findings: list[Finding], unified: bool, coverage: Any = None) -> list[Finding]:
    """The advice an UNUSED_MEMORY carries (a fraction that would use the idle memory) is given on a card of its own;
    on a unified-memory platform a fraction of system memory is not a GPU's to take, and the finding says so;
    where the pool is not modelled (rule 7) no fraction is computed for it."""
    out = []
    for f in findings:
        if f.code != "UNUSED_MEMORY" or f.fields.get("settled"):
            out.append(f)
            continue
        if coverage is not None and not coverage.judged:
            advice: str | None = UNMODELLED_ADVICE
        else:
            advice = UNIFIED_ADVICE if unified else f.fields.get("advice")
        msg = f.message + (f"; {advice}" if advice else "")
        out.append(replace(f, message=msg, fields={**f.fields, "settled": True, "advice": advice}))
    return out


def _one_account_per_gib(findings: list[Finding]) -> list[Finding]:
    """Rule 1. Free memory after the pool is what the reserve was *for* plus what stayed idle. "Not wasted" is
    said only when no UNUSED_MEMORY speaks of the idle part of the same GPUs; otherwise the reserve finding
    points at it as part of the reserve the operator configured."""
    unused = [f for f in findings if f.code == "UNUSED_MEMORY" and not f.ignored]
    out = []
    for f in findings:
        if f.code != "RESERVE_EXPLAINS_FREE" or f.fields.get("settled"):
            out.append(f)
            continue
        overlap = [u for u in unused if not u.ranks or not f.ranks or set(u.ranks) & set(f.ranks)]
        msg = f.message.rstrip(". ")
        end = f.fields.get("free_at_end_gib")
        final = f.fields.get("free_at_end_is_final") and isinstance(end, (int, float))
        if overlap:
            idle = overlap[0].fields.get("idle_gib")
            late = overlap[0].fields.get("freed_after_sizing_gib")
            amount = f"{idle:.2f} GiB" if isinstance(idle, (int, float)) else "the memory"
            if isinstance(late, (int, float)) and isinstance(idle, (int, float)) and late > 0:
                # one account per GiB: the part given back after sizing is not reserve (UNUSED_MEMORY says which)
                msg += (f". Of the {amount} still free at the end of startup, {min(late, idle):.2f} GiB was given "
                        f"back during CUDA-graph capture and {max(0.0, idle - late):.2f} GiB is reserve you "
                        "configured that nothing used (UNUSED_MEMORY)")
            else:
                msg += (f". The {amount} still free at the end of startup is not what it was held for: reserve you "
                        "configured that nothing used (UNUSED_MEMORY)")
        else:
            if final:
                msg += f"; {end:.2f} GiB was still free for activations at the end of startup"
            msg += ". It is not wasted"
        out.append(replace(f, message=msg + ".", fields={**f.fields, "settled": True,
                                                         "idle_is_unused": bool(overlap)}))
    return out


def _causes_that_hold(findings: list[Finding], ranks: tuple[RankLedger, ...]) -> list[Finding]:
    """Rule 2. A cause named for unexplained memory must be able to hold the amount: a candidate whose largest
    possible size is below it is not offered; memory *more* free than accounted (negative) is held by no
    consumer at all, so the finding says an item was counted too large instead."""
    out = []
    for f in findings:
        if f.code != "UNEXPLAINED_MEMORY" or f.fields.get("settled"):
            out.append(f)
            continue
        amount = f.fields.get("unexplained_gib")
        worst = max((r for r in ranks if r.unexplained_gib is not None),
                    key=lambda r: abs(r.unexplained_gib or 0), default=None)
        if not isinstance(amount, (int, float)) or worst is None:
            out.append(f)
            continue
        tol = worst.unexplained_tolerance_gib or 0.0
        where = f.message.split(" is not accounted", 1)[0]
        need = abs(amount) - tol
        sizes = dict(zip(worst.unmodelled, worst.unmodelled_max_gib)) if worst.unmodelled_max_gib else {}
        able = [c for c in worst.unmodelled if (size := sizes.get(c)) is None or size >= need]
        unable = [(c, size) for c in worst.unmodelled if c not in able and (size := sizes.get(c)) is not None]
        fields = {**f.fields, "settled": True, "candidates": able,
                  "candidates_too_small": {c: s for c, s in unable}}
        if amount < 0:
            freed = f.fields.get("freed_candidates") or []
            msg = (f"{where} is more free than every logged and modelled item allows (rounding allows "
                   f"+-{tol:.2f}): an item was counted larger than it is, or memory was freed that the log does "
                   "not show" + (f" ({'; '.join(freed)})" if freed else "")
                   + "; no unmodelled item can explain memory that is free")
            out.append(replace(f, message=msg, fields={**fields, "candidates": []}, severity=Severity.WARNING))
            continue
        if able:
            said = " or ".join(able)
            covered = f.fields.get("covered_by_unmodelled")
            msg = (f"{where} is not accounted for by any logged or modelled item (rounding allows +-{tol:.2f}); "
                   + (f"probably {said}, which the log does not let kvaudit size" if covered else
                      f"not modelled: {said}"))
        else:
            msg = (f"{where} is not accounted for by any logged or modelled item (rounding allows +-{tol:.2f}); "
                   f"no modelled item can hold {abs(amount):.2f} GiB")
            fields["covered_by_unmodelled"] = False
        if unable:
            msg += " (" + "; ".join(f"{c} is at most {s:.2f} GiB" for c, s in unable) + ")"
        sev = f.severity if able else Severity.WARNING
        out.append(replace(f, message=msg, fields=fields, severity=sev))
    return out


def _assumptions_said(findings: list[Finding], formula: Formula, model: Any) -> list[Finding]:
    """Rule 3. A check that rests on an assumed value cannot produce a mismatch by itself: the mismatch
    becomes ASSUMPTION_CONTRADICTED (info), which says which value was assumed and what the log implies."""
    assumed = [i for i in inputs_of(formula, model) if i.kind == "assumed" and i.name in formula.check_inputs]
    if not assumed:
        return findings
    said = " and ".join(f"{i.name} {i.value:g}" if isinstance(i.value, float) else f"{i.name} {i.value}"
                        for i in assumed) + " (" + "; ".join(str(i.source) for i in assumed) + ")"
    out = []
    for f in findings:
        if f.code == "TOKENS_MISMATCH":
            eff = formula.effective_mem_fraction_static
            implied = (f"; the pool implies a fraction of {eff:g}"
                       if eff is not None and any(i.name == "mem_fraction_static" for i in assumed) else "")
            out.append(Finding("ASSUMPTION_CONTRADICTED", Severity.INFO,
                               f"the pool does not follow the formula with an assumed {said}: the log does not "
                               f"state it{implied}; pass the value the server ran with to check it. {f.message}",
                               {**f.fields, "assumed": [i.name for i in assumed]}, f.ranks, f.ignored))
        else:
            out.append(f)
    return out


def _not_a_check_of_itself(findings: list[Finding], formula: Formula) -> list[Finding]:
    """Rule 3. A value derived from the same line it is checked against is not a check: when the bytes per
    token came from the KV line and the config disagrees with that line (GEOMETRY_MISMATCH), the token
    "match" only shows that the budget equals the line's own size; it is folded into the geometry finding."""
    codes = {f.code for f in findings if not f.ignored}
    if not ({"GEOMETRY_MISMATCH", "TOKENS_MATCH"} <= codes):
        return findings
    if not (formula.bytes_per_token_source or "").startswith(("kv_line", "log")):
        return findings
    out = []
    for f in findings:
        if f.code == "TOKENS_MATCH":
            continue
        if f.code == "GEOMETRY_MISMATCH" and not f.fields.get("settled"):
            f = replace(f, message=f.message + "; the budget holds the pool at the KV line's own bytes per token, "
                        "so the token count is not checked against the config",
                        fields={**f.fields, "settled": True})
        out.append(f)
    return out


def _violations_are_findings(findings: list[Finding], formula: Formula) -> list[Finding]:
    """Rule 4. A formula that does not hold is a finding wherever it was computed, never only a note."""
    if formula.verdict != Verdict.MISMATCH or any(f.code in VIOLATION_CODES for f in findings):
        return findings
    p = formula.predicted_tokens
    return findings + [Finding("TOKENS_MISMATCH", Severity.WARNING, formula.verdict_reason, {
        "logged_tokens": formula.logged_tokens, "predicted_low": p.low if p else None,
        "predicted_high": p.high if p else None,
        "effective_mem_fraction_static": formula.effective_mem_fraction_static,
        "mem_fraction_static": formula.mem_fraction_static})]


@record
class Input:
    """One input of the formula and where it came from (rule 3): ``kind`` is ``log`` (a line, a setting the
    log printed), ``config`` (config.json), ``user`` (a flag), ``derived`` (computed from other inputs) or
    ``assumed`` (a version default or a guess, said as one)."""

    name: str
    value: Any
    source: str | None
    kind: str


def input_kind(source: str | None) -> str:
    s = (source or "").lower()
    if not s:
        return "unknown"
    if s.startswith(ASSUMED_PREFIXES):
        return "assumed"
    if s.startswith(("cli", "user", "--")):
        return "user"
    if s.startswith("config"):
        return "config"
    if s.startswith(("inferred", "derived", "estimated")):
        return "derived"
    return "log"


def inputs(a: Audit) -> list[Input]:
    """The formula's inputs with their sources, in the order the formula uses them."""
    return inputs_of(a.formula, a.model)


def inputs_of(f: Formula, m: Any) -> list[Input]:
    rows = [("mem_fraction_static", f.mem_fraction_static, f.mem_fraction_static_source),
            ("pre_load_free_gib", f.pre_load_free_gib, f.pre_load_free_source),
            ("post_load_free_gib", f.post_load_free_gib, "log" if f.post_load_free_gib is not None else None),
            ("bytes_per_token", f.bytes_per_token, f.bytes_per_token_source),
            ("attention_tp_size", m.attention_tp_size, m.attention_tp_size_source or (
                "log" if m.attention_tp_size is not None else None)),
            ("page_size", f.page_size, (f.page_size_source or "log") if f.page_size is not None else None),
            ("max_total_tokens_cap", f.max_total_tokens_cap, "log" if f.max_total_tokens_cap else None)]
    return [Input(n, v, src, input_kind(src)) for n, v, src in rows if v is not None]


def unread(a: Audit, lines: tuple[tuple[int, str], ...], total: int) -> Audit:
    """Rule 9. The memory lines of the startup that no grammar read are listed with the audit; where the audit
    says the log lacks a value, it says that such lines exist (the value may stand in one of them)."""
    if not lines:
        return a
    more = f" ({total:,} in all, the first {len(lines)} listed)" if total > len(lines) else ""
    said = (f"; {total:,} memory line{'s' if total != 1 else ''} of this startup {'were' if total != 1 else 'was'} "
            f"not interpreted{more} (listed under 'Not interpreted'): what it lacks may stand there")
    findings = tuple(replace(f, message=f.message + said, fields={**f.fields, "uninterpreted_lines": total})
                     if f.code == "INCOMPLETE_LOG" and "uninterpreted_lines" not in f.fields else f
                     for f in a.findings)
    formula = a.formula
    if formula.verdict == Verdict.UNKNOWN and "not interpreted" not in formula.verdict_reason:
        formula = replace(formula, verdict_reason=formula.verdict_reason + said)
    return replace(a, uninterpreted=lines, findings=findings, formula=formula)


# --- the judgement and its headline -----------------------------------------------------------------------


def counted(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ignored]


def _line_of(f: Finding) -> int | None:
    line = f.fields.get("line")
    return line if isinstance(line, int) and line > 0 else None


TRACEBACK_HEADER = "Traceback (most recent call last)"


def _failure_cause(f: Finding) -> str:
    """The exception as the log stated it, without kvaudit's framing: its first sentence. A traceback's
    header is never the cause; when the log was cut before the exception line, that is said instead."""
    detail = f.fields.get("detail")
    if f.code == "STARTUP_FAILED" and isinstance(detail, str) and detail:
        msg = detail
    else:
        msg = f.message
        if msg.startswith("line ") and ": " in msg:
            msg = msg.split(": ", 1)[1]
        msg = msg.split("; ", 1)[0]
    if TRACEBACK_HEADER in msg:
        msg = msg.split(TRACEBACK_HEADER, 1)[0].rstrip(" :") or "a traceback"
        msg += " (the log ends before the traceback's exception line)"
    tried = _OOM_ASKED.search(msg)
    if tried:  # torch's OOM: the size it asked for is the cause's second half
        return msg[:tried.end()]
    ends = [m.start() for m in _SENTENCE_END.finditer(msg) if m.start() >= 20]
    return msg[:ends[0] + 1] if ends else msg


_OOM_ASKED = re.compile(r"out of memory\. Tried to allocate \d+(?:\.\d+)? [KMG]i?B")


_SENTENCE_END = re.compile(r"(?<!\bi\.e)(?<!\be\.g)(?<!\betc)(?<!\bvs)\. ")


BRIEF_CHARS = 240


def brief(message: str, whole_under: str | None = "Findings") -> str:
    """A finding's message for a summary: whole when short; else its first sentences up to a sentence end
    (an error quoted from the log is printed whole once, in the findings, not twice). ``whole_under``: the
    section of the same report that holds the whole message (None: the report has none, and none is named)."""
    message = message.rstrip(".")
    if len(message) <= BRIEF_CHARS:
        return message
    ends = [m.start() for m in re.finditer(r"(?<!\bi\.e)(?<!\be\.g)(?<!\betc)(?<!\bvs)\. ", message[:BRIEF_CHARS])]
    cut = ends[-1] if ends else -1
    where = f" (whole under {whole_under})" if whole_under else ""
    if cut < 40:
        cut = message.rfind("; ", 0, BRIEF_CHARS)
    if cut < 40:
        cut = message.rfind(" ", 0, BRIEF_CHARS)
        return message[:cut] + " ..." + where
    return message[:cut] + where


def _first_sentence(text: str, limit: int = 160, whole: bool = False) -> str:
    """A message's opening for a headline: its first sentences up to ``limit`` characters, cut with " ..." (the
    terminal's headline, short on purpose); ``whole``: the same sentences never cut inside (the JSON's headline, read
    by scripts and alert bodies): the message whole when short, else up to a sentence end."""
    if whole:
        message = text.rstrip(".")
        if len(message) <= BRIEF_CHARS:
            return message
        ends = [m.start() for m in _SENTENCE_END.finditer(message)]
        within = [e for e in ends if 40 <= e <= BRIEF_CHARS]
        return message[:within[-1]] if within else message[:ends[0]] if ends else message
    s = brief(text).replace(" (whole under Findings)", "").replace(" ... (whole under Findings)", "")
    return s if len(s) <= limit else s[:limit - 1].rsplit(" ", 1)[0] + " ..."


def unchecked_reason(reason: str) -> str:
    """Why the pool could not be checked, without the reconcilers' own "cannot check: " (the sentence that quotes it
    already says so: "the pool size could not be checked: the log lacks ...")."""
    return reason[len("cannot check: "):] if reason.startswith("cannot check: ") else reason


def _ignored_note(findings: Iterable[Finding]) -> str:
    n = sum(1 for f in findings if f.ignored)
    return f" ({n} ignored)" if n else ""


def _ok_answer(a: Audit, whole: bool = False) -> str:
    f = a.formula
    parts = []
    if f.logged_tokens and f.verdict == Verdict.MATCH:
        parts.append(f"{f.logged_tokens:,} tokens = formula")
    elif f.logged_tokens and f.verdict == Verdict.EXPLAINED:
        parts.append(f"{f.logged_tokens:,} tokens, explained: {_first_sentence(f.verdict_reason, 100, whole)}")
    reserve = next((x for x in a.findings if x.code == "RESERVE_EXPLAINS_FREE"), None)
    if reserve is not None and isinstance(reserve.fields.get("free_after_pool_gib"), (int, float)):
        parts.append(f"{reserve.fields['free_after_pool_gib']:.2f} GiB free is the reserve")
    ends = [r.free_at_end_gib for r in a.ranks if r.end_is_final and r.free_at_end_gib is not None]
    if ends:
        parts.append(f"{min(ends):.2f} GiB free for activations")
    if not parts:
        held = next((x for x in a.findings if x.code in ("BUDGET_RECONCILES", "TOKENS_MATCH")), None)
        if held is not None:
            parts.append(_first_sentence(held.message, 140, whole))
    return "; ".join(parts) or "the checks that ran held"


def checked(a: Audit) -> bool:
    """Did a check run and hold (the pool against the formula, or a budget that adds up)?"""
    return a.formula.verdict in (Verdict.MATCH, Verdict.EXPLAINED) or any(
        f.code in CHECKS_THAT_HELD and not f.ignored for f in a.findings)


def judge(a: Audit, extra: Iterable[Finding] = (), partial: tuple[str, ...] = ()) -> Judgement:
    """:func:`_judge`'s judgement, with its headline short (the terminal's) and whole (the JSON's)."""
    short = _judge(a, extra, partial, False)
    return replace(short, whole_headline=_judge(a, extra, partial, True).headline)


def _judge(a: Audit, extra: Iterable[Finding], partial: tuple[str, ...], whole: bool) -> Judgement:
    """Status and headline of one audit (``extra``: a host's live findings; ``partial``: what a check could
    not read). Rule 5: the headline says the status, the root cause or the answer, and where it is. The order
    is :data:`kvaudit.status.ORDER`'s: error, then warning, then partial, then ok (a check held) or unchecked."""
    allf = list(a.findings) + list(extra)
    active = counted(allf)
    ign = _ignored_note(allf)
    errors = [f for f in active if f.severity == Severity.ERROR]
    if errors:
        # the finding that quotes the exception: STARTUP_FAILED's quote, unless it refers to the memory error's own
        # line (vLLM quotes that once, in NOT_ENOUGH_MEMORY)
        started = next((f for f in errors if f.code == "STARTUP_FAILED"), None)
        memory = next((f for f in errors if f.code == "NOT_ENOUGH_MEMORY"), None)
        refers = started is not None and str(started.fields.get("detail", "")).startswith("the error quoted in")
        failure = (memory if (started is None or refers) and memory is not None else started) or memory
        if failure is not None:
            line = _line_of(failure)
            cause = _first_sentence(_failure_cause(failure), 200, whole)
            where = f" (line {line})" if line and f"line {line}" not in cause else ""
            head = f"ERROR startup failed: {cause}{where}"
        else:
            head = f"ERROR {errors[0].code}: {_first_sentence(errors[0].message, whole=whole)}"
        return Judgement(Status.ERROR, head + ign, tuple(allf))
    warnings = [f for f in active if f.severity == Severity.WARNING]
    if warnings:
        first = warnings[0]
        more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
        said = _first_sentence(first.message, whole=whole)
        return Judgement(Status.WARNING, f"WARNING {first.code}: {said}{more}{ign}", tuple(allf))
    if partial:
        answer = _ok_answer(a, whole) if checked(a) else "nothing checked"
        return Judgement(Status.PARTIAL, f"PARTIAL {answer}; missing: {_first_sentence(partial[0], 100, whole)}{ign}",
                         tuple(allf))
    if checked(a):
        where = " (live numbers)" if a.from_endpoint else ""
        return Judgement(Status.OK, f"OK {_ok_answer(a, whole)}{where}{ign}", tuple(allf))
    tokens = f"{a.formula.logged_tokens:,} tokens; " if a.formula.logged_tokens else ""
    return Judgement(Status.UNCHECKED, f"UNCHECKED {tokens}the pool size could not be checked: "
                     f"{_first_sentence(unchecked_reason(a.formula.verdict_reason), 140, whole)}{ign}", tuple(allf))


def judge_host(h: HostAudit) -> Judgement:
    """A checked host: a transport failure first, then its audit's judgement (with its live findings and what
    could not be read)."""
    if h.error is not None:
        return Judgement(Status.FAILED, f"FAILED {h.error.reason}: {h.error}", tuple(h.findings), h.error.reason)
    if h.audit is None:
        active = counted(h.findings)
        worst = max((f.severity.rank for f in active), default=0)
        status = Status.ERROR if worst >= Severity.ERROR.rank else (
            Status.WARNING if worst >= Severity.WARNING.rank else Status.PARTIAL)
        first = next((f for f in active if f.severity.rank == worst and worst > 0), None)

        def head(whole: bool) -> str:
            said = f"{status.value.upper()} no engine startup audited"
            if first is not None:
                said += f"; {first.code}: {_first_sentence(first.message, 120, whole)}"
            return said + (f"; missing: {h.partial[0]}" if h.partial else "")

        return Judgement(status, head(False), tuple(h.findings), whole_headline=head(True))
    return judge(h.audit, h.findings, tuple(h.partial))


def judge_audits(audits: Iterable[Audit]) -> ExitStatus:
    """The exit status of ``explain`` over one or more startups: the worst of their judgements'."""
    statuses = [judge(a).status for a in audits]
    worst = min(statuses, key=lambda s: s.rank, default=Status.OK)
    return exit_status(worst)


def judge_whatif(w: Any) -> ExitStatus:
    """The exit status of a what-if (kvaudit.reconcile.interface.WhatIf): 0 only when the change leaves the
    headroom (``ok``); a change that would not start, risks low headroom or an OOM, or one kvaudit cannot answer
    (nothing computable, or ``unknown``) is 1 (docs/exit-codes.md)."""
    return ExitStatus.OK if w.computed and w.risk == "ok" else ExitStatus.WARNINGS


def judge_fleet(hosts: Iterable[HostAudit]) -> FleetJudgement:
    """A fleet run: each host's status counted, and the run's exit status: the most pressing class among its
    hosts (kvaudit.status.FLEET_ORDER), 0 when every host is ok or unchecked."""
    counts: dict[Status, int] = {}
    codes = set()
    for h in hosts:
        j = judge_host(h)
        counts[j.status] = counts.get(j.status, 0) + 1
        codes.add(j.exit_status)
    ordered = {s: counts[s] for s in ORDER if s in counts}
    return FleetJudgement(ordered, next((c for c in FLEET_ORDER if c in codes), ExitStatus.OK))
