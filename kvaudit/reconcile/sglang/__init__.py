"""SGLang's KV-cache sizing formula and the per-GPU ledger, as pure functions over parsed startups.

One module per question: ``facts`` (what each rank logged), ``context`` (what the startup establishes),
``cell`` (bytes per token), ``pool`` (the pool's components), ``formula`` (the formula per era),
``ledger`` (where each GiB went), ``checks`` (findings), ``audit`` (the whole answer), ``whatif``.
docs/how-it-works.md walks through it with numbers.
"""

from kvaudit.reconcile.sglang.audit import ENGINE, reconcile
from kvaudit.reconcile.sglang.cell import CellSize, cell_size
from kvaudit.reconcile.sglang.whatif import whatif



def plan(inp, history=None):  # noqa: ANN001 - kvaudit.plan.model.PlanInput, a pandas frame
    """kvaudit plan for SGLang (reconcile/sglang/planner.py), loaded only when a plan is asked for."""
    from kvaudit.reconcile.sglang.planner import plan as sglang_plan

    return sglang_plan(inp, history)


__all__ = ["ENGINE", "CellSize", "cell_size", "plan", "reconcile", "whatif"]
