"""The fleet's terminal table at 80 columns (ux-audit item 30): a host name up to 32 cells is whole, a longer one
cut in the middle; a failed host's status says why (failed:unreachable, as docs/fleet.md shows); the findings are
left-aligned and listed in the order the "Why not ok" entry gives them (the headline's code first). Real captures
with a corpus log swapped in, and a real refused SSH connection."""

from __future__ import annotations

import io
import shutil

from rich.cells import cell_len

from kvaudit.cli import Environment, run
from tests.conftest import FIXTURES
from tests.test_ignores import _capture_with

TWO_WARNINGS = FIXTURES / "corpus" / "sglang_c026.log"  # UNUSED_MEMORY (the headline's), UNEXPLAINED_MEMORY


def _fleet(inv, *args, columns: str) -> list[str]:
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdin=io.BytesIO(), stdout=out, stderr=err, stdout_isatty=False, stderr_isatty=False,
                      environ={"NO_COLOR": "1", "COLUMNS": columns})
    run(["fleet", str(inv), "--no-config", *map(str, args)], env)
    return out.getvalue().splitlines()


def test_fleet_table_keeps_names_reasons_and_the_headline_code(tmp_path, monkeypatch):
    if shutil.which("ssh") is None:
        import pytest
        pytest.skip("no ssh client")
    warned = _capture_with(tmp_path, "gpu-node-07.rack-b", TWO_WARNINGS)
    (warned / "config.json").unlink()  # the bundled capture's Kimi config is not this log's model
    healthy = shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", tmp_path / ("gpu-node-08." + "x" * 40))
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host unreachable-host\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n")
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{warned.name}\n{healthy.name}\nunreachable-host\n")  # names as an inventory gives them
    monkeypatch.chdir(tmp_path)
    lines = _fleet(inv, "--ssh-config", cfg, columns="80")
    table = lines[1:lines.index("")]
    assert all(cell_len(x) <= 80 for x in table), table
    by_name = {x.split()[0]: x for x in table[1:]}
    assert "unreachable-host" in by_name and "failed:unreachable" in by_name["unreachable-host"], table
    assert "gpu-node-07.rack-b" in by_name, table  # a name within 32 cells: whole
    long = [n for n in by_name if "…" in n]
    assert len(long) == 1 and long[0].startswith("gpu-node-") and long[0].endswith("x" * 8), table  # the middle cut
    row = by_name["gpu-node-07.rack-b"]
    assert row.split()[-2:] == ["UNUSED_MEMORY", "+1"], row  # the headline's code first, as "Why not ok" says
    why = lines[lines.index("Why not ok") + 1]
    assert "UNUSED_MEMORY" in why
    header = table[0]
    assert header.index("findings") == row.index("UNUSED_MEMORY"), (header, row)  # left-aligned under its header


def test_fleet_table_at_60_columns_keeps_names_and_reasons(tmp_path, monkeypatch):
    """ux-audit2 item 5: at 60 columns no row is wider, a name of 18 cells stays whole (only a long one is cut,
    in the middle), a failed host's status keeps its reason (``unreachable``), the findings still open with
    the headline's code; Markdown's findings column is in that order too (it was alphabetical)."""
    if shutil.which("ssh") is None:
        import pytest
        pytest.skip("no ssh client")
    warned = _capture_with(tmp_path, "gpu-node-07.rack-b", TWO_WARNINGS)
    (warned / "config.json").unlink()
    healthy = shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", tmp_path / ("gpu-node-08." + "x" * 40))
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host unreachable-host\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n")
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{warned.name}\n{healthy.name}\nunreachable-host\n")
    monkeypatch.chdir(tmp_path)
    lines = _fleet(inv, "--ssh-config", cfg, columns="60")
    assert all(cell_len(x) <= 60 for x in lines), [(cell_len(x), x) for x in lines]
    table = lines[next(i for i, x in enumerate(lines) if x.split()[:2] == ["host", "status"]):lines.index("")]
    rows = {x.split()[0]: x for x in table[1:]}
    assert "gpu-node-07.rack-b" in rows and "unreachable-host" in rows, table  # whole names
    assert rows["unreachable-host"].split()[1] == "unreachable", table  # the reason, not a bare "failed"
    code = rows["gpu-node-07.rack-b"].split()[-1]
    assert code.startswith("UNUSED_MEM") and cell_len(code) >= 12, table  # the headline's code, cut to 12 at most
    assert "tokens" in table[0].split(), table  # numbers are never cut, the KV tokens kept
    long = [n for n in rows if "…" in n]
    assert len(long) == 1 and long[0].startswith("gpu-node-") and long[0].endswith("x" * 6), table
    md = _fleet(inv, "--ssh-config", cfg, "--format", "markdown", columns="60")
    row = next(x for x in md if x.startswith("| gpu-node-07.rack-b"))
    assert row.index("`UNUSED_MEMORY`") < row.index("`UNEXPLAINED_MEMORY`"), row  # as the text's order


def test_why_not_ok_says_a_failed_start_once(tmp_path):
    """ux-audit2 item 18: a failed start (SGLang's "Not enough memory", sglang_c037) quoted the engine's error
    three times (the headline, NOT_ENOUGH_MEMORY, STARTUP_FAILED). The entry says it once with "(+1 more)", and
    keeps what else the other finding says (the fraction the formula needs); the health line skips "line N:"."""
    failed = _capture_with(tmp_path, "gpu-03", FIXTURES / "corpus" / "sglang_c037.log")
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{failed}\n")
    for fmt in ("text", "markdown"):
        lines = _fleet(inv, "--format", fmt, columns="200")
        at = next(i for i, x in enumerate(lines) if x.endswith("Why not ok"))
        entry = "\n".join(lines[at + 1:]).strip()
        assert entry.count("Not enough memory") == 1, entry
        assert "ERROR startup failed" in entry and "(+1 more)" in entry, entry
        assert "--mem-fraction-static above" in entry and "STARTUP_FAILED" not in entry, entry
    out = io.StringIO()
    run(["check", str(failed), "--health-check", "--no-config"],
        Environment(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO(), stdout_isatty=False,
                    stderr_isatty=False, environ={"NO_COLOR": "1"}))
    assert out.getvalue().startswith("KVAUDIT WARNING - NOT_ENOUGH_MEMORY: Not enough memory"), out.getvalue()


def test_a_bad_model_config_setting_names_its_path_and_reason(tmp_path):
    """ux-audit2 item 19: a host's kvaudit_model_config that cannot be read fails that host, and its "Not
    audited" entry names the file and why (no such file; not JSON), in the text and in JSON's summary."""
    host = shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", tmp_path / "gpu-04")
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    for path, why in ((tmp_path / "missing.json", "No such file or directory"), (bad, "is not JSON")):
        inv = tmp_path / "hosts.ini"
        inv.write_text(f"[a]\n{host} kvaudit_model_config={path}\n")
        text = " ".join(" ".join(_fleet(inv, columns="80")).split())
        assert "bad_setting: kvaudit_model_config: " in text and str(path) in text and why in text, text
        out = io.StringIO()
        run(["fleet", str(inv), "--no-config", "-f", "json"],
            Environment(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO(), stdout_isatty=False,
                        stderr_isatty=False, environ={"NO_COLOR": "1"}))
        import json
        summary = json.loads(out.getvalue())["hosts"][0]["summary"]
        assert str(path) in summary["error"] and why in summary["error"], summary


def test_two_captures_of_one_host_name_share_a_textfile_and_say_so(tmp_path):
    """ux-audit2 item 7: ``check CAPTURE --textfile-dir`` labels a capture by its recorded host name (capture.json's
    host, as the check's title does), so two captures of gpu-node-07 write one file; the second says on stderr
    that it replaced the first's, where it was silent. A second check of the same capture says nothing."""
    from prometheus_client.parser import text_string_to_metric_families

    a = shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", tmp_path / "monday")
    b = shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", tmp_path / "tuesday")
    prom = tmp_path / "textfile"
    prom.mkdir()

    def check(target):
        out, err = io.StringIO(), io.StringIO()
        run(["check", str(target), "--no-config", "--textfile-dir", str(prom)],
            Environment(stdin=io.BytesIO(), stdout=out, stderr=err, stdout_isatty=False, stderr_isatty=False,
                        environ={"NO_COLOR": "1"}))
        return err.getvalue()

    assert "note" not in check(a) and "note" not in check(a)
    said = check(b)
    assert "was written from" in said and str(a) in said and str(b) in said, said
    files = list(prom.glob("*.prom"))
    assert [f.name for f in files] == ["kvaudit-check-gpu-node-07.prom"]
    text = files[0].read_text()
    assert text.startswith(f"# kvaudit check of {b}\n")
    hosts = {s.labels.get("host") for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert hosts - {None} == {"gpu-node-07"}, hosts  # the capture's host name, not the directory
