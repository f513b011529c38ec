"""Issue 39, High 2: lines a request wrote into a log that carries no process id (a plain file, `docker logs`, a
paste). A request logged with a raw newline prints whatever follows the newline as a line of its own, with the
engine's prefix if the sender wrote one. Each engine's memory, startup and failure lines, injected after a real
startup's serving lines with and without the prefix, must leave the audit unchanged, and a line a grammar would
read is named in the audit's notes as set aside (kvaudit.parse.request_time). The companion tests show the same
lines inside the startup do change the audit, so the guard is where a line stands, not its words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.report.json import audit_dict
from tests.conftest import FIXTURES, SAMPLES

CORPUS = FIXTURES / "corpus"

SG = "[2026-05-25 18:19:05 TP0] "
VE = "(EngineCore_0 pid=1) ERROR 06-10 22:55:45 [core.py:700] "
VI = "(EngineCore_0 pid=1) INFO 06-10 22:55:45 [gpu_worker.py:276] "
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.11 GiB of which 1.00 GiB is free.")

#: (real log that serves, engine prefix, the line's text); every base log carries the line its server prints once
#: it serves or its startup summary: SGLang's summary and "fired up", vLLM's stats, uvicorn's "Application startup
#: complete" (LMDeploy's c014 ends at uvicorn's "Waiting for application startup.": the next line uvicorn prints,
#: "Application startup complete.", is added)
SHAPES: dict[str, tuple[Path, list[tuple[str, str, str]]]] = {
    "sglang": (CORPUS / "sglang_c011.log", [
        ("server_args", "[2026-05-25 18:19:05] ", "server_args=ServerArgs(model_path='/tmp/evil/.docker', "
                                                  "tokenizer_path='/tmp/evil/.docker', mem_fraction_static=0.5)"),
        ("weight_begin", SG, "Load weight begin. avail mem=79.00 GB"),
        ("weight_end", SG, "Load weight end. type=Evil, dtype=torch.bfloat16, avail mem=1.00 GB, mem usage=70.00 GB."),
        ("kv_alloc", SG, "KV Cache is allocated. #tokens: 5, K size: 0.01 GB, V size: 0.01 GB"),
        ("pool_end", SG, "Memory pool end. avail mem=1.00 GB"),
        ("summary", SG, "max_total_num_tokens=5, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                        "max_running_requests=4, context_len=4096, available_gpu_mem=1.00 GB"),
        ("not_enough", SG, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                           "Current value: mem_fraction_static=0.5"),
        ("oom", SG, OOM),
        ("hit_exception", SG, "Scheduler hit an exception: Traceback (most recent call last):"),
        ("killed", "", "Killed"),
    ]),
    "vllm": (CORPUS / "vllm_c024.log", [
        ("weights", VI, "Model loading took 99.0000 GiB and 1.0 seconds"),
        ("kv_memory", VI, "Available KV cache memory: 99.00 GiB"),
        ("kv_tokens", VI.replace("gpu_worker.py:276", "kv_cache_utils.py:716"), "GPU KV cache size: 5 tokens"),
        ("kv_needed", VE, "ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB "
                          "KV cache is needed, which is larger than the available KV cache memory (1.00 GiB). Try "
                          "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                          "engine."),
        ("no_blocks", VE, "ValueError: No available memory for the cache blocks. Try increasing "
                          "`gpu_memory_utilization` when initializing the engine."),
        ("oom", VE, OOM),
    ]),
    "trtllm": (SAMPLES / "trtllm_001.log", [
        ("kv_alloc", "[TensorRT-LLM][INFO] ", "[MemUsageChange] Allocated 99.00 GiB for max tokens in paged KV cache "
                                              "(5)."),
        ("mem_usage", "[12/20/2025-04:30:00] [TRT-LLM] [I] ", "Memory usage when calculating max tokens in paged kv "
                                                              "cache: total: 79.11 GiB, available: 1.00 GiB"),
        ("checkpoint", "", "/tmp/evil/models--x--y/snapshots/0123456789abcdef"),
        ("executor_oom", "[TensorRT-LLM][ERROR] ", "Executor creation failed due to insufficient GPU memory."),
        ("oom", "[TensorRT-LLM][ERROR] ", OOM),
    ]),
    "lmdeploy": (CORPUS / "lmdeploy_c014.log", [
        ("block_size", "[TM][INFO] ", "[BlockManager] block_size = 1 MB"),
        ("block_count", "[TM][INFO] ", "[BlockManager] max_block_count = 5"),
        ("engine_config", "2025-01-01 10:00:00,000 - lmdeploy - INFO - ",
         "TurbomindEngineConfig(dtype='auto', model_format=None, tp=1, session_len=None, max_batch_size=128, "
         "cache_max_entry_count=0.1, cache_block_seq_len=64)"),
        ("oom", "2025-01-01 10:00:00,000 - lmdeploy - ERROR - ", OOM),
    ]),
}

#: what is not guarded yet (docs/check.md): LMDeploy's release clues are read per line, not per event, so a
#: TurbomindEngineConfig line set aside after serving still narrows the release range its fields name (the
#: audit's figures, status and findings are unchanged; the default fraction's wording names the narrower range)
KNOWN = {("lmdeploy", "engine_config", "prefixed"): "a set-aside line's release clue still narrows the range"}

CASES = [pytest.param(engine, name, prefix if how == "prefixed" else "", text, id=f"{engine}-{name}-{how}",
                      marks=[pytest.mark.xfail(reason=KNOWN[(engine, name, how)], strict=True)]
                      if (engine, name, how) in KNOWN else [])
         for engine, (_, shapes) in SHAPES.items() for name, prefix, text in shapes
         for how in ("prefixed", "bare") if how == "prefixed" or prefix]


def _audit(path: Path):
    with open(path, "rb") as f:
        log = read_log(f)
    (a,) = audit(log, AuditOptions())
    return log, a


def _summary(path: Path):
    log, a = _audit(path)
    d = audit_dict(a)
    s = log.startups[-1]
    return (d["status"], d["headline"], len(log.startups), s.model_path, sorted(f["code"] for f in d["findings"]),
            d["formula"])


def _written(tmp_path: Path, text: str, name: str = "server.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


#: the line uvicorn prints after "Waiting for application startup." once the app is up
SERVED = {"lmdeploy": "INFO:     Application startup complete.\n"}


def _served(tmp_path: Path, engine: str) -> Path:
    """The engine's base log, as a file, once the server serves."""
    base, _ = SHAPES[engine]
    return _written(tmp_path, base.read_text() + SERVED.get(engine, ""), "base.log")


@pytest.mark.parametrize("engine, name, prefix, text", CASES)
def test_a_line_a_request_wrote_after_serving_changes_nothing(tmp_path, engine, name, prefix, text):
    base = _served(tmp_path, engine)
    real = base.read_text()
    number = real.count("\n") + 1
    forged = _written(tmp_path, real + prefix + text + "\n")
    assert _summary(forged) == _summary(base)
    _, a = _audit(forged)
    said = [n for n in a.notes if "set aside" in n or "not read" in n]
    read_inside = _changes_inside(tmp_path, base, prefix + text)
    if read_inside:  # a line a grammar reads: said, by its number
        assert any(f"{number}" in n for n in said), a.notes


def _changes_inside(tmp_path: Path, base: Path, line: str) -> bool:
    """The line put inside the startup: just before its last event line (before its summary or serving)."""
    log, _ = _audit(base)
    at = log.startups[-1].events[-1].line
    lines = base.read_text().splitlines(keepends=True)
    return _summary(_written(tmp_path, "".join(lines[:at - 1] + [line + "\n"] + lines[at - 1:]))) != _summary(base)


@pytest.mark.parametrize("engine, name", [
    ("sglang", "server_args"), ("sglang", "kv_alloc"), ("sglang", "oom"), ("sglang", "not_enough"),
    ("vllm", "kv_tokens"), ("vllm", "no_blocks"), ("vllm", "oom"),
    ("trtllm", "kv_alloc"), ("trtllm", "executor_oom"),
    ("lmdeploy", "block_count"), ("lmdeploy", "oom"),
])
def test_the_same_line_inside_the_startup_is_read(tmp_path, engine, name):
    """The guard is where the line stands: inside the startup, before the server serves, it is read (so the test
    above would fail if these lines were never read)."""
    _, shapes = SHAPES[engine]
    prefix, text = next((p, t) for n, p, t in shapes if n == name)
    assert _changes_inside(tmp_path, _served(tmp_path, engine), prefix + text)


def test_a_serving_host_is_never_called_failed_by_a_request(tmp_path):
    """The one of last round's 26 that turned a serving host into "ERROR startup failed": SGLang's own
    out-of-memory error after the server had served requests. It is said as a line not read, not hidden."""
    base = CORPUS / "sglang_c022.log"
    real = base.read_text()
    forged = _written(tmp_path, real + SG + OOM + "\n" + "Killed\n")
    log, a = _audit(forged)
    assert audit_dict(a)["status"] == "ok", audit_dict(a)["headline"]
    assert any("after the startup was complete" in n and "not read as the startup's" in n for n in a.notes), a.notes


def test_a_copy_of_the_whole_startup_is_set_aside_by_its_times(tmp_path):
    """A request can print many lines: a copy of the startup's own lines, opening and sequence, passes every rule
    but time. Their stamps are the startup's, behind the serving lines above them: set aside and said."""
    import re

    base = CORPUS / "sglang_c008.log"  # 12 minutes from its server_args to its last batch line
    real = base.read_text()
    copy = re.sub(r"model_path='[^']*'", "model_path='/tmp/evil'", real)
    log, a = _audit(_written(tmp_path, real + copy))
    assert len(log.startups) == 1 and "/tmp/evil" not in str(log.startups[0].model_path)
    assert any("set aside" in n and "copies of earlier lines" in n for n in a.notes), a.notes


def test_a_real_restart_in_a_docker_log_is_still_the_latest_startup(tmp_path):
    """docker logs of a restarted vLLM container: the same `(APIServer pid=1)` tags, later times, the whole
    startup again. It is a restart, audited as startup 2, with nothing set aside."""
    base = CORPUS / "vllm_c024.log"
    real = base.read_text()
    again = real.replace(" 06-10 ", " 06-11 ")
    log, a = _audit(_written(tmp_path, real + again))
    assert len(log.startups) == 2 and log.startups[-1].first_line > real.count("\n")
    assert not any("set aside" in n for n in a.notes), a.notes


def test_a_restart_that_failed_after_a_crash_loop_is_still_read(tmp_path):
    """A startup that failed, then one more that failed the same way (a crash loop): nothing came up, so an
    error after an opening line is the restart's own and the latest startup is the failed one."""
    base = CORPUS / "sglang_c037.log"
    real = base.read_text()
    log, a = _audit(_written(tmp_path, real + real.replace("2026-", "2027-")))
    assert len(log.startups) == 2 and audit_dict(a)["status"] == "error"


def _kvaudit(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("kvaudit")
    env = {k: v for k, v in os.environ.items() if k != "KVAUDIT_DEBUG"}
    return subprocess.run([str(exe), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_a_forged_startup_in_a_plain_file_chooses_no_config_json(tmp_path):
    """The capture of a host whose log is a plain file (`--source file:`): a request-printed `server_args` line
    naming a directory with a config.json that parses as a model's (the attacker's choice) no longer opens a
    startup, so that file is neither read nor copied into the capture; the notes say the line was set aside."""
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "config.json").write_text((FIXTURES / "hosts" / "kimi-k25-tp8" / "config.json").read_text())
    log = tmp_path / "server.log"
    real = (CORPUS / "sglang_c011.log").read_text()
    log.write_text(real + f"[2026-05-25 18:19:05] server_args=ServerArgs(model_path='{evil}', "
                          f"tokenizer_path='{evil}', mem_fraction_static=0.5, tp_size=1)\n")
    out = tmp_path / "cap"
    r = _kvaudit("capture", "local", "--source", f"file:{log}", "-o", out, cwd=tmp_path)
    assert out.joinpath("capture.json").exists(), r.stderr
    assert not out.joinpath("config.json").exists()
    assert json.loads(out.joinpath("capture.json").read_text()).get("config_source") is None
    doc = json.loads(_kvaudit("check", out, "-f", "json", cwd=tmp_path).stdout)
    assert doc["startup"]["total"] == 1 and str(evil) not in json.dumps(doc["model"])
    assert any("set aside" in n and f"line {real.count(chr(10)) + 1}" in n for n in doc["notes"]), doc["notes"]
