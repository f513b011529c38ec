"""``kvaudit plan --validate``: every startup of a history (or of a directory of logs) predicted from the others.

Leave-one-out: each startup is planned with its own settings (card, release, ranks, fraction, its bytes per token)
and the other startups as the history, and the plan's token interval is held against the tokens it logged. A log
names no card, so a startup replayed from a log keeps its own T (said: "T given") and everything after T is
predicted; a history's startups carry their card, and T is predicted too. "Family seen": the weight memory came
from another startup of the same model, card, release and ranks; "not seen": from a nearer family or the
checkpoint's bytes; "not predictable": nothing gave the weights (a log names no checkpoint size).
"""

from __future__ import annotations

import statistics
from typing import Any

from kvaudit.errors import KvauditError
from kvaudit.record import record
from kvaudit.planning.model import Observed, PlanInput


@record
class Case:
    host: str
    family_seen: bool | None  # None: not predictable
    t_given: bool
    logged: int
    low: int | None
    high: int | None
    why: str = ""

    @property
    def error(self) -> float | None:
        if self.low is None or self.high is None or not self.logged:
            return None
        return ((self.low + self.high) / 2 - self.logged) / self.logged

    @property
    def held(self) -> bool:
        return self.low is not None and self.high is not None and self.low <= self.logged <= self.high


def _case(row: Observed, df: Any) -> Case:
    """``row`` planned with ``df`` (the history's frame without it) as its history."""
    from kvaudit.engines import by_name
    from kvaudit.planning import calibrate

    need = (row.version, row.tp, row.fraction, row.tokens, row.bytes_per_token, row.t_gib, row.model_key)
    if any(v is None for v in need):
        return Case(row.host, None, False, row.tokens or 0, None, None, "the startup lacks a term the replay needs")
    t_given = row.gpu_name is None and row.gpu_total_mib is None
    assert row.version and row.tp and row.fraction and row.tokens and row.bytes_per_token and row.t_gib is not None \
        and row.model_key  # checked just above: the narrowing mypy needs
    bpt = (float(row.bpt_low or row.bytes_per_token), float(row.bpt_high or row.bytes_per_token))
    inp = PlanInput(row.engine, row.version, row.gpu_name, row.gpu_total_mib or 0.0, row.tp, 1, 1,
                    row.fraction, "auto", None, None, row.page_size, None, None, row.model_key, None, None,
                    bytes_per_token=bpt, given_t=(row.t_gib - 0.005, row.t_gib + 0.005) if t_given else None,
                    rocm=row.rocm)
    w = calibrate.weight_memory(df, inp) or calibrate.logged_weights(df, inp)
    if w is None:
        return Case(row.host, None, t_given, row.tokens, None, None,
                    "no other startup of this model, and a log names no checkpoint size")
    planner = by_name(row.engine).plan
    if planner is None:
        return Case(row.host, None, t_given, row.tokens, None, None, f"kvaudit plan does not size {row.engine}")
    try:
        p = planner(inp, df)
    except KvauditError as exc:
        return Case(row.host, None, t_given, row.tokens, None, None, str(exc))
    return Case(row.host, w.level == 0, t_given, row.tokens, p.tokens_low, p.tokens_high)


def validate_history(path: str, observed: list[Observed]) -> dict[str, Any]:
    """Leave-one-out over ``observed``: the startups of ``path`` (a history or a directory of logs), read by the
    command layer (kvaudit.plan_inputs), so that plan/ imports neither the fleet's history nor explain."""
    from kvaudit.plan.build import planned_engines

    planned = {e.name for e in planned_engines()}
    rows = [r for r in observed if r.engine in planned]
    from kvaudit.planning.calibrate import frame

    # one frame, each startup left out of it by its position: building a frame per startup from the others was
    # quadratic in Python objects (1,000 startups: 27.6 s, issue 39); dropping a row is one vectorised copy
    whole = frame(rows)
    cases = [_case(r, whole.drop(index=whole.index[i])) for i, r in enumerate(rows)]

    def summary(group: list[Case]) -> dict[str, Any]:
        errs = sorted(abs(c.error) for c in group if c.error is not None)
        if not errs:
            return {"startups": 0}
        p95 = errs[min(len(errs) - 1, max(0, round(0.95 * len(errs)) - 1))]
        return {"startups": len(errs), "median_abs_error": round(statistics.median(errs), 5),
                "p95_abs_error": round(p95, 5), "mean_abs_error": round(statistics.fmean(errs), 5),
                "interval_held": round(sum(c.held for c in group) / len(group), 3)}

    return {
        "schema": "kvaudit.plan-validation/1", "source": path, "startups": len(rows),
        "t_given": sum(c.t_given for c in cases),
        "family_seen": summary([c for c in cases if c.family_seen is True]),
        "family_not_seen": summary([c for c in cases if c.family_seen is False]),
        "not_predictable": sum(c.family_seen is None for c in cases),
        "cases": [{"startup": c.host, "family_seen": c.family_seen, "t_given": c.t_given, "logged_tokens": c.logged,
                   "predicted_tokens": None if c.low is None else {"low": c.low, "high": c.high},
                   "error": None if c.error is None else round(c.error, 6), "held": c.held, "why": c.why}
                  for c in cases],
    }

