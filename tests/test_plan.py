"""kvaudit plan (issue 25): a deployment sized by the engine's own formula, calibrated on the fleet's history."""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest

from kvaudit.planning.calibrate import RUN_TO_RUN_GIB
from kvaudit.status import ExitStatus
from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, cli

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"
KIMI = ("--engine", "sglang==0.5.9", "--gpu", "rtx-pro-6000", "--tp", "8")


@pytest.fixture(scope="module")
def kimi_history(tmp_path_factory):
    """The fleet's history after one nightly run over the bundled Kimi host (the real fleet command)."""
    root = tmp_path_factory.mktemp("history")
    inventory = root / "hosts.txt"
    inventory.write_text(f"{KIMI_HOST}\n")
    db = root / "history.db"
    r = cli("fleet", inventory, "--history", db)
    assert r.code == ExitStatus.OK, r.stderr
    return db


#: plan's exit status by its word on starting (docs/plan.md, "Exit status")
EXIT = {"yes": ExitStatus.OK, "at risk": ExitStatus.WARNINGS, "unknown": ExitStatus.WARNINGS,
        "no": ExitStatus.LOG_ERRORS}


def _plan(*args):
    r = cli("plan", *args, "-f", "json")
    if r.code not in (ExitStatus.OK, ExitStatus.WARNINGS, ExitStatus.LOG_ERRORS):
        return r, None
    p = json.loads(r.stdout)
    assert r.code == EXIT[p["starts"]["verdict"] if isinstance(p["starts"], dict) else p["starts"]], (r.code, p)
    return r, p


def test_one_startup_calibrates_the_same_host_to_the_formulas_own_answer(kimi_history):
    """The history's one startup of the Kimi host, planned again at fraction 0.92: T, post and the cell are that
    startup's, so the plan's tokens are what the formula gives rerun on its log at 0.92 (whatif), widened by the
    run-to-run spread of one deployment that one startup cannot show (calibrate.RUN_TO_RUN_GIB on T and post)."""
    r, p = _plan(KIMI_CONFIG, *KIMI, "--fraction", "0.92", "--history", kimi_history)
    assert r.code == ExitStatus.WARNINGS, r.stderr  # at risk: LOW HEADROOM, as whatif says (below)
    w = cli("whatif", KIMI_LOG, "--mem-fraction-static", "0.92", "-m", KIMI_CONFIG, "-f", "json")
    assert w.stdout, w.stderr  # its exit status is the audit's (1: a warning), the answer is in the JSON
    after = json.loads(w.stdout)["whatif"]["tokens_after"]
    planned = p["formula"]["predicted_tokens"]
    # rest = post - 0.08 T: each of T and post widened by the run-to-run spread moves rest by it x (1 + 0.08)
    step = math.floor(RUN_TO_RUN_GIB * 1.08 * 2**30 / 70272)
    assert after["low"] - step - 1 <= planned["low"] <= after["low"] - step + 1
    assert after["high"] + step - 1 <= planned["high"] <= after["high"] + step + 1
    kinds = {t["key"]: t["kind"] for t in p["terms"]}
    assert kinds["t_gib"] == kinds["post_load_free_gib"] == kinds["weights_gib"] == "calibrated"
    assert kinds["bytes_per_token"] == "formula" and p["formula"]["bytes_per_token"] == 70272
    basis = {t["key"]: t["basis"] for t in p["terms"]}
    assert "1 startup of NVIDIA RTX PRO 6000 Blackwell Server Edition, sglang 0.5.9, 8 ranks" in basis["t_gib"]
    assert "run-to-run spread" in basis["t_gib"] and "run-to-run spread" in basis["post_load_free_gib"]
    # the reserve held 4.35 GiB at 0.88 (graphs, the EAGLE draft): at 0.92 it is 7.52 GiB, 3.16 left
    left = next(t for t in p["terms"] if t["key"] == "left_after_graphs_gib")
    assert left["kind"] == "calibrated" and 3.1 < left["low"] <= left["high"] < 3.2
    assert p["starts"] == "at risk" and p["starts_reason"].startswith("LOW HEADROOM")


@pytest.mark.parametrize("fraction", ["0.89", "0.9", "0.91", "0.92"])
def test_a_plan_and_a_whatif_of_one_startup_agree_on_headroom(kimi_history, fraction):
    """The same rule decides both (issue 38: the plan said 'starts: yes' where whatif said LOW HEADROOM): what is
    left for activations under low_headroom_gib, or under half of what the startup left, is at risk."""
    _, p = _plan(KIMI_CONFIG, *KIMI, "--fraction", fraction, "--history", kimi_history)
    w = json.loads(cli("whatif", KIMI_LOG, "--mem-fraction-static", fraction, "-m", KIMI_CONFIG, "-f", "json").stdout)
    low = w["whatif"]["risk"] == "low"
    assert (p["starts"] == "at risk") == low, (p["starts"], p["starts_reason"], w["whatif"]["risk"])
    assert low == (fraction == "0.92")


def test_at_the_logged_fraction_the_plan_is_the_audits_prediction(kimi_history):
    r, p = _plan(KIMI_CONFIG, *KIMI, "--fraction", "0.88", "--history", kimi_history)
    e = json.loads(cli("explain", KIMI_LOG, "-m", KIMI_CONFIG, "-f", "json").stdout)
    planned, audited = p["formula"]["predicted_tokens"], e["formula"]["predicted_tokens"]
    step = math.floor(RUN_TO_RUN_GIB * 1.12 * 2**30 / 70272)  # T and post each widened by the run-to-run spread
    assert abs(audited["low"] - step - planned["low"]) <= 1 and abs(audited["high"] + step - planned["high"]) <= 1
    assert p["formula"]["predicted_tokens"]["low"] <= e["formula"]["logged_tokens"] <= \
        p["formula"]["predicted_tokens"]["high"]


def test_without_a_history_every_term_says_it_is_assumed_and_the_interval_is_wide(tmp_path, kimi_history):
    model = _model_dir(tmp_path, KIMI_CONFIG.read_text(), {"w": (np.float16, (8192, 8192))})
    r, p = _plan(model, *KIMI, "--fraction", "0.92", "--context-length", "32768")
    assert r.code == 0, r.stderr
    kinds = {t["key"]: t["kind"] for t in p["terms"]}
    assert kinds["t_gib"] == "assumed" and kinds["weights_gib"] == "assumed"
    _, calibrated = _plan(KIMI_CONFIG, *KIMI, "--fraction", "0.92", "--history", kimi_history)
    width = p["formula"]["predicted_tokens"]["high"] - p["formula"]["predicted_tokens"]["low"]
    narrow = calibrated["formula"]["predicted_tokens"]["high"] - calibrated["formula"]["predicted_tokens"]["low"]
    assert width > 25 * narrow  # the assumed T offset is 1 GiB wide (0.75-1.75)
    assert not any(t["key"] == "left_after_graphs_gib" for t in p["terms"])  # not established: not printed
    assert "not established" in p["starts_reason"]


def _model_dir(root, config_text, tensors, shards=1):
    from safetensors.numpy import save_file

    d = root / "model"
    d.mkdir()
    (d / "config.json").write_text(config_text)
    items = list(tensors.items())
    for i in range(shards):
        part = {k: np.zeros(shape, dtype=dt) for k, (dt, shape) in items[i::shards]}
        save_file(part, str(d / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"))
    return d


def test_the_safetensors_headers_give_the_exact_weight_bytes(tmp_path):
    """Files written by Hugging Face's own safetensors library: the bytes are the tensors' own, from the headers."""
    from kvaudit.plan.weights import model_weights

    tensors = {"embed": (np.float16, (1000, 64)), "layer.0.w": (np.float32, (64, 64)), "norm": (np.int8, (7,)),
               "bias": (np.float16, (3, 5))}
    d = _model_dir(tmp_path, KIMI_CONFIG.read_text(), tensors, shards=2)
    w = model_weights(d)
    expected = sum(np.dtype(dt).itemsize * int(np.prod(shape)) for dt, shape in tensors.values())
    assert w.total_bytes == expected == 1000 * 64 * 2 + 64 * 64 * 4 + 7 + 30
    assert w.files == 2 and "safetensors headers" in w.source
    r, p = _plan(d, *KIMI, "--fraction", "0.9")
    assert p["model"]["weight_bytes"] == expected
    weights = next(t for t in p["terms"] if t["key"] == "weights_gib")
    assert weights["low"] == pytest.approx(expected / 8 / 2**30, abs=1e-4)


def test_an_index_without_shards_gives_its_total_size(tmp_path):
    from kvaudit.plan.weights import model_weights

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 123456789},
                                                                      "weight_map": {}}))
    assert model_weights(tmp_path).total_bytes == 123456789


@pytest.mark.parametrize("header", [
    (1 << 40).to_bytes(8, "little"),  # announces a terabyte of header
    (20).to_bytes(8, "little") + b"not json at all.....",
    (2).to_bytes(8, "little") + b"[]",
    (40).to_bytes(8, "little") + b'{"w": {"data_offsets": [0, 99999999999]}}',
])
def test_a_hostile_safetensors_header_is_one_clear_error(tmp_path, header):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(KIMI_CONFIG.read_text())
    (d / "model.safetensors").write_bytes(header)
    r = cli("plan", d, *KIMI, "--fraction", "0.9")
    assert r.code == ExitStatus.BAD_INPUT and "model.safetensors" in r.stderr and "Traceback" not in r.stderr


def test_a_fraction_too_small_does_not_start_and_the_plan_says_the_smallest_that_does(kimi_history):
    r, p = _plan(KIMI_CONFIG, *KIMI, "--fraction", "0.7", "--history", kimi_history, "--context-length", "8192")
    assert p["starts"] == "no" and "NOT_ENOUGH_MEMORY" in p["starts_reason"]
    smallest = p["smallest_fraction"]
    assert 0.7 < smallest < 0.8
    _, ok = _plan(KIMI_CONFIG, *KIMI, "--fraction", str(smallest), "--history", kimi_history,
                  "--context-length", "8192")
    assert ok["formula"]["predicted_tokens"]["low"] >= 8192 and ok["starts"] == "yes"


def test_a_term_from_another_release_is_kept_apart_and_widened(kimi_history):
    _, same = _plan(KIMI_CONFIG, *KIMI, "--fraction", "0.9", "--history", kimi_history)
    _, other = _plan(KIMI_CONFIG, "--engine", "sglang==0.5.10", "--gpu", "rtx-pro-6000", "--tp", "8",
                     "--fraction", "0.9", "--history", kimi_history)
    t_same = next(t for t in same["terms"] if t["key"] == "t_gib")
    t_other = next(t for t in other["terms"] if t["key"] == "t_gib")
    assert "other sglang releases" in t_other["basis"] and "releases 0.5.9" in t_other["basis"]
    assert t_other["high"] - t_other["low"] > t_same["high"] - t_same["low"] + 0.4


@pytest.mark.parametrize("args, words", [
    ((KIMI_CONFIG, "--engine", "sglang", "--gpu", "h100", "--fraction", "0.9"), "sglang==0.5.9"),
    ((KIMI_CONFIG, "--engine", "tgi==3.0.0", "--gpu", "h100", "--fraction", "0.9"),
     "plan sizes sglang, vllm, trtllm, lmdeploy"),
    ((KIMI_CONFIG, "--engine", "sglang==0.5.9", "--gpu", "tpu-v5", "--fraction", "0.9"), "--gpu-memory-gib"),
    ((KIMI_CONFIG, *KIMI, "--fraction", "0.9"), "weights per rank are unknown"),
])
def test_what_a_plan_cannot_know_is_said_not_guessed(args, words):
    r = cli("plan", *args)
    assert r.code == ExitStatus.BAD_INPUT and words in r.stderr, r.stderr


def test_a_history_row_of_the_wrong_type_is_skipped(kimi_history, tmp_path):
    import shutil

    db = tmp_path / "h.db"
    shutil.copy(kimi_history, db)
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO startups (run_id, host, engine, t_gib) VALUES (1, 'evil', 'sglang', 'lots')")
    from kvaudit.fleet.history import startups

    assert [s.host for s in startups(str(db))] == [str(KIMI_HOST)]


def test_validate_replays_each_corpus_startup_to_its_audits_own_prediction():
    """Leave-one-out over the corpus: a startup whose model another startup of the same deployment shows is
    predicted by the same formula on its own T (a log names no card), the weights the other startup loaded, and
    its cell: each interval holds the audit's own prediction (one rounding step wider: post is T less weights)."""
    r = cli("plan", "--validate", FIXTURES / "corpus", "-f", "json")
    assert r.code == 0, r.stderr
    v = json.loads(r.stdout)
    seen = [c for c in v["cases"] if c["family_seen"]]
    assert len(seen) >= 8 and v["family_seen"]["startups"] == len(seen)
    for c in seen:
        e = json.loads(cli("explain", FIXTURES / "corpus" / c["startup"], "-f", "json").stdout)
        p, a = c["predicted_tokens"], e["formula"]["predicted_tokens"]
        assert p["low"] <= a["low"] and a["high"] <= p["high"], c["startup"]
        # and not much wider: the rounding step, and the run-to-run spread of the other startup's weights
        run_to_run = 2 * RUN_TO_RUN_GIB * 2**30 / e["formula"]["bytes_per_token"]
        assert (p["high"] - p["low"]) < 1.5 * (a["high"] - a["low"]) + run_to_run, c["startup"]
        if e["formula"]["verdict"] == "match":  # a mismatch may fall within the run-to-run spread
            assert c["held"], c["startup"]
    assert v["family_seen"]["median_abs_error"] < 0.005
    assert v["not_predictable"] > 0  # a log names no checkpoint size: said, not guessed


def test_a_replayed_rocm_startup_takes_rocm_from_its_audit_not_its_card(tmp_path):
    """AMD's v0.5.6.post2 PD prefill and decode servers (sglang_c056, c058; MI355X, triton backend): a log names no
    card, so the replay (plan --validate) takes ROCm from what its audit read, quantization/awq.py's HIP-only
    warning, and its reserve takes ROCm's T drift as the audit's does: the plan holds the audit's interval. Without
    the sign it would be planned as CUDA and miss the audit's low end."""
    import dataclasses
    import shutil

    from kvaudit.plan.validate import _case
    from kvaudit.plan_inputs import log_rows
    from kvaudit.planning.calibrate import frame
    from kvaudit.planning.model import PlanInput
    from kvaudit.reconcile.sglang.planner import rocm

    for name in ("sglang_c056.log", "sglang_c058.log"):
        shutil.copy(FIXTURES / "corpus" / name, tmp_path / name)
    rows = log_rows(tmp_path)
    assert [r.rocm for r in rows] == ["line 8: quantization/awq.py's HIP-only warning"] * 2
    a = json.loads(cli("explain", tmp_path / "sglang_c056.log", "-f", "json").stdout)["formula"]["predicted_tokens"]
    assert (a["low"], a["high"]) == (2_548_546, 2_549_970)
    case = _case(rows[0], frame(rows[1:]))
    assert case.t_given and case.family_seen and case.low is not None and case.high is not None
    assert case.low <= a["low"] and a["high"] <= case.high and case.held
    as_cuda = _case(dataclasses.replace(rows[0], rocm=None), frame(rows[1:]))
    assert as_cuda.low is not None and as_cuda.low > a["low"]
    # without a replayed startup's sign the card's name still tells ROCm
    amd = PlanInput("sglang", "0.5.9", "AMD Instinct MI300X", 196_592.0, 8, 1, 1, None, "auto", None, None, None,
                    None, None, "m", None, None)
    assert rocm(amd) and not rocm(dataclasses.replace(amd, card="NVIDIA H100 80GB HBM3"))
    assert rocm(dataclasses.replace(amd, card=None, rocm="attention_backend='aiter'"))
