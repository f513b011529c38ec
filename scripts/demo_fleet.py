"""A small demo fleet for the report screenshot (docs/fleet.md): built from the bundled captures, audited by the
real CLI twice (two runs of history), with a healthy host, hosts with a warning and a failed one.

    python scripts/demo_fleet.py OUTDIR    -> OUTDIR/report.html (and the inventory, history, captures)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def capture_with(out: Path, name: str, log: Path | None = None) -> Path:
    """The bundled Kimi capture, optionally with another startup log in it."""
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(ROOT / "fixtures" / "hosts" / "kimi-k25-tp8", d)
    if log is not None:
        lines = log.read_text().splitlines()
        (d / "log.txt").write_text("".join(f"{i}:{line}\n" for i, line in enumerate(lines, 1)))
    return d


def main(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    hosts = [capture_with(out, f"gpu-node-{i:02d}") for i in (1, 2, 3)]
    hosts.append(capture_with(out, "gpu-node-04", ROOT / "fixtures" / "samples" / "sglang_107.log"))
    hosts.append(capture_with(out, "gpu-node-05", ROOT / "fixtures" / "samples" / "sglang_013.log"))
    held = socket.socket()  # a port nothing answers on: the failed host
    held.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{held.getsockname()[1]}"
    inventory = out / "fleet.txt"
    inventory.write_text("".join(f"{h}\n" for h in hosts) + f"{down}\n")
    kvaudit = Path(sys.executable).with_name("kvaudit")
    history, report = out / "history.sqlite", out / "report.html"
    history.unlink(missing_ok=True)
    for _ in range(2):
        subprocess.run([str(kvaudit), "fleet", str(inventory), "--history", str(history), "--html", str(report),
                        "--quiet", "--no-config"], stdout=subprocess.DEVNULL, check=False)
    held.close()
    return report


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out/demo-fleet")))
