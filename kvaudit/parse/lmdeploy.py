"""LMDeploy startup-log grammar: the TurboMind engine (C++, ``src/turbomind``) and the PyTorch engine
(``lmdeploy/pytorch``), as ``lmdeploy serve api_server``, the pipeline API and its Docker images print them.

Format strings, per release (InternLM/lmdeploy tags v0.1.0..v0.16.0; docs/lmdeploy-log-grammar.md has the table):

* TurboMind ``BlockManager.cc`` (MiB printed as "MB"): "[BlockManager] block_size = %lu MB" (``>> 20``: truncated,
  <=0.7), "[BlockManager] block_size = %.3f MB" (0.8-0.12), "block_size = {:.3f} MB" with the file tag
  "[BlockManager.cc:NN]" in the prefix instead of the "[BlockManager]" tag (0.13-0.14); "max_block_count = N" and
  "chunk_size = N" after it in the same shapes. 0.15+ has no block manager: ``turbomind.cc`` prints "Object cache
  budget: X MB from free Y MB and ratio R" (bytes, not tokens).
* ``SequenceManager.cc`` (0.12.3-0.14, models with linear-attention layers): "[SeqMgr] Adjusting block_count: free_before
  A MB, linear B MB, target C MB", "[SeqMgr] Adjusted block_count to N", and the error "[SeqMgr] Linear-state
  memory (A MB) >= cache budget (B MB)".
* ``LlamaBatch.cc``: "No enough blocks for `session_len` (A), `session_len` truncated to B." (0.2.6-0.11),
  ``engine.cc`` "`session_len` truncated to N due to limited KV cache memory" (0.12-0.14).
* ``LlamaTritonModel.cc`` (<=0.2): "[LlamaTritonModel] `cache_block_seq_len` is not set, default to N."
* Python (``serve/async_engine.py``): "input backend=B, backend_config=TurbomindEngineConfig(...)" /
  "updated backend_config=PytorchEngineConfig(...)" (dataclass reprs: tp, session_len, cache_max_entry_count,
  cache_block_seq_len, block_size, quant_policy, num_gpu_blocks); the TurboMind model config the engine logs
  ("model_config:" INI in 0.2-0.5, "turbomind model config:" JSON in 0.6+), one "key = value" or ``"key": value``
  per line.
* PyTorch engine (``pytorch/engine/executor/base.py``, ``cache_engine.py``): "Building CacheEngine with config:"
  followed on the next line by the ``CacheConfig(...)`` repr (``num_gpu_blocks=N``, ``block_size=B``); DEBUG
  "minimal free gpu memory: N mb" (older "device<i> free gpu memory: N mb"), "estimated max runtime memory: N mb"
  (``>> 20``: MiB, truncated), "Initialize cache engine with N gpu blocks and M cpu blocks."; WARNING "No enough
  memory. Update max_prefill_token_num=N".
* Failures: "No enough gpu memory for kv cache." / "... for runtime." / "... for state cache", TurboMind's
  "[TM][ERROR] CUDA runtime error: out of memory", torch's CUDA OOM, the linear-state error above.

Prefixes: the Python logger ``2025-01-01 10:00:00,123 - lmdeploy - INFO - file.py:N - `` (0.6.2+; before, no file),
TurboMind's ``[TM][INFO] `` (``[TM][INFO][MMDD.HH:MM:SS.us][file.cc:N] `` and ``WARN`` in 0.13+), Ray's
``(RayWorkerWrapper pid=N) ``, journald's and docker's: every pattern is searched anywhere in the line.
"""

from __future__ import annotations

import re
from typing import Iterable, cast

from kvaudit.parse.patterns import lazy
from kvaudit.parse.interface import (Event, Failure, OwnPrefix, Rank, RankEvent, Startup, anchored, numbered_rank,
                                     oom_numbers, quote, unquoted, with_unprefixed)
from kvaudit.parse.lines import Line
from kvaudit.parse.vocabulary import LMDeployWords
from kvaudit.versions import VersionRange, parse_version, resolve
from kvaudit.versions import clue as _clue
from kvaudit.record import record

ENGINE = LMDeployWords.name

NUM = r"(\d+(?:\.\d+)?)"


@record
class EngineConfig(Event):
    """A ``TurbomindEngineConfig(...)`` / ``PytorchEngineConfig(...)`` repr: ``backend`` turbomind | pytorch,
    ``updated`` for the "updated backend_config=" line (the engine's defaults filled in), the settings it names."""

    backend: str = ""
    updated: bool = False
    settings: tuple[tuple[str, float], ...] = ()


@record
class Reading(RankEvent):
    """One number a line states. Keys: block_mib (TurboMind block, MiB as printed), block_mib_truncated (1 when the
    line prints an integer: ``>> 20``), max_block_count, chunk_size, object_budget_mib, object_free_mib,
    object_ratio, free_before_mib, linear_mib, target_mib, adjusted_blocks, session_len_asked, session_len_cut,
    block_seq_len_default, num_gpu_blocks, num_cpu_blocks, pt_block_size, free_mib, runtime_mib, prefill_tokens,
    and the model config's layers, kv_heads, head_dim, tp, session_len, ratio, block_seq_len, quant_policy."""

    key: str = ""
    value: float = 0.0


@record
class ModelArch(Event):
    """The architecture the TurboMind model config names (``model_arch = X`` / ``"model_arch": "X",``)."""

    name: str = ""


@record
class Release(Event):
    """The release a line names (``lmdeploy check_env``'s "LMDeploy: 0.10.2+...")."""

    version: str = ""


_RANK = lazy(r"\[TM\]\[[A-Z]+\]\[(\d+)\]|rank\[(\d+)\]")
_BLOCK = lazy(r"(\[BlockManager\] |BlockManager\.cc:\d+\] )block_size = " + NUM + " MB")
_COUNT = lazy(r"(?:\[BlockManager\] |BlockManager\.cc:\d+\] )(max_block_count|chunk_size) = (\d+)")
_OBJECT = lazy(r"Object cache budget: " + NUM + r" MB from free " + NUM + r" MB and ratio " + NUM)
_ADJUSTING = lazy(r"\[SeqMgr\] Adjusting block_count: free_before " + NUM + r" MB, linear " + NUM
                        + r" MB, target " + NUM + " MB")
_ADJUSTED = lazy(r"\[SeqMgr\] Adjusted block_count to (\d+)")
_LINEAR_FAIL = lazy(r"\[SeqMgr\] Linear-state memory \(" + NUM + r" MB\) >= cache budget \(" + NUM + r" MB\)")
_TRUNCATED = lazy(r"No enough blocks for `session_len` \((\d+)\), `session_len` truncated to (\d+)")
_TRUNCATED_12 = lazy(r"`session_len` truncated to (\d+) due to limited KV cache memory")
_SEQ_DEFAULT = lazy(r"`cache_block_seq_len` is not set, default to (\d+)")
_CONFIG = lazy(r"(Turbomind|Pytorch)EngineConfig\((.*)")
_SETTING = lazy(r"\b(tp|session_len|cache_max_entry_count|cache_block_seq_len|block_size|quant_policy|"
                      r"num_gpu_blocks|max_batch_size|max_prefill_token_num)=(None|\d+(?:\.\d+)?(?:[eE]-?\d+)?)")
_CACHE_CONFIG = lazy(r"CacheConfig\((.*)")
_CACHE_FIELD = lazy(r"\b(block_size|num_gpu_blocks|num_cpu_blocks|cache_max_entry_count|quant_policy|"
                          r"max_prefill_token_num|max_batches)=(\d+(?:\.\d+)?)")
_INIT_CACHE = lazy(r"Initialize cache engine with (\d+) gpu blocks and (\d+) cpu blocks")
_FREE = lazy(r"(?:minimal free gpu memory|device<\d+> free gpu memory): (\d+) mb")
_RUNTIME = lazy(r"estimated max runtime memory: (\d+) mb")
_PREFILL = lazy(r"No enough memory\. [Uu]pdate max_prefill_token_num=(\d+)")
#: the TurboMind model config the engine logs, one key per line (INI "key = value", JSON ``"key": value,``)
_MODEL_KEY = lazy(r"(?:^|[\s:\]{,])\"?(num_layer|kv_head_num|size_per_head|head_dim|tensor_para_size|attn_tp_size|"
                        r"session_len|cache_max_entry_count|cache_block_seq_len|quant_policy)\"?\s*[=:]\s*"
                        r"(\d+(?:\.\d+)?)\s*,?\s*$")
_MODEL_ARCH = lazy(r"(?:^|[\s:\]{,])\"?model_arch\"?\s*[=:]\s*\"?([A-Za-z][\w.]{0,80})\"?\s*,?\s*$")
_MODEL_KEYS = {"num_layer": "layers", "kv_head_num": "kv_heads", "size_per_head": "head_dim", "head_dim": "head_dim",
               "tensor_para_size": "tp", "attn_tp_size": "tp", "session_len": "session_len",
               "cache_max_entry_count": "ratio", "cache_block_seq_len": "block_seq_len",
               "quant_policy": "quant_policy"}
_RELEASE = lazy(r"LMDeploy: (\d+\.\d+\.\d+)")
#: lines of plain numbers: (a cheap needle, the pattern, the reading key of each group)
#: ``[TM][INFO] max cached tokens: N`` (src/turbomind/engine/engine.cc, Engine::Impl, 0.12.x: max_block_count x
#: cache_block_seq_len x attn_cp_size, the pool's token capacity, printed before the session_len truncation)
_MAX_CACHED = lazy(r"max cached tokens: (\d+)")
_SIMPLE = (
    ("cache engine with", _INIT_CACHE, ("num_gpu_blocks", "num_cpu_blocks")),
    ("free gpu memory", _FREE, ("free_mib",)),
    ("max runtime memory", _RUNTIME, ("runtime_mib",)),
    ("max_prefill_token_num=", _PREFILL, ("prefill_tokens",)),
    ("max cached tokens", _MAX_CACHED, ("max_cached_tokens",)),
)
#: the Python logger's prefix: with "file.py:N - " since 0.6.2 (lmdeploy/utils.py get_logger), without before
_PY_PREFIX = lazy(r"- lmdeploy - (?:DEBUG|INFO|WARNING|ERROR) - (\w+\.py:\d+ - )?")
_NEW_PREFIX = lazy(r"\[TM\]\[(?:INFO|WARN|ERROR|DEBUG)\]\[\d{4}\.")
#: Failure kinds this grammar emits: no_kv_memory | no_runtime_memory | no_state_memory | linear_state | oom
_FAILURES = (
    ("No enough gpu memory for kv cache", "no_kv_memory"),
    ("No enough gpu memory for runtime", "no_runtime_memory"),
    ("No enough gpu memory for state cache", "no_state_memory"),
    ("CUDA runtime error: out of memory", "oom"),
    ("CUDA out of memory", "oom"),
    ("OutOfMemoryError", "oom"),
)
#: a failure line that is LMDeploy's only when its startup has LMDeploy lines of its own (another engine's OOM)
GENERIC_FAILURES = ("oom",)


def _dump_line(ev: list[Event]) -> bool:
    """A line of TurboMind's model-config dump (``key = value`` or ``"key": value,``): one reading of the model."""
    return len(ev) == 1 and (isinstance(ev[0], ModelArch)
                             or isinstance(ev[0], Reading) and ev[0].key in _MODEL_KEYS.values())


#: LMDeploy's loggers: Python's ``2024-08-05 05:40:52,191 - lmdeploy - INFO - [file.py:N - ]`` (utils.py
#: get_logger), TurboMind's C++ ``[TM][INFO] `` (``[TM][INFO][1205 ...]`` 0.13+, src/turbomind/utils/logger.h)
_OWN = lazy(r"- lmdeploy - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - |\[TM\]\[(?:DEBUG|INFO|WARN|WARNING|ERROR)\]")
#: what it prints without one: a traceback's exception (anywhere), the model-config dump's lines (one logger
#: call, ``model_config:`` and the INI or JSON text on the lines after it) and the PyTorch engine's
#: ``CacheConfig(...)`` repr on the line after "Building CacheEngine with config:" (engine/cache_engine.py)
OWN_PREFIX = OwnPrefix(cast("re.Pattern[str]", _OWN), bare=lambda e: _dump_line([e]) or e.text.lstrip().startswith("CacheConfig("),
                       anywhere=lambda e: isinstance(e, Failure))


def rank_of(text: str) -> Rank:
    return numbered_rank(_RANK.search(text))


def _turbomind_config_clues(t: str) -> list[VersionRange]:
    """The fields of TurboMind's config repr, as lmdeploy/messages.py TurbomindEngineConfig had them per release:
    ``model_name`` 0.2.0-0.5.3 (dropped in 0.6.0), ``cache_block_seq_len`` from 0.3.0, ``enable_prefix_caching``
    from 0.4.2, ``cache_chunk_size`` from 0.6.0."""
    clues = [_clue((0, 2, 0), (0, 5, 3), "TurbomindEngineConfig with model_name= (0.2.0-0.5.3)")
             if "TurbomindEngineConfig(model_name=" in t or ", model_name=" in t else None,
             _clue((0, 3, 0), None, "TurbomindEngineConfig with cache_block_seq_len= (0.3+)")
             if "cache_block_seq_len=" in t else None,
             _clue((0, 4, 2), None, "TurbomindEngineConfig with enable_prefix_caching= (0.4.2+)")
             if "enable_prefix_caching=" in t else None,
             _clue((0, 6, 0), None, "TurbomindEngineConfig with cache_chunk_size= (0.6+)")
             if "cache_chunk_size=" in t else None]
    return [c for c in clues if c is not None]


def parse_line(line: Line) -> tuple[list[Event], list[VersionRange]]:
    t, n = line.text, line.number
    rank = rank_of(t)
    ev: list[Event] = []
    clues: list[VersionRange] = []

    def read(key: str, value: float | str) -> None:
        ev.append(Reading(n, t, rank, "target", key, float(value)))

    m = _PY_PREFIX.search(t) if "- lmdeploy -" in t else None
    if m:
        clues.append(_clue((0, 6, 2), None, "the logger's 'file.py:N' field (0.6.2+)") if m.group(1) else
                     _clue((0, 1, 0), (0, 6, 1), "the logger's prefix without 'file.py:N' (<=0.6.1)"))
    if "EngineConfig(" in t:
        clues.append(_clue((0, 2, 0), None, "a TurbomindEngineConfig/PytorchEngineConfig repr (0.2+)"))
        if "TurbomindEngineConfig(" in t:
            clues += _turbomind_config_clues(t)
    if _NEW_PREFIX.search(t):
        clues.append(_clue((0, 13, 0), None, "the '[TM][LEVEL][MMDD.' TurboMind prefix (0.13+)"))
    m = _BLOCK.search(t) if "block_size = " in t else None
    if m:
        read("block_mib", m.group(2))
        if "." not in m.group(2):
            read("block_mib_truncated", 1)
            clues.append(_clue((0, 1, 0), (0, 7, 99), "'block_size = N MB' in whole MiB (<=0.7)"))
        elif m.group(1).startswith("[BlockManager]"):
            clues.append(_clue((0, 8, 0), (0, 12, 99), "'[BlockManager] block_size = X.XXX MB' (0.8-0.12)"))
        else:
            clues.append(_clue((0, 13, 0), (0, 14, 99), "'block_size = X.XXX MB' under BlockManager.cc (0.13-0.14)"))
        return ev, clues
    m = _COUNT.search(t) if "_" in t else None
    if m:
        read(m.group(1), m.group(2))
        return ev, clues
    m = _OBJECT.search(t) if "Object cache budget" in t else None
    if m:
        read("object_budget_mib", m.group(1))
        read("object_free_mib", m.group(2))
        read("object_ratio", m.group(3))
        return ev, clues + [_clue((0, 15, 0), None, "'Object cache budget' (0.15+)")]
    if "[SeqMgr]" in t:
        m = _ADJUSTING.search(t)
        if m:
            for key, value in zip(("free_before_mib", "linear_mib", "target_mib"), m.groups()):
                read(key, value)
            # from "Optimize Qwen3.5" (#4434, 764f35a) first tagged in v0.12.3, under the old "[TM][INFO] " prefix
            # there, to v0.14 (#4717 replaced it with the object cache in v0.15)
            return ev, clues + [_clue((0, 12, 3), (0, 14, 99),
                                      "'[SeqMgr] Adjusting block_count' (0.12.3-0.14)")]
        m = _ADJUSTED.search(t)
        if m:
            read("adjusted_blocks", m.group(1))
            return ev, clues
        m = _LINEAR_FAIL.search(t)
        if m:
            ev.append(Failure(n, t, rank, "target", "linear_state", quote(t[m.start():]),
                              {"linear_mib": float(m.group(1)), "budget_mib": float(m.group(2))}))
            return ev, clues
    m = _TRUNCATED.search(t) if "session_len" in t else None
    if m:
        read("session_len_asked", m.group(1))
        read("session_len_cut", m.group(2))
        return ev, clues + [_clue((0, 2, 6), (0, 11, 99), "'No enough blocks for `session_len`' (0.2.6-0.11)")]
    m = _TRUNCATED_12.search(t) if "session_len" in t else None
    if m:
        read("session_len_cut", m.group(1))
        return ev, clues + [_clue((0, 12, 0), (0, 14, 99), "'`session_len` truncated to N due to limited KV cache "
                                                            "memory' (0.12-0.14)")]
    m = _SEQ_DEFAULT.search(t) if "cache_block_seq_len" in t else None
    if m:
        read("block_seq_len_default", m.group(1))
        return ev, clues + [_clue((0, 1, 0), (0, 2, 99), "'`cache_block_seq_len` is not set, default to' (<=0.2)")]
    m = _CONFIG.search(t) if "EngineConfig(" in t else None
    if m:
        settings = tuple((k, float(v)) for k, v in _SETTING.findall(m.group(2)) if v != "None")
        ev.append(EngineConfig(n, t, m.group(1).lower(), "updated backend_config" in t, settings))
        return ev, clues
    if "Fallback to pytorch engine because" in t:
        # lmdeploy/archs.py autoget_backend (WARNING, 0.2+): TurboMind does not support the model, or is not
        # installed; the PyTorch engine runs it
        ev.append(EngineConfig(n, t, "pytorch", False, ()))
        return ev, clues
    m = _CACHE_CONFIG.search(t) if "CacheConfig(" in t else None
    # the PyTorch engine's repr once the count is set (max_batches= from 0.6, window_size= before); vLLM's
    # CacheConfig repr has gpu_memory_utilization= and no window_size=
    if (m and re.search(r"\bnum_gpu_blocks=\d", m.group(1)) and "gpu_memory_utilization=" not in m.group(1)
            and ("max_batches=" in m.group(1) or "window_size=" in m.group(1))):
        for key, value in _CACHE_FIELD.findall(m.group(1)):
            read({"block_size": "pt_block_size", "cache_max_entry_count": "pt_ratio",
                  "quant_policy": "pt_quant_policy", "max_prefill_token_num": "pt_prefill_tokens"}.get(key, key), value)
        # CacheConfig gained max_batches in 0.6.0; cache_engine.py logged "build CacheEngine with config:" until the
        # executor's "Building CacheEngine with config:" (0.7.3)
        clues.append(_clue((0, 6, 0), None, "CacheConfig(max_batches=...) (0.6+)") if "max_batches=" in m.group(1)
                     else _clue((0, 2, 4), (0, 5, 99), "CacheConfig without max_batches (<=0.5)"))
        if "build CacheEngine with config:" in t:
            clues.append(_clue((0, 2, 4), (0, 7, 2), "'build CacheEngine with config:' (<=0.7.2)"))
        return ev, clues
    for needle, rx, keys in _SIMPLE:
        m = rx.search(t) if needle in t else None
        if m:
            for key, value in zip(keys, m.groups()):
                read(key, value)
            return ev, clues
    m = _RELEASE.search(t) if "LMDeploy: " in t else None
    if m:
        v = parse_version(m.group(1))
        ev.append(Release(n, t, m.group(1)))
        return ev, clues + [_clue(v, v, f"LMDeploy {m.group(1)} (check_env)")]
    for needle, kind in _FAILURES:
        at = t.find(needle)
        if at >= 0:
            cut = t.rfind("] ", 0, at)  # the message after the logger's last bracket; the whole line without one
            ev.append(Failure(n, t, rank, "target", kind, quote(t[cut + 2 if cut >= 0 else 0:] if kind == "oom"
                                                               else t[at:]), oom_numbers(t)))
            return ev, clues
    m = _MODEL_KEY.search(t)
    if m:
        read(_MODEL_KEYS[m.group(1)], m.group(2))
        return ev, clues
    m = _MODEL_ARCH.search(t) if "model_arch" in t else None
    if m:
        ev.append(ModelArch(n, t, m.group(1)))
        return ev, clues
    return ev, clues


#: events that are LMDeploy's own words (a startup needs one: a model-config key or an OOM alone is not)
def _own(e: Event) -> bool:
    if isinstance(e, EngineConfig):
        return True
    if isinstance(e, Failure):
        return e.kind not in GENERIC_FAILURES or "[TM]" in e.text or "lmdeploy" in e.text
    if isinstance(e, Reading):
        return e.key not in _MODEL_KEYS.values()
    return False


class LMDeployParser(LMDeployWords):
    def parse(self, lines: Iterable[Line]) -> list[Startup]:
        startups: list[Startup] = []
        events: list[Event] = []
        clues: list[VersionRange] = []
        first = last = 0
        pool_seen = False
        blocks_seen = 0
        tp: int | None = None  # the latest TP size the start's lines state

        def flush() -> None:
            # a TurboMind model-config dump (three keys or more) is LMDeploy's too: a WARNING-level log has nothing else
            dump = sum(1 for e in events if isinstance(e, Reading) and e.key in _MODEL_KEYS.values()) >= 3
            if any(_own(e) for e in events) or dump:
                era = resolve(clues, VersionRange((0, 1, 0), None))
                startups.append(Startup(ENGINE, len(startups) + 1, first, last, {}, tuple(events), era, None))

        rows: list[tuple[Line, list[Event], list[VersionRange]]] = []
        for line in lines:
            ev, cl = parse_line(line)
            # a JSON model-config line is a quoted key and a number, the whole line: masking the key would hide it
            if not _dump_line(ev):
                ev = unquoted(line, ev, lambda masked: parse_line(masked)[0])
            if ev:
                rows.append((line, ev, cl))
        own, dropped = anchored([(line, ev) for line, ev, _ in rows], OWN_PREFIX)
        for (line, _, cl), ev in zip(rows, own):
            if not ev:
                continue  # the engine's words without its prefix, in a log whose lines carry it: not its line
            # the next start: a new engine config after a pool, or another pool once every rank has logged its
            # own (TurboMind <=0.12 prints the block manager once per rank, untagged: the TP size tells them apart)
            block = any(isinstance(e, Reading) and e.key == "block_mib" for e in ev)
            new_start = pool_seen and (
                any(isinstance(e, EngineConfig) and not e.updated for e in ev)
                or any(isinstance(e, Reading) and e.key == "object_budget_mib" for e in ev)
                or (block and tp is not None and blocks_seen >= tp))
            if new_start:
                flush()
                events, clues, pool_seen, blocks_seen, tp = [], [], False, 0, None
            if not events:
                first = line.number
            last = line.number
            events.extend(ev)
            clues.extend(cl)
            blocks_seen += block
            for e in ev:
                said = dict(e.settings).get("tp") if isinstance(e, EngineConfig) else (
                    e.value if isinstance(e, Reading) and e.key == "tp" else None)
                tp = int(said) if said is not None else tp
            if any(isinstance(e, Reading) and e.key in ("max_block_count", "object_budget_mib", "num_gpu_blocks")
                   for e in ev):
                pool_seen = True
        flush()
        return with_unprefixed(startups, dropped)
