"""TensorRT-LLM startup-log grammar: the PyTorch backend (``tensorrt_llm/_torch/pyexecutor``) and the C++
runtime / TensorRT engine path (``cpp/tensorrt_llm/batch_manager``), as served by ``trtllm-serve``, Triton's
``tensorrtllm_backend``, Dynamo and the LLM API.

Format strings (shared reference §2.3 and its 2026 update; docs/trtllm-log-grammar.md has the table):

* PyTorch backend, ``_torch/pyexecutor/_util.py::KvCacheCreator`` (f-strings; GiB = 2**30, "GB" also GiB):
  "Use %.2f GB for model weights." (0.20: "Rank r uses %.2f GB for model weights."), "Memory used after
  loading model weights (inside torch|outside torch) in memory usage profiling: %.2f GiB", "Memory dynamically
  allocated during inference (inside torch) in memory usage profiling: %.2f GiB", "Memory used outside torch
  (e.g., NCCL and CUDA graphs) in memory usage profiling: %.2f GiB", the peak line in four variants ("Peak
  memory during memory usage profiling (torch + non-torch): P GiB, available KV cache memory when calculating
  max tokens: K GiB[, fraction is set F, kv size is B[. device total memory T GiB, , tmp kv_mem X GiB]]" and
  2026's "kv size per token is B bytes/token[ + M bytes fixed cost]. device total memory T GiB, temporary kv
  cache memory during profiling X GiB"), "Estimated max memory in KV cache : %.2f GiB" / "Estimated max
  tokens in KV cache : %d", the caps ("max_tokens=N is provided, max_memory is set to X GiB", 2026 "max_tokens=N
  is provided. It limits max memory to X GiB. New max_memory is set to Y GiB", "max_gpu_total_bytes=X GiB is
  provided, max_memory is set to Y GiB" / ". New max memory is Y GiB"), "Both free_gpu_memory_fraction and
  max_tokens are set (to F and N[ with free memory A of total memory B], respectively)" (A and B in units of
  4 GiB: an upstream bug divides by 2**32), "Reserving X GiB for the multimodal encoder cache while estimating
  KV cache capacity.", KV manager v2 "KV cache manager v2 device quota set to XGiB";
* C++ (``kvCacheManager.cpp``, ``trtGptModelInflightBatching.cpp``): "Number of tokens per block: %d.",
  "[MemUsageChange] Allocated %.2f GiB for max tokens in paged KV cache (%d).", "Memory usage when calculating
  max tokens in paged kv cache: total: %.2f GiB, available: %.2f GiB", "Number of blocks in KV cache primary
  pool[ for windowSize W]: %d", "... secondary pool ...", "Max KV cache pages|blocks per sequence: %d[ [window
  size=W]]", "Both freeGpuMemoryFraction (aka kv_cache_free_gpu_mem_fraction) and maxTokens (aka
  max_tokens_in_paged_kv_cache) are set (to %f and %ld, respectively).", "Loaded engine size: %d MiB",
  "[MemUsageChange] Allocated %.2f MiB for execution context memory.", "Allocated %s GPU memory for runtime
  buffers." / "for decoder." (KB/MB/GB in base 1024), pre-0.9 "Allocate %zu bytes for k/v cache." and "Using
  %d total tokens in paged KV cache, and %d blocks per sequence", 2024's "Max tokens in paged KV cache: %d.
  Allocating %zu bytes.", and the oldest (~0.5-0.8) "Using %d tokens in
  paged KV cache.";
* failures: "Executor creation failed", CUDA out of memory, "maxTokensInPagedKvCache (N) must be large enough
  to process at least 1 sequence to completion (i.e. must be larger than beam_width (B) * tokensPerBlock (T) *
  maxBlocksPerSeq (M))", "Impossib(l)e to fit in any sequence in kvCache", "Can't allocate new blocks",
  "Invalid freeMemFraction".

Prefixes: ``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [I]``, ``[TRT-LLM] [RANK N] [I]`` / ``[MPI_Rank N]``,
``[TRT-LLM] [I] [batchmgr][RANK 0]``, ``[TensorRT-LLM][INFO]`` (``[TensorRT-LLM][INFO][N]`` per rank), Triton's
``I0410 12:00:00.000000 1 file.cc:N]`` glog prefix, Dynamo's wrappers, and lines whose prefix the user
stripped: every pattern is searched anywhere in the line.
"""

from __future__ import annotations

import re
from typing import Iterable, cast

from kvaudit.parse.patterns import lazy
from kvaudit.parse.interface import (Event, Failure, OwnPrefix, Rank, RankEvent, Startup, anchored, numbered_rank, quote,
                                     unquoted, with_unprefixed)
from kvaudit.parse.lines import Line
from kvaudit.parse.vocabulary import TRTLLMWords
from kvaudit.versions import VersionRange, parse_version, resolve
from kvaudit.versions import clue as _clue
from kvaudit.record import record

ENGINE = TRTLLMWords.name

NUM = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


@record
class Banner(Event):
    version: str | None = None
    backend: str | None = None  # "pytorch" | "tensorrt" | "autodeploy"


@record
class ModelPath(Event):
    """The checkpoint directory (its config.json sizes the KV cache)."""

    path: str = ""


@record
class Reading(RankEvent):
    """One number from a memory line (GiB unless the key says otherwise): total_gib, peak_gib, available_gib,
    fraction, bytes_per_token, fixed_cost_bytes, tmp_kv_gib, weights_gib, weights_in_torch_gib,
    weights_outside_torch_gib, activation_gib, outside_torch_gib, estimated_kv_gib, estimated_tokens,
    cpp_total_gib, cpp_available_gib, tokens_per_block, primary_blocks, secondary_blocks, multimodal_gib,
    quota_gib, engine_gib, context_gib, buffers_gib, decoder_gib, max_seq_len, max_num_tokens, ..."""

    key: str = ""
    value: float = 0.0


@record
class KVAllocation(RankEvent):
    """``[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N).``: the pool the C++ manager
    allocated (the PyTorch backend logs it twice: the temporary profiling cache, then the final one)."""

    gib: float | None = None  # None: the line states tokens only ("Using N tokens in paged KV cache", pre-0.9)
    tokens: int = 0


@record
class Cap(RankEvent):
    """A user setting that bounds the pool: ``kind`` max_tokens | max_gpu_total_bytes | both_set (the
    fraction-and-max_tokens warning, also logged for the profiling cache and the estimate's write-back)."""

    kind: str = ""
    tokens: int | None = None
    limit_gib: float | None = None
    result_gib: float | None = None
    fraction: float | None = None


@record
class WindowPool(RankEvent):
    """Variable sliding-window attention (VSWA): one window size's share of the pool (C++ ``BlockManager``)."""

    window: int = 0
    max_tokens: int | None = None
    primary_blocks: int | None = None


@record
class WindowNote(RankEvent):
    """``Attention window size W exceeds upper bound N for available blocks. Reducing to N.`` and its follow-up
    ``Adjusted window size W to N in blocks_per_window`` (``resource_manager.py``
    ``_validate_and_adjust_attention_windows``, 1.0+): the window W is cut to N, the most tokens one sequence can
    hold in that window's pool (``get_max_atten_window_upper_bound``: the pool's blocks x tokens per block for
    beam width 1 without sink tokens)."""

    window: int = 0
    bound: int = 0


@record
class ComponentRow(RankEvent):
    """A row of the executor's OOM table under 'Previously created components and free GPU memory before/after
    creation (GiB):' (``py_executor_creator.py`` ``_maybe_explain_if_oom``, 1.0+): the free memory before and after
    one component was created, so ``before - after`` is what it took."""

    name: str = ""
    before_gib: float = 0.0
    after_gib: float = 0.0


@record
class WindowVector(RankEvent):
    """``Adjusted max_attention_window_vec to [w, ...]``: the attention window of each layer group after the cut;
    more than one distinct value is variable sliding-window attention (VSWA)."""

    windows: tuple[int, ...] = ()


_RANK = lazy(r"\[(?:RANK|MPI_Rank) (\d+)\]|\[TensorRT-LLM\]\[[A-Z]+\]\[(\d+)\]|\[batchmgr\]\[RANK (\d+)\]")
_VERSION = lazy(r"TensorRT[- ]LLM version: ([\w.+-]+)")
_ENGINE_VERSION = lazy(r"Engine version ([\w.+-]+) found in the config file")
_WEIGHTS = lazy(r"(?:Use|Rank \d+ uses) " + NUM + r" GB for model weights")
_PROFILE = lazy(r"Memory (used after loading model weights|used for model weights|dynamically allocated during "
                      r"inference|used outside torch) ?(\((?:inside|outside) torch\)|\(e\.g\., NCCL and CUDA graphs\))? "
                      r"in memory usage profiling: " + NUM + r" ?GiB")
_PEAK = lazy(r"Peak memory during memory usage profiling \(torch \+ non-torch\): " + NUM + r" GiB, available KV "
                   r"cache memory when calculating max tokens: " + NUM + r" GiB")
_FRACTION = lazy(r"fraction is set " + NUM)
_PERCENTAGE = lazy(r"KV Memory Percentage:\s*(\d+(?:\.\d+)?)\s*%")
_CONFIG_FRACTION = lazy(r"(?:kv_cache_)?free_gpu_mem(?:ory)?_fraction['\"]?\s*[=:]\s*['\"]?(0?\.\d+|1\.0*)\b")
_KV_SIZE = lazy(r"kv size (?:per token )?is (\d+)(?: bytes/token)?(?: \+ (\d+) bytes fixed cost)?")
_DEVICE_TOTAL = lazy(r"device total memory " + NUM + r" GiB")
_TMP_KV = lazy(r"(?:tmp kv_mem|temporary kv cache memory during profiling) " + NUM + r" GiB")
_ESTIMATED = lazy(r"Estimated max (memory|tokens) in KV cache ?: " + NUM)
_MAX_TOKENS_CAP = lazy(r"max_tokens=(\d+) is provided(?:, max_memory is set to " + NUM + r" GiB|\. It limits max "
                             r"memory to " + NUM + r" GiB\. New max_memory is set to " + NUM + r" GiB)")
# resource_manager.py KVCacheManager.calculate_max_num_blocks (PyTorch backend, 1.0+): kv_cache_config.max_tokens
# is set and free_gpu_memory_fraction is None, so the pool is max_tokens itself and no fraction applies to it.
# KvCacheCreator writes its profiling-cache size, then its estimate, into max_tokens, so the line is printed for
# either pass (the NVIDIA forum's gpt-oss-20b on 1.1.0rc3: 4,128 = the profiling cache)
# the C++ runtime's untagged rank lines: 'Detecting local TP group for rank 1', 'TP group is intra-node for rank 1'
# (runtime/worldConfig.cpp / ipcUtils, 0.1x C++ executor) and 'MPI size: 4, rank: 0' (mpiUtils, TP x PP ranks)
_RANK_LINE = lazy(r"(?:Detecting local TP group for rank|TP group is intra-node for rank|MPI size: (\d+), rank:) (\d+)")
_MAX_TOKENS_ONLY = lazy(r"max_tokens is set by kv_cache_config\.max_tokens: (\d+)")
_MAX_BYTES_CAP = lazy(r"max_gpu_total_bytes=" + NUM + r" ?GiB is provided(?:, max_memory is set to|\. New max "
                            r"memory is) " + NUM + r" GiB")
_BOTH = lazy(r"Both (?:free_gpu_memory_fraction|freeGpuMemoryFraction \(aka kv_cache_free_gpu_mem_fraction\)) and "
                   r"(?:max_tokens|maxTokens \(aka max_tokens_in_paged_kv_cache\)) are set \(to " + NUM + r" and (\d+)")
# "with free memory A of total memory B": A and B are bytes / 2**32 (4 GiB units) in the 1.x builds that print no
# unit (resource_manager.py calculate_max_num_blocks), GiB where "GiB" follows them (later builds)
_BOTH_FREE = lazy(r"with free memory " + NUM + r"(GiB)? of total memory " + NUM + r"(GiB)?")
# trtGptModelInflightBatching.cpp (encoder-decoder models): a self and a cross KV cache split the free memory
_ENC_DEC = lazy(r"This is an Encoder-Decoder model, set " + NUM + r" cross KV cache fraction")
_MULTIMODAL = lazy(r"Reserving " + NUM + r" GiB for the multimodal encoder cache")
_QUOTA = lazy(r"KV cache manager v2 device quota set to " + NUM + r" ?GiB")
_TOKENS_PER_BLOCK = lazy(r"Number of tokens per block: (\d+)")
_ALLOCATED = lazy(r"Allocated " + NUM + r" GiB for max tokens in paged KV cache \((\d+)\)")
_CPP_USAGE = lazy(r"Memory usage when calculating max tokens in paged kv cache: total: " + NUM + r" GiB, "
                        r"available: " + NUM + r" GiB")
_BLOCKS = lazy(r"Number of blocks in KV cache (primary|secondary) pool(?: for windowSize (\d+))?: (\d+)")
_PAGES = lazy(r"Max KV cache (?:pages|blocks) per sequence: (\d+)(?: \[window size=(\d+)\])?")
_ENGINE_SIZE = lazy(r"Loaded engine size: (\d+) MiB")
# TensorRT's memory tracker (the C++ runtime's TllmRuntime, every TensorRT release since 8.x): "[MemUsageChange]
# TensorRT-managed allocation in IExecutionContext creation: CPU +0, GPU +0, now: CPU 0, GPU 8163 (MiB)" (also "in
# engine deserialization"): what TensorRT holds on the GPU then, the deserialized engine (the corpus logs that
# print both: 869 MiB beside 'Loaded engine size: 875 MiB', trtllm_c017; 3405 beside 3404, trtllm_c015)
_TRT_MANAGED = lazy(r"TensorRT-managed allocation in (?:IExecutionContext creation|engine deserialization): CPU "
                    r"[+-]?\d+, GPU [+-]?\d+, now: CPU \d+, GPU (\d+) \(MiB\)")
_CONTEXT = lazy(r"Allocated " + NUM + r" MiB for execution context memory")
_BUFFERS = lazy(r"Allocated " + NUM + r" (B|KB|MB|GB) GPU memory for (runtime buffers|decoder)")
_OLD_ALLOC = lazy(r"Allocate (\d+) bytes for k/v cache")
# Triton's tensorrtllm_backend says which default it uses when the setting is absent
_FRACTION_DEFAULT = lazy(r"kv_cache_free_gpu_mem_fraction is not specified, will use default value of " + NUM)
# the 2024 batch manager (0.8-0.12 builds, shipped closed-source then; the shape is from dated logs: a Gemma 7B
# Triton startup, tensorrtllm_backend#456): the pool in tokens and its exact size in bytes
_MAX_TOKENS_BYTES = lazy(r"Max tokens in paged KV cache: (\d+)\. Allocating (\d+) bytes")
_OLD_TOKENS = lazy(r"Using (\d+) (?:total )?tokens in paged KV cache(?:, and (\d+) blocks per sequence)?")
_SEQ = lazy(r"max_seq_len=(\d+), max_num_requests=(\d+), max_num_tokens=(\d+)")
_WINDOW = lazy(r"Attention window size (\d+) exceeds upper bound (\d+) for available blocks")
_WINDOW_ADJUSTED = lazy(r"Adjusted window size (\d+) to (\d+) in blocks_per_window")
_WINDOW_VEC = lazy(r"Adjusted max_attention_window_vec to \[([\d, ]*)\]")
_SEQ_ADJUSTED = lazy(r"Adjusted max_seq_len to (\d+)")
# the runtime cuts the sequence length to what one sequence can hold in the pool (C++ trtGptModelInflightBatching.cpp,
# 0.1x: "... they are reduced to %d" from KVCacheManager::getMaxAttentionWindowUpperBound, later
# calculateMaxAttentionWindow; the early PyTorch backend's resource_manager.py: "They are reduced to"), and maxInputLen
# to one less
_SEQ_CUT = lazy(r"maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit in kvCache\. "
                r"[Tt]hey are reduced to (\d+)")
_INPUT_CUT = lazy(r"maxInputLen is reduced to (\d+)")
# a cross (encoder-decoder) cache has one window, rekeyed to max_seq_len (resource_manager.py)
_CROSS_WINDOW = lazy(r"Adjusted attention window size to (\d+) in blocks_per_window")
# the Python VSWA sizing (resource_manager.py, later builds; no release pinned): one line per window
_WINDOW_BLOCKS = lazy(r"Window size = (\d+), primary_blocks: (\d+), secondary_blocks: (\d+)")
_BACKEND = lazy(r"Using LLM with (PyTorch|TensorRT|AutoDeploy) backend")
# the AutoDeploy backend (_torch/auto_deploy/shim/ad_executor.py, _CacheManagerWithFakePool.calculate_max_num_blocks;
# 0.2x-1.2 builds): its caches are AutoDeploy's own layer-wise pools; the C++ KV cache manager it creates only keeps
# the page table, with head_dim=0, so that manager's pool line says 0.00 GiB for num pages x page size tokens
_AD_FAKE = lazy(r"Using fake cache manager with head_dim=0 and num pages:? (\d+)")
# resource_manager.py (2026 builds, NVIDIA/TensorRT-LLM#15182): "[kv cache manager] Primary/secondary blocks for
# window sizes set to {262146: (8256, 0)} for estimation dry run": the blocks of the temporary cache KvCacheCreator
# profiles with, per window; a pool of that many blocks is that cache, not the one the server runs with
_DRY_RUN = lazy(r"Primary/secondary blocks for window sizes set to \{\s*(\d+): \((\d+), (\d+)\)\s*\} for estimation "
                r"dry run")
#: Failure kinds this grammar emits: executor_failed | oom | oom_component | too_small | no_fit | no_blocks | bad_fraction | instance_failed
_FAILURES = (
    ("Executor creation failed", "executor_failed"),
    ("must be large enough to process at least 1 sequence", "too_small"),
    ("to fit in any sequence in kvCache", "no_fit"),
    ("No free blocks left", "no_blocks"),
    ("Invalid freeMemFraction", "bad_fraction"),
    ("out of memory", "oom"),
    ("OutOfMemoryError", "oom"),
    ("Failed to create instance", "instance_failed"),
)
GENERIC_FAILURES = ("oom", "instance_failed")
TELLS = ("[TRT-LLM]", "[TensorRT-LLM]", "tensorrt_llm", "TensorRT-LLM")
_SNAPSHOT = lazy(r"/[\w./-]*/models--[\w.-]+/snapshots/[0-9a-f]{7,64}/?")
_WINDOW_TOKENS = lazy(r"Primary maxTokens for windowSize (\d+): (\d+)")
_ALLOTTED = lazy(r"\.allottedPrimaryMemBytes=(\d+), \.allottedSecondaryMemBytes=(\d+)")
_SPEC = lazy(r"has_speculative_draft_tokens=(True|False)")
_COMPONENT = lazy(r"The following component could not be created: (.+)$")
_OOM_TABLE = lazy(r"(Total|Free) GPU memory (?:before component creation attempt )?\(GiB\): " + NUM)
# py_executor_creator.py _adjust_torch_mem_fraction (1.x, at the end of start-up): torch's allocator is capped at
# free + torch-reserved - 32 MiB, printed as a fraction of the device total and in GiB (full float precision)
_TORCH_CAP = lazy(r"Setting PyTorch memory fraction to " + NUM + r" \(" + NUM + r" GiB\)")
# the row names: 1.0's labels (trtllm_c019) and the final KV cache, which is created last; from 1.2 the table prints
# the ``ExecutorMemoryType`` values instead (``_torch/virtual_memory.py``: model, sampler, drafter,
# _no_capture_init_kv_cache, _no_capture_init_extra_resources, model_extra, ...; mlcommons/inference#2501)
_OOM_ROW = lazy(r"^\s*(Model|Sampler|Drafter|Initial KV cache \(temporary for KV cache size estimation\)|Additional "
                r"executor resources \(temporary for KV cache size estimation\)|KV cache|model|draft_model|"
                r"model_weights|draft_model_weights|sampler|drafter|guided_decoder|spec_resource_manager|"
                r"_no_capture_init_kv_cache|_no_capture_init_extra_resources|_no_capture_model_extra|model_extra|"
                r"executor_extra|kv_cache): " + NUM + r" / " + NUM + r"\s*$")
_TOO_SMALL = lazy(r"maxTokensInPagedKvCache \((\d+)\) must be large enough.*?beam_width \((\d+)\) \* tokensPerBlock "
                        r"\((\d+)\) \* maxBlocksPerSeq \((\d+)\)")
_BINARY = {"B": 1 / 2**30, "KB": 1 / 2**20, "MB": 1 / 2**10, "GB": 1.0}


def rank_of(text: str) -> Rank:
    return numbered_rank(_RANK.search(text))


def _message(text: str, start: int) -> str:
    """The error from its start (after the log prefix) to the end of the line."""
    cut = max(text.rfind("] ", 0, start), text.rfind("[E] ", 0, start))
    return quote(text[cut + 2 if cut >= 0 else 0:])


#: TensorRT-LLM's loggers: the C++ ``[TensorRT-LLM][INFO] `` (tensorrt_llm/common/logger.cpp), the Python
#: ``[12/01/2025-10:00:00] [TRT-LLM] [I] `` (tensorrt_llm/logger.py), TensorRT's ``[TRT] [I] ``, and Triton's
#: glog prefix (``I0306 16:40:07.708802 117 model_instance_state.cc:691] ``) for the backend's lines
_OWN = lazy(r"\[TensorRT-LLM\]|\[TRT-LLM(?: AUTO-DEPLOY)?\]|\[TRT\]|\b[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.]+:\d+\]")
#: what it prints without a prefix: a traceback's exception and the trtllm-serve wrapper's checkpoint path
#: (anywhere: the path is used only when it is the only one), the executor's OOM table rows (one logger call
#: over several lines) and trtllm-bench's summary table (printed) after its prefixed lines
OWN_PREFIX = OwnPrefix(
    cast("re.Pattern[str]", _OWN),  # a LazyPattern: compiled on first use, a Pattern in every use
    bare=lambda e: isinstance(e, ComponentRow) or isinstance(e, Reading) and (_OOM_TABLE.search(e.text) is not None
                                               or _PERCENTAGE.search(e.text) is not None
                                               or e.key == "args_fraction"),
    anywhere=lambda e: isinstance(e, (Failure, ModelPath)),
)


def parse_line(line: Line) -> tuple[list[Event], list[VersionRange]]:
    t, n = line.text, line.number
    rank = rank_of(t)
    ev: list[Event] = []

    def read(key: str, value: float | str | None) -> None:
        if value is not None:
            ev.append(Reading(n, t, rank, "target", key, float(value)))

    m = _VERSION.search(t) if "LLM version" in t else None
    if m:
        try:
            v = parse_version(m.group(1))[:3]
        except ValueError:
            return [], []
        return [Banner(n, t, m.group(1), None)], [VersionRange(v, v, (f"version banner v{m.group(1)}",))]
    m = _ENGINE_VERSION.search(t) if "Engine version" in t else None
    if m:  # the version that built the engine: the runtime that loads it is that version or newer
        try:
            v = parse_version(m.group(1))[:3]
        except ValueError:
            return [Banner(n, t, None, "tensorrt")], []
        return [Banner(n, t, None, "tensorrt")], [_clue(v, None, f"engine built by TensorRT-LLM {m.group(1)}")]
    m = _BACKEND.search(t) if "backend" in t else None
    if m:
        return [Banner(n, t, None, m.group(1).lower())], []
    m = _AD_FAKE.search(t) if "fake cache manager" in t else None
    if m:
        read("autodeploy_pages", m.group(1))
        return ev, []
    for word, kind in _FAILURES:
        if word in t:
            nums: dict[str, float] = {}
            if kind == "too_small":
                s = _TOO_SMALL.search(t)
                if s:
                    nums = {"max_tokens": float(s.group(1)), "beam_width": float(s.group(2)),
                            "tokens_per_block": float(s.group(3)), "blocks_per_sequence": float(s.group(4))}
            return [Failure(n, t, rank, "target", kind, _message(t, t.find(word)), nums)], []
    m = _SNAPSHOT.fullmatch(t.strip()) if "/snapshots/" in t else None
    if m:  # trtllm-serve prints the resolved checkpoint directory on a line of its own
        return [ModelPath(n, t, m.group(0))], []
    m = _COMPONENT.search(t) if "could not be created" in t else None
    if m:  # the executor's OOM table (py_executor_creator.py::_maybe_explain_if_oom), one line each
        return [Failure(n, t, rank, "target", "oom_component", m.group(1).strip(), {})], []
    m = _TORCH_CAP.search(t) if "PyTorch memory fraction" in t else None
    if m:
        read("torch_cap_fraction", m.group(1))
        read("torch_cap_gib", m.group(2))
        return ev, []
    m = _OOM_ROW.search(t) if " / " in t else None
    if m:
        return [ComponentRow(n, t, rank, "target", m.group(1), float(m.group(2)), float(m.group(3)))], []
    m = _OOM_TABLE.search(t) if "(GiB): " in t else None
    if m:
        read("oom_total_gib" if m.group(1) == "Total" else "oom_free_gib", m.group(2))
        return ev, []
    m = _PERCENTAGE.search(t) if "KV Memory Percentage" in t else None
    if m:
        # trtllm-bench's summary: the fraction the run used, in percent (bench/dataclasses/reporting.py)
        read("fraction", str(float(m.group(1)) / 100))
        return ev, []
    m = _CONFIG_FRACTION.search(t) if "free_gpu_mem" in t else None
    if m and t.startswith("model=") and "kv_cache_config=KvCacheConfig(" in t:
        # the body of the LLM API's "[TRT-LLM] [I] LLM Args:" message (1.x trtllm-serve), printed bare on the line
        # after its prefixed head: the configured fraction, weaker than the one the peak line states
        read("args_fraction", m.group(1))
        return ev, []
    if m and "Both" not in t:
        # the KvCacheConfig repr / Triton's parameter: free_gpu_memory_fraction=F, kv_cache_free_gpu_mem_fraction
        read("fraction", m.group(1))
        return ev, []
    m = _PEAK.search(t) if "Peak memory during memory usage profiling" in t else None
    if m:
        read("peak_gib", m.group(1))
        read("available_gib", m.group(2))
        f = _FRACTION.search(t)
        read("fraction", f.group(1) if f else None)
        k = _KV_SIZE.search(t)
        if k:
            read("bytes_per_token", k.group(1))
            read("fixed_cost_bytes", k.group(2))
        d = _DEVICE_TOTAL.search(t)
        read("total_gib", d.group(1) if d else None)
        x = _TMP_KV.search(t)
        read("tmp_kv_gib", x.group(1) if x else None)
        clues = []
        if k and "bytes/token" in k.group(0):
            clues.append(_clue((1, 2, 0), None, "'kv size per token is N bytes/token' (2026 builds)"))
        elif x and "temporary kv cache memory" in x.group(0):
            clues.append(_clue((1, 1, 0), None, "'temporary kv cache memory during profiling'"))
        elif x:
            clues.append(_clue((1, 0, 0), (1, 1, 99), "'tmp kv_mem' in the peak line (1.0-1.1 builds)"))
        elif not f:
            clues.append(_clue((0, 18, 0), (0, 21, 99), "the peak line without the fraction (2025 builds)"))
        return ev, clues
    m = _PROFILE.search(t) if "in memory usage profiling" in t else None
    if m:
        what, where = m.group(1), m.group(2) or ""
        if what.startswith("used after loading") or what.startswith("used for model weights"):
            key = "weights_outside_torch_gib" if "outside" in where else "weights_in_torch_gib"
        elif what.startswith("dynamically"):
            key = "activation_gib"
        else:
            key = "outside_torch_gib"
        read(key, m.group(3))
        return ev, []
    m = _WEIGHTS.search(t) if "for model weights" in t else None
    if m:
        read("weights_gib", m.group(1))
        return ev, ([_clue((0, 20, 0), (0, 20, 99), "'Rank r uses X GB for model weights' (0.20)")]
                    if "uses" in m.group(0) else [])
    m = _ESTIMATED.search(t) if "Estimated max" in t else None
    if m:
        read("estimated_kv_gib" if m.group(1) == "memory" else "estimated_tokens", m.group(2))
        return ev, []
    m = _MAX_TOKENS_CAP.search(t) if "max_tokens=" in t else None
    if m:
        limit = m.group(3) or m.group(2)
        ev.append(Cap(n, t, rank, "target", "max_tokens", int(m.group(1)), float(limit) if limit else None,
                      float(m.group(4) or m.group(2)) if (m.group(4) or m.group(2)) else None))
        return ev, []
    m = _RANK_LINE.search(t) if ("TP group" in t or "MPI size" in t) else None
    if m:  # a rank the runtime names without a rank tag: the ranks are at least that many
        read("mpi_size" if m.group(1) else "rank_named", m.group(1) or m.group(2))
        return ev, []
    m = _MAX_TOKENS_ONLY.search(t) if "is set by kv_cache_config" in t else None
    if m:  # resource_manager.py calculate_max_num_blocks (1.0+): max_tokens set, free_gpu_memory_fraction None
        read("max_tokens_only", m.group(1))
        return ev, []
    m = _MAX_BYTES_CAP.search(t) if "max_gpu_total_bytes=" in t else None
    if m:
        ev.append(Cap(n, t, rank, "target", "max_gpu_total_bytes", None, float(m.group(1)), float(m.group(2))))
        return ev, [_clue((1, 0, 0), None, "max_gpu_total_bytes (Jul 2025+)")]
    m = _BOTH.search(t) if "are set (to" in t else None
    if m:
        ev.append(Cap(n, t, rank, "target", "both_set", int(m.group(2)), None, None, float(m.group(1))))
        f = _BOTH_FREE.search(t)
        if f:
            read("both_free_gib", round(float(f.group(1)) * (1.0 if f.group(2) else 4.0), 4))
            read("both_total_gib", round(float(f.group(3)) * (1.0 if f.group(4) else 4.0), 4))
        return ev, []
    m = _ENC_DEC.search(t) if "Encoder-Decoder model" in t else None
    if m:
        read("cross_fraction", m.group(1))
        return ev, []
    m = _MULTIMODAL.search(t) if "multimodal encoder cache" in t else None
    if m:
        read("multimodal_gib", m.group(1))
        return ev, []
    m = _QUOTA.search(t) if "device quota" in t else None
    if m:
        read("quota_gib", m.group(1))
        return ev, [_clue((1, 2, 0), None, "KV cache manager v2 (2026)")]
    m = _DRY_RUN.search(t) if "for estimation dry run" in t else None
    if m:  # one window only: a VSWA dict (several windows) is not modelled
        read("dry_run_blocks", m.group(2))
        return ev, []
    m = _TOKENS_PER_BLOCK.search(t) if "tokens per block" in t else None
    if m:
        read("tokens_per_block", m.group(1))
        return ev, []
    m = _ALLOCATED.search(t) if "for max tokens in paged KV cache" in t else None
    if m:
        ev.append(KVAllocation(n, t, rank, "target", float(m.group(1)), int(m.group(2))))
        return ev, []
    m = _CPP_USAGE.search(t) if "Memory usage when calculating" in t else None
    if m:
        read("cpp_total_gib", m.group(1))
        read("cpp_available_gib", m.group(2))
        return ev, []
    m = _WINDOW_TOKENS.search(t) if "maxTokens for windowSize" in t else None
    if m:
        ev.append(WindowPool(n, t, rank, "target", int(m.group(1)), int(m.group(2)), None))
        return ev, [_clue((0, 18, 0), None, "per-window max tokens (VSWA)")]
    m = _ALLOTTED.search(t) if "allottedPrimaryMemBytes" in t else None
    if m:
        read("allotted_primary_gib", int(m.group(1)) / 2**30)
        read("allotted_secondary_gib", int(m.group(2)) / 2**30)
        if "for Cross KvCacheManager" in t:  # the encoder-decoder model's second cache (trtGptModelInflightBatching)
            read("cross_manager", 1)
        return ev, []
    m = _SPEC.search(t) if "has_speculative_draft_tokens" in t else None
    if m:
        read("speculative", 1.0 if m.group(1) == "True" else 0.0)
        return ev, []
    m = _BLOCKS.search(t) if "Number of blocks in KV cache" in t else None
    if m and m.group(2):
        ev.append(WindowPool(n, t, rank, "target", int(m.group(2)), None,
                             int(m.group(3)) if m.group(1) == "primary" else None))
        return ev, [_clue((0, 18, 0), None, "per-window block counts (VSWA)")]
    if m:
        read(f"{m.group(1)}_blocks", m.group(3))
        read("window_size", m.group(2))
        return ev, ([_clue((0, 18, 0), None, "per-window block counts (VSWA)")] if m.group(2) else [])
    m = _PAGES.search(t) if "per sequence:" in t else None
    if m:
        read("blocks_per_sequence", m.group(1))
        read("window_size", m.group(2))
        return ev, []
    m = _ENGINE_SIZE.search(t) if "Loaded engine size" in t else None
    if m:
        read("engine_gib", float(m.group(1)) / 1024)
        return ev, []
    m = _TRT_MANAGED.search(t) if "TensorRT-managed allocation" in t else None
    if m:
        read("trt_managed_gib", float(m.group(1)) / 1024)
        return ev, []
    m = _CONTEXT.search(t) if "execution context memory" in t else None
    if m:
        read("context_gib", float(m.group(1)) / 1024)
        return ev, []
    m = _BUFFERS.search(t) if "GPU memory for" in t else None
    if m:
        read("buffers_gib" if m.group(3) == "runtime buffers" else "decoder_gib",
             float(m.group(1)) * _BINARY[m.group(2)])
        return ev, []
    m = _FRACTION_DEFAULT.search(t) if "is not specified, will use default value of" in t else None
    if m:
        read("fraction", m.group(1))
        return ev, []
    m = _MAX_TOKENS_BYTES.search(t) if "Max tokens in paged KV cache" in t else None
    if m:
        ev.append(KVAllocation(n, t, rank, "target", int(m.group(2)) / 2**30, int(m.group(1))))
        return ev, [_clue((0, 8, 0), (0, 12, 99), "'Max tokens in paged KV cache: N. Allocating B bytes.' (2024 builds)")]
    m = _OLD_ALLOC.search(t) if "for k/v cache" in t else None
    if m:
        read("old_kv_bytes", m.group(1))
        return ev, [_clue((0, 1, 0), (0, 8, 99), "'Allocate N bytes for k/v cache' (pre-0.9 batch manager)")]
    m = _OLD_TOKENS.search(t) if "tokens in paged KV cache" in t else None
    if m:
        ev.append(KVAllocation(n, t, rank, "target", None, int(m.group(1))))
        if m.group(2):
            read("blocks_per_sequence", m.group(2))
            return ev, [_clue((0, 1, 0), (0, 8, 99), "'Using N total tokens in paged KV cache' (pre-0.9)")]
        # the oldest wording (~0.5-0.8, the C++ batch manager): the count before it is rounded up to whole
        # blocks at allocation (maintainer's answer in NVIDIA/TensorRT-LLM#224)
        return ev, [_clue((0, 1, 0), (0, 8, 99), "'Using N tokens in paged KV cache.' (~0.5-0.8)")]
    m = _SEQ.search(t) if "max_seq_len=" in t else None
    if m:
        read("max_seq_len", m.group(1))
        read("max_num_requests", m.group(2))
        read("max_num_tokens", m.group(3))
        return ev, []
    m = ((_WINDOW.search(t) if "exceeds upper bound" in t else None)
         or (_WINDOW_ADJUSTED.search(t) if "in blocks_per_window" in t else None))
    if m:  # the cut and its follow-up name the same window and bound
        ev.append(WindowNote(n, t, rank, "target", int(m.group(1)), int(m.group(2))))
        return ev, []
    m = _CROSS_WINDOW.search(t) if "in blocks_per_window" in t else None
    if m:
        read("cross_window", m.group(1))
        return ev, []
    m = _WINDOW_VEC.search(t) if "max_attention_window_vec" in t else None
    if m:
        ev.append(WindowVector(n, t, rank, "target",
                               tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x)))
        return ev, []
    m = _SEQ_CUT.search(t) if "are reduced to" in t else None
    if m:
        read("seq_cut", m.group(1))
        return ev, []
    m = _INPUT_CUT.search(t) if "maxInputLen is reduced" in t else None
    if m:
        read("input_cut", m.group(1))
        return ev, []
    m = _SEQ_ADJUSTED.search(t) if "Adjusted max_seq_len" in t else None
    if m:
        read("max_seq_len_adjusted", m.group(1))
        return ev, []
    m = _WINDOW_BLOCKS.search(t) if "primary_blocks: " in t else None
    if m:
        ev.append(WindowPool(n, t, rank, "target", int(m.group(1)), None, int(m.group(2))))
        return ev, []
    return [], []


class TRTLLMParser(TRTLLMWords):
    def parse(self, lines: Iterable[Line]) -> list[Startup]:
        startups: list[Startup] = []
        events: list[Event] = []
        clues: list[VersionRange] = []
        first = last = 0
        seen_memory = False

        def flush() -> None:
            # a generic failure ("out of memory", Triton's "Failed to create instance") is TensorRT-LLM's only
            # when its line or another line of the startup says so: another engine's OOM is not ours
            own = [e for e in events if not isinstance(e, (Banner, ModelPath)) and not (
                isinstance(e, Failure) and e.kind in GENERIC_FAILURES and not any(m in e.text for m in TELLS))]
            if own or (any(isinstance(e, Banner) for e in events) and any(isinstance(e, Failure) for e in events)):
                era = resolve(clues, VersionRange((0, 1, 0), None))
                # a bare path line is anyone's to print: two different ones leave the checkpoint unknown, so
                # that a line added to the log can hide the config but never choose it
                paths = {e.path.rstrip("/") for e in events if isinstance(e, ModelPath)}
                path = paths.pop() if len(paths) == 1 else None
                startups.append(Startup(ENGINE, len(startups) + 1, first, last, {}, tuple(events), era, path))

        rows: list[tuple[Line, list[Event], list[VersionRange]]] = []
        for line in lines:
            ev, cl = parse_line(line)
            ev = unquoted(line, ev, lambda masked: parse_line(masked)[0])
            if ev:  # else nothing, or engine-looking text only inside a quoted value (a prompt, a path)
                rows.append((line, ev, cl))
        own, dropped = anchored([(line, ev) for line, ev, _ in rows], OWN_PREFIX)
        for (line, _, cl), ev in zip(rows, own):
            if not ev:
                continue  # the engine's words without its prefix, in a log whose lines carry it: not its line
            banner = next((e for e in ev if isinstance(e, Banner)), None)
            if banner is not None and banner.version and seen_memory:
                flush()
                events, clues, seen_memory = [], [], False
            if not events:
                first = line.number
            last = line.number
            events.extend(ev)
            clues.extend(cl)
            if banner is None and not isinstance(ev[0], ModelPath):
                seen_memory = True
        flush()
        return with_unprefixed(startups, dropped)
