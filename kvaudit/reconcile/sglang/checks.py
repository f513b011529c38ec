"""Findings drawn from the ledgers and from the failure lines of a startup."""

from __future__ import annotations

from kvaudit.parse.sglang import Failure
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding, Formula, RankLedger, Thresholds
from kvaudit.reconcile.sglang.context import Context
from kvaudit.units import GIB, Interval

def ledger_findings(ctx: Context, ledgers: tuple[RankLedger, ...], formula: Formula, reserve: Interval | None,
                     th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    # rank imbalance: the formula sizes every rank by the smallest T and post
    worst = None
    for what, attr in (("free memory before the weights (T)", "pre_load_free_gib"),
                       ("free memory after the weights", "free_after_weights_gib")):
        vals = [(l.label, getattr(l, attr)) for l in ledgers if getattr(l, attr) is not None]
        if len(vals) < 2:
            continue
        lo, hi = min(vals, key=lambda x: x[1]), max(vals, key=lambda x: x[1])
        spread = hi[1] - lo[1]
        if spread > max(th.rank_imbalance_gib, th.rank_imbalance_fraction * hi[1]) and (
                worst is None or spread > worst[3]):
            worst = (what, lo, hi, spread)
    if worst is not None:
        out.append(F.rank_imbalance(*worst, formula.bytes_per_token))

    # does the static reserve explain the memory free after the pool?
    if reserve is not None and formula.mem_fraction_static_source != "inferred":
        explained = []
        for l in ledgers:
            if l.free_after_pool_gib is None or l.free_after_weights_gib is None or l.kv_gib is None:
                continue
            req = item_gib(l, "request_table")
            rnd = item_gib(l, "allocator_rounding")
            pools = sum(it.gib or 0 for it in l.items if it.key == "kv_cache" or it.key.startswith("pool_"))
            expected = l.free_after_weights_gib - pools - req - rnd
            tol = th.reserve_tolerance_gib + (0.0 if l.item("allocator_rounding") else 0.08)
            if abs(l.free_after_pool_gib - expected) <= tol:
                explained.append(l)
        if explained:
            l = min(explained, key=lambda x: x.free_after_pool_gib or 0)
            out.append(F.reserve_explains_free(l, reserve.mid, formula, item_gib(l, "request_table"),
                                               item_gib(l, "allocator_rounding"), [x.label for x in explained],
                                               len(ledgers)))

    off = [l for l in ledgers if l.unexplained_gib is not None
           and abs(l.unexplained_gib) > th.unexplained_gib + (l.unexplained_tolerance_gib or 0)]
    if off:
        out.append(F.unexplained(off))

    # memory idle at the end of startup (or after the pool, when the log stops before the end)
    for l in ledgers:
        t = l.pre_load_free_gib
        idle = l.free_at_end_gib if l.end_is_final else l.free_after_pool_gib
        if t and idle is not None and idle >= max(th.unused_min_gib, th.unused_fraction * t):
            extra = int(idle * GIB / formula.bytes_per_token) if formula.bytes_per_token else None
            out.append(F.unused_memory(l, idle, t, formula, extra, l.end_is_final))
            break
    low = [l for l in ledgers if l.end_is_final and l.free_at_end_gib is not None
           and l.free_at_end_gib < th.low_headroom_gib]
    if low:
        out.append(F.low_headroom(min(low, key=lambda x: x.free_at_end_gib or 0), th.low_headroom_gib))
    return out


def item_gib(l: RankLedger, key: str) -> float:
    it = l.item(key)
    return (it.gib or 0.0) if it else 0.0


def failure_findings(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    failures = ctx.startup.of(Failure)
    seen: set[str] = set()
    for f in failures:
        if f.kind in ("not_enough_memory", "no_kv_memory", "host_memory"):
            key = f.kind
            if key not in seen:
                seen.add(key)
                out.append(F.not_enough_memory(f.message, f.line, f.numbers))
        elif f.kind == "unbalanced":
            if "unbalanced" not in seen:
                seen.add("unbalanced")
                out.append(F.engine_unbalanced(f.line, f.numbers))
    fatal = [f for f in failures if f.kind in ("traceback", "exception", "oom", "pool_too_small",
                                                 "not_enough_memory", "no_kv_memory", "unbalanced")]
    if fatal and ctx.summary is None:
        first = fatal[0]
        detail = next((f.message for f in fatal if f.kind in ("exception", "oom", "not_enough_memory",
                                                               "no_kv_memory")), first.message)
        out.append(F.startup_failed(first.line, detail))
    return out
