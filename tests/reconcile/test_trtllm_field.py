"""TensorRT-LLM startups kvaudit had never seen (fixtures/corpus trtllm_c027..c034, new-fieldtrt.json), each class
on its real lines: TensorRT's memory tracker read as the engine, the fraction's default by release, the estimation
dry run's blocks, a pool line a later KV cache manager replaces; and the budget steps that return their findings
(issue 33)."""

from __future__ import annotations

import inspect

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.reconcile.trtllm.budget import kv_budget
from kvaudit.reconcile.trtllm.cell import bytes_per_token
from kvaudit.reconcile.trtllm.context import build_context
from kvaudit.reconcile.trtllm.facts import logged_pool
from tests.conftest import ROOT, cli

CORPUS = ROOT / "fixtures" / "corpus"


def _audit(name):
    d = cli("explain", CORPUS / f"{name}.log", "-f", "json").json()
    return d["audits"][0] if "audits" in d else d


def _item(a, label, key):
    rank = next(r for r in a["ranks"] if r["label"] == label)
    return next((i["gib"] for i in rank["items"] if i["key"] == key), None)


def test_tensorrts_tracker_line_is_the_engine_and_a_log_of_only_such_lines_is_read():
    """'[MemUsageChange] TensorRT-managed allocation in IExecutionContext creation: ... now: CPU 0, GPU 8163 (MiB)'
    is what TensorRT holds after the execution context is created, the deserialized engine (869 MiB beside
    'Loaded engine size: 875 MiB' in trtllm_c017). It was neither read nor listed as not interpreted (its unit is in
    parentheses), and a log holding only such lines (trtllm_c033, NVIDIA/TensorRT-LLM#2305) was refused as 'no
    startup lines found'."""
    a = _audit("trtllm_c028")  # tensorrtllm_backend#569: TP 2, 18.75 GiB of execution context, a 3,136-token pool
    assert _item(a, "TP0", "weights") == 7.9717
    assert _item(a, "TP0", "activation_peak") == 18.3117
    assert not a["uninterpreted_lines"]
    run = cli("explain", CORPUS / "trtllm_c033.log", "-f", "json")
    assert run.code == 0, run.stderr
    b = run.json()
    assert _item(b, "TP0", "weights") == 4.4775
    assert any(f["code"] == "INCOMPLETE_LOG" for f in b["findings"])


def test_the_fractions_default_is_the_releases():
    """Releases before 0.8 default kv_cache_free_gpu_mem_fraction to 0.85 (batch_manager/kvCacheConfig.h
    kDefaultGpuMemFraction; tensorrtllm_backend v0.5.0-v0.7.2 print 'will use default value of 0.85'), 0.8 on to 0.9.
    A C++ log whose lines do not tell the era apart (trtllm_c029, January 2024) says the default it assumes and the
    other; a PyTorch-backend log (0.17+; trtllm_c032's dry-run line) is 0.9 with no caveat."""
    old = _audit("trtllm_c029")["formula"]
    assert old["mem_fraction_static"] == 0.9
    assert old["mem_fraction_static_source"] == "default 0.9 (the log does not state it; 0.85 before 0.8)"
    new = _audit("trtllm_c032")["formula"]
    assert new["mem_fraction_static_source"] == "default 0.9 (the log does not state it)"


def test_the_estimation_dry_runs_pools_are_not_the_servers():
    """trtllm_c032 (NVIDIA/TensorRT-LLM#15182, Kimi K2.6, 2026): '[kv cache manager] Primary/secondary blocks for
    window sizes set to {262146: (8256, 0)} for estimation dry run' names the temporary cache's blocks; the pool lines
    of 8,256 x 32 = 264,192 tokens (8.65 GiB on rank 0, a 0.14 GiB draft manager on rank 2) were the headline's
    pool."""
    a = _audit("trtllm_c032")
    assert a["formula"]["logged_tokens"] is None
    assert "264,192" not in a["headline"].split(":")[0]
    reason = a["formula"]["verdict_reason"]
    assert "8,256 blocks of 32, which line 5 says were set for the estimation dry run" in reason


def test_a_pool_line_a_later_kv_manager_replaces_is_not_claimed():
    """ai-dynamo/dynamo#1299 (trtllm_c034, 0.21 PyTorch backend, the Python logger's INFO lines absent): the one pool
    line (131,104 tokens) is followed by a second manager's 'Max KV cache pages per sequence' (line 16) whose pool
    line is cut: the temporary profiling cache comes first, so the line is not the server's pool."""
    a = _audit("trtllm_c034")
    assert a["formula"]["logged_tokens"] is None
    assert "followed by another KV cache manager's creation (line 16)" in a["formula"]["verdict_reason"]
    assert any(f["code"] == "INCOMPLETE_LOG" for f in a["findings"])


def test_the_cell_and_budget_steps_return_their_findings():
    """Issue 33: the steps return what they found (Cell.findings, Budget.findings) instead of appending to a list
    the caller hands them; on trtllm_c027 (1.1.0, TinyLlama) the budget check reconciles and the count matches."""
    assert "findings" not in inspect.signature(bytes_per_token).parameters
    assert "findings" not in inspect.signature(kv_budget).parameters
    with open(CORPUS / "trtllm_c027.log", "rb") as fh:
        log = read_log(fh)
    (startup,) = log.startups
    ctx = build_context(startup, AuditOptions())
    pool = logged_pool(ctx.facts)
    cell = bytes_per_token(ctx, pool)
    assert cell.bytes == 22528 and cell.findings == ()
    budget = kv_budget(ctx, pool)
    assert [f.code for f in budget.findings] == ["BUDGET_RECONCILES"]
    (a,) = audit(log, AuditOptions())
    assert [f.code for f in a.findings] == ["TOKENS_MATCH", "BUDGET_RECONCILES"]
    assert a.formula.logged_tokens == 1871136


def test_the_llm_args_body_is_the_engines_own_line():
    """trtllm-serve 1.x logs '[TRT-LLM] [I] LLM Args:' and prints the arguments' repr on the next line, bare
    (trtllm_c027 line 148: 'model=... kv_cache_config=KvCacheConfig(... free_gpu_memory_fraction=0.9 ...)'). It was
    set aside as 'another program's output or text echoed into the log'; it is the configured fraction, weaker
    than the float32 the peak line states."""
    a = _audit("trtllm_c027")
    assert not any("without its log prefix" in n for n in a["notes"]), a["notes"]
    assert a["formula"]["mem_fraction_static"] == 0.8999999761581421
    assert a["formula"]["mem_fraction_static_source"] == "log"
