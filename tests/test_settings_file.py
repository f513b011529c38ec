"""kvaudit.toml for check, capture and history, read from the working directory only when announced, with
--config to choose and --no-config for none (issue 11, item 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("kvaudit")
    return subprocess.run([str(exe), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_check_reads_the_working_directory_file_and_says_so(tmp_path):
    (tmp_path / "kvaudit.toml").write_text('ignore = ["RESERVE_EXPLAINS_FREE"]\n')
    r = _run(tmp_path, "check", KIMI_HOST, "-f", "json")
    assert r.returncode == 0 and "kvaudit: using ./kvaudit.toml" in r.stderr
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "RESERVE_EXPLAINS_FREE"]
    assert f["ignored"] is True
    quiet = _run(tmp_path, "check", KIMI_HOST, "-f", "json", "--no-config")
    assert "using" not in quiet.stderr
    assert not any(f["ignored"] for f in json.loads(quiet.stdout)["findings"])


def test_a_named_file_is_not_announced_and_bad_keys_are_errors(tmp_path):
    cfg = tmp_path / "team.toml"
    cfg.write_text("[fleet]\ntimeout = 30\n")
    r = _run(tmp_path, "check", KIMI_HOST, "--config", cfg)
    assert r.returncode == 0 and "using" not in r.stderr
    cfg.write_text("timout = 30\n")
    r = _run(tmp_path, "capture", KIMI_HOST, "-o", tmp_path / "cap", "--config", cfg)
    assert r.returncode == 2 and "unknown setting 'timout'" in r.stderr
    r = _run(tmp_path, "check", KIMI_HOST, "--config", cfg, "--no-config")
    assert r.returncode == 2 and "exclude each other" in r.stderr


def test_history_takes_its_file_from_the_settings_and_lists_hosts(tmp_path):
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    (tmp_path / "kvaudit.toml").write_text('history = "h.sqlite"\n')
    assert _run(tmp_path, "fleet", inv).returncode == 0
    assert _run(tmp_path, "fleet", inv).returncode == 0
    r = _run(tmp_path, "history", "-f", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["runs"]) == 2 and d["hosts"] == [
        {"host": str(KIMI_HOST), "runs": 2, "status": "ok", "last_run": d["runs"][-1]["started_at"]}]
    one = _run(tmp_path, "history", str(KIMI_HOST), "-f", "json")
    assert [x["tokens"] for x in json.loads(one.stdout)["runs"]] == [159277, 159277]
    none = _run(tmp_path, "history", "--no-config")
    assert none.returncode == 2 and "--history FILE" in none.stderr
