"""vLLM startup-log grammar, V0 worker (0.2.x-0.10.x) and V1 (0.6.4 onwards).

Format strings quoted from vLLM's source (paths under ``vllm/`` upstream; version ranges per the shared
reference, section 1.4; docs/vllm-log-grammar.md has the table):

* weights: ``worker/model_runner.py`` / ``v1/worker/gpu_model_runner.py``: "Loading model weights took %.4f GB"
  (0.4-0.7.3), "Model loading took %.4f GB|GiB[ memory] and %.6f seconds" (0.8+); "GB" is GiB here;
* V0 profiling summary (``worker/worker.py::determine_num_available_blocks``): the 0.6.4 one-liner
  "Memory profiling results: total_gpu_memory=...", the 0.6.5-0.10 three-line record ("the current vLLM
  instance can use total_gpu_memory (T GiB) x gpu_memory_utilization (u) = R GiB" / "model weights take
  ...; the rest of the memory reserved for KV Cache is K GiB."), and the column-aligned table some builds print;
* blocks: "# GPU blocks: %d, # CPU blocks: %d" (also "# CUDA blocks", "# cuda blocks", V1 0.6.4-0.7 without
  CPU blocks), "num_gpu_blocks is: %d"; the CPU backend's pool: "# CPU blocks: %d" alone (executor/cpu_executor.py
  0.4-0.6) and "# cpu blocks: %d, # CPU blocks: 0" (executor_base.py 0.7-0.10 names the platform's device), with its
  KV space from the VLLM_CPU_KVCACHE_SPACE warning (the ``cpu_kvcache_space`` Setting); V1 tokens: "GPU KV cache size: %s tokens" (``v1/core/kv_cache_utils.py``),
  "Maximum concurrency for %s tokens per request: %.2fx";
* V1 budget: "Available KV cache memory: %.2f GiB" (``v1/worker/gpu_worker.py``, every worker), the
  "Free memory on device (F/T GiB) on startup ..." suggestion and error lines, kv_cache_memory_bytes;
* graphs: "Graph capturing finished in %.0f secs, took %.2f GiB", "Estimated CUDA graph memory: %.2f GiB total",
  "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated)", the gpu-memory-utilization equivalence note.

Process tags: ``(VllmWorkerProcess pid=N)``, ``(VllmWorker rank=N pid=P)``, ``(Worker_TP0 pid=P)``,
``(RayWorkerWrapper pid=N)``, ``(EngineCore_DP0 pid=P)``; Ray's "[repeated Nx across cluster]" suffix and
vLLM-Omni's pipe-delimited lines are tolerated. Values labelled GB, GiB or Gib are all GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, cast

from kvaudit.parse.patterns import lazy
from kvaudit.parse.interface import (SINGLE_RANK, literal, Event, Failure, OwnPrefix, Rank, RankEvent, Startup,
                                     anchored, quote, unquoted, with_unprefixed)
from kvaudit.parse.lines import Line
from kvaudit.parse.request_time import SERVING, SERVING_WITHIN
from kvaudit.parse.vocabulary import VLLMWords
from kvaudit.versions import VersionRange, resolve
from kvaudit.versions import clue as _clue
from kvaudit.record import record

ENGINE = VLLMWords.name

NUM = r"(-?\d+(?:\.\d+)?)"
GI = r"\s?(?:GiB|GB|Gib)"


@record
class Banner(Event):
    version: str | None = None
    engine_kind: str | None = None  # "V0" | "V1"
    config: dict[str, Any] = field(default_factory=dict)


@record
class Reading(RankEvent):
    """One number from a memory line: ``key`` names it (total_gib, util, requested_gib, weights_gib,
    non_torch_gib, activation_gib, kv_gib, graph_gib, graph_estimate_gib, equiv_util, ...)."""

    key: str = ""
    value: float = 0.0


@record
class Blocks(RankEvent):
    gpu_blocks: int = 0
    cpu_blocks: int | None = None  # the swap blocks beside the pool (V0)
    device: str = "GPU"  # the pool's device as the line names it; "cpu": the CPU backend's pool, in host memory


@record
class KVTokens(Event):
    tokens: int = 0
    device: str = "GPU"  # 0.31+: the first word is the device (GPU, XPU, ...)
    with_host: bool = False  # 0.33: "GPU + host": the count includes host-offloaded (sparse) cache
    dp: int | None = None  # the EngineCore_DPn that logged it (each data-parallel engine has its own pool)


@record
class HybridLayout(Event):
    """A hybrid (attention + Mamba/GDN) model's unified page: the attention block size the engine chose so that
    an attention page is at least a Mamba page, and how much the Mamba page was padded to match it exactly."""

    block_size: int | None = None
    mamba_padding_pct: float | None = None


@record
class Setting(Event):
    """A setting the engine states on a line of its own rather than in the args: ``mamba_cache_mode``
    ("Mamba cache mode is set to 'align' ...", ``config/vllm.py`` 0.2x), ``max_num_batched_tokens`` ("Chunked
    prefill is enabled with max_num_batched_tokens=N.", ``config/scheduler.py``), ``padding_layers`` ("Add N
    padding layers, may waste at most X% KV cache memory", ``v1/core/kv_cache_utils.py``
    ``_get_kv_cache_groups_uniform_page_size``, 0.10+; ``extra`` is X), ``sliding_as_full`` (the warning that every
    sliding-window layer is sized as full attention), ``mamba_cache_blocks`` (the CUDA-graph sizes capped to a Mamba
    hybrid's blocks, ``config/compilation.py``: the model is a Mamba hybrid)."""

    key: str = ""
    value: str = ""
    extra: float | None = None


@record
class AutoFit(Event):
    """0.14+ ``--max-model-len -1`` (auto): the context length the KV memory allows."""

    from_len: int = 0
    to_len: int = 0
    kv_gib: float | None = None
    host_gib: float | None = None


@record
class Concurrency(Event):
    max_model_len: int = 0
    factor: float = 0.0


_ART_BANNER = lazy(r"\u2588\s+version (\d+\.\d+\.\d+[\w.+-]*)")
#: the pid key of a process tag; a log passed through a host-name redactor can lose letters of it ("pi" of
#: "pid" taken for a host name: ``(Worker_TP0 <HOST>d=111)``, noonghunna/club-3090#1339), and the tag still names
#: the rank
_PID_KEY = r"(?:pid|<[^<>()\s]+>d|p<[^<>()\s]+>)"
#: Ray adds the node's address to a worker's tag on a multi-node cluster: ``(RayWorkerWrapper pid=N, ip=10.0.0.2)``
_TAG = lazy(r"\((?P<proc>[^()]*?)\s+" + _PID_KEY + r"=(?P<pid>\d+)(?:,\s*ip=[^()\s]+)?\)")
#: "Initializing an LLM engine (v0.4.0) with config: ..." (0.4+); before 0.4 the same line had no version
#: ("Initializing an LLM engine with config: model=..., tensor_parallel_size=1, ...", engine/llm_engine.py 0.1-0.3)
_BANNER = lazy(r"Initializing an? (?:(?P<kind>V[01]) )?LLM engine (?:\(v(?P<ver>[\w.+-]+)\) )?with config: "
                     r"(?P<cfg>.*)$")
_MB_WEIGHTS = lazy(r"Loading model weights took " + NUM + r" MB\b")
_API = lazy(r"vLLM API server version (?P<ver>[\w.+-]+)")
_ARGS = lazy(r"non-default args: (?P<d>\{.*\})")
#: vLLM's logger prefix right before a message: "INFO 06-01 10:00:00 [utils.py:326] " (0.8+), "INFO 01-17 10:00:00
#: llm_engine.py:72] " before (vllm/logger.py _FORMAT); the lines that name the model must carry it
_OWN_PREFIX = lazy(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +\[?[\w./-]+\.py:\d+\] *$")
#: the same prefix anywhere at the head of a line (after a journal's, kubectl's or Ray's ``(pid=N)`` prefix); a
#: pasted excerpt often lost the time ("INFO [kv_cache_utils.py:1324] ...")
_OWN = lazy(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +(?:\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +)?\[?[\w./-]+\.py:\d+\]")
_WEIGHTS = lazy(r"(?:Loading model weights took|Model loading took) " + NUM + GI
                      + r"(?: memory)?(?: and " + NUM + r" seconds)?")
_V0_CAN_USE = lazy(r"the current vLLM instance can use total_gpu_memory \(" + NUM + GI + r"\) x "
                         r"gpu_memory_utilization \(" + NUM + r"\) = " + NUM + GI)
_V0_TAKE = lazy(r"model weights take " + NUM + GI + r"; non_torch_memory takes " + NUM + GI
                      + r"; PyTorch activation peak memory takes " + NUM + GI
                      + r"; the rest of the memory reserved for KV Cache is " + NUM + GI)
_V0_064 = lazy(r"Memory profiling results: (?P<kv>(?:\w+=\d+(?:\.\d+)?(?:GiB|Gib|GB)?\s*)+)")
_V0_TABLE = lazy(
    r"(?P<k>total_gpu_memory|gpu_memory_utilization|the current vLLM instance can use|model weights take|"
    r"non_torch_memory(?: takes)?|PyTorch activation peak memory(?: takes)?|available_kv_cache_memory|"
    r"duration)\s+" + NUM + r"\s*(?:GiB|Gib|GB|seconds)?\s*$")
_TABLE_WORDS = lazy(r"total_gpu_memory|gpu_memory_utilization|vLLM instance can use|model weights take|"
                          r"non_torch_memory|activation peak memory|available_kv_cache_memory|duration")
_PROFILE_TIME = lazy(r"Memory profiling takes " + NUM + r" seconds")
#: the pool's block line. V0's executor_base.py (0.7-0.10) logs "# %s blocks: %d, # CPU blocks: %d" with the
#: platform's ``device_name`` (platforms/*.py, read in the 0.11.0 wheel: cuda, rocm, cpu, tpu, xpu; the HPU and
#: Ascend plugins: hpu, npu); a "CPU blocks" after ", # " is that line's swap count, never the CPU backend's own
#: pool ("# CPU blocks: N" alone, 0.4-0.6): a device word this list lacks must not turn its swap count into a pool
_BLOCKS = lazy(r"(?:#\s*)?\b(GPU|CUDA|cuda|rocm|ROCm|XPU|HPU|NPU|TPU|xpu|hpu|npu|tpu|neuron|cpu|(?<!, # )CPU) "
               r"blocks: (\d+)(?:, # CPU blocks: (\d+))?")
#: the CPU backend's KV space (GiB) when VLLM_CPU_KVCACHE_SPACE is not set: its default, said by a warning
#: (executor/cpu_executor.py 0.4-0.6 "(GB)", platforms/cpu.py 0.7-0.11 "(GiB) ... using 4 by default"), or the size
#: 0.14 chose from the free host memory and printed (format_gib: 0.01 GiB). A set value is never logged
_HPU_BUDGET = lazy(r"Free device memory: " + NUM + r" ?GiB, " + NUM + r" ?GiB usable \(gpu_memory_utilization=" + NUM +
                   r"\), " + NUM + r" ?GiB reserved for HPUGraphs")
_CPU_SPACE = lazy(r"VLLM_CPU_KVCACHE_SPACE \(Gi?B\) for CPU backend is not set, using (\d+) by default|"
                  r"VLLM_CPU_KVCACHE_SPACE not set\. Using " + NUM + r" GiB for KV cache")
_NUM_BLOCKS = lazy(r"num_gpu_blocks is: (\d+)")
#: where engine/llm_engine.py logs its "# GPU blocks" line in each 0.2-0.3 release (the logger's ``file:line``,
#: read in the wheels): the line number tells the release where the banner names none (0.2.6 and 0.2.7 print the
#: same banner; only 0.2.7 raises when the pool is shorter than max_seq_len)
_LLM_ENGINE_AT = lazy(r"\bllm_engine\.py:(\d+)\]")
_LLM_ENGINE_BLOCK_LINE = {205: ((0, 2, 0), (0, 2, 0)), 207: ((0, 2, 1), (0, 2, 2)), 222: ((0, 2, 3), (0, 2, 5)),
                          223: ((0, 2, 6), (0, 2, 6)), 275: ((0, 2, 7), (0, 2, 7)), 322: ((0, 3, 0), (0, 3, 0)),
                          337: ((0, 3, 1), (0, 3, 2)), 357: ((0, 3, 3), (0, 3, 3))}
_TOKENS = lazy(r"(?:GPU|[A-Z]+(?: \+ host)?) KV cache size: ([\d,]+) tokens")
_CONCURRENCY = lazy(r"Maximum concurrency for ([\d,]+) tokens per request: " + NUM + r"x")
_AVAILABLE = lazy(r"Available KV cache memory: " + NUM + r" GiB")
_FREE_ON_DEVICE = lazy(r"Free memory on device (?:\S+ )?\(" + NUM + r"/" + NUM + r" GiB\) on startup")
_DESIRED = lazy(r"[Dd]esired (?:[A-Z]+ )?memory utilization(?: is)? \(" + NUM + ", "
                      + NUM + r" GiB\)")
_ACTUAL = lazy(r"Actual usage is " + NUM + r" GiB for weight, " + NUM + r" GiB for peak activation, " + NUM
                     + r" GiB for non-torch memory, and " + NUM + r" GiB for CUDAGraph memory")
_ACTUAL_CONSUMED = lazy(r"Actual usage is " + NUM + r" GiB for consumed memory \(weights \+ non-torch\), " + NUM
                              + r" GiB for peak activation, and " + NUM + r" GiB for CUDAGraph memory")
_ACTUAL_PLUGIN = lazy(r"Actual usage: " + NUM + r" GiB for weights, " + NUM + r" GiB for peak activation, " + NUM
                            + r" GiB for non-torch memory(?:, " + NUM + r" GiB for [A-Z]+ graph memory)?")
_EXTERNAL = lazy(r"Weights are held outside this process: of the " + NUM + r" GiB utilization budget, " + NUM
                       + r" GiB is externally held and " + NUM + r" GiB remains")
_AUTOFIT = lazy(r"Auto-fit max_model_len: reduced from (\d+) to (\d+) to fit in available (?:GPU|KV cache) memory "
                      r"\((?:" + NUM + r" GiB available for KV cache|" + NUM + r" GiB GPU(?: \+ " + NUM + r" GiB host)?)\)")
_AUTOFIT_FULL = lazy(r"Auto-fit max_model_len: full model context length (\d+) fits")
_HYBRID_BLOCK = lazy(r"Setting attention block size to (\d+) tokens to ensure that attention page size is >= "
                           r"mamba page size")
_MAMBA_PAD = lazy(r"Padding mamba page size by " + NUM + r"%")
#: config/cache.py (0.6+): "Using fp8_e4m3 data type to store kv cache. It reduces the GPU memory footprint ..."
_KV_DTYPE_LINE = lazy(r"Using (\w+) data type to store kv cache")
# quantization/kv_cache.py process_weights_after_loading (0.7.3 .. 0.27.1 at least): warned only when the KV cache is
# quantized (is_quantized_kv_cache) to a non-e5m2 fp8 and the checkpoint gave no k/v scales, so it names the KV dtype
# v1/core/kv_cache_utils.py: unify_hybrid_kv_cache_specs (0.10+) and, 0.2x, the page-size fallback both size every
# sliding-window layer as full attention (the hybrid manager off, whatever the args said)
_SLIDING_AS_FULL = lazy(r"Hybrid KV cache manager is disabled for this hybrid model|KV cache page sizes cannot be "
                        r"unified; treating sliding-window layers as full attention")
_KV_SCALE_DEFAULT = lazy(r"Using KV cache scaling factor 1\.0 for (fp8_e4m3)\b")
#: V1 gpu_worker.py determine_available_memory at DEBUG (0.9-0.2x, read in the 0.19.0 wheel): the request, the
#: init snapshot (utils/mem_utils.py MemorySnapshot.__repr__: "... free_memory=F GiB, total_memory=T GiB, ...") and
#: MemoryProfilingResult.__repr__ ("Memory profiling takes S seconds. Total non KV cache memory: A GiB; torch peak
#: memory increase: B GiB; non-torch forward increase memory: C GiB; weights memory: D GiB.")
_DEBUG_REQUESTED = lazy(r"Initial free memory: " + NUM + r" GiB; Requested memory: " + NUM + r" \(util\), " + NUM
                        + r" GiB")
_SNAPSHOT_TOTAL = lazy(r"free_memory=" + NUM + r"\s?GiB, total_memory=" + NUM + r"\s?GiB")
_PROFILE_RESULT = lazy(r"Total non KV cache memory: " + NUM + r"\s?GiB; torch peak memory increase: " + NUM
                       + r"\s?GiB; non-torch forward increase memory: " + NUM + r"\s?GiB; weights memory: " + NUM
                       + r"\s?GiB")
_MAMBA_MODE = lazy(r"Mamba cache mode is set to '(\w+)'")
_CHUNKED = lazy(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_PADDING_LAYERS = lazy(r"Add (\d+) padding layers, may waste at most " + NUM + r"% KV cache memory")
_ESTIMATED_LEN = lazy(r"the estimated maximum model length is (\d+)")
#: 0.26+ "Current kv cache memory in use is X GiB." (gpu_worker.py); vllm-ascend's worker.py "Current KV cache
#: memory: X GiB." (its 0.26+-style summary, corpus vllm_c018)
_KV_IN_USE = lazy(r"Current (?:kv|KV) cache memory(?: in use is|:) " + NUM + " GiB")
# the two budgets the suggestion line offers, in bytes (gpu_worker.py compile_or_warm_up_model, 0.10.2+)
# (the first can be negative: 0.26+ counts the captured graphs twice, vllm#57936; corpus vllm_c019)
_SUGGESTED = lazy(r"`--kv-cache-memory=(-?\d{1,16})`(?: \(-?[\d.]+ GiB\))? to fit into requested memory, or "
                        r"`--kv-cache-memory=(-?\d{1,16})`")
# the persisted startup plan (v1/worker/startup_plan.py, VLLM_ENABLE_STARTUP_PLAN=1; read in the 0.26.0 wheel): a
# plan applied sets kv_cache_memory_bytes from a file, so the KV size is the plan's, not --kv-cache-memory-bytes's
_PLAN_APPLIED = lazy(r"Applying persisted startup plan \(fingerprint (\w+)\): kv_cache_memory_bytes=(\d+) \(" + NUM
                     + r" GiB\), recorded free-memory baseline " + NUM + r" GiB, current " + NUM + r" GiB")
_PLAN_NOT_APPLIED = lazy(r"Startup plan not applied: current free memory \(" + NUM + r" GiB\) is below the recorded "
                         r"baseline \(" + NUM + r" GiB\)")
#: what the server prints once it serves (kvaudit.parse.request_time.SERVING: uvicorn's lines, the periodic stats)
_SERVING = SERVING[ENGINE]
_PLAN_SAVED = lazy(r"Saved startup plan to (\S+)")
_PLAN_UNREADABLE = lazy(r"Ignoring unreadable startup plan (\S+)")
_KV_BYTES = lazy(r"reserved " + NUM + r"\s?GiB memory for KV Cache as specified by kv_cache_memory_bytes")
_GRAPH = lazy(r"Graph capturing finished in " + NUM + r" secs(?:, took " + NUM + r" GiB)?")
_GRAPH_EST = lazy(r"Estimated CUDA graph memory: " + NUM + r" GiB total")
_GRAPH_POOL = lazy(r"(?:CUDA|ACL|NPU|XPU|HPU) graph pool memory: " + NUM + r" GiB \(actual\), " + NUM + r" GiB \(estimated\)")
#: 0.18-0.19 note while the estimate is opt-in (v1/worker/gpu_worker.py determine_available_memory, read in the 0.18.0
#: and 0.19.0 wheels): "In v0.19, CUDA graph memory profiling will be enabled by default ... increase --gpu-memory-utilization
#: from %.4f to %.4f ...", the second min(round(util + estimate / total, 4), 1.0); the estimate is not taken
#: from the budget then
_GRAPH_RAISE = lazy(r"increase --gpu-memory-utilization from " + NUM + r" to " + NUM + r" to maintain the same "
                    r"effective KV cache size")
#: config/compilation.py adjust_cudagraph_sizes_for_mamba_cache (0.18.0 wheel; vllm#34094): "Capping cudagraph capture
#: sizes from max %d to %d to fit Mamba cache blocks (%d blocks available)" is printed only for a hybrid
#: Mamba/attention model, after its pool was sized (the blocks are KVCacheConfig.num_blocks)
_MAMBA_CAP = lazy(r"to fit Mamba cache blocks \((\d+) blocks available\)")
#: sleep mode (worker/worker.py 0.7-0.10; v1/worker/gpu_worker.py sleep, read in the 0.18.0 wheel): "Sleep mode freed
#: %s GiB memory, %s GiB memory is still in use." (freed: free after minus free before; in use: the device's total
#: minus its free memory after, every process on it). Printed after the startup, when the engine is put to sleep
_SLEEP = lazy(r"Sleep mode freed " + NUM + GI + r" memory, " + NUM + GI + r" memory is still in use")
_GRAPH_UTIL = lazy(r"--gpu-memory-utilization=" + NUM + r" is equivalent to --gpu-memory-utilization=" + NUM)
#: Failure kinds this grammar emits: no_kv_memory | max_len | profiling | kv_needed | mamba_blocks | engine_failed | oom
#: | free_memory
#: | exception (a traceback's final line; fatal only before the KV pool was sized)
_FAILURES = (
    (lazy(r"No available memory for the cache blocks"), "no_kv_memory"),
    (lazy(r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV "
                r"cache \((\d+)\)"), "max_len"),
    (lazy(r"Error in memory profiling"), "profiling"),
    # the number follows "max seq len (N)," on one line, or starts its own when a paste wrapped the message
    (lazy(r"(?:\(|^|[\s,])" + NUM + r" G(?:i)?B KV cache is needed, which is larger than the available KV "
                r"cache memory \(" + NUM + r" G(?:i)?B\)"), "kv_needed"),
    (lazy(r"on startup is less than desired GPU memory utilization"), "free_memory"),
    # config/compilation.py (vllm#34094; in the 0.20.0 and 0.27.1 wheels, not 0.19.0): after the pool was sized, FULL decode CUDA graphs
    # need one Mamba block per sequence, so max_num_seqs above the pool's block count stops the startup
    (lazy(r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)"), "mamba_blocks"),
    (lazy(r"EngineCore failed to start"), "engine_failed"),
    (lazy(r"CUDA out of memory"), "oom"),
    # a V0 worker's step raised (worker/worker_base.py execute_method, 0.4-0.10: "Error executing method %s. This
    # might cause deadlock in distributed execution." then ``raise``; 'X' quoted from 0.7; Ray and mp executors):
    # during startup the step is init_device, load_model, determine_num_available_blocks or initialize_cache, and
    # the engine stops; the exception follows in the traceback, often past an excerpt's end
    (lazy(r"Error executing method '?\w+'?\. This might cause deadlock"), "engine_failed"),
    # the same from a multiprocessing worker (executor/multiproc_worker_utils.py, 0.5-0.10: "Exception in worker
    # %s while processing method %s.")
    (lazy(r"Exception in worker \w+ while processing method \w+"), "engine_failed"),
)


_FAILURE_WORDS = ("No available memory", "max seq len", "Error in memory profiling", "KV cache is needed",
                  "less than desired GPU memory", "Mamba cache blocks", "EngineCore failed", "out of memory",
                  "Error executing method", "while processing method")


def _rank(text: str, upto: int) -> Rank:
    """The process tag nearest before ``upto`` (Ray may nest two). Worker tags name their place in the parallel
    layout (``Worker_TP3``, ``Worker_PP1_TP0``, ``Worker_DP1_TP0_EP1``, ``VllmWorker TP0``, ``VllmWorker rank=2``);
    the engine core, the API server and 0.31+'s ``MainProcess`` are the single process of a one-GPU server;
    a V0 ``VllmWorkerProcess`` or a Ray worker names no rank, only its pid."""
    tags = list(_TAG.finditer(text, 0, upto))
    if not tags:
        return SINGLE_RANK
    proc, pid = tags[-1].group("proc").strip(), int(tags[-1].group("pid"))
    parts = dict((k, int(v)) for k, v in re.findall(r"(?:^|[_\s])(PP|TP|DP|EP|PCP|DCP)(\d+)", proc))
    m = re.search(r"rank=(\d+)", proc)
    if m:
        parts.setdefault("TP", int(m.group(1)))
    if "TP" in parts:
        label = " ".join(f"{k}{parts[k]}" for k in ("DP", "PP", "TP") if k in parts)
        return Rank((parts.get("PP", 0), parts["TP"], parts.get("DP", 0)), label)
    if proc == "Worker":  # 0.10.2+: the one worker of a TP=1 multiprocess engine
        return SINGLE_RANK
    if proc.startswith(("EngineCore", "APIServer", "MainProcess")):
        return SINGLE_RANK
    return Rank((0, 1_000_000 + pid, 0), f"pid {pid}")  # a worker process that names no rank


def rank_of(text: str) -> Rank:
    """The rank a whole line's process tag names (SINGLE_RANK when it has none)."""
    return _rank(text, len(text))


def has_process_tag(text: str) -> bool:
    """Whether the line carries a vLLM process tag (``(Worker_TP0 pid=111)``, a redacted pid included)."""
    return _TAG.search(text) is not None


def dp_of(text: str) -> int | None:
    """The data-parallel index of an ``EngineCore_DPn``/``EngineCore_n`` tag (each DP engine has its own pool)."""
    m = re.search(r"\(EngineCore_(?:DP)?(\d+) " + _PID_KEY + r"=\d+\)", text)
    return int(m.group(1)) if m else None



@dataclass
class _Parsed:
    events: list[Event]
    clues: list[VersionRange]


#: what vLLM prints without its prefix: a traceback's exception (anywhere), and the lines after the first of a
#: multi-line profiling message (worker.py 0.6.x "Memory profiling takes ...\nthe current vLLM instance can use
#: ...\nmodel weights take ...", and the table rows of 0.6.4-0.7): one logger call, its first line prefixed
OWN_PREFIX = OwnPrefix(
    cast("re.Pattern[str]", _OWN),  # a LazyPattern: compiled on first use, a Pattern in every use
    bare=lambda e: isinstance(e, Reading) and any(rx.search(e.text) is not None
                                                  for rx in (_V0_TABLE, _V0_CAN_USE, _V0_TAKE)),
    anywhere=lambda e: isinstance(e, Failure) or (isinstance(e, Setting) and e.key == "worker_tag"),
)


def parse_line(line: Line) -> _Parsed:
    t, n = line.text, line.number
    ev: list[Event] = []
    clues: list[VersionRange] = []

    def rank_at(m: re.Match[str]) -> Rank:
        return _rank(t, m.start())

    def read(m: re.Match[str], pairs: Iterable[tuple[str, int]]) -> None:
        r = rank_at(m)
        for key, group in pairs:
            if m.group(group) is not None:
                ev.append(Reading(n, t, r, "target", key, float(m.group(group))))

    m = _BANNER.search(t) if "LLM engine " in t else None
    # the banner and the non-default args choose the model whose config.json check reads on the host: only the
    # engine's own logger lines count (the same words in another program's output, or an unquoted echo, do not)
    if m and not _OWN_PREFIX.search(t, 0, m.start()):
        return _Parsed([], [])
    if m:
        ver = m.group("ver")
        if ver is None:  # the pre-0.4 banner: V0, and a version no later than 0.3
            ev.append(Banner(n, t, None, m.group("kind") or "V0", _config(m.group("cfg"))))
            return _Parsed(ev, [_clue((0, 1, 0), (0, 3, 99), "banner without a version")])
        ev.append(Banner(n, t, ver, m.group("kind") or ("V0" if ver.startswith(("0.4", "0.5", "0.6")) else None),
                         _config(m.group("cfg"))))
        return _Parsed(ev, [_version_clue(ver)])
    m = _MB_WEIGHTS.search(t) if " MB" in t else None
    if m:  # the weights line in MiB (the wording as PR #3120 first printed it, before GB): GiB here
        ev.append(Reading(n, t, rank_at(m), "target", "weights_gib", float(m.group(1)) / 1024))
        return _Parsed(ev, [])  # no release printed it: it narrows no version
    m = _API.search(t) if "API server version" in t else None
    if m:
        return _Parsed([Banner(n, t, m.group("ver"), None, {})], [_version_clue(m.group("ver"))])
    m = _ART_BANNER.search(t) if "version " in t and "\u2588" in t else None
    if m:
        # the 0.2x ASCII-art banner (entrypoints/utils.py / api_utils.py): "... █  version 0.22.1rc1..."
        return _Parsed([Banner(n, t, m.group(1), None, {})], [_version_clue(m.group(1))])
    m = _ARGS.search(t) if "non-default args" in t else None
    if m and not _OWN_PREFIX.search(t, 0, m.start()):
        return _Parsed([], [])
    if m:
        try:
            args = literal(m.group("d"))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            args = {}
        return _Parsed([Banner(n, t, None, None, args if isinstance(args, dict) else {})],
                       [_clue((0, 10, 0), None, "'non-default args:' line")])
    for (rx, kind), word in zip(_FAILURES, _FAILURE_WORDS):
        if word not in t:
            continue
        m = rx.search(t)
        if m:
            nums = {}
            if kind == "max_len":
                nums = {"max_model_len": float(m.group(1)), "max_tokens": float(m.group(2))}
            elif kind == "kv_needed":
                nums = {"needed_gib": float(m.group(1)), "available_gib": float(m.group(2))}
                est = _ESTIMATED_LEN.search(t)
                if est:
                    nums["estimated_max_model_len"] = float(est.group(1))
                ml = re.search(r"max seq len \((\d+)\)", t)
                if ml:
                    nums["max_model_len"] = float(ml.group(1))
            elif kind == "mamba_blocks":
                nums = {"max_num_seqs": float(m.group(1)), "mamba_blocks": float(m.group(2))}
            elif kind == "oom":
                want = re.search(r"Tried to allocate " + NUM + r" (GiB|MiB)", t)
                free = re.search(r"of which " + NUM + r" (GiB|MiB) (?:is )?free", t)
                for key, mm in (("tried_gib", want), ("free_gib", free)):
                    if mm:
                        nums[key] = float(mm.group(1)) / (1024 if mm.group(2) == "MiB" else 1)
            elif kind == "free_memory":
                fm, d = _FREE_ON_DEVICE.search(t), _DESIRED.search(t)
                if fm:
                    nums.update(free_gib=float(fm.group(1)), total_gib=float(fm.group(2)))
                if d:
                    nums.update(util=float(d.group(1)), requested_gib=float(d.group(2)))
            clues = [_clue((0, 20, 0), None, "the Mamba-blocks ValueError (config/compilation.py, 0.20.0+)")
                     ] if kind == "mamba_blocks" else []
            if kind in ("kv_needed", "no_kv_memory") and "also controls CPU memory" in t:
                # v1/core/kv_cache_utils.py: the CPU-backend aside is in the 0.22.0 and 0.27.1 wheels, not 0.20.1's
                clues.append(_clue((0, 20, 2), None, "'also controls CPU memory' in the KV memory error"))
            if word in ("Error executing method", "while processing method"):
                nums = {"generic": 1.0, "wrapper": 1.0}  # the cause is the exception its traceback ends with
            return _Parsed([Failure(n, t, rank_at(m), "target", kind, _message(t, m.start()), nums)], clues)
    m = _WEIGHTS.search(t) if "took" in t else None
    if m:
        read(m, (("weights_gib", 1),))
        unit = "GB" if " GB" in m.group(0) else "GiB"
        if m.group(0).startswith("Loading model weights"):
            clues.append(_clue((0, 4, 0), (0, 7, 3), "'Loading model weights took'"))
        elif unit == "GB":
            clues.append(_clue((0, 8, 0), (0, 8, 2), "'Model loading took ... GB'"))
        elif " memory and" in m.group(0):
            clues.append(_clue((0, 12, 0), None, "'Model loading took ... GiB memory'"))
        else:
            clues.append(_clue((0, 8, 3), None, "'Model loading took ... GiB'"))
        return _Parsed(ev, clues)
    m = _V0_CAN_USE.search(t) if "vLLM instance can use" in t else None
    if m:
        read(m, (("total_gib", 1), ("util", 2), ("requested_gib", 3)))
        return _Parsed(ev, [_clue((0, 6, 5), (0, 10, 99), "V0 three-line profiling record")])
    m = _V0_TAKE.search(t) if "model weights take" in t and ";" in t else None
    if m:
        read(m, (("weights_gib", 1), ("non_torch_gib", 2), ("activation_gib", 3), ("kv_gib", 4)))
        return _Parsed(ev, [_clue((0, 6, 5), (0, 10, 99), "V0 three-line profiling record")])
    m = _V0_064.search(t) if "Memory profiling results: " in t else None
    if m:
        # 0.6.4: space-separated; 0.6.4.post1-0.6.5 builds: "duration=18.41 seconds, total_gpu_memory=...GiB, ..."
        kv = dict(re.findall(r"(\w+)=(-?\d+(?:\.\d+)?)(?!\d|\.\d)", t[m.start():]))
        r = rank_at(m)
        names = {"total_gpu_memory": "total_gib", "initial_memory_usage": "initial_used_gib",
                 "peak_torch_memory": "peak_torch_gib", "memory_usage_post_profile": "post_profile_gib",
                 "non_torch_memory": "non_torch_gib", "kv_cache_size": "kv_gib", "gpu_memory_utilization": "util"}
        ev += [Reading(n, t, r, "target", names[k], float(v)) for k, v in kv.items() if k in names]
        if "duration=" in t:
            return _Parsed(ev, [_clue((0, 6, 4), (0, 6, 5), "comma-separated 'Memory profiling results: duration=' "
                                                            "(0.6.4.post1-0.6.5 builds)")])
        return _Parsed(ev, [_clue((0, 6, 4), (0, 6, 4), "0.6.4 'Memory profiling results:' line")])
    m = _PROFILE_RESULT.search(t) if "Total non KV cache memory" in t else None
    if m:
        read(m, (("non_kv_gib", 1), ("activation_gib", 2), ("non_torch_gib", 3), ("weights_gib", 4)))
        return _Parsed(ev, [_clue((0, 9, 0), None, "V1 'Total non KV cache memory' (DEBUG)")])
    m = _DEBUG_REQUESTED.search(t) if "Requested memory" in t else None
    if m:
        read(m, (("init_free_gib", 1), ("util", 2), ("requested_gib", 3)))
        return _Parsed(ev, [_clue((0, 9, 0), None, "V1 'Requested memory: u (util)' (DEBUG)")])
    m = _SNAPSHOT_TOTAL.search(t) if "total_memory=" in t and "free_memory=" in t else None
    if m:
        read(m, (("total_gib", 2),))
        return _Parsed(ev, [])
    m = _KV_DTYPE_LINE.search(t) if "data type to store kv cache" in t else None
    if m:
        return _Parsed([Setting(n, t, "kv_cache_dtype", m.group(1))], [])
    m = _SLIDING_AS_FULL.search(t) if "sliding" in t or "Hybrid KV cache manager" in t else None
    if m:
        return _Parsed([Setting(n, t, "sliding_as_full", m.group(0))], [])
    m = _KV_SCALE_DEFAULT.search(t) if "KV cache scaling factor 1.0" in t else None
    if m:
        return _Parsed([Setting(n, t, "kv_cache_dtype", m.group(1))], [])
    m = _HPU_BUDGET.search(t) if "reserved for HPUGraphs" in t else None
    if m:
        # HabanaAI/vllm-fork hpu_worker.py / habana_worker.py determine_num_available_blocks (2024-2025): the HPU's
        # own budget (free device memory x gpu_memory_utilization, less VLLM_GRAPH_RESERVED_MEM); it names the
        # device, whose budget kvaudit does not model (reconcile.vllm.context.UNMODELLED_DEVICES)
        return _Parsed([Setting(n, t, "device", "hpu")], [])
    m = _CPU_SPACE.search(t) if "VLLM_CPU_KVCACHE_SPACE" in t else None
    if m:
        if m.group(1) is not None:
            return _Parsed([Setting(n, t, "cpu_kvcache_space", "default", float(m.group(1)))], [])
        return _Parsed([Setting(n, t, "cpu_kvcache_space", "chosen", float(m.group(2)))], [])
    m = _PROFILE_TIME.search(t) if "Memory profiling takes" in t else None
    if m:
        read(m, (("profile_s", 1),))
        return _Parsed(ev, [])
    m = _V0_TABLE.search(t) if len(t) < 400 and _TABLE_WORDS.search(t) else None
    if m:
        row_key = {"total_gpu_memory": "total_gib", "gpu_memory_utilization": "util",
                   "the current vLLM instance can use": "requested_gib", "model weights take": "weights_gib",
                   "available_kv_cache_memory": "kv_gib", "duration": "profile_s"}.get(m.group("k"))
        if row_key is None:
            row_key = "non_torch_gib" if m.group("k").startswith("non_torch") else "activation_gib"
        read(m, ((row_key, 2),))
        return _Parsed(ev, [])
    m = _AVAILABLE.search(t) if "Available KV cache memory" in t else None
    if m:
        read(m, (("kv_gib", 1),))
        return _Parsed(ev, [_clue((0, 9, 1), None, "'Available KV cache memory'")])
    m = _FREE_ON_DEVICE.search(t) if "Free memory on device" in t else None
    if m:
        read(m, (("init_free_gib", 1), ("total_gib", 2)))
        d = _DESIRED.search(t)
        if d:
            read(d, (("util", 1), ("requested_gib", 2)))
        a = _ACTUAL.search(t)
        if a:
            read(a, (("weights_gib", 1), ("activation_printed_gib", 2), ("non_torch_gib", 3), ("graph_gib", 4)))
            clues.append(_clue((0, 10, 2), (0, 27, 0), "'Actual usage is ... for weight' (0.10.2-0.27.0)"))
        a = _ACTUAL_PLUGIN.search(t)
        if a:  # hardware plugins (vllm-ascend): the graph memory captured (vllm-ascend: "NPU graph memory") last
            read(a, (("weights_gib", 1), ("activation_gib", 2), ("non_torch_gib", 3),
                    ("graph_gib", 4)))
        a = _ACTUAL_CONSUMED.search(t)
        if a:
            read(a, (("consumed_gib", 1), ("activation_printed_gib", 2), ("graph_gib", 3)))
            # seen in a real 0.27.1 startup (corpus vllm_c012); the 0.26 tag still prints "for weight"
            clues.append(_clue((0, 27, 0), None, "'Actual usage is ... for consumed memory' (0.27+)"))
        k = _KV_IN_USE.search(t)
        if k:
            read(k, (("kv_gib", 1),))
        k = _SUGGESTED.search(t)
        if k:
            read(k, (("suggest_fit_bytes", 1), ("suggest_full_bytes", 2)))
        return _Parsed(ev, clues or [_clue((0, 9, 1), None, "'Free memory on device' line")])
    m = _ACTUAL_PLUGIN.search(t) if "Actual usage: " in t else None
    if m:  # hardware plugins (vllm-ascend): the graph memory captured (vllm-ascend: "NPU graph memory") last; no version of vLLM itself follows from it
        read(m, (("weights_gib", 1), ("activation_gib", 2), ("non_torch_gib", 3), ("graph_gib", 4)))
        return _Parsed(ev, [])
    m = _EXTERNAL.search(t) if "held outside this process" in t else None
    if m:
        read(m, (("budget_gib", 1), ("external_weights_gib", 2), ("engine_budget_gib", 3)))
        return _Parsed(ev, [_clue((0, 32, 0), None, "'Weights are held outside this process' (0.32+)")])
    m = _AUTOFIT.search(t) if "Auto-fit" in t else None
    if m:
        fit_gib = m.group(3) or m.group(4)
        ev.append(AutoFit(n, t, int(m.group(1)), int(m.group(2)), float(fit_gib) if fit_gib else None,
                          float(m.group(5)) if m.group(5) else None))
        clue = (_clue((0, 33, 0), None, "'Auto-fit ... available KV cache memory' (0.33)") if m.group(4) is not None
                else _clue((0, 14, 0), (0, 30, 99), "'Auto-fit ... available GPU memory' (0.14-0.30)"))
        return _Parsed(ev, [clue])
    m = _AUTOFIT_FULL.search(t) if "Auto-fit" in t else None
    if m:
        ev.append(AutoFit(n, t, int(m.group(1)), int(m.group(1))))
        return _Parsed(ev, [_clue((0, 14, 0), None, "'Auto-fit max_model_len' line")])
    m = _HYBRID_BLOCK.search(t) if "mamba page size" in t else None
    if m:
        return _Parsed([HybridLayout(n, t, int(m.group(1)), None)], [])
    m = _MAMBA_PAD.search(t) if "Padding mamba page" in t else None
    if m:
        return _Parsed([HybridLayout(n, t, None, float(m.group(1)))], [])
    m = _MAMBA_MODE.search(t) if "Mamba cache mode" in t else None
    if m:
        return _Parsed([Setting(n, t, "mamba_cache_mode", m.group(1))], [])
    m = _CHUNKED.search(t) if "Chunked prefill" in t else None
    if m:
        return _Parsed([Setting(n, t, "max_num_batched_tokens", m.group(1))], [])
    m = _PADDING_LAYERS.search(t) if "padding layers" in t else None
    if m:
        return _Parsed([Setting(n, t, "padding_layers", m.group(1), float(m.group(2)))], [])
    m = _MAMBA_CAP.search(t) if "to fit Mamba cache blocks" in t else None
    if m:
        return _Parsed([Setting(n, t, "mamba_cache_blocks", m.group(1))], [])
    m = _PLAN_APPLIED.search(t) if "startup plan" in t else None
    if m:
        ev.append(Setting(n, t, "startup_plan", "applied", int(m.group(2)) / 2**30))
        read(m, (("plan_baseline_gib", 4), ("plan_free_gib", 5)))
        return _Parsed(ev, [])
    m = _PLAN_NOT_APPLIED.search(t) if "Startup plan" in t else None
    if m:
        ev.append(Setting(n, t, "startup_plan", "not applied"))
        read(m, (("plan_free_gib", 1), ("plan_baseline_gib", 2)))
        return _Parsed(ev, [])
    m = (_PLAN_SAVED.search(t) or _PLAN_UNREADABLE.search(t)) if "startup plan" in t else None
    if m:
        return _Parsed([Setting(n, t, "startup_plan", "saved" if "Saved" in m.group(0) else "unreadable")], [])
    m = _KV_BYTES.search(t) if "kv_cache_memory_bytes" in t else None
    if m:
        read(m, (("kv_bytes_config_gib", 1),))
        return _Parsed(ev, [_clue((0, 10, 2), None, "kv_cache_memory_bytes")])
    m = _GRAPH.search(t) if "Graph capturing finished" in t else None
    if m:
        read(m, (("graph_gib", 2),))
        return _Parsed(ev, [])
    m = _GRAPH_POOL.search(t) if "graph pool memory" in t else None
    if m:
        read(m, (("graph_gib", 1), ("graph_estimate_gib", 2)))
        return _Parsed(ev, [_clue((0, 18, 0), None, "CUDA graph pool memory line")])
    m = _GRAPH_EST.search(t) if "Estimated CUDA graph memory" in t else None
    if m:
        read(m, (("graph_estimate_gib", 1),))
        return _Parsed(ev, [_clue((0, 18, 0), None, "'Estimated CUDA graph memory'")])
    if "CUDA graph memory profiling is disabled" in t:  # 0.20+ WARNING: no estimate comes out of the budget
        return _Parsed([Reading(n, t, _rank(t, len(t)), "target", "graph_profiling_disabled", 1.0)],
                       [_clue((0, 20, 0), None, "'CUDA graph memory profiling is disabled' (0.20+)")])
    m = _SLEEP.search(t) if "Sleep mode freed" in t else None
    if m:
        read(m, (("sleep_freed_gib", 1), ("sleep_in_use_gib", 2)))
        return _Parsed(ev, [_clue((0, 7, 0), None, "sleep mode")])
    m = _GRAPH_RAISE.search(t) if "In v0.19, CUDA graph memory profiling will be enabled" in t else None
    if m:
        read(m, (("util", 1), ("suggested_util", 2)))
        return _Parsed(ev, [_clue((0, 18, 0), (0, 19, 99), "CUDA graph profiling 'In v0.19 ... will be enabled' note")])
    m = _GRAPH_UTIL.search(t) if "is equivalent to --gpu-memory-utilization" in t else None
    if m:
        read(m, (("util", 1), ("equiv_util", 2)))
        clue = (_clue((0, 20, 0), None, "CUDA graph profiling 'default since v0.21.0'") if "default since" in t
                else _clue((0, 18, 0), (0, 19, 99), "CUDA graph profiling opt-in note"))
        return _Parsed(ev, [clue])
    m = _TOKENS.search(t) if "KV cache size" in t else None
    if m:
        word = t[m.start():m.start() + 40].split(" KV cache size")[0]
        ev.append(KVTokens(n, t, int(m.group(1).replace(",", "")), word.split(" +")[0], "+ host" in word, dp_of(t)))
        if word.split(" +")[0] != "GPU" or "+ host" in word:
            clues.append(_clue((0, 31, 0), None, f"'{word} KV cache size' (0.31+)"))
        c = _CONCURRENCY.search(t)
        if c:
            ev.append(Concurrency(n, t, int(c.group(1).replace(",", "")), float(c.group(2))))
        return _Parsed(ev, clues + [_clue((0, 8, 0), None, "'GPU KV cache size: N tokens'")])
    m = _CONCURRENCY.search(t) if "Maximum concurrency" in t else None
    if m:
        ev.append(Concurrency(n, t, int(m.group(1).replace(",", "")), float(m.group(2))))
        # a length under 1,000 prints the same with or without the separator (f"{n:,}" of 128 is "128"): no clue
        if "," in m.group(1):
            return _Parsed(ev, [_clue((0, 8, 0), None, "thousands separator in 'Maximum concurrency'")])
        return _Parsed(ev, [_clue((0, 6, 3), (0, 10, 99), "'Maximum concurrency' with a raw integer")]
                       if int(m.group(1)) >= 1000 else [])
    # which pattern matched is told by the match kept, not by comparing m.re with a pattern (the patterns are
    # compiled lazily: m.re is the compiled one, never the module's LazyPattern)
    num = _NUM_BLOCKS.search(t) if "num_gpu_blocks" in t else None
    blocks_m = None if num else (_BLOCKS.search(t) if "blocks: " in t else None)
    m = num or blocks_m
    if m:
        cpu = int(blocks_m.group(3)) if blocks_m is not None and blocks_m.group(3) else None
        word = blocks_m.group(1) if blocks_m is not None else "GPU"
        device = "cpu" if word in ("cpu", "CPU") else word
        count = int(num.group(1)) if num is not None else int(blocks_m.group(2))  # type: ignore[union-attr]
        ev.append(Blocks(n, t, rank_at(m), "target", count, cpu, device))
        if word == "CPU":  # executor/cpu_executor.py (0.4-0.6): the CPU backend's pool, "# CPU blocks: %d" alone
            clues.append(_clue((0, 4, 0), (0, 6, 99), "the CPU backend's '# CPU blocks' line alone"))
        elif blocks_m is not None and "CPU blocks" not in t:
            clues.append(_clue((0, 6, 4), (0, 7, 99), "V1 '# GPU blocks' without CPU blocks"))
        elif "# cuda blocks" in t:
            clues.append(_clue((0, 7, 3), (0, 10, 99), "'# cuda blocks'"))
        elif "# rocm blocks" in t:  # the same executor_base.py line on ROCm (device_name "rocm")
            clues.append(_clue((0, 7, 3), (0, 10, 99), "'# rocm blocks'"))
        elif "# CUDA blocks" in t:
            clues.append(_clue((0, 7, 0), (0, 7, 2), "'# CUDA blocks'"))
        at = _LLM_ENGINE_AT.search(t, 0, m.start())
        if at and int(at.group(1)) in _LLM_ENGINE_BLOCK_LINE:
            lo, hi = _LLM_ENGINE_BLOCK_LINE[int(at.group(1))]
            clues.append(_clue(lo, hi, f"'# GPU blocks' logged at llm_engine.py:{at.group(1)}"))
        return _Parsed(ev, clues)
    m = _EXCEPTION.match(_after_prefix(t)) if "Error" in t or "Exception" in t else None
    if m:
        msg = m.group("msg")
        return _Parsed([Failure(n, t, _rank(t, len(t)), "target", "exception",
                                quote(f"{m.group('exc')}: {msg}"), {"generic": float(_generic_wrapper(msg))})], [])
    m = _CORE_ERROR.search(t) if "ERROR" in t and "EngineCore" in t else None
    if m:
        # the engine core logs at ERROR from core.py only when it dies (run_engine_core's handler: "EngineCore
        # failed to start." / "EngineCore encountered a fatal error.", then the traceback): a line of it, even cut
        # short where an excerpt ends, is the failure; traceback frames are not quoted
        msg = t[m.end():].strip()
        if not msg.startswith(("File ", "Traceback", "^", "~", "raise ", "return ", "self.", "|")) and not t[
                m.end():m.end() + 2].startswith("  "):
            return _Parsed([Failure(n, t, _rank(t, len(t)), "target", "engine_failed",
                                    quote(msg or "(an EngineCore ERROR line, cut short)"), {"generic": 1.0})], [])
    if "Worker_" in t and has_process_tag(t):
        r = rank_of(t)
        if "TP" in r.label:  # any line of a tagged worker: the rank exists, whatever the line says
            return _Parsed([Setting(n, t, "worker_tag", r.label)], [])
    return _Parsed([], [])


#: the exception a Python traceback ends with, as vLLM's processes print it (after the process tag and level)
#: an ERROR line of the engine core's own handler (v1/engine/core.py run_engine_core, 0.8+)
_CORE_ERROR = lazy(r"\(EngineCore[^()]*" + _PID_KEY + r"=\d+\)\s+ERROR\s+[\d-]+ [\d:.]+ \[core\.py:\d+\]")
_EXCEPTION = lazy(r"(?:[\w.]+\.)?(?P<exc>[A-Z]\w*(?:Error|Exception)): (?P<msg>.+)")
_LINE_PREFIX = lazy(r"^(?:\([^()]*?" + _PID_KEY + r"=\d+(?:,\s*ip=[^()\s]+)?\)\s*)?(?:(?:INFO|WARNING|ERROR|CRITICAL|DEBUG)\s+[\d-]+ [\d:.]+ "
                          r"\[[^\]]*\]\s?)?")
#: exceptions that only wrap the cause printed above them: the quote prefers the cause
_WRAPPERS = ("See root cause above", "validation error for", "Error raised in subprocess", "non-zero exit status",
             "Engine core initialization failed")


def _after_prefix(text: str) -> str:
    """The message after a paste's quote bar (``▎``, ``│``, ``>``), the process tag, the level and the
    ``[file.py:N]`` location (a traceback's exception line has nothing before it but these)."""
    text = _PASTE_BAR.sub("", text, count=1)
    m = _LINE_PREFIX.match(text)
    return text[m.end() if m else 0:]


_PASTE_BAR = lazy(r"^[\s\u258e\u2502\u2503|>]+")


def _generic_wrapper(msg: str) -> bool:
    return any(w in msg for w in _WRAPPERS)


def _message(text: str, start: int) -> str:
    """The error as the engine wrote it: from the start of the message (after the ``[file.py:N]`` prefix)."""
    prefix = text.rfind("] ", 0, start)
    return quote(_PASTE_BAR.sub("", text[prefix + 2 if prefix >= 0 else 0:], count=1))


_NESTED_CONFIG = lazy(r"(\w+)=[A-Z]\w*\(")


def _config(text: str, depth: int = 0) -> dict[str, Any]:
    """The banner's ``key=value, ...`` config (model='...', dtype=torch.bfloat16, tensor_parallel_size=8...).
    A nested ``key=Name(...)`` value (``speculative_config=SpeculativeConfig(method='dflash',
    model='/models/drafter', num_spec_tokens=15)``, 0.10+) is read as its own dict: its ``model`` is the draft's,
    never the engine's."""
    out: dict[str, Any] = {}
    flat, i = [], 0
    while depth < 3:
        m = _NESTED_CONFIG.search(text, i)
        if m is None:
            break
        level, end = 0, len(text)
        for k in range(m.end() - 1, len(text)):
            level += {"(": 1, ")": -1}.get(text[k], 0)
            if level == 0:
                end = k
                break
        out[m.group(1)] = _config(text[m.end():end], depth + 1)
        flat.append(text[i:m.start()])
        i = end + 1
    flat.append(text[i:])
    text = "".join(flat)
    for k, v in re.findall(r"(\w+)=('[^']*'|\"[^\"]*\"|[^,]+)", text):
        if k in out:
            continue
        v = v.strip()
        try:
            out[k] = literal(v)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            out[k] = v
    return out


def _version_clue(ver: str) -> VersionRange:
    from kvaudit.versions import parse_version

    try:
        v = parse_version(ver)
    except ValueError:
        return VersionRange((0, 1, 0), None)
    return VersionRange(v[:3], v[:3], (f"version banner v{ver}",))


class VLLMParser(VLLMWords):
    def parse(self, lines: Iterable[Line]) -> list[Startup]:
        startups: list[Startup] = []
        events: list[Event] = []
        clues: list[VersionRange] = []
        first = last = 0
        config: dict[str, Any] = {}
        seen_memory = False
        tags_seen: set[str] = set()
        aside: list[str] = []  # args lines read as no start's, said on the next startup

        def flush() -> None:
            # a traceback's exception is any Python program's: it makes a vLLM startup only beside vLLM's banner
            own = [e for e in events if not isinstance(e, Banner)
                   and not (isinstance(e, Failure) and e.kind == "exception")]
            if own or (any(isinstance(e, Banner) for e in events) and any(isinstance(e, Failure) for e in events)):
                era = resolve(clues, VersionRange((0, 2, 0), None))
                path = config.get("model")
                startups.append(Startup(ENGINE, len(startups) + 1, first, last, dict(config), tuple(events), era,
                                        path if isinstance(path, str) else None, set_aside=tuple(aside)))
                aside.clear()

        rows: list[tuple[Line, _Parsed]] = []
        serving: list[int] = []  # the lines a server prints once it serves (request_time.SERVING)
        end = 0  # the input's last line: a startup's window runs to the next one's start, the last to the end, so
        # a memory line after its last event (a sleep-mode line, a summary kvaudit does not read) is still listed
        for line in lines:
            end = line.number
            if _SERVING.search(line.text, 0, SERVING_WITHIN) is not None:
                serving.append(line.number)
            p = parse_line(line)
            p.events = unquoted(line, p.events, lambda masked: parse_line(masked).events)
            if p.events:  # else nothing, or engine-looking text only inside a quoted value (a prompt, a path)
                rows.append((line, p))
        own, dropped = anchored([(line, p.events) for line, p in rows], OWN_PREFIX)
        for (line, p), kept in zip(rows, own):
            if not kept:
                continue  # the engine's words without its prefix, in a log whose lines carry it: not its line
            p.events = kept
            tags = [e for e in kept if isinstance(e, Setting) and e.key == "worker_tag"]
            if tags and len(tags) == len(kept):
                if all(e.value in tags_seen for e in tags):
                    continue  # a rank already named: one line per rank is enough
                tags_seen.update(e.value for e in tags)
            banner = next((e for e in p.events if isinstance(e, Banner)), None)
            # a new start: a banner once memory lines were seen, or a second weight load on the same rank
            restart = banner is not None and seen_memory
            # or, in an excerpt with no banner between two runs, a "KV cache is needed" error whose available
            # memory is not the KV memory this rank already logged: one startup checks the budget it computed
            # (check_enough_kv_cache_memory is handed the same available_memory), so a different one is another run
            restart = restart or any(
                isinstance(f, Failure) and f.kind == "kv_needed" and "available_gib" in f.numbers and any(
                    isinstance(r, Reading) and r.key == "kv_gib" and r.rank == f.rank
                    and abs(r.value - f.numbers["available_gib"]) > 0.015 for r in events)
                for f in p.events)
            if restart:
                last = max(last, line.number - 1)
                flush()
                events, clues, config, seen_memory = [], [], {}, False
            if (banner is not None and banner.version and not banner.config and events
                    and all(isinstance(e, Banner) and e.version is None for e in events)
                    and any(n < events[0].line for n in serving)):
                # the API server's version line opens a start and its args line follows it (api_server.py
                # run_server, 0.10+): args lines before it, after a server served, are no start's (a request can
                # print one); unread, and said on the start they stood before
                lines_aside = sorted({e.line for e in events})
                aside.append(f"non-default args line{'s' if len(lines_aside) != 1 else ''} "
                             f"{', '.join(map(str, lines_aside))} after the server served and before the next start's "
                             "version line w" + ("ere" if len(lines_aside) != 1 else "as") + " not read: vLLM prints "
                             "its args after its version line, so these are text a request wrote into the log")
                events, clues, config = [], [], {}
            if not events:
                first = line.number
            last = line.number
            events.extend(p.events)
            clues.extend(p.clues)
            if banner is not None:
                config.update(banner.config)
            elif not all(isinstance(e, Setting) for e in p.events):
                seen_memory = True  # a setting the API server states before the engine's banner starts nothing
        last = max(last, end)
        flush()
        if events and startups and all(isinstance(e, Banner) for e in events) and not any(
                "version" in (e.text or "") and isinstance(e, Banner) and e.version for e in events):
            # a pasted excerpt with the args line after the memory lines (no version banner): the args belong
            # to the startup above; keys it already has stay as they are. Only an args line printed before that
            # startup serves: vLLM logs its args once, before the engine starts (api_server.py run_server), so one
            # after a serving line is the running server's output (text a request wrote), never its startup's
            prev = startups[-1]
            served = next((n for n in serving if n > prev.first_line), None)
            late: dict[str, Any] = {}
            for e in events:
                if isinstance(e, Banner) and (served is None or e.line < served):
                    late.update(e.config)
            if late:
                merged = {**late, **(prev.server_args or {})}
                path = merged.get("model")
                startups[-1] = replace(prev, server_args=merged, model_path=path if isinstance(path, str) else None)
        return with_unprefixed(startups, dropped)
