"""Host text in reports is data (issue 21, item 7): invisible format characters that reorder or hide text are
dropped where text enters, and Markdown's own syntax from a host never becomes a link or emphasis."""

from __future__ import annotations

from kvaudit.check import HostAudit
from kvaudit.collect.interface import Unreachable
from kvaudit.fleet.inventory import FleetHost
from kvaudit.fleet.runner import FleetRun
from kvaudit.report.fleet import render_markdown
from kvaudit.textsafe import md_cell, printable


def test_bidi_overrides_and_zero_width_characters_are_dropped():
    # U+202E would show "gpu-1" as "1-upg" in a terminal or browser; U+200B hides a difference between two names
    assert printable("node\u202egpu-1") == "nodegpu-1"
    assert printable("gpu\u200b-1\u2066x\u2069\ufeff") == "gpu-1x"
    assert printable("tab\tkept, é and 日本 kept") == "tab\tkept, é and 日本 kept"


def test_markdown_syntax_from_a_host_is_text():
    cell = md_cell("see [the fix](http://evil.example/x) *now* or _soon_ `rm` | <img>")
    assert "\\[the fix\\](http://evil.example/x)" in cell and "\\*now\\*" in cell and "\\_soon\\_" in cell
    assert "\\`rm\\`" in cell and "\\|" in cell and "<img" not in cell
    assert md_cell("mem_fraction_static") == "mem_fraction_static"  # intraword _ opens no emphasis


def test_a_failed_hosts_stderr_cannot_put_a_link_in_the_fleet_report():
    host = FleetHost(name="gpu\u202e-7", target="gpu-7")
    failed = HostAudit(target="gpu-7", collected=None, audit=None, gpus=(), findings=(),
                       error=Unreachable("ssh: [reset your password](http://evil.example) now"))
    run = FleetRun(started_at="2026-12-01T00:00:00Z", started_ts=0.0, duration_s=1.0, parallel=1,
                   results=((host, failed),), deadline_hit=False)
    md = render_markdown(run)
    assert "\\[reset your password\\](http://evil.example)" in md and "\u202e" not in md
    assert "[reset your password](" not in md


def test_report_files_are_replaced_whole(tmp_path):
    """issue 21, item 7: -o, --csv and --html are written to a temporary file and renamed, as the textfile is: a
    reader that opened the previous report still reads all of it, and the new one is complete. (A truncating
    write would hand the open reader an empty or half-written file.)"""
    import json

    from tests.conftest import FIXTURES, SAMPLES, cli

    CORPUS = FIXTURES / "corpus"

    out = tmp_path / "report.json"
    assert cli("explain", str(SAMPLES / "sglang_216.log"), "-f", "json", "-o", str(out)).code == 0
    before = out.read_text()
    with open(out, encoding="utf-8") as reader:
        assert cli("explain", str(CORPUS / "sglang_c005.log"), "-f", "json", "-o", str(out)).code == 0
        assert reader.read() == before  # the old file, whole
    after = json.loads(out.read_text())
    assert after != json.loads(before) and not list(tmp_path.glob(".report.json.*"))
