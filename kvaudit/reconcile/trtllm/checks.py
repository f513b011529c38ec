"""TensorRT-LLM findings beyond the budget and the token count: ranks that differ, little memory left outside
the KV cache, and failures (the executor's OOM table, a pool too small for one sequence, out of memory)."""

from __future__ import annotations

from kvaudit.parse.trtllm import ComponentRow, Failure
from kvaudit.reconcile import findings as F
from kvaudit.reconcile.interface import Finding
from kvaudit.units import GIB


def rank_and_failure_findings(startup, ranks, frees, fraction, cell, logged, th, pool_text=None) -> list[Finding]:
    out: list[Finding] = []
    # the Python executor's "available" line where any rank has it, else the C++ runtime's
    key = "available_gib" if any("available_gib" in rr.r for rr in ranks.values()) else "cpp_available_gib"
    stated = {rr.rank.display: rr for rr in ranks.values() if key in rr.r}
    avail = {r: rr.r[key] for r, rr in stated.items()}
    if len(avail) >= 2:
        lo = min(avail.items(), key=lambda x: x[1])
        hi = max(avail.items(), key=lambda x: x[1])
        if hi[1] - lo[1] > th.rank_imbalance_gib:
            out.append(F.rank_imbalance("available KV cache memory", lo, hi, hi[1] - lo[1], cell))
    tiny = {r: v for r, v in avail.items() if v < th.low_headroom_gib}
    if tiny:
        rank, a = min(tiny.items(), key=lambda x: x[1])
        rr = stated[rank]
        out.append(F.small_kv_budget(rank, a, rr.r.get("total_gib") or rr.r.get("cpp_total_gib"), logged,
                                     th.low_headroom_gib, rr.lines.get(key), pool_text))
    for b in frees.values():
        free = b.mid
        head = (1 - fraction) * free
        if head < th.low_headroom_gib and logged is not None and not tiny:
            out.append(F.trtllm_low_headroom(head, fraction, free, th.low_headroom_gib))
            break
    failures = startup.of(Failure)
    quoted: set[int] = set()
    small = next((f for f in failures if f.kind == "too_small"), None)
    if small is not None:
        n = small.numbers
        need = int(n.get("beam_width", 1) * n.get("tokens_per_block", 0) * n.get("blocks_per_sequence", 0))
        have = int(n.get("max_tokens", 0))
        fits: dict[str, float] = {"tokens_needed": need}
        clause = ""
        if need and have:
            per_seq = have // int(n.get("tokens_per_block", 1) or 1) * int(n.get("tokens_per_block", 1) or 1)
            clause = f" -> a pool of at least {need:,} tokens ({need / have:.2f}x this one)"
            fits["max_sequence_length_that_fits"] = per_seq
            if cell:
                extra = (need - have) * cell / GIB
                clause += f", {extra:.2f} GiB more KV memory; or a maximum sequence length of at most {per_seq:,}"
                fits["extra_gib"] = round(extra, 3)
        out.append(F.not_enough_memory(small.message + clause, small.line, {**n, **fits}))
        # Triton logs the same check twice (backend_model.cc 'Failed to create instance: ...', then
        # model_lifecycle.cc "failed to load 'tensorrt_llm' version 1: Internal: ..."): one error, quoted once
        quoted.update(f.line for f in failures if f.kind == "too_small")
    nofit = next((f for f in failures if f.kind == "no_fit"), None)
    if nofit is not None and small is None:
        out.append(F.not_enough_memory(nofit.message, nofit.line, {}))
        quoted.add(nofit.line)
    for rr in ranks.values():
        k = rr.r.get("available_gib")
        if k is not None and k <= 0 and not quoted:
            out.append(F.not_enough_memory(f"available KV cache memory is {k} GiB on {rr.rank.display}: the profiling "
                                           "peak left nothing for the KV cache", rr.lines.get("available_gib", 0),
                                           {"available_gib": k}))
            break
    executor = next((f for f in failures if f.kind == "executor_failed"), None)
    if executor is not None and "insufficient GPU memory" in executor.message:
        component = next((f.message for f in failures if f.kind == "oom_component"), None)
        total = next((rr.r["oom_total_gib"] for rr in ranks.values() if "oom_total_gib" in rr.r), None)
        free = next((rr.r["oom_free_gib"] for rr in ranks.values() if "oom_free_gib" in rr.r), None)
        detail = ""
        if component:
            detail = f": the {component} could not be created"
            if free is not None and total is not None:
                detail += f" with {free:.2f} GiB free of {total:.2f} GiB"
        rows = startup.of(ComponentRow)
        if rows:
            # what each component created before took (free before - free after; a temporary one may give it back)
            detail += "; before it: " + ", ".join(_took(r) for r in rows)
        out.append(F.not_enough_memory(executor.message.rstrip(".") + detail, executor.line,
                                       {"component": component, "free_gib": free, "total_gib": total}))
        quoted.add(executor.line)
    oom = next((f for f in failures if f.kind == "oom"), None)
    if oom is not None and not quoted:
        # a CUDA allocation that failed (cudaMallocAsync in BufferManager::gpu, torch's OutOfMemoryError) is a memory
        # failure whatever raised it; where it happened decides what could have made room
        if logged is not None:
            where = ("after the KV pool was sized: what the pool left outside it (1 - the free-memory fraction) did "
                     "not hold the allocation; a lower kv_cache_free_gpu_mem_fraction leaves more")
        else:
            where = ("before any KV pool line: the engine, its runtime buffers (they grow with max_batch_size and "
                     "max_num_tokens) or activations did not fit")
        out.append(F.not_enough_memory(f"{oom.message.rstrip('.')}: CUDA out of memory {where}", oom.line,
                                       dict(oom.numbers)))
        quoted.add(oom.line)
    fatal = [f for f in failures if f.kind not in ("no_blocks", "oom_component")]
    if fatal:
        last = fatal[-1]
        detail = "the error quoted in NOT_ENOUGH_MEMORY" if last.line in quoted else last.message
        if logged is not None:
            detail += " (after the KV pool was sized)"
        out.append(F.startup_failed(last.line, detail))
    return out


def _took(row: ComponentRow) -> str:
    """What one component of the OOM table took: free before - free after. More free after than before is memory
    given back while it was created (1.2's ``model_extra`` row, mlcommons/inference#2501: 197.99 -> 200.47), not a
    size: said as such, never as a negative amount."""
    name, delta = row.name.split(" (")[0], row.before_gib - row.after_gib
    return f"{name} gave back {-delta:.2f} GiB" if delta < -0.005 else f"{name} {max(delta, 0.0):.2f} GiB"
