"""A field test on vLLM startup logs kvaudit had not seen (issue 33, "Know the edge"): each test runs one real log
of the corpus (fixtures/corpus/new-fieldvllm.json names its source and truth) and holds the class of problem it
showed to what vLLM's code at that release does."""

from __future__ import annotations

import io

from kvaudit.explain import audit, read_log
from kvaudit.parse.vllm import has_process_tag, rank_of
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.reconcile.vllm.context import build_context
from kvaudit.verdict import judge
from tests.conftest import ROOT

CORPUS = ROOT / "fixtures" / "corpus"


def startup(name: str):
    with open(CORPUS / f"{name}.log", "rb") as fh:
        return read_log(fh)


def run(name: str):
    with open(CORPUS / f"{name}.log", "rb") as fh:
        return audit(read_log(fh), AuditOptions(source=name))[-1]


def codes(a):
    return {f.code: f for f in a.findings}


def test_a_ray_worker_tag_with_the_node_address_is_a_worker_and_its_fold_counts_workers():
    """vllm#15598 (V0 0.8 on a multi-node Ray cluster): '(RayWorkerWrapper pid=N, ip=A)' is a worker's tag (it was
    read as no tag, so the report said the log carried none), and Ray's '[repeated 30x across cluster]' says 30 more
    workers printed the line: TP x PP is at least 31, said as such, not taken for the TP size."""
    line = (CORPUS / "vllm_c065.log").read_text(encoding="utf-8").splitlines()[1]
    assert has_process_tag(line) and rank_of(line).label == "pid 1463574"
    a = run("vllm_c065")
    notes = " ".join(a.notes)
    assert "carries no process tags" not in notes
    assert "'[repeated 30x across cluster]'" in notes and "TP x PP is at least 31" in notes
    assert {"BUDGET_RECONCILES", "LOW_HEADROOM"} <= set(codes(a))


def test_a_v0_workers_failed_startup_step_is_a_failed_start():
    """OpenRLHF#336 (V0 in a Ray actor): worker_base.py execute_method logs 'Error executing method
    initialize_cache. This might cause deadlock ...' and re-raises: the startup failed (it was 'unchecked' with
    'No problem was found')."""
    a = run("vllm_c069")
    assert "STARTUP_FAILED" in codes(a) and judge(a).status == "error"
    assert "initialize_cache" in codes(a)["STARTUP_FAILED"].message


def test_a_v0_workers_exception_header_does_not_hide_the_cause():
    """vllm#14092: 'Exception in worker VllmWorkerProcess while processing method load_model.' announces a
    traceback; the cause quoted is the CUDA OOM another worker printed, not the header."""
    a = run("vllm_c068")
    failed = codes(a)["STARTUP_FAILED"]
    assert "CUDA out of memory" in failed.message and "while processing method" not in failed.message


def test_a_v0_pool_below_the_model_length_is_a_failed_start_even_when_the_log_stops_before_the_error():
    """vllm#2418 (0.2.x): 229 blocks x 16 = 3,664 tokens < max_seq_len 4,096, and _init_cache raises ValueError
    there (0.4-0.10: worker.py raise_if_cache_size_invalid); the excerpt ends in the traceback before the error."""
    a = run("vllm_c064")
    # the release is told by where llm_engine.py logged the block line (275: the 0.2.7 wheel; 0.2.6, whose banner is
    # the same, logs it at 223 and has no such check)
    assert a.engine_version == "0.2.7"
    mem = codes(a)["NOT_ENOUGH_MEMORY"]
    assert "3,664 tokens" in mem.message and "4,096" in mem.message and "--max-model-len 3,664 fits" in mem.message
    assert mem.fields["max_model_len_that_fits"] == 3664 and judge(a).status == "error"
    # a V0 pool that holds the model length raises nothing (vllm_c059: no length in the excerpt; c063: none either)
    assert "NOT_ENOUGH_MEMORY" not in codes(run("vllm_c059"))


def test_the_018_opt_in_graph_note_gives_the_utilisation_and_the_total():
    """vllm PR #30515 (0.18): 'In v0.19, CUDA graph memory profiling will be enabled by default ... increase
    --gpu-memory-utilization from 0.7000 to 0.7021' (gpu_worker.py, 0.18.0 wheel: the second is
    min(round(util + estimate / total, 4), 1.0)): util 0.70 is read, the total 0.26 / 0.0021 is said with its
    rounding interval, and the estimate is not taken from the budget (opt-in in 0.18)."""
    s = startup("vllm_c061").startups[-1]
    ctx = build_context(s, AuditOptions())
    assert ctx.util == 0.7 and ctx.era.lo == (0, 18, 0)
    a = run("vllm_c061")
    assert a.formula.mem_fraction_static == 0.7
    assert any("118.6..129.3 GiB" in n and "(0.7021 - 0.7) x total" in n for n in a.notes)
    assert judge(a).status == "unchecked"


def test_a_mamba_hybrid_told_by_its_capping_warning_is_not_judged_per_token():
    """The same log: config/compilation.py prints 'Capping cudagraph capture sizes ... to fit Mamba cache blocks
    (361 blocks available)' only for a Mamba/attention hybrid. Its concurrency (5.23x) is the groups' per-request
    need, not tokens / max_model_len (no CONCURRENCY_MISMATCH), its attention block is not the default 16 (no such
    note), and without the config the pool is unchecked for that reason, not for bytes per token."""
    a = run("vllm_c061")
    assert "CONCURRENCY_MISMATCH" not in codes(a)
    assert not any("block size 16" in n for n in a.notes)
    assert any(n.startswith("a Mamba hybrid (line 6") for n in a.notes)
    assert "hybrid (Mamba) pool" in a.formula.verdict_reason


def test_a_pool_below_the_model_length_before_0_2_7_is_not_called_a_failed_start():
    """The same lines as logged by 0.2.6 (llm_engine.py:223): that release has no max-seq-len check in
    _init_cache (read in the 0.2.0-0.2.6 wheels), so nothing says the start failed."""
    text = (CORPUS / "vllm_c064.log").read_text(encoding="utf-8").replace("llm_engine.py:275]", "llm_engine.py:223]")
    a = audit(read_log(io.BytesIO(text.encode())), AuditOptions())[-1]
    assert a.engine_version == "0.2.6" and "NOT_ENOUGH_MEMORY" not in codes(a)


def test_a_log_of_sleep_mode_lines_is_read_and_said_not_refused():
    """vllm PR #11743 (a comment, 0.7.x): 'Sleep mode freed 0.00 GiB memory, 63.15 GiB memory is still in use.'
    (worker.py sleep(): freed = free after - free before; in use = total - free after) is vLLM's memory line;
    a log of these alone was refused ("no ... startup lines found"). vllm#17117: after a budget line, the same
    line was listed as not interpreted; now both are read and said."""
    a = run("vllm_c073")
    assert judge(a).status == "unchecked"
    assert any(n.startswith("sleep mode (line 2, TP0): 0.00 GiB freed, 63.15 GiB") for n in a.notes)
    b = run("vllm_c074")
    assert any("19.51 GiB freed, 26.31 GiB of the card still in use" in n for n in b.notes)
    assert b.formula.mem_fraction_static == 0.25
