"""What each TensorRT-LLM rank logged, and the pool the server allocated."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.trtllm import KVAllocation, Reading
from kvaudit.units import GIB


@dataclass
class RankFacts:
    rank: Rank
    r: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    allocations: list[KVAllocation] = field(default_factory=list)

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
        return self.allocations[-1]

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
        if n is None or block is None or a.tokens is None:
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
    return out


def first(facts: dict[Rank, RankFacts], key: str) -> float | None:
    """A reading any rank logged (ranks log the settings alike)."""
    return next((rr.r[key] for rr in facts.values() if key in rr.r), None)


@dataclass(frozen=True)
class Pool:
    """The allocated pool, per rank and the smallest (every rank runs with the smallest count)."""

    finals: dict[Rank, KVAllocation]
    smallest: KVAllocation | None
    gib: float | None  # its size (the pre-0.9 byte count when that is all the log has)
    temporary: KVAllocation | None = None  # the profiling pass's cache, when it is the only pool line
    self_pool: KVAllocation | None = None  # encoder-decoder: the self-attention cache (``smallest`` is the cross one)
    either: bool = False  # ``temporary`` may as well be the final pool (RankFacts.either_pass)

    def missing(self) -> str:
        """Why there is no pool to check, in the log's own terms."""
        t = self.temporary
        if t is not None and self.either:
            return (f"the only pool line (line {t.line}, {t.tokens:,} tokens) was sized by kv_cache_config.max_tokens "
                    "with no fraction, which the PyTorch backend sets both for its temporary profiling cache and for "
                    "the final pool; with no profiling peak line and no max_num_tokens the log does not say which "
                    "this is")
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
    temporary, either = None, False
    if not finals:
        temporary = next((rr.allocations[0] for rr in facts.values()
                          if len(rr.allocations) == 1 and rr.estimation_sized(rr.allocations[0])), None)
        if temporary is None:
            temporary = next((rr.allocations[0] for rr in facts.values()
                              if len(rr.allocations) == 1 and rr.either_pass(rr.allocations[0])), None)
            either = temporary is not None
    return Pool(finals, smallest, gib, temporary, either=either)
