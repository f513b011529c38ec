"""`kvaudit check` over an emulated WAN (issue 23, item 1): a delay proxy in front of a real sshd adds the round
trip time, turns are counted at the proxy (a turn: the client sends after the server has spoken, which is one
round trip of the protocol), exec requests are counted by the sshd's ForceCommand wrapper on the simulated host.

Side by side, on the same host through the same proxy:
- kvaudit now: the host script, one exec;
- kvaudit command by command (the session's fallback, what every check did before: the host's shell refuses
  the script);
- the floor: OpenSSH's own client running the same script in one exec (``ssh host '<one script>'``);
and each again where the login shell costs 0.3 s per exec (a ``.bashrc`` that runs an init; emulated by the
wrapper sleeping that long before it runs the command).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests import hostsim  # noqa: E402

sys.path.insert(0, str(HERE))
from fleet_scaling import sim_user  # noqa: E402  (a login with /bin/sh, not root's pyenv-running .bashrc)

RTT = float(os.environ.get("BENCH_RTT_MS", "100")) / 1000
FIX = ROOT / "fixtures"
KIMI_LOG = FIX / "journal_logs" / "kimi-k25-sglang-0.5.9-tp8-eagle3.log"
CAPTURE = FIX / "hosts" / "kimi-k25-tp8"


class DelayProxy:
    """TCP proxy adding RTT/2 to each direction (bytes are held, in order, until their time); counts turns."""

    def __init__(self, target_port: int, rtt: float):
        self.target, self.half = target_port, rtt / 2
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.turns = 0
        self._last = "server"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.target))
            for a, b, side in ((c, s, "client"), (s, c, "server")):
                threading.Thread(target=self._pump, args=(a, b, side), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, side: str) -> None:
        import queue

        q: "queue.Queue[tuple[float, bytes]]" = queue.Queue()

        def deliver() -> None:
            while True:
                due, data = q.get()
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=deliver, daemon=True).start()
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            with self._lock:
                if data and side == "client" and self._last == "server":
                    self.turns += 1
                if data:
                    self._last = side
            q.put((time.monotonic() + self.half, data))
            if not data:
                return

    def reset(self) -> None:
        with self._lock:
            self.turns, self._last = 0, "server"


def main() -> dict:
    if hostsim.JOURNAL_REMOTE is None or not os.path.exists(hostsim.SSHD) or not shutil.which("ssh"):
        print("WAN check: skipped (sshd, ssh or systemd-journal-remote missing; make test installs them as root)")
        return {}
    site = HERE / "out" / "wan"
    subprocess.run(["rm", "-rf", str(site)])
    site.mkdir(parents=True)
    host = hostsim.make_host(site / "host", KIMI_LOG.read_bytes(), (CAPTURE / "nvidia-smi-gpus.csv").read_text(),
                             (CAPTURE / "nvidia-smi-apps.csv").read_text(), (CAPTURE / "config.json").read_text())
    requests, slow, refuse = site / "requests", site / "slow-login", site / "refuse-script"
    wrapper = site / "wrapper"
    wrapper.write_text(f'#!/bin/sh\necho x >> {requests}\n[ -e {slow} ] && sleep 0.3\n'
                       f'if [ -e {refuse} ]; then case "$SSH_ORIGINAL_COMMAND" in *@@*) exit 126;; esac; fi\n'
                       'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n')
    wrapper.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)  # the simulated login reads the host's files
    for f in (requests,):
        f.write_text("")
        f.chmod(0o666)
    key = site / "key"
    sshd = hostsim.start_sshd(site / "sshd", hostsim.keygen(key), [host.bin], extra=(f"ForceCommand {wrapper}",))
    proxy = DelayProxy(sshd.port, RTT)
    cfg = site / "ssh_config"
    cfg.write_text(f"Host wan\n  HostName 127.0.0.1\n  Port {proxy.port}\n  User {sim_user()}\n"
                   f"  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {site}/known_hosts\n"
                   "  ControlMaster no\n  ControlPath none\n")
    (site / "known_hosts").write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_pub}\n")
    kvaudit = str(Path(sys.executable).with_name("kvaudit"))
    from kvaudit.collect import commands as C
    from kvaudit.collect.session import CollectOptions
    from kvaudit.engines import all_anchors, process_names

    frags = CollectOptions(all_anchors(), engine_names=process_names()).unit_fragments
    script = C.host_script(secrets.token_hex(8), "dir", None, str(host.journal), None, None, 64 << 20, frags,
                           all_anchors())
    runs = {
        "kvaudit_one_exec": [kvaudit, "check", "wan", "--ssh-config", str(cfg), "--journal-directory",
                             str(host.journal), "--format", "json"],
        "openssh_one_script": ["ssh", "-F", str(cfg), "wan", script],
    }
    before = os.environ.get("BENCH_BEFORE_TREE")  # a checkout of an earlier commit: its check, side by side
    if before:
        runs["kvaudit_before"] = [sys.executable, "-m", "kvaudit", *runs["kvaudit_one_exec"][1:]]
    res: dict[str, dict] = {}
    try:
        for login in ("fast", "slow"):
            slow.unlink(missing_ok=True)
            if login == "slow":
                slow.write_text("")
            for name, argv in [*runs.items(), ("kvaudit_command_by_command", runs["kvaudit_one_exec"])]:
                refuse.unlink(missing_ok=True)
                if name == "kvaudit_command_by_command":
                    refuse.write_text("")
                best = None
                for _ in range(int(os.environ.get("BENCH_RUNS", "3"))):
                    requests.write_text("")
                    proxy.reset()
                    t = time.perf_counter()
                    env = dict(os.environ, PYTHONPATH=before) if name == "kvaudit_before" else None
                    p = subprocess.run(argv, capture_output=True, timeout=300, env=env, cwd=before if env else None)
                    wall = time.perf_counter() - t
                    if name.startswith("kvaudit") and p.returncode != 0:
                        raise SystemExit(f"{name}: exit {p.returncode}: {p.stderr.decode()[-400:]}")
                    row = {"seconds": round(wall, 3), "round_trips": proxy.turns,
                           "execs": len(requests.read_text().split())}
                    if best is None or wall < best["seconds"]:
                        best = row
                res[f"{name}_{login}_login"] = best
    finally:
        sshd.stop()
    print(f"\ncheck at {RTT * 1000:g} ms RTT through a delay proxy (best of {os.environ.get('BENCH_RUNS', '3')})")
    print(f"{'':40} {'seconds':>8} {'round trips':>12} {'execs':>6} {'vs floor':>9}")
    for k, v in res.items():
        floor = res[f"openssh_one_script_{k.rsplit('_', 2)[-2]}_login"]["seconds"]
        print(f"{k:40} {v['seconds']:8.2f} {v['round_trips']:12} {v['execs']:6} {v['seconds'] / floor:9.2f}")
    return {"rtt_ms": RTT * 1000, **res}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
