"""The words that tell an engine's log before its grammar is loaded: every engine's anchors (the byte strings
the scanner selects lines by), markers (the strings only its startup lines hold: which engine wrote a log) and
request markers (what its request log lines carry, never read by any grammar).

Light on purpose: ``kvaudit.engines`` reads all four engines' words to tell which engine a log is, and loads a
grammar (``kvaudit.parse.<engine>``, which compiles its patterns and builds its event classes) only when that
engine's lines are parsed. Each grammar's parser class takes its words from here (its base class): one
source, no copy.
"""

from __future__ import annotations

#: uvicorn's line once the ASGI app has started (uvicorn/lifespan/on.py): vLLM, TensorRT-LLM's trtllm-serve and
#: LMDeploy's api_server build their engine (weights, KV cache, graphs) before they hand the app to uvicorn
UVICORN_READY = "Application startup complete."
#: uvicorn's lines once it serves, as a pattern (``Uvicorn running on`` follows the startup line)
UVICORN_SERVING = r"Application startup complete|Uvicorn running on"


class SGLangWords:
    """SGLang's words (its grammar: kvaudit.parse.sglang)."""

    name = "sglang"
    #: byte strings of which every line this grammar reads contains at least one (see parse.lines.scan)
    anchors: tuple[bytes, ...] = (
        # few, and chosen by measurement (bench/): grep's cost grows with the strings' number and how often their
        # letters occur. "GB" catches nearly every memory line; the rest are lines that carry no "GB".
        b"GB",
        b"KV ",
        b"Not enough",
        b"unbalanced",
        b"Loaded weights",
        b"liding window",
        b"server_args",
        b"max_total_",
        b"max_running_request",
        b"Load weight",
        b"Capture ",
        b"Init ",
        b"Traceback",
        b"Error",
        b"TokenToKVPool",
        b"fraction-static",
        b"HONOR_EXPLICIT",
        # failures that carry none of the above: "Killed" (the kernel's OOM killer / the shell), "Initialization
        # failed. warmup error", "Scheduler hit an exception"
        b"Killed",
        b"failed",
        b"exception",
        # a scheduler's hung batch (``Watchdog timeout (...)``, ``Scheduler watchdog timeout (...)``) and uvicorn's
        # ``[Errno 98] error while attempting to bind ...: address already in use``
        b"atchdog timeout",
        b"already in use",
        # server_args.py's ROCm-only ``Enable Aiter AllReduce Fusion for <architecture>`` (0.5.10+)
        b"Aiter AllReduce",
        # ROCm's other signs: quantization/awq.py's HIP-only warning (no logger prefix: ``awq.py:67: UserWarning:
        # HIP does not support fused_marlin_moe currently.``, 0.4.10-0.5.20) and custom_all_reduce.py's ``[AR] Using
        # AiterCustomAllreduce (AMD default)`` (0.5.7+)
        b"fused_marlin_moe",
        b"AiterCustomAllreduce",
        # a launcher's version banner (``SGLang Version 0.5.11+05fb6a52``)
        b"SGLang Version",
        b"SGLang version",
    )

    #: strings only SGLang's startup lines contain: the head of an input that has them (and no other engine's)
    #: is scanned with this grammar's anchors alone
    markers: tuple[str, ...] = ("server_args=ServerArgs(", "server_args={", "Load weight begin", "Load weight end",
                                "KV Cache is allocated", "Memory pool end", "Init torch distributed", "max_total_num_tokens=")
    #: what its request log lines carry (``--log-requests``): a prompt may hold text that looks like a
    #: startup line, so a line with one of these is never read, by any grammar
    request_markers: tuple[str, ...] = ("GenerateReqInput(", "EmbeddingReqInput(", "Receive: obj=", "Finish: obj=")
    #: the lines it prints once its startup is over and it serves. ``ready`` (each ends the line) is where a running
    #: server's journal read stops (kvaudit.collect.commands.StartupWindow): http_server.py::_wait_and_warmup (0.4+;
    #: srt/server.py before), after the warm-up request, which uvicorn's own line precedes (a warm-up failure is
    #: logged after it). ``serving`` (a pattern) ends the startup for the forgery rules (kvaudit.parse.request_time):
    #: the same line, uvicorn's not counting
    ready: tuple[str, ...] = ("The server is fired up and ready to roll!",)
    serving = r"fired up and ready to roll"


class VLLMWords:
    """vLLM's words (its grammar: kvaudit.parse.vllm)."""

    name = "vllm"
    anchors: tuple[bytes, ...] = (
        # shared with SGLang's where they can be (GB, KV , Error); "GiB" catches nearly every memory line
        b"GB",
        b"GiB",
        b"KV ",
        b"Error",
        b"ERROR",  # an engine core ERROR line, even one cut short before its message
        b"profiling results",
        b"memory_utilization",
        b"memory-utilization",
        b"No available",
        b"blocks: ",
        b"num_gpu_blocks",
        b"concurrency",
        b"LLM engine",
        b"server version",
        b"non-default args",
        "\u2588  version".encode(),
        b"max seq len",
        b"failed to start",
        b"mamba page",
        b"startup plan",  # 'Saved startup plan to PATH' carries no other anchor (v1/worker/startup_plan.py)
        b"Auto-fit",
        b"weights took",  # also the MiB form, which carries no "GiB"
        b"Mamba cache mode",
        b"Mamba cache blocks",
        b"data type to store kv cache",
        b"Worker_",  # a worker's tag on any line (a compiler's, a progress bar's) names a rank: TP at least n + 1
        b"max_num_batched_tokens",
    )

    markers: tuple[str, ...] = ("vLLM", "LLM engine (v", "Initializing an LLM engine with config", "Loading model weights took", "Model loading took",
                                "GPU KV cache size", "Available KV cache memory", "# GPU blocks", "# CUDA blocks",
                                "# cuda blocks", "# rocm blocks", "vLLM instance can use", "VllmWorker", "exceeds available Mamba cache blocks")
    #: what its request log lines carry (``--log-requests``): a prompt may hold text that looks like a
    #: startup line, so a line with one of these is never read, by any grammar
    request_markers: tuple[str, ...] = ("Received request", "Added request", "prompt_token_ids", "prompt: '", 'prompt: "')
    #: ready: entrypoints/launcher.py::serve_http (0.5.1+), after build_async_engine_client sized the KV cache;
    #: serving: uvicorn's lines and the periodic stats (selected already by their ``KV `` anchor)
    ready: tuple[str, ...] = ("Available routes are:", UVICORN_READY)
    serving = r"Avg prompt throughput: |GPU KV cache usage: \d|" + UVICORN_SERVING


class TRTLLMWords:
    """TensorRT-LLM's words (its grammar: kvaudit.parse.trtllm)."""

    name = "trtllm"
    anchors: tuple[bytes, ...] = (
        b"GiB",
        b"GB for model weights",
        b"paged KV cache",
        b"paged kv cache",
        b"KV cache",
        b"kvCache",
        b"k/v cache",
        b"tokens per block",
        b"TensorRT-LLM version",
        b"TensorRT LLM version",  # the 2026 banner, after the rename ('[TensorRT-LLM] TensorRT LLM version: 1.3.0rc0')
        b"Engine version",
        b"Loaded engine size",
        b"execution context memory",
        b"GPU memory for",
        b"max_tokens",
        b"max_seq_len=",
        b"freeGpuMemoryFraction",
        b"freeMemFraction",
        b"Executor creation failed",
        b"must be large enough",  # 0.5-0.7's "maxTokensInPagedKvCache must be large enough ..." (no anchor above)
        b"out of memory",
        b"Failed to create instance",
        b"No free blocks",
        b"PyTorch backend",
        b"could not be created",
        b"(GiB): ",
        b"/snapshots/",
        b"maxTokens for windowSize",
        b"has_speculative_draft_tokens",
        b"allottedPrimaryMemBytes",
        b"KV Memory Percentage",
        b"free_gpu_mem",
        # the window lines carry none of the words above (resource_manager.py, 1.0+: the attention window cut to what
        # the pool holds, and the per-window pools of the Python VSWA sizing)
        b"exceeds upper bound",
        b"max_attention_window_vec",
        b"in blocks_per_window",
        b"Adjusted max_seq_len",
        b"primary_blocks: ",
        # the executor's OOM table rows (py_executor_creator.py _maybe_explain_if_oom): 'Model: 139.55 / 110.70'
        b"Model: ",
        b"Sampler: ",
        b"Drafter: ",
        b"executor resources",
        # 1.2+ rows print ExecutorMemoryType values: 'model: 274.64 / 208.12' (mlcommons/inference#2501)
        b"model: ",
        b"model_weights: ",
        b"sampler: ",
        b"drafter: ",
        b"guided_decoder: ",
        b"spec_resource_manager: ",
        b"_no_capture_",
        b"model_extra: ",
        b"executor_extra: ",
        b"kv_cache: ",
        b"PyTorch memory fraction",
        # the C++ runtime names each rank in untagged lines (tensorrtllm_backend#577, #396)
        b"TP group",
        b"MPI size: ",
        # TensorRT's memory tracker: '[MemUsageChange] TensorRT-managed allocation in IExecutionContext creation: CPU
        # +0, GPU +0, now: CPU 0, GPU 8163 (MiB)' (tensorrtllm_backend#569): the engine TensorRT holds
        b"TensorRT-managed allocation",
        # the temporary cache's blocks ('... set to {262146: (8256, 0)} for estimation dry run', NVIDIA/TensorRT-LLM#15182)
        b"for estimation dry run",
        # the AutoDeploy backend: its banner and its placeholder KV cache manager's page count (ad_executor.py
        # _CacheManagerWithFakePool; jeansblog/Nemotron3nano, 1.2.0rc5)
        b"AutoDeploy backend",
        b"fake cache manager",
        # the C++ runtime's cut of the sequence length to the pool (trtGptModelInflightBatching.cpp; grps_trtllm's
        # docs/scheduler.md); its first line carries 'kvCache' above
        b"maxInputLen is reduced",
    )

    markers: tuple[str, ...] = ("[TRT-LLM]", "[TensorRT-LLM]", "TensorRT-LLM version", "for max tokens in paged KV cache",
                                "Memory usage when calculating max tokens in paged kv cache", "Loaded engine size",
                                "in memory usage profiling", "Number of tokens per block", "for k/v cache")
    #: what its request log lines carry (``--log-requests``): a prompt may hold text that looks like a
    #: startup line, so a line with one of these is never read, by any grammar
    request_markers: tuple[str, ...] = ()
    #: commands/serve.py: LLM(...) (the executor and its KV cache manager), then OpenAIServer under uvicorn;
    #: Triton's "Started HTTPService at ADDRESS" ends in an address, no suffix: read to the end there. Not
    #: trtllm-bench's "Request serving started": its summary table, which the grammar reads, follows it
    ready: tuple[str, ...] = (UVICORN_READY,)
    serving = UVICORN_SERVING


class LMDeployWords:
    """LMDeploy's words (its grammar: kvaudit.parse.lmdeploy)."""

    name = "lmdeploy"
    anchors: tuple[bytes, ...] = (
        b"block_size = ",
        b"max_block_count = ",
        b"Object cache budget",
        b"[SeqMgr]",
        b"session_len",
        b"EngineConfig(",
        b"CacheConfig(",
        b"cache engine with",
        b"free gpu memory",
        b"max runtime memory",
        b"max_prefill_token_num=",
        b"No enough",
        b"cache_block_seq_len",
        b"cache_max_entry_count",
        b"kv_head_num",
        b"num_layer",
        b"size_per_head",
        b"tensor_para_size",
        b"attn_tp_size",
        b"quant_policy",
        b"model_arch",
        b"out of memory",
        b"OutOfMemoryError",
        b"LMDeploy: ",
        b"lmdeploy serve",
        b"Fallback to pytorch engine",
        b"max cached tokens",
    )

    markers: tuple[str, ...] = ("[BlockManager]", "BlockManager.cc:", "[TM][", "- lmdeploy -", "TurbomindEngineConfig(",
                                "PytorchEngineConfig(", "Object cache budget", "Building CacheEngine")
    #: what its request log lines carry (``--log-requests``): a prompt may hold text that looks like a
    #: startup line, so a line with one of these is never read, by any grammar
    request_markers: tuple[str, ...] = ("prompt=", "prompt_token_ids=")
    #: serve/openai/api_server.py::serve: the pipeline's engine is built before uvicorn.run
    ready: tuple[str, ...] = (UVICORN_READY,)
    serving = UVICORN_SERVING


#: every engine's words, in the registry's order (kvaudit.engines.ENGINES names each)
ENGINE_WORDS = (SGLangWords, VLLMWords, TRTLLMWords, LMDeployWords)
