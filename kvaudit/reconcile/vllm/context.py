"""What one vLLM startup establishes before any arithmetic, and how: the utilisation, the block size, the
parallel layout (TP, PP, DP), the KV element type and a hybrid model's page unification. Each setting keeps its
source, so a report can say "at least", "default" or "assumed" instead of printing a guess as a fact.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Any

from kvaudit.model_config import ModelGeometry, element_bytes
from kvaudit.parse.interface import Rank, RankEvent, Startup
from kvaudit.parse.vllm import Banner, Blocks, HybridLayout, Setting, has_process_tag, rank_of
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.reconcile.values import as_float, as_int
from kvaudit.reconcile.vllm.facts import RankFacts, gather_facts
from kvaudit.versions import VersionRange

DEFAULT_BLOCK = 16  # CacheConfig.block_size on CUDA when neither the args nor a hybrid layout set it
#: the CPU backend's block when none is set (platforms/cpu.py 0.8.4, 0.11.0: ``128 if ipex_available else 16``;
#: 0.7.3: 16): tried in this order, the one that gives the logged pool named
CPU_BLOCKS = ((16, "16, the CPU backend's default without IPEX"),
              (128, "128, the CPU backend's default with IPEX (intel_extension_for_pytorch), 0.8+"))


#: accelerators kvaudit has no vLLM budget model for, by the word their block line carries (V0's executor_base.py
#: logs "# %s blocks" with the platform's ``device_name``: hpu, xpu, tpu, npu, neuron) or by the HPU worker's own
#: budget line. HabanaAI/vllm-fork's hpu_worker.py sizes the cache from the free device memory x
#: gpu_memory_utilization, less VLLM_GRAPH_RESERVED_MEM for HPU graphs, with a default block of 128
#: (platforms/hpu.py), not total x util - usage with a block of 16: the CUDA rule would print a count it cannot know
UNMODELLED_DEVICES = {"hpu": "an HPU (Intel Gaudi)", "xpu": "an XPU (Intel GPU, V0)", "tpu": "a TPU (V0)",
                      "npu": "an NPU (V0)", "neuron": "AWS Neuron"}


@dataclass
class Context:
    startup: Startup
    opts: AuditOptions
    args: dict[str, Any]
    facts: dict[Rank, RankFacts]
    era: VersionRange
    geom: ModelGeometry | None
    util: float | None
    util_source: str | None
    block_size: int
    block_source: str
    tp: int
    tp_at_least: bool
    tp_assumed: bool
    tp_source: str
    pp: int
    dp: int
    kv_dtype: str
    kv_elt: float
    kv_dtype_assumed: bool
    hybrid: HybridLayout | None  # the logged page unification, merged from its two lines
    args_seen: bool  # a banner or non-default-args line: absent settings are the defaults
    notes: list[str] = field(default_factory=list)
    #: vLLM's CPU backend (kvaudit.platforms): the KV budget is VLLM_CPU_KVCACHE_SPACE, host memory of a set size
    cpu: bool = False
    #: that space as the log states it: (GiB, "default" | "chosen", line), None when no line does (set by the env)
    cpu_space: tuple[float, str, int] | None = None
    #: an accelerator without a model here (UNMODELLED_DEVICES): (its name, the line that names it)
    device: tuple[str, int] | None = None

    @property
    def workers(self) -> int:
        """How many workers should each log a budget (TP x PP x DP)."""
        return self.tp * self.pp * self.dp


#: ``CacheConfig.gpu_memory_utilization``'s default (vllm/config/cache.py): 0.9 up to 0.20, 0.92 from 0.21
UTILIZATION_DEFAULTS = (((0, 21, 0), 0.92), ((0, 0, 0), 0.9))


def default_utilization(era) -> tuple[float | None, str | None]:
    """The version's default fraction, when the era tells which; an era that straddles 0.21 assumes none."""
    for since, value in UTILIZATION_DEFAULTS:
        if era.lo >= since:
            if since == (0, 0, 0) and not (era.hi is not None and era.hi < (0, 21, 0)):
                return None, None  # 0.9 or 0.92: the log does not say which release
            return value, f"default {value:g} for {era} (not among the non-default args)"
    return None, None


def build_context(startup: Startup, opts: AuditOptions) -> Context:
    args = dict(startup.server_args or {})
    facts = gather_facts(startup)
    notes: list[str] = []
    args_seen = bool(startup.of(Banner))
    cpu = (opts.platform is not None and bool(getattr(opts.platform, "cpu", False))) or any(
        b.device == "cpu" for b in startup.of(Blocks)) or any(e.key == "cpu_kvcache_space" for e in startup.of(Setting))
    space = next(((e.extra, e.value, e.line) for e in startup.of(Setting)
                  if e.key == "cpu_kvcache_space" and e.extra is not None), None)
    util, util_source = opts.mem_fraction_static, "cli" if opts.mem_fraction_static is not None else None
    if util is None:
        util = next((f.r["util"] for f in facts.values() if "util" in f.r), None)
        util_source = "log" if util is not None else None
    if util is None and as_float(args.get("gpu_memory_utilization")) is not None:
        util, util_source = as_float(args["gpu_memory_utilization"]), "engine args"
    if util is None and args_seen and "gpu_memory_utilization" not in args and _non_default_args_seen(startup):
        util, util_source = default_utilization(startup.era)
    if cpu:
        util, util_source = None, None  # the CPU backend's budget is VLLM_CPU_KVCACHE_SPACE: no fraction sizes it

    hybrid = _hybrid_layout(startup)
    if hybrid is not None and hybrid.block_size:
        block, block_source = hybrid.block_size, "log (attention block size set to fit the Mamba page)"
    elif as_int(args.get("block_size")):
        block, block_source = as_int(args["block_size"]) or DEFAULT_BLOCK, "engine args"
    elif cpu:
        block, block_source = CPU_BLOCKS[0][0], f"default ({CPU_BLOCKS[0][1]})"
    else:
        block, block_source = DEFAULT_BLOCK, "default (16 on CUDA)"

    device = _unmodelled_device(startup)
    if device is not None and block_source.startswith("default"):
        block_source = f"unknown (on {device[0]} the default is the platform's, not 16)"

    tp, at_least, assumed, tp_source = _tensor_parallel(startup, args, opts)
    pp = as_int(args.get("pipeline_parallel_size")) or (max((r.sort_key[0] for r in _ranks(startup)), default=0) + 1)
    dp = as_int(args.get("data_parallel_size")) or (max((r.sort_key[2] for r in _ranks(startup)), default=0) + 1)

    logged_dtype = next((e.value for e in reversed(startup.of(Setting)) if e.key == "kv_cache_dtype"), None)
    if logged_dtype and not args.get("kv_cache_dtype"):
        args["kv_cache_dtype"] = logged_dtype  # "Using fp8_e4m3 data type to store kv cache" (config/cache.py)
    kv_dtype, elt, kv_assumed = _kv_dtype(args, opts, args_seen, opts.model_geometry)
    return Context(startup, opts, args, facts, startup.era, opts.model_geometry, util, util_source, block,
                   block_source, tp, at_least, assumed, tp_source, pp, dp, kv_dtype, elt, kv_assumed, hybrid,
                   args_seen, notes, cpu, space, device)


def _unmodelled_device(startup: Startup) -> tuple[str, int] | None:
    """The accelerator the log names that kvaudit has no budget model for (UNMODELLED_DEVICES), with its line."""
    for e in startup.events:
        word = (e.device.lower() if isinstance(e, Blocks) else
                e.value.lower() if isinstance(e, Setting) and e.key == "device" else None)
        if word in UNMODELLED_DEVICES:
            return UNMODELLED_DEVICES[word], e.line
    return None


def _non_default_args_seen(startup: Startup) -> bool:
    return any("non-default args" in b.text for b in startup.of(Banner))


def _ranks(startup: Startup) -> set[Rank]:
    """Every rank a parsed line's tag names, whatever the line says (a worker may show only its layout line)."""
    return {e.rank if isinstance(e, RankEvent) else rank_of(e.text) for e in startup.events}


#: files whose lines the V1 engine-core process prints itself, whatever the TP size (its workers log the memory
#: profile, the weights and the graphs under their own tags when TP > 1)
_ENGINE_CORE_FILE = re.compile(r"\[?(?:kv_cache_utils|core|core_client|scheduler|api_server|api_utils|arg_utils)"
                               r"\.py:\d+\]")


def _tensor_parallel(startup: Startup, args: dict[str, Any], opts: AuditOptions) -> tuple[int, bool, bool, str]:
    """TP size, whether it is only a lower bound, whether it is assumed, and its source. Only --tp-size and the
    engine args establish it; tags give "at least" (an excerpt may not show every rank); the pids that happen to
    be visible are never the TP size."""
    if opts.tp_size:
        return opts.tp_size, False, False, "--tp-size"
    tp = as_int(args.get("tensor_parallel_size"))
    if tp:
        return tp, False, False, "engine args (tensor_parallel_size)"
    ranks = _ranks(startup)
    tagged = [r for r in ranks if "TP" in r.label]
    if tagged:
        n = max(r.sort_key[1] for r in tagged) + 1
        return n, True, False, f"worker tags (the highest seen is TP{n - 1})"
    pids = [r for r in ranks if r.label.startswith("pid ")]
    if pids:
        # V0: the rank-0 driver's lines carry no tag at all
        driver = any(not has_process_tag(e.text) for e in startup.events if isinstance(e, RankEvent))
        n = len(pids) + (1 if driver else 0)
        return n, True, False, (f"{len(pids)} worker process(es)" + (" + the driver" if driver else "")
                                + " seen; their pids do not name ranks" + _ray_repeats(startup))
    tagged_events = [e for e in startup.events if has_process_tag(e.text)]
    if tagged_events and all(_ENGINE_CORE_FILE.search(e.text) for e in tagged_events):
        # the engine core prints the pool's size and concurrency (v1/core/kv_cache_utils.py) and its own failure
        # (v1/engine/core.py) under its tag at any TP size, its workers being other processes: no TP from these
        return 1, False, True, "assumed (only the engine core's own lines are tagged; they name no TP size)"
    if tagged_events:
        return 1, False, False, "one process (no worker tags)"
    return 1, False, True, "assumed (the log names no TP size and carries no process tags)"


_RAY_REPEATED = re.compile(r"\[repeated (\d+)x across cluster\]")


def _ray_repeats(startup: Startup) -> str:
    """Ray folds the lines other workers print alike into one with "[repeated Nx across cluster]" (its log
    deduplication): N more processes printed that line, a lower bound on the workers (TP x PP), not the TP size."""
    best = max(((int(m.group(1)), -e.line) for e in startup.events
                if (m := _RAY_REPEATED.search(e.text)) is not None), default=None)
    if best is None:
        return ""
    return (f"; Ray's '[repeated {best[0]}x across cluster]' (line {-best[1]}): {best[0]} more worker processes "
            f"printed that line, so TP x PP is at least {best[0] + 1}")


def _kv_dtype(args: dict[str, Any], opts: AuditOptions, args_seen: bool,
              geom: ModelGeometry | None) -> tuple[str, float, bool]:
    """The KV element: --kv-cache-dtype, the engine args, else "auto" = the model dtype. "auto" is established
    when a banner or a non-default-args line is present (an absent key is the default); the model dtype is
    established by the args' dtype or the config's torch_dtype; anything else says "assumed"."""
    name = opts.kv_cache_dtype or args.get("kv_cache_dtype")
    unknown = None
    if isinstance(name, str) and name != "auto":
        elt = element_bytes(name)
        if elt is not None:
            return name, elt, False
        unknown = name  # the log states a dtype kvaudit cannot size: say so, never "auto"
    auto_known = args_seen or name == "auto"
    model = args.get("dtype") if args.get("dtype") not in (None, "auto") else None
    model_known = model is not None or (geom is not None and geom.torch_dtype is not None)
    model_name = str(model) if model is not None else (geom.torch_dtype if geom and geom.torch_dtype else "bfloat16")
    elt = element_bytes(model_name) or 2
    if elt == 4:
        elt = 2  # an fp32 checkpoint runs in 16-bit unless --dtype float32
    assumed = not (auto_known and model_known)
    label = f"auto ({model_name.replace('torch.', '')}{', assumed' if assumed else ''})"
    if unknown is not None:
        return f"{unknown} (element size unknown to kvaudit; {elt:g} B assumed)", elt, True
    return label, elt, assumed


def _hybrid_layout(startup: Startup) -> HybridLayout | None:
    events = startup.of(HybridLayout)
    if not events:
        return None
    block = next((e.block_size for e in reversed(events) if e.block_size), None)
    pad = next((e.mamba_padding_pct for e in reversed(events) if e.mamba_padding_pct is not None), None)
    return HybridLayout(events[0].line, events[0].text, block, pad)
