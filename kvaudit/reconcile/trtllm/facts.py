"""What each TensorRT-LLM rank logged, and the pool the server allocated."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.trtllm import KVAllocation, Reading
from kvaudit.units import GIB
from kvaudit.record import record


#: readings only the C++ runtime of a TensorRT engine prints (not the PyTorch backend, which profiles first)
TRT_ENGINE_KEYS = ("engine_gib", "context_gib", "trt_managed_gib", "cpp_available_gib", "buffers_gib", "decoder_gib")


@dataclass
class RankFacts:
    rank: Rank
    r: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    allocations: list[KVAllocation] = field(default_factory=list)
    #: the estimation dry run's blocks, as any rank logged them (ranks size it alike), and that line
    dry_run: tuple[int, int] | None = None

    def final_allocation(self) -> KVAllocation | None:
        """The pool the server runs with: on the PyTorch path the allocation after the peak line (the one
        before it is the temporary profiling cache); otherwise the last one."""
        if not self.allocations:
            return None
        peak_line = self.lines.get("peak_gib")
        if peak_line is not None:
            after = [a for a in self.allocations if a.line > peak_line]
            if after:
                return after[-1]
            # an excerpt whose lines were pasted out of order (NVIDIA/TensorRT-LLM PR 15734: the pool line first):
            # a pool before the peak line is the final one when it has the budget's size, not the temporary one's
            kv, tmp = self.r.get("available_gib"), self.r.get("tmp_kv_gib")
            before = [a for a in self.allocations if a.gib and kv is not None and abs(a.gib - kv) <= 0.02
                      and (tmp is None or abs(a.gib - tmp) > 0.02)]
            return before[-1] if before else None
        if len(self.allocations) == 1 and (self.estimation_sized(self.allocations[0])
                                           or self.either_pass(self.allocations[0])):
            return None
        if self.replaced(self.allocations[-1]) is not None:
            return None
        return self.allocations[-1]

    def replaced(self, a: KVAllocation) -> int | None:
        """The line of a KV cache manager created after the pool line ``a`` ('Max KV cache pages|blocks per
        sequence', which the C++ manager prints before it allocates), when no peak line places the pools: the
        PyTorch backend builds its temporary profiling cache first and the pool it runs with after, so ``a`` is
        not known to be the server's pool, and the later one's pool line is not in the log (ai-dynamo/dynamo#1299:
        the Python logger's INFO lines absent, the C++ runtime's present). None otherwise."""
        later = self.lines.get("blocks_per_sequence")
        if later is None or later <= a.line or "peak_gib" in self.r or self.encoder_decoder_pair() is not None:
            return None
        if any(k in self.r for k in TRT_ENGINE_KEYS):  # a TensorRT engine's runtime sizes one pool, no profiling
            return None
        return later

    def either_pass(self, a: KVAllocation) -> bool:
        """A lone pool whose size was kv_cache_config.max_tokens with no fraction ('max_tokens is set by
        kv_cache_config.max_tokens: N', resource_manager.py calculate_max_num_blocks), with neither a peak line nor
        max_num_tokens to place it: KvCacheCreator writes the profiling cache's size into max_tokens before the
        profiling pass and its estimate after it, so the line reads the same for the temporary and the final pool."""
        said, block = self.r.get("max_tokens_only"), self.r.get("tokens_per_block") or 128
        # within a block of it: 1.0 rounds max_tokens up to whole blocks (math.ceil), later builds down (//)
        return (said is not None and a.tokens is not None and abs(a.tokens - said) < block
                and "peak_gib" not in self.r and "max_num_tokens" not in self.r
                and self.lines.get("max_tokens_only", a.line) <= a.line)

    def encoder_decoder_pair(self) -> tuple[KVAllocation, KVAllocation] | None:
        """(self, cross) when this rank sized two KV caches for an encoder-decoder model: the C++ runtime creates
        the self-attention manager, then the cross-attention one (trtGptModelInflightBatching.cpp: free memory x
        (1 - crossKvCacheFraction), then x crossKvCacheFraction). Told by the runtime's own line, or, in older
        builds that do not print it, by a second pool sized from its own 'Memory usage when calculating' line."""
        if len(self.allocations) < 2 or "peak_gib" in self.r:  # the PyTorch backend's temporary + final pair
            return None
        first, last = self.allocations[-2], self.allocations[-1]
        # ranks that print without a rank tag log identical pools, one after the other: not a pair of caches
        sized_between = (first.line < self.lines.get("cpp_available_gib", -1) < last.line
                         and first.tokens != last.tokens)
        if "cross_fraction" in self.r or "cross_manager" in self.r or sized_between:
            return first, last
        return None

    def estimation_sized(self, a: KVAllocation) -> bool:
        """The PyTorch backend first builds a temporary KV cache for its profiling pass, sized for the dummy
        requests (``KvCacheCreator._get_token_num_for_estimation``: max_num_tokens of prompt plus a few generated
        and draft tokens per request, in whole blocks), and only after the peak line the real one. An excerpt with
        no peak line whose one pool is that size shows the temporary cache (NVIDIA/TensorRT-LLM#8961: 8,256 tokens
        for max_num_tokens 8,192 in blocks of 32), not the pool the server runs with."""
        n, block = self.r.get("max_num_tokens"), self.r.get("tokens_per_block")
        if block is None or a.tokens is None:
            return False
        if self.dry_run is not None and a.tokens == self.dry_run[0] * block:
            # the log names the dry run's block count ('... for estimation dry run', 2026 builds)
            return True
        if n is None:
            return False
        return n <= a.tokens <= n + 4 * block


def gather_facts(startup: Startup) -> dict[Rank, RankFacts]:
    out: dict[Rank, RankFacts] = {}
    for e in startup.events:
        if isinstance(e, Reading):
            rr = out.setdefault(e.rank, RankFacts(e.rank))
            rr.r[e.key] = e.value
            rr.lines[e.key] = e.line
        elif isinstance(e, KVAllocation):
            out.setdefault(e.rank, RankFacts(e.rank)).allocations.append(e)
    dry = next(((int(rr.r["dry_run_blocks"]), rr.lines["dry_run_blocks"]) for rr in out.values()
                if "dry_run_blocks" in rr.r), None)
    for rr in out.values():
        rr.dry_run = dry
    return out


def first(facts: dict[Rank, RankFacts], key: str) -> float | None:
    """A reading any rank logged (ranks log the settings alike)."""
    return next((rr.r[key] for rr in facts.values() if key in rr.r), None)


@record
class Pool:
    """The allocated pool, per rank and the smallest (every rank runs with the smallest count)."""

    finals: dict[Rank, KVAllocation]
    smallest: KVAllocation | None
    gib: float | None  # its size (the pre-0.9 byte count when that is all the log has)
    temporary: KVAllocation | None = None  # the profiling pass's cache, when it is the only pool line
    self_pool: KVAllocation | None = None  # encoder-decoder: the self-attention cache (``smallest`` is the cross one)
    either: bool = False  # ``temporary`` may as well be the final pool (RankFacts.either_pass)
    dry_run: tuple[int, int, int] | None = None  # the dry run's blocks, its line, tokens per block
    replaced_by: int | None = None  # the line of a KV cache manager created after ``temporary`` (RankFacts.replaced)

    def missing(self) -> str:
        """Why there is no pool to check, in the log's own terms."""
        t = self.temporary
        if t is not None and self.either:
            return (f"the only pool line (line {t.line}, {t.tokens:,} tokens) was sized by kv_cache_config.max_tokens "
                    "with no fraction, which the PyTorch backend sets both for its temporary profiling cache and for "
                    "the final pool; with no profiling peak line and no max_num_tokens the log does not say which "
                    "this is")
        if t is not None and self.dry_run is not None and t.tokens == self.dry_run[0] * self.dry_run[2]:
            return (f"the pool lines (line {t.line}, {t.tokens:,} tokens) are the PyTorch backend's temporary cache: "
                    f"{self.dry_run[0]:,} blocks of {self.dry_run[2]}, which line {self.dry_run[1]} says were set for "
                    "the estimation dry run; the pool the server runs with is not in the log")
        if t is not None and self.replaced_by is not None:
            return (f"the pool line (line {t.line}, {t.tokens:,} tokens) is followed by another KV cache manager's "
                    f"creation (line {self.replaced_by}) whose pool line is not in the log: the PyTorch backend sizes "
                    "a temporary cache to profile with, then the pool it runs with, and no profiling peak line says "
                    "which this is")
        if t is not None:
            return (f"the only pool line (line {t.line}, {t.tokens:,} tokens) is the size of the PyTorch backend's "
                    "temporary profiling cache (max_num_tokens of dummy prompt plus generated tokens, in whole "
                    "blocks), and no profiling peak line follows it: the pool the server runs with is not in the log")
        return "the log has no 'Allocated ... for max tokens in paged KV cache (N)' line"

    @property
    def tokens(self) -> int | None:
        return self.smallest.tokens if self.smallest else None


def logged_pool(facts: dict[Rank, RankFacts]) -> Pool:
    finals = {r: a for r, rr in facts.items() if (a := rr.final_allocation()) is not None}
    smallest = min(finals.values(), key=lambda a: a.tokens) if finals else None
    gib = smallest.gib if smallest and smallest.gib else None
    old_bytes = first(facts, "old_kv_bytes")
    if gib is None and old_bytes is not None:
        gib = old_bytes / GIB
    pair = next((p for rr in facts.values() if (p := rr.encoder_decoder_pair()) is not None), None)
    if pair is not None:
        return Pool(finals, pair[1], pair[1].gib or None, None, pair[0])
    temporary, either, replaced_by = None, False, None
    if not finals:
        temporary = next((rr.allocations[0] for rr in facts.values()
                          if len(rr.allocations) == 1 and rr.estimation_sized(rr.allocations[0])), None)
        if temporary is None:
            temporary = next((rr.allocations[0] for rr in facts.values()
                              if len(rr.allocations) == 1 and rr.either_pass(rr.allocations[0])), None)
            either = temporary is not None
        if temporary is None:
            replaced = next(((rr.allocations[-1], line) for rr in facts.values() if rr.allocations
                             and (line := rr.replaced(rr.allocations[-1])) is not None), None)
            if replaced is not None:
                temporary, replaced_by = replaced
    dry = None
    if temporary is not None:
        rr0 = next(iter(facts.values()))
        block = first(facts, "tokens_per_block")
        if rr0.dry_run is not None and block:
            dry = (rr0.dry_run[0], rr0.dry_run[1], int(block))
    return Pool(finals, smallest, gib, temporary, either=either, dry_run=dry, replaced_by=replaced_by)
