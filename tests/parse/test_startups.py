"""Startups in one input: restarts, draft-worker attribution, and the shapes logs arrive in."""

from __future__ import annotations

import io
import re

import pytest

from kvaudit.explain import audit, parse_lines, read_log
from kvaudit.model_config import load_config
from kvaudit.parse import sglang as S
from kvaudit.parse.lines import Line
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import KIMI_CONFIG, KIMI_LOG, ROOT, SAMPLES


def parse(text: str):
    return read_log(io.BytesIO(text.encode()))


def test_several_restarts_split_on_server_args_latest_by_default():
    first = (SAMPLES / "sglang_029.log").read_bytes().decode()
    second = KIMI_LOG.read_bytes().decode()
    # the third run a year later: a copy with the same times would be a copy of earlier lines (request_time)
    log = parse(first + second + first.replace("2025-", "2027-"))
    assert len(log.startups) == 3
    assert [s.first_line for s in log.startups][0] == 1
    opts = AuditOptions()
    (latest,) = audit(log, opts)
    assert latest.startup_index == 3 and latest.formula.logged_tokens == 105531
    (middle,) = audit(log, opts, startup=2)
    assert middle.formula.logged_tokens == 159277
    (again,) = audit(log, opts, startup=-2)
    assert again.startup_index == 2
    assert [a.startup_index for a in audit(log, opts, all_startups=True)] == [1, 2, 3]


def test_restart_without_server_args_splits_after_the_summary():
    body = ("[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=22.76 GB\n"
            "[2026-01-01 10:00:01 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=8.37 GB, mem usage=14.39 GB.\n"
            "[2026-01-01 10:00:02 TP0] KV Cache is allocated. #tokens: 105531, K size: 2.82 GB, V size: 2.82 GB\n"
            "[2026-01-01 10:00:03 TP0] max_total_num_tokens=105531, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=2049, context_len=131072, available_gpu_mem=1.60 GB\n")
    # the restart five minutes later: a copy with the same times would be copies of earlier lines (request_time)
    log = parse(body + body.replace("105531", "99000").replace("10:00:0", "10:05:0"))
    assert [s.of(S.KVAlloc)[0].tokens for s in log.startups] == [105531, 99000]


def test_failed_start_then_restart():
    fail = ("[2026-01-01 10:00:00] server_args=ServerArgs(mem_fraction_static=0.95, tp_size=1)\n"
            "[2026-01-01 10:00:01] Load weight begin. avail mem=22.76 GB\n"
            "[2026-01-01 10:00:02] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=8.37 GB, mem usage=14.39 GB.\n"
            "Traceback (most recent call last):\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    log = parse(fail + KIMI_LOG.read_bytes().decode())
    assert len(log.startups) == 2
    (first,) = audit(log, AuditOptions(), startup=1)
    assert {f.code for f in first.findings} >= {"STARTUP_FAILED"}
    assert first.worst.value == "error"
    (latest,) = audit(log, AuditOptions())
    assert latest.worst.value == "info"


def test_0_5_14_order_target_then_draft_weights_then_pools():
    lines = [
        "[2026-07-01 10:00:00 TP0] Load weight begin. avail mem=94.01 GB",
        "[2026-07-01 10:00:01 TP0] Load weight end. elapsed=200.00 s, type=KimiK25ForConditionalGeneration, avail mem=21.71 GB, mem usage=72.30 GB.",
        "[2026-07-01 10:00:02 TP0] Load weight begin. avail mem=21.71 GB",
        "[2026-07-01 10:00:03 TP0] Load weight end. elapsed=3.00 s, type=LlamaForCausalLMEagle3, avail mem=20.16 GB, mem usage=1.55 GB.",
        "[2026-07-01 10:00:04 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 133500, KV size: 8.74 GB",
        "[2026-07-01 10:00:04 TP0] Memory pool end. avail mem=11.30 GB",
        "[2026-07-01 10:00:04 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 133500, K size: 0.03 GB, V size: 0.03 GB",
    ]
    log = parse_lines([Line(i + 1, t) for i, t in enumerate(lines)])
    (s,) = log.startups
    roles = [(type(e).__name__, e.role) for e in s.events]
    assert roles == [("WeightBegin", "target"), ("WeightEnd", "target"), ("WeightBegin", "draft"),
                     ("WeightEnd", "draft"), ("KVAlloc", "target"), ("PoolEnd", "target"), ("KVAlloc", "draft")]


def test_interleaved_ranks_are_attributed_by_prefix():
    text = (SAMPLES / "sglang_005.log").read_text()
    (a,) = audit(parse(text), AuditOptions())
    assert [r.label for r in a.ranks] == ["TP0", "TP1", "TP2", "TP3"]
    assert {r.label: r.free_after_pool_gib for r in a.ranks} == {"TP0": None, "TP1": 12.45, "TP2": 12.45, "TP3": 12.68}


def _kimi_numbers(text: str):
    (a,) = audit(parse(text), AuditOptions(model_geometry=load_config(KIMI_CONFIG)))
    return (a.formula.pre_load_free_gib, a.formula.post_load_free_gib, a.formula.logged_tokens,
            a.formula.verdict.value, [(r.label, r.free_after_pool_gib, r.free_at_end_gib) for r in a.ranks])


def _journal_line(line: str, fmt: str) -> str:
    m = re.match(r"2026-02-25T(\S+)\+0000 (\S+) (\S+): (.*)$", line, re.S)
    assert m, line
    ts, host, unit, msg = m.groups()
    return {
        "short": f"Feb 25 {ts} {host} {unit}: {msg}",
        "cat": msg,
        "docker": f"2026-02-25T{ts}.123456789Z {msg}",
        "ansi": f"\x1b[32m{msg}\x1b[0m",
        "crlf": msg + "\r",
        "k9s": f"│ {msg} │",
        "json": __import__("json").dumps({"_HOSTNAME": host, "_SYSTEMD_UNIT": "sglang.service", "MESSAGE": msg}),
    }[fmt]


@pytest.mark.parametrize("fmt", ["short", "cat", "docker", "ansi", "crlf", "k9s", "json"])
def test_same_numbers_whatever_wrapper_the_lines_arrive_in(fmt):
    original = KIMI_LOG.read_bytes().decode()
    wrapped = "\n".join(_journal_line(l, fmt) for l in original.rstrip("\n").split("\n")) + "\n"
    assert _kimi_numbers(wrapped) == _kimi_numbers(original)


def test_blank_lines_and_user_elisions_are_tolerated():
    original = KIMI_LOG.read_bytes().decode().splitlines()
    edited = []
    for i, l in enumerate(original):
        edited.append(l)
        if i % 7 == 0:
            edited += ["", "   ", "..."]
    numbers = _kimi_numbers("\n".join(edited))
    assert numbers == _kimi_numbers("\n".join(original))


def test_truncated_lines_do_not_crash_and_lose_only_their_numbers():
    text = "\n".join(l[: len(l) * 2 // 3] for l in KIMI_LOG.read_bytes().decode().splitlines())
    log = parse(text)
    (a,) = audit(log, AuditOptions())
    assert a.engine == "sglang"


def test_a_kv_needed_error_with_another_available_figure_is_another_vllm_run():
    """corpus vllm_c009: two runs pasted without a banner between them. One startup checks the budget it
    computed (check_enough_kv_cache_memory gets the same available memory), so the error's 5.59 GiB after a logged
    10.55 GiB is a second run; the same figure would be the same run."""
    text = (ROOT / "fixtures" / "corpus" / "vllm_c009.log").read_text(encoding="utf-8")
    log = parse(text)
    assert [s.first_line for s in log.startups] == [1, 4]
    same = text.replace("memory (5.59 GiB)", "memory (10.55 GiB)")
    assert len(parse(same).startups) == 1


def test_vllm_block_lines_keep_their_cpu_count_and_era_clue():
    """'# GPU blocks: N, # CPU blocks: M' keeps M, and the V1 shape without CPU blocks narrows the era (0.6.4 to
    0.7): the grammar tells which pattern matched by the match it kept, so lazily compiled patterns cannot break
    it (an identity test against the pattern object silently dropped both)."""
    from kvaudit.parse.lines import Line
    from kvaudit.parse.vllm import Blocks, parse_line

    both = parse_line(Line(3, "INFO 10-01 12:00:00 worker.py:1] # GPU blocks: 1952, # CPU blocks: 2048"))
    assert [(e.gpu_blocks, e.cpu_blocks) for e in both.events if isinstance(e, Blocks)] == [(1952, 2048)]
    v1 = parse_line(Line(7, "INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381"))
    assert [(e.gpu_blocks, e.cpu_blocks) for e in v1.events if isinstance(e, Blocks)] == [(1381, None)]
    assert any("without CPU blocks" in e for c in v1.clues for e in c.evidence), v1.clues
    num = parse_line(Line(9, "INFO 10-01 12:00:00 worker.py:1] num_gpu_blocks is: 512"))
    assert [(e.gpu_blocks, e.cpu_blocks) for e in num.events if isinstance(e, Blocks)] == [(512, None)]
