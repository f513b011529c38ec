"""TensorRT-LLM's KV-cache budget and the per-GPU ledger, as pure functions over parsed startups.

PyTorch backend (``tensorrt_llm/_torch/pyexecutor/_util.py::KvCacheCreator.configure_kv_cache_capacity``,
1.0+; earlier ``estimate_max_tokens``): a temporary KV cache sized for the profiling requests is allocated, the
dummy requests run (autotuner, CUDA-graph warmup), then

    peak      = torch peak + memory outside torch      (NCCL, CUDA graphs, the temporary KV, other processes)
    available = (device total - peak + temporary KV) x free_gpu_memory_fraction     ((total - peak) x f, <=0.19)
    available = min(available, max_tokens x bytes/token, max_gpu_total_bytes)       (when configured)
    max_tokens = floor(available / bytes per token); the C++ pool rounds it up to whole blocks
                 (``Number of tokens per block``): tokens = ceil(max_tokens / block) x block

C++ runtime / TensorRT engine (``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``, ``calculateMaxNumBlocks``):
``available`` = free + the memory pool's free bytes after the engine, context, buffers and decoder are
allocated, ``primary = available x fraction`` (``kDefaultGpuMemFraction`` 0.9), the same token and block
arithmetic, and the minimum over ranks (MPI allreduce).

Unlike SGLang (fraction of the free memory before the weights) and vLLM (fraction of the total), the fraction
here applies to what is **free after profiling**. Modules: ``facts`` (what each rank logged, the pool),
``context`` (settings and their sources), ``cell`` (bytes per token), ``budget`` (the budget, caps and the
prediction), ``ledger``, ``checks`` (findings), ``audit`` and ``whatif``.
"""

from kvaudit.reconcile.trtllm.audit import reconcile
from kvaudit.reconcile.trtllm.cell import cell_size
from kvaudit.reconcile.trtllm.whatif import whatif


def plan(inp, history=None):  # noqa: ANN001 - kvaudit.plan.model.PlanInput, a pandas frame
    """kvaudit plan for this engine (reconcile/trtllm/planner.py), loaded only when a plan is asked for."""
    from kvaudit.reconcile.trtllm.planner import plan as engine_plan

    return engine_plan(inp, history)


__all__ = ["cell_size", "plan", "reconcile", "whatif"]
