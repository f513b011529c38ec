"""Flat rows of a checked host: one summary per host and one row per GPU. The shape CSV, Prometheus,
HTML and the history share, so they all carry the same numbers as the JSON report."""

from __future__ import annotations

from typing import Any

from kvaudit.reconcile.interface import RankLedger, Severity, Verdict
from kvaudit.results import HostAudit
from kvaudit.status import Status
from kvaudit.units import GIB
from kvaudit.verdict import brief, judge_host, unchecked_reason

GPU_FIELDS = ("host", "gpu", "uuid", "rank", "status", "kv_tokens", "kv_bytes", "kv_gib", "weights_gib",
              "graphs_gib", "draft_gib", "reserve_gib", "unexplained_gib", "pre_load_free_gib", "free_at_end_gib",
              "free_now_gib", "before_t_gib", "drift_gib", "foreign_gib", "verdict")


def findings(h: HostAudit) -> list:
    return list(h.all_findings)


def pool_check(verdict: str | None) -> str:
    """The pool check in three states, as Prometheus and the tables carry it: ``match`` (the formula holds, or a
    known rule explains the difference), ``mismatch``, or ``not_checked`` (unknown, or no audit)."""
    if verdict in (Verdict.MATCH.value, Verdict.EXPLAINED.value):
        return "match"
    if verdict == Verdict.MISMATCH.value:
        return "mismatch"
    return "not_checked"


def startup_id(h: HostAudit) -> str | None:
    """Which start of the server was audited: the unit's invocation id, else the log source and the startup's
    first line (a docker source names its start time). A new value in the next run is a restart."""
    c, a = h.collected, h.audit
    if c is None or a is None:
        return None
    if c.invocation_id:
        return f"invocation {c.invocation_id}"
    if a.from_endpoint:
        return None  # a live endpoint has no startup to tell apart
    return f"{c.source} startup at line {a.first_line}"


def why_items(h: HostAudit) -> list[str]:
    """Why a host is not ok, item by item: the failure and its reason; else each finding above info (its code and
    first sentences) and each thing that could not be read; the pool's reason when it could not be checked.
    Empty for an ok host. (The fleet's reports have no Findings section: nothing points to one.)"""
    if h.error is not None:
        return [f"{h.error.reason}: {h.error}"]
    if h.audit is not None and judge_host(h).status is Status.UNCHECKED:
        return [f"not checked: {brief(unchecked_reason(h.audit.formula.verdict_reason), None)}"]
    parts = [f"{f.code}: {brief(f.message, None)}" for f in sorted(findings(h), key=lambda f: -f.severity.rank)
             if f.severity != Severity.INFO and not f.ignored]
    return parts + [f"missing: {p}" for p in h.partial]


def why(h: HostAudit) -> str:
    """:func:`why_items` in one line."""
    return "; ".join(why_items(h))


def _sum(r: RankLedger | None, pred) -> float | None:
    if r is None:
        return None
    vals = [i.gib for i in r.items if pred(i.key) and i.gib is not None]
    return round(sum(vals), 4) if vals else None


def gpu_rows(name: str, h: HostAudit) -> list[dict[str, Any]]:
    a = h.audit
    st = judge_host(h).label
    tokens = a.formula.logged_tokens if a else None
    reserve = a.formula.reserve_gib if a else None
    verdict = a.formula.verdict.value if a else None
    by_label = {r.label: r for r in (a.ranks if a else ())}
    rows = []
    used: set[str] = set()

    def row(gpu, uuid, r: RankLedger | None, g=None) -> dict[str, Any]:
        kv = r.kv_gib if r else None
        return {
            "host": name, "gpu": gpu, "uuid": uuid, "rank": r.label if r else None, "status": st,
            "kv_tokens": tokens if r else None,
            "kv_bytes": int(round(kv * GIB)) if kv is not None else None, "kv_gib": kv,
            "weights_gib": r.weights_gib if r else None,
            "graphs_gib": _sum(r, lambda k: k.startswith("graphs_target") or k == "attention_backend"),
            "draft_gib": _sum(r, lambda k: k.startswith("draft") or k.startswith("graphs_draft")),
            "reserve_gib": reserve if r else None,
            "unexplained_gib": r.unexplained_gib if r else None,
            "pre_load_free_gib": r.pre_load_free_gib if r else None,
            "free_at_end_gib": r.free_at_end_gib if r else None,
            "free_now_gib": g.free_gib if g else None,
            "before_t_gib": g.before_t_gib if g else None,
            "drift_gib": g.drift_gib if g else None,
            "foreign_gib": round(sum(f.gib or 0 for f in g.foreign), 3) if g and g.foreign else (0.0 if g else None),
            "verdict": verdict,
        }

    for g in h.gpus:
        r = by_label.get(g.rank) if g.rank else None
        if r:
            used.add(r.label)
        rows.append(row(g.index, g.uuid, r, g))
    for label, r in by_label.items():  # ranks without GPU readings
        if label not in used:
            rows.append(row(None, None, r))
    return rows


def host_summary(name: str, h: HostAudit) -> dict[str, Any]:
    a = h.audit
    fs = findings(h)
    j = judge_host(h)
    frees = [g.free_gib for g in h.gpus if g.free_gib is not None] or [
        r.free_at_end_gib for r in (a.ranks if a else ()) if r.free_at_end_gib is not None]
    unexpl = [r.unexplained_gib for r in (a.ranks if a else ()) if r.unexplained_gib is not None]
    weights = [r.weights_gib for r in (a.ranks if a else ()) if r.weights_gib is not None]
    return {
        "host": name,
        "target": h.target,
        "status": j.label,
        "reason": h.error.reason if h.error else None,
        "error": str(h.error) if h.error else None,
        "engine": a.engine if a else None,
        "gpus": len(h.gpus) or (len(a.ranks) if a else 0),
        "tokens": a.formula.logged_tokens if a else None,
        "verdict": a.formula.verdict.value if a else None,
        "pool_check": pool_check(a.formula.verdict.value if a else None),
        "weights_gib": max(weights) if weights else None,
        "free_min_gib": min(frees) if frees else None,
        "unexplained_gib": max(unexpl, key=abs) if unexpl else None,
        "findings": sorted({f.code for f in fs if f.severity != Severity.INFO and not f.ignored}),
        "all_findings": sorted({f.code for f in fs}),
        "ignored": sorted({f.code for f in fs if f.ignored}),
        "errors": sum(1 for f in fs if f.severity == Severity.ERROR and not f.ignored),
        "warnings": sum(1 for f in fs if f.severity == Severity.WARNING and not f.ignored),
        "infos": sum(1 for f in fs if f.severity == Severity.INFO and not f.ignored),
        "partial": list(h.partial),
        "why": why(h),
        "why_items": why_items(h),
        "headline": j.whole,
        "startup_id": startup_id(h),
    }
