"""How many bytes cross the network when `kvaudit check` audits a host whose journal holds 1 GiB of server
output: a real journal (systemd-journal-remote), a real sshd on 127.0.0.1, the real CLI. Target: < 1 MiB.

And how long the read of a long-running server's invocation takes (issue 40, item 3), side by side on the same
journal: ``journalctl -o cat`` over it alone (the floor the target is stated against: check <= 0.5x), the read
kvaudit made before (every line through ``grep -F`` with the anchors), the read it makes now (through the startup's
ready line: kvaudit.collect.commands.StartupWindow), the whole ``kvaudit check`` over SSH, and the alternatives
measured for the filter (``grep -E`` with the same strings, ``journalctl --grep`` with them as one PCRE, the latter
only with BENCH_JOURNAL_GREP=1: more than ten times journalctl's own time here). ``BENCH_JOURNAL_GIB`` sets the
journal's size (default 1; the issue's shape is 2)."""

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


def _timed(command: str, runs: int = 2) -> tuple[float, int]:
    """Best wall seconds of a shell command, and the bytes it wrote."""
    best, size = float("inf"), 0
    for _ in range(runs):
        t = time.perf_counter()
        r = subprocess.run(["sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        best, size = min(best, time.perf_counter() - t), len(r.stdout)
    return best, size


def journal_reads(directory: Path) -> dict:
    """The invocation's read, each way, side by side (seconds, bytes out)."""
    import re
    import shlex

    from kvaudit.collect import commands as C
    from kvaudit.engines import all_anchors, startup_window

    inv, anchors = "b" * 32, all_anchors()
    cat = shlex.join(["journalctl", "--no-pager", "-q", "--directory", str(directory),
                      f"_SYSTEMD_INVOCATION_ID={inv}", "-o", "cat", "-a"])
    alternation = "|".join(re.escape(a.decode("latin-1")) for a in anchors)
    rows = {"journalctl_cat": cat + " >/dev/null",
            "read_before_grep_F": C.journal_lines("sglang.service", inv, str(directory), anchors),
            "read_now_window": C.journal_lines("sglang.service", inv, str(directory), anchors, startup_window()),
            "grep_E_instead": cat + " | " + shlex.join(["grep", "-a", "-n", "-E", alternation])}
    if os.environ.get("BENCH_JOURNAL_GREP"):
        rows["journalctl_grep_instead"] = cat + " " + shlex.join(["--case-sensitive=yes", "--grep", alternation])
    out = {}
    for name, command in rows.items():
        seconds, size = _timed(command)
        out[name] = {"seconds": round(seconds, 3), "bytes": size}
        print(f"  {name:26s} {seconds:8.2f} s  {size:>12,} bytes", flush=True)
    return out


def main() -> dict:
    if hostsim.JOURNAL_REMOTE is None or not os.path.exists(hostsim.SSHD):
        print("journal bytes: skipped (systemd-journal-remote or sshd missing; make test installs them as root)")
        return {}
    out = HERE / "out"
    t = time.perf_counter()
    gib = float(os.environ.get("BENCH_JOURNAL_GIB", "1"))
    journal = out / ("journal-1g" if gib == 1 else f"journal-{gib:g}g")
    size = build_journal(journal, int(gib * (1 << 30)))
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
                            str(journal), "--format", "json", "--timeout", "600"], capture_output=True)
        wall = time.perf_counter() - t
        d = json.loads(r.stdout)
        received = d["host"]["bytes_received"]
    finally:
        sshd.stop()
    print(f"\nthe invocation's read, {size / 2**30:.2f} GiB of messages, side by side (best of 2):")
    reads = journal_reads(journal)
    floor = reads["journalctl_cat"]["seconds"]
    res = {"journal_message_bytes": size, "bytes_received": received, "check_seconds": round(wall, 2),
           "journal_build_seconds": round(built, 1), "logged_tokens": d["formula"]["logged_tokens"],
           "reads": reads, "check_vs_journalctl_cat": round(wall / floor, 3),
           "read_before_vs_journalctl_cat": round(reads["read_before_grep_F"]["seconds"] / floor, 3),
           "read_now_vs_journalctl_cat": round(reads["read_now_window"]["seconds"] / floor, 4)}
    print(f"  check over SSH {wall:.2f} s = {res['check_vs_journalctl_cat']:.3f}x journalctl -o cat (target <= 0.5); "
          f"the read before {res['read_before_vs_journalctl_cat']:.2f}x, now {res['read_now_vs_journalctl_cat']:.4f}x")
    print(f"\njournal of {size / 2**30:.2f} GiB of server output; kvaudit check over SSH received "
          f"{received:,} bytes ({received / 2**20:.3f} MiB, target < 1 MiB) in {wall:.1f} s; "
          f"tokens {res['logged_tokens']:,}")
    return res


if __name__ == "__main__":
    main()
