"""Fleet scaling: `kvaudit fleet` over 64 loopback hosts (64 real sshd instances, each with its own journal
and replayed nvidia-smi) at --parallel 16, against the same command over 1 host. Target: wall ratio < 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests import hostsim  # noqa: E402

N = 64
SIM_USER = "kvaudit-sim"


def sim_user() -> str:
    """The simulated hosts' login. This machine's root runs `pyenv init` from ~/.bashrc for every SSH
    command (bash sources it when started by sshd): ~80 ms of CPU that a GPU server's login does not cost,
    times 64 hosts on one 2-core box. A dedicated user with /bin/sh keeps the simulation honest."""
    import getpass
    import pwd

    if os.geteuid() != 0:
        return getpass.getuser()
    try:
        pwd.getpwnam(SIM_USER)
    except KeyError:
        # '*': no password, but not locked ('!' would make sshd refuse even key logins without PAM)
        subprocess.run(["useradd", "--system", "--shell", "/bin/sh", "--home-dir", "/nonexistent", "--no-create-home",
                        "--password", "*", SIM_USER], check=True)
    else:
        subprocess.run(["usermod", "--password", "*", SIM_USER], check=True)
    return SIM_USER


def _busy() -> int:
    with open("/proc/stat") as fh:
        return sum(int(x) for x in fh.readline().split()[1:4])


def measure(cmd: list[str]) -> tuple[float, int, int, float, float]:
    """wall s, peak RSS KiB, exit code, kvaudit's own CPU s, every process's CPU s (the simulated hosts too)."""
    with (HERE / "out" / "fleet.json").open("wb") as sink:
        b = _busy()
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        return (wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime,
                (_busy() - b) / os.sysconf("SC_CLK_TCK"))


def make_fleet(root: Path, n: int) -> list:
    """n loopback hosts under ``root``, each a real sshd with its own journal and replayed nvidia-smi: writes
    ``one.ini`` (the first host), ``all.ini``, ``known_hosts`` and ``ssh_config``; returns the daemons (stop them)."""
    subprocess.run(["rm", "-rf", str(root)])
    root.mkdir(parents=True)
    key = root / "client_key"
    pub = hostsim.keygen(key)
    cap = ROOT / "fixtures" / "hosts" / "kimi-k25-tp8"
    log = (ROOT / "fixtures" / "journal_logs" / "kimi-k25-sglang-0.5.9-tp8-eagle3.log").read_bytes()
    cfg = (ROOT / "fixtures" / "configs" / "kimi-k2.5.json").read_text()
    daemons, lines, known = [], [], []
    user = sim_user()
    try:
        for i in range(n):
            h = hostsim.make_host(root / f"h{i:02d}", log, (cap / "nvidia-smi-gpus.csv").read_text(),
                                  (cap / "nvidia-smi-apps.csv").read_text(), cfg)
            d = hostsim.start_sshd(root / f"h{i:02d}" / "sshd", pub, [h.bin])
            daemons.append(d)
            lines.append(f"host-{i:02d} ansible_host=127.0.0.1 ansible_port={d.port} ansible_user={user} "
                         f"kvaudit_journal_directory={h.journal}")
            for f in h.journal.iterdir():  # journal-remote writes 0640: let the simulated login read it
                f.chmod(0o644)
            known.append(f"[127.0.0.1]:{d.port} {d.host_pub}")
    except BaseException:
        for d in daemons:
            d.stop()
        raise
    (root / "one.ini").write_text("[gpus]\n" + lines[0] + "\n")
    (root / "all.ini").write_text("[gpus]\n" + "\n".join(lines) + "\n")
    (root / "known_hosts").write_text("\n".join(known) + "\n")
    (root / "ssh_config").write_text(f"Host 127.0.0.1\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                                     f"  UserKnownHostsFile {root}/known_hosts\n")
    return daemons


def main() -> dict:
    if hostsim.JOURNAL_REMOTE is None or not os.path.exists(hostsim.SSHD):
        print("fleet scaling: skipped (sshd or systemd-journal-remote missing)")
        return {}
    root = HERE / "out" / "fleet"
    daemons = make_fleet(root, N)
    try:
        kvaudit = str(Path(sys.executable).with_name("kvaudit"))
        base = [kvaudit, "fleet", "--ssh-config", str(root / "ssh_config"), "--quiet", "--format", "json",
                "--unit", "sglang.service"]
        one = min((measure(base + [str(root / "one.ini"), "--parallel", "1"]) for _ in range(3)), key=lambda r: r[0])
        many = min((measure(base + [str(root / "all.ini"), "--parallel", "16"]) for _ in range(2)), key=lambda r: r[0])
        failed = json.loads((HERE / "out" / "fleet.json").read_text())["run"]["failed"]
        if failed:
            raise SystemExit(f"fleet scaling: {failed} of {N} hosts failed; see bench/out/fleet.json")
        # the pull figure (issue 24): hosts per minute one auditing machine does at --parallel 64
        wide = min((measure(base + [str(root / "all.ini"), "--parallel", "64"]) for _ in range(2)), key=lambda r: r[0])
        failed = json.loads((HERE / "out" / "fleet.json").read_text())["run"]["failed"]
        if failed:
            raise SystemExit(f"fleet scaling at --parallel 64: {failed} of {N} hosts failed")
    finally:
        for d in daemons:
            d.stop()
    res = {"one_host_s": round(one[0], 3), "hosts": N, "parallel": 16, "all_hosts_s": round(many[0], 3),
           "wall_ratio": round(many[0] / one[0], 2), "peak_rss_one_mib": round(one[1] / 1024, 1),
           "peak_rss_all_mib": round(many[1] / 1024, 1), "exit_codes": [one[2], many[2]],
           "kvaudit_cpu_s": [round(one[3], 2), round(many[3], 2)], "all_cpu_s": [round(one[4], 2), round(many[4], 2)],
           "cpus": os.cpu_count(), "parallel_64_s": round(wide[0], 3),
           "hosts_per_minute_at_64": round(N / wide[0] * 60), "kvaudit_cpu_s_per_host_at_64": round(wide[3] / N, 4)}
    print(f"\nfleet: 1 host {one[0]:.2f} s ({one[1] / 1024:.0f} MiB peak); {N} hosts at --parallel 16 "
          f"{many[0]:.2f} s ({many[1] / 1024:.0f} MiB peak): wall ratio {res['wall_ratio']:.2f} (target < 3)\n"
          f"  CPU seconds, kvaudit / every process (the simulated hosts' sshd and tools share this machine's "
          f"{os.cpu_count()} cores): 1 host {one[3]:.2f} / {one[4]:.2f}; {N} hosts {many[3]:.2f} / {many[4]:.2f}\n"
          f"  at --parallel 64: {wide[0]:.2f} s, {res['hosts_per_minute_at_64']:,} hosts per minute on loopback, "
          f"kvaudit {wide[3] / N * 1000:.0f} ms of CPU per host")
    return res


if __name__ == "__main__":
    main()
