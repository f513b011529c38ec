"""SGLang startup-log grammar, v0.1.x to v0.5.23.

Every pattern below quotes a format string from SGLang's source (``python/sglang/`` upstream); the version
range in each comment is where that exact text was printed (release wheels compared one by one; see
docs/sglang-log-grammar.md for the full table):

* prefix ``[%(asctime)s{prefix}]``: ``srt/utils.py::configure_logger`` (date from 0.3.4, time-only before,
  ``.msecs`` with ``SGLANG_LOG_MS=1`` from 0.5.6); rank tags ``DPn PPn TPn EPn ...`` from the scheduler
  (``srt/managers/scheduler.py``); 0.1.x printed ``[rank=N]``, some forks ``[gpu_id=N]``.
* weights, pool end, graphs: ``srt/model_executor/model_runner.py`` (and its 0.5.x mixins);
* KV pools: ``srt/mem_cache/memory_pool.py``; scheduler summary: ``srt/managers/scheduler.py``;
* HiCache host pool: ``srt/mem_cache/memory_pool_host.py`` (decimal GB);
* server_args: ``srt/server.py`` / ``srt/entrypoints/engine.py`` (dataclass repr to 0.5.18, dict after).

All "GB" values are GiB (``x / (1 << 30)``, ``:.2f``) except HiCache's host figure (``/ 1e9``).
Lines from the speculative-decoding draft worker carry the same prefix as the target's: they are told apart
by order (the draft loads after the target on each rank) and by their ``type=``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, cast

from kvaudit.parse.patterns import lazy
from kvaudit.parse.interface import (oom_numbers, SINGLE_RANK, literal, Event, OwnPrefix, Rank, RankEvent, Startup,
                                     anchored, quote, unquoted, with_unprefixed)
from kvaudit.parse.lines import Line
from kvaudit.parse.vocabulary import SGLangWords
from kvaudit.versions import VersionRange, narrow, parse_version, resolve
from kvaudit.versions import clue as _clue
from kvaudit.record import record

ENGINE = SGLangWords.name

OLDEST = (0, 1, 0)
NEWEST_KNOWN = (0, 5, 23)

# ----------------------------------------------------------------------------------------------------------
# events


@record
class ServerArgs(Event):
    """``server_args=ServerArgs(...)`` (through 0.5.18) or ``server_args={...}`` (0.5.19+): the launch arguments."""

    args: dict[str, Any] = field(default_factory=dict)
    form: str = "repr"  # "repr" (ServerArgs(...), <=0.5.18) or "dict" (0.5.19+)


@record
class DistInit(RankEvent):
    """``Init torch distributed ends. [elapsed=.. s, ]mem usage=X GB`` (0.4.4-0.5.20) or
    ``Memory baseline taken. mem usage=X GB`` (0.5.21+): NCCL/custom all-reduce buffers."""

    usage_gib: float | None = None
    begin_avail_gib: float | None = None  # 0.1.x "Init torch begin. Avail mem=X GB"


@record
class WeightBegin(RankEvent):
    """``Load weight begin. avail mem=X GB``."""

    avail_gib: float | None = None


@record
class WeightEnd(RankEvent):
    """``Load weight end. ...``: the model's type, dtype and quantisation, free memory and the weights' size."""

    model_type: str | None = None
    dtype: str | None = None
    quant: str | None = None
    avail_gib: float | None = None
    usage_gib: float | None = None
    elapsed_s: float | None = None


@record
class KVAlloc(RankEvent):
    """``KV Cache is allocated. [dtype: D, ][#tokens: N, ](K size: X GB, V size: Y GB|KV size: X GB)``."""

    label: str = ""  # "", "Full", "SWA", ... (0.5.17+ cache names)
    dtype: str | None = None
    tokens: int | None = None
    tokens_approx: bool = False  # "273K" in a hand-abridged paste
    k_gib: float | None = None
    v_gib: float | None = None
    kv_gib: float | None = None  # MLA single buffer
    upper_bound: bool = False  # "KV Cache VA upper bound" (virtual reservation, 0.5.17+)

    @property
    def total_gib(self) -> float | None:
        if self.kv_gib is not None:
            return self.kv_gib
        if self.k_gib is not None or self.v_gib is not None:
            return (self.k_gib or 0.0) + (self.v_gib or 0.0)
        return None


@record
class OtherPool(RankEvent):
    """Pools beside the main KV cache: Mamba state, the SWA pool summary, DeepSeek-V4 pools."""

    kind: str = ""
    gib: float | None = None  # memory it holds, when the line says (GiB)
    counts_in_total: bool = True  # False for summaries that restate KV lines already counted
    detail: dict[str, Any] = field(default_factory=dict)


@record
class MemoryProfile(RankEvent):
    """``Memory profiling: available_gpu_memory=X GB, total_gpu_memory=T GB, mem_fraction_static=F,
    rest_memory=R GB`` (DeepSeek-V4 launch builds, 2026-04..05, ``profile_available_bytes`` beside
    ``DSv4MemoryCalculator``; not in the 0.5.12+ wheels): the engine's own rest = available - T x (1 - F), GiB,
    ``available`` the free memory now (min over the world), T the pre-load free memory."""

    available_gib: float = 0.0
    total_gib: float = 0.0
    mem_fraction_static: float = 0.0
    rest_gib: float = 0.0


@record
class DSv4Calc(RankEvent):
    """``DSv4 memory calculation: bytes_per_full_token=B, available_bytes=A GB, full_token=N`` (launch builds,
    ``DSv4MemoryCalculator.calculate_pool_sizes``), ``DSV4 memory calculation: ...`` in the same shape (0.5.12..0.5.19,
    ``model_executor/pool_configurator.py::DSV4PoolConfigurator.calculate_pool_sizes``) and with ``unified=``,
    ``..._fixed=X GB`` fields from 0.5.20 (the fixed pools come off the budget before the division).
    ``fixed_gib``: the ``*_fixed`` / ``*_fixed_overhead`` amounts the line names (GiB)."""

    bytes_per_full_token: float = 0.0
    available_gib: float = 0.0
    full_token: int = 0
    fixed_gib: dict[str, float] = field(default_factory=dict)
    effective_gib: float | None = None  # "effective_available_bytes=" (HiSparse builds)


@record
class PoolEnd(RankEvent):
    """``Memory pool end. avail mem=X GB``."""

    avail_gib: float | None = None


@record
class GraphBegin(RankEvent):
    """``Capture [NAME] cuda graph begin. ...``, with the free memory where the line states it."""

    name: str = "target decode"
    avail_gib: float | None = None


@record
class GraphEnd(RankEvent):
    """``Capture [NAME] cuda graph end. ...``: the time, the graphs' memory and the free memory it states."""

    name: str = "target decode"
    usage_gib: float | None = None
    avail_gib: float | None = None
    elapsed_s: float | None = None


@record
class KVBudget(RankEvent):
    """``The available memory for KV cache is X GB`` (some 0.5.x releases): the engine's own ``rest``, GiB."""

    gib: float = 0.0


@record
class SchedulerSummary(Event):
    """The scheduler's summary: ``max_total_num_tokens=N, chunked_prefill_size=..., ...``."""

    max_total_num_tokens: int = 0
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    available_gpu_mem_gib: float | None = None
    #: the rank tag of the line (every TP rank prints its own summary): not a RankEvent, so that it adds no
    #: rank of memory facts, but its tag still bounds the TP size from below
    tagged_rank: Rank | None = None


@record
class HiCacheHost(RankEvent):
    """A HiCache host pool: host RAM (pinned), never GPU memory. ``Allocating X GB host memory for hierarchical KV
    cache`` (0.4.2-0.5.16, ``memory_pool_host.py``); 0.5.17+ ``pool_host/base.py``: ``Allocating <label>
    hierarchical KV host pool: N tokens, X GB host memory`` (sized by --hicache-ratio x the device pool, by
    --hicache-size, or, 0.5.22+, a ratio lowered to fit the host's free memory: :class:`HiCacheAutoSize`), and
    ``Allocating X GB host memory for <what>`` for the Mamba, DSA-indexer and DeepSeek-V4 host pools."""

    host_gb: float = 0.0  # decimal GB (10**9 bytes), as SGLang prints it here
    tokens: int | None = None  # the host pool's tokens, when the line states them (0.5.17+)
    what: str = "hierarchical KV cache"


@record
class PostCaptureKV(RankEvent):
    """Post-capture KV sizing (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``, opt-in, 0.5.16+;
    ``model_runner_components/kv_pool_runtime.py`` ``compute_post_capture_kv_resize``): the pool re-sized after
    CUDA-graph capture. 0.5.16: ``Post-capture KV sizing: max_total_num_tokens=N, free memory=X GB``; 0.5.17+:
    ``Post-capture KV sizing: KV cache allocated. dtype: D, #tokens: N, KV size: X GB, avail mem=Y GB`` (the
    backed bytes, GiB) after ``... full_layer_tokens=F, swa_layer_tokens=S``. ``tokens`` is the final pool."""

    tokens: int | None = None
    kv_gib: float | None = None  # the physically backed KV (0.5.17+)
    free_gib: float | None = None  # free memory after the resize, this rank
    full_tokens: int | None = None
    swa_tokens: int | None = None


@record
class HiCacheAutoSize(RankEvent):
    """``HiCache auto-sizing: ratio R0 -> R1; X GiB host memory per rank (fraction F, N ranks on this host), host
    pools Y GiB.`` (0.5.22+, ``mem_cache/hicache_auto_size.py``, PR 40135): the default --hicache-ratio lowered
    so the host pools fit the host's free memory (GiB: ``/ 1024**3``). Host RAM, never GPU memory."""

    ratio_asked: float = 0.0
    ratio: float = 0.0
    host_budget_gib: float = 0.0
    host_pools_gib: float = 0.0


@record
class KVDtype(RankEvent):
    """``Using KV cache dtype: D``."""

    dtype: str = ""


@record
class CapWarning(RankEvent):
    """``max_total_tokens=N is larger than the profiled value P``."""

    requested: int = 0
    profiled: int = 0


@record
class SpecReset(Event):
    """``Max running requests is reset to N for speculative decoding``."""

    max_running_requests: int = 48


@record
class RequestsReduced(Event):
    """``max_running_requests was reduced from the requested R to A (per dp worker) due to the available KV cache
    capacity.`` (srt/mem_cache/kv_cache_configurator.py ``resolve_max_num_reqs``, 0.5.2x): the concurrency the
    engine applied is below the one asked for."""

    requested: int = 0
    applied: int = 0


@record
class NsaModel(Event):
    """The engine says the model runs DeepSeek sparse attention (the NSA pool, ``NSATokenToKVPool``):
    ``Set NSA backends for <dtype> KV Cache: prefill=..., decode=...`` (server_args.py
    ``_set_default_nsa_backends``, 0.5.9; not in 0.5.8.post1) or ``DSA with TP mode is active`` (0.5.8.post1,
    0.5.9); both only on the ``is_deepseek_nsa`` path. ``kv_cache_dtype`` is the one the first line names, and
    ``backends`` the prefill and decode NSA backends it names (they decide the FP8 row's layout: reconcile/sglang/
    cell.py ``nsa_fp8_line_not_budget``)."""

    kv_cache_dtype: str | None = None
    backends: tuple[str, ...] = ()


@record
class RocmSign(Event):
    """SGLang's own words that it runs on ROCm, printed only under ``is_hip()``: server_args.py's ``Setting page
    size to 1 for DeepSeek DSA on ROCm.``, ``Detected ROCm and MXFP4 quantization format ...`` (0.5.9) and
    ``Enable Aiter AllReduce Fusion for <architecture>`` (0.5.10+); quantization/awq.py's import warning ``HIP does
    not support fused_marlin_moe currently.`` (0.4.10-0.5.7 in every start; 0.5.8-0.5.20 only for an AWQ model);
    custom_all_reduce.py's ``[AR] Using AiterCustomAllreduce (AMD default)`` (0.5.7+). ``text`` says which."""


@record
class AiterFractionKept(RankEvent):
    """0.5.19+ (``arg_groups/attention_hook.py``, PR 37242): ``attention_backend=aiter with context_len=N (>8192)
    normally scales mem_fraction_static by 0.85 ..., but SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION is set, so
    mem_fraction_static=X is used as-is.`` (WARNING): the explicit fraction was not scaled."""

    mem_fraction_static: float = 0.0


@record
class MfsAdjust(RankEvent):
    """0.4.2-0.4.8: ``Automatically reduce --mem-fraction-static to X because this is a multimodal model.``"""

    mem_fraction_static: float = 0.0


@record
class SlidingWindowSplit(RankEvent):
    """``Use Sliding window memory pool. full_layer_tokens=F, swa_layer_tokens=S``."""

    full_tokens: int | None = None
    swa_tokens: int | None = None


@record
class Failure(RankEvent):
    """A line that says the startup failed, or is about to.

    kind: ``not_enough_memory`` | ``no_kv_memory`` | ``unbalanced`` | ``host_memory`` | ``oom`` |
    ``traceback`` | ``exception`` | ``pool_too_small`` | ``warmup`` | ``cuda_error`` | ``killed`` | ``child_failed`` |
    ``watchdog`` (a scheduler's forward batch hung past --watchdog-timeout) | ``port_in_use`` (the HTTP server
    could not bind its port).
    """

    kind: str = ""
    message: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------
# grammar

NUM = r"(-?\d+(?:\.\d+)?)"

_PREFIX = lazy(
    r"\[(?:(?P<date>\d{4}-\d{2}-\d{2})[ T])?(?P<time>\d{2}:\d{2}:\d{2}(?P<ms>[.,]\d+)?)?"
    r"(?P<tags>(?:\s*[A-Z][A-Z_]*\d+)*)\s*\]\s*$"
    r"|\[(?P<kv>rank|gpu_id)=(?P<n>\d+)\]\s*$"
)

_SERVER_ARGS = lazy(r"server_args=(?:ServerArgs\((?P<repr>.*?)\)?\s*$|(?P<dict>\{.*)$)")
_INIT_BEGIN = lazy(r"Init (?:torch distributed|nccl) begin\.")
_INIT_END = lazy(
    r"Init torch distributed ends\.(?: elapsed=" + NUM + r" s,)? mem usage=" + NUM + r" GB"
)
_INIT_OLD = lazy(r"Init torch begin\. Avail mem=" + NUM + r" GB")
_BASELINE = lazy(r"Memory baseline taken\. mem usage=" + NUM + r" GB")
_W_BEGIN = lazy(r"Load weight begin\.?(?: avail mem=" + NUM + r" GB)?")
_W_END = lazy(r"Load weight end\b(?P<rest>.*)")
_KV = lazy(r"KV Cache (?P<state>is allocated|VA upper bound)\b(?P<rest>.*)")
_SWA_SUMMARY = lazy(
    r"SWAKVPool mem usage: " + NUM + r" ?GB, swa size: (\d+), full size: (\d+)"
)
_MAMBA = lazy(r"Mamba Cache is allocated\.(?P<rest>.*)")
_SWA_SPLIT = lazy(
    r"[Uu]se [Ss]liding window memory pool(?: \(all SWA\))?\.\s*"
    r"(?:full_layer_tokens=(\d+),\s*)?swa_layer_tokens=(\d+)"
)
_INIT_POOL = lazy(r"Initialize (\w*TokenToKVPool) with (?P<rest>.*)")
_MEM_PROFILE = lazy(
    r"Memory profiling: available_gpu_memory=" + NUM + r" GB, total_gpu_memory=" + NUM
    + r" GB, mem_fraction_static=" + NUM + r", rest_memory=" + NUM + r" GB"
)
_DSV4_CALC = lazy(r"DS[Vv]4 memory calculation: (?P<rest>.*\bfull_token=(?P<full>\d+)\b.*)")
_DSV4_BPFT = lazy(r"\bbytes_per_full_token=(\d+(?:\.\d+)?)")
_DSV4_AVAIL = lazy(r"\b(?:raw_)?available_bytes=" + NUM + r" GB")
_DSV4_FIXED = lazy(r"\b(\w+_fixed(?:_overhead)?)=" + NUM + r" GB")
_DSV4_EFFECTIVE = lazy(r"\beffective_available_bytes=" + NUM + r" GB")
#: a bare version banner a launcher prints before the server (``SGLang Version 0.5.11+05fb6a52``, the
#: dgx-spark-hijinks harness; ``sglang version: X``): the release itself, which wins over line shapes
_VERSION_BANNER = lazy(r"^\s*(?:\S+\s+)?SGLang [Vv]ersion:? v?(?P<v>\d+\.\d+\.\d+)(?P<local>\S*)\s*$", re.IGNORECASE)
_POOL_END = lazy(r"Memory pool end\. avail mem=" + NUM + r" GB")
_GRAPH = lazy(
    r"Capture (?P<name>[\w ]*?)\s*(?:cuda|CUDA|cpu|CPU|npu|NPU) graph (?P<edge>begin|end)\b(?P<rest>.*)"
)
_SUMMARY = lazy(r"max_total_num_tokens=(\d+)(?P<rest>.*)")
_POST_CAPTURE = lazy(r"Post-capture KV sizing: (?:max_total_num_tokens=(?P<t16>\d+), free memory=(?P<f16>[\d.]+) GB"
                     r"|KV cache allocated\. dtype: \S+, #tokens: (?P<t>\d+), KV size: (?P<kv>[\d.]+) GB, "
                     r"avail mem=(?P<f>[\d.]+) GB|full_layer_tokens=(?P<full>\d+), swa_layer_tokens=(?P<swa>\d+))")
_HICACHE = lazy(r"Allocating " + NUM + r" GB host memory for (hierarchical [\w ]+? cache|DSA indexer|V4 \w+ pool '[^']*'|"
                r"MiniMax sparse index-K)\b")
_HICACHE_AUTO = lazy(r"HiCache auto-sizing: ratio ([\d.]+) -> ([\d.]+); ([\d.]+) GiB host memory per rank .*host pools "
                     r"([\d.]+) GiB")
_HICACHE_POOL = lazy(r"Allocating (\S+) hierarchical KV host pool: (\d+) tokens, " + NUM + r" GB host memory")
_HICACHE_FAIL = lazy(
    r"Not enough host memory available\. Requesting " + NUM + r" GB but only have " + NUM + r" GB free"
)
_NSA_MODEL = lazy(r"Set NSA backends for (\S+) KV Cache(?:: prefill=(\w+), decode=(\w+))?|DSA with TP mode is active")
#: ServerArgs fields whose presence dates a release (the dataclass's repr prints every field): read in the
#: server_args.py of the 0.5.3, 0.5.3.post3, 0.5.4, 0.5.5, 0.5.5.post3, 0.5.6 and 0.5.7 wheels.
#: ``kt_amx_weight_path``: 0.5.4 and 0.5.5 (not 0.5.3.post3, not 0.5.5.post3, renamed kt_weight_path by 0.5.6);
#: ``fastapi_root_path``: 0.5.6 on (not 0.5.5.post3)
_ARGS_FIELD_CLUES = (
    ("kt_amx_weight_path", (0, 5, 4), (0, 5, 5), "server_args field kt_amx_weight_path (0.5.4-0.5.5)"),
    ("fastapi_root_path", (0, 5, 6), None, "server_args field fastapi_root_path (0.5.6+)"),
)
_ROCM_SIGN = lazy(r"server_args\.py:\d+: (?:Setting page size to 1 for DeepSeek DSA on ROCm|Detected ROCm and )")
#: ``Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM`` / ``... for GptOssForCausalLM``: server_args.py's
#: model adjustments print it only under ``is_hip()`` (0.5.10+), through the logger's usual prefix
_ROCM_AITER_FUSION = lazy(r"Enable Aiter AllReduce Fusion for \w+")
#: ``/sgl-workspace/sglang/python/sglang/srt/layers/quantization/awq.py:67: UserWarning: HIP does not support
#: fused_marlin_moe currently.``: Python's warnings module, no logger prefix (the next line echoes the source,
#: ``warnings.warn(f"HIP ...")``, and is not read). quantization/awq.py warns it only under ``_is_hip``: at import
#: (module level, 0.4.10-0.5.7; not in 0.4.9), which quantization/__init__.py does in every process of every
#: start, and in ``AWQConfig.__init__`` (0.5.8-0.5.10; layers/quantization/awq/awq.py 0.5.11-0.5.20), then only
#: for an AWQ checkpoint. Read in the 0.4.9, 0.4.10, 0.5.1-0.5.13 and 0.5.20 wheels
_ROCM_AWQ = lazy(r"quantization/awq(?:/awq)?\.py:\d+: UserWarning: HIP does not support fused_marlin_moe currently")
#: ``[TP0] [AR] Using AiterCustomAllreduce (AMD default)``: distributed/device_communicators/custom_all_reduce.py
#: ``dispatch_custom_allreduce`` returns CUDA's class before it and asserts ``_is_hip``; printed where the custom
#: all-reduce is built (more than one rank, SGLANG_USE_AITER_AR not off, no 1-stage all-reduce). 0.5.7-0.5.20
#: (read in the 0.5.7-0.5.13 and 0.5.20 wheels; not in 0.5.6)
_ROCM_AITER_AR = lazy(r"\[AR\] Using AiterCustomAllreduce \(AMD default\)")
_AITER_KEPT = lazy(r"SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION is set, so mem_fraction_static=" + NUM + r" is used as-is")
_MFS_ADJUST = lazy(r"reduce --mem-fraction-static to " + NUM + r" because this is a multimodal model")
_KV_DTYPE = lazy(r"Using KV cache dtype: ([\w.]+)")
_KV_BUDGET = lazy(r"[Tt]he available memory for (?:the )?KV cache is " + NUM + r" ?GB")
_CAP = lazy(r"max_total_tokens=(\d+) is larger than the profiled value (-?\d+)")
_SPEC_RESET = lazy(r"Max running requests is reset to (\d+) for speculative decoding")
#: ``Reserving X GB of the KV budget for post-sizing multimodal allocations (...)``
#: (srt/mem_cache/kv_cache_configurator.py ``mm_runtime_reservation_gb``, 2026: SGLANG_VLM_CACHE_SIZE_MB, 100 MiB
#: by default, plus the feature cache with CUDA-IPC transport; multimodal models only): taken from the budget
_BUDGET_RESERVE = lazy(r"Reserving " + NUM + r" ?GB of the KV budget for (.+)")
_REQS_REDUCED = lazy(r"max_running_requests was reduced from the requested (\d+) to (\d+)")
_NOT_ENOUGH = lazy(
    r"Not enough memory\. Please try to increase --mem-fraction-static\.?"
    r"(?: Current value: (?P<self>self\.server_args\.)?mem_fraction_static=" + NUM + r")?"
)
_NO_KV = lazy(
    r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=" + NUM
    + r"\.? Raise --mem-fraction-static above " + NUM
    + r"(?: \(minimum viable = 1 - available/pre = " + NUM + r"\))?"
)
_UNBALANCED = lazy(
    r"memory capacity is unbalanced\. Some GPUs may be occupied by other processes\.?"
    r"(?:\s*(?P<name>min_per_gpu_memory|pre_model_load_memory)=" + NUM + r", local_gpu_memory=" + NUM + ")?"
)
_OOM = lazy(r"CUDA out of memory|OutOfMemoryError")
_TRACEBACK = lazy(r"Traceback \(most recent call last\)")
#: the exception a traceback ends with: ``RuntimeError: msg`` or, when it is the repr Triton and friends print
#: inside another error, ``ValueError("msg")``
_EXCEPTION = lazy(r"^\s*(?:[\w.]+\.)?(?P<exc>[A-Z]\w*(?:Error|Exception))"
                        r"(?:: (?P<msg>.+)|\((?P<arg>[\"'].+[\"'])\)\s*$|(?P<bare>\s*$))")
#: ``Received sigquit from a child process. It usually means the child failed.`` (srt/entrypoints/engine.py, the
#: launcher's SIGQUIT handler, 0.4+): SGLang's own word that a scheduler or detokenizer process died at startup.
#: Early-2025 builds spell it ``from a child proces.`` (sglang#3752's log, 2025-03): the stem matches both
_CHILD_FAILED = lazy(r"Received sigquit from a child proces")
#: ``SIGQUIT received. signum=None, frame=None. It usually means one child failed.`` (srt/managers/
#: tokenizer_manager.py, running_phase_sigquit_handler, 0.5.3-0.5.12 at least): the same word once the server
#: runs (after the scheduler summary, e.g. during warmup)
_CHILD_FAILED_RUNNING = lazy(r"SIGQUIT received\. signum=\S*,? frame=\S*\. It usually means one child failed")
#: a scheduler's hung forward batch, fatal (SGLang sends SIGQUIT after it): ``Watchdog timeout
#: (self.watchdog_timeout=180.0)`` (managers/scheduler.py 0.5.3, scheduler_runtime_checker_mixin.py 0.5.6) and
#: ``Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)`` (utils/watchdog.py WatchdogRaw,
#: 0.5.8+); with ``self.soft=True`` (--soft-watchdog-timeout) it only dumps debug information and is not read
_WATCHDOG = lazy(r"(?:\b(?P<who>\w+) )?[Ww]atchdog timeout \(self\.watchdog_timeout=(?P<t>" + NUM[1:-1] + r")"
                 r"(?:, self\.soft=(?P<soft>True|False))?\)")
#: uvicorn's ``ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address
#: already in use``, printed through SGLang's logger: the HTTP server never listens, the warmup then fails
_PORT_IN_USE = lazy(r"\[Errno \d+\] error while attempting to bind on address (?P<addr>.+?): address already in use")
_POOL_SMALL = lazy(r"Memory pool size is too small|max_running_request is zero")
# failures SGLang's processes print after the pool is sized, as often as before it:
# ``Initialization failed. warmup error: ...`` (srt/entrypoints/http_server.py, _wait_and_warmup),
# ``Scheduler hit an exception: ...`` (srt/managers/scheduler.py, run_scheduler_process), the CUDA runtime's
# ``CUDA Error: ...`` / ``CUDA error: ...``, and ``Killed`` (the shell's report of a SIGKILL, e.g. the OOM killer)
_WARMUP = lazy(r"Initialization failed\.\s*(?P<msg>.*)")
_HIT_EXCEPTION = lazy(r"\b(?P<who>\w+) hit an exception\b:?\s*(?P<msg>.*)")
_CUDA_ERROR = lazy(r"\bCUDA [Ee]rror: (?P<msg>.+)")
_KILLED = lazy(r"^\s*(?:\[[^\]]*\]\s*)?(?:Killed\b|.*\bKilled process \d+)")

_FIELD_NUM_GB = {
    "avail": lazy(r"avail(?:_| )mem=" + NUM + r" ?GB", re.IGNORECASE),
    "usage": lazy(r"mem usage=" + NUM + r" ?GB"),
}
_TYPE = lazy(r"\b[Tt]ype=([\w.]+?)(?:[,.]?\s|[,.]?$)")
_DTYPE = lazy(r"\bdtype[=:] ?([\w.]+?)(?:,|\s|$)")
_QUANT = lazy(r"\bquant=([^,]+(?:, (?:bits|quant_algo|fmt)=[^,]+)*)")
_ELAPSED = lazy(r"(?:\belapsed=|Time elapsed: )" + NUM + r" ?s")
_TOKENS = lazy(r"#tokens: (\d+(?:\.\d+)?)([KkMm]?)")
_K_SIZE = lazy(r"(?<![A-Za-z])K size: " + NUM + r" ?GB")
_V_SIZE = lazy(r"(?<![A-Za-z])V size: " + NUM + r" ?GB")
_KV_SIZE = lazy(r"KV size: " + NUM + r" ?GB")
_DRAFT_TYPE = lazy(r"Eagle|EAGLE|NextN|MTP|Draft|Medusa|Dflash|DFlash")


def _f(m: re.Match[str] | None, group: int = 1) -> float | None:
    if m is None or m.group(group) is None:
        return None
    return float(m.group(group))


# ----------------------------------------------------------------------------------------------------------
# server_args


def parse_server_args(body: str, form: str) -> dict[str, Any]:
    """``ServerArgs(k=v, ...)`` repr or ``{'k': v, ...}`` dict text -> dict; values that are not Python
    literals (enums, objects) stay as their text. A line cut short (journald's LineMax) keeps what it has."""
    if form == "dict":
        try:
            value = literal(body)
            if isinstance(value, dict):
                return {str(k): v for k, v in value.items()}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
        body = body.strip().lstrip("{").rstrip("}")
    out: dict[str, Any] = {}
    for item in _split_top_level(body):
        key, sep, raw = item.partition(":" if form == "dict" else "=")
        if not sep:
            continue
        key = key.strip().strip("'\"")
        if not key.isidentifier():
            continue
        raw = raw.strip()
        try:
            out[key] = literal(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            out[key] = raw
    return out


def _split_top_level(body: str) -> list[str]:
    items, depth, quote, start, i = [], 0, "", 0, 0
    n = len(body)
    while i < n:
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    items.append(body[start:])
    return items


# ----------------------------------------------------------------------------------------------------------
# per-line parsing


@dataclass
class _Parsed:
    event: Event | None
    clues: list[VersionRange]


#: SGLang's logger prefix (``[2025-01-01 10:00:00 TP0] ``, ``[10:00:00] `` 0.3, ``[TP0] ``, ``[rank=0] ``;
#: srt/utils.py configure_logger), somewhere at the head of a line (after a journal's or kubectl's own prefix)
_OWN = lazy(r"\[(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?(?:\s*[A-Z][A-Z_]*\d+)*\s*\]"
                  r"|\[(?:\s*[A-Z][A-Z_]*\d+)+\s*\]|\[(?:rank|gpu_id)=\d+\]")
#: what SGLang prints without the prefix: a traceback's exception and the shell's ``Killed`` (anywhere), Python's
#: ``warnings`` line of quantization/awq.py's HIP-only warning (anywhere: it comes before the first prefixed line,
#: and from each scheduler process's import), and bench_one_batch's ``print(f"max_total_num_tokens={...}")``
#: (after the scheduler's prefixed lines)
OWN_PREFIX = OwnPrefix(
    cast("re.Pattern[str]", _OWN),  # a LazyPattern: compiled on first use, the same search/match
    bare=lambda e: isinstance(e, SchedulerSummary) and re.fullmatch(r"max_total_num_tokens=\d+", e.text.strip()) is not None,
    anywhere=lambda e: isinstance(e, Failure) or (isinstance(e, RocmSign) and "fused_marlin_moe" in e.text),
)


def _has_prefix(text: str, start: int) -> bool:
    """Whether SGLang's own log prefix (a bracket with a time or a rank tag) ends right where the message starts."""
    open_at = text.rfind("[", 0, start)
    while open_at >= 0:
        m = _PREFIX.match(text, open_at, start)
        if m is not None:
            return bool(m.group("time") or (m.group("tags") or "").strip() or m.group("kv"))
        open_at = text.rfind("[", 0, open_at)
    return False


def _prefix(text: str, start: int) -> tuple[Rank, list[VersionRange]]:
    # the prefix is the last [...] that ends right where the message starts
    m = None
    open_at = text.rfind("[", 0, start)
    while m is None and open_at >= 0:
        m = _PREFIX.match(text, open_at, start)
        if m is None:
            open_at = text.rfind("[", 0, open_at)
    if m is None:
        return SINGLE_RANK, []
    if m.group("kv"):
        return Rank.from_tags(f"{m.group('kv')}={m.group('n')}"), (
            [_clue(OLDEST, (0, 2, 99), "[rank=N] prefix")] if m.group("kv") == "rank" else []
        )
    clues = []
    if m.group("time") and not m.group("date"):
        clues.append(_clue((0, 3, 0), (0, 3, 2), "time-only log prefix"))
    if m.group("ms"):
        clues.append(_clue((0, 5, 6), None, "milliseconds in the log prefix"))
    tags = (m.group("tags") or "").strip()
    return (Rank.from_tags(tags) if tags else SINGLE_RANK), clues


def _line_events(line: Line) -> list[Event]:
    ev = parse_line(line).event
    return [ev] if ev is not None else []


def parse_line(line: Line) -> _Parsed:
    """One cleaned line -> at most one event (the first rule that matches wins) and its era clues."""
    text = line.text
    n = line.number

    m = _SERVER_ARGS.search(text) if "server_args=" in text else None
    # the engine prints its arguments through its logger, with its own "[time TPn]" prefix right before them: a
    # line that carries the words without it (an echo of a request, another program's output) does not open a
    # startup, and cannot name the model whose config.json kvaudit reads on the host
    if m and _has_prefix(text, m.start()):
        if m.group("dict") is not None:
            return _Parsed(
                ServerArgs(n, text, parse_server_args(m.group("dict"), "dict"), "dict"),
                [_clue((0, 5, 19), None, "server_args printed as a dict")],
            )
        args = parse_server_args(m.group("repr"), "repr")
        return _Parsed(
            ServerArgs(n, text, args, "repr"),
            [_clue(OLDEST, (0, 5, 18), "server_args printed as ServerArgs(...)")]
            + [_clue(lo, hi, why) for key, lo, hi, why in _ARGS_FIELD_CLUES if key in args],
        )

    def at(match: re.Match[str]) -> tuple[Rank, list[VersionRange]]:
        return _prefix(text, match.start())

    # before the scheduler summary: 0.5.16 words its line "max_total_num_tokens=N, free memory=X GB"
    m = _POST_CAPTURE.search(text) if "Post-capture KV sizing: " in text else None
    if m:
        rank, clues = at(m)
        if m.group("t16"):
            clues.append(_clue((0, 5, 16), (0, 5, 16), "'Post-capture KV sizing: max_total_num_tokens=' (0.5.16)"))
            return _Parsed(PostCaptureKV(n, text, rank, "target", int(m.group("t16")), None, float(m.group("f16"))),
                           clues)
        clues.append(_clue((0, 5, 17), None, "'Post-capture KV sizing: KV cache allocated' (0.5.17+)"))
        if m.group("t"):
            return _Parsed(PostCaptureKV(n, text, rank, "target", int(m.group("t")), float(m.group("kv")),
                                         float(m.group("f"))), clues)
        return _Parsed(PostCaptureKV(n, text, rank, "target", None, None, None, int(m.group("full")),
                                     int(m.group("swa"))), clues)

    # failures first: their text can contain other anchors (cheap substring tests guard every regex)
    for rx, kind in ((_NO_KV, "no_kv_memory"), (_NOT_ENOUGH, "not_enough_memory")):
        if "Loaded weights leave" not in text and "Not enough memory" not in text:
            break
        m = rx.search(text)
        if m:
            rank, clues = at(m)
            nums: dict[str, float] = {}
            if kind == "no_kv_memory":
                clues.append(_clue((0, 5, 14), None, "'Loaded weights leave no GPU memory' error"))
                nums = {"mem_fraction_static": float(m.group(1)), "suggested": float(m.group(2))}
                if m.group(3):
                    nums["minimum_viable"] = float(m.group(3))
            else:
                if m.group(2) is not None:
                    nums["mem_fraction_static"] = float(m.group(2))
                    clues.append(
                        _clue((0, 5, 3), (0, 5, 9), "'Not enough memory ... self.server_args.' error")
                        if m.group("self")
                        else _clue((0, 5, 10), None, "'Not enough memory ... Current value:' error")
                    )
                else:
                    clues.append(_clue(OLDEST, (0, 5, 2), "'Not enough memory.' without a value"))
            return _Parsed(Failure(n, text, rank, "target", kind, m.group(0), nums), clues)
    m = _HICACHE_FAIL.search(text) if "Not enough host" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(
            Failure(n, text, rank, "target", "host_memory", m.group(0),
                    {"requested_gb": float(m.group(1)), "available_gb": float(m.group(2))}),
            clues,
        )
    m = _UNBALANCED.search(text) if "unbalanced" in text else None
    if m:
        rank, clues = at(m)
        nums = {}
        if m.group("name"):
            nums = {"min_gib": float(m.group(2)), "local_gib": float(m.group(3))}
            clues.append(
                _clue((0, 5, 10), None, "pre_model_load_memory= in the imbalance error")
                if m.group("name") == "pre_model_load_memory"
                else _clue((0, 4, 4), (0, 5, 9), "min_per_gpu_memory= in the imbalance error")
            )
        return _Parsed(Failure(n, text, rank, "target", "unbalanced", m.group(0), nums), clues)

    m = _W_END.search(text) if "Load weight end" in text else None
    if m:
        rank, clues = at(m)
        rest = m.group("rest")
        avail = _f(_FIELD_NUM_GB["avail"].search(rest))
        usage = _f(_FIELD_NUM_GB["usage"].search(rest))
        mtype = _TYPE.search(rest)
        dtype = _DTYPE.search(rest)
        quant = _QUANT.search(rest)
        elapsed = _f(_ELAPSED.search(rest))
        if avail is None and usage is None and mtype is not None and mtype.end() >= len(rest.rstrip()):
            # every era prints type= before avail mem / mem usage: a line that ends inside type= was cut there
            # (an excerpt's last line), and the name it shows is a fragment, not the model
            mtype = None
        if avail is None and usage is None and mtype is None:
            return _Parsed(None, clues)  # the 0.5.18+ overlap note, or a fragment
        elided = "..." in rest
        if not elided:
            if "Type=" in rest:
                clues.append(_clue(OLDEST, (0, 2, 99), "'Load weight end. Type=' (0.1.x)"))
            elif usage is None:
                clues.append(_clue(OLDEST, (0, 4, 3), "'Load weight end' without mem usage"))
            elif quant is not None or (elapsed is not None and dtype is None):
                clues.append(_clue((0, 5, 10), None, "'Load weight end' with quant= or without dtype="))
            elif elapsed is not None:
                clues.append(_clue((0, 5, 9), (0, 5, 9), "'Load weight end. elapsed=... dtype='"))
            else:
                clues.append(_clue((0, 4, 4), (0, 5, 8), "'Load weight end' with dtype= and mem usage"))
        return _Parsed(
            WeightEnd(n, text, rank, "target", mtype.group(1) if mtype else None,
                      dtype.group(1) if dtype else None, quant.group(1).strip() if quant else None,
                      avail, usage, elapsed),
            clues,
        )
    m = _W_BEGIN.search(text) if "Load weight begin" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(WeightBegin(n, text, rank, "target", _f(m)), clues)

    m = _KV.search(text) if "KV Cache" in text else None
    if m:
        rank, clues = _prefix(text, _label_start(text, m.start()))
        label = text[_label_start(text, m.start()) : m.start()].strip()
        rest = m.group("rest")
        tok = _TOKENS.search(rest)
        tokens, approx = None, False
        if tok:
            mult = {"k": 1_000, "m": 1_000_000}.get(tok.group(2).lower(), 1)
            tokens = int(float(tok.group(1)) * mult)
            approx = mult != 1
        dtype = _DTYPE.search(rest)
        k, v, kv = _f(_K_SIZE.search(rest)), _f(_V_SIZE.search(rest)), _f(_KV_SIZE.search(rest))
        upper = m.group("state") == "VA upper bound"
        if "..." not in rest:
            if upper or label:
                clues.append(_clue((0, 5, 17), None, "named KV cache or 'VA upper bound'"))
            elif tokens is None:
                clues.append(_clue((0, 4, 2), (0, 4, 3), "'KV Cache is allocated' without #tokens"))
            elif dtype is not None:
                clues.append(_clue((0, 5, 13), None, "'KV Cache is allocated. dtype:'"))
            elif kv is not None:
                clues.append(_clue((0, 4, 6), (0, 5, 12), "MLA 'KV size' line without dtype"))
            else:
                clues.append(_clue((0, 4, 4), (0, 5, 12), "'KV Cache is allocated. #tokens:' without dtype"))
        return _Parsed(
            KVAlloc(n, text, rank, "target", label, dtype.group(1) if dtype else None, tokens, approx,
                    k, v, kv, upper),
            clues,
        )
    m = _POOL_END.search(text) if "Memory pool end" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(PoolEnd(n, text, rank, "target", _f(m)), clues)

    m = _GRAPH.search(text) if "Capture " in text else None
    if m:
        rank, clues = at(m)
        raw_name = " ".join(m.group("name").split())
        rest = m.group("rest")
        name = _graph_name(raw_name)
        role = "draft" if name.startswith("draft") else "target"
        avail = _f(_FIELD_NUM_GB["avail"].search(rest))
        if raw_name.startswith(("target", "draft decode")) or "elapsed=" in rest:
            clues.append(_clue((0, 5, 14), None, "'Capture target|draft ... CUDA graph' lines"))
        elif raw_name == "piecewise":
            clues.append(_clue((0, 5, 6), (0, 5, 13), "'Capture piecewise CUDA graph'"))
        if m.group("edge") == "begin":
            if avail is None and not raw_name:
                clues.append(_clue(OLDEST, (0, 4, 3), "'Capture cuda graph begin' without avail mem"))
            return _Parsed(GraphBegin(n, text, rank, role, name, avail), clues)
        usage = _f(_FIELD_NUM_GB["usage"].search(rest))
        elapsed = _f(_ELAPSED.search(rest))
        if not raw_name and "Time elapsed" in rest:
            if usage is None and avail is None:
                clues.append(_clue((0, 4, 0), (0, 4, 3), "'Capture cuda graph end. Time elapsed' alone"))
            elif avail is not None and usage is not None and rest.find("avail mem") < rest.find("mem usage"):
                clues.append(_clue((0, 4, 4), (0, 4, 6), "graph end with avail mem before mem usage"))
            elif usage is not None:
                clues.append(_clue((0, 4, 7), (0, 5, 13), "graph end with mem usage before avail mem"))
        return _Parsed(GraphEnd(n, text, rank, role, name, usage, avail, elapsed), clues)

    m = _SUMMARY.search(text) if "max_total_num_tokens=" in text else None
    if m:
        rank, clues = at(m)
        fields = dict(re.findall(r"(\w+)=(-?\d+(?:\.\d+)?)(?![\d.])", m.group("rest")))
        avail_text = fields.get("available_gpu_mem") or fields.get("available_cpu_mem")
        if avail_text is not None:
            clues.append(_clue((0, 4, 7), None, "scheduler summary with available_gpu_mem"))
        elif "chunked_prefill_size" in fields:
            clues.append(_clue((0, 4, 2), (0, 4, 6), "scheduler summary without available_gpu_mem"))
        else:
            clues.append(_clue(OLDEST, (0, 4, 1), "scheduler summary without chunked_prefill_size"))
        return _Parsed(
            SchedulerSummary(
                n, text, int(m.group(1)), _int(fields.get("chunked_prefill_size")),
                _int(fields.get("max_prefill_tokens")), _int(fields.get("max_running_requests")),
                _int(fields.get("context_len")), float(avail_text) if avail_text is not None else None,
                rank if rank != SINGLE_RANK else None,
            ),
            clues,
        )

    if "Init " not in text and "Memory baseline" not in text:
        return _other_lines(line)
    m = _INIT_END.search(text)
    if m:
        rank, clues = at(m)
        clues.append(
            _clue((0, 5, 9), (0, 5, 20), "'Init torch distributed ends. elapsed='")
            if m.group(1)
            else _clue((0, 4, 4), (0, 5, 8), "'Init torch distributed ends. mem usage='")
        )
        return _Parsed(DistInit(n, text, rank, "target", float(m.group(2))), clues)
    m = _BASELINE.search(text)
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 5, 21), None, "'Memory baseline taken'"))
        return _Parsed(DistInit(n, text, rank, "target", float(m.group(1))), clues)
    m = _INIT_OLD.search(text)
    if m:
        rank, clues = at(m)
        return _Parsed(DistInit(n, text, rank, "target", None, float(m.group(1))), clues)
    m = _INIT_BEGIN.search(text)
    if m:
        rank, clues = at(m)
        if "nccl" in m.group(0):
            clues.append(_clue((0, 3, 0), (0, 3, 2), "'Init nccl begin'"))
        else:
            clues.append(_clue((0, 3, 4), (0, 5, 20), "'Init torch distributed begin'"))
        return _Parsed(None, clues)

    return _other_lines(line)


def _other_lines(line: Line) -> _Parsed:
    """The rarer pools, HiCache, dtype, caps, and generic failures. Each pattern is tried only on a line holding
    a literal that every match of it holds: most lines reach here and match none (issue 40: no search, and a
    pattern no line needs is never compiled)."""
    text = line.text
    n = line.number

    def at(match: re.Match[str]) -> tuple[Rank, list[VersionRange]]:
        return _prefix(text, match.start())

    m = _MEM_PROFILE.search(text) if "Memory profiling" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(MemoryProfile(n, text, rank, "target", float(m.group(1)), float(m.group(2)),
                                     float(m.group(3)), float(m.group(4))), clues)
    m = _DSV4_CALC.search(text) if "4 memory calculation" in text else None
    if m:
        rank, clues = at(m)
        rest = m.group("rest")
        bpft, avail = _f(_DSV4_BPFT.search(rest)), _f(_DSV4_AVAIL.search(rest))
        if bpft is not None and avail is not None:
            fixed = {k: float(v) for k, v in _DSV4_FIXED.findall(rest)}
            if "DSV4" in m.group(0):
                clues.append(_clue((0, 5, 20), None, "'DSV4 memory calculation: unified='")
                             if "unified=" in rest else _clue((0, 5, 12), (0, 5, 19), "'DSV4 memory calculation:'"))
            return _Parsed(DSv4Calc(n, text, rank, "target", bpft, avail, int(m.group("full")), fixed,
                                    _f(_DSV4_EFFECTIVE.search(rest))), clues)
    m = _VERSION_BANNER.search(text) if "ersion" in text else None
    if m:
        v = parse_version(m.group("v"))
        return _Parsed(None, [VersionRange(v, v, (f"version banner: {text.strip()[:80]}",))])
    m = _SWA_SUMMARY.search(text) if "SWAKVPool mem usage: " in text else None
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 4, 9), None, "SWAKVPool summary"))
        return _Parsed(
            OtherPool(n, text, rank, "target", "swa_summary", float(m.group(1)), False,
                      {"swa_size": int(m.group(2)), "full_size": int(m.group(3))}),
            clues,
        )
    m = _BUDGET_RESERVE.search(text) if "of the KV budget for " in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(OtherPool(n, text, rank, "target", "budget_reserve", float(m.group(1)), True,
                                 {"for": m.group(2).strip().rstrip(".")}), clues)
    m = _MAMBA.search(text) if "Mamba Cache is allocated." in text else None
    if m:
        rank, clues = at(m)
        rest = m.group("rest")
        parts = {k: float(v) for k, v in re.findall(r"(\w+) size: " + NUM + r" ?GB", rest)}
        size = re.search(r"max_mamba_cache_size: (\d+)", rest)
        clues.append(
            _clue((0, 5, 4), None, "Mamba line with max_mamba_cache_size")
            if size
            else _clue((0, 5, 2), (0, 5, 3), "Mamba line without max_mamba_cache_size")
        )
        detail: dict[str, Any] = dict(parts)
        if size:
            detail["max_mamba_cache_size"] = int(size.group(1))
        return _Parsed(
            OtherPool(n, text, rank, "target", "mamba", sum(parts.values()) if parts else None, True, detail),
            clues,
        )
    m = _SWA_SPLIT.search(text) if "liding window memory pool" in text else None
    if m:
        rank, clues = at(m)
        clues.append(
            _clue((0, 5, 7), None, "lower-case 'sliding window memory pool'")
            if "sliding" in m.group(0)
            else _clue((0, 4, 9), (0, 5, 6), "'Use Sliding window memory pool'")
        )
        return _Parsed(SlidingWindowSplit(n, text, rank, "target", _int(m.group(1)), _int(m.group(2))), clues)
    m = _INIT_POOL.search(text) if "TokenToKVPool with " in text else None
    if m:
        rank, clues = at(m)
        detail = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group("rest"))}
        return _Parsed(OtherPool(n, text, rank, "target", m.group(1), None, False, detail), clues)

    m = _HICACHE_AUTO.search(text) if "HiCache auto-sizing" in text else None
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 5, 22), None, "'HiCache auto-sizing: ratio' (0.5.22+)"))
        return _Parsed(HiCacheAutoSize(n, text, rank, "target", *(float(g) for g in m.groups())), clues)
    m = _HICACHE_POOL.search(text) if "host pool" in text else None
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 5, 17), None, "'Allocating <label> hierarchical KV host pool: N tokens' (0.5.17+)"))
        return _Parsed(HiCacheHost(n, text, rank, "target", float(m.group(3)), int(m.group(2)),
                                   f"hierarchical KV host pool ({m.group(1)})"), clues)
    m = _HICACHE.search(text) if "host memory for" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(HiCacheHost(n, text, rank, "target", float(m.group(1)), None, m.group(2)), clues)
    m = _NSA_MODEL.search(text) if ("NSA backends" in text or "DSA with TP" in text) else None
    if m:
        return _Parsed(NsaModel(n, text, m.group(1), tuple(g for g in (m.group(2), m.group(3)) if g)), [])
    if "ROCm" in text and _ROCM_SIGN.search(text):
        return _Parsed(RocmSign(n, text), [])
    if "Aiter AllReduce Fusion" in text and _ROCM_AITER_FUSION.search(text):
        return _Parsed(RocmSign(n, text), [_clue((0, 5, 10), None, "'Enable Aiter AllReduce Fusion for' (0.5.10+)")])
    if "fused_marlin_moe" in text and _ROCM_AWQ.search(text):
        return _Parsed(RocmSign(n, text), [])
    if "AiterCustomAllreduce" in text and _ROCM_AITER_AR.search(text):
        return _Parsed(RocmSign(n, text), [_clue((0, 5, 7), None, "'[AR] Using AiterCustomAllreduce (AMD default)' "
                                                 "(0.5.7+)")])
    m = _AITER_KEPT.search(text) if "HONOR_EXPLICIT" in text else None
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 5, 19), None, "SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION warning (0.5.19+)"))
        return _Parsed(AiterFractionKept(n, text, rank, "target", float(m.group(1))), clues)
    m = _MFS_ADJUST.search(text) if "reduce --mem-fraction-static to " in text else None
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 4, 2), (0, 4, 8), "multimodal mem-fraction reduction line"))
        return _Parsed(MfsAdjust(n, text, rank, "target", float(m.group(1))), clues)
    m = _KV_BUDGET.search(text) if "available memory for" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(KVBudget(n, text, rank, "target", float(m.group(1))), clues)
    m = _KV_DTYPE.search(text) if "Using KV cache dtype: " in text else None
    if m:
        rank, clues = at(m)
        clues.append(_clue((0, 5, 3), (0, 5, 12), "'Using KV cache dtype'"))
        return _Parsed(KVDtype(n, text, rank, "target", m.group(1)), clues)
    m = _CAP.search(text) if " is larger than the profiled value " in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(CapWarning(n, text, rank, "target", int(m.group(1)), int(m.group(2))), clues)
    m = _REQS_REDUCED.search(text) if "max_running_requests was reduced" in text else None
    if m:
        # the release that added the warning is not pinned down: it narrows no version
        return _Parsed(RequestsReduced(n, text, int(m.group(1)), int(m.group(2))), [])
    m = _SPEC_RESET.search(text) if "Max running requests is reset to " in text else None
    if m:
        return _Parsed(SpecReset(n, text, int(m.group(1))), [_clue((0, 5, 4), None, "spec max-requests reset")])

    m = _POOL_SMALL.search(text) if ("Memory pool size is too small" in text
                                      or "max_running_request is zero" in text) else None
    if m:
        rank, clues = at(m)
        return _Parsed(Failure(n, text, rank, "target", "pool_too_small", m.group(0)), clues)
    for rx, kind, words in ((_WARMUP, "warmup", ("Initialization failed.",)),
                            (_HIT_EXCEPTION, "exception", (" hit an exception",)),
                            (_CUDA_ERROR, "cuda_error", ("CUDA Error: ", "CUDA error: ")), (_KILLED, "killed", ("Killed",))):
        m = rx.search(text) if any(w in text for w in words) else None
        if m:
            rank, clues = at(m)
            msg = (m.groupdict().get("msg") or "").strip()
            label = {"warmup": "Initialization failed", "exception": f"{m.groupdict().get('who')} hit an exception",
                     "cuda_error": "CUDA error", "killed": "Killed"}[kind]
            return _Parsed(Failure(n, text, rank, "target", kind, quote(f"{label}: {msg}" if msg else label)),
                           clues)
    m = _OOM.search(text) if ("CUDA out of memory" in text or "OutOfMemoryError" in text) else None
    if m and "Not enough" not in text:
        rank, clues = at(m)
        return _Parsed(Failure(n, text, rank, "target", "oom", quote(_after_prefix(text).strip()),
                               oom_numbers(text)), clues)
    m = _TRACEBACK.search(text) if "Traceback (most recent call last)" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(Failure(n, text, rank, "target", "traceback", m.group(0)), clues)
    m = _WATCHDOG.search(text) if "atchdog timeout (" in text else None
    if m and m.group("soft") != "True":
        rank, clues = at(m)
        who = f"{m.group('who')} watchdog timeout" if m.group("who") else "Watchdog timeout"
        return _Parsed(Failure(n, text, rank, "target", "watchdog",
                               f"{who}: a forward batch did not finish within {float(m.group('t')):g} s "
                               f"(--watchdog-timeout) and SGLang stopped the server",
                               {"watchdog_timeout_s": float(m.group("t"))}), clues)
    m = _PORT_IN_USE.search(text) if "address already in use" in text else None
    if m:
        rank, clues = at(m)
        return _Parsed(Failure(n, text, rank, "target", "port_in_use",
                               quote(f"the HTTP server could not bind {m.group('addr')}: address already in use "
                                     "(another process holds the port)")), clues)
    m = ((_CHILD_FAILED_RUNNING.search(text) if "It usually means one child failed" in text else None)
         or (_CHILD_FAILED.search(text) if "Received sigquit from a child proces" in text else None))
    if m:  # either wording of SGLang's SIGQUIT from a child
        rank, clues = at(m)
        return _Parsed(Failure(n, text, rank, "target", "child_failed",
                               "a child process failed (SGLang received SIGQUIT from it)"), clues)
    m = _EXCEPTION.search(_after_prefix(text)) if ("Error" in text or "Exception" in text) else None
    if m:
        if m.group("bare") is not None:
            # ``AssertionError`` alone: the exception, without a message (its statement is on the line above)
            return _Parsed(Failure(n, text, SINGLE_RANK, "target", "exception", m.group("exc")), [])
        msg = m.group("msg") if m.group("msg") is not None else m.group("arg")[1:-1]
        return _Parsed(Failure(n, text, SINGLE_RANK, "target", "exception",
                               quote(f"{m.group('exc')}: {msg}")), [])
    return _Parsed(None, [])


#: a syslog-style prefix a journal or rsyslog puts before the engine's line (``journalctl -o short-iso``:
#: ``2026-02-25T10:12:01+0000 gpu-node-07 python3[48190]: ``): not the engine's words, so never quoted
_SYSLOG_PREFIX = lazy(r"^(?:\S+ ){2,4}[^\s\[\]]{1,64}\[[1-9][0-9]{0,9}\]: ")


def _after_prefix(text: str) -> str:
    """The engine's message: the line without a syslog prefix and SGLang's ``[time TPn]`` prefix."""
    if "]: " in text:
        m = _SYSLOG_PREFIX.match(text)
        if m:
            text = text[m.end():]
    close = text.find("] ")
    if text.startswith("[") and close > 0:
        return text[close + 2 :]
    return text


def _label_start(text: str, kv_start: int) -> int:
    """Where a cache name like 'Full' / 'SWA' before 'KV Cache' begins (just after the log prefix)."""
    close = text.rfind("]", 0, kv_start)
    return close + 1 if close >= 0 else kv_start


def _graph_name(raw: str) -> str:
    """Normalise graph-capture names across eras: plain 'cuda graph' (<=0.5.13) is the target's decode graph,
    'piecewise' (0.5.6-0.5.13) its prefill graph, 'draft' the draft's decode graph."""
    raw = raw.lower()
    if not raw:
        return "target decode"
    if raw == "piecewise":
        return "target prefill"
    if raw == "draft":
        return "draft decode"
    return raw


def _int(s: str | None) -> int | None:
    if s is None:
        return None
    try:
        return int(float(s))
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------------------
# startup segmentation and draft attribution


@dataclass
class _RankState:
    target_weights: bool = False
    draft_weights: bool = False
    target_kv: bool = False
    target_kv_closed: bool = False
    last_kv_role: str = "target"
    dist_inits: int = 0
    last_avail: float | None = None  # the rank's latest free-memory reading (GiB)
    kv_lines: list[tuple[int, float | None]] = field(default_factory=list)  # this startup's KV lines: tokens, GiB
    pool_closed: bool = False  # a 'Memory pool end' came after the rank's last KV line


@dataclass
class _Builder:
    index: int
    first_line: int
    last_line: int = 0
    server_args: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    clues: list[VersionRange] = field(default_factory=list)
    ranks: dict[Rank, _RankState] = field(default_factory=dict)
    summary_seen: bool = False
    failed: bool = False

    def state(self, rank: Rank) -> _RankState:
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = _RankState()
        return st

    @property
    def empty(self) -> bool:
        return not self.events

    def spec_enabled(self) -> bool | None:
        if self.server_args is None:
            return None
        algo = self.server_args.get("speculative_algorithm")
        return algo not in (None, "None", "", "NONE")

    def build(self) -> Startup:
        # a version the log prints wins over the shapes of its lines (a fork of 0.5.11 carries newer lines)
        banner = any(e.startswith("version banner") for c in self.clues for e in c.evidence)
        era = (resolve if banner else narrow)(self.clues, VersionRange(OLDEST, None))
        path = (self.server_args or {}).get("model_path")
        return Startup(ENGINE, self.index, self.first_line, self.last_line, self.server_args,
                       tuple(_peer_roles(_paired_draft(self.events, self.ranks), self.ranks)), era,
                       path if isinstance(path, str) else None)


def _paired_draft(events: list[Event], ranks: dict[Rank, _RankState]) -> list[Event]:
    """A rank with no weight lines (an excerpt, a harness's summary of the pool lines: c060) whose two KV lines
    name one token count with two sizes, no 'Memory pool end' between them, holds a target's pool and a draft's:
    SGLang sizes the draft's pool to the target's tokens (pool_configurator.py MemoryPoolConfig, "shared between
    target and draft workers", 0.5.11+), and a draft (an MTP or EAGLE head) has far fewer layers: the smaller line
    is the draft's, whichever came first (a harness may sort them). Identical lines are other ranks' (untagged)."""
    out = list(events)
    open_kv: dict[Rank, int] = {}  # the rank's last target KV line not yet closed by a pool end
    for i, e in enumerate(out):
        if isinstance(e, PoolEnd):
            open_kv.pop(e.rank, None)
            continue
        if not isinstance(e, KVAlloc) or e.role != "target" or e.upper_bound:
            continue
        st = ranks.get(e.rank)
        if st is None or st.target_weights or st.draft_weights:
            continue
        j = open_kv.pop(e.rank, None)
        prev = out[j] if j is not None else None
        if (isinstance(prev, KVAlloc) and prev.tokens and prev.tokens == e.tokens and prev.label == e.label
                and prev.total_gib is not None and e.total_gib is not None and prev.total_gib != e.total_gib):
            small = j if prev.total_gib < e.total_gib else i
            out[small] = _replace_role(out[small], "draft")  # type: ignore[index,arg-type]
            continue
        open_kv[e.rank] = i
    return out


def _peer_roles(events: list[Event], ranks: dict[Rank, _RankState]) -> list[Event]:
    """A pasted excerpt can lose a rank's weight lines; its KV line then cannot be placed by order. Ranks are
    symmetric, so a KV line identical to another rank's draft KV line (and to no target one) is the draft's."""
    def key(e: KVAlloc) -> tuple:
        return (e.label, e.tokens, e.k_gib, e.v_gib, e.kv_gib)

    draft_keys = {key(e) for e in events if isinstance(e, KVAlloc) and e.role == "draft"}
    if not draft_keys:
        return events
    target_keys = {key(e) for e in events if isinstance(e, KVAlloc) and e.role == "target"
                   and ranks.get(e.rank, _RankState()).target_weights}
    out = []
    for e in events:
        if (isinstance(e, KVAlloc) and e.role == "target" and not ranks[e.rank].target_weights
                and key(e) in draft_keys and key(e) not in target_keys):
            e = _replace_role(e, "draft")
        out.append(e)
    return out


#: a new startup is told by a new server_args, a new ``Load weight begin`` / distributed init, or the phase order
#: starting again; never by a rise in free memory alone: a CUDA-graph capture can *free* memory (``mem
#: usage=-5.29 GB`` when the loader's garbage is collected). A phase-start line (weights begin or end, distributed
#: init: an excerpt may lack the begin) this much above the rank's
#: previous reading is a restart (two startups pasted together without a server_args line), unless it may be the
#: draft worker's begin (speculative decoding on)
RESTART_RISE_GIB = 2.0
RESTART_RISE_FRACTION = 0.1


def _avail(ev: Event) -> float | None:
    if isinstance(ev, (WeightBegin, WeightEnd, PoolEnd, GraphBegin, GraphEnd)):
        return ev.avail_gib
    if isinstance(ev, DistInit):
        return ev.begin_avail_gib
    return None


#: events of server_args.py's warnings, printed while the arguments are settled, before the 'server_args=' line
_ARGS_WARNINGS = (NsaModel, RocmSign)


def _starts_new(b: _Builder, ev: Event) -> bool:
    """Does this event begin a new server start rather than continue the current one?"""
    if b.empty:
        return False
    if isinstance(ev, ServerArgs):
        # server_args.py's own warnings (__post_init__) come before the 'server_args=' line they belong to
        return b.server_args is not None or not all(isinstance(e, _ARGS_WARNINGS) for e in b.events)
    if isinstance(ev, (WeightBegin, WeightEnd, DistInit)) and ev.role == "target":
        st = b.ranks.get(ev.rank)
        now = _avail(ev)
        if st is not None and now is not None and st.last_avail is not None and \
                now - st.last_avail > max(RESTART_RISE_GIB, RESTART_RISE_FRACTION * st.last_avail) and \
                (b.spec_enabled() is not True or st.draft_weights):
            return True
    if isinstance(ev, KVAlloc) and ev.tokens and not ev.upper_bound:
        # a rank without weight lines (an excerpt or a harness's summary of the pool lines, c060) whose pool a
        # 'Memory pool end' closed, allocating again a pool it already has, or one of fewer tokens: a server
        # started again. A draft's pool is never smaller in tokens than its target's (a draft worker's pool shares
        # the target's size, pool_configurator.py MemoryPoolConfig 0.5.11+; draft_runner_cache_size >= it
        # before), and a hybrid's second pool (SWA) comes before the pool end
        st = b.ranks.get(ev.rank)
        if st is not None and st.pool_closed and st.kv_lines and not (
                st.target_weights or st.draft_weights or st.dist_inits):
            counts = {t for t, _ in st.kv_lines}
            if (ev.tokens, ev.total_gib) in st.kv_lines or (ev.tokens < max(counts) and ev.tokens not in counts):
                return True
    if not isinstance(ev, (WeightBegin, WeightEnd, DistInit)):
        return False
    st = b.ranks.get(ev.rank)
    if b.summary_seen:
        return True
    if st is None:
        return False
    if isinstance(ev, DistInit):
        # the draft worker re-initialises distributed (<=0.5.13) after the target's weights
        return st.draft_weights or (st.dist_inits >= 1 and not st.target_weights)
    if isinstance(ev, WeightBegin):
        return st.draft_weights
    # WeightEnd
    if not st.target_weights:
        return False
    if st.draft_weights:
        return True
    draftish = ev.model_type is not None and _DRAFT_TYPE.search(ev.model_type) is not None
    if draftish:
        return False
    spec = b.spec_enabled()
    if spec is False:
        return True
    return b.failed


def _attribute(b: _Builder, ev: Event) -> Event:
    """Set ``role`` on a rank event from the per-rank order of events; update the rank's state."""
    if not isinstance(ev, RankEvent):
        return ev
    st = b.state(ev.rank)
    role = ev.role
    if isinstance(ev, DistInit):
        role = "draft" if st.target_weights else "target"
        st.dist_inits += 1
    elif isinstance(ev, WeightBegin):
        role = "draft" if st.target_weights else "target"
    elif isinstance(ev, WeightEnd):
        draftish = ev.model_type is not None and _DRAFT_TYPE.search(ev.model_type) is not None
        if st.target_weights or draftish:
            # a draft type= is the draft's even when the target's line was cut from the excerpt
            role = "draft"
            st.draft_weights = True
            if st.target_kv:
                st.target_kv_closed = True
        else:
            role = "target"
            st.target_weights = True
    elif isinstance(ev, KVAlloc):
        role = "draft" if (st.draft_weights and st.target_kv_closed) else "target"
        if role == "target":
            st.target_kv = True
        st.last_kv_role = role
        if ev.tokens:
            st.kv_lines.append((ev.tokens, ev.total_gib))
        st.pool_closed = False
    elif isinstance(ev, KVBudget):
        # the draft's own budget line is the draft's, as its KV line: builds that print the line (the Ascend image
        # cann8.3.rc2-a3-release20260106, pre-0.5.7 sizing: profile_max_num_token runs again for the EAGLE draft's
        # worker after the target's pool, corpus sglang_c075) print it once per worker
        role = "draft" if (st.draft_weights and st.target_kv_closed) else "target"
    elif isinstance(ev, PoolEnd):
        st.pool_closed = True
        role = st.last_kv_role
        if role == "target" and st.target_kv:
            st.target_kv_closed = True
    elif isinstance(ev, (OtherPool, SlidingWindowSplit)):
        role = st.last_kv_role if st.draft_weights and st.target_kv_closed else "target"
    now = _avail(ev)
    if now is not None and role == "target":
        st.last_avail = now
    if role != ev.role:
        ev = _replace_role(ev, role)
    return ev


def _replace_role(ev: RankEvent, role: str) -> RankEvent:
    return replace(ev, role=role)


def _generic(ev: Event) -> bool:
    """Tracebacks and exceptions appear in any Python server's log: alone they do not make an SGLang startup."""
    return isinstance(ev, Failure) and ev.kind in ("traceback", "exception", "oom", "warmup", "cuda_error", "killed")


class SGLangParser(SGLangWords):
    def parse(self, lines: Iterable[Line]) -> list[Startup]:
        rows: list[tuple[Line, _Parsed]] = []
        for line in lines:
            parsed = parse_line(line)
            ev = parsed.event
            if ev is not None and not unquoted(line, [ev], _line_events):
                continue  # engine-looking text inside a quoted value (a prompt, a path): not the engine's line
            if ev is None and not parsed.clues:
                continue
            rows.append((line, parsed))
        own, dropped = anchored([(line, [p.event] if p.event else []) for line, p in rows], OWN_PREFIX)
        startups: list[Startup] = []
        b: _Builder | None = None
        for (line, parsed), kept in zip(rows, own):
            if parsed.event is not None and not kept:
                continue  # the engine's words without its prefix, in a log whose lines carry it: not its line
            ev = parsed.event
            if b is None:
                b = _Builder(1, line.number)
            if ev is not None and _starts_new(b, ev):
                startups.append(b.build())
                b = _Builder(b.index + 1, line.number)
            b.last_line = line.number
            b.clues.extend(parsed.clues)
            if ev is None:
                continue
            ev = _attribute(b, ev)
            b.events.append(ev)
            if isinstance(ev, ServerArgs):
                b.server_args = ev.args
            elif isinstance(ev, SchedulerSummary):
                b.summary_seen = True
            elif isinstance(ev, Failure) and ev.kind != "unbalanced":
                b.failed = True
        if b is not None and not b.empty:
            startups.append(b.build())
        return with_unprefixed([s for s in startups if not all(_generic(e) for e in s.events)], dropped)
