"""A small demo fleet for the report screenshot (docs/fleet.md): built from the bundled captures, audited by the
real CLI twice (two runs of history): healthy hosts, a host where another process holds memory on one GPU, a host
whose journal kept only the start of the engine's log, and a failed one. Every host is the same consistent
server (its own log, config and GPU readings): nothing is audited against another host's capture.

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


def with_foreign_process(d: Path, gpu: int, pid: int, mib: int) -> None:
    """Another tenant's process holding ``mib`` on GPU ``gpu``: in nvidia-smi's process list, and gone from the
    GPU's free memory."""
    gpus = (d / "nvidia-smi-gpus.csv").read_text().splitlines()
    cols = [c.strip() for c in gpus[gpu].split(",")]
    uuid = cols[1]
    cols[6], cols[7] = str(int(cols[6]) + mib), str(int(cols[7]) - mib)  # used, free (MiB)
    gpus[gpu] = ", ".join(cols)
    (d / "nvidia-smi-gpus.csv").write_text("\n".join(gpus) + "\n")
    with open(d / "nvidia-smi-apps.csv", "a") as fh:
        fh.write(f"{pid}, {uuid}, python3, {mib}\n")


def with_log_cut(d: Path, keep: int) -> None:
    """The engine's log as a rotated journal left it: its first ``keep`` lines."""
    lines = (d / "log.txt").read_text().splitlines()[:keep]
    (d / "log.txt").write_text("".join(f"{line}\n" for line in lines))


def main(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    hosts = [capture_with(out, f"gpu-node-{i:02d}") for i in (1, 2, 3, 4, 5)]
    with_foreign_process(hosts[3], 3, 77001, 6144)
    with_log_cut(hosts[4], 30)
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
