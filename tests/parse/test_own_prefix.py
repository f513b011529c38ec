"""In a log whose engine lines carry the engine's log prefix, a line with the engine's words but without the
prefix is not the engine's (issue 21, item 6): another program's output in the same unit, an unquoted echo, a
forged line. A log pasted without prefixes is read as it is; lines the engine itself prints bare stay read."""

from __future__ import annotations

import io

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import FIXTURES, SAMPLES

CORPUS = FIXTURES / "corpus"


def _read(text: str):
    log = read_log(io.BytesIO(text.encode()))
    (a,) = audit(log, AuditOptions())
    return log, a


def _summary(log, a):
    last = log.startups[-1]
    return (log.engine.name, len(log.startups), [type(e).__name__ for e in last.events], last.model_path,
            dict(last.server_args or {}), a.formula, [(r.label, r.logged) for r in a.ranks],
            [f.code for f in a.findings])


# the engine's memory lines as its grammar reads them, written without its prefix (each one alone changes the
# audit when it carries the prefix: test_the_same_lines_prefixed_are_read)
FORGED = {
    SAMPLES / "sglang_029.log": (
        "[2025-02-04 05:30:00 TP0] ",
        ["Load weight end. type=Evil, dtype=torch.bfloat16, avail mem=1.00 GB, mem usage=70.00 GB.",
         "KV Cache is allocated. #tokens: 5, K size: 0.01 GB, V size: 0.01 GB",
         "Memory pool end. avail mem=1.00 GB",
         "max_total_num_tokens=5, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4, "
         "context_len=4096, available_gpu_mem=1.00 GB"],
    ),
    SAMPLES / "vllm_106.log": (
        "(EngineCore_0 pid=1) INFO 07-09 03:00:00 [gpu_worker.py:276] ",
        ["Model loading took 99.0000 GiB and 1.0 seconds",
         "Available KV cache memory: 99.00 GiB",
         "GPU KV cache size: 5 tokens",
         "non-default args: {'model': '/etc/evil', 'gpu_memory_utilization': 0.1}"],
    ),
    SAMPLES / "trtllm_001.log": (
        "[TensorRT-LLM][INFO] ",
        ["[MemUsageChange] Allocated 99.00 GiB for max tokens in paged KV cache (5).",
         "Memory usage when calculating max tokens in paged kv cache: total: 79.11 GiB, available: 1.00 GiB"],
    ),
    CORPUS / "lmdeploy_c001.log": (
        "[TM][INFO] ",
        ["[BlockManager] block_size = 1 MB", "[BlockManager] max_block_count = 5"],
    ),
}


def _ids(p):
    return p.name


@pytest.mark.parametrize("path", sorted(FORGED), ids=_ids)
def test_lines_without_the_prefix_are_not_the_engines(path):
    real = path.read_text()
    _, lines = FORGED[path]
    forged = real + "".join(f"{line}\n" for line in lines) * 2
    log, a = _read(forged)
    assert _summary(log, a) == _summary(*_read(real))
    assert "/etc/evil" not in str(_summary(log, a))
    skipped = log.startups[-1].unprefixed
    assert len(skipped) >= len(lines), "the skipped lines are counted"  # vLLM's args line is refused before
    note = next(n for n in a.notes if "without its log prefix" in n)
    assert f"{len(skipped):,} lines" in note and f"lines {skipped[0]}, " in note


@pytest.mark.parametrize("path", sorted(FORGED), ids=_ids)
def test_the_same_lines_prefixed_are_read(path):
    """The guard is the prefix, not the words: each forged line with the engine's prefix changes the audit (so
    the test above would fail if unprefixed lines were read)."""
    real = path.read_text()
    prefix, lines = FORGED[path]
    before = _summary(*_read(real))
    head, rest = real.split("\n", 1)  # inside the startup: after its completion such lines are set aside
    for line in lines:
        assert _summary(*_read(head + "\n" + prefix + line + "\n" + rest)) != before, line


def test_a_log_pasted_without_prefixes_is_read_as_it_is():
    """An excerpt whose every line lost its prefix (a user pasted messages only) is still audited."""
    real = (CORPUS / "vllm_c014.log").read_text()
    log, a = _read(real)
    assert log.engine.name == "vllm" and a.formula is not None
    assert not log.startups[-1].unprefixed
    assert not any("without its log prefix" in n for n in a.notes)


def test_lines_the_engine_prints_bare_are_read_in_a_prefixed_log():
    """A traceback's exception and a dump's continuation lines carry no prefix in the engine's own output."""
    log, a = _read((CORPUS / "lmdeploy_c007.log").read_text())
    kinds = {type(e).__name__ for e in log.startups[-1].events}
    assert "ModelArch" in kinds
    log, a = _read((CORPUS / "sglang_c009.log").read_text())
    assert any(type(e).__name__ == "Failure" and e.kind == "oom" for e in log.startups[-1].events)
    assert not log.startups[-1].unprefixed


def test_two_checkpoint_paths_choose_none():
    """trtllm-serve's wrapper prints the checkpoint directory bare: a second, different path in the log leaves
    the checkpoint unknown (said by check as no config.json), so a line added to the log cannot choose it."""
    real = (SAMPLES / "trtllm_001.log").read_text()
    log, _ = _read(real)
    assert log.startups[-1].model_path and "gpt-oss-120b" in log.startups[-1].model_path
    head, rest = real.split("\n", 1)  # inside the startup, before the server serves
    log, _ = _read(head + "\n/etc/evil/models--x--y/snapshots/0123456789abcdef\n" + rest)
    assert log.startups[-1].model_path is None
    # after the server serves (uvicorn's "Application startup complete"), such a line is set aside and said
    log, a = _read(real + "/etc/evil/models--x--y/snapshots/0123456789abcdef\n")
    assert "gpt-oss-120b" in log.startups[-1].model_path
    assert any("after the startup was complete" in n for n in a.notes), a.notes
