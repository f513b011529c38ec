"""Per-rank facts gathered from a startup's events: the readings, logged sizes and where each was logged.

The parser (``kvaudit.parse.sglang``) has already told target lines from draft lines; here they are sorted
into one record per rank, which every later step reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.sglang import (
    DistInit,
    GraphBegin,
    GraphEnd,
    KVAlloc,
    PostCaptureKV,
    KVBudget,
    OtherPool,
    PoolEnd,
    SlidingWindowSplit,
    WeightBegin,
    WeightEnd,
)
from kvaudit.units import LOG_HALF_ULP, Interval

@dataclass
class RankFacts:
    rank: Rank
    pre: Interval | None = None
    pre_source: str | None = None
    post: Interval | None = None
    weights: float | None = None
    kv: list[KVAlloc] = field(default_factory=list)
    other_pools: list[OtherPool] = field(default_factory=list)
    pool_end: float | None = None
    graph_begin: dict[str, float] = field(default_factory=dict)
    graph_usage: dict[str, float] = field(default_factory=dict)
    draft_weights: float | None = None
    draft_post: float | None = None
    #: the draft's 'Load weight end' reading when it stands after the target's and before the target's pool
    #: (SGLang 0.5.14+ loads the draft before sizing the pool): the free memory the pool was sized from
    draft_post_before_pool: Interval | None = None
    draft_kv: list[KVAlloc] = field(default_factory=list)
    draft_pool_end: float | None = None
    dist_usage: float | None = None
    readings: list[tuple[int, float, str]] = field(default_factory=list)  # (line, avail GiB, what)
    lines: dict[str, int] = field(default_factory=dict)  # where each fact was logged

    swa_summary: OtherPool | None = None  # "SWAKVPool mem usage: X GB, swa size: N, full size: M"
    kv_budget: float | None = None  # "The available memory for KV cache is X GB": the engine's own rest
    post_capture_kv: PostCaptureKV | None = None  # the pool re-sized after capture (0.5.16+, opt-in)


def gather_facts(startup: Startup) -> dict[Rank, RankFacts]:
    facts: dict[Rank, RankFacts] = {}

    def get(rank: Rank) -> RankFacts:
        if rank not in facts:
            facts[rank] = RankFacts(rank)
        return facts[rank]

    # post-capture KV sizing (0.5.16+, opt-in): the pre-capture KV lines name address space, not memory (0.5.17+
    # says "VA upper bound"; 0.5.16 still says "is allocated"): a later "Post-capture KV sizing" line marks them
    resized = startup.of(PostCaptureKV)
    first_resize = min((ev.line for ev in resized), default=None)
    for ev in startup.events:
        if isinstance(ev, (KVAlloc, OtherPool, PoolEnd, KVBudget, SlidingWindowSplit)) and ev.role == "target":
            # the first line of the target's pool stage: the pool was sized just before it
            get(ev.rank).lines.setdefault("pool_start", ev.line)
        if (isinstance(ev, KVAlloc) and ev.role == "target" and first_resize is not None and ev.line < first_resize
                and not ev.upper_bound):
            ev = replace(ev, upper_bound=True)
        if isinstance(ev, WeightBegin) and ev.role == "target" and ev.avail_gib is not None:
            rf = get(ev.rank)
            if rf.pre is None or rf.pre_source != "Load weight begin":
                rf.pre, rf.pre_source = Interval.logged(ev.avail_gib), "Load weight begin"
            rf.readings.append((ev.line, ev.avail_gib, "before weights"))
        elif isinstance(ev, WeightEnd):
            rf = get(ev.rank)
            rf.lines["weights" if ev.role == "target" else "draft_weights"] = ev.line
            if ev.role == "target":
                if ev.avail_gib is not None:
                    rf.post = Interval.logged(ev.avail_gib)
                    rf.readings.append((ev.line, ev.avail_gib, "after weights"))
                rf.weights = ev.usage_gib
                if rf.pre is None and ev.avail_gib is not None and ev.usage_gib is not None:
                    rf.pre = Interval.logged(ev.avail_gib + ev.usage_gib, 2 * LOG_HALF_ULP)
                    rf.pre_source = "Load weight end (avail + mem usage)"
            else:
                rf.draft_weights = ev.usage_gib
                rf.draft_post = ev.avail_gib
                if ev.avail_gib is not None:
                    rf.readings.append((ev.line, ev.avail_gib, "after draft weights"))
        elif isinstance(ev, DistInit):
            rf = get(ev.rank)
            if ev.role == "target":
                rf.dist_usage = ev.usage_gib
                if ev.begin_avail_gib is not None and rf.pre is None:
                    rf.pre = Interval(ev.begin_avail_gib - 2.0, ev.begin_avail_gib + LOG_HALF_ULP)
                    rf.pre_source = "Init torch begin (before NCCL; approximate)"
        elif isinstance(ev, PostCaptureKV) and ev.tokens is not None:
            rf = get(ev.rank)
            rf.post_capture_kv = ev
            rf.lines["post_capture_kv"] = ev.line
            if ev.free_gib is not None:
                rf.readings.append((ev.line, ev.free_gib, "after the post-capture KV resize"))
        elif isinstance(ev, KVAlloc):
            rf = get(ev.rank)
            (rf.kv if ev.role == "target" else rf.draft_kv).append(ev)
            rf.lines["kv_cache" if ev.role == "target" else "draft_kv_cache"] = ev.line
        elif isinstance(ev, KVBudget) and ev.role == "target":
            get(ev.rank).kv_budget = ev.gib
            get(ev.rank).lines["kv_budget"] = ev.line
        elif isinstance(ev, OtherPool) and ev.kind == "swa_summary":
            if ev.role == "target":
                get(ev.rank).swa_summary = ev
        elif isinstance(ev, OtherPool):
            if ev.role == "target" and ev.counts_in_total and ev.gib is not None:
                get(ev.rank).other_pools.append(ev)
                get(ev.rank).lines[f"pool_{ev.kind}"] = ev.line
        elif isinstance(ev, PoolEnd) and ev.avail_gib is not None:
            rf = get(ev.rank)
            if ev.role == "target":
                rf.pool_end = ev.avail_gib
                rf.lines["pool_end"] = ev.line
            else:
                rf.draft_pool_end = ev.avail_gib
                rf.lines["draft_pool_end"] = ev.line
            rf.readings.append((ev.line, ev.avail_gib, f"{'draft ' if ev.role == 'draft' else ''}Memory pool end"))
        elif isinstance(ev, GraphBegin):
            rf = get(ev.rank)
            if ev.avail_gib is not None:
                rf.graph_begin.setdefault(ev.name, ev.avail_gib)
                rf.lines.setdefault(f"begin {ev.name}", ev.line)
                rf.readings.append((ev.line, ev.avail_gib, f"before {ev.name} graphs"))
        elif isinstance(ev, GraphEnd):
            rf = get(ev.rank)
            usage = ev.usage_gib
            if usage is None and ev.avail_gib is not None and ev.name in rf.graph_begin:
                usage = rf.graph_begin[ev.name] - ev.avail_gib
            if usage is not None:
                rf.graph_usage[ev.name] = rf.graph_usage.get(ev.name, 0.0) + usage
                rf.lines[f"graphs_{ev.name.replace(' ', '_')}"] = ev.line
            if ev.avail_gib is not None:
                rf.readings.append((ev.line, ev.avail_gib, f"after {ev.name} graphs"))
    for rf in facts.values():
        rf.draft_post_before_pool = _draft_post_before_pool(rf)
    return facts


def _draft_post_before_pool(rf: RankFacts) -> Interval | None:
    """The draft's post-weights reading when this rank's log shows the draft loaded between the target's weights
    and the target's pool (``scheduler.py::init_model_worker``, SGLang 0.5.14+: ``init_tp_model_worker``,
    ``maybe_init_draft_worker``, then ``init_memory_pools``). Only with the target's own 'Load weight end' before
    it and a pool line after it: an excerpt that shows neither order proves nothing."""
    weights, draft, pool = rf.lines.get("weights"), rf.lines.get("draft_weights"), rf.lines.get("pool_start")
    if rf.draft_post is None or weights is None or draft is None or pool is None:
        return None
    return Interval.logged(rf.draft_post) if weights < draft < pool else None
