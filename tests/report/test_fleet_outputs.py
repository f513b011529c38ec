"""Reports fit where they are read (issue 24, item 7): $COLUMNS sets the width also when piped, 80 columns
never wrap a table row; the CSV rows carry the run's time and the host's findings so nightly files append."""

from __future__ import annotations

import io

import pandas as pd

from kvaudit.cli import Environment, run
from tests.test_ignores import WARNED, _capture_with


def _fleet(inv, *args, columns: str | None = None) -> str:
    out, err = io.StringIO(), io.StringIO()
    environ = {"NO_COLOR": "1", **({"COLUMNS": columns} if columns else {})}
    env = Environment(stdin=io.BytesIO(), stdout=out, stderr=err, stdout_isatty=False, stderr_isatty=False,
                      environ=environ)
    run(["fleet", str(inv), *map(str, args)], env)
    return out.getvalue()


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[1:lines.index("")] if "" in lines else lines[1:]


def test_columns_sets_the_width_when_piped(tmp_path):
    hosts = [_capture_with(tmp_path, f"a-rather-long-host-name-in-rack-{i}", WARNED) for i in range(2)]
    inv = tmp_path / "hosts.txt"
    inv.write_text("".join(f"{h}\n" for h in hosts))
    narrow, wide, default = _fleet(inv, columns="80"), _fleet(inv, columns="200"), _fleet(inv)
    assert all(len(line) <= 80 for line in _table(narrow)), _table(narrow)
    assert any(len(line) > 120 for line in _table(wide)), "200 columns: nothing cut"
    assert max(len(line) for line in _table(default)) <= 120
    assert all("OCCUPIED_AT_STARTUP" in line for line in _table(wide)[1:])  # the findings whole at 200


def test_wide_characters_keep_the_columns_straight_and_within_80_cells(tmp_path):
    """Host names in a script whose characters take two terminal cells (CJK): widths are measured in cells (rich's
    measure), so every row's status column starts at the same cell and no row passes 80 cells."""
    from rich.cells import cell_len

    hosts = [_capture_with(tmp_path, name, WARNED) for name in ("gpu-东京-机柜-07-节点-a-rather-long-name", "gpu-b")]
    inv = tmp_path / "hosts.txt"
    inv.write_text("".join(f"{h}\n" for h in hosts))
    rows = _table(_fleet(inv, columns="80"))
    assert all(cell_len(line) <= 80 for line in rows), rows
    status_at = {cell_len(line[:line.index(word)]) for line in rows[1:] for word in ("warning", "ok") if word in line}
    assert len(status_at) == 1, rows  # one column, whatever the name's script
    assert any("…" in line for line in rows[1:])  # the long name cut in the middle, by cells


def test_csv_rows_append_across_nights(tmp_path):
    host = _capture_with(tmp_path, "host-a", WARNED)
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{host}\n")
    nights = []
    for i in range(2):
        csv = tmp_path / f"night-{i}.csv"
        _fleet(inv, "--csv", csv)
        nights.append(pd.read_csv(csv))
    df = pd.concat(nights, ignore_index=True)
    assert list(df.columns[:2]) == ["run_at", "host"] and "findings" in df.columns
    assert len(df) == 2 * len(nights[0]) and pd.to_datetime(df["run_at"]).notna().all()  # each row says its run
    assert df["findings"].str.contains("UNUSED_MEMORY").all()


def test_the_streamed_fleet_json_is_the_whole_document_byte_for_byte():
    """iter_json yields the document a host at a time; joined, it is exactly dumps() of the whole tree."""
    import json

    from kvaudit.check import CheckOptions, HostAudit, check
    from kvaudit.collect.interface import Unreachable
    from kvaudit.fleet.history import Drift
    from kvaudit.fleet.inventory import FleetHost
    from kvaudit.fleet.runner import FleetRun
    from kvaudit.reconcile.interface import AuditOptions
    from kvaudit.report.fleet import iter_json
    from kvaudit.report.host import host_dict
    from kvaudit.report.json import dumps
    from kvaudit.report.rows import host_summary
    from tests.conftest import FIXTURES

    h = check(str(FIXTURES / "hosts" / "kimi-k25-tp8"), CheckOptions(AuditOptions()))
    down = HostAudit("gpu-9", None, None, (), (), Unreachable("refused"))
    results = tuple((FleetHost(n, n, (), {}), x) for n, x in (("a", h), ("b", down), ("c", h)))
    run = FleetRun("2026-12-01T00:00:00Z", 0.0, 1.0, 8, results, False)
    drift = [Drift("a", 0, "free", 1.0, 2.0, "a GPU 0 (TP0): free 1.00 -> 2.00 GiB (+1.00)")]
    pieces = list(iter_json(run, drift, 7, False))
    assert len(pieces) == len(results) + 2  # the head, one piece per host, the tail
    got = "".join(pieces)
    doc = json.loads(got)
    hosts = []
    for f, x in results:
        d = host_dict(x)
        d["name"], d["summary"] = f.name, host_summary(f.name, x)
        hosts.append(d)
    assert got == dumps({**doc, "hosts": hosts})
    assert doc["drift"][0]["message"].startswith("a GPU 0") and doc["run"]["previous_run_id"] == 7
    assert json.loads("".join(iter_json(FleetRun("t", 0.0, 1.0, 8, (), False))))["hosts"] == []


def test_the_html_page_reads_on_a_phone_and_says_its_ranges(tmp_path):
    """issue 24, item 7: the page has a viewport and a scrollable table (phone width), the counts in its
    headline, and each trend says its range (a line that looks flat over 133,500..159,277 is not flat)."""
    host = _capture_with(tmp_path, "host-a", WARNED)
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{host}\n")
    hist, page = tmp_path / "h.sqlite", tmp_path / "r.html"
    _fleet(inv, "--history", hist)
    log = host / "log.txt"
    log.write_text(log.read_text().replace("#tokens: 25169", "#tokens: 25000"))
    _fleet(inv, "--history", hist, "--html", page)
    text = page.read_text()
    assert "name='viewport'" in text and "@media (max-width:640px)" in text and "class='wide'" in text
    import re

    assert re.search(r"<p>1 host \(1 (ok|warning|error|partial)\)", text), text[:800]
    assert "range 25,000–25,169" in text, text[text.find("trend"):][:600]


def test_csv_findings_are_the_codes_that_count_at_one_precision(tmp_path):
    """ux-audit2 item 13: the CSV's findings column is JSON's summary.findings (no info codes: a healthy host's
    cell is empty, so a filter on a non-empty cell finds the hosts with problems), and every GiB column has at
    most 2 decimals (reserve_gib and weights_gib had 4)."""
    import csv
    import shutil

    from tests.conftest import FIXTURES, cli

    healthy = shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", tmp_path / "healthy")
    warned = _capture_with(tmp_path, "warned", WARNED)
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{healthy}\n{warned}\n")
    out = tmp_path / "run.csv"
    _fleet(inv, "--csv", out)
    rows = list(csv.DictReader(out.open()))
    summary = {h["name"]: h["summary"] for h in cli("fleet", inv, "--no-config", "-f", "json").json()["hosts"]}
    for r in rows:
        assert r["findings"] == ";".join(summary[r["host"]]["findings"]), (r["host"], r["findings"])
    assert {r["findings"] for r in rows if r["host"] == str(healthy)} == {""}
    assert all("UNUSED_MEMORY" in r["findings"] for r in rows if r["host"] == str(warned))
    gib = [(k, v) for r in rows for k, v in r.items() if k.endswith("_gib") and v]
    assert gib and all(len(v.split(".", 1)[1]) <= 2 for k, v in gib if "." in v), gib
