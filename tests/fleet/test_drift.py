"""The nightly signal (issue 24, item 4): each host compared with its own last successful audit, info
findings that do not churn, a failing host that says since when, GPU drift named by GPU. On a real SQLite
history written by history.record, with the rows the fleet writes."""

from __future__ import annotations

from kvaudit.fleet import history as hist


def _summary(host, status="ok", tokens=159277, findings=("RESERVE_EXPLAINS_FREE", "TOKENS_MATCH"), startup="s1"):
    return {"host": host, "status": status, "reason": status.split(":", 1)[1] if ":" in status else None,
            "tokens": None if status.startswith("failed:") else tokens, "verdict": None, "weights_gib": 70.0,
            "free_min_gib": 11.2, "unexplained_gib": None,
            "all_findings": [] if status.startswith("failed:") else list(findings), "startup_id": startup}


def _gpu(host, gpu, free=11.18):
    return {"host": host, "gpu": gpu, "rank": f"TP{gpu}", "kv_tokens": 159277, "kv_gib": 10.42,
            "weights_gib": 70.0, "free_now_gib": free, "free_at_end_gib": 11.18, "unexplained_gib": 0.0}


def _run(path, i, summaries, gpus=()):
    return hist.record(str(path), f"2026-12-{i:02d}T02:00:00Z", 1_780_000_000 + i * 86400, 10.0, summaries,
                       list(gpus))


def _what(drift, host):
    return [(d.what, d.before, d.after) for d in drift if d.host == host]


def test_a_host_that_went_down_does_not_resolve_its_findings(tmp_path):
    db = tmp_path / "h.sqlite"
    _run(db, 1, [_summary("a"), _summary("b")])
    r2 = _run(db, 2, [_summary("a", "failed:unreachable"), _summary("b")])
    _, d = hist.drift(str(db), r2)
    assert _what(d, "a") == [("status", "ok", "failed:unreachable")]  # no "TOKENS_MATCH resolved"
    assert _what(d, "b") == []


def test_a_host_failing_for_several_runs_says_since_when(tmp_path):
    db = tmp_path / "h.sqlite"
    _run(db, 1, [_summary("a")])
    _run(db, 2, [_summary("a", "failed:timeout")])
    r3 = _run(db, 3, [_summary("a", "failed:timeout")])
    _, d = hist.drift(str(db), r3)
    (item,) = [x for x in d if x.host == "a"]
    assert item.what == "failing" and item.after == 2 and item.before == "2026-12-02T02:00:00Z"
    assert "failing since run 2 (2026-12-02T02:00:00Z), 2 runs" in item.message


def test_a_recovered_host_is_compared_with_its_last_successful_audit(tmp_path):
    """Down last night, back tonight with a smaller pool: the tokens are compared with the night before,
    and the info findings it had then (and has again) are not news."""
    db = tmp_path / "h.sqlite"
    r1 = _run(db, 1, [_summary("a")], [_gpu("a", 0)])
    _run(db, 2, [_summary("a", "failed:unreachable")])
    r3 = _run(db, 3, [_summary("a", "warning", 133500, ("TOKENS_MATCH", "UNUSED_MEMORY"), startup="s2")],
              [_gpu("a", 0, free=14.0)])
    _, d = hist.drift(str(db), r3)
    got = _what(d, "a")
    assert ("status", "failed:unreachable", "warning") in got
    assert ("tokens", 159277, 133500) in got and ("restart", "s1", "s2") in got
    assert ("finding_new", None, "UNUSED_MEMORY") in got
    assert not any(w in ("finding_resolved",) for w, _, _ in got)  # RESERVE_EXPLAINS_FREE is info: no churn
    tok = next(x for x in d if x.what == "tokens")
    assert f"compared with run {r1}, its last successful audit" in tok.message
    free = next(x for x in d if x.what == "free")
    assert free.gpu == 0 and free.message.startswith("a GPU 0 (TP0): free 11.18 -> 14.00 GiB")


def test_warning_findings_still_come_and_go(tmp_path):
    db = tmp_path / "h.sqlite"
    _run(db, 1, [_summary("a", "warning", findings=("UNUSED_MEMORY", "TOKENS_MATCH"))])
    r2 = _run(db, 2, [_summary("a", findings=("TOKENS_MATCH", "RESERVE_EXPLAINS_FREE"))])
    _, d = hist.drift(str(db), r2)
    assert ("finding_resolved", "UNUSED_MEMORY", None) in _what(d, "a")
    assert not any(x.after == "RESERVE_EXPLAINS_FREE" for x in d)
