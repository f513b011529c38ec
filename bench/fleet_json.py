"""Writing the fleet JSON report for many hosts (issue 23, item 4): the whole document as one tree and one
string (how it was written before) against the streamed pieces (report.fleet.iter_json), side by side:
Python heap peak (tracemalloc) and seconds, for 100 and 500 copies of the bundled Kimi host's audit."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _run(n: int):
    from kvaudit.check import CheckOptions, check
    from kvaudit.fleet.inventory import FleetHost
    from kvaudit.fleet.runner import FleetRun
    from kvaudit.reconcile.interface import AuditOptions

    h = check(str(ROOT / "fixtures" / "hosts" / "kimi-k25-tp8"), CheckOptions(AuditOptions()))
    return FleetRun("2026-12-01T00:00:00Z", 0.0, 1.0, 8,
                    tuple((FleetHost(f"gpu-{i:04d}", f"gpu-{i:04d}", (), {}), h) for i in range(n)), False)


def _whole(run, path: str) -> None:
    from kvaudit.report.fleet import host_dict, host_summary
    from kvaudit.report.json import dumps

    hosts = []
    for f, h in run.results:
        d = host_dict(h)
        d["name"], d["summary"] = f.name, host_summary(f.name, h)
        hosts.append(d)
    Path(path).write_text(dumps({"hosts": hosts}))


def _streamed(run, path: str) -> None:
    from kvaudit.report.fleet import iter_json

    with open(path, "w") as fh:
        for c in iter_json(run):
            fh.write(c)


def main() -> dict:
    out = {}
    print(f"\n{'fleet JSON report':34} {'hosts':>6} {'MB':>7} {'seconds':>8} {'heap peak MiB':>14}")
    for n in (100, 500):
        run = _run(n)
        for name, fn in (("whole document", _whole), ("streamed", _streamed)):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
                path = tmp.name
            tracemalloc.start()
            t = time.perf_counter()
            fn(run, path)
            secs = time.perf_counter() - t
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            size = os.path.getsize(path)
            os.unlink(path)
            out[f"{name}_{n}"] = {"seconds": round(secs, 3), "heap_peak_mib": round(peak / 2**20, 1),
                                  "mb": round(size / 1e6, 1)}
            print(f"{name:34} {n:6} {size / 1e6:7.1f} {secs:8.2f} {peak / 2**20:14.1f}")
    return out


if __name__ == "__main__":
    main()
