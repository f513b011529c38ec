"""SGLang on ROCm: T is read before the model registry's imports, the printed 'Load weight begin' after them.

Real lines: AMD's sglang-ci Grok 2.5 server log (fixtures/corpus/sglang_c053.log, v0.5.6.post2 on MI355X, aiter):
its pool of 5,599,082 tokens lies 4,203 tokens below the formula run on the printed reading (T 0.46 GiB above it
explains them), the class seen on 44 such ROCm startups (up to 0.50 GiB)."""

from __future__ import annotations

import io
import re

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions, Verdict
from tests.conftest import FIXTURES

GROK = (FIXTURES / "corpus" / "sglang_c053.log").read_bytes()


def _audit(data: bytes):
    return audit(read_log(io.BytesIO(data)), AuditOptions(source="grok"))[-1]


def test_the_grok_pool_on_rocm_lies_within_the_drift_of_t():
    a = _audit(GROK)
    f = a.formula
    assert f.verdict == Verdict.MATCH, f.verdict_reason
    assert f.predicted_tokens is not None and f.predicted_tokens.low <= 5_599_082 <= f.predicted_tokens.high
    # the upper end is the printed reading's: only T's lower bound moved
    assert f.predicted_tokens.high == 5_604_359
    assert any("ROCm (attention_backend='aiter')" in n and "0.6 GiB above it" in n for n in a.notes)


def test_a_pool_further_below_than_the_drift_allows_is_still_a_mismatch():
    # the drift allows 0.6 GiB x (1 - 0.7225) = 0.17 GiB of budget, about 5,450 tokens of 32,768 B; with every
    # rank's free memory after the weights 0.26 GiB higher the pool lies about 12,700 tokens below: beyond it
    data = re.sub(rb"avail mem=250\.\d\d GB, mem usage", b"avail mem=250.30 GB, mem usage", GROK)
    assert data.count(b"avail mem=250.30 GB, mem usage") == 8
    f = _audit(data).formula
    assert f.verdict == Verdict.MISMATCH, f.verdict_reason


#: quantization/awq.py's HIP-only warning as Python's warnings module prints it (no SGLang prefix), with the echo
#: of its source line after it
AWQ_WARNING = re.compile(rb"[^\n]*quantization/awq\.py:\d+: UserWarning: HIP does not support fused_marlin_moe "
                         rb"currently\.\n")


def test_without_a_sign_of_rocm_the_printed_reading_is_t():
    data = AWQ_WARNING.sub(b"", GROK.replace(b"attention_backend='aiter'", b"attention_backend='triton'"))
    assert data != GROK and b"awq.py" not in data
    a = _audit(data)
    assert a.formula.verdict == Verdict.MISMATCH, a.formula.verdict_reason
    assert not any("ROCm" in n for n in a.notes)


def test_server_args_own_rocm_warning_is_a_sign_of_rocm():
    """GLM-5 on MI355X with the triton backend (sglang_c052, 0.5.9 image): no aiter in server_args, but
    server_args.py's 'Setting page size to 1 for DeepSeek DSA on ROCm.' (printed only under is_hip())."""
    from kvaudit.reconcile.sglang.audit import rocm_evidence
    from kvaudit.reconcile.sglang.context import build_context

    log = read_log(io.BytesIO((FIXTURES / "corpus" / "sglang_c052.log").read_bytes()))
    ctx = build_context(log.startups[-1], AuditOptions(source="glm5"))
    assert ctx.args.get("attention_backend") == "triton"
    sign = rocm_evidence(ctx)
    assert sign is not None and "server_args.py says so" in sign
    # and a CUDA log says nothing of the kind
    cuda = read_log(io.BytesIO((FIXTURES / "corpus" / "sglang_c048.log").read_bytes()))
    assert rocm_evidence(build_context(cuda.startups[-1], AuditOptions(source="llama"))) is None


def test_a_start_that_died_is_not_told_its_memory_sat_idle():
    """sglang_c057 died in its warm-up (the port still held by the previous run's server): STARTUP_FAILED. Its
    scheduler summary's free memory was never idle on a running server, so no UNUSED_MEMORY and no advice to
    raise the fraction beside the failure (the review found both, contradicting each other)."""
    log = read_log(io.BytesIO((FIXTURES / "corpus" / "sglang_c057.log").read_bytes()))
    (a,) = audit(log, AuditOptions())
    codes = {f.code for f in a.findings}
    assert "STARTUP_FAILED" in codes and "UNUSED_MEMORY" not in codes
    assert not any("--mem-fraction-static" in f.message for f in a.findings)


def test_unexplained_memory_on_several_gpus_gives_the_others_own_range():
    """sglang_c053: '(and 7 more GPU(s))' gives the seven others' own range. TP0's 8.25 GiB between 'Memory pool
    end' and the scheduler summary (graphs disabled) is an item of its own (ledger.py, the after-pool step), so TP0
    keeps +0.32 like the others (before: +8.57 on TP0 beside +0.31-0.32)."""
    log = read_log(io.BytesIO((FIXTURES / "corpus" / "sglang_c053.log").read_bytes()))
    (a,) = audit(log, AuditOptions())
    f = next(f for f in a.findings if f.code == "UNEXPLAINED_MEMORY")
    assert "+0.32 GiB on TP0 (and 7 more GPUs: +0.31 to +0.32 GiB)" in f.message
    assert a.ranks[0].item("after_pool").gib == pytest.approx(8.25)


PD_PREFILL = (FIXTURES / "corpus" / "sglang_c070.log").read_bytes()


def test_the_awq_import_warning_alone_tells_rocm():
    """AMD's v0.5.5 PD prefill server (sglang_c070, MI355X, triton backend): its only SGLang line that shows ROCm is
    quantization/awq.py's ``HIP does not support fused_marlin_moe currently.`` (warned at import under _is_hip,
    0.4.10-0.5.7), printed without SGLang's prefix before the server_args line and by each scheduler process. Read,
    the pool lies in ROCm's T drift; before, it was a 4-token TOKENS_MISMATCH on the printed T."""
    a = _audit(PD_PREFILL)
    f = a.formula
    assert f.verdict == Verdict.MATCH, f.verdict_reason
    assert f.logged_tokens == 2_559_852
    assert f.predicted_tokens is not None and (f.predicted_tokens.low, f.predicted_tokens.high) == (2_558_755, 2_560_180)
    assert a.rocm == "line 2: quantization/awq.py's HIP-only warning"
    assert any("ROCm (line 2: quantization/awq.py's HIP-only warning)" in n for n in a.notes)
    # the source line Python echoes after the warning is not a sign: with the warning lines gone, so is ROCm
    without = AWQ_WARNING.sub(b"", PD_PREFILL)
    assert without.count(b'warnings.warn(f"HIP does not support fused_marlin_moe currently.")') == 6
    b = _audit(without)
    assert b.rocm is None and b.formula.verdict == Verdict.MISMATCH
    assert b.formula.predicted_tokens is not None and b.formula.predicted_tokens.low == 2_559_856


def test_the_aiter_all_reduce_line_is_a_sign_of_rocm_and_dates_the_release():
    """custom_all_reduce.py's ``[AR] Using AiterCustomAllreduce (AMD default)`` (dispatch_custom_allreduce, after
    its CUDA return, 0.5.7+), the real line of AMD's GLM-5 log (sglang_c046)."""
    from kvaudit.parse.lines import Line
    from kvaudit.parse.sglang import RocmSign, parse_line

    line = next(x for x in (FIXTURES / "corpus" / "sglang_c046.log").read_text().splitlines()
                if "AiterCustomAllreduce" in x)
    assert line == "[2026-02-26 16:30:59 TP1] [AR] Using AiterCustomAllreduce (AMD default)"
    p = parse_line(Line(120, line))
    assert isinstance(p.event, RocmSign)
    assert [(c.lo, c.hi) for c in p.clues if "AiterCustomAllreduce" in c.evidence[0]] == [((0, 5, 7), None)]


def test_server_args_fields_tell_0_5_5_from_0_5_6():
    """The PD prefill logs of AMD's v0.5.5 (sglang_c070) and v0.5.6.post2 (sglang_c056) images print the same lines
    but for server_args' fields: kt_amx_weight_path (0.5.4-0.5.5) and fastapi_root_path (0.5.6+)."""
    assert _audit(PD_PREFILL).engine_version == "0.5.4..0.5.5"
    assert _audit((FIXTURES / "corpus" / "sglang_c056.log").read_bytes()).engine_version == "0.5.6..0.5.8"
