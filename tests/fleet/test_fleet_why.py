"""Every host that is not ok says why, in every report format, and the counts come worst first (issue 11,
item 9). Hosts: the bundled capture (ok), a live endpoint (partial: no GPU readings), a refused port (failed)."""

from __future__ import annotations

import csv
import io

from tests.conftest import FIXTURES, cli
from tests.endpointsim import json_doc, serve, sglang_server_info
from tests.hostsim import closed_port

KIMI_INFO = sglang_server_info({"mem_fraction_static": 0.88, "tp_size": 8, "page_size": 1},
                               [{"weight": 72.3, "kvcache": 10.42, "token_capacity": 159277}], "0.5.9")


def test_every_non_ok_host_says_why_in_every_format(tmp_path):
    sock, port = closed_port()
    try:
        with serve({"/server_info": json_doc(KIMI_INFO)}) as (url, _):
            inv = tmp_path / "servers.txt"
            inv.write_text(f"{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\n{url}\nhttp://127.0.0.1:{port}\n")
            text = cli("fleet", inv, "--html", tmp_path / "r.html", "--csv", tmp_path / "gpus.csv")
            md = cli("fleet", inv, "-f", "markdown")
    finally:
        sock.close()
    assert "1 failed, 1 partial, 1 ok" in text.stdout.splitlines()[0]
    assert f"http://127.0.0.1:{port}: unreachable:" in text.stdout
    assert "Why not ok" in text.stdout and "missing: no GPU readings" in text.stdout
    assert "(1 failed, 1 partial, 1 ok)" in md.stdout and "## Why not ok" in md.stdout
    assert "missing: no GPU readings" in md.stdout
    html = (tmp_path / "r.html").read_text()
    assert "why not ok" in html and "missing: no GPU readings" in html
    assert html.index("failed:unreachable") < html.index(">ok<")  # problems first
    rows = list(csv.DictReader(io.StringIO((tmp_path / "gpus.csv").read_text())))
    failed = [r for r in rows if r["status"] == "failed:unreachable"]
    assert len(failed) == 1 and failed[0]["why"].startswith("unreachable:")  # a failed host is a row too
    assert all(r["why"] == "" for r in rows if r["status"] == "ok") and len(rows) == 8 + 1 + 1


def test_check_and_fleet_share_a_textfile_directory(tmp_path):
    """Each invocation writes its own file and labels its series: node_exporter, which reads every *.prom in
    the directory, never sees one series twice, although the same host is in both."""
    from prometheus_client.parser import text_string_to_metric_families

    capture = FIXTURES / "hosts" / "kimi-k25-tp8"
    prom = tmp_path / "textfile"
    prom.mkdir()
    assert cli("check", capture, "--textfile-dir", prom).code == 0
    inv = tmp_path / "nightly.txt"
    inv.write_text(f"{capture}\n")
    assert cli("fleet", inv, "--textfile-dir", prom).code == 0
    files = sorted(p.name for p in prom.glob("*.prom"))
    assert files == ["kvaudit-check-gpu-node-07.prom", "kvaudit-fleet-nightly.prom"]
    seen = set()
    for f in prom.glob("*.prom"):
        for fam in text_string_to_metric_families(f.read_text()):
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                assert key not in seen, key
                seen.add(key)
    assert any(name == "kvaudit_kv_tokens" and dict(labels)["invocation"] == "check" for name, labels in seen)


def test_a_history_file_from_before_restarts_were_tracked_still_opens(tmp_path):
    """An older history file (no startup_id column, no startups table) gains them on open; its runs are kept."""
    import sqlite3

    from kvaudit.fleet import history

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(history.SCHEMA)
    if "startup_id" in {row[1] for row in db.execute("PRAGMA table_info(hosts)")}:
        db.execute("ALTER TABLE hosts DROP COLUMN startup_id")
    db.execute("DROP TABLE startups")  # older still: no startups table (kvaudit plan's calibration)
    db.execute("INSERT INTO runs (started_at, started_ts, duration_s, hosts) VALUES ('t', 1, 1, 1)")
    db.execute("INSERT INTO hosts (run_id, host, status, findings) VALUES (1, 'gpu-1', 'ok', '[]')")
    db.commit()
    db.close()
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\n")
    r = cli("fleet", inv, "--history", path, "-f", "json")
    assert r.code == 0, r.stderr
    assert r.json()["run"]["previous_run_id"] == 1 and r.json()["run"]["first_run"] is False
    assert [s.host for s in history.startups(str(path))] == [str(FIXTURES / "hosts" / "kimi-k25-tp8")]


def test_html_report_for_on_call(tmp_path):
    """Provenance at the top, problems open and first, healthy hosts collapsed, a trend per host from the
    history (inline SVG, nothing fetched from the network)."""
    sock, port = closed_port()
    try:
        inv = tmp_path / "servers.txt"
        inv.write_text(f"{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\nhttp://127.0.0.1:{port}\n")
        for _ in range(2):
            cli("fleet", inv, "--history", tmp_path / "h.sqlite", "--html", tmp_path / "r.html")
    finally:
        sock.close()
    page = (tmp_path / "r.html").read_text()
    assert "kvaudit: <code>" in page and f"inventory: <code>{inv}</code>" in page
    failed_at = page.index(f"<details id='h-http://127.0.0.1:{port}' open>")
    ok_at = page.index(f"<details id='h-{FIXTURES / 'hosts' / 'kimi-k25-tp8'}'>")  # collapsed
    assert failed_at < ok_at
    assert page.count("<polyline") >= 2 and "over 2 runs" in page  # KV tokens and free memory over the runs
    assert "http://" not in page.replace(f"http://127.0.0.1:{port}", "")  # no external resource


def test_the_fleet_table_fits_an_80_column_terminal(tmp_path):
    """Long names (a pod group's selector, a capture path) are shortened in the middle, the findings cut at
    the end, numbers never; no line is wider than the terminal; status coloured without breaking alignment."""
    from kvaudit.fleet.runner import FleetRun
    from kvaudit.fleet.inventory import FleetHost
    from kvaudit.check import CheckOptions, check
    from kvaudit.reconcile.interface import AuditOptions
    from kvaudit.report.fleet import render_text

    capture = FIXTURES / "hosts" / "kimi-k25-tp8"
    h = check(str(capture), CheckOptions(AuditOptions()))
    long_name = "k8s:inference-production -l leaderworkerset.sigs.k8s.io/name=kimi-k25,leaderworkerset.sigs.k8s.io/group-index=0"
    run = FleetRun("2026-11-30T00:00:00+00:00", 0.0, 1.0, 8, ((FleetHost(long_name, str(capture)), h),
                                                              (FleetHost("gpu-01", str(capture)), h)), False)
    for color in (False, True):
        text = render_text(run, width=80, color=color)
        import re

        plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
        assert max(len(line) for line in plain.splitlines()) <= 80, plain
        assert "159,277" in plain and "…" in plain
    head = [line for line in plain.splitlines() if line.lstrip().startswith("host")][0]
    row = [line for line in plain.splitlines() if "159,277" in line][0]
    assert head.index("tokens") + len("tokens") == row.index("159,277") + len("159,277")  # aligned


def test_fleet_exit_status_keeps_failure_classes_apart():
    from kvaudit.check import HostAudit
    from kvaudit.collect.interface import AuthFailed, NoEngineFound, Unreachable
    from kvaudit.collect.ssh import SshConfigError
    from kvaudit.status import ExitStatus
    from kvaudit.verdict import judge_fleet

    def for_fleet(hosts):
        return judge_fleet(hosts).exit_status

    def failed(exc):
        return HostAudit("h", None, None, (), (), exc)

    auth, down, cfg, none = failed(AuthFailed("x")), failed(Unreachable("x")), failed(SshConfigError("x")), \
        failed(NoEngineFound("x"))
    assert for_fleet([auth, cfg]) == ExitStatus.AUTH_REFUSED  # refused, not "unreachable"
    assert for_fleet([auth, down, cfg]) == ExitStatus.UNREACHABLE
    assert for_fleet([cfg, none]) == ExitStatus.BAD_INPUT
    assert for_fleet([none]) == ExitStatus.PARTIAL_DATA
    assert for_fleet([]) == ExitStatus.OK


def test_identical_gpus_share_a_row_in_the_html():
    from kvaudit.report.html import _merged_rows, _span

    base = {"gpu": 0, "rank": "TP0", "kv_gib": 10.4241, "weights_gib": 72.3, "graphs_gib": 1.92, "draft_gib": 2.31,
            "reserve_gib": 11.28, "unexplained_gib": 0.015, "pre_load_free_gib": 94.01, "free_at_end_gib": 6.93,
            "free_now_gib": 6.43, "before_t_gib": 1.55, "foreign_gib": 0.0, "status": "ok"}
    rows = [{**base, "gpu": i, "rank": f"TP{i}"} for i in range(8)]
    rows[5] = {**rows[5], "free_now_gib": 2.0}  # one GPU drifted: it keeps its own row
    groups = _merged_rows(rows)
    assert [len(g) for g in groups] == [5, 1, 2]
    assert _span([r["gpu"] for r in groups[0]]) == "0–4 (5)" and _span([r["rank"] for r in groups[1]]) == "TP5"
