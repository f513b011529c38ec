"""What one TensorRT-LLM startup establishes before any arithmetic, each setting with its source: the
fraction (the log, --mem-fraction-static, or the 0.9 default, said to be assumed), tokens per block, the TP size
(rank tags give "at least"), the KV element type, configured caps, VSWA windows, speculative decoding."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvaudit.model_config import ModelGeometry
from kvaudit.model_config import element_bytes as model_element_bytes
from kvaudit.parse.interface import Rank, Startup
from kvaudit.parse.trtllm import Banner, Cap, Reading, WindowPool, WindowVector
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.reconcile.trtllm.facts import RankFacts, first, gather_facts

DEFAULT_FRACTION = 0.9  # KvCacheConfig / executor::KvCacheConfig default (kDefaultGpuMemFraction), 0.8+
#: the default before 0.8: batch_manager/kvCacheConfig.h kDefaultGpuMemFraction = 0.85f, which Triton's
#: tensorrtllm_backend v0.5.0-v0.7.2 prints ("will use default value of 0.85"); v0.8.0 prints 0.9
OLD_DEFAULT_FRACTION = 0.85
OLD_DEFAULT_UNTIL = (0, 7, 99)


#: readings only the PyTorch backend (0.17+) prints: a startup with one is 0.8 or later
PYTORCH_KEYS = frozenset({"peak_gib", "weights_gib", "weights_in_torch_gib", "weights_outside_torch_gib",
                          "activation_gib", "outside_torch_gib", "estimated_kv_gib", "estimated_tokens",
                          "torch_cap_gib", "max_tokens_only", "oom_total_gib", "oom_free_gib", "dry_run_blocks"})


def default_fraction(startup: Startup) -> tuple[float, str]:
    """The fraction a release uses when none is set: 0.85 up to 0.7, 0.9 from 0.8 (and on the PyTorch backend,
    which came later); where the log's lines do not tell the era apart, 0.9, said so."""
    era = startup.era
    pytorch = any(e.key in PYTORCH_KEYS for e in startup.of(Reading)) or any(
        b.backend == "pytorch" for b in startup.of(Banner))
    if not pytorch and era.hi is not None and era.hi <= OLD_DEFAULT_UNTIL:
        return OLD_DEFAULT_FRACTION, "default 0.85 of releases before 0.8 (the log does not state it)"
    if not pytorch and era.lo <= OLD_DEFAULT_UNTIL:
        return DEFAULT_FRACTION, "default 0.9 (the log does not state it; 0.85 before 0.8)"
    return DEFAULT_FRACTION, "default 0.9 (the log does not state it)"


@dataclass
class Context:
    startup: Startup
    opts: AuditOptions
    facts: dict[Rank, RankFacts]
    geom: ModelGeometry | None
    fraction: float
    fraction_source: str
    fraction_assumed: bool
    block: int | None  # tokens per block, as logged
    tp: int
    tp_at_least: bool
    tp_source: str
    kv_dtype: str
    kv_elt: float
    kv_assumed: bool
    caps: tuple[Cap, ...]
    windows: dict[int, tuple[int | None, int | None]]  # window -> (max tokens, primary blocks)
    speculative: bool
    multimodal_gib: float
    notes: list[str] = field(default_factory=list)
    #: the AutoDeploy backend ('Using LLM with AutoDeploy backend', its fake cache manager's line): AutoDeploy sizes
    #: and holds its own caches, which kvaudit does not model (see audit.AUTODEPLOY)
    autodeploy: bool = False

    def first(self, key: str) -> float | None:
        return first(self.facts, key)

    def line_of(self, key: str) -> int | None:
        """The line of the first reading of ``key`` any rank logged."""
        return next((rr.lines[key] for rr in self.facts.values() if key in rr.lines), None)


def element_bytes(name: str | None) -> float | None:
    """The shared dtype table, plus NVFP4: 4-bit values and one FP8 scale per 16 elements."""
    if name and name.replace("torch.", "").lower() in ("nvfp4", "fp4"):
        return 0.5 + 1 / 16
    return model_element_bytes(name)


def build_context(startup: Startup, opts: AuditOptions) -> Context:
    facts = gather_facts(startup)
    geom: ModelGeometry | None = opts.model_geometry
    caps = startup.of(Cap)

    fraction, source = opts.mem_fraction_static, "cli" if opts.mem_fraction_static is not None else ""
    if fraction is None and first(facts, "fraction") is not None:
        fraction, source = first(facts, "fraction"), "log"
    if fraction is None and first(facts, "args_fraction") is not None:
        fraction, source = first(facts, "args_fraction"), "log (LLM Args)"
    if fraction is None:
        both = next((c.fraction for c in caps if c.kind == "both_set" and c.fraction is not None), None)
        if both is not None:
            fraction, source = both, "log"
    assumed = fraction is None
    if fraction is None:
        fraction, source = default_fraction(startup)

    # every rank a line names counts, a failing rank's error too ('[RANK 1] [E] Failed to initialize executor'),
    # not only the ranks that logged a reading
    tagged = [r for r in {*facts, *startup.ranks()} if r.label]
    tp = opts.tp_size or (max(r.sort_key[1] for r in tagged) + 1 if tagged else 1)
    tp_source = "--tp-size" if opts.tp_size else ("rank tags (at least)" if tagged else "assumed (no rank tags)")
    if tagged and tp == 1 and not opts.tp_size:
        # '[RANK 0]' alone (a 1.x worker's tag, trtllm_c022) names no second rank: 'at least 1' says nothing, so
        # the size is assumed as with no tag at all
        tagged, tp_source = [], "assumed (only rank 0's lines are tagged)"
    # untagged C++ runtime lines that name a rank of a TP group ('TP group is intra-node for rank 1'): at least
    # that many ranks, as a rank tag says. 'MPI size: 4, rank: 3' is the world, TP x PP: a note, not the TP size
    seen = int(max((e.value + 1 for e in startup.of(Reading) if e.key == "rank_named"), default=0))
    if not opts.tp_size and seen > tp:
        tp, tp_source, tagged = seen, "ranks the runtime names (at least)", tagged or [Rank((0, seen - 1, 0), "")]

    elt = element_bytes(opts.kv_cache_dtype)
    if elt is not None:
        kv_dtype, kv_assumed = str(opts.kv_cache_dtype), False
    else:
        model_dtype = (geom.torch_dtype if geom else None) or "bfloat16"
        kv_dtype, elt, kv_assumed = f"auto ({model_dtype}, assumed)", (geom.dtype_bytes if geom else 2) or 2, True

    windows: dict[int, tuple[int | None, int | None]] = {}
    for w in startup.of(WindowPool):
        tokens, blocks = windows.get(w.window, (None, None))
        windows[w.window] = (w.max_tokens if w.max_tokens is not None else tokens,
                             w.primary_blocks if w.primary_blocks is not None else blocks)
    # the window vector names the windows even where no per-window pool line is printed (the 1.x PyTorch backend
    # prints only "Adjusted max_attention_window_vec"): two or more distinct windows are VSWA, whose per-window
    # split kvaudit does not model
    vectors = startup.of(WindowVector)
    if vectors and len(set(vectors[-1].windows)) > 1:
        for size in set(vectors[-1].windows):
            windows.setdefault(size, (None, None))
    autodeploy = first(facts, "autodeploy_pages") is not None or any(
        b.backend == "autodeploy" for b in startup.of(Banner))
    if autodeploy and assumed:
        # AutoDeploy's resize_kv_cache transform takes free_mem_ratio of the free memory, not
        # free_gpu_memory_fraction: no default of that setting is assumed for it
        source = "not used: the AutoDeploy backend sizes its caches by its own free_mem_ratio"
    return Context(startup, opts, facts, geom, fraction, source, assumed,
                   int(first(facts, "tokens_per_block") or 0) or None, tp, not opts.tp_size and bool(tagged),
                   tp_source, kv_dtype, elt, kv_assumed, caps, windows, bool(first(facts, "speculative")),
                   first(facts, "multimodal_gib") or 0.0, autodeploy=autodeploy)
