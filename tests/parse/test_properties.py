"""Property tests: whatever lines arrive, the parser and the reconciler return data, never raise."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvaudit.explain import NoStartupError, audit, read_log
from kvaudit.parse.lines import InputError, Line
from kvaudit.parse.sglang import SGLangParser, parse_line
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import KIMI_LOG, SAMPLES

REAL_LINES = [l for p in [KIMI_LOG, *sorted(SAMPLES.glob("*.log"))]  # SGLang, vLLM and TensorRT-LLM
              for l in p.read_bytes().decode("utf-8", "replace").split("\n") if l.strip()]


@st.composite
def mutated_line(draw):
    line = draw(st.sampled_from(REAL_LINES))
    op = draw(st.sampled_from(["cut", "digits", "insert", "delete", "dup", "none"]))
    if not line:
        return line
    i = draw(st.integers(0, len(line)))
    if op == "cut":
        return line[:i]
    if op == "digits":
        return "".join(draw(st.sampled_from("0123456789-.")) if c.isdigit() else c for c in line)
    if op == "insert":
        return line[:i] + draw(st.text(max_size=20)) + line[i:]
    if op == "delete":
        j = draw(st.integers(i, len(line)))
        return line[:i] + line[j:]
    if op == "dup":
        return line[:i] + line
    return line


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.one_of(mutated_line(), st.text(max_size=200)), max_size=40))
def test_parser_never_raises(lines):
    startups = SGLangParser().parse([Line(i + 1, t) for i, t in enumerate(lines)])
    for s in startups:
        assert s.first_line <= s.last_line


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(mutated_line(), min_size=1, max_size=60))
def test_whole_pipeline_never_raises(lines):
    data = ("\n".join(lines) + "\n").encode()
    try:
        log = read_log(io.BytesIO(data))
    except (NoStartupError, InputError):
        return
    for a in audit(log, AuditOptions(), all_startups=True):
        assert a.formula.verdict.value in ("match", "explained", "mismatch", "unknown")
        for r in a.ranks:
            if r.unexplained_gib is not None:
                assert r.pre_load_free_gib is not None


@given(st.text(max_size=300))
def test_single_arbitrary_line(text):
    from kvaudit.parse import vllm

    from kvaudit.parse import trtllm

    parse_line(Line(1, text))
    vllm.parse_line(Line(1, text))
    trtllm.parse_line(Line(1, text))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.one_of(mutated_line(), st.text(max_size=200)), max_size=40))
def test_trtllm_parser_never_raises(lines):
    from kvaudit.parse.trtllm import TRTLLMParser

    for s in TRTLLMParser().parse([Line(i + 1, t) for i, t in enumerate(lines)]):
        assert s.first_line <= s.last_line


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.one_of(mutated_line(), st.text(max_size=200)), max_size=40))
def test_vllm_parser_never_raises(lines):
    from kvaudit.parse.vllm import VLLMParser

    for s in VLLMParser().parse([Line(i + 1, t) for i, t in enumerate(lines)]):
        assert s.first_line <= s.last_line


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes(data):
    try:
        read_log(io.BytesIO(data))
    except (NoStartupError, InputError):
        pass


def test_long_lines_parse_in_linear_time():
    """A 1 MiB line (the most the host-side cut lets through) of letters, digits and anchor words must not
    make any pattern backtrack quadratically. The bound is a hang guard (quadratic means hours), not a speed
    claim; speed is measured in bench/."""
    import time

    from kvaudit.explain import parse_lines

    for filler in ("x", "a b", "1.", "[", "GB ", "blocks: ", "took ", "TP1 ", "/snapshots/", "(GiB): ",
                   "must be large enough to process at least 1 sequence "):
        line = filler * ((1 << 20) // len(filler)) + " 1.00 GB"
        t = time.process_time()
        try:
            parse_lines([Line(1, line)])
        except NoStartupError:
            pass
        assert time.process_time() - t < 5, filler  # linear: well under a second; quadratic: hours
