"""ux-audit items 1, 6, 10, 11, 25-28: `kvaudit whatif` answers whether the change starts first, in the engine's
own words, before any headroom; a headroom that grows is never "would fall"; a startup that failed is no baseline;
an assumed ratio is said and pins nothing; the option names print whole at 80 columns and are engine-neutral.
Real logs, the real CLI: words and exit status (docs/exit-codes.md: whatif exits 0 only for ok)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, KIMI_LOG, ROOT, cli

CORPUS = FIXTURES / "corpus"


@pytest.mark.parametrize("log,fraction,needs", [
    (KIMI_LOG, "0.5", "0.769"),                     # item 1: -386,772 tokens printed as "ok"
    (CORPUS / "sglang_c002.log", "0.2", "0.236"),   # item 1: -6,096 tokens printed as "ok"
])
def test_sglang_budget_at_or_below_zero_will_not_start(log, fraction, needs):
    r = cli("whatif", log, "--mem-fraction-static", fraction)
    assert r.code == 1, r.stdout
    assert "OUT OF MEMORY" in r.stdout and "ok:" not in r.stdout
    flat = " ".join(r.stdout.split())
    assert "SGLang will not start" in flat and "Not enough memory. Please try to increase --mem-fraction-static" in flat
    assert f"it needs --mem-fraction-static above {needs}" in flat
    w = cli("whatif", log, "--mem-fraction-static", fraction, "-f", "json").json()["whatif"]
    assert w["risk"] == "oom" and w["pin"] is None
    assert w["tokens_after"]["high"] == 0 and w["kv_gib_after"] == 0  # no negative tokens or GiB in the table


def test_sglang_failed_startup_answers_the_budget_check_from_its_own_numbers():
    """item 10: sglang_c037 failed ('needs --mem-fraction-static above 0.5401'); its 51 GiB 'headroom' is no
    baseline, so no LOW HEADROOM: below the fraction it needs it will not start, above it kvaudit cannot tell."""
    r = cli("whatif", CORPUS / "sglang_c037.log", "--mem-fraction-static", "0.5")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "OUT OF MEMORY" in flat and "SGLang will not start" in flat
    assert "above 0.540" in flat and "51.32" not in flat
    r = cli("whatif", CORPUS / "sglang_c037.log", "--mem-fraction-static", "0.7")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "LOW HEADROOM" not in flat and "ok:" not in flat
    assert "unknown: the KV budget would be 17.85 GiB, above zero" in flat
    assert "cannot be told: this startup failed" in flat
    w = cli("whatif", CORPUS / "sglang_c037.log", "--mem-fraction-static", "0.7", "-f", "json").json()["whatif"]
    assert w["risk"] == "unknown" and w["headroom_gib_before"] is None and w["headroom_gib_after"] is None


def test_vllm_budget_below_zero_names_vllms_reason_not_the_headroom():
    """item 11: at 0.5 the headroom grows to 11.79 GiB; what stops vLLM is the budget."""
    r = cli("whatif", CORPUS / "vllm_c014.log", "--gpu-memory-utilization", "0.5")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "OUT OF MEMORY: the KV budget would be -5.62 GiB" in flat
    assert "No available memory for the cache blocks" in flat and "--gpu-memory-utilization above 0.738" in flat
    assert "reserve would not even cover" not in flat


def test_vllm_pool_below_one_max_model_len_request_will_not_start():
    r = cli("whatif", CORPUS / "vllm_c014.log", "--gpu-memory-utilization", "0.75")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "fewer than one request of max_model_len 20,000" in flat
    assert "vLLM will not start" in flat


def test_trtllm_pool_below_one_sequence_is_not_ok():
    """item 28: 2,944 tokens was "ok"; TensorRT-LLM's C++ runtime refuses a pool below one max_seq_len sequence
    (trtllm_c004). This log does not state max_seq_len: the answer says so, and --context-length checks it."""
    r = cli("whatif", CORPUS / "trtllm_c014.log", "--free-gpu-memory-fraction", "0.01")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "ok:" not in flat and "does not state max_seq_len" in flat
    assert "To pin" not in flat
    r = cli("whatif", CORPUS / "trtllm_c014.log", "--free-gpu-memory-fraction", "0.01", "--context-length", "8192")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "OUT OF MEMORY: the pool would hold 2,944 tokens, fewer than one max_seq_len 8,192" in flat
    assert "must be large enough to process at least 1 sequence" in flat
    # a pool that holds the sequence is judged on what stays free, as before
    r = cli("whatif", CORPUS / "trtllm_c014.log", "--free-gpu-memory-fraction", "0.5", "--context-length", "8192")
    assert r.code == 0 and "ok:" in r.stdout


def test_lmdeploy_headroom_that_grows_is_not_said_to_fall_and_the_assumed_ratio_pins_nothing():
    """items 6 and 27: lmdeploy_c003 at 0.5 leaves more room (0.36 -> 0.90 GiB, still under 1 GiB); at 0.95 the
    answer rests on LMDeploy's default 0.8, which the log does not state, so no block count is pinned."""
    r = cli("whatif", CORPUS / "lmdeploy_c003.log", "--cache-max-entry-count", "0.5")
    flat = " ".join(r.stdout.split())
    assert "would fall" not in flat and "would rise from 0.36 to 0.90 GiB, but stay low" in flat
    assert "rests on the assumed cache_max_entry_count 0.8" in flat and "--log-fraction" in flat
    assert "--log-mem-fraction-static" not in flat  # item 26: no SGLang option named on an LMDeploy log
    r = cli("whatif", CORPUS / "lmdeploy_c003.log", "--cache-max-entry-count", "0.95")
    flat = " ".join(r.stdout.split())
    assert r.code == 1 and "would fall from 0.36 to 0.09 GiB" in flat and "To pin" not in flat
    # the ratio the server ran with, under the engine-neutral name (the old one still works)
    new = cli("whatif", CORPUS / "lmdeploy_c003.log", "--cache-max-entry-count", "0.95", "--log-fraction", "0.8")
    old = cli("whatif", CORPUS / "lmdeploy_c003.log", "--cache-max-entry-count", "0.95",
              "--log-mem-fraction-static", "0.8")
    assert new.code == old.code == 1 and new.stdout == old.stdout and "rests on the assumed" not in new.stdout


def test_vllm_names_its_own_setting_for_the_logged_fraction():
    r = cli("whatif", CORPUS / "vllm_c018.log", "--gpu-memory-utilization", "0.9")
    assert r.code == 1 and "--log-mem-fraction-static" not in r.stdout


def test_whatif_help_prints_every_option_name_whole_at_80_columns():
    """item 25: --gpu-memory-utilizat..., --free-gpu-memory-fra... were cut."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-m", "kvaudit", "whatif", "--help"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    for flag in ("--mem-fraction-static", "--gpu-memory-utilization", "--free-gpu-memory-fraction",
                 "--cache-max-entry-count", "--log-fraction", "--context-length", "--max-tokens"):
        assert flag in p.stdout, flag
    assert "…" not in "".join(line for line in p.stdout.splitlines() if line.lstrip("│ ").startswith("--"))
    assert "--log-mem-fraction-static" not in p.stdout  # the old name works, hidden
    assert cli("whatif", KIMI_LOG, "--mem-fraction-static", "1.5").code == 2
