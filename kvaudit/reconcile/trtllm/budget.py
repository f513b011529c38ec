"""The KV budget as an interval carried from the logged rounding, what bounds it (a multimodal reservation, a
v2 quota, configured caps), whether it adds up with the logged available memory, and the token count it
predicts after the block rounding the C++ pool does."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding, TokenInterval, Verdict
from kvaudit.reconcile.trtllm.cell import Cell
from kvaudit.reconcile.trtllm.context import Context
from kvaudit.reconcile.trtllm.facts import Pool
from kvaudit.units import GIB, LOG_HALF_ULP
from kvaudit.record import record

BUDGET_TOLERANCE_GIB = 0.02  # three logged 2-decimal values through a fraction below 1


@record
class Free:
    """What the fraction was applied to on one rank, as an interval: (total - peak + temporary KV) on the
    PyTorch path (each term +-0.005), the logged ``available`` on the C++ path."""

    lo: float
    hi: float
    text: str  # how it was formed, for messages
    rule: str

    @property
    def mid(self) -> float:
        return (self.lo + self.hi) / 2

    @property
    def cpp(self) -> bool:
        return self.rule.endswith("(C++)")


def free_after_profiling(r: dict[str, float]) -> Free | None:
    if "peak_gib" in r and "total_gib" in r:
        T, P = r["total_gib"], r["peak_gib"]
        tmp = r.get("tmp_kv_gib")
        ulps = 3 if tmp is not None else 2
        free = T - P + (tmp or 0.0)
        text = f"{T:.2f} - {P:.2f}" + (f" + {tmp:.2f}" if tmp is not None else "")
        rule = "(total - peak + temporary KV) x fraction" if tmp is not None else "(total - peak) x fraction"
        return Free(free - ulps * LOG_HALF_ULP, free + ulps * LOG_HALF_ULP, text, rule)
    if "cpp_available_gib" in r:
        A = r["cpp_available_gib"]
        return Free(A - LOG_HALF_ULP, A + LOG_HALF_ULP, f"{A:.2f} available", "available x fraction (C++)")
    return None


@dataclass
class Budget:
    """The KV budget interval (GiB) and what established it."""

    frees: dict[str, Free]
    smallest: Free | None  # the engine sizes every rank by the smallest
    lo: float | None
    hi: float | None
    rule: str | None
    available_logged: float | None
    capped: list[Finding] = field(default_factory=list)
    #: what the budget check found (BUDGET_RECONCILES / BUDGET_MISMATCH), returned to the caller (issue 33)
    findings: tuple[Finding, ...] = ()

    @property
    def mid(self) -> float | None:
        return None if self.lo is None or self.hi is None else (self.lo + self.hi) / 2


def kv_budget(ctx: Context, pool: Pool) -> Budget:
    """The budget; its check's findings are in ``Budget.findings`` and the caps that bound it in ``Budget.capped``
    (returned, not appended to a list the caller hands in: issue 33)."""
    frees = {rr.rank.display: f for rr in ctx.facts.values() if (f := free_after_profiling(rr.r)) is not None}
    smallest = min(frees.values(), key=lambda f: f.lo) if frees else None
    available = ctx.first("available_gib")
    b = Budget(frees, smallest, None, None, smallest.rule if smallest else None, available)
    frac, mm = ctx.fraction, ctx.multimodal_gib
    if smallest is not None:
        b.lo, b.hi = smallest.lo * frac - mm, smallest.hi * frac - mm
        if mm and available is not None:
            # the multimodal encoder reservation comes off the KV budget; whether before or after the fraction
            # is not documented: the logged available memory says which
            before = ((smallest.lo - mm) * frac, (smallest.hi - mm) * frac)
            if not b.lo - LOG_HALF_ULP <= available <= b.hi + LOG_HALF_ULP and \
                    before[0] - LOG_HALF_ULP <= available <= before[1] + LOG_HALF_ULP:
                b.lo, b.hi = before
                ctx.notes.append(f"the {mm:.2f} GiB multimodal encoder reservation came off before the fraction")
            else:
                ctx.notes.append(f"the {mm:.2f} GiB multimodal encoder reservation came off the KV budget after "
                                 "the fraction")
        b.findings = tuple(_budget_check(ctx, b, pool))
    elif available is not None:  # the peak line without the device total: its own rounding only
        b.lo, b.hi = available - LOG_HALF_ULP, available + LOG_HALF_ULP
        b.rule = "the logged available KV memory"
    quota = ctx.first("quota_gib")
    if quota is not None:
        ctx.notes.append(f"KV cache manager v2: device quota {quota:.2f} GiB")
        b.lo, b.hi = ((min(b.lo, quota), min(b.hi, quota)) if b.lo is not None and b.hi is not None
                      else (quota, quota))
    for c in ctx.caps:
        if c.kind in ("max_tokens", "max_gpu_total_bytes") and c.result_gib is not None:
            budget_hi = b.hi
            b.lo = min(b.lo, c.result_gib - LOG_HALF_ULP) if b.lo is not None else c.result_gib - LOG_HALF_ULP
            b.hi = min(b.hi, c.result_gib + LOG_HALF_ULP) if b.hi is not None else c.result_gib + LOG_HALF_ULP
            if budget_hi is None or c.result_gib < budget_hi - LOG_HALF_ULP:
                b.capped.append(F.capped_by(c.kind, c.tokens, c.limit_gib, budget_hi))
    return b


def _budget_check(ctx: Context, b: Budget, pool: Pool) -> list[Finding]:
    s = b.smallest
    assert s is not None and b.lo is not None and b.hi is not None
    ranks = sorted(b.frees)
    if b.available_logged is not None:
        K = b.available_logged
        if b.lo - LOG_HALF_ULP - 1e-9 <= K <= b.hi + LOG_HALF_ULP + 1e-9:
            mm = f", less the multimodal reservation {ctx.multimodal_gib:.2f}" if ctx.multimodal_gib else ""
            return [F.budget_reconciles(f"({s.text}) x {ctx.fraction:g}{mm} = {K:.2f} GiB available for the KV cache",
                                        ranks)]
        worst = min(b.frees, key=lambda k: b.frees[k].lo)
        return [F.budget_mismatch(worst, K - (b.lo + b.hi) / 2, BUDGET_TOLERANCE_GIB, ranks)]
    if pool.gib is not None and s.cpp and pool.tokens:
        # the C++ line states no available KV memory: the allocated pool is fraction x available, to within one
        # block of rounding and the pool line's own 0.005
        slack = LOG_HALF_ULP + (pool.gib / pool.tokens) * (ctx.block or 128)
        if b.lo - slack <= pool.gib <= b.hi + slack:
            at = " (the default fraction, which the log does not state)" if ctx.fraction_assumed else ""
            return [F.budget_reconciles(f"{s.text} x {ctx.fraction:g}{at} = {(b.lo + b.hi) / 2:.2f} GiB, and the pool "
                                        f"is {pool.gib:.2f} GiB", ranks)]
    return []


def round_up(tokens: int, block: int) -> int:
    return math.ceil(tokens / block) * block


@record
class Prediction:
    interval: TokenInterval | None
    verdict: Verdict
    reason: str
    effective_fraction: float | None = None


def predict(ctx: Context, b: Budget, cell: Cell, pool: Pool) -> Prediction:
    """Tokens = ceil(floor(budget / bytes per token) / block) x block over the budget interval; or why the
    log does not allow the check."""
    logged = pool.tokens
    unknown = _why_not(ctx, b, cell, logged, pool)
    if unknown:
        return Prediction(None, Verdict.UNKNOWN, unknown)
    assert b.lo is not None and b.hi is not None and cell.bytes and ctx.block and logged is not None
    block, c = ctx.block, cell.bytes
    interval = TokenInterval(round_up(math.floor(max(0.0, b.lo) * GIB / c), block),
                             round_up(math.floor(b.hi * GIB / c), block))
    if interval.low <= logged <= interval.high:
        return Prediction(interval, Verdict.MATCH, match_text(logged, max(0.0, b.lo), b.hi, c, block))
    if b.capped and logged < interval.low:
        return Prediction(interval, Verdict.EXPLAINED,
                          f"{logged:,} tokens: the configured cap, not the fraction, sized the pool")
    implied = logged * c / GIB
    eff = round((implied + ctx.multimodal_gib) / b.smallest.mid, 4) if b.smallest else None
    return Prediction(interval, Verdict.MISMATCH,
                      f"{logged:,} tokens is not what {b.lo:.2f}..{b.hi:.2f} GiB holds at {c:,} B/token "
                      f"({interval.low:,}..{interval.high:,}); the count implies {implied:.2f} GiB", eff)


def reproducing_gib(logged: int, lo: float, hi: float, cell: int, block: int) -> str | None:
    """The shortest decimal budget (GiB) within lo..hi for which ceil(floor(budget / cell) / block) x block is the
    logged count, as printed: an operator who redoes the printed equation by hand gets the logged figure (ux
    audit item 8: the interval's middle can give another count)."""
    for places in range(2, 10):
        step = 10 ** -places
        x = math.ceil(lo / step) * step
        while x <= hi + 1e-12:
            text = f"{x:.{places}f}"
            if round_up(math.floor(float(text) * GIB / cell), block) == logged:
                return text
            if round_up(math.floor(x * GIB / cell), block) > logged:
                break
            x += step
    return None


def match_text(logged: int, lo: float, hi: float, cell: int, block: int) -> str:
    """The MATCH line: the equation with a budget that gives the logged count, and the logged rounding's span."""
    x = reproducing_gib(logged, lo, hi, cell, block)
    span = f"{lo:.4f}..{hi:.4f} GiB"
    if x is None:
        return f"{logged:,} tokens = ceil(floor(budget / {cell:,} B) / {block}) x {block} for a budget in {span}"
    return (f"{logged:,} tokens = ceil(floor({x} GiB / {cell:,} B) / {block}) x {block}; the logged rounding puts "
            f"the budget in {span}")


def _why_not(ctx: Context, b: Budget, cell: Cell, logged: int | None, pool: Pool) -> str:
    if logged is None:
        return "cannot check: " + pool.missing()
    if len(ctx.windows) > 1:
        return ("variable sliding-window attention: BlockManager::calculateWindowSizeToShare splits the budget by "
                "each window's layers and bytes per token, which the log does not give; the per-window counts are "
                "in the notes")
    if ctx.speculative and cell.source == "config":
        return ("speculative decoding is on: the draft model's KV layers add to the bytes per token, which the model "
                "config alone does not give (a log with 'kv size' states the total)")
    if b.lo is None:
        return ("cannot check: the log has neither the profiling peak line nor the C++ 'Memory usage when "
                "calculating max tokens' line")
    if cell.source == "kv_line":
        why = ("the config's were not used and the log has no 'kv size'" if ctx.opts.model_geometry is not None
               else "no --model-config and no 'kv size' in the log")
        return (f"bytes per token were derived from the pool line itself ({why}), so the token count cannot be "
                "checked independently")
    if ctx.block is None:
        return "the log does not state the tokens per block ('Number of tokens per block')"
    return ""
