"""parse.sglang: every line shape of reference section 5, one parametrised case per era's format string."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import read_log
from kvaudit.parse import sglang as S
from kvaudit.parse.lines import Line
from kvaudit.versions import VersionRange
from tests.conftest import KIMI_LOG

# (id, line, event type, expected fields, a version the line's era must admit, one it must exclude)
CASES = [
    ("load-begin", "[2026-02-25 10:12:22 TP0] Load weight begin. avail mem=94.01 GB",
     S.WeightBegin, {"avail_gib": 94.01}, None, None),
    ("load-end-0.3", "[17:43:27 TP1] Load weight end. type=DeepseekV2ForCausalLM, dtype=torch.bfloat16, avail mem=20.62 GB",
     S.WeightEnd, {"model_type": "DeepseekV2ForCausalLM", "avail_gib": 20.62, "usage_gib": None}, (0, 3, 0), (0, 4, 4)),
    ("load-end-0.4.4", "[2025-05-09 15:00:16 DP0 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=31.96 GB, mem usage=105.59 GB.",
     S.WeightEnd, {"dtype": "torch.bfloat16", "avail_gib": 31.96, "usage_gib": 105.59}, (0, 5, 0), (0, 5, 9)),
    ("load-end-0.5.9", "[2026-02-25 10:16:40 TP0] Load weight end. elapsed=218.42 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem=21.71 GB, mem usage=72.30 GB.",
     S.WeightEnd, {"elapsed_s": 218.42, "model_type": "KimiK25ForConditionalGeneration", "usage_gib": 72.30}, (0, 5, 9), (0, 5, 10)),
    ("load-end-0.5.10-quant", "[2026-04-01 10:00:00 TP0] Load weight end. elapsed=218.42 s, type=KimiK25ForConditionalGeneration, quant=compressed-tensors, bits=4, avail mem=21.71 GB, mem usage=72.30 GB.",
     S.WeightEnd, {"quant": "compressed-tensors, bits=4", "dtype": None, "avail_gib": 21.71}, (0, 5, 12), (0, 5, 9)),
    ("load-end-0.1", "[rank=3] Load weight end. Type=LlavaQwenForCausalLM. Avail mem=6.10 GB",
     S.WeightEnd, {"model_type": "LlavaQwenForCausalLM", "avail_gib": 6.10}, (0, 1, 5), (0, 3, 0)),
    ("kv-0.4.2", "[2025-02-04 05:29:17 TP0] KV Cache is allocated. K size: 2.82 GB, V size: 2.82 GB.",
     S.KVAlloc, {"tokens": None, "k_gib": 2.82, "v_gib": 2.82}, (0, 4, 3), (0, 4, 4)),
    ("kv-mha-0.4.4", "[2025-07-28 11:04:12 TP0] KV Cache is allocated. #tokens: 42632, K size: 2.60 GB, V size: 2.60 GB",
     S.KVAlloc, {"tokens": 42632, "k_gib": 2.60, "v_gib": 2.60, "kv_gib": None}, (0, 5, 0), (0, 5, 13)),
    ("kv-mla", "[2026-02-25 10:16:41 TP0] KV Cache is allocated. #tokens: 159277, KV size: 10.42 GB",
     S.KVAlloc, {"tokens": 159277, "kv_gib": 10.42, "k_gib": None, "v_gib": None}, (0, 5, 9), (0, 4, 5)),
    ("kv-0.5.13-dtype", "[2026-06-08 07:20:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1106304, K size: 25.32 GB, V size: 25.32 GB",
     S.KVAlloc, {"dtype": "torch.bfloat16", "tokens": 1106304, "k_gib": 25.32}, (0, 5, 13), (0, 5, 12)),
    ("kv-0.5.17-labelled", "[2026-09-01 10:00:00 TP0] SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 329472, K size: 3.10 GB, V size: 3.10 GB",
     S.KVAlloc, {"label": "SWA", "tokens": 329472}, (0, 5, 17), (0, 5, 16)),
    ("kv-va-upper-bound-abridged", "KV Cache VA upper bound ... #tokens: 273K",
     S.KVAlloc, {"upper_bound": True, "tokens": 273000, "tokens_approx": True}, None, None),
    # post-capture KV sizing (kv_pool_runtime.py compute_post_capture_kv_resize's format strings; no public log
    # of the opt-in mode was found, so these are the format with sample values, not a startup's lines)
    ("post-capture-0.5.16", "[2026-07-01 10:00:00 TP0] Post-capture KV sizing: max_total_num_tokens=500000, free memory=2.50 GB",
     S.PostCaptureKV, {"tokens": 500000, "free_gib": 2.5, "kv_gib": None}, (0, 5, 16), (0, 5, 17)),
    ("post-capture-0.5.17", "[2026-07-01 10:00:00 TP0] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 500000, KV size: 30.52 GB, avail mem=2.50 GB",
     S.PostCaptureKV, {"tokens": 500000, "kv_gib": 30.52, "free_gib": 2.5}, (0, 5, 17), (0, 5, 16)),
    ("post-capture-split", "[2026-07-01 10:00:00 TP0] Post-capture KV sizing: full_layer_tokens=500000, swa_layer_tokens=0",
     S.PostCaptureKV, {"tokens": None, "full_tokens": 500000, "swa_tokens": 0}, (0, 5, 17), (0, 5, 16)),
    # HiCache host pools (host RAM): 0.5.17+ pool_host/base.py, 0.5.22+ hicache_auto_size.py format strings
    ("hicache-host-pool-0.5.17", "[2026-09-01 10:00:00 TP0] Allocating kv hierarchical KV host pool: 1200000 tokens, 150.99 GB host memory.",
     S.HiCacheHost, {"host_gb": 150.99, "tokens": 1200000, "what": "hierarchical KV host pool (kv)"}, (0, 5, 17), (0, 5, 16)),
    ("hicache-auto-size-0.5.22", "[2026-09-01 10:00:00 TP0] HiCache auto-sizing: ratio 2.000 -> 1.250; 180.0 GiB host memory per rank (fraction 0.80, 8 ranks on this host), host pools 140.6 GiB.",
     S.HiCacheAutoSize, {"ratio_asked": 2.0, "ratio": 1.25, "host_budget_gib": 180.0, "host_pools_gib": 140.6}, (0, 5, 22), (0, 5, 21)),
    ("hicache-mamba-host", "[2026-09-01 10:00:00 TP0] Allocating 3.00 GB host memory for hierarchical Mamba cache (layout=page_first).",
     S.HiCacheHost, {"host_gb": 3.0, "tokens": None, "what": "hierarchical Mamba cache"}, None, None),
    ("pool-end", "[2026-02-25 10:16:41 TP0] Memory pool end. avail mem=11.18 GB",
     S.PoolEnd, {"avail_gib": 11.18}, None, None),
    ("graph-begin-0.4.4", "[2025-12-28 10:40:09 TP2] Capture cuda graph begin. This can take up to several minutes. avail mem=11.87 GB",
     S.GraphBegin, {"name": "target decode", "avail_gib": 11.87}, None, None),
    ("graph-begin-old", "[17:43:28 TP4] Capture cuda graph begin. This can take up to several minutes.",
     S.GraphBegin, {"name": "target decode", "avail_gib": None}, (0, 3, 0), (0, 4, 4)),
    ("graph-end-0.4.0", "[2025-02-04 05:29:19 TP0] Capture cuda graph end. Time elapsed: 1.79 s",
     S.GraphEnd, {"elapsed_s": 1.79, "usage_gib": None}, (0, 4, 2), (0, 4, 4)),
    ("graph-end-0.4.4-avail-first", "[2025-03-20 10:00:00 TP0] Capture cuda graph end. Time elapsed: 5.00 s. avail mem=9.29 GB. mem usage=1.87 GB.",
     S.GraphEnd, {"usage_gib": 1.87, "avail_gib": 9.29}, (0, 4, 5), (0, 4, 7)),
    ("graph-end-0.4.7", "[2025-09-05 20:48:29 TP0] Capture cuda graph end. Time elapsed: 12.11 s. mem usage=0.54 GB. avail mem=16.74 GB.",
     S.GraphEnd, {"usage_gib": 0.54, "avail_gib": 16.74, "elapsed_s": 12.11}, (0, 5, 0), (0, 4, 6)),
    ("graph-end-draft", "[2025-09-05 20:50:29 TP6] Capture draft cuda graph end. Time elapsed: 62.67 s. mem usage=0.21 GB. avail mem=15.31 GB.",
     S.GraphEnd, {"name": "draft decode", "role": "draft", "usage_gib": 0.21}, None, None),
    ("graph-begin-draft-extend", "[2025-07-28 11:04:21 TP1] Capture draft extend cuda graph begin. This can take up to several minutes. avail mem=6.88 GB",
     S.GraphBegin, {"name": "draft extend", "role": "draft", "avail_gib": 6.88}, None, None),
    ("graph-piecewise", "[2026-01-01 10:00:00 TP0] Capture piecewise CUDA graph end. Time elapsed: 9.00 s. mem usage=0.80 GB. avail mem=8.00 GB.",
     S.GraphEnd, {"name": "target prefill", "usage_gib": 0.80}, (0, 5, 8), (0, 5, 14)),
    ("graph-0.5.14", "[2026-07-01 10:00:00 TP0] Capture target decode CUDA graph end. elapsed=41.22 s, mem usage=1.87 GB, avail mem=9.29 GB.",
     S.GraphEnd, {"name": "target decode", "usage_gib": 1.87, "avail_gib": 9.29}, (0, 5, 14), (0, 5, 13)),
    ("graph-0.5.14-draft", "[2026-07-01 10:00:00 TP0] Capture draft decode CUDA graph begin. backend=fa3, num_tokens_per_bs=4, bs=[1, 2, 4], avail mem=9.29 GB",
     S.GraphBegin, {"name": "draft decode", "role": "draft", "avail_gib": 9.29}, (0, 5, 14), (0, 5, 13)),
    ("summary-0.4.2", "[2025-02-04 05:29:20 TP0] max_total_num_tokens=105531, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=2049, context_len=131072",
     S.SchedulerSummary, {"max_total_num_tokens": 105531, "context_len": 131072, "available_gpu_mem_gib": None}, (0, 4, 2), (0, 4, 7)),
    ("summary-0.5", "[2026-02-25 10:18:02 TP0] max_total_num_tokens=159277, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=262144, available_gpu_mem=6.93 GB",
     S.SchedulerSummary, {"max_running_requests": 48, "available_gpu_mem_gib": 6.93}, (0, 5, 9), (0, 4, 6)),
    ("dist-0.4.4", "[2026-01-01 10:00:00 TP0] Init torch distributed ends. mem usage=1.05 GB",
     S.DistInit, {"usage_gib": 1.05}, (0, 5, 0), (0, 5, 9)),
    ("dist-0.5.9", "[2026-02-25 10:12:17 TP0] Init torch distributed ends. elapsed=2.84 s, mem usage=1.05 GB",
     S.DistInit, {"usage_gib": 1.05}, (0, 5, 9), (0, 5, 8)),
    ("baseline-0.5.21", "[2026-10-01 10:00:00 TP0] Memory baseline taken. mem usage=1.05 GB",
     S.DistInit, {"usage_gib": 1.05}, (0, 5, 21), (0, 5, 20)),
    ("mamba", "[2026-02-27 17:10:28 TP0] Mamba Cache is allocated. max_mamba_cache_size: 82, conv_state size: 0.13GB, ssm_state size: 7.29GB ",
     S.OtherPool, {"kind": "mamba", "detail": {"conv_state": 0.13, "ssm_state": 7.29, "max_mamba_cache_size": 82}}, (0, 5, 9), (0, 5, 3)),
    ("swa-summary", "[2025-12-19 07:42:57 TP2] SWAKVPool mem usage: 77.63 GB, swa size: 1496958, full size: 1496958",
     S.OtherPool, {"kind": "swa_summary", "gib": 77.63, "counts_in_total": False}, None, None),
    ("swa-split", "[2026-01-01 10:00:00 TP0] Use sliding window memory pool. full_layer_tokens=100000, swa_layer_tokens=80000",
     S.SlidingWindowSplit, {"full_tokens": 100000, "swa_tokens": 80000}, (0, 5, 7), (0, 5, 6)),
    ("hicache", "[2026-02-25 10:16:03 TP0] Allocating 22.39 GB host memory for hierarchical KV cache.",
     S.HiCacheHost, {"host_gb": 22.39}, None, None),
    ("kv-dtype", "[2026-01-23 09:10:36 TP0] Using KV cache dtype: torch.bfloat16",
     S.KVDtype, {"dtype": "torch.bfloat16"}, (0, 5, 5), (0, 5, 13)),
    ("cap-warning", "[2026-01-01 10:00:00 TP0] max_total_tokens=500000 is larger than the profiled value 159277. Use the profiled value instead.",
     S.CapWarning, {"requested": 500000, "profiled": 159277}, None, None),
    ("spec-reset", "[2026-01-01 10:00:00] Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.",
     S.SpecReset, {"max_running_requests": 48}, (0, 5, 4), (0, 5, 3)),
    ("not-enough-0.3", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
     S.Failure, {"kind": "not_enough_memory", "numbers": {}}, (0, 4, 0), (0, 5, 3)),
    ("not-enough-0.5.3", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.88",
     S.Failure, {"kind": "not_enough_memory", "numbers": {"mem_fraction_static": 0.88}}, (0, 5, 5), (0, 5, 10)),
    ("not-enough-0.5.10", "ValueError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.7",
     S.Failure, {"kind": "not_enough_memory", "numbers": {"mem_fraction_static": 0.7}}, (0, 5, 12), (0, 5, 9)),
    ("no-kv-0.5.14", "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8. Raise --mem-fraction-static above 0.853 (minimum viable = 1 - available/pre = 0.8433). If using speculative decoding, draft weights are now counted.",
     S.Failure, {"kind": "no_kv_memory", "numbers": {"mem_fraction_static": 0.8, "suggested": 0.853, "minimum_viable": 0.8433}}, (0, 5, 14), (0, 5, 13)),
    ("unbalanced-0.4.4", "[2025-04-01 10:00:00 TP3] The memory capacity is unbalanced. Some GPUs may be occupied by other processes. min_per_gpu_memory=60.12, local_gpu_memory=78.50, local_gpu_memory * 0.9=70.65",
     S.Failure, {"kind": "unbalanced", "numbers": {"min_gib": 60.12, "local_gib": 78.50}}, (0, 5, 0), (0, 5, 10)),
    ("host-memory", "[2026-01-01 10:00:00 TP0] Not enough host memory available. Requesting 22.39 GB but only have 12.00 GB free. Please reduce the size of the hierarchical cache.",
     S.Failure, {"kind": "host_memory", "numbers": {"requested_gb": 22.39, "available_gb": 12.0}}, None, None),
    ("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB",
     S.Failure, {"kind": "oom"}, None, None),
    ("traceback", "Traceback (most recent call last):", S.Failure, {"kind": "traceback"}, None, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_line_grammar(case):
    _id, text, kind, fields, inside, outside = case
    parsed = S.parse_line(Line(7, text))
    ev = parsed.event
    assert isinstance(ev, kind), f"{text!r} parsed as {ev!r}"
    assert ev.line == 7
    for k, v in fields.items():
        assert getattr(ev, k) == v, (k, getattr(ev, k))
    era = VersionRange((0, 1, 0), None)
    for clue in parsed.clues:
        era = era.intersect(clue) or era
    if inside is not None:
        assert era.overlaps(inside, inside), f"{text!r}: era {era} should admit {inside}"
    if outside is not None:
        assert not era.overlaps(outside, outside), f"{text!r}: era {era} should exclude {outside}"


PREFIXES = [
    ("none", "", ""),
    ("tp", "[2026-02-25 10:16:41 TP3] ", "TP3"),
    ("dp-tp-ep", "[2026-02-25 10:16:41 DP1 TP1 EP1] ", "DP1 TP1 EP1"),
    ("pp-tp", "[2026-02-25 10:16:41 PP1 TP2] ", "PP1 TP2"),
    ("gpu-id", "[gpu_id=5] ", "gpu_id=5"),
    ("rank", "[rank=2] ", "rank=2"),
    ("time-only", "[17:43:28 TP6] ", "TP6"),
    ("no-rank", "[2026-02-25 10:16:41] ", ""),
    ("ms", "[2026-02-25 10:16:41.123 TP1] ", "TP1"),
    ("journal-short", "Feb 25 10:16:41 gpu-node-07 python3[48211]: [2026-02-25 10:16:41 TP4] ", "TP4"),
    ("journal-short-iso", "2026-02-25T10:16:41+0000 gpu-node-07 python3[48211]: [2026-02-25 10:16:41 TP5] ", "TP5"),
    ("docker-double", "2025-02-04 21:29:17 [2025-02-04 05:29:17 TP0] ", "TP0"),
    ("k9s-box", "│ [2026-02-25 10:16:41 TP2] ", "TP2"),
    ("indented", "    [2026-02-25 10:16:41 TP7] ", "TP7"),
]


@pytest.mark.parametrize("prefix", PREFIXES, ids=[p[0] for p in PREFIXES])
def test_rank_prefix_shapes(prefix):
    _id, head, label = prefix
    ev = S.parse_line(Line(1, head + "Memory pool end. avail mem=11.18 GB")).event
    assert isinstance(ev, S.PoolEnd) and ev.avail_gib == 11.18
    assert ev.rank.label == label


def test_server_args_repr_and_dict_forms():
    repr_line = ("[2026-02-25 10:12:01] server_args=ServerArgs(model_path='/m/Kimi', mem_fraction_static=0.88, "
                 "tp_size=8, json_model_override_args='{\"a\": 1, \"b\": [1, 2]}', lora_paths=None, "
                 "cuda_graph_bs=[1, 2, 4], speculative_algorithm='EAGLE3', enable_mla=True)")
    ev = S.parse_line(Line(1, repr_line)).event
    assert isinstance(ev, S.ServerArgs) and ev.form == "repr"
    assert ev.args["mem_fraction_static"] == 0.88 and ev.args["tp_size"] == 8
    assert ev.args["cuda_graph_bs"] == [1, 2, 4] and ev.args["lora_paths"] is None
    assert ev.args["json_model_override_args"] == '{"a": 1, "b": [1, 2]}'
    dict_line = "[2026-09-01 10:00:00] server_args={'model_path': '/m', 'mem_fraction_static': 0.9, 'tp_size': 2}"
    ev = S.parse_line(Line(1, dict_line)).event
    assert ev.form == "dict" and ev.args == {"model_path": "/m", "mem_fraction_static": 0.9, "tp_size": 2}


def test_server_args_cut_short_keeps_what_it_has():
    ev = S.parse_line(Line(1, "[2026-02-25 10:16:41] server_args=ServerArgs(model_path='/m', "
                              "mem_fraction_static=0.85, tp_si")).event
    assert ev.args["mem_fraction_static"] == 0.85 and ev.args["model_path"] == "/m"


def test_server_args_without_the_engines_prefix_open_no_startup_and_name_no_model():
    """issue 21, item 6: SGLang prints its arguments through its logger, with its "[time]" prefix; the same words
    on a line without it (another program's output in the unit's journal, an unquoted echo) are not the engine's:
    they neither open a startup nor choose the config.json kvaudit reads on the host."""
    forged = "server_args=ServerArgs(model_path='/root/.ssh', tp_size=8, mem_fraction_static=0.5)"
    assert S.parse_line(Line(1, forged)).event is None
    assert S.parse_line(Line(1, "GET /x " + forged)).event is None
    log = KIMI_LOG.read_bytes() + b"Feb 25 10:30:00 host sglang[4242]: " + forged.encode() + b"\n"
    parsed = read_log(io.BytesIO(log))
    assert len(parsed.startups) == 1 and parsed.startups[0].model_path == "/models/moonshotai/Kimi-K2.5"


def test_non_memory_lines_yield_nothing():
    for text in ("[2026-02-25 10:18:03] INFO:     Application startup complete.",
                 "[2026-02-25 10:21:40 TP0] Decode batch, #running-req: 12, #token: 48211, token usage: 0.30, ",
                 "Loading safetensors checkpoint shards: 100% Completed | 64/64 [03:38<00:00,  3.41s/it]",
                 "Capturing batches (bs=1 avail_mem=9.31 GB): 100%|██████████| 10/10"):
        assert S.parse_line(Line(1, text)).event is None, text


def test_escapes_in_a_logged_value_raise_no_warning():
    """A value with an invalid escape ('\\R') is read as Python reads it, silently: the compiler's
    SyntaxWarning (Python 3.12+) or DeprecationWarning would otherwise land on kvaudit's stderr."""
    import warnings

    from kvaudit.parse.sglang import parse_server_args

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = parse_server_args("model_path='C:\\Repo\\model', tp_size=2", "repr")
        args2 = parse_server_args("{'model_path': 'C:\\Repo', 'tp_size': 2}", "dict")
    assert args["tp_size"] == 2 and args2["tp_size"] == 2 and "Repo" in args["model_path"]
    assert caught == []

