"""vLLM's KV-cache budget and the per-GPU ledger, as pure functions over parsed startups.

One module per concern, as for SGLang: ``facts`` (what each worker logged), ``context`` (what the startup
establishes: utilisation, block size, TP/PP/DP with their source, KV dtype, hybrid layout), ``cell`` (bytes per
token, uniform and hybrid pools), ``formula`` (the budget per era and the prediction), ``ledger``, ``checks``
(findings), ``audit`` and ``whatif``. docs/how-it-works.md has the worked examples.
"""

from kvaudit.reconcile.vllm.audit import reconcile
from kvaudit.reconcile.vllm.cell import cell_size
from kvaudit.reconcile.vllm.whatif import whatif


def plan(inp, history=None):  # noqa: ANN001 - kvaudit.plan.model.PlanInput, a pandas frame
    """kvaudit plan for vLLM (reconcile/vllm/planner.py), loaded only when a plan is asked for."""
    from kvaudit.reconcile.vllm.planner import plan as vllm_plan

    return vllm_plan(inp, history)


__all__ = ["cell_size", "plan", "reconcile", "whatif"]
