"""How many bytes cross the network when `kvaudit check` audits a host whose journal holds 1 GiB of server
output: a real journal (systemd-journal-remote), a real sshd on 127.0.0.1, the real CLI. Target: < 1 MiB."""

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
sys.path.insert(0, str(HERE))

from genlog import STARTUP, filler_block  # noqa: E402

from tests import hostsim  # noqa: E402


def build_journal(directory: Path, size: int) -> int:
    """Stream ~size bytes of messages (the Kimi startup, then runtime lines) into systemd-journal-remote."""
    if (directory / "done").exists():
        return int((directory / "done").read_text())
    directory.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([hostsim.JOURNAL_REMOTE, f"--output={directory}/remote.journal", "-"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stdin is not None
    t0 = 1_771_900_000_000_000
    written = 0
    blocks = [filler_block(s, 4 << 20).rstrip(b"\n").split(b"\n") for s in range(2)]
    startup = STARTUP.rstrip(b"\n").split(b"\n")
    i = 0
    while written < size:
        msgs = startup if i == 0 else blocks[i % 2]
        p.stdin.write(hostsim.export_entries(msgs, "sglang.service", "b" * 32, 48190, t0 + i * 10**10))
        written += sum(len(m) + 1 for m in msgs)
        i += 1
    p.stdin.close()
    if p.wait() != 0:
        raise SystemExit(f"systemd-journal-remote failed: {p.stderr.read().decode()[-300:]}")
    (directory / "done").write_text(str(written))
    return written


def main() -> dict:
    if hostsim.JOURNAL_REMOTE is None or not os.path.exists(hostsim.SSHD):
        print("journal bytes: skipped (systemd-journal-remote or sshd missing; make test installs them as root)")
        return {}
    out = HERE / "out"
    t = time.perf_counter()
    size = build_journal(out / "journal-1g", 1 << 30)
    built = time.perf_counter() - t
    site = out / "site"
    subprocess.run(["rm", "-rf", str(site)])
    site.mkdir(parents=True)
    key = site / "client_key"
    pub = hostsim.keygen(key)
    (site / "bin").mkdir()
    sshd = hostsim.start_sshd(site / "sshd", pub, [site / "bin"])
    try:
        cfg = site / "ssh_config"
        cfg.write_text(f"Host bench\n  HostName 127.0.0.1\n  Port {sshd.port}\n  IdentityFile {key}\n"
                       f"  IdentitiesOnly yes\n  UserKnownHostsFile {site}/known_hosts\n")
        (site / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
        kvaudit = str(Path(sys.executable).with_name("kvaudit"))
        t = time.perf_counter()
        r = subprocess.run([kvaudit, "check", "bench", "--ssh-config", str(cfg), "--journal-directory",
                            str(out / "journal-1g"), "--format", "json", "--timeout", "600"], capture_output=True)
        wall = time.perf_counter() - t
        d = json.loads(r.stdout)
        received = d["host"]["bytes_received"]
    finally:
        sshd.stop()
    res = {"journal_message_bytes": size, "bytes_received": received, "check_seconds": round(wall, 2),
           "journal_build_seconds": round(built, 1), "logged_tokens": d["formula"]["logged_tokens"]}
    print(f"\njournal of {size / 2**30:.2f} GiB of server output; kvaudit check over SSH received "
          f"{received:,} bytes ({received / 2**20:.3f} MiB, target < 1 MiB) in {wall:.1f} s; "
          f"tokens {res['logged_tokens']:,}")
    return res


if __name__ == "__main__":
    main()
