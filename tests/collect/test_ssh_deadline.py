"""issue 21, item 1: every wait of an SSH audit is bounded by the host's deadline, also the ones paramiko itself
makes without a timeout. The server here is a real SSH server (paramiko's server side, on loopback) that does
what OpenSSH never does: it opens the session and then never answers the request to run a command."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest

from kvaudit.status import ExitStatus
from tests.conftest import cli
from tests.hostsim import keygen

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed")


class _SilentExec:
    """An SSH server that authenticates anyone with a key, opens sessions, and never answers ``exec``."""

    def __init__(self):
        import paramiko

        self.host_key = paramiko.RSAKey.generate(2048)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.release = threading.Event()
        self.exec_asked = threading.Event()
        self.transports: list = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        import paramiko

        outer = self

        class Iface(paramiko.ServerInterface):
            def get_allowed_auths(self, username):
                return "publickey"

            def check_auth_publickey(self, username, key):
                return paramiko.AUTH_SUCCESSFUL

            def check_channel_request(self, kind, chanid):
                return paramiko.OPEN_SUCCEEDED

            def check_channel_exec_request(self, channel, command):
                outer.exec_asked.set()
                outer.release.wait()  # holds the request unanswered (and the server's transport thread with it)
                return False

        self.sock.settimeout(0.2)
        while not self.release.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(self.host_key)
            self.transports.append(t)
            try:
                t.start_server(server=Iface())
            except Exception:  # noqa: BLE001 - a client that went away mid-handshake
                continue

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.thread.join(5)
        for t in self.transports:
            t.close()
        self.sock.close()


def test_a_server_that_never_answers_the_exec_request_is_ended_by_the_host_deadline(tmp_path):
    """`check --timeout 20` was still waiting at 100 s: paramiko waits for the exec request's answer without a
    timeout. Now the host's deadline closes the connection: a timeout (exit 4) a few seconds after it."""
    key = tmp_path / "client_key"
    keygen(key)
    with _SilentExec() as srv:
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{srv.port} ssh-rsa {srv.host_key.get_base64()}\n")
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"""Host silent
    HostName 127.0.0.1
    Port {srv.port}
    User {os.environ.get('USER') or 'root'}
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {known}
    ConnectTimeout 20
""")
        start = time.monotonic()
        r = cli("check", "silent", "--ssh-config", cfg, "--timeout", "6")
        took = time.monotonic() - start
        assert srv.exec_asked.is_set(), r.stderr  # the wait under test was reached
    assert r.code == ExitStatus.UNREACHABLE and "deadline" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert took < 6 + 25, took  # the deadline plus a margin for a loaded machine
