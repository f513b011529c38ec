"""The health check's one "do:" line per problem (kvaudit.health.ACTIONS) is what the paged person reads: it
never points the opposite way of the finding beside it. A failed start's memory shortfall, idle memory and a
shared GPU have causes that call for opposite changes; the line names a direction only where every cause agrees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, cli

KIMI = FIXTURES / "hosts" / "kimi-k25-tp8"


def _capture(tmp: Path, log: Path) -> Path:
    """A capture of a host whose engine printed ``log`` (the bundled host's metadata, no GPU readings)."""
    d = tmp / log.stem
    d.mkdir()
    meta = json.loads((KIMI / "capture.json").read_text())
    meta.update(host=d.name, config_source=None, partial=[], gpu_source=None)
    (d / "capture.json").write_text(json.dumps(meta))
    (d / "log.txt").write_text("".join(f"{i}:{line}\n" for i, line in enumerate(
        log.read_text(encoding="utf-8", errors="replace").splitlines(), 1)))
    return d


def _problems(tmp: Path, name: str) -> dict[str, dict]:
    r = cli("check", _capture(tmp, FIXTURES / "corpus" / f"{name}.log"), "--health-check", "--format", "json")
    return {p["code"]: p for p in r.json()["problems"]}


@pytest.mark.parametrize("name", ["sglang_c037", "vllm_c043", "sglang_c009"])
def test_a_start_short_of_memory_is_never_told_to_lower_its_fraction(tmp_path, name):
    """sglang_c037: SGLang's own error asks for a larger --mem-fraction-static; vllm_c043: a negative budget needs
    a larger utilisation; sglang_c009: the weights did not fit, no fraction helps."""
    p = _problems(tmp_path, name)["NOT_ENOUGH_MEMORY"]
    assert "lower" not in p["action"] and "raise" not in p["action"] and "the finding names" in p["action"]


def test_a_pool_capped_by_max_total_tokens_is_not_told_to_raise_its_fraction(tmp_path):
    p = _problems(tmp_path, "sglang_c048")["UNUSED_MEMORY"]
    assert "--max-total-tokens" in p["message"] and "raise" not in p["action"] and "fraction" not in p["action"]


def test_a_failed_start_cannot_be_acknowledged_by_flag_or_settings_file(tmp_path, monkeypatch):
    """A cloned repository's kvaudit.toml (or --ignore) must not turn a node whose engine did not start into OK."""
    cap = _capture(tmp_path, FIXTURES / "corpus" / "vllm_c043.log")
    r = cli("explain", FIXTURES / "corpus" / "vllm_c043.log", "--ignore", "STARTUP_FAILED")
    assert r.code == 2 and "STARTUP_FAILED is an error" in r.stderr and "Traceback" not in r.stderr
    r = cli("check", cap, "--health-check", "--format", "json", "--ignore", "TOKENS_MISMATCH")
    assert r.json()["state"] == "warning" and "NOT_ENOUGH_MEMORY" in {p["code"] for p in r.json()["problems"]}
    work = tmp_path / "repo"
    work.mkdir()
    (work / "kvaudit.toml").write_text('ignore = ["NOT_ENOUGH_MEMORY"]\n')
    monkeypatch.chdir(work)
    r = cli("check", cap, "--health-check")
    assert "NOT_ENOUGH_MEMORY is an error" in r.stderr and "KVAUDIT OK" not in r.stdout
