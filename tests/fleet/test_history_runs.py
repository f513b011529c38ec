"""History as ``diff HOST@RUN`` reads it, and a host in ``error`` for several runs (issue 37, item 7): on a real
SQLite history written by history.record, through the real CLI."""

from __future__ import annotations

from kvaudit.fleet import history as hist
from tests.conftest import cli_process
from tests.fleet.test_drift import _run, _summary


def test_a_host_in_error_for_several_runs_says_since_when(tmp_path):
    db = tmp_path / "h.sqlite"
    _run(db, 1, [_summary("a")])
    _run(db, 2, [_summary("a", "error", findings=("STARTUP_FAILED",))])
    r3 = _run(db, 3, [_summary("a", "error", findings=("STARTUP_FAILED",))])
    _, d = hist.drift(str(db), r3)
    (item,) = [x for x in d if x.host == "a"]
    assert item.what == "erring" and item.after == 2 and item.before == "2026-12-02T02:00:00Z"
    assert "in error since run 2 (2026-12-02T02:00:00Z), 2 runs" in item.message
    # one run in error is a change of status, not a streak
    _, d2 = hist.drift(str(db), 2)
    assert [(x.what, x.before, x.after) for x in d2 if x.host == "a"] == [("status", "ok", "error"),
                                                                        ("finding_new", None, "STARTUP_FAILED")]


def test_history_numbers_runs_as_diff_takes_them(tmp_path):
    db = tmp_path / "h.sqlite"
    ids = [_run(db, i, [_summary("gpu-1", tokens=159277 - i)]) for i in (1, 2, 3)]
    r = cli_process("history", "gpu-1", "--history", db, "--no-config")
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:2] == ["run", "started"]
    assert [line.split()[0] for line in lines[2:]] == [str(i) for i in ids]  # the numbers diff HOST@RUN takes
    assert lines[2].split()[1] == "2026-12-01T02:00:00Z"
    # diff reads the same number (these summaries recorded no startup: it says so, at that run)
    r = cli_process("diff", f"gpu-1@{ids[0]}", f"gpu-1@{ids[2]}", "--history", db)
    assert r.code == 2 and f"no startup of 'gpu-1' recorded at or before run {ids[0]}" in r.stderr
