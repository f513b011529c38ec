"""The per-GPU ledger: where the memory free before the weights (T on that rank) went, item by item."""

from __future__ import annotations

from kvaudit.reconcile.interface import LedgerItem, RankLedger
from kvaudit.reconcile.sglang.cell import ALLOC_ROUND, CellSize, pad_rows, rounding_bytes
from kvaudit.reconcile.sglang.context import Context, rounded
from kvaudit.reconcile.values import as_int
from kvaudit.reconcile.sglang.facts import RankFacts
from kvaudit.reconcile.sglang.pool import KV_KEYS, components, is_swa, kv_gib, kv_parts
from kvaudit.units import GIB, LOG_HALF_ULP

#: ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`` and the extra-buffer additions (srt/mem_cache/
#: kv_cache_configurator.py ``_calculate_mamba_ratio``, 0.5.4+; model_runner.py before the configurator split):
#: state slots per request row: 3, + 2 with the ping-pong extra buffer under the overlap scheduler (+ 1 when lazy
#: or without overlap), 1 without the radix cache
MAMBA_RATIO = 3


def mamba_ratio(ctx: Context) -> tuple[int, int, str]:
    """(low, high, how) of the state slots per request row; low == high when server_args decide it."""
    a = ctx.args
    if a.get("disable_radix_cache") is True:
        return 1, 1, "1 (radix cache off)"
    strategy = a.get("mamba_radix_cache_strategy")
    extra = a.get("enable_mamba_extra_buffer")
    if strategy == "extra_buffer" or extra is True:
        add = 1 if a.get("disable_overlap_schedule") is True else 2
        return MAMBA_RATIO + add, MAMBA_RATIO + add, f"{MAMBA_RATIO + add} (extra buffer)"
    if ctx.startup.server_args is not None:
        return MAMBA_RATIO, MAMBA_RATIO, f"{MAMBA_RATIO}"
    return MAMBA_RATIO, MAMBA_RATIO + 2, f"{MAMBA_RATIO}..{MAMBA_RATIO + 2} (server_args not in the log)"


def state_slots(ctx: Context) -> int | None:
    """The state pool's slot count (``max_mamba_cache_size`` on the Mamba line, 0.5.4+)."""
    from kvaudit.parse.sglang import OtherPool

    for e in ctx.startup.of(OtherPool):
        if e.kind == "mamba" and e.role == "target" and isinstance(e.detail.get("max_mamba_cache_size"), int):
            return e.detail["max_mamba_cache_size"]
    return None


def applied_requests(ctx: Context, tokens: int | None, context_len: int | None) -> tuple[int | None, str]:
    """How many request rows the engine sized (``resolve_max_num_reqs``): the scheduler summary's
    ``max_running_requests`` when the log prints it (what was applied); else --max-running-requests or the default
    clamp(tokens / context_len x 512, 2048, 4096), capped at tokens // 2 and, for a state-pool hybrid, at
    ``max_mamba_cache_size // ratio`` (0.5.4+)."""
    if ctx.summary is not None and ctx.summary.max_running_requests:
        return ctx.summary.max_running_requests, "max_running_requests in the scheduler summary"
    reqs = as_int(ctx.args.get("max_running_requests"))
    how = "--max-running-requests"
    if reqs is None and ctx.spec_algo is not None and ctx.era.overlaps((0, 4, 5), (0, 5, 18)):
        reqs, how = 48, "48 (speculative decoding default)"
    if reqs is None and tokens and context_len:
        upper = 5120 if ctx.era.hi is not None and ctx.era.hi <= (0, 3, 0) else 4096
        reqs = max(2048, min(upper, int(tokens / context_len * 512)))
        how = "default clamp(tokens/context_len*512, 2048, 4096)"
    slots = state_slots(ctx)
    if slots is not None:
        lo, _hi, ratio_how = mamba_ratio(ctx)
        cap = slots // lo  # the larger bound: the table is at most this
        if reqs is None or cap < reqs:
            reqs, how = cap, f"capped by the state pool: {slots} slots // ratio {ratio_how}"
    if reqs is None:
        return None, "max_running_requests unknown"
    return reqs, how


def request_table(ctx: Context, tokens: int | None, context_len: int | None) -> tuple[int | None, str]:
    """req_to_token: rows x (context_len + extra) x int32 (``ReqToTokenPool``, srt/mem_cache/memory_pool.py).
    Rows: the applied max_num_reqs (:func:`applied_requests`), + 1 in 0.4.0-0.4.8 and for state-pool hybrids
    (``HybridReqToTokenPool`` allocates size + 1 rows, the padding row). Extra: 4 (+ speculative_num_draft_tokens
    from 0.5.1)."""
    if not context_len:
        return None, "context length unknown"
    reqs, how = applied_requests(ctx, tokens, context_len)
    if reqs is None:
        return None, how
    rows = reqs + 1 if (ctx.era.within((0, 4, 0), (0, 4, 8)) or state_slots(ctx) is not None) else reqs
    extra = 4
    if ctx.spec_algo is not None and ctx.era.lo >= (0, 5, 1):
        extra += as_int(ctx.args.get("speculative_num_draft_tokens")) or 0
    nbytes = rows * (context_len + extra) * 4
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND, f"{rows} rows ({how}) x ({context_len:,} + {extra}) x 4 B"


def rank_ledger(index: int, rf: RankFacts, ctx: Context, cell: CellSize | None, tokens: int | None,
            req_bytes: int | None, req_how: str, rank0: bool, fp4_scales: bool = False) -> RankLedger:
    """Items in the order they took memory. Logged sizes where the log has them, modelled ones (request
    table, allocator rounding) from the formula, differences between two readings where nothing is printed
    (attention-backend buffers). ``unexplained`` = T on this rank - every item - free at the end."""
    items: list[LedgerItem] = []
    unmodelled: list[str] = []
    limits: dict[str, float | None] = {}  # the largest an unmodelled item can be (verdict rule 2)
    if ctx.opts.gpu_capacity_gib is not None and rf.pre is not None:
        if ctx.opts.gpu_capacity_gib < rf.pre.lo:
            # a card cannot have less memory than was free on it: the total given is not this card's
            note = (f"--gpu-memory-gib {ctx.opts.gpu_capacity_gib:g} is below what was free before the weights "
                    f"(T, {rf.pre.mid:.2f} GiB on {rf.rank.display}): not this card's total, so nothing is booked "
                    "before T")
            if not any(n.startswith(note[:40]) for n in ctx.notes):  # once, for the first rank it fails on
                ctx.notes.append(note)
        else:
            items.append(LedgerItem("before_t", "CUDA context, NCCL, other processes (before T)",
                                    rounded(ctx.opts.gpu_capacity_gib - rf.pre.mid, 3), "derived"))
    if rf.weights is not None:
        items.append(LedgerItem("weights", "weights", rf.weights, "log", line=rf.lines.get("weights")))
    elif rf.pre is not None and rf.post is not None:
        items.append(LedgerItem("weights", "weights (before - after)", rounded(rf.pre.mid - rf.post.mid, 3), "derived",
                                line=rf.lines.get("weights")))

    comps = components(rf)
    kv_logged = kv_gib(comps)
    kv_exact, pad = None, None
    if cell is not None and tokens is not None and kv_logged is not None and not is_swa(comps):
        # the modelled size at the padding the log allows that comes closest to this rank's line
        pad_lo, pad_hi = pad_rows(ctx.era, ctx.page_size if ctx.page_size_known else None)
        logged_gib: float = kv_logged
        pad = min({pad_lo, pad_hi, ctx.page_size}, key=lambda p: abs((tokens + p) * cell.pool / GIB - logged_gib))
        kv_exact = (tokens + pad) * cell.pool / GIB
        if abs(kv_exact - kv_logged) > LOG_HALF_ULP * max(1, kv_parts(comps)) + 0.001:
            kv_exact = None  # the config disagrees with this rank's line: trust the log
    for c in comps:
        if c.key == "kv_cache" and kv_exact is not None and len([x for x in comps if x.key in KV_KEYS]) == 1:
            items.append(LedgerItem("kv_cache", c.label, rounded(kv_exact, 4), "model", line=c.line))
        else:
            items.append(LedgerItem(c.key, c.label, c.gib, "log", line=c.line))
    kv_line = next((c.line for c in comps if c.key in KV_KEYS), None)
    kv_values = kv_exact if kv_exact is not None else kv_logged
    if fp4_scales and kv_values is not None:
        # FP4: the KV line counts the packed values only, while the pool also holds one scale byte per 16 values
        # (k/v_scale_buffer; pool_configurator.py _compute_cell_size: 9/8 of the values), paid from the same budget
        items.append(LedgerItem("pool_fp4_scales", "FP4 KV scales (1 B per 16 values, values / 8; the KV line "
                                "counts the values only)", rounded(kv_values / 8, 3), "model", line=kv_line))
    if kv_line is None and rf.post_capture_kv is not None:
        # 0.5.16's post-capture line gives the pool's tokens and the free memory, not its size
        unmodelled.append("KV cache sized after capture (0.5.16 prints its tokens, not its size)")
        limits["KV cache sized after capture (0.5.16 prints its tokens, not its size)"] = None
    if not comps and rf.post is not None and rf.pool_end is not None:
        # MLA pools before 0.4.6 print no KV line: the drop across the pool stage is the pool and the table
        items.append(LedgerItem("kv_cache", "KV pool + request table (no KV line; free after weights - Memory "
                                "pool end)", rounded(rf.post.mid - rf.pool_end, 3), "derived",
                                line=rf.lines.get("pool_end")))
        kv_logged = None
    if kv_line is not None:
        if req_bytes is not None:
            items.append(LedgerItem("request_table", f"request table ({req_how})", rounded(req_bytes / GIB, 4),
                                    "model", in_reserve=True, line=kv_line))
        else:
            unmodelled.append(f"request table ({req_how})")
        if kv_exact is not None and cell is not None and tokens is not None and pad is not None:
            rounding = rounding_bytes(cell.buffers, tokens + pad)
            freelist = -(-(tokens + pad) * 8 // ALLOC_ROUND) * ALLOC_ROUND
            items.append(LedgerItem("allocator_rounding", "allocator rounding (2 MiB segments) + token free list",
                                    rounded((rounding + freelist) / GIB, 4), "model", in_reserve=True, line=kv_line))
        else:
            unmodelled.append("allocator rounding (needs --model-config)")
            limits["allocator rounding (needs --model-config)"] = rounding_limit_gib(tokens)

    # Memory pool end -> first target graph capture: attention-backend workspaces (nothing logs their size)
    first_graph = rf.graph_begin.get("target decode", rf.graph_begin.get("target prefill"))
    if (rf.pool_end is None or first_graph is None) and rf.graph_usage and kv_line is not None:
        # graphs were captured, but the lines that bracket the backend's workspaces are not in the log
        what = "attention-backend buffers (no 'Memory pool end' / 'Capture ... begin' line to size them)"
        unmodelled.append(what)
        limits[what] = None
    if rf.pool_end is not None and first_graph is not None:
        begin_line = rf.lines.get("begin target decode", rf.lines.get("begin target prefill"))
        start, what = rf.pool_end, "pool end"
        pool_line, draft_line = rf.lines.get("pool_end"), rf.lines.get("draft_pool_end")
        if (rf.draft_pool_end is not None and pool_line is not None and draft_line is not None
                and begin_line is not None and pool_line < draft_line < begin_line):
            # 0.5.14+ allocates the draft's pool right after the target's (scheduler.py init_memory_pools), then
            # the attention backends (init_all_attention_backends), then the graphs: the span from the target's
            # pool end holds the draft's pool, which its own items count
            start, what = rf.draft_pool_end, "draft pool end"
        items.append(LedgerItem("attention_backend", f"attention backend buffers ({what} -> graph begin)",
                                rounded(start - first_graph, 3), "derived", in_reserve=True, line=begin_line))
    elif (rf.pool_end is not None and not rf.graph_usage and rank0 and ctx.summary is not None
          and ctx.summary.available_gpu_mem_gib is not None and not rf.draft_kv and rf.draft_weights is None
          and rf.lines.get("pool_end") is not None and rf.lines["pool_end"] < ctx.summary.line):
        # no graph line between them (graphs disabled, or none captured): the drop from 'Memory pool end' to the
        # scheduler summary is measured by two readings, the attention backend's buffers (init_attention_backend)
        # and what the scheduler allocates before it logs (c066: 42.35 -> 41.84 GB with --disable-cuda-graph)
        drop = rounded(rf.pool_end - ctx.summary.available_gpu_mem_gib, 3)
        if drop > 0:
            items.append(LedgerItem("after_pool", "attention backend and scheduler buffers (pool end -> "
                                    "scheduler summary, no graph line)", drop, "derived", in_reserve=True,
                                    line=ctx.summary.line))
    for name in sorted(n for n in rf.graph_usage if not n.startswith("draft")):
        key = f"graphs_{name.replace(' ', '_')}"
        usage = rf.graph_usage[name]
        if usage < 0:
            # free memory *rose* across the capture (``mem usage=-5.29 GB``): the loader's buffers were garbage
            # collected while graphs were captured; that is memory given back, not graphs of negative size
            items.append(LedgerItem(f"freed_{key}", f"memory freed during CUDA-graph capture ({name}): the "
                                    "loader's buffers collected", rounded(usage, 3), "log", line=rf.lines.get(key)))
            continue
        items.append(LedgerItem(key, f"CUDA graphs ({name})", rounded(usage, 3), "log", in_reserve=True,
                                line=rf.lines.get(key)))
    if rf.draft_weights is not None:
        # 0.5.14+ loads the draft before sizing the pool, so its weights sit inside the mfs budget
        items.append(LedgerItem("draft_weights", "draft weights", rf.draft_weights, "log",
                                in_reserve=not ctx.era.lo >= (0, 5, 14), line=rf.lines.get("draft_weights")))
    dkv = [k.total_gib for k in rf.draft_kv if k.total_gib is not None]
    if dkv:
        items.append(LedgerItem("draft_kv_cache", "draft KV cache", rounded(sum(dkv), 3), "log", in_reserve=True,
                                line=rf.lines.get("draft_kv_cache")))
        # the draft's pool stage begins at the last reading before its KV line: its own weights' end when it
        # loads after the target's pool (<= 0.5.13), the target's Memory pool end when it loads first (the
        # 0.5.14+ three-phase init, or an excerpt that begins at the draft's Load weight end)
        stage_start = rf.draft_post
        weights_line, target_pool_line = rf.lines.get("draft_weights"), rf.lines.get("pool_end")
        if rf.pool_end is not None and target_pool_line is not None and (
                weights_line is None or weights_line < target_pool_line):
            stage_start = rf.pool_end
        if rf.draft_pool_end is not None and stage_start is not None:
            overhead = rounded(stage_start - rf.draft_pool_end - sum(dkv), 3)
            if overhead:
                items.append(LedgerItem("draft_pool_overhead", "draft pool overhead", overhead, "derived",
                                        in_reserve=True, line=rf.lines.get("draft_pool_end")))
    for name in sorted(n for n in rf.graph_usage if n.startswith("draft")):
        key = f"graphs_{name.replace(' ', '_')}"
        items.append(LedgerItem(key, f"CUDA graphs ({name})", rounded(rf.graph_usage[name], 3), "log", in_reserve=True,
                                line=rf.lines.get(key)))

    # free at the end of startup: the scheduler summary (rank 0 prints it), else this rank's last reading
    end, end_source, final, end_line = None, None, False, 0
    if rank0 and ctx.summary is not None and ctx.summary.available_gpu_mem_gib is not None:
        end, end_source, final = ctx.summary.available_gpu_mem_gib, "scheduler summary (available_gpu_mem)", True
        end_line = ctx.summary.line
    elif rf.readings:
        end_line, end, what = max(rf.readings)
        end_source = f"last reading: {what}, line {end_line}"
        final = ctx.summary is not None and what.startswith("after") and what.endswith("graphs")
    unexplained = tol = None
    if rf.pre is not None and end is not None:
        # only what happened before the end reading; an excerpt may cut a rank's later lines
        counted = [it for it in items if it.gib is not None and it.key != "before_t"
                   and (it.line is None or it.line <= end_line)]
        tol = rounded(LOG_HALF_ULP * (sum(1 for it in counted if it.source != "model") + 1) + rf.pre.width / 2, 3)
        unexplained = rounded(rf.pre.mid - sum(it.gib for it in counted) - end, 3)  # type: ignore[misc]
    return RankLedger(
        rank=index,
        label=rf.rank.display,
        pre_load_free_gib=rounded(rf.pre.mid) if rf.pre else None,
        weights_gib=next((it.gib for it in items if it.key == "weights"), None),
        kv_gib=kv_logged,
        free_after_weights_gib=rounded(rf.post.mid) if rf.post else None,
        free_after_pool_gib=rf.pool_end,
        free_at_end_gib=end,
        free_at_end_source=end_source,
        end_is_final=final,
        items=tuple(items),
        unexplained_gib=unexplained,
        unexplained_tolerance_gib=tol,
        unmodelled=tuple(unmodelled),
        unmodelled_max_gib=tuple(limits.get(u) for u in unmodelled),
    )


#: the most K/V buffers a pool has: 2 per layer for the deepest models served (128 layers); MLA has 1 per layer
MAX_BUFFERS = 256


def rounding_limit_gib(tokens: int | None) -> float | None:
    """The largest allocator rounding can be without the config: at most one 2 MiB segment per buffer, plus the
    token free list (8 B a token) rounded up to a segment."""
    if tokens is None:
        return None
    freelist = -(-tokens * 8 // ALLOC_ROUND) * ALLOC_ROUND
    return rounded((MAX_BUFFERS * ALLOC_ROUND + freelist) / GIB, 3)
