"""What the reconciler produces: the formula rerun, a per-GPU ledger and findings. Pure data, no I/O.

Every GiB field is a float in GiB (2**30 bytes) or ``None`` when the inputs do not determine it.
"""

from __future__ import annotations

from dataclasses import field, fields, replace
from enum import Enum
from typing import Any

from kvaudit.record import Record, record


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


class Verdict(str, Enum):
    MATCH = "match"  # the logged token count lies in the interval the formula predicts
    EXPLAINED = "explained"  # it does not, but a known, named rule accounts for the difference
    MISMATCH = "mismatch"  # it does not, and no known rule accounts for it
    UNKNOWN = "unknown"  # the log lacks what the check needs


@record
class Thresholds(Record):
    """When a number becomes a finding. All GiB unless named otherwise; see docs/findings.md."""

    rank_imbalance_gib: float = 0.5  # spread of pre-load free memory across ranks
    rank_imbalance_fraction: float = 0.01  # ... and at least this fraction of T
    unexplained_gib: float = 0.25  # |unexplained| per GPU
    unused_min_gib: float = 4.0  # free at end of startup at least this ...
    unused_fraction: float = 0.2  # ... and at least this fraction of T
    low_headroom_gib: float = 1.0  # free at end of startup below this
    reserve_tolerance_gib: float = 0.03  # free-after-pool vs reserve - request table - rounding
    # live readings (kvaudit check)
    drift_gib: float = 1.0  # free memory now vs at the end of startup
    unattributed_gib: float = 0.5  # NVML used that no process accounts for
    occupied_at_startup_gib: float = 3.0  # memory gone before T (CUDA context + NCCL is ~1-2 GiB)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def with_overrides(self, pairs: dict[str, float]) -> "Thresholds":
        unknown = set(pairs) - set(self.names())
        if unknown:
            raise ValueError(f"unknown threshold(s): {', '.join(sorted(unknown))}; known: {', '.join(self.names())}")
        return replace(self, **pairs)


@record
class Finding(Record):
    code: str
    severity: Severity
    message: str
    fields: dict[str, Any] = field(default_factory=dict)
    ranks: tuple[str, ...] = ()
    ignored: bool = False  # acknowledged (--ignore, a baseline): shown, marked, not counted


def active(findings) -> list["Finding"]:
    """The findings that count (not acknowledged with --ignore)."""
    return [f for f in findings if not f.ignored]


def failures(findings) -> list["Finding"]:
    """The error findings that count: the startup failed (what-if answers from them, not from its headroom)."""
    return [f for f in active(findings) if f.severity is Severity.ERROR]


@record
class TokenInterval(Record):
    low: int
    high: int

    def contains(self, n: int) -> bool:
        return self.low <= n <= self.high


@record
class Formula(Record):
    """The engine's KV sizing formula, rerun on this startup's numbers."""

    mem_fraction_static: float | None
    mem_fraction_static_source: str | None  # server_args | cli | inferred | log
    pre_load_free_gib: float | None  # T: free memory before the weights loaded, min over ranks
    pre_load_free_source: str | None
    post_load_free_gib: float | None  # free after the weights, min over ranks
    reserve_gib: float | None  # (1 - mfs) * T
    rest_gib: float | None  # post - reserve: the KV budget
    bytes_per_token: int | None  # per rank, as the formula divides by it
    bytes_per_token_source: str | None  # config | kv_line
    predicted_tokens: TokenInterval | None
    logged_tokens: int | None
    verdict: Verdict
    verdict_reason: str
    rule: str | None = None  # which era's post-processing produced the prediction
    effective_mem_fraction_static: float | None = None  # solved from the logged tokens on a mismatch
    page_size: int | None = None
    max_total_tokens_cap: int | None = None
    speculative_headroom_tokens: int | None = None
    kv_bytes_per_token_logged: float | None = None  # from the KV line: size / (tokens + padding)
    logged_tokens_approximate: bool = False  # the log gives the count only abridged ("273K")
    probable_cap: str | None = None  # why the pool looks capped although no --max-total-tokens is in the log
    state_pool_gib: float | None = None  # what a hybrid's state pool took from the budget (max rank; no padding slot)
    #: the inputs the token check rests on (names as in kvaudit.verdict.inputs): a check that rests on an
    #: assumed one cannot produce a mismatch by itself (verdict rule 3)
    check_inputs: tuple[str, ...] = ()
    #: the bytes per token as an interval (from the KV line's rounded sizes; one value from config.json): a plan
    #: that replays this startup divides by the same interval the audit did
    bytes_per_token_range: tuple[float, float] | None = None
    #: the formula worked on this startup's numbers, in the engine's words (``(post - (1 - f) x T) GiB / B per
    #: token``): the verdict quotes it in TOKENS_MATCH
    check_text: str | None = None
    #: where page_size came from ("log", "engine args", "default (16 on CUDA)"); None: the log
    page_size_source: str | None = None


@record
class FormulaRow(Record):
    """One line of an engine's formula as the human reports show it; the reports do the formatting."""

    quantity: str
    value: float | None
    unit: str  # "GiB", or "" for a plain number (a fraction)
    source: str = ""


@record
class LedgerItem(Record):
    key: str  # stable identifier: weights, kv_cache, request_table, ...
    label: str
    gib: float | None
    source: str  # "log" (a logged value), "model" (computed from the formula), "derived" (difference)
    in_reserve: bool = False  # comes out of the static reserve rather than the mfs budget
    line: int | None = None  # the log line it comes from (or, for modelled items, the line they belong to)


@record
class RankLedger(Record):
    """One GPU: where the memory free before the weights (T on this rank) went, item by item."""

    rank: int
    label: str
    pre_load_free_gib: float | None
    weights_gib: float | None
    kv_gib: float | None
    free_after_weights_gib: float | None
    free_after_pool_gib: float | None
    free_at_end_gib: float | None
    free_at_end_source: str | None
    end_is_final: bool  # free_at_end is the end of startup (not just the last line the log kept)
    items: tuple[LedgerItem, ...]
    unexplained_gib: float | None
    unexplained_tolerance_gib: float | None
    unmodelled: tuple[str, ...] = ()  # items the ledger could not size (and so may sit in 'unexplained')
    #: the largest each unmodelled item can be (GiB; None: no bound known), parallel to ``unmodelled``: a
    #: cause that cannot hold the unexplained amount is not offered (kvaudit.verdict, rule 2)
    unmodelled_max_gib: tuple[float | None, ...] = ()
    logged: tuple[tuple[str, float], ...] = ()  # every number this rank's memory lines stated, by reading key

    def item(self, key: str) -> LedgerItem | None:
        for it in self.items:
            if it.key == key:
                return it
        return None


@record
class ModelSummary(Record):
    architecture: str | None
    attention: str  # mha | mla | unknown
    layers: int | None
    kv_heads: int | None
    kv_heads_per_rank: int | None
    head_dim: int | None
    kv_dtype: str | None
    kv_dtype_bytes: float | None
    attention_tp_size: int | None
    source: str | None
    attention_tp_size_at_least: bool = False  # only a lower bound: from the rank tags an excerpt happened to show
    attention_tp_size_source: str | None = None


@record
class Audit(Record):
    """The whole answer for one startup."""

    engine: str
    source: str
    startup_index: int
    startups_total: int
    first_line: int
    last_line: int
    engine_version: str  # inferred range, e.g. "0.5.9" or "0.4.4..0.5.8"
    version_evidence: tuple[str, ...]
    model: ModelSummary
    formula: Formula
    ranks: tuple[RankLedger, ...]
    findings: tuple[Finding, ...]
    speculative: str | None
    hicache_host_gb: float | None  # decimal GB, host RAM per rank
    notes: tuple[str, ...] = ()
    # how the engine's formula reads, for the human reports (the engine module writes these; reports print them)
    engine_display: str = ""
    formula_text: str = ""
    formula_rows: tuple[FormulaRow, ...] = ()
    pre_load_label: str = "free before loading"
    #: what the engine's budget holds besides the KV cache (f x T - rest), in its words (kvaudit diff)
    budget_other_label: str = "what the budget holds besides the KV cache"
    #: the numbers are a live server's own (its HTTP endpoints), not a startup log's: no lines, less visible
    from_endpoint: bool = False
    #: the platform the audit ran on when it is not a card of its own (kvaudit.platforms), e.g. unified memory
    platform: str | None = None
    #: that platform's kind in the support table (kvaudit.support.KINDS["platform"]): "unified" or "cpu"; an
    #: engine's audit may set "accelerator" (a device whose budget rule kvaudit has not read) without a platform
    #: name; None: a card of its own
    platform_kind: str | None = None
    #: the pool kinds this startup holds, as the engine read them (kvaudit.support.KINDS["pool"]: dense, mla, nsa,
    #: swa, mamba, dsv4, encoder_decoder, draft, backend_managed); empty: the verdict tells them from the config and
    #: the audit
    pool_kinds: tuple[str, ...] = ()
    #: how much of this startup kvaudit models (kvaudit.support.Coverage), set by the verdict
    coverage: Any = None
    #: memory-bearing lines of the startup window that no grammar read: (line number, text), listed in the report
    uninterpreted: tuple[tuple[int, str], ...] = ()
    #: the line that ends the pool's sizing, when the startup's log does not reach it (the engine's words: "KV
    #: cache size line (...)"); None when it does. The verdict raises INCOMPLETE_LOG from it (unless the startup
    #: failed: a failure is its own end)
    lacks: str | None = None
    #: the log's sign that the engine ran on AMD ROCm (the engine writes it: SGLang's rocm_evidence, e.g.
    #: "attention_backend='aiter'" or a HIP-only line); None: none seen. A plan that replays this startup
    #: (plan --validate) reads the platform from it, as a log names no card
    rocm: str | None = None

    @property
    def worst(self) -> Severity | None:
        counted = [f for f in self.findings if not f.ignored]
        if not counted:
            return None
        return max((f.severity for f in counted), key=lambda s: s.rank)


@record
class AuditOptions(Record):
    """What the user (or a live reading) adds to the log. Every field is optional."""

    source: str = "-"
    model_geometry: Any = None  # kvaudit.model_config.ModelGeometry
    mem_fraction_static: float | None = None
    tp_size: int | None = None
    kv_cache_dtype: str | None = None
    context_length: int | None = None
    max_tokens: int | None = None  # what-if: a cap on the KV pool (TensorRT-LLM's kv_cache_config.max_tokens)
    gpu_capacity_gib: float | None = None  # the card's CUDA-visible total, when known (NVML)
    thresholds: Thresholds = field(default_factory=Thresholds)
    hypothetical: bool = False  # a what-if: the log's KV lines describe other settings than these
    platform: Any = None  # kvaudit.platforms.Platform: unified memory or a CPU backend, from the log or a reading


@record
class WhatIf(Record):
    """The same formula rerun with changed inputs, and what it would do to the reserve."""

    changes: dict[str, Any]
    tokens_before: int | None
    tokens_after: TokenInterval | None
    kv_gib_before: float | None
    kv_gib_after: float | None
    reserve_gib_before: float | None
    reserve_gib_after: float | None
    reserve_needs_gib_before: float | None  # what this startup took out of the reserve (graphs, draft, tables)
    reserve_needs_gib_after: float | None  # the same items at the new token count / context length
    headroom_gib_before: float | None  # free at the end of startup, as logged
    headroom_gib_after: float | None  # what would be left for activations
    risk: str  # ok | low | oom | unknown
    explanation: tuple[str, ...]
    #: the engine's absolute setting that gives exactly this answer whatever the free memory is next time
    #: (``--max-total-tokens N``, ``--kv-cache-memory-bytes B``, ``max_tokens``/``max_gpu_total_bytes``)
    pin: str | None = None
    #: what the engine keeps out of the KV cache, in its terms (the whatif table's row for it)
    reserve_label: str = "static reserve"
    #: the one reason that decides ``risk`` when it is not the reserve (a KV budget <= 0, a pool smaller than one
    #: request, a startup that never finished): the engine's own words; also the first line of ``explanation``
    reason: str | None = None

    @property
    def computed(self) -> bool:
        """Whether the rerun produced any figure at all; when none, there is no answer to show, only why."""
        return any(v is not None for v in (self.tokens_after, self.kv_gib_after, self.reserve_gib_after,
                                           self.reserve_needs_gib_after, self.headroom_gib_after))


def startup_identity(startup: Any, source: str, startups_total: int) -> dict[str, Any]:
    """The Audit fields every engine fills the same way: which input, which startup, which version era."""
    era = startup.era
    return {"source": source, "startup_index": startup.index, "startups_total": startups_total,
            "first_line": startup.first_line, "last_line": startup.last_line,
            "engine_version": str(era) if era.evidence else "unknown",
            "version_evidence": tuple(dict.fromkeys(era.evidence))}
