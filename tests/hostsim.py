"""Simulated GPU hosts for integration tests: real parts wherever we have them.

- the journal: real journal files, written by systemd-journal-remote from journal export format and read
  back by the real journalctl (``--directory``) and by systemd-python;
- SSH: a real OpenSSH sshd on 127.0.0.1 with its own host key, authorized_keys and port, whose sessions get
  ``PATH`` pointing at the host's ``bin/`` (``SetEnv``);
- the one stand-in: ``bin/nvidia-smi``, a shell script replaying recorded CSV (no GPU here). Its behaviour
  is switched by ``smi/mode``: ok | fail | hang | drop (kills the SSH session mid-output).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
JOURNAL_REMOTE = next((p for p in ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote")
                       if os.path.exists(p)), None)

FAKE_SMI = r"""#!/bin/sh
# nvidia-smi stand-in: replays recorded CSV (kvaudit tests; no GPU on this machine). Shell builtins only,
# so it costs about what one real nvidia-smi exec does.
d="${0%/*}/../smi"
mode=ok
[ -r "$d/mode" ] && read -r mode < "$d/mode"
replay() { while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "$line"; done < "$1"; }
case "$mode" in
  fail) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9;;
  hang) : > "$d/hanging"; sleep 30; exit 0;;  # the marker: a test waits for it, not for a guessed delay
esac
for a in "$@"; do
  case "$a" in
    --query-gpu=*) replay "$d/gpus.csv"; exit 0;;
    --query-compute-apps=*)
      if [ "$mode" = drop ]; then
        head -c 40 "$d/apps.csv"
        # the connection drops: kill this session's sshd process (the nearest sshd above us)
        p=$PPID
        while [ "$p" -gt 1 ]; do
          case "$(cat /proc/$p/comm 2>/dev/null)" in sshd*) kill -9 "$p"; break;; esac
          p=$(cut -d' ' -f4 /proc/$p/stat)
        done
        sleep 5; exit 0
      fi
      replay "$d/apps.csv"; exit 0;;
  esac
done
echo "nvidia-smi stand-in: unsupported arguments: $*" >&2
exit 2
"""


def _field(name: str, value: bytes) -> bytes:
    if b"\n" in value or any(c < 32 and c != 9 for c in value):
        return name.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
    return name.encode() + b"=" + value + b"\n"


def export_entries(messages: list[bytes], unit: str, invocation: str, pid: int, t0: int) -> bytes:
    """Journal export format (systemd's JOURNAL_EXPORT_FORMATS), one entry per message."""
    out = bytearray()
    for i, msg in enumerate(messages):
        ts = str(t0 + i * 1000).encode()
        for name, value in (("__REALTIME_TIMESTAMP", ts), ("__MONOTONIC_TIMESTAMP", ts),
                            ("_BOOT_ID", b"0f2a3b4c5d6e7f8091a2b3c4d5e6f708"), ("_SYSTEMD_UNIT", unit.encode()),
                            ("_SYSTEMD_INVOCATION_ID", invocation.encode()), ("SYSLOG_IDENTIFIER", b"python3"),
                            ("_PID", str(pid).encode()), ("PRIORITY", b"6"), ("MESSAGE", msg)):
            out += _field(name, value)
        out += b"\n"
    return bytes(out)


def write_journal(directory: Path, export: bytes) -> None:
    if JOURNAL_REMOTE is None:
        raise RuntimeError("systemd-journal-remote is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    src = directory.parent / "journal.export"
    src.write_bytes(export)
    p = subprocess.run([JOURNAL_REMOTE, f"--output={directory}/remote.journal", str(src)], capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"systemd-journal-remote failed: {p.stderr.decode()[-500:]}")
    src.unlink()


@dataclass
class SimHost:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def model_dir(self) -> Path:
        return self.root / "models" / "Kimi-K2.5"

    def set_smi_mode(self, mode: str) -> None:
        (self.root / "smi" / "mode").write_text(mode)

    def remove_smi(self) -> None:
        (self.bin / "nvidia-smi").unlink()

    def snapshot(self) -> dict[str, tuple[int, int, str]]:
        """Every file under the host root with size, mtime and a content hash: to prove nothing changed."""
        import hashlib

        out = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                st = p.stat()
                out[str(p.relative_to(self.root))] = (st.st_size, st.st_mtime_ns,
                                                      hashlib.sha256(p.read_bytes()).hexdigest())
        return out


def make_host(root: Path, log: bytes, gpus_csv: str, apps_csv: str, config_json: str | None,
              unit: str = "sglang.service", previous_log: bytes | None = None,
              extra_messages: list[bytes] = ()) -> SimHost:
    """A host whose journal holds ``log`` as the latest start of ``unit`` (and ``previous_log`` as an
    earlier one), with model_path in server_args pointing at the host's model directory."""
    host = SimHost(root)
    (root / "bin").mkdir(parents=True)
    (root / "smi").mkdir()
    smi = root / "bin" / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    (root / "smi" / "gpus.csv").write_text(gpus_csv)
    (root / "smi" / "apps.csv").write_text(apps_csv)
    host.set_smi_mode("ok")
    host.model_dir.mkdir(parents=True)
    if config_json is not None:
        (host.model_dir / "config.json").write_text(config_json)
    log = log.replace(b"/models/moonshotai/Kimi-K2.5", str(host.model_dir).encode())  # model_path / 'model'

    export = b""
    t0 = 1_771_900_000_000_000
    if previous_log is not None:
        export += export_entries(previous_log.rstrip(b"\n").split(b"\n"), unit, "a" * 32, 4000, t0)
    export += export_entries(log.rstrip(b"\n").split(b"\n") + list(extra_messages), unit,
                             "b" * 32, 48190, t0 + 10_000_000_000)
    export += export_entries([b"Started some other service."], "cron.service", "c" * 32, 77, t0 + 20_000_000_000)
    write_journal(host.journal, export)
    return host


# ----------------------------------------------------------------------------------------------------------
# sshd


def closed_port() -> tuple[socket.socket, int]:
    """A port nothing listens on, held so (bound, never listening) for as long as the socket is open: a
    connection to it is refused, even with other tests starting servers side by side."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)]
                   + (["-b", "2048"] if kind == "rsa" else []), check=True)
    path.chmod(0o600)
    return (path.with_suffix(".pub")).read_text().strip()


@dataclass
class Sshd:
    proc: subprocess.Popen
    port: int
    host_pub: str  # "ssh-ed25519 AAAA..."
    dir: Path
    host_pubs: dict = field(default_factory=dict)  # key type -> "TYPE AAAA..." for every host key it has

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _listens(pid: int, port: int) -> bool:
    """True when process ``pid`` itself holds the listening socket on 127.0.0.1:``port`` (not another
    process that took the port first: a port picked free can be taken before sshd binds it)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        with open("/proc/net/tcp") as fh:
            rows = fh.read().splitlines()[1:]
    except OSError:
        return False
    for row in rows:
        cols = row.split()
        if cols[1].endswith(f":{port:04X}") and cols[3] == "0A" and f"socket:[{cols[9]}]" in inodes:
            return True
    return False


def start_sshd(workdir: Path, client_pub: str, path_dirs: list[Path], port: int | None = None,
               key_types: tuple[str, ...] = ("ed25519",), extra: tuple[str, ...] = ()) -> Sshd:
    """A real sshd on 127.0.0.1 with host keys of ``key_types``, ready when it holds its port itself; on a
    port another process took in the meantime (tests run side by side), it retries on a new one."""
    workdir.mkdir(parents=True, exist_ok=True)
    pubs = {k: " ".join(keygen(workdir / f"ssh_host_{k}_key", k).split()[:2]) for k in key_types}
    hostkeys = [f"HostKey {workdir / f'ssh_host_{k}_key'}" for k in key_types]
    host_pub = pubs.get("ed25519") or next(iter(pubs.values()))
    (workdir / "authorized_keys").write_text(client_pub + "\n")
    path = ":".join(str(p) for p in path_dirs) + ":/usr/local/bin:/usr/bin:/bin"
    os.makedirs("/run/sshd", exist_ok=True)
    fixed = port
    for _ in range(10):
        port = fixed or free_port()
        cfg = workdir / "sshd_config"
        cfg.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", *hostkeys, f"PidFile {workdir}/sshd.pid",
            f"AuthorizedKeysFile {workdir}/authorized_keys", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "PermitRootLogin prohibit-password", "StrictModes no",
            "AllowTcpForwarding yes", "LogLevel ERROR", f"SetEnv PATH={path}", "MaxStartups 100:30:200",
            "PrintMotd no", *extra, "",
        ]))
        proc = subprocess.Popen([SSHD, "-D", "-e", "-r", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                stderr=open(workdir / "sshd.log", "wb"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None and not _listens(proc.pid, port):
            time.sleep(0.02)
        if proc.poll() is None and _listens(proc.pid, port):
            return Sshd(proc, port, host_pub, workdir, pubs)
        proc.kill()
        proc.wait()
        if fixed:
            break
    raise RuntimeError(f"sshd did not start: {(workdir / 'sshd.log').read_text()[-500:]}")


@contextlib.contextmanager
def ssh_site(root: Path, alias: str, log: bytes, gpus_csv: str, apps_csv: str,
             unit: str) -> Iterator[tuple[SimHost, Path]]:
    """One simulated host behind a real sshd on 127.0.0.1, reachable as ``alias`` through the ssh_config this
    yields (its own client key and known_hosts): the site an engine's ``check`` test audits."""
    host = make_host(root / "host", log, gpus_csv, apps_csv, None, unit=unit)
    key = root / "client_key"
    sshd = start_sshd(root / "sshd", keygen(key), [host.bin])
    cfg = root / "ssh_config"
    cfg.write_text(f"Host {alias}\n  HostName 127.0.0.1\n  Port {sshd.port}\n  IdentityFile {key}\n"
                   f"  IdentitiesOnly yes\n  UserKnownHostsFile {root}/known_hosts\n  ConnectTimeout 20\n")
    (root / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
    try:
        yield host, cfg
    finally:
        sshd.stop()
