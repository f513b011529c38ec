"""ux-audit items 14-17 and 19: `kvaudit plan` says one thing when the weights leave no room, sizes nothing of a
layout the engine refuses, refuses a release it does not model, labels a release default "default", and
docs/plan.md's examples and accuracy table are what the tool does now. The real CLI on the bundled Qwen3-32B
directory (fixtures/models/qwen3-32b: its config.json and its index's total_size, the audit's /tmp/ux/q32)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from kvaudit.status import ExitStatus
from tests.conftest import FIXTURES, ROOT, cli

Q32 = FIXTURES / "models" / "qwen3-32b"
PLAN_MD = ROOT / "docs" / "plan.md"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_weights_past_the_card_say_only_that_no_fraction_helps():
    """item 14: 61 GiB of weights on a 24 GiB card said 'increase the fraction' and 'at any fraction' at once."""
    r = cli("plan", Q32, "--engine", "sglang==0.5.9", "--gpu", "rtx-4090", "--tp", "1")
    said = _flat(r.stdout)
    assert r.code == ExitStatus.LOG_ERRORS and "starts: no" in said
    assert "the weights leave no memory for the pool at any fraction" in said and "more GPUs (--tp)" in said
    assert "increase the fraction" not in said


def test_vllm_weights_past_the_card_offer_no_fraction():
    """item 14's class on vLLM: no utilisation up to 1.0 gives a budget, so no 'largest fraction' beside 'no'."""
    r = cli("plan", Q32, "--engine", "vllm==0.11.0", "--gpu", "rtx-4090")
    said = _flat(r.stdout)
    assert r.code == ExitStatus.LOG_ERRORS and "no gpu_memory_utilization gives a KV budget" in said
    assert "No available memory for the cache blocks" in said and "largest fraction" not in said


def test_a_tp_the_heads_cannot_split_sizes_nothing():
    """item 15: --tp 3 on 64 heads printed a cell of '8 KV heads / 3', 805,220 tokens and a smallest fraction."""
    r = cli("plan", Q32, "--engine", "sglang==0.5.9", "--gpu", "h100", "--tp", "3", "--fraction", "0.9")
    said = _flat(r.stdout)
    assert r.code == ExitStatus.LOG_ERRORS and "--tp 3 does not divide the model's 64 attention heads" in said
    for sized in ("cell", "805,", "smallest fraction", "weights per rank", "KV budget"):
        assert sized not in said, sized
    assert "not sized" in said
    p = cli("plan", Q32, "--engine", "vllm==0.11.0", "--gpu", "h100", "--tp", "3", "-f", "json").json()
    assert p["starts"] == "no" and p["smallest_fraction"] is None and p["concurrency"] is None
    assert {t["key"] for t in p["terms"]} <= {"t_gib", "mem_fraction_static"}


@pytest.mark.parametrize("engine,newest", [("sglang==9.9.9", "0.5.23"), ("sglang==0.5.24", "0.5.23"),
                                           ("vllm==99.0", "0.33"), ("trtllm==1.3.0", "1.2"),
                                           ("lmdeploy==0.16.0", "0.15")])
def test_a_release_kvaudit_does_not_model_is_refused_by_name(engine, newest):
    """item 16: vllm==99.0 and sglang==9.9.9 planned silently by the newest rules, as that release's own."""
    r = cli("plan", Q32, "--engine", engine, "--gpu", "h100", "--tp", "2", "--fraction", "0.9")
    assert r.code == ExitStatus.BAD_INPUT and r.stdout == ""
    assert "not modelled here" in r.stderr and f"kvaudit models is {newest}" in r.stderr


@pytest.mark.parametrize("engine", ["sglang==0.5.23", "vllm==0.33.1", "trtllm==1.2.0", "lmdeploy==0.15.0"])
def test_the_newest_modelled_release_still_plans(engine):
    r = cli("plan", Q32, "--engine", engine, "--gpu", "h100", "--tp", "2", "--fraction", "0.9")
    assert r.code in (ExitStatus.OK, ExitStatus.WARNINGS), r.stderr


@pytest.mark.parametrize("engine", ["sglang==0.5.9", "vllm==0.11.0", "trtllm==1.0.0", "lmdeploy==0.10.0"])
def test_a_fraction_not_given_is_labelled_default(engine):
    """item 17: the release's default fraction was labelled 'formula'; given, it is 'given'."""
    p = cli("plan", Q32, "--engine", engine, "--gpu", "h100", "--tp", "2", "-f", "json").json()
    term = next(t for t in p["terms"] if t["key"] == "mem_fraction_static")
    assert term["kind"] == "default", term
    p = cli("plan", Q32, "--engine", engine, "--gpu", "h100", "--tp", "2", "--fraction", "0.85", "-f", "json").json()
    assert next(t for t in p["terms"] if t["key"] == "mem_fraction_static")["kind"] == "given"


def _plan_examples() -> list[str]:
    text = PLAN_MD.read_text()
    return [line for block in re.findall(r"```\n(.*?)```", text, re.S) for line in block.splitlines()
            if line.startswith("kvaudit plan ")]


def test_plan_md_examples_on_bundled_files_run_as_written():
    """item 19: the config.json example stopped with 'the weights per rank are unknown' (exit 2)."""
    ran = 0
    for line in _plan_examples():
        argv = shlex.split(line)[2:]
        paths = [a for a in argv if not a.startswith("-") and "/" in a]
        if not all((ROOT / a).exists() for a in paths):
            continue  # a placeholder of the reader's own (/models/..., history.sqlite)
        r = cli("plan", *[str(ROOT / a) if (ROOT / a).exists() else a for a in argv])
        assert r.code in (ExitStatus.OK, ExitStatus.WARNINGS, ExitStatus.LOG_ERRORS), (line, r.stderr)
        ran += 1
    assert ran >= 2  # the bundled model directory and --validate fixtures/corpus


def test_plan_md_accuracy_table_is_what_validate_prints_now():
    """item 19: the table said 31 startups and 22 not predictable; the tool prints 61 and 52."""
    d = json.loads(cli("plan", "--validate", FIXTURES / "corpus", "-f", "json").stdout)
    text = PLAN_MD.read_text()
    total = int(re.search(r"`fixtures/corpus`: (\d+) startups of the engines kvaudit plans", text).group(1))
    assert total == d["startups"]
    logs = int(re.search(r"; (\d+) from logs whose own T is given", text).group(1))
    assert logs == d["t_given"]
    seen = re.search(r"\| family seen \(T given\) \| (\d+) \| ([\d.]+) % \| ([\d.]+) % \| (\d+) %", text)
    fs = d["family_seen"]
    assert int(seen.group(1)) == fs["startups"]
    assert float(seen.group(2)) == pytest.approx(fs["median_abs_error"] * 100, abs=0.0005)
    assert float(seen.group(3)) == pytest.approx(fs["p95_abs_error"] * 100, abs=0.0005)
    assert int(seen.group(4)) == round(fs["interval_held"] * 100)
    assert int(re.search(r"\| family not seen \| (\d+) \|", text).group(1)) == d["family_not_seen"]["startups"]
    assert int(re.search(r"\| not predictable \| (\d+) \|", text).group(1)) == d["not_predictable"]


def test_sglangs_smallest_fraction_holds_one_request_of_the_models_own_length():
    """Second review, item 2: without --context-length the smallest fraction was sized for one token (0.406 for
    Qwen3-32B at TP 2; at 0.41 the pool held 2,591-19,872 tokens). SGLang's default context is the config's
    max_position_embeddings (40,960), so the answer is the one --context-length 40960 gives."""
    def smallest(*extra):
        return cli("plan", Q32, "--engine", "sglang==0.5.9", "--gpu", "h100", "--tp", "2", *extra,
                   "-f", "json").json()["smallest_fraction"]

    assert smallest() == smallest("--context-length", "40960") and smallest() > 0.41
