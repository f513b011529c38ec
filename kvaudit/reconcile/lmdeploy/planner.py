"""kvaudit plan for LMDeploy: the KV pool of a deployment that does not exist yet, by its engine's own sizing.

``cache_max_entry_count`` is a fraction of the **free** memory after the weights (0.2.2+; the package docstring
has the eras):

    TurboMind 0.2.2-0.14:  blocks = floor(floor(free x ratio) / block bytes)                (BlockManager)
    TurboMind 0.15+:       one object cache of floor(free x ratio) bytes for every cache   (turbomind.cc)
    PyTorch engine:        blocks = int((free - runtime) x ratio / block bytes)            (update_configs)
                           runtime = (max_prefill_token_num + 2 x max_batches) x vocab x 2 (0.10+; x 7 before)
    tokens = blocks x block length (64)

``free`` is the smallest rank's free memory once the weights are in: the card's total as CUDA reports it, less the
CUDA context, NCCL and the engine's own buffers, less the weights per rank. The history's startups rarely carry it
(LMDeploy logs it only at DEBUG), so it is mostly assumed, and said so.
"""

from __future__ import annotations

from typing import Any

from kvaudit.planning import terms as shared
from kvaudit.planning.model import ASSUMED, FORMULA, Plan, PlanInput, Term
from kvaudit.planning.terms import PlanError, weakest
from kvaudit.reconcile.lmdeploy.cell import pytorch_block, turbomind_block
from kvaudit.reconcile.lmdeploy.settings import DEFAULT_BLOCK, DEFAULT_RATIO, policy_of
from kvaudit.units import GIB, Interval
from kvaudit.versions import VersionRange

#: in use before the engine measures the free memory, besides the weights: the CUDA context, NCCL, the engine's
#: workspaces (assumed; docs/plan.md, "LMDeploy")
BEFORE_MEASURE_GIB = (0.3, 2.0)
#: PytorchEngineConfig's max_prefill_token_num and max_batch_size as the corpus' startups print them
PREFILL_TOKENS = (4096, 8192)
MAX_BATCHES = (128, 256)


#: the newest LMDeploy release kvaudit models (its minor series): parse/lmdeploy.py's newest log shape is 0.15's
#: object-cache line; a later release is refused by name rather than planned by 0.15's rules
NEWEST_MODELLED = (0, 15)

def plan(inp: PlanInput, history: Any = None) -> Plan:
    version = shared.release(inp, (0, 2, 2), "kvaudit plan sizes LMDeploy 0.2.2+ (the ratio took the total memory "
                             "before)", newest=NEWEST_MODELLED,
                             newest_basis="the newest whose log lines it reads: 0.15's object-cache line")
    backend = (inp.backend or "turbomind").lower()
    if backend not in ("turbomind", "pytorch"):
        raise PlanError(f"--backend {inp.backend}: LMDeploy's engines are turbomind and pytorch")
    geom = inp.geometry
    if geom is None:
        raise PlanError("the model's config.json is needed for the bytes per block")
    notes: list[str] = []
    total = shared.cuda_total(inp, history, "LMDeploy")
    ratio = shared.fraction(inp, "cache_max_entry_count", (DEFAULT_RATIO, "LMDeploy's default (lmdeploy/messages.py, "
                                                           "0.2.2+)"))
    weights = shared.weights(inp, history)
    before = Term("before_measure_gib", "in use before it measures, besides the weights (context, NCCL, buffers)",
                  *BEFORE_MEASURE_GIB, "GiB", ASSUMED, "assumed: LMDeploy logs the free memory only at DEBUG")
    free = shared.interval(total) - Interval(weights.lo, weights.hi) - Interval(before.lo, before.hi)
    out = [total, ratio, weights, before,
           Term("post_load_free_gib", "free after the weights (min over ranks)", free.lo, free.hi, "GiB",
                weakest(total.kind, weights.kind, before.kind), "formula")]
    policy = policy_of(inp.kv_dtype)
    if policy is None:
        raise PlanError(f"--kv-dtype {inp.kv_dtype}: LMDeploy's KV caches are auto (16-bit), int8 or int4")
    block_len = inp.page_size or DEFAULT_BLOCK
    if geom.is_mla:  # one shared latent of kv_lora_rank + rope dims, one "head"
        heads, head_dim = 1, geom.kv_lora_rank + geom.qk_rope_head_dim  # type: ignore[operator]
    else:
        heads, head_dim = geom.num_kv_heads or 1, geom.head_dim or 0
    if backend == "pytorch":
        block = pytorch_block(geom.num_layers, heads, head_dim, inp.tp, block_len, policy, geom.dtype_bytes)
        runtime = _runtime(inp, version)
        out.append(runtime)
        budget = (free - Interval(runtime.lo, runtime.hi)).scale(ratio.lo)
        rule = "PyTorch engine: int((free - runtime) x ratio / block bytes) x block length"
    else:
        block = turbomind_block(geom.num_layers, heads, head_dim, inp.tp, block_len, policy,
                                VersionRange(version, version))
        budget = free.scale(ratio.lo)
        rule = "TurboMind: floor(floor(free x ratio) / block bytes) x block length"
        if version >= (0, 15, 0):
            rule = "TurboMind 0.15+: one object cache of floor(free x ratio) bytes"
            notes.append("LMDeploy 0.15+ keeps every cache in one object cache: the tokens are what it holds if KV "
                         "blocks took all of it")
    if not block.bytes:
        raise PlanError(f"the bytes per block are not determined: {block.description}")
    out.append(Term("bytes_per_token", "KV bytes per token per rank (block / block length)", block.bytes / block_len,
                    block.bytes / block_len, "B", FORMULA, block.description))
    out.append(Term("rest_gib", "KV budget", budget.lo, budget.hi, "GiB", weakest(*(t.kind for t in out)), "formula"))
    lo = int(max(0.0, budget.lo) * GIB // block.bytes) * block_len
    hi = int(max(0.0, budget.hi) * GIB // block.bytes) * block_len
    if geom.is_hybrid_swa or geom.is_mamba_hybrid:
        notes.append("a hybrid model: the linear state taken out of the budget first (0.13+) is not modelled")
    starts, why = shared.pool_starts(budget, lo, hi, inp.context_length, "LMDeploy raises: no KV blocks",
                                     context_fatal=False)
    if starts == "at risk" and inp.context_length and hi < inp.context_length:
        why += " (TurboMind truncates session_len to the blocks: 'No enough blocks for session_len')"
    concurrency = shared.concurrency(lo, hi, inp.context_length, inp.max_running_requests)
    return Plan(inp, tuple(out), lo, hi, round(lo * block.bytes / block_len / GIB, 3),
                round(hi * block.bytes / block_len / GIB, 3), concurrency, None, starts, why, None, None, rule,
                tuple(notes), block_size=block_len)


def _runtime(inp: PlanInput, version: tuple[int, ...]) -> Term:
    """The PyTorch engine's runtime estimate, taken from the free memory before the ratio."""
    vocab = inp.vocab_size
    if not vocab:
        raise PlanError("the PyTorch engine's runtime estimate needs the model's vocab_size (config.json)")
    batches = (inp.max_running_requests,) * 2 if inp.max_running_requests else MAX_BATCHES
    if version >= (0, 10, 0):
        lo, hi = ((p + 2 * b) * vocab * 2 / GIB for p, b in zip(PREFILL_TOKENS, batches))
        words = "(max_prefill_token_num + 2 x max_batches) x vocab x 2 B"
    else:
        lo, hi = (p * vocab * 7 / GIB for p in PREFILL_TOKENS)
        words = "max_prefill_token_num x vocab x 7 B"
    return Term("runtime_gib", "runtime estimate (PyTorch engine)", lo, hi, "GiB", ASSUMED,
                f"{words}, vocab {vocab:,}, max_prefill_token_num {PREFILL_TOKENS[0]}-{PREFILL_TOKENS[1]} "
                f"(assumed: the defaults the corpus' startups print)"
                + (f", max_batches {batches[0]}" if inp.max_running_requests else
                   f", max_batches {MAX_BATCHES[0]}-{MAX_BATCHES[1]} (assumed)"))
