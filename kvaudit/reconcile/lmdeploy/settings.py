"""What one LMDeploy startup's lines say about its settings, each with where it came from (rule 3: a default
is said as one and never stands in for a value the log states)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvaudit.parse.interface import Startup
from kvaudit.parse.lmdeploy import EngineConfig, Reading
from kvaudit.reconcile.interface import AuditOptions

#: ``TurbomindEngineConfig.cache_max_entry_count`` / ``PytorchEngineConfig``: 0.8 since v0.2.2 (0.5 before)
DEFAULT_RATIO = 0.8
#: ``cache_block_seq_len`` (TurboMind, v0.3.0+: lmdeploy/messages.py ``TurbomindEngineConfig``) and ``block_size``
#: (PyTorch engine, ``PytorchEngineConfig``): 64
DEFAULT_BLOCK = 64
#: TurboMind's default before v0.3.0: 128 (v0.1.0-v0.2.6 lmdeploy/turbomind/deploy/target_model/base.py
#: ``TurbomindModelConfig.cache_block_seq_len = 128``, the converted workspace's config.ini; LlamaTritonModel.cc's
#: fallback when the INI lacks it is 128 too); v0.3.0 made it 64 in both
OLD_DEFAULT_BLOCK = 128
OLD_DEFAULT_BLOCK_UNTIL = (0, 2, 99)


class Geometry(NamedTuple):
    """What sizes a block: from config.json (``config`` holds its ModelGeometry) or the engine's model-config dump."""

    layers: int
    kv_heads: int
    head_dim: int
    source: str
    config: Any = None


@dataclass
class Settings:
    startup: Startup
    backend: str  # turbomind | pytorch | unknown
    readings: dict[str, float]  # the last value of each key any rank stated
    lines: dict[str, int]
    ratio: float
    ratio_source: str
    block: int
    block_source: str
    quant_policy: int
    quant_source: str
    tp: int
    tp_source: str
    session_len: int | None
    geometry: Geometry | None
    notes: list[str] = field(default_factory=list)
    #: the other era's default tokens per block, when the block length is a default and the log's era spans v0.3.0
    #: (TurboMind: 128 before, 64 from): the default taken is then no more likely than this one
    block_other: int | None = None

    def get(self, key: str) -> float | None:
        return self.readings.get(key)

    def value(self, key: str) -> float:
        """A reading the caller has checked is there (``get`` is not None)."""
        v = self.readings.get(key)
        if v is None:
            raise KeyError(key)
        return v

    @property
    def ratio_assumed(self) -> bool:
        return self.ratio_source.startswith("default")


def _config(startup: Startup) -> dict[str, float]:
    """The engine config's settings, the "updated" repr (defaults filled in) over the "input" one."""
    out: dict[str, float] = {}
    for e in sorted(startup.of(EngineConfig), key=lambda e: e.updated):
        out.update(dict(e.settings))
    return out


def build_settings(startup: Startup, opts: AuditOptions) -> Settings:
    readings: dict[str, float] = {}
    lines: dict[str, int] = {}
    for e in startup.of(Reading):
        readings[e.key] = e.value
        lines[e.key] = e.line
    cfg = _config(startup)
    backends = {e.backend for e in startup.of(EngineConfig)}
    if "pytorch" in backends or any(k in readings for k in ("num_gpu_blocks", "free_mib", "pt_block_size")):
        backend = "pytorch"
    elif "turbomind" in backends or any(k in readings for k in ("block_mib", "object_budget_mib", "target_mib")):
        backend = "turbomind"
    else:
        backend = "unknown"
    notes: list[str] = []

    def pick(*candidates: tuple[Any, str]) -> tuple[Any, str]:
        return next(((v, s) for v, s in candidates if v is not None), (None, ""))

    ratio, ratio_source = pick((readings.get("object_ratio"), "log (the object cache line)"),
                               (cfg.get("cache_max_entry_count"), "log (backend_config)"),
                               (readings.get("pt_ratio"), "log (CacheConfig)"),
                               (readings.get("ratio"), "log (the TurboMind model config)"),
                               (opts.mem_fraction_static, "cli (the fraction given to kvaudit)"),
                               _default_ratio(startup))
    cut, count = readings.get("session_len_cut"), readings.get("max_block_count")
    # LlamaBatch: the session is cut to max_block_count x cache_block_seq_len, so the cut states the block length
    from_cut = int(cut // count) if cut and count and cut % count == 0 else None
    block, block_source = pick((readings.get("pt_block_size"), "log (CacheConfig)"),
                               (cfg.get("block_size") if backend == "pytorch" else None, "log (backend_config)"),
                               (cfg.get("cache_block_seq_len"), "log (backend_config)"),
                               (readings.get("block_seq_len"), "log (the TurboMind model config)"),
                               (readings.get("block_seq_len_default"), "log (the engine's default, stated)"),
                               (from_cut, "log (session_len cut to blocks x block length)"),
                               _default_block(startup, backend))
    qp, quant_source = pick((cfg.get("quant_policy"), "log (backend_config)"),
                            (readings.get("pt_quant_policy"), "log (CacheConfig)"),
                            (readings.get("quant_policy"), "log (the TurboMind model config)"),
                            (policy_of(opts.kv_cache_dtype), "cli (--kv-cache-dtype)"),
                            (0, "default 0 (quant_policy: a 16-bit KV cache)"))
    ranks = {e.rank for e in startup.of(Reading) if e.rank.label}
    tp, tp_source = pick((cfg.get("tp"), "log (backend_config)"), (readings.get("tp"), "log (the TurboMind model "
                                                                                        "config)"),
                         (opts.tp_size, "cli (--tp-size)"),
                         (len(ranks) if len(ranks) > 1 else None, "log (the rank tags)"),
                         (1, "default 1 (tp)"))
    session = cfg.get("session_len") or readings.get("session_len") or readings.get("session_len_asked")
    geom = None
    if opts.model_geometry is not None:
        g = opts.model_geometry
        geom = Geometry(g.num_layers, g.num_kv_heads, g.head_dim, f"config ({g.source})", g)
    elif all(k in readings for k in ("layers", "kv_heads", "head_dim")):
        geom = Geometry(int(readings["layers"]), int(readings["kv_heads"]), int(readings["head_dim"]),
                        "log (the TurboMind model config)")
    other = (OLD_DEFAULT_BLOCK if backend != "pytorch" and block_source.startswith("default") and block == DEFAULT_BLOCK
             and startup.era.lo <= OLD_DEFAULT_BLOCK_UNTIL else None)
    return Settings(startup, backend, readings, lines, float(ratio), ratio_source, int(block), block_source,
                    int(qp), quant_source, int(tp), tp_source, int(session) if session else None, geom, notes,
                    block_other=other)


def _default_block(startup: Startup, backend: str) -> tuple[int, str]:
    """The tokens per block a release uses when no line states them: the PyTorch engine's block_size 64; TurboMind's
    cache_block_seq_len 128 up to v0.2.6, 64 from v0.3.0 (where the lines do not tell the era apart: 64, said so,
    and ``Settings.block_other`` holds 128)."""
    era = startup.era
    if backend == "pytorch":
        return DEFAULT_BLOCK, "default 64 (block_size)"
    if era.hi is not None and era.hi <= OLD_DEFAULT_BLOCK_UNTIL:
        return OLD_DEFAULT_BLOCK, "default 128 (cache_block_seq_len before 0.3.0)"
    if era.lo <= OLD_DEFAULT_BLOCK_UNTIL:
        return DEFAULT_BLOCK, "default 64 (cache_block_seq_len from 0.3.0; 128 before, and the log's era spans both)"
    return DEFAULT_BLOCK, "default 64 (cache_block_seq_len / block_size)"


def _default_ratio(startup: Startup) -> tuple[float, str]:
    era = startup.era
    if era.hi is not None and era.hi < (0, 2, 2):
        return 0.5, "default 0.5 (cache_max_entry_count before 0.2.2: of the card's total memory)"
    if era.lo < (0, 2, 2):
        return DEFAULT_RATIO, "default 0.8 (cache_max_entry_count, 0.2.2+; 0.5 of the total before)"
    return DEFAULT_RATIO, "default 0.8 (cache_max_entry_count, 0.2.2+)"


def policy_of(dtype: str | None) -> int | None:
    """--kv-cache-dtype in LMDeploy's terms: int8 -> quant_policy 8, int4 -> 4, a 16-bit type -> 0."""
    if not dtype:
        return None
    d = dtype.lower()
    return 8 if d in ("int8", "8") else 4 if d in ("int4", "4") else 0 if d in ("auto", "bf16", "fp16", "float16",
                                                                            "bfloat16", "0") else None
