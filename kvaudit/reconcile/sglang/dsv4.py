"""DeepSeek-V4's compressed-attention pools: the engine's own budget line and its division, checked to the digit.

DeepSeek-V4 does not size one KV pool from ``rest / cell``: a configurator splits the budget over a full pool,
an SWA pool, the c4/c128 compressed pools and their state rings, with one coefficient, bytes per *full* token.
The engine prints both ends of that division, and every later size follows from the full-token count:

* launch builds (DeepSeek-V4 images, 2026-04..05; ``DSv4MemoryCalculator`` with ``profile_available_bytes``)::

      Memory profiling: available_gpu_memory=A GB, total_gpu_memory=T GB, mem_fraction_static=F, rest_memory=R GB
      DSv4 memory calculation: bytes_per_full_token=B, available_bytes=R GB, full_token=N

  ``rest_memory = available - T x (1 - F)`` (available: the free memory now, min over the world; T: the
  pre-load free memory), ``available_bytes = int(rest x 2^30)`` (times ``L/(L+1)`` with a draft worker), and
  ``full_token = int(available_bytes / B) // page x page``;
* 0.5.12..0.5.19 (``model_executor/pool_configurator.py::DSV4PoolConfigurator.calculate_pool_sizes``): the same
  division and line, spelled ``DSV4``; the budget from ``_profile_available_bytes`` (the usual
  ``post - (1 - mfs) x T``);
* 0.5.20+: ``DSV4 memory calculation: unified=.., bytes_per_full_token=B, available_bytes=A GB, c128_state_fixed=..
  GB, ..., full_token=N``: the fixed request-scoped pools come off A first, then whole pages are removed while
  the reserved pages of ratio-1/2 layers do not fit (``_get_low_ratio_kv_padding_bytes``; not modelled here: a
  count below the division is then not judged).

``Initialize DeepSeekV4TokenToKVPool with ... swa_size= c4_size= c128_size= ...``
(``mem_cache/deepseek_v4_memory_pool.py``) then states the pools: ``swa = int(N x ratio) // page x page``,
``c4 = N // 4`` (``// (4 x shrink)`` with HiSparse), ``c128 = N // 128`` (``_compute_dsv4_sizes``, every release).
Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import field

from kvaudit.parse.interface import Startup
from kvaudit.parse.sglang import DSv4Calc, MemoryProfile, OtherPool, SchedulerSummary
from kvaudit.reconcile.interface import TokenInterval, Verdict
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.record import Record, record
from kvaudit.units import GIB, LOG_HALF_ULP, Interval

#: the line's two-decimal print of bytes per full token (``{:.2f}``)
BPFT_HALF_ULP = 0.005
#: page sizes DeepSeek-V4 runs with when server_args does not say (``assert page_size % 128 == 0``; 256 the
#: launch recipes' and the 0.5.2x default for V4)
DEFAULT_PAGES = (128, 256)
POOL_KIND = "DeepSeekV4TokenToKVPool"

RULE = ("DeepSeek-V4: full_token = int(available_bytes / bytes_per_full_token) // page x page "
        "(DSv4MemoryCalculator / DSV4PoolConfigurator.calculate_pool_sizes)")


@record
class DSv4Check(Record):
    calc: DSv4Calc
    cell: Interval  # bytes per full token, as printed
    budget: Interval  # available_bytes less the fixed pools (GiB)
    tokens: TokenInterval  # what the division allows
    logged: int
    verdict: Verdict
    reason: str
    engine_rest: float  # available_bytes as printed (GiB)
    budget_note: str | None  # how the printed budget compares with post - (1 - mfs) x T
    budget_off: bool  # the printed budget is outside what the formula allows
    notes: tuple[str, ...] = field(default_factory=tuple)


def has_dsv4(startup: Startup) -> bool:
    return any(e.role == "target" for e in startup.of(DSv4Calc)) or any(
        e.kind == POOL_KIND for e in startup.of(OtherPool))


def memory_profile(startup: Startup) -> MemoryProfile | None:
    """The ``Memory profiling`` line with the smallest rest (the engine all-reduces the free memory with MIN)."""
    profiles = [e for e in startup.of(MemoryProfile) if e.role == "target"]
    return min(profiles, key=lambda e: e.rest_gib) if profiles else None


def check(startup: Startup, args: dict, T: Interval | None, post: Interval | None, mfs: float | None
          ) -> DSv4Check | None:
    """The DSv4 division and the budget it starts from; None when the log has no DSv4 memory calculation."""
    calcs = [e for e in startup.of(DSv4Calc) if e.role == "target"]
    if not calcs:
        return None
    calc = min(calcs, key=lambda e: (e.available_gib, e.full_token))
    notes: list[str] = []
    page = as_int(args.get("page_size"))
    pages = (page,) if page else DEFAULT_PAGES
    if not page:
        notes.append("page size not in the log: DeepSeek-V4 runs with a multiple of 128 (128 or 256 assumed)")
    fixed = sum(calc.fixed_gib.values())
    n_fixed = len(calc.fixed_gib)
    base = calc.effective_gib if calc.effective_gib is not None else calc.available_gib
    if calc.effective_gib is not None:
        fixed, n_fixed = 0.0, 0  # the line states the budget after the fixed pools itself
    budget = Interval(base - fixed - (1 + n_fixed) * LOG_HALF_ULP, base - fixed + (1 + n_fixed) * LOG_HALF_ULP)
    cell = Interval(calc.bytes_per_full_token - BPFT_HALF_ULP, calc.bytes_per_full_token + BPFT_HALF_ULP)
    hi_raw = math.floor(max(budget.hi, 0) * GIB / cell.lo)
    lo_raw = math.floor(max(budget.lo, 0) * GIB / cell.hi)
    tokens = TokenInterval(lo_raw // max(pages) * max(pages), hi_raw // min(pages) * min(pages))
    logged = calc.full_token
    padding = "unified=" in calc.text or n_fixed > 0  # 0.5.20+: reserved-page loop after the division
    if tokens.contains(logged) and logged % min(pages) == 0:
        verdict = Verdict.MATCH
        # the printed budget is rounded: its end points, not its middle, are what an operator can redo
        reason = (f"{logged:,} full tokens is within the engine's division int(budget x 2^30 / "
                  f"{calc.bytes_per_full_token:.2f} B) rounded down to whole pages of "
                  f"{'/'.join(str(p) for p in pages)}, over the printed budget's rounding "
                  f"{budget.lo:.3f}..{budget.hi:.3f} GiB: {tokens.low:,}..{tokens.high:,} (line {calc.line})")
    elif padding and logged < tokens.low and logged % min(pages) == 0:
        verdict = Verdict.UNKNOWN
        reason = (f"{logged:,} full tokens is below the division's {tokens.low:,}..{tokens.high:,}; from 0.5.20 "
                  "whole pages are removed while the reserved pages of ratio-1/2 layers do not fit "
                  "(DSV4PoolConfigurator._get_low_ratio_kv_padding_bytes), which kvaudit does not model")
    else:
        verdict = Verdict.MISMATCH
        reason = (f"{logged:,} full tokens is not what the engine's own division gives: "
                  f"int({base - fixed:.2f} GiB / {calc.bytes_per_full_token:.2f} B) rounded to the page is "
                  f"{tokens.low:,}..{tokens.high:,}")
    budget_note, off = _budget(startup, calc, T, post, mfs)
    # --max-total-tokens below the division: the pools are rebuilt from the cap
    # (calculate_pool_sizes_from_max_tokens: cap // page x page), and the scheduler summary states it
    pool_full = logged
    cap = as_int(args.get("max_total_tokens"))
    summaries = startup.of(SchedulerSummary)
    if cap is not None and cap < logged:
        pool_full = summaries[-1].max_total_num_tokens if summaries else cap // max(pages) * max(pages)
        notes.append(f"--max-total-tokens {cap:,} caps the pools below the division's {logged:,} full tokens: they "
                     f"hold {pool_full:,} (calculate_pool_sizes_from_max_tokens)")
    notes.extend(_pool_sizes(startup, args, pool_full, pages, swa_ratio_sized=not padding))
    return DSv4Check(calc, cell, budget, tokens, logged, verdict, reason, calc.available_gib, budget_note, off,
                     tuple(notes))


def _budget(startup: Startup, calc: DSv4Calc, T: Interval | None, post: Interval | None, mfs: float | None
            ) -> tuple[str | None, bool]:
    """Does the printed budget follow from post - (1 - mfs) x T? A draft worker scales it by L/(L+1) in the launch
    builds (get_pool_sizes_by_profiling), which the line does not say: then only its upper end is checked."""
    prof = memory_profile(startup)
    spec = _speculative(startup)
    if prof is not None:
        # the engine's own rest, from its own three readings: available - total x (1 - F)
        own = prof.available_gib - prof.total_gib * (1 - prof.mem_fraction_static)
        slack = LOG_HALF_ULP * (2 + prof.total_gib)  # F printed with two decimals: +-0.005 x total at most
        if abs(own - prof.rest_gib) > slack + LOG_HALF_ULP:
            return (f"the engine's 'Memory profiling' line does not add up: {prof.available_gib:.2f} - "
                    f"{prof.total_gib:.2f} x (1 - {prof.mem_fraction_static:.2f}) = {own:.2f}, it printed "
                    f"rest_memory={prof.rest_gib:.2f}", True)
        if not spec and abs(prof.rest_gib - calc.available_gib) > 2 * LOG_HALF_ULP:
            return (f"available_bytes={calc.available_gib:.2f} GB is not the rest_memory={prof.rest_gib:.2f} GB "
                    "the engine profiled", True)
        return (f"rest_memory = {prof.available_gib:.2f} - {prof.total_gib:.2f} x (1 - "
                f"{prof.mem_fraction_static:.2f}) = {prof.rest_gib:.2f} GiB (line {prof.line}), the budget the "
                "division starts from", False)
    if T is None or post is None or mfs is None:
        return None, False
    rest = post - T.scale(1 - mfs)
    # 'Reserving X GB of the KV budget ...' (kv_cache_configurator.py, 2026) comes off before the division
    reserved = sum(e.gib or 0.0 for e in startup.of(OtherPool) if e.kind == "budget_reserve" and e.role == "target")
    rest = rest - reserved
    lo, hi = rest.lo - LOG_HALF_ULP * (2 if reserved else 1), rest.hi + LOG_HALF_ULP * (2 if reserved else 1)
    if calc.available_gib > hi or (not spec and calc.available_gib < lo):
        return (f"available_bytes={calc.available_gib:.2f} GB is outside post - (1 - mfs) x T = "
                f"{rest.mid:.2f} GiB (+-{(hi - lo) / 2:.3f}): memory moved between 'Load weight end' and the "
                "pool's sizing", True)
    return (f"available_bytes={calc.available_gib:.2f} GB = post - (1 - {mfs}) x T = {rest.mid:.2f} GiB "
            "(within rounding)", False)


def _speculative(startup: Startup) -> bool:
    algo = (startup.server_args or {}).get("speculative_algorithm")
    return algo not in (None, "None", "", "NONE")


def _pool_sizes(startup: Startup, args: dict, full: int, pages: tuple[int, ...], swa_ratio_sized: bool = True
                ) -> list[str]:
    """``swa_size= c4_size= c128_size=`` against the full-token count (``_compute_dsv4_sizes``). From 0.5.20 the
    SWA pool may be sized by a request cap instead of the ratio (``DSV4 SWA sizing: mode=cap``): not checked."""
    pools = [e for e in startup.of(OtherPool) if e.kind == POOL_KIND]
    if not pools:
        return []
    d = pools[0].detail
    c4, c128, swa = d.get("c4_size"), d.get("c128_size"), d.get("swa_size")
    if c4 == 0 and c128 == 0:
        return [f"the pool line (line {pools[0].line}) states no compressed pools (c4_size=0, c128_size=0): a "
                "layout kvaudit does not model; its sizes are not checked"]
    bad = []
    if c4 is not None and c4 != full // 4:
        bad.append(f"c4_size={c4:,} is not full // 4 = {full // 4:,} (HiSparse shrinks it; not modelled)")
    if c128 is not None and c128 != full // 128:
        bad.append(f"c128_size={c128:,} is not full // 128 = {full // 128:,}")
    ratio = as_float(args.get("swa_full_tokens_ratio"))
    if swa is not None and ratio is not None and len(pages) == 1 and swa_ratio_sized:
        want = int(full * ratio) // pages[0] * pages[0]
        if swa != want:
            bad.append(f"swa_size={swa:,} is not int({full:,} x {ratio}) // {pages[0]} x {pages[0]} = {want:,}")
    if bad:
        return [f"pool sizes (line {pools[0].line}): " + "; ".join(bad)]
    parts = []
    if c4 is not None:
        parts.append(f"c4 {c4:,} = full // 4")
    if c128 is not None:
        parts.append(f"c128 {c128:,} = full // 128")
    if swa is not None:
        parts.append(f"swa {swa:,} ({swa / full:.4f} of full)" if full else f"swa {swa:,}")
    return [f"DeepSeek-V4 pools (line {pools[0].line}): " + ", ".join(parts)]
