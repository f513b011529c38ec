"""What if: the same startup rerun with another fraction, KV dtype, TP size or context length.

Whether it starts comes first: SGLang raises "Not enough memory. Please try to increase --mem-fraction-static" when
the KV budget ``free after weights - (1 - mfs) x T`` leaves no token (model_runner.py profile_max_num_token, then
``if self.max_total_num_tokens <= 0``, every era 0.3-0.5.x). A startup that failed never measured its graphs or its
free memory at the end: its headroom is no baseline, and only the budget check can be answered from its numbers."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvaudit.parse.interface import Startup
from kvaudit.reconcile.interface import Audit, AuditOptions, TokenInterval, WhatIf, failures
from kvaudit.reconcile.sglang.audit import reconcile
from kvaudit.reconcile.sglang.context import build_context, context_length_of
from kvaudit.reconcile.sglang.formula import predict, rules_for
from kvaudit.reconcile.sglang.ledger import request_table
from kvaudit.units import GIB, LOG_HALF_ULP, Interval

def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    """Rerun the formula with changed inputs; say what the reserve would still cover."""
    new_opts = replace(new_opts, hypothetical=True)
    after = reconcile(startup, new_opts)
    changes: dict[str, Any] = {}
    for name in ("mem_fraction_static", "kv_cache_dtype", "tp_size", "context_length"):
        new = getattr(new_opts, name)
        if new is not None and new != getattr(opts, name):
            changes[name] = new
    explanation: list[str] = []
    f0, f1 = base.formula, after.formula
    tokens_after = None
    if f1.rest_gib is not None and f1.bytes_per_token:
        ctx = build_context(startup, new_opts)
        T = Interval(f1.pre_load_free_gib - LOG_HALF_ULP, f1.pre_load_free_gib + LOG_HALF_ULP)  # type: ignore
        post = Interval.logged(f1.post_load_free_gib)  # type: ignore[arg-type]
        if "tp_size" in changes and base.formula.post_load_free_gib is not None and ctx.tp:
            old_tp = build_context(startup, opts).tp
            w = max((l.weights_gib or 0) for l in base.ranks) if base.ranks else 0
            new_w = w * old_tp / ctx.tp
            post = Interval(post.lo + w - new_w, post.hi + w - new_w)
            explanation.append(f"weights per GPU scale with TP: {w:.2f} -> {new_w:.2f} GiB (approximation)")
        rules = rules_for(ctx.era, ctx.spec_algo is not None)
        cell = Interval.exact(f1.bytes_per_token)
        pred = predict(ctx, rules[0], T, post, f1.mem_fraction_static or 0, cell, None,
                        None, None)
        tokens_after = pred.tokens
    tokens_before = f0.logged_tokens
    kv_before = max((l.kv_gib or 0) for l in base.ranks) if base.ranks else None
    kv_after = None
    if tokens_after is not None and f1.bytes_per_token:
        kv_after = round(tokens_after.low * f1.bytes_per_token / GIB, 2)
    # what came out of the reserve in this startup, and the same items at the new token count
    ratio = (tokens_after.low / tokens_before) if (tokens_after and tokens_before) else 1.0
    worst = min(base.ranks, key=lambda l: l.free_at_end_gib if l.free_at_end_gib is not None else 1e9,
                default=None)
    needs_before = needs_after = None
    if worst is not None:
        needs_before = needs_after = 0.0
        for it in worst.items:
            if not it.in_reserve or it.gib is None:
                continue
            g = it.gib
            needs_before += g
            if it.key in ("draft_kv_cache", "allocator_rounding"):
                g *= ratio
            elif it.key == "request_table" and ("context_length" in changes or ratio != 1.0):
                g = _scaled_request_table(startup, new_opts, tokens_after.low if tokens_after else None) or g
            needs_after += g
        needs_before, needs_after = round(needs_before, 3), round(needs_after, 3)
    headroom_before = worst.free_at_end_gib if worst else None
    headroom_after = None
    risk = "unknown"
    r0, r1 = f0.reserve_gib, f1.reserve_gib
    if None not in (r0, r1, needs_before, needs_after, headroom_before):
        # what neither the items nor the final reading account for stays as it was (rounding, small buffers)
        slack = r0 - needs_before - headroom_before  # type: ignore[operator]
        headroom_after = round(r1 - needs_after - slack, 2)  # type: ignore[operator]
        if headroom_after < 0:
            risk = "oom"
        elif headroom_after < opts.thresholds.low_headroom_gib or headroom_after < 0.5 * headroom_before:  # type: ignore[operator]
            risk = "low"
        else:
            risk = "ok"
        took = [name for name, keys in (("graphs", ("graphs_", "attention_backend")), ("draft", ("draft",)),
                                        ("request table", ("request_table",)), ("rounding", ("allocator_rounding",)))
                if any(it.key.startswith(keys) and it.in_reserve for it in worst.items)]  # type: ignore[union-attr]
        graphs_logged = worst.end_is_final and any(it.key.startswith("graphs_") for it in worst.items)  # type: ignore[union-attr]
        absent = [] if graphs_logged else ["graphs not in the log"]
        what = (", ".join(took[:-1]) + " and " + took[-1] if len(took) > 1 else took[0]) if took \
            else "nothing the log shows"
        explanation.append(
            f"at this startup {what} took {needs_before:.2f} GiB of the {r0:.2f} GiB reserve"
            + (f" ({', '.join(absent)})" if absent else "")
            + f" and left {headroom_before:.2f} GiB for activations on {worst.label}")  # type: ignore[union-attr]
    reason = None
    failed = failures(base.findings)
    if failed:
        # the server never finished: its end-of-startup reading is no baseline for a headroom
        headroom_before = headroom_after = needs_before = needs_after = None
        risk = "unknown"
        explanation = [e for e in explanation if not e.startswith("at this startup")]
    T1, post1 = f1.pre_load_free_gib, f1.post_load_free_gib
    minimum = (1 - post1 / T1) if (T1 and post1 is not None and "tp_size" not in changes) else None
    need = f"it needs --mem-fraction-static above {minimum:.3f}" if minimum is not None and minimum < 1 else ""
    budget = f1.rest_gib
    if (tokens_after is not None and tokens_after.low <= 0) or (tokens_after is None and budget is not None
                                                                  and budget <= 0):
        sure = (tokens_after.high <= 0) if tokens_after is not None else True
        what = (f"the KV budget would be {budget:.2f} GiB" if budget is not None else "the KV budget would leave")
        count = (f" ({max(tokens_after.high, 0):,} tokens)" if tokens_after is not None else "")
        reason = (f"{what}{count}: SGLang {'will' if sure else 'may'} not start (\"Not enough memory. Please try to "
                  f"increase --mem-fraction-static\")" + (f"; {need}" if need else ""))
        risk, headroom_after = "oom", None
        tokens_after = TokenInterval(max(tokens_after.low, 0), max(tokens_after.high, 0)) if tokens_after else None
        kv_after = max(kv_after, 0.0) if kv_after is not None else None
    elif failed:
        if budget is not None:
            reason = ("the KV budget would be " f"{budget:.2f} GiB, above zero, so SGLang's budget check would pass"
                      + (f" ({need})" if need else "") + "; whether graphs and activations then fit cannot be told: "
                      "this startup failed before they were measured")
        else:
            reason = ("cannot tell whether it would start: this startup failed (" + failed[0].code + ") before "
                      "the readings the formula needs")
    # --max-total-tokens fixes the pool whatever the free memory measures next time (the fraction still sets the
    # reserve); the count is this what-if's lower bound, which every reading within rounding allows. Offered only
    # for an answer that is ok: a pin for a risky answer would fix the risk in place
    pin = f"--max-total-tokens {tokens_after.low}" if tokens_after and tokens_after.low > 0 and risk == "ok" else None
    return WhatIf(changes, tokens_before, tokens_after, kv_before, kv_after, r0, r1, needs_before, needs_after,
                  headroom_before, headroom_after, risk,
                  tuple(([reason] if reason else []) + explanation + list(after.notes)), pin, reason=reason)


def _scaled_request_table(startup: Startup, opts: AuditOptions, tokens: int | None) -> float | None:
    ctx = build_context(startup, opts)
    b, _ = request_table(ctx, tokens, context_length_of(ctx))
    return b / GIB if b is not None else None
