"""LMDeploy's KV-cache sizing, per engine and era, as pure functions over parsed startups.

``cache_max_entry_count`` (``lmdeploy/messages.py``, ``TurbomindEngineConfig`` / ``PytorchEngineConfig``) has meant
four things (InternLM/lmdeploy, read per tag):

* v0.0.x: a count of sequences (kvaudit reads no log of that era: it printed no block lines);
* TurboMind v0.1.0-v0.2.1: a fraction of the card's **total** memory (``BlockManager::GetBlockCount``:
  ``total * ratio / block_size``; default 0.5);
* TurboMind v0.2.2-v0.14: a fraction of the **free** memory after the weights, the minimum over the TP ranks
  (``GetSyncFreeMemSize``, #973 and #1053; default 0.8): ``max_block_count = floor(floor(free * ratio) /
  block_bytes)``; a value >= 1 is the block count itself (``BlockManager``: ``max_block_count_ = block_count``);
  from 0.13, models with linear-attention layers first take the pooled linear state out of ``free * ratio``
  (``SequenceManager``: ``blocks = (floor(free_before * ratio) - linear) / block_bytes``);
* TurboMind v0.15+: one object cache of ``floor(free * ratio)`` bytes (``turbomind.cc``; only 0 < ratio < 1), shared
  by every cache: bytes, no token count;
* the PyTorch engine (v0.2.4+; ``executor/base.py::update_configs``, before 0.7.3 ``model_agent.py``):
  ``num_gpu_blocks = int((min_ranks free - runtime) * ratio / block_bytes)``, the runtime estimate
  ``(max_prefill_token_num + 2 * max_batches) * vocab * 2`` (v0.10+; ``* 7`` before).

Block bytes: TurboMind ``kernels/attention/block.h::Layout::block_size`` (0.4+): ``layers x local KV heads x kv_num x
block_len x (head_dim x q_bits / 8 + 2 x t_bits / 8)``, q_bits 16 (or 8 / 4 with ``quant_policy`` 8 / 4), t_bits 16
when quantised (a scale and a zero per head and token), kv_num 1 for shared-KV MLA (head_dim 576, 0.13+); before 0.4
``SequenceManager``: ``2 x layers x heads x block_len x head_dim x elem_bits / 8`` with elem_bits 8 when
``quant_policy & 4`` (int8 KV then), else 16. The PyTorch engine (``CacheEngine.get_cache_block_size``): K and V
blocks of ``block_size x heads / tp x head_dim`` in the model dtype, or uint8 (int4 packed two per byte) plus a
scale/zero pair in the model dtype per head and token.

Modules: ``settings`` (what the log says, with sources and defaults), ``cell`` (bytes per block), ``audit`` (the
pool, the checks, the findings), ``whatif`` and ``endpoint``.
"""

from kvaudit.reconcile.lmdeploy.audit import reconcile
from kvaudit.reconcile.lmdeploy.whatif import whatif


def plan(inp, history=None):  # noqa: ANN001 - kvaudit.plan.model.PlanInput, a pandas frame
    """kvaudit plan for this engine (reconcile/lmdeploy/planner.py), loaded only when a plan is asked for."""
    from kvaudit.reconcile.lmdeploy.planner import plan as engine_plan

    return engine_plan(inp, history)


__all__ = ["plan", "reconcile", "whatif"]
