"""Start-up (issue 40, item 1): what an operator waits for before kvaudit does any work, as ratios against a bare
``python -c pass`` on the same machine, side by side with an earlier tree (``BENCH_BEFORE_TREE=DIR``: a checkout
whose ``kvaudit`` package is run with this venv, ``python -m kvaudit`` from that directory).

Rows: ``--version``, ``--help``, ``explain`` of a 15 KB log, ``check`` of a capture directory, and ``check`` of an
SSH target whose port refuses the connection (the start-up of an SSH check up to its first packet, plus the error
report). Each is the minimum of ``BENCH_STARTUP_RUNS`` (default 10) runs, wall and CPU (user + system: less
disturbed by other load on a shared box); the modules each loads are counted with ``python -X importtime``, and,
where valgrind is installed (``BENCH_STARTUP_INSTRUCTIONS=0`` skips it), the instructions each executes: the one
figure here that other load does not move.

Every row runs under a plain interpreter (``bench/out/plain-python``: a venv whose only content is a path entry naming
this venv's site-packages), as an operator's ``pip install kvaudit`` runs: the development venv's editable install
puts setuptools' import finder in every start (``__editable___kvaudit_*_finder``: pathlib, urllib.parse, ipaddress;
~50 M instructions, 20-25 ms here), ``python -c pass`` included, which shrank every ratio it divided.

The typer floor: ``import typer`` and a two-command typer app (``bench/typer_floor.py``) running a command and its
``--help``: what any CLI written with typer pays before doing anything, read beside kvaudit's rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SMALL_LOG = ROOT / "fixtures" / "samples" / "sglang_029.log"
CAPTURE = ROOT / "fixtures" / "hosts" / "kimi-k25-tp8"
RUNS = int(os.environ.get("BENCH_STARTUP_RUNS", "10"))
#: also count each command's instructions under valgrind (~50x slower, once per command and tree)
IREFS = os.environ.get("BENCH_STARTUP_INSTRUCTIONS", "1") != "0"


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: the connection is refused at once
    return port


def plain_python() -> str:
    """An interpreter that imports what this venv has installed without running its ``.pth`` files: a venv with no
    packages of its own (``--without-pip``) whose one ``.pth`` line names this venv's site-packages. A directory a
    ``.pth`` line adds is not a site directory, so the editable install's finder hook there never runs; ``python
    -m kvaudit`` still finds the package in its working directory first (a tree's own, side by side)."""
    import sysconfig

    venv = HERE / "out" / "plain-python"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_paths()["purelib"]
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    (target / "kvaudit-bench-deps.pth").write_text(purelib + "\n")
    rg = Path(sys.executable).parent / "rg"  # kvaudit looks for ripgrep beside its interpreter first, as installed
    if rg.exists() and not (venv / "bin" / "rg").exists():
        (venv / "bin" / "rg").symlink_to(rg)
    return str(python)


PYTHON = sys.executable  # replaced by plain_python() in main()

#: rows that measure typer itself, not a tree: run once, with the first tree
FLOOR_ROWS = ("typer_import", "typer_app_command", "typer_app_help")


def commands() -> dict[str, list[str]]:
    port = _closed_port()
    cfg = HERE / "out" / "startup_ssh_config"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(f"Host refused\n  HostName 127.0.0.1\n  Port {port}\n  User nobody\n")
    return {
        "python_bare": ["-c", "pass"],
        "version": ["-m", "kvaudit", "--version"],
        "help": ["-m", "kvaudit", "--help"],
        "explain_small_log": ["-m", "kvaudit", "explain", str(SMALL_LOG)],
        "check_capture": ["-m", "kvaudit", "check", str(CAPTURE)],
        "check_ssh_refused": ["-m", "kvaudit", "check", "refused", "--ssh-config", str(cfg), "--timeout", "5"],
        "typer_import": ["-c", "import typer"],
        "typer_app_command": [str(HERE / "typer_floor.py"), "explain", str(SMALL_LOG)],
        "typer_app_help": [str(HERE / "typer_floor.py"), "--help"],
    }


def _run(args: list[str], cwd: Path) -> tuple[float, float]:
    with open(os.devnull, "wb") as sink:
        t = time.perf_counter()
        p = subprocess.Popen([PYTHON, *args], stdout=sink, stderr=sink, cwd=cwd)
        _, _, usage = os.wait4(p.pid, 0)
        return time.perf_counter() - t, usage.ru_utime + usage.ru_stime


def _modules(args: list[str], cwd: Path) -> int:
    p = subprocess.run([PYTHON, "-X", "importtime", *args], capture_output=True, text=True, cwd=cwd)
    return sum(1 for line in p.stderr.splitlines() if line.startswith("import time:") and "|" in line) - 1


_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(args: list[str], cwd: Path) -> int | None:
    """The instructions the command's Python process executes (valgrind's cachegrind, no cache simulation;
    children such as ``ssh -G`` are not followed): a count that other load on the machine does not move, where
    wall and CPU seconds on a shared box do. None without valgrind."""
    if not shutil.which("valgrind"):
        return None
    p = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                        PYTHON, *args], capture_output=True, text=True, cwd=cwd,
                       env=dict(os.environ, PYTHONHASHSEED="0"))
    m = _IREFS.search(p.stderr)
    return int(m.group(1).replace(",", "")) if m else None


def measure(trees: dict[str, Path]) -> dict[str, dict[str, dict]]:
    """Each command run from each tree (``python -m kvaudit`` finds the package in its working directory first),
    the trees and commands interleaved, so that a burst of other load touches every row alike."""
    res: dict[str, dict[str, dict]] = {label: {} for label in trees}
    cmds = commands()
    first = next(iter(trees))

    def rows(label: str) -> dict[str, list[str]]:
        return {n: a for n, a in cmds.items() if label == first or n not in FLOOR_ROWS}

    for _ in range(RUNS):
        for label, tree in trees.items():
            for name, args in rows(label).items():
                wall, cpu = _run(args, tree)
                r = res[label].setdefault(name, {"seconds": wall, "cpu_s": cpu})
                r["seconds"], r["cpu_s"] = min(r["seconds"], wall), min(r["cpu_s"], cpu)
    for label, tree in trees.items():
        for name, args in rows(label).items():
            r = res[label][name]
            r["modules"] = _modules(args, tree)
            if IREFS:
                r["instructions"] = instructions(args, tree)
            res[label][name] = {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
    return res


def main() -> dict:
    global PYTHON
    PYTHON = plain_python()
    before = os.environ.get("BENCH_BEFORE_TREE")
    trees = {"now": ROOT, **({"before": Path(before)} if before else {})}
    for tree in trees.values():
        # byte-compiled first, each tree alike: with PYTHONDONTWRITEBYTECODE set (as on this box) a fresh checkout
        # would compile every module on every run (an export of an earlier commit measured 17.5x for explain
        # against its own 10.6x compiled), and a tree with stale .pyc files recompiles what changed
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "kvaudit")], stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(HERE / "typer_floor.py")], stdout=subprocess.DEVNULL)
    res = measure(trees)
    # `python -c pass` does not depend on the tree: the least disturbed of its runs is every row's yardstick
    b = {k: min(rows["python_bare"][k] for rows in res.values()) for k in ("seconds", "cpu_s")}
    print(f"\nstart-up, min of {RUNS} (ratio: to a bare `python -c pass`, wall / CPU)")
    head = "".join(f" {label + ' s':>9} {'ratio':>11} {'modules':>8}" for label in res)
    print(f"{'':20}{head}")
    for name in res["now"]:
        cells = ""
        for rows in res.values():
            if name not in rows:
                continue
            r = rows[name]
            wall, cpu = r["seconds"] / b["seconds"], r["cpu_s"] / max(b["cpu_s"], 1e-3)
            cells += f" {r['seconds']:9.3f} {wall:5.1f}/{cpu:<5.1f} {r['modules']:8}"
        print(f"{name:20}{cells}")
    now = res["now"]
    print("\nagainst the typer floor (wall): explain / a typer app's command "
          f"{now['explain_small_log']['seconds'] / now['typer_app_command']['seconds']:.2f}, "
          f"--help / a typer app's --help {now['help']['seconds'] / now['typer_app_help']['seconds']:.2f}; "
          f"`import typer` alone {now['typer_import']['seconds'] / b['seconds']:.1f}x a bare start")
    bare_i = min((rows["python_bare"].get("instructions") or 0) for rows in res.values())
    if bare_i:
        print("\ninstructions executed (valgrind; ratio to `python -c pass`, which does not move with other load)")
        print(f"{'':20}" + "".join(f" {label + ' (M)':>12} {'ratio':>6}" for label in res))
        for name in res["now"]:
            print(f"{name:20}" + "".join(f" {(rows[name].get('instructions') or 0) / 1e6:12.1f} "
                                         f"{(rows[name].get('instructions') or 0) / bare_i:6.2f}"
                                         for rows in res.values() if name in rows))
    return res


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
