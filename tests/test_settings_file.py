"""kvaudit.toml for check, capture and history, read from the working directory only when announced, with
--config to choose and --no-config for none (issue 11, item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"


def _run(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("kvaudit")
    return subprocess.run([str(exe), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


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
    """The user's own ~/.config/kvaudit/kvaudit.toml may name the history file (the working directory's may not)."""
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    xdg = tmp_path / "xdg"
    (xdg / "kvaudit").mkdir(parents=True)
    (xdg / "kvaudit" / "kvaudit.toml").write_text(f'history = "{tmp_path / "h.sqlite"}"\n')
    env = {"XDG_CONFIG_HOME": str(xdg)}
    first = _run(tmp_path, "fleet", inv, env=env)
    assert first.returncode == 0 and f"using {xdg / 'kvaudit' / 'kvaudit.toml'}" in first.stderr
    assert _run(tmp_path, "fleet", inv, env=env).returncode == 0
    r = _run(tmp_path, "history", "-f", "json", env=env)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["runs"]) == 2 and d["hosts"] == [
        {"host": str(KIMI_HOST), "runs": 2, "status": "ok", "last_run": d["runs"][-1]["started_at"]}]
    one = _run(tmp_path, "history", str(KIMI_HOST), "-f", "json", env=env)
    assert [x["tokens"] for x in json.loads(one.stdout)["runs"]] == [159277, 159277]
    none = _run(tmp_path, "history", "--no-config")
    assert none.returncode == 2 and "--history FILE" in none.stderr


def test_the_working_directory_file_does_not_choose_what_runs_trusts_or_writes(tmp_path):
    """issue 21 item 4: a kvaudit.toml in a cloned repository may not name an ssh_config (its ProxyCommand runs),
    turn on trust-on-first-use or choose output files; named with --config it is trusted."""
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for line in ('ssh_config = "evil_config"', "accept_new_host_key = true", f'html = "{victim}"',
                 f'history = "{victim}"', f'csv = "{victim}"', f'textfile_dir = "{tmp_path}"'):
        (tmp_path / "kvaudit.toml").write_text(line + "\n")
        r = _run(tmp_path, "fleet", inv)
        key = line.split(" ", 1)[0]
        assert r.returncode == 2 and f"may not set {key}" in r.stderr and "--config ./kvaudit.toml" in r.stderr, r
        assert victim.read_text() == "precious\n"
    (tmp_path / "kvaudit.toml").write_text(f'html = "{tmp_path / "report.html"}"\n')
    trusted = _run(tmp_path, "fleet", inv, "--config", tmp_path / "kvaudit.toml")
    assert trusted.returncode == 0 and (tmp_path / "report.html").exists()


def test_settings_are_typed(tmp_path):
    """'false' is a string, and a string is true: a boolean setting must be a TOML boolean; timeouts and counts
    are positive numbers; the message names the key and what it must be."""
    cfg = tmp_path / "team.toml"
    for text, want in (('accept_new_host_key = "false"', "accept_new_host_key must be true or false"),
                       ('timeout = "30"', "timeout must be a number of seconds above 0"),
                       ("timeout = -1", "timeout must be a number of seconds above 0"),
                       ("parallel = true", "parallel must be a whole number of hosts above 0"),
                       ("unit = 5", "unit must be a string"),
                       ('ignore = "TOKENS_MISMATCH"', "ignore must be a list"),
                       ('[thresholds]\nunused_fraction = "x"', "thresholds must be a table of numbers")):
        cfg.write_text(text + "\n")
        r = _run(tmp_path, "check", KIMI_HOST, "--config", cfg)
        assert r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr, (text, r.stderr)


def test_a_malformed_history_row_is_skipped_and_said_and_the_reports_are_written(tmp_path):
    """issue 21, item 3: one bad row in the history (findings not JSON, a number that is text, control characters)
    no longer ends the run with exit 70 before its reports are written: the row is skipped, the report says so,
    and `kvaudit history` lists the rest with the control characters gone."""
    import sqlite3

    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    hist = tmp_path / "h.sqlite"
    assert _run(tmp_path, "fleet", inv, "--history", hist, "--no-config").returncode == 0
    db = sqlite3.connect(hist)
    db.execute("UPDATE hosts SET findings = 'not json', tokens = 'many'")
    db.execute("INSERT INTO hosts (run_id, host, status, findings) VALUES (1, 'evil\x1b[31m', 'ok', '[]')")
    db.commit()
    db.close()
    html = tmp_path / "r.html"
    r = _run(tmp_path, "fleet", inv, "--history", hist, "--html", html, "-f", "json", "--no-config")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    drift = json.loads(r.stdout)["drift"]
    assert any(d["what"] == "history" and "1 malformed row(s) skipped" in d["message"] for d in drift), drift
    assert html.exists()
    listing = _run(tmp_path, "history", "--history", hist, "--no-config")
    assert listing.returncode == 0 and "\x1b" not in listing.stdout and "evil[31m" in listing.stdout
