"""Fixtures: a simulated Kimi host (real journal files, replayed nvidia-smi) behind a real sshd on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import hostsim
from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, SAMPLES

CAPTURE = FIXTURES / "hosts" / "kimi-k25-tp8"

needs_sshd = pytest.mark.skipif(not os.path.exists(hostsim.SSHD) or shutil.which("ssh-keygen") is None,
                                reason="openssh-server not installed (make test installs it when run as root)")
needs_journal = pytest.mark.skipif(hostsim.JOURNAL_REMOTE is None or shutil.which("journalctl") is None,
                                   reason="systemd-journal-remote/journalctl not installed (make test installs them as root)")


@dataclass
class Site:
    host: hostsim.SimHost
    sshd: hostsim.Sshd
    key: Path
    root: Path

    def ssh_config(self, name: str = "ssh_config", known_hosts: str | None = None, extra: str = "",
                   alias: str = "gpu-test", key: Path | None = None, port: int | None = None) -> Path:
        kh = Path(known_hosts) if known_hosts else self.root / f"{name}.known_hosts"
        p = self.root / name
        p.write_text(f"""Host {alias}
    HostName 127.0.0.1
    Port {port or self.sshd.port}
    User {os.environ.get('USER') or 'root'}
    IdentityFile {key or self.key}
    IdentitiesOnly yes
    UserKnownHostsFile {kh}
    ConnectTimeout 20
{extra}""")
        return p

    def known_hosts(self, path: Path) -> Path:
        """A known_hosts file that pins this site's sshd."""
        path.write_text(f"[127.0.0.1]:{self.sshd.port} {self.sshd.host_pub}\n")
        return path

    def trusted_config(self, name: str = "trusted") -> Path:
        cfg = self.ssh_config(name)
        (self.root / f"{name}.known_hosts").write_text(f"[127.0.0.1]:{self.sshd.port} {self.sshd.host_pub}\n")
        return cfg


def _user() -> str:
    import getpass

    return getpass.getuser()


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    if not os.path.exists(hostsim.SSHD) or hostsim.JOURNAL_REMOTE is None:
        pytest.skip("openssh-server / systemd-journal-remote not installed (make test installs them as root)")
    root = tmp_path_factory.mktemp("site")
    gpus = (CAPTURE / "nvidia-smi-gpus.csv").read_text()
    apps = (CAPTURE / "nvidia-smi-apps.csv").read_text()
    host = hostsim.make_host(root / "host", KIMI_LOG.read_bytes(), gpus, apps, KIMI_CONFIG.read_text(),
                             previous_log=(SAMPLES / "sglang_029.log").read_bytes())
    # a second journal on the same host: one entry with a 50 MB line that contains an anchor
    big = b"x" * (50 << 20) + b" 1.00 GB"
    kimi = KIMI_LOG.read_bytes().replace(b"/models/moonshotai/Kimi-K2.5", str(host.model_dir).encode())
    hostsim.write_journal(root / "host" / "journal-big", hostsim.export_entries(
        kimi.rstrip(b"\n").split(b"\n") + [big], "sglang.service", "d" * 32, 5000, 1_771_900_000_000_000))
    (root / "host" / "journal-empty").mkdir()
    hostsim.write_journal(root / "host" / "journal-other", hostsim.export_entries(
        [b"hello"], "cron.service", "e" * 32, 6000, 1_771_900_000_000_000))
    key = root / "client_key"
    pub = hostsim.keygen(key)
    sshd = hostsim.start_sshd(root / "sshd", pub, [host.bin])
    yield Site(host, sshd, key, root)
    sshd.stop()
