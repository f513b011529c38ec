"""Issue 19's samples read right (fixtures/samples: copies of the public logs in fixtures/samples/INDEX.md)."""

from __future__ import annotations

import io

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.versions import VersionRange
from tests.conftest import ROOT

SAMPLES = ROOT / "fixtures" / "samples"


def run(name_or_text):
    data = name_or_text.encode() if "\n" in name_or_text else (SAMPLES / name_or_text).read_bytes()
    return audit(read_log(io.BytesIO(data)), AuditOptions())[-1]


def codes(a):
    return {f.code: f for f in a.findings}


def test_trtllm_bench_reads_its_fraction_and_warns_on_headroom():
    """trtllm_102: 'KV Memory Percentage: 99.0%' is the fraction; 63.62 x 0.99 = 62.98 ~ the 62.99 GiB pool;
    (1 - 0.99) x 63.62 = 0.64 GiB left outside is LOW_HEADROOM."""
    a = run("trtllm_102.log")
    assert a.formula.mem_fraction_static == 0.99 and a.formula.mem_fraction_static_source == "log"
    assert "BUDGET_RECONCILES" in codes(a) and "LOW_HEADROOM" in codes(a)
    assert codes(a)["LOW_HEADROOM"].fields["headroom_gib"] == 0.636


def test_the_oldest_trtllm_pool_line_is_read():
    """trtllm_103 (TensorRT-LLM ~0.5, Triton): 'Using 10718 tokens in paged KV cache.'"""
    a = run("trtllm_103.log")
    assert a.engine == "trtllm" and a.formula.logged_tokens == 10718 and a.engine_version == "0.1.0..0.8.99"


def test_a_graph_estimate_that_took_the_budget_is_named():
    a = run("vllm_201.log")
    f = codes(a)["NOT_ENOUGH_MEMORY"]
    assert f.fields["graph_estimate_gib"] == 118.65 and "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in f.message


def test_the_default_utilization_follows_the_release():
    from kvaudit.reconcile.vllm.context import default_utilization

    assert default_utilization(VersionRange((0, 22, 1), (0, 22, 1)))[0] == 0.92
    assert default_utilization(VersionRange((0, 10, 0), (0, 20, 99)))[0] == 0.9
    assert default_utilization(VersionRange((0, 10, 0), None)) == (None, None)  # 0.9 or 0.92: not assumed
