"""The KV pool of one rank as a list of components, each with its logged size and source line.

SGLang's pool is no longer one tensor pair: a sliding-window hybrid (gpt-oss, Gemma 2/3, MiMo) holds a full-
attention pool and a sliding-window pool (``SWAKVPool``, ``srt/mem_cache/swa_memory_pool.py``); a hybrid
linear-attention model (Qwen3-Next, Qwen3.5, Nemotron-H, Falcon-H1, LFM2, Kimi-Linear) adds a Mamba/conv state
pool (``MambaPool``, ``srt/mem_cache/memory_pool.py``) that comes out of the same budget (reference §2.6);
DeepSeek-V3.2's NSA indexer buffers sit inside the MLA line. Each component becomes its own ledger item:

    kv_cache       the full-attention KV tensors (every layer, for a plain model), or the whole SWA pool
                   when a rank logged only the ``SWAKVPool mem usage`` summary
    kv_cache_swa   the sliding-window layers' KV tensors
    state_pool     Mamba conv + SSM state (+ the speculative intermediate caches), per request, not per token
    budget_reserve a reservation the engine logged out of the same budget (``Reserving X GB of the KV budget``)
    pool_<kind>    another engine-logged pool that counts in the budget
"""

from __future__ import annotations


from kvaudit.parse.sglang import KVAlloc
from kvaudit.reconcile.sglang.facts import RankFacts
from kvaudit.record import Record, record

#: ledger keys of the components that hold KV tensors (the rest are state and other pools)
KV_KEYS = ("kv_cache", "kv_cache_swa")


@record
class PoolComponent(Record):
    key: str  # ledger item key
    label: str
    gib: float  # as logged (GiB)
    parts: int  # how many rounded figures were added up (each +-0.005)
    line: int
    tokens: int | None = None  # rows it holds, when the line says (#tokens, swa size)
    per_token: bool = True  # False for the state pool (sized per request)
    #: post-capture sizing's backed bytes: each buffer rounded up to the VMM granularity (kv_vmm_backing.py
    #: align_up), so the size over the tokens is not the cell
    backed: bool = False


def _kv_size(lines: list[KVAlloc]) -> tuple[float, int]:
    gib = sum(k.total_gib or 0.0 for k in lines)
    parts = sum((k.k_gib is not None) + (k.v_gib is not None) + (k.kv_gib is not None) for k in lines)
    return gib, parts


def components(rf: RankFacts) -> tuple[PoolComponent, ...]:
    """This rank's pool, component by component, as its lines state it."""
    out: list[PoolComponent] = []
    kvs = [k for k in rf.kv if k.total_gib is not None and not k.upper_bound]
    swa_rank = rf.swa_summary is not None or any(k.label.upper() == "SWA" for k in kvs)
    if swa_rank:
        swa = [k for k in kvs if k.label.upper() == "SWA"]
        full = [k for k in kvs if k.label and k.label.upper() != "SWA"]
        plain = [k for k in kvs if not k.label]
        # SWAKVPool.__init__ builds the sliding-window pool first, then the full one: unlabelled lines
        # (before 0.5.17's cache names) come in that order
        if plain and not swa:
            swa, plain = plain[:1], plain[1:]
        full += plain
        summary = rf.swa_summary
        if summary is not None and summary.gib is not None and not (swa and full):
            # a line of the pair is missing from the excerpt: the summary states the whole pool
            out.append(PoolComponent("kv_cache", "KV cache (full + sliding-window layers; SWAKVPool)",
                                     summary.gib, 1, summary.line, summary.detail.get("full_size")))
        else:
            if full:
                gib, parts = _kv_size(full)
                out.append(PoolComponent("kv_cache", "KV cache (full-attention layers)", gib, parts, full[-1].line,
                                         full[0].tokens))
            if swa:
                gib, parts = _kv_size(swa)
                out.append(PoolComponent("kv_cache_swa", "KV cache (sliding-window layers)", gib, parts,
                                         swa[-1].line, swa[0].tokens))
    elif kvs:
        gib, parts = _kv_size(kvs)
        out.append(PoolComponent("kv_cache", "KV cache (target)", gib, parts, kvs[-1].line, kvs[0].tokens))
    elif rf.post_capture_kv is not None and rf.post_capture_kv.kv_gib is not None:
        # post-capture sizing (0.5.17+): the memory backed after the resize, not the pre-capture address space
        pc = rf.post_capture_kv
        out.append(PoolComponent("kv_cache", "KV cache (backed after CUDA-graph capture)", pc.kv_gib or 0.0, 1,
                                 pc.line, pc.tokens, backed=True))
    for pool in rf.other_pools:
        if pool.kind == "mamba":
            sizes = [k for k in pool.detail if k != "max_mamba_cache_size"]
            what = " + ".join(k.replace("_size", "").replace("_", " ") for k in sizes) or "state"
            out.append(PoolComponent("state_pool", f"Mamba state pool ({what}; "
                                     f"{pool.detail.get('max_mamba_cache_size', '?')} slots)",
                                     pool.gib or 0.0, max(1, len(sizes)), pool.line,
                                     pool.detail.get("max_mamba_cache_size"), per_token=False))
        elif pool.kind == "budget_reserve":
            out.append(PoolComponent("budget_reserve", f"KV budget reserved for {pool.detail.get('for') or 'later'}",
                                     pool.gib or 0.0, 1, pool.line, per_token=False))
        else:
            out.append(PoolComponent(f"pool_{pool.kind}", f"{pool.kind} pool", pool.gib or 0.0, 1, pool.line))
    return tuple(out)


def kv_gib(comps: tuple[PoolComponent, ...]) -> float | None:
    """The KV tensors only (full + sliding-window), not the state pool."""
    vals = [c.gib for c in comps if c.key in KV_KEYS]
    return round(sum(vals), 4) if vals else None


def kv_parts(comps: tuple[PoolComponent, ...]) -> int:
    return sum(c.parts for c in comps if c.key in KV_KEYS)


#: what the budget pays for before the KV pool: a hybrid's state pool, a logged reservation (multimodal buffers)
TAKEN_BEFORE_KV = ("state_pool", "budget_reserve")


def budget_share(c: PoolComponent) -> float:
    """GiB of a component the KV budget was charged for. The state pool allocates ``max_mamba_cache_size + 1``
    slots (slot 0 is the padding slot that padded tokens write to; ``MambaPool.__init__``, conv and temporal
    tensors of ``(layers, size + 1, ...)``, 0.5.2+) and the line prints those tensors' sizes, while
    ``handle_max_mamba_cache`` took ``max_mamba_cache_size x mamba_cache_per_req`` from the budget: the padding
    slot comes out of the reserve, not the budget."""
    if c.key == "state_pool" and c.tokens:
        return c.gib * c.tokens / (c.tokens + 1)
    return c.gib


def state_gib(comps: tuple[PoolComponent, ...], *, budget: bool = False) -> tuple[float, int] | None:
    """What was taken before the KV pool (GiB, rounded figures in it): the state pool and any logged
    reservation, or None when the rank logged neither. ``budget``: the part the KV budget was charged for
    (the state pool without its padding slot, ``budget_share``); otherwise what was allocated."""
    st = [c for c in comps if c.key in TAKEN_BEFORE_KV]
    if not st:
        return None
    return sum(budget_share(c) if budget else c.gib for c in st), sum(c.parts for c in st)


def is_swa(comps: tuple[PoolComponent, ...]) -> bool:
    return any(c.key == "kv_cache_swa" or "SWAKVPool" in c.label for c in comps)
