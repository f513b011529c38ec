"""vLLM what-if: another gpu_memory_utilization moves the budget by (new - old) x total, one for one; another KV
dtype rescales bytes per token."""

from __future__ import annotations

import math

from kvaudit.parse.interface import Startup
from kvaudit.reconcile.interface import Audit, AuditOptions, TokenInterval, WhatIf
from kvaudit.model_config import element_bytes
from kvaudit.units import GIB


#: the whatif row for what this engine keeps out of the KV cache
RESERVE_LABEL = "headroom (1 - utilization) x total"


def whatif(startup: Startup, opts: AuditOptions, base: Audit, new_opts: AuditOptions) -> WhatIf:
    f0 = base.formula
    changes = {k: getattr(new_opts, k) for k in ("mem_fraction_static", "kv_cache_dtype", "tp_size", "context_length")
               if getattr(new_opts, k) is not None and getattr(new_opts, k) != getattr(opts, k)}
    explanation: list[str] = []
    if f0.pre_load_free_gib is None or f0.mem_fraction_static is None or f0.rest_gib is None or not f0.bytes_per_token:
        return WhatIf(changes, f0.logged_tokens, None, f0.rest_gib, None, f0.reserve_gib, None, None, None, None, None,
                      "unknown", ("the log lacks total memory, the utilisation or the available KV memory",),
                      reserve_label=RESERVE_LABEL)
    T, u0 = f0.pre_load_free_gib, f0.mem_fraction_static
    u1 = new_opts.mem_fraction_static or u0
    cell = f0.bytes_per_token
    if new_opts.kv_cache_dtype and opts.model_geometry is not None:
        new_elt = element_bytes(new_opts.kv_cache_dtype) or 2
        old_elt = base.model.kv_dtype_bytes or 2
        cell = int(cell * new_elt / old_elt)
        explanation.append(f"KV element {old_elt:g} -> {new_elt:g} B: {f0.bytes_per_token:,} -> {cell:,} B/token")
    kv1 = f0.rest_gib + (u1 - u0) * T
    bs = f0.page_size or 16
    tokens = math.floor(kv1 * GIB / (cell * bs)) * bs if kv1 > 0 else 0
    graphs = max((l.item("graphs_target_decode").gib or 0 for l in base.ranks if l.item("graphs_target_decode")),
                 default=0.0)
    r0, r1 = T * (1 - u0), T * (1 - u1)
    h0, h1 = r0 - graphs, r1 - graphs
    risk = "oom" if (h1 < 0 or kv1 <= 0) else ("low" if h1 < opts.thresholds.low_headroom_gib else "ok")
    explanation.append(f"the budget moves by ({u1} - {u0}) x {T:.2f} GiB = {(u1 - u0) * T:+.2f} GiB; CUDA graphs "
                       f"captured beyond any estimate ({graphs:.2f} GiB) live in the (1 - util) headroom")
    # --kv-cache-memory-bytes (0.10.2+) fixes the KV cache per worker and skips the profiling budget: the same
    # pool next time, whatever the profile measures (config/cache.py kv_cache_memory_bytes)
    pin = f"--kv-cache-memory-bytes {int(tokens * cell)}" if tokens > 0 else None
    return WhatIf(changes, f0.logged_tokens, TokenInterval(tokens, tokens), f0.rest_gib, round(max(kv1, 0), 2),
                  round(r0, 2), round(r1, 2), round(graphs, 3), round(graphs, 3), round(h0, 2), round(h1, 2), risk,
                  tuple(explanation), pin, reserve_label=RESERVE_LABEL)
