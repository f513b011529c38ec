"""kvaudit's CPU per added host (issue 40, item 2): `kvaudit fleet` over N loopback hosts (real sshd instances, each
with its own journal and replayed nvidia-smi; bench/fleet_scaling.py builds them) against the same command over one
host. The kvaudit process's CPU seconds (user + system: its threads, and the children it waited for, `ssh -G` and
`ansible-inventory`), so the simulated hosts' sshd, shells and journalctl on the same machine do not count:
(CPU of N hosts - CPU of 1 host) / (N - 1). Target: 20 ms.

Side by side with an earlier tree: ``BENCH_BEFORE_TREE=DIR`` (a checkout whose ``kvaudit`` package is run with this
venv, ``python -m kvaudit`` from that directory). ``BENCH_HOSTS`` (default 16) hosts at ``--parallel 4``, best of
``BENCH_RUNS`` (default 3). ``--profile``: the costliest functions of one host's ``check``, run in this process 20
times over (cProfile: the main thread only, so the hosts are checked one after the other here;
``BENCH_PROFILE_SORT=tottime`` sorts by each function's own time). ``BENCH_HOST_INSTRUCTIONS=1`` (where valgrind is
installed) also counts the instructions the kvaudit process executes (all its threads; its children, ``ssh -G`` and
``ansible-inventory``, not followed) per added host: on a shared 2-core box the CPU figure moves by +-5 ms between
runs, the instruction count does not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from fleet_scaling import make_fleet  # noqa: E402

from tests import hostsim  # noqa: E402

HOSTS = int(os.environ.get("BENCH_HOSTS", "16"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))


def _cpu(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(kvaudit's CPU seconds, wall seconds) of one run; the report is checked for failed hosts."""
    import time

    out = HERE / "out" / "host_cpu.json"
    with out.open("wb") as sink:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.DEVNULL, cwd=cwd)
        _, _, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
    failed = json.loads(out.read_text())["run"]["failed"]
    if failed:
        raise SystemExit(f"host CPU: {failed} host(s) failed: see {out}")
    return usage.ru_utime + usage.ru_stime, wall


def measure(root: Path, trees: dict[str, Path]) -> dict[str, dict]:
    """Each tree's runs interleaved with the others' (``python -m kvaudit`` from ``tree`` finds the package in its
    working directory first), after one fleet run that is not counted: the first run over fresh hosts (their
    journals and sshd cold) cost 56 ms per added host, whichever tree ran it, against 27-48 ms for the next."""
    base = [sys.executable, "-m", "kvaudit", "fleet", "--ssh-config", str(root / "ssh_config"), "--quiet",
            "--format", "json", "--unit", "sglang.service"]
    one_cmd = base + [str(root / "one.ini"), "--parallel", "1"]
    all_cmd = base + [str(root / "all.ini"), "--parallel", "4"]
    _cpu(all_cmd, ROOT)  # warm-up, not counted
    best: dict[str, list[float]] = {label: [float("inf"), float("inf")] for label in trees}
    for _ in range(RUNS):
        for label, tree in trees.items():
            best[label][0] = min(best[label][0], _cpu(one_cmd, tree)[0])
            best[label][1] = min(best[label][1], _cpu(all_cmd, tree)[0])
    res = {label: {"cpu_one_s": round(one, 3), "cpu_all_s": round(many, 3),
                   "ms_per_added_host": round((many - one) / (HOSTS - 1) * 1000, 1)}
           for label, (one, many) in best.items()}
    if os.environ.get("BENCH_HOST_INSTRUCTIONS") == "1" and shutil.which("valgrind"):
        for label, tree in trees.items():
            one, many = _instructions(one_cmd, tree), _instructions(all_cmd, tree)
            res[label]["m_instructions_per_added_host"] = round((many - one) / (HOSTS - 1) / 1e6, 1)
    return res


def _instructions(cmd: list[str], cwd: Path) -> int:
    """The instructions the kvaudit process executes over one fleet run (valgrind's cachegrind, its threads
    serialised; children not followed)."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile() as log:
        subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                        f"--log-file={log.name}", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=cwd, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
        m = re.search(r"I\s+refs:\s+([\d,]+)", Path(log.name).read_text())
    if m is None:
        raise SystemExit(f"host CPU: valgrind gave no instruction count for {cmd}")
    return int(m.group(1).replace(",", ""))


def profile(root: Path) -> None:
    import cProfile
    import pstats

    from kvaudit.check import CheckOptions, check
    from kvaudit.reconcile.interface import AuditOptions

    line = (root / "one.ini").read_text().splitlines()[1].split()
    port = next(x.split("=")[1] for x in line if x.startswith("ansible_port="))
    user = next(x.split("=")[1] for x in line if x.startswith("ansible_user="))
    journal = next(x.split("=")[1] for x in line if x.startswith("kvaudit_journal_directory="))
    opts = CheckOptions(AuditOptions(), unit="sglang.service", journal_directory=journal,
                        ssh_config=str(root / "ssh_config"))
    target = f"{user}@127.0.0.1:{port}"
    assert check(target, opts).error is None  # warm: imports, caches
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        check(target, opts)
    prof.disable()
    pstats.Stats(prof).sort_stats(os.environ.get("BENCH_PROFILE_SORT", "cumulative")).print_stats(40)


def main() -> dict:
    if hostsim.JOURNAL_REMOTE is None or not os.path.exists(hostsim.SSHD):
        print("host CPU: skipped (sshd or systemd-journal-remote missing)")
        return {}
    root = HERE / "out" / "host_cpu"
    daemons = make_fleet(root, HOSTS)
    try:
        if "--profile" in sys.argv:
            profile(root)
            return {}
        before = os.environ.get("BENCH_BEFORE_TREE")
        res: dict = {"hosts": HOSTS, **measure(root, {"now": ROOT, **({"before": Path(before)} if before else {})})}
    finally:
        for d in daemons:
            d.stop()
    print(f"\nkvaudit's CPU per added host ({HOSTS} loopback hosts at --parallel 4 against 1, best of {RUNS}, "
          "trees interleaved after a warm-up run; target 20 ms)")
    for label in ("now", "before"):
        if label in res:
            r = res[label]
            print(f"  {label:7} {r['ms_per_added_host']:6.1f} ms per added host (1 host {r['cpu_one_s']:.2f} s, "
                  f"{HOSTS} hosts {r['cpu_all_s']:.2f} s of CPU)"
                  + (f"; {r['m_instructions_per_added_host']:.1f} M instructions per added host"
                     if "m_instructions_per_added_host" in r else ""))
    return res


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
