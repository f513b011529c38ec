"""One status, every output (issue 33): the verdict decides a host's status once, and every surface says the
same word for it: explain's JSON, text and Markdown; check's JSON, text and Markdown and its Prometheus textfile;
the fleet's JSON, text table, CSV, history and textfile. Run over every real log the repository holds (the corpus,
the samples, the class fixtures, the Kimi journal log), each as a capture of its own (`check DIR`): once with the
log alone, once beside the bundled host's GPU readings (live findings join the audit's). No alert rule in contrib/
fires on a host whose pool was not checked (promtool on the series the textfile holds)."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvaudit.status import Status
from tests.conftest import FIXTURES, cli

ROOT = FIXTURES.parent
LOGS = sorted([*(FIXTURES / "corpus").glob("*.log"), *(FIXTURES / "samples").glob("*.log"),
               *FIXTURES.glob("*_classes/*.log"), *(FIXTURES / "journal_logs").glob("*.log")])
KIMI = FIXTURES / "hosts" / "kimi-k25-tp8"
WORDS = {s.value.upper(): s.value for s in Status}


def _word(text: str) -> str:
    """The status word a human report's headline opens with (Markdown bolds the headline)."""
    first = text.lstrip("*").split()[0]
    assert first in WORDS, text[:200]
    return WORDS[first]


def _status_series(prom: str) -> dict[str, str]:
    """host -> the status whose kvaudit_host_status series is 1 (exactly one per host)."""
    out: dict[str, list[str]] = {}
    for fam in text_string_to_metric_families(prom):
        if fam.name == "kvaudit_host_status":
            for s in fam.samples:
                if s.value == 1:
                    out.setdefault(s.labels["host"], []).append(s.labels["status"])
    assert all(len(v) == 1 for v in out.values()), out
    return {h: v[0] for h, v in out.items()}


def _wide(*args) -> str:
    """The CLI's text in a terminal wide enough that no host name is cut."""
    import io

    from kvaudit.cli import Environment, run

    out = io.StringIO()
    env = Environment(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO(), stdout_isatty=False,
                      stderr_isatty=False, environ={"NO_COLOR": "1", "COLUMNS": "400"})
    run([str(a) for a in args], env)
    return out.getvalue()


def _capture(tmp: Path, log: Path, with_gpus: bool) -> Path:
    """A capture of a host whose engine printed ``log``: the log alone, or beside the bundled host's readings."""
    d = tmp / ("gpus" if with_gpus else "log") / f"{log.parent.name}-{log.stem}"
    d.mkdir(parents=True)
    meta = json.loads((KIMI / "capture.json").read_text())
    meta.update(host=d.name, config_source=None, partial=[], gpu_source="nvidia-smi" if with_gpus else None)
    (d / "capture.json").write_text(json.dumps(meta))
    (d / "log.txt").write_text("".join(f"{i}:{line}\n" for i, line in enumerate(
        log.read_text(encoding="utf-8", errors="replace").splitlines(), 1)))
    if with_gpus:
        for name in ("nvidia-smi-gpus.csv", "nvidia-smi-apps.csv"):
            shutil.copy(KIMI / name, d / name)
    return d


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> list[tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("hosts")
    return [(log, _capture(tmp, log, gpus)) for log in LOGS for gpus in (False, True)]


@pytest.fixture(scope="module")
def explained() -> dict[Path, dict]:
    """log -> explain's JSON document, for each log kvaudit reads (exit 2: not a log it reads, said on stderr)."""
    out = {}
    for log in LOGS:
        j = cli("explain", log, "-f", "json")
        if j.code != 2:
            out[log] = j.json()
    return out


@pytest.fixture(scope="module")
def checked(hosts, tmp_path_factory) -> dict[Path, tuple[str, str]]:
    """capture -> (check's JSON status, the Prometheus textfile that same run wrote)."""
    prom_dir = tmp_path_factory.mktemp("prom")
    out = {}
    for _, cap in hosts:
        status = cli("check", cap, "-f", "json", "--textfile-dir", prom_dir).json()["status"]
        proms = list(prom_dir.glob("kvaudit-check-*.prom"))
        assert len(proms) == 1, (cap, proms)
        out[cap] = (status, proms[0].read_text())
        for p in prom_dir.glob("*.prom"):
            p.unlink()
    return out


def test_explain_says_one_status_in_every_format(explained):
    seen = set()
    for log, doc in explained.items():
        status = doc["status"]
        seen.add(status)
        assert _word(cli("explain", log).stdout) == status, log
        assert _word(cli("explain", log, "-f", "markdown").stdout) == status, log
        assert doc["headline"].split()[0] == status.upper(), log
    assert {"ok", "unchecked", "warning", "error"} <= seen, seen  # the test sees every audited status


def test_check_and_its_textfile_say_the_status_of_its_json(hosts, explained, checked):
    seen = set()
    for log, cap in hosts:
        status, prom = checked[cap]
        seen.add(status)
        assert _word(cli("check", cap).stdout) == status, cap
        assert _word(cli("check", cap, "-f", "markdown").stdout) == status, cap
        assert set(_status_series(prom).values()) == {status}, (cap, prom)
        if cap.parent.name == "log" and log in explained:  # the log alone: what explain says of it
            assert explained[log]["status"] == status, (log, explained[log]["headline"])
    assert {"ok", "unchecked", "warning", "error"} <= seen, seen


def test_the_fleet_says_each_host_s_status_everywhere(hosts, checked, tmp_path):
    inv = tmp_path / "hosts.txt"
    inv.write_text("".join(f"{cap}\n" for _, cap in hosts))
    history, table, prom_dir = tmp_path / "history.sqlite", tmp_path / "gpus.csv", tmp_path / "prom"
    prom_dir.mkdir()
    r = cli("fleet", inv, "-f", "json", "--history", history, "--csv", table, "--textfile-dir", prom_dir,
            "--parallel", "4")
    doc = r.json()
    want = {h["name"]: h["summary"]["status"] for h in doc["hosts"]}
    assert len(want) == len(hosts)
    for _, cap in hosts:  # the host's own check says the same
        assert want[str(cap)] == checked[cap][0], cap
    with sqlite3.connect(history) as db:
        recorded = dict(db.execute("SELECT host, status FROM hosts"))
    assert recorded == want
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["host"]: r["status"] for r in rows} == want
    prom = next(prom_dir.glob("*.prom")).read_text()
    assert _status_series(prom) == want
    text = _wide("fleet", inv, "--parallel", "4")
    for name, status in want.items():  # the table's row: the host and its status cell
        row = next((line.split() for line in text.splitlines() if line.split()[:1] == [name]), None)
        assert row is not None and row[1] == status, (name, status, row)
    counts = doc.get("counts") or {}
    if counts:
        assert sum(counts.values()) == len(want)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_no_alert_fires_on_an_unchecked_host(hosts, checked, tmp_path):
    """The series an unchecked host's check writes, fed to the shipped alert rules: nothing fires."""
    import yaml

    unchecked = [checked[cap][1] for _, cap in hosts
                 if cap.parent.name == "log" and checked[cap][0] == "unchecked"][:12]
    assert unchecked, "no unchecked host among the logs"
    series = []
    for prom in unchecked:
        for fam in text_string_to_metric_families(prom):
            if fam.name.startswith("kvaudit_last_run") or fam.name.startswith("kvaudit_run_duration"):
                continue  # time-based staleness rules are tested on their own
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                series.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value:g}x5"})
    rules = yaml.safe_load((ROOT / "contrib" / "prometheus" / "kvaudit-alerts.yml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    test = {"rule_files": [str(ROOT / "contrib" / "prometheus" / "kvaudit-alerts.yml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "alert_rule_test": [{"eval_time": "3m", "alertname": n, "exp_alerts": []} for n in names]}]}
    path = tmp_path / "unchecked.test.yml"
    path.write_text(yaml.safe_dump(test))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
