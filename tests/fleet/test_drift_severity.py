"""A warning that went away is listed as resolved whatever its code's usual severity (ux-audit2 item 11):
MEMORY_DRIFT is info by default and a warning when little is left, and its going away was not said. Two fleet
runs with --history over the bundled Kimi-K2.5 capture (fixtures/hosts/kimi-k25-tp8), the first with 6 GiB more
of GPU 3 taken since startup (MEMORY_DRIFT, warning: 0.45 GiB left), the second as bundled."""

from __future__ import annotations

import json
import shutil

from kvaudit.fleet import history as hist
from tests.conftest import FIXTURES, cli

KIMI = FIXTURES / "hosts" / "kimi-k25-tp8"
GPU3 = "GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c000003"


def _set_gpu3_free(d, free_mib: int) -> None:
    rows = []
    for line in (d / "nvidia-smi-gpus.csv").read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        if f[1] == GPU3:
            f[7], f[6] = str(free_mib), str(int(f[4]) - int(f[5]) - free_mib)
        rows.append(", ".join(f))
    (d / "nvidia-smi-gpus.csv").write_text("\n".join(rows) + "\n")


def _fleet(inv, db) -> dict:
    r = cli("fleet", inv, "--history", db, "--no-config", "--format", "json")
    assert r.code in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_a_memory_drift_warning_that_went_away_is_resolved(tmp_path):
    host = tmp_path / "gpu-05"
    shutil.copytree(KIMI, host)
    _set_gpu3_free(host, 461)
    inv, db = tmp_path / "inv.txt", tmp_path / "h.sqlite"
    inv.write_text(f"{host}\n")
    first = _fleet(inv, db)
    (summary,) = [h["summary"] for h in first["hosts"]]
    assert "MEMORY_DRIFT" in summary["findings"], summary["findings"]
    shutil.copy(KIMI / "nvidia-smi-gpus.csv", host / "nvidia-smi-gpus.csv")
    second = _fleet(inv, db)
    drift = [(d["what"], d["before"], d["after"]) for d in second["drift"] if d["host"] == str(host)]
    assert ("finding_resolved", "MEMORY_DRIFT", None) in drift, second["drift"]
    assert not any(w == "finding_resolved" and b in ("TOKENS_MATCH", "RESERVE_EXPLAINS_FREE") for w, b, _ in drift)
    # a third run as the second: nothing came or went
    third = _fleet(inv, db)
    assert not [d for d in third["drift"] if d["what"].startswith("finding_")], third["drift"]


def test_a_history_written_before_the_counted_codes_still_compares(tmp_path):
    """Rows without the counted codes (NULL: an older history file) fall back to the codes' usual severity."""
    db = tmp_path / "h.sqlite"
    base = {"host": "a", "status": "warning", "reason": None, "tokens": 1, "verdict": None, "weights_gib": 1.0,
            "free_min_gib": 1.0, "unexplained_gib": None, "startup_id": "s1"}
    hist.record(str(db), "2026-12-01T02:00:00Z", 1.0, 1.0,
                [{**base, "all_findings": ["UNUSED_MEMORY", "TOKENS_MATCH"]}], [])
    r2 = hist.record(str(db), "2026-12-02T02:00:00Z", 2.0, 1.0,
                     [{**base, "status": "ok", "all_findings": ["TOKENS_MATCH"], "findings": []}], [])
    _, d = hist.drift(str(db), r2)
    assert [(x.what, x.before) for x in d if x.what.startswith("finding_")] == [("finding_resolved", "UNUSED_MEMORY")]
